//! `GET /metrics`: a published snapshot as Prometheus series (docs/operations.md lists them).
//!
//! Built with `prometheus-client`, which writes OpenMetrics; that is served when the scraper
//! asks for it (`Accept: application/openmetrics-text`, as Prometheus does). Otherwise the
//! same families go out in the classic text format (0.0.4), which `promtool check metrics`
//! reads: a counter's HELP and TYPE name carry its `_total`, and there is no `# EOF`.

mod series;

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::runner::Published;
use crate::stats::WaitHistogram;

/// The two exposition formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4.
    Classic,
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for: OpenMetrics when it names it, else classic.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let wants = |part: &str| {
            let mut params = part.split(';').map(str::trim);
            let refused = |p: &str| p.strip_prefix("q=").and_then(|q| q.parse().ok()) == Some(0.0);
            params.next() == Some("application/openmetrics-text") && !params.any(refused)
        };
        match accept {
            Some(a) if a.split(',').any(wants) => Format::OpenMetrics,
            _ => Format::Classic,
        }
    }
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Classic => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// Renders a published snapshot in `format`.
pub(crate) fn metrics(published: &Published, format: Format) -> String {
    let reg = series::registry(published);
    let mut out = String::new();
    // Writing to a String does not fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    match format {
        Format::OpenMetrics => out,
        Format::Classic => classic(&out),
    }
}

/// The classic text format from OpenMetrics text as `prometheus-client` writes it (HELP then
/// TYPE per family, no UNIT lines, no info or state-set families).
fn classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help = None;
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.split_once(' ').map_or("", |(_, text)| text));
            continue;
        }
        if let Some((name, kind)) = line
            .strip_prefix("# TYPE ")
            .and_then(|r| r.rsplit_once(' '))
        {
            let (suffix, kind) = match kind {
                "counter" => ("_total", kind),
                "unknown" => ("", "untyped"),
                _ => ("", kind),
            };
            if let Some(text) = help.take() {
                let _ = writeln!(out, "# HELP {name}{suffix} {text}");
            }
            let _ = writeln!(out, "# TYPE {name}{suffix} {kind}");
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Histograms kept elsewhere ([`WaitHistogram`]s), one per label set, in seconds.
#[derive(Debug, Default)]
pub(super) struct Histograms<L> {
    rows: Vec<(L, WaitHistogram)>,
}

impl<L> Histograms<L> {
    pub(super) fn push(&mut self, labels: L, h: &WaitHistogram) {
        self.rows.push((labels, h.clone()));
    }
}

impl<L: EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static> EncodeMetric for Histograms<L> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (labels, h) in &self.rows {
            // Upper bounds in seconds; f64::MAX is written as +Inf.
            let buckets: Vec<(f64, u64)> = h
                .buckets()
                .map(|(us, n)| (us.map_or(f64::MAX, |us| us as f64 / 1e6), n))
                .collect();
            let count = buckets.iter().map(|(_, n)| n).sum();
            encoder
                .encode_family(labels)?
                .encode_histogram::<NoLabelSet>(h.sum_ns() as f64 / 1e9, count, &buckets, None)?;
        }
        Ok(())
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Every family name the exporter registers, as the classic format writes it (a counter's
/// with `_total`; a histogram's samples add `_bucket`, `_sum` and `_count`).
pub fn family_names() -> Vec<String> {
    let empty = Published {
        switch: crate::engine::Snapshot {
            host_id: 0,
            vms: Vec::new(),
            tenants: Vec::new(),
            switch: Default::default(),
            cost_model: None,
        },
        ports: Vec::new(),
        pool_free: 0,
        pool_capacity: 0,
        accel: None,
        workers: Vec::new(),
        slo: Default::default(),
    };
    let reg = series::registry(&empty);
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    classic(&out)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(Format::negotiate(None), Format::Classic);
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Classic);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Classic);
        let refused = "application/openmetrics-text; q=0, text/plain";
        assert_eq!(Format::negotiate(Some(refused)), Format::Classic);
    }

    #[test]
    fn classic_names_counters_with_total_and_drops_eof() {
        let om = "# HELP a_b Frames.\n# TYPE a_b counter\na_b_total{x=\"1\"} 3\n\
                  # HELP g A gauge.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            classic(om),
            "# HELP a_b_total Frames.\n# TYPE a_b_total counter\na_b_total{x=\"1\"} 3\n\
             # HELP g A gauge.\n# TYPE g gauge\ng 1\n"
        );
    }
}
