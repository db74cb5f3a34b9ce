//! Fuzz target: Watch's label selector, the one parser of the subscriber API that is
//! plegd's own (requests themselves are decoded by prost). It compiles the real
//! `api/src/selector.rs` in (`#[path]`; no copy) and reads the input as a selector
//! (first line) and a pod's labels (the other lines, `key=value`). Checks, besides
//! "no panic":
//!
//! - a selector longer than the limit is refused as such; an accepted one prints as
//!   text that parses back to the same selector, and matches the same labels;
//! - the empty selector matches everything;
//! - a refused selector's error displays (it names the term and the reason).
#![no_main]

#[allow(dead_code)]
#[path = "../../api/src/selector.rs"]
mod selector;

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use selector::{LabelSelector, SelectorError, MAX_SELECTOR_BYTES};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.lines();
    let selector_text = lines.next().unwrap_or("");
    let labels: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match LabelSelector::parse(selector_text) {
        Ok(sel) => {
            assert!(selector_text.len() <= MAX_SELECTOR_BYTES);
            let printed = sel.to_string();
            let back = LabelSelector::parse(&printed).expect("a printed selector parses");
            assert_eq!(back, sel, "{printed:?}");
            assert_eq!(back.matches(&labels), sel.matches(&labels));
            if sel.is_empty() {
                assert!(sel.matches(&labels));
            }
        }
        Err(e) => {
            if selector_text.len() > MAX_SELECTOR_BYTES {
                assert_eq!(e, SelectorError::TooLong);
            }
            assert!(!e.to_string().is_empty());
        }
    }
});
