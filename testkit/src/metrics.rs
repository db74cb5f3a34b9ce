//! Prometheus text (what plegd's `/metrics` answers), read into samples: one line
//! `name{labels} value` each; comments, blank lines and a value that is not a number
//! are passed over.

use std::collections::BTreeMap;

/// One sample: the metric's name, the text between its braces (empty for none), its
/// value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: String,
    pub value: f64,
}

/// One scrape.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    samples: Vec<Sample>,
}

impl Scrape {
    /// The samples of Prometheus text.
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (series, value) = l.trim_end().rsplit_once(' ')?;
                let value = value.parse::<f64>().ok()?;
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, rest.strip_suffix('}')?),
                    None => (series, ""),
                };
                Some(Sample {
                    name: name.to_string(),
                    labels: labels.to_string(),
                    value,
                })
            })
            .collect();
        Scrape { samples }
    }

    /// The samples of an HTTP response's body (the whole response, head and body, as
    /// [`crate::process::http_get`] gives it); `None` without a body.
    pub fn from_response(response: &str) -> Option<Scrape> {
        let (_, body) = response.split_once("\r\n\r\n")?;
        Some(Scrape::parse(body))
    }

    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The samples of `name` whose labels contain every one of `labels` (`key="value"`
    /// strings; none: every sample of `name`).
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [&'a str],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name && labels.iter().all(|l| s.labels.contains(l)))
    }

    /// The sum of [`Self::matching`]'s values; `None` if no sample matches.
    pub fn find(&self, name: &str, labels: &[&str]) -> Option<f64> {
        let mut found = false;
        let sum = self
            .matching(name, labels)
            .inspect(|_| found = true)
            .map(|s| s.value)
            .sum();
        found.then_some(sum)
    }

    /// [`Self::find`], 0 if no sample matches (a counter not there yet has counted
    /// nothing).
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.find(name, labels).unwrap_or(0.0)
    }

    /// [`Self::find`] of counters and gauges that count (whole numbers, not negative).
    pub fn count(&self, name: &str, labels: &[&str]) -> Option<u64> {
        self.find(name, labels).map(|v| v.max(0.0).round() as u64)
    }

    /// Every series, `name{labels}` (or `name`) → value.
    pub fn series(&self) -> BTreeMap<String, f64> {
        self.samples
            .iter()
            .map(|s| {
                let key = if s.labels.is_empty() {
                    s.name.clone()
                } else {
                    format!("{}{{{}}}", s.name, s.labels)
                };
                (key, s.value)
            })
            .collect()
    }

    /// The labels of every sample of `name` whose value is 1: e.g. the state of each
    /// hint source in `plegd_hint_source_state`.
    pub fn labels_at_one(&self, name: &str) -> Vec<String> {
        self.matching(name, &[])
            .filter(|s| s.value == 1.0 && !s.labels.is_empty())
            .map(|s| s.labels.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# HELP plegd_x a counter
# TYPE plegd_x counter
plegd_x{source=\"cri\",result=\"ok\"} 3
plegd_x{source=\"nri\",result=\"ok\"} 4
plegd_x{source=\"nri\",result=\"failed\"} 1
plegd_x_total 9
plegd_state{source=\"cri\",state=\"up\"} 1
plegd_state{source=\"cri\",state=\"down\"} 0
plegd_gauge -2.5

";

    #[test]
    fn sums_select_by_exact_name_and_every_label() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.find("plegd_x", &[]), Some(8.0));
        assert_eq!(s.find("plegd_x", &["source=\"nri\""]), Some(5.0));
        assert_eq!(
            s.find("plegd_x", &["source=\"nri\"", "result=\"ok\""]),
            Some(4.0)
        );
        assert_eq!(s.find("plegd_x_total", &[]), Some(9.0));
        assert_eq!(s.find("plegd", &[]), None);
        assert_eq!(s.find("plegd_x", &["source=\"none\""]), None);
        assert_eq!(s.sum("plegd_x", &["source=\"none\""]), 0.0);
        assert_eq!(s.sum("plegd_x", &["result=\"ok\""]), 7.0);
        assert_eq!(s.count("plegd_gauge", &[]), Some(0));
        assert_eq!(s.count("plegd_x", &[]), Some(8));
    }

    #[test]
    fn series_and_labels_at_one() {
        let s = Scrape::parse(TEXT);
        let series = s.series();
        assert_eq!(series.get("plegd_x_total"), Some(&9.0));
        assert_eq!(
            series.get("plegd_x{source=\"cri\",result=\"ok\"}"),
            Some(&3.0)
        );
        assert_eq!(series.len(), 7);
        assert_eq!(
            s.labels_at_one("plegd_state"),
            vec!["source=\"cri\",state=\"up\"".to_string()]
        );
    }

    #[test]
    fn a_response_is_read_past_its_head() {
        let response = "HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\nplegd_y 12\n";
        let s = Scrape::from_response(response).expect("a body");
        assert_eq!(s.samples().len(), 1);
        assert_eq!(s.sum("plegd_y", &[]), 12.0);
        assert!(Scrape::from_response("HTTP/1.1 200 OK").is_none());
    }
}
