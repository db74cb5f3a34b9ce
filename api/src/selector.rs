//! The equality-based label selector of Watch (Kubernetes' equality-based
//! requirements): `app=web,tier!=db`. Every term must hold; `key=value` and
//! `key==value` need the label with that value, `key!=value` holds when the label is
//! absent or different. Set-based terms (`in`, `notin`, `!key`) are refused with a
//! clear error rather than misread.

use std::collections::BTreeMap;
use std::fmt;

/// The longest selector accepted (WatchRequest.label_selector).
pub const MAX_SELECTOR_BYTES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Equals,
    NotEquals,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Term {
    key: String,
    op: Op,
    value: String,
}

/// A parsed selector; the empty selector selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    terms: Vec<Term>,
}

/// Why a selector was refused: the offending term and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("label selector longer than {MAX_SELECTOR_BYTES} bytes")]
    TooLong,
    #[error("label selector term {term:?}: {reason}")]
    Term { term: String, reason: &'static str },
}

impl LabelSelector {
    /// Parses `a=b,c!=d`. Spaces around terms, keys and values are ignored.
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        if text.len() > MAX_SELECTOR_BYTES {
            return Err(SelectorError::TooLong);
        }
        if text.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        let terms = text.split(',').map(parse_term).collect::<Result<_, _>>()?;
        Ok(LabelSelector { terms })
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// True when every term holds for `labels`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|t| {
            let value = labels.get(&t.key);
            match t.op {
                Op::Equals => value == Some(&t.value),
                Op::NotEquals => value != Some(&t.value),
            }
        })
    }
}

fn parse_term(raw: &str) -> Result<Term, SelectorError> {
    let bad = |reason| SelectorError::Term {
        term: raw.trim().to_string(),
        reason,
    };
    let term = raw.trim();
    if term.is_empty() {
        return Err(bad("empty term (a stray comma?)"));
    }
    let (key, op, value) = if let Some((k, v)) = term.split_once("!=") {
        (k, Op::NotEquals, v)
    } else if let Some((k, v)) = term.split_once("==") {
        (k, Op::Equals, v)
    } else if let Some((k, v)) = term.split_once('=') {
        (k, Op::Equals, v)
    } else {
        return Err(bad(
            "expected key=value, key==value or key!=value (set-based selectors are not supported)",
        ));
    };
    let (key, value) = (key.trim(), value.trim());
    if key.is_empty() {
        return Err(bad("empty key"));
    }
    if !key.chars().all(is_key_char) {
        return Err(bad(
            "a key has only letters, digits and '-', '_', '.', '/' characters",
        ));
    }
    if value.contains(['=', '!']) {
        return Err(bad("the value holds '=' or '!'"));
    }
    if !value.chars().all(is_value_char) {
        return Err(bad(
            "a value has only letters, digits and '-', '_', '.' characters",
        ));
    }
    Ok(Term {
        key: key.to_string(),
        op,
        value: value.to_string(),
    })
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let op = match t.op {
                Op::Equals => "=",
                Op::NotEquals => "!=",
            };
            write!(f, "{}{op}{}", t.key, t.value)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_and_inequality_terms_all_must_hold() {
        let s = LabelSelector::parse(" app=web , tier!=db,env==prod").unwrap();
        assert_eq!(s.to_string(), "app=web,tier!=db,env=prod");
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod")])));
        assert!(s.matches(&labels(&[("app", "web"), ("env", "prod"), ("tier", "fe")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("env", "prod"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("app", "api"), ("env", "prod")])));
        assert!(
            !s.matches(&labels(&[("env", "prod")])),
            "a missing label is not equal"
        );
        // An empty value is a value: `a=` needs the label, empty.
        let empty = LabelSelector::parse("a=").unwrap();
        assert!(empty.matches(&labels(&[("a", "")])));
        assert!(!empty.matches(&labels(&[])));
    }

    #[test]
    fn the_empty_selector_selects_everything() {
        let s = LabelSelector::parse("  ").unwrap();
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn bad_selectors_name_the_term_and_the_reason() {
        for (text, term, reason) in [
            ("app", "app", "expected key=value"),
            ("app in (a,b)", "app in (a", "expected key=value"),
            ("app=web,", "", "empty term"),
            ("=web", "=web", "empty key"),
            ("a b=c", "a b=c", "a key has only"),
            ("a=b=c", "a=b=c", "'=' or '!'"),
            ("a=b c", "a=b c", "a value has only"),
            ("a!=!b", "a!=!b", "'=' or '!'"),
        ] {
            let err = LabelSelector::parse(text).unwrap_err();
            let SelectorError::Term { term: t, reason: r } = &err else {
                panic!("{text}: {err}")
            };
            assert_eq!(t, term, "{text}");
            assert!(r.contains(reason), "{text}: {err}");
        }
        let long = format!("a={}", "b".repeat(MAX_SELECTOR_BYTES));
        assert_eq!(LabelSelector::parse(&long), Err(SelectorError::TooLong));
    }
}
