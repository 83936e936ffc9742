//! Live metrics (issue 9 items 1 and 4): real `engine-host serve --store local` processes
//! over HTTP; after a short workload their `/metrics` exports every metric name declared in
//! actors/src/names.rs, counts the workload (a miss, then Device reuse of a repeated prompt,
//! then an L3 restore in a fresh process served by the local store's DFS tier), and never
//! carries an object key or a request id.

mod common;

use common::Host;
use std::collections::BTreeMap;
use std::time::Duration;

/// An engine host on the local store in `store_dir`.
fn start(store_dir: &str) -> Host {
    start_with(store_dir, &[])
}

fn start_with(store_dir: &str, envs: &[(&str, &str)]) -> Host {
    Host::start(
        &["serve", "--store", "local", "--store-dir", store_dir],
        envs,
    )
}

/// Scrapes until `done` holds on the parsed samples (snapshots are exported at most once
/// a second), bounded by a number of scrapes, not by a timing assertion.
fn metrics_until(h: &Host, what: &str, done: impl Fn(&Samples) -> bool) -> String {
    for _ in 0..200 {
        let text = h.metrics();
        if done(&samples(&text)) {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what} never held; last scrape:\n{}", h.metrics());
}

/// Samples by metric name: (labels, value).
type Samples = BTreeMap<String, Vec<(BTreeMap<String, String>, f64)>>;

fn samples(text: &str) -> Samples {
    let mut out = Samples::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (id, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = id.split_once('{').unwrap_or((id, ""));
        let labels = labels
            .trim_end_matches('}')
            .split("\",")
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once("=\"").unwrap();
                (k.to_string(), v.trim_end_matches('"').to_string())
            })
            .collect();
        out.entry(name.to_string())
            .or_default()
            .push((labels, value.parse().unwrap()));
    }
    out
}

fn value(s: &Samples, name: &str, label: &str, want: &str) -> f64 {
    s.get(name)
        .into_iter()
        .flatten()
        .filter(|(l, _)| l.get(label).map(String::as_str) == Some(want))
        .map(|(_, v)| *v)
        .sum()
}

/// Every `pub const NAME: &str = "tsl3_..."` in names.rs's `metric` module.
fn declared_metric_names() -> Vec<String> {
    let src = include_str!("../actors/src/names.rs");
    let metric = src.split_once("pub mod metric {").map(|x| x.1).unwrap();
    metric
        .lines()
        .filter_map(|l| {
            let v = l.trim().strip_prefix("pub const ")?.split_once("= \"")?.1;
            let v = v.split('"').next()?;
            v.starts_with("tsl3_").then(|| v.to_string())
        })
        .collect()
}

fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 17 + salt * 131) % 991).collect()
}

/// No object keys, no request ids: only the rank labels and the closed enumerations.
fn assert_no_keys_or_ids(text: &str) {
    let allowed = [
        "model",
        "role",
        "dp_rank",
        "tp_rank",
        "replica",
        "kind",
        "outcome",
        "state",
        "credit",
        "reason",
        "tier",
        "fallback_reason",
        "le",
    ];
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains("tsl3-"), "object key in /metrics: {line}");
        assert!(!line.contains("cmpl-"), "request id in /metrics: {line}");
    }
    for (name, rows) in samples(text) {
        for (labels, _) in rows {
            for k in labels.keys() {
                assert!(allowed.contains(&k.as_str()), "{name} has label {k}");
            }
            for k in ["model", "role", "dp_rank", "tp_rank", "replica"] {
                assert!(labels.contains_key(k), "{name} lacks {k}");
            }
        }
    }
}

#[test]
fn a_live_engine_host_exports_every_declared_metric_and_counts_its_workload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let p = prompt(48, 1);

    let first = start(d);
    let before = first.metrics();
    let names = declared_metric_names();
    assert!(names.len() >= 30, "{names:?}");
    for n in &names {
        assert!(
            before.contains(&format!("# TYPE {n} ")),
            "{n} (names.rs) is not exported before any traffic"
        );
    }
    let a = first.complete(&p, 3);
    assert_eq!(a["tsl3"]["fallback_reason"], "miss");
    let b = first.complete(&p, 3);
    assert!(b["tsl3"]["device"].as_u64().unwrap() > 0, "{b}");
    let text = metrics_until(&first, "a miss, Device reuse and a completed PUT", |s| {
        value(s, "tsl3_requests_total", "fallback_reason", "miss") >= 1.0
            && value(s, "tsl3_prefix_tokens_total", "tier", "device") > 0.0
            && value(s, "tsl3_l3_operations_total", "kind", "put") > 0.0
    });
    let s = samples(&text);
    assert_eq!(
        value(&s, "tsl3_prefix_tokens_total", "tier", "device"),
        b["tsl3"]["device"].as_f64().unwrap(),
        "Device tokens counted once, as the response reported them"
    );
    assert!(value(&s, "tsl3_l3_payload_bytes_total", "kind", "put") > 0.0);
    for n in &names {
        assert!(text.contains(&format!("# TYPE {n} ")), "{n} missing");
    }
    assert_no_keys_or_ids(&text);
    assert!(
        first.stop().success(),
        "SIGTERM ends the engine host with 0"
    );

    // A fresh process restores the prompt from L3 through the local store (its GET reads
    // DFS into Host; with promote_after_get, what it read is then promoted into MEMORY).
    let second = start_with(d, &[("TSL3_STORAGE__LOCAL__PROMOTE_AFTER_GET", "true")]);
    let c = second.complete(&p, 3);
    assert!(c["tsl3"]["l3"].as_u64().unwrap() > 0, "{c}");
    let text = metrics_until(&second, "an L3 restore served by the local store", |s| {
        let one = |n: &str| value(s, n, "dp_rank", "0");
        let settled = one("tsl3_promotion_committed_total")
            + one("tsl3_promotion_failed_total")
            + one("tsl3_promotion_expired_total")
            + one("tsl3_promotion_cancelled_total")
            + one("tsl3_promotion_in_flight");
        value(s, "tsl3_prefix_tokens_total", "tier", "l3") > 0.0
            && one("tsl3_local_get_total") > 0.0
            && one("tsl3_promotion_attempted_total") > 0.0
            && one("tsl3_promotion_attempted_total") == settled
    });
    let s = samples(&text);
    assert_eq!(
        value(&s, "tsl3_prefix_tokens_total", "tier", "l3"),
        c["tsl3"]["l3"].as_f64().unwrap()
    );
    assert!(value(&s, "tsl3_l3_operations_total", "outcome", "completed") > 0.0);
    assert_no_keys_or_ids(&text);
    assert!(second.stop().success());
}
