//! Prometheus metrics of one engine host: one registry whose constant labels identify model,
//! role, DP rank and TP rank. This module owns registration, the closed label enumerations
//! and rendering only; every known label combination is pre-initialized to zero so each
//! series exists from the first scrape. Values are set from snapshots by the engine host at
//! most once a second (and when storage turns pending or idle). Metrics never feed a
//! decision, and no label ever carries a request ID or an object key.

use crate::frontend::FallbackReason;
use crate::l3::store::dfs::InvalidReason;
use crate::l3::store::promotion::stats::FailReason;
use crate::l3::store::{CapacityReason, PromotionFailure};
use crate::names::metric as m;
use crate::storage_transfer::DropReason;
use messages::StorageOpKind;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use std::collections::HashMap;

/// `outcome` of `tsl3_l3_operations_total`: how an L3 operation ended (`failed`: it ran and
/// settled with a native failure or an exception; `completed`: it ran and settled without).
pub const L3_OUTCOMES: [&str; 4] = ["completed", "failed", "rejected", "cancelled"];
/// `state` of `tsl3_l3_jobs`.
pub const L3_JOB_STATES: [&str; 2] = ["queued", "running"];
/// `credit` of `tsl3_l3_credits_in_use`.
pub const CREDITS: [&str; 2] = ["operation", "host"];
/// `tier` of `tsl3_prefix_tokens_total`: where a prompt token's KV came from.
pub const PREFIX_TIERS: [&str; 4] = ["device", "host", "l3", "computed"];
/// `kind` of the tail metrics: the cache group kind of a tail block.
pub const TAIL_KINDS: [&str; 3] = ["full", "sliding_window", "state"];
/// `tier` of `tsl3_tail_tokens_reused_total`.
pub const TAIL_TIERS: [&str; 3] = ["device", "host", "l3"];
/// `tier` of `tsl3_local_get_total`: where the local store served a GET from.
pub const LOCAL_GET_TIERS: [&str; 2] = ["memory", "dfs"];

/// `outcome` of `tsl3_dfs_reads_total`.
pub const DFS_READ_RESULTS: [&str; 4] = ["ok", "missing", "invalid", "failed"];
/// `outcome` of `tsl3_dfs_puts_total`.
pub const DFS_PUT_RESULTS: [&str; 4] = ["written", "exists", "capacity", "failed"];

/// `reason` label of a capacity gate.
pub fn capacity_label(c: CapacityReason) -> &'static str {
    match c {
        CapacityReason::Quota => "quota",
        CapacityReason::Allocation => "allocation",
        CapacityReason::Watermark => "watermark",
        CapacityReason::InFlightCap => "in_flight_cap",
    }
}

/// `reason` label of a promotion failure.
pub fn failure_label(f: PromotionFailure) -> &'static str {
    match f {
        PromotionFailure::Busy => "busy",
        PromotionFailure::Fenced => "fenced",
        PromotionFailure::Expired => "expired",
        PromotionFailure::SourceChanged => "source_changed",
        PromotionFailure::Io => "io",
        PromotionFailure::Checksum => "checksum",
    }
}

/// Every capacity reason (`reason` of `tsl3_promotion_rejected_total`).
pub const CAPACITY_REASONS: [CapacityReason; 4] = [
    CapacityReason::Quota,
    CapacityReason::Allocation,
    CapacityReason::Watermark,
    CapacityReason::InFlightCap,
];

/// Every reason an admitted promotion failed (`reason` of `tsl3_promotion_failed_total`).
pub const PROMOTION_FAIL_REASONS: [FailReason; 10] = [
    FailReason::Failure(PromotionFailure::Busy),
    FailReason::Failure(PromotionFailure::Fenced),
    FailReason::Failure(PromotionFailure::Expired),
    FailReason::Failure(PromotionFailure::SourceChanged),
    FailReason::Failure(PromotionFailure::Io),
    FailReason::Failure(PromotionFailure::Checksum),
    FailReason::Capacity(CapacityReason::Quota),
    FailReason::Capacity(CapacityReason::Allocation),
    FailReason::Capacity(CapacityReason::Watermark),
    FailReason::Capacity(CapacityReason::InFlightCap),
];

/// `reason` label of a promotion failure reason.
pub fn fail_reason_label(r: FailReason) -> &'static str {
    match r {
        FailReason::Failure(f) => failure_label(f),
        FailReason::Capacity(c) => capacity_label(c),
    }
}

/// The labels every series carries.
#[derive(Clone, Debug)]
pub struct MetricLabels {
    pub model: String,
    pub role: String,
    pub dp_rank: u32,
    pub tp_rank: u32,
    /// The replica this rank belongs to (every TP rank of it alike; distinct between
    /// replicas, so two replicas with the same dp_rank never fold into one series).
    pub replica: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub l3_operations: IntCounterVec,
    pub l3_queue_seconds: prometheus::CounterVec,
    pub l3_backend_seconds: prometheus::CounterVec,
    pub l3_jobs: IntGaugeVec,
    pub l3_completed_jobs: IntCounterVec,
    pub l3_payload_bytes: IntCounterVec,
    pub l3_queued_payload_bytes: IntGaugeVec,
    pub l3_oldest_job_age_seconds: Gauge,
    pub l3_backend_calls: IntCounterVec,
    pub l3_put_new_writes: IntCounter,
    pub l3_health_state: IntGauge,
    pub l3_health_epoch: IntGauge,
    pub l3_unproven_retirement: IntGauge,
    pub l3_ready_holds: IntGauge,
    pub l3_quarantined_references: IntGauge,
    pub l3_soft_timeouts: IntCounter,
    pub l3_ready_expirations: IntCounter,
    pub l3_pressure_bypasses: IntCounter,
    pub l3_dropped_backup_keys: IntCounterVec,
    pub l3_admission_gate_open: IntGauge,
    pub l3_admission_gate_closed_seconds: prometheus::Counter,
    pub l3_credits_in_use: IntGaugeVec,
    pub promotion_attempted: IntCounter,
    pub promotion_committed: IntCounter,
    pub promotion_failed: IntCounterVec,
    pub promotion_in_flight: IntGauge,
    pub promotion_staging_bytes: IntGauge,
    pub promotion_expired: IntCounter,
    pub promotion_cancelled: IntCounter,
    pub promotion_rejected: IntCounterVec,
    pub local_get: IntCounterVec,
    pub dfs_reads: IntCounterVec,
    pub dfs_puts: IntCounterVec,
    pub dfs_invalid_objects: IntCounterVec,
    pub dfs_invalid_removed: IntCounter,
    pub ttft_seconds: Histogram,
    pub prefix_tokens: IntCounterVec,
    pub requests: IntCounterVec,
    pub rounds: IntCounter,
    pub tail_candidates_queried: IntCounter,
    pub tail_blocks_queried: IntCounterVec,
    pub tail_blocks_reused: IntCounterVec,
    pub tail_tokens_reused: IntCounterVec,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

impl Metrics {
    /// A registry with every series of every known label combination present at zero.
    pub fn new(labels: &MetricLabels) -> prometheus::Result<Self> {
        let me = Self::register(labels)?;
        me.zero_every_series();
        Ok(me)
    }

    /// Touches every known label combination so it is exported (at zero) from the start.
    fn zero_every_series(&self) {
        for k in StorageOpKind::ALL {
            let kind = k.as_str();
            for outcome in L3_OUTCOMES {
                self.l3_operations.with_label_values(&[kind, outcome]);
            }
            for state in L3_JOB_STATES {
                self.l3_jobs.with_label_values(&[kind, state]);
            }
            self.l3_queue_seconds.with_label_values(&[kind]);
            self.l3_backend_seconds.with_label_values(&[kind]);
            self.l3_completed_jobs.with_label_values(&[kind]);
            self.l3_payload_bytes.with_label_values(&[kind]);
            self.l3_queued_payload_bytes.with_label_values(&[kind]);
            self.l3_backend_calls.with_label_values(&[kind]);
        }
        for r in DropReason::ALL {
            self.l3_dropped_backup_keys.with_label_values(&[r.as_str()]);
        }
        for c in CREDITS {
            self.l3_credits_in_use.with_label_values(&[c]);
        }
        for r in PROMOTION_FAIL_REASONS {
            self.promotion_failed
                .with_label_values(&[fail_reason_label(r)]);
        }
        for c in CAPACITY_REASONS {
            self.promotion_rejected
                .with_label_values(&[capacity_label(c)]);
        }
        for t in LOCAL_GET_TIERS {
            self.local_get.with_label_values(&[t]);
        }
        for r in DFS_READ_RESULTS {
            self.dfs_reads.with_label_values(&[r]);
        }
        for r in DFS_PUT_RESULTS {
            self.dfs_puts.with_label_values(&[r]);
        }
        for r in InvalidReason::ALL {
            self.dfs_invalid_objects.with_label_values(&[r.as_str()]);
        }
        for t in PREFIX_TIERS {
            self.prefix_tokens.with_label_values(&[t]);
        }
        for k in TAIL_KINDS {
            self.tail_blocks_queried.with_label_values(&[k]);
            self.tail_blocks_reused.with_label_values(&[k]);
        }
        for t in TAIL_TIERS {
            self.tail_tokens_reused.with_label_values(&[t]);
        }
        for f in FallbackReason::ALL {
            self.requests.with_label_values(&[f.as_str()]);
        }
    }

    fn register(labels: &MetricLabels) -> prometheus::Result<Self> {
        let mut constant = HashMap::new();
        constant.insert("model".to_string(), labels.model.clone());
        constant.insert("role".to_string(), labels.role.clone());
        constant.insert("dp_rank".to_string(), labels.dp_rank.to_string());
        constant.insert("tp_rank".to_string(), labels.tp_rank.to_string());
        constant.insert("replica".to_string(), labels.replica.clone());
        let registry = Registry::new_custom(None, Some(constant))?;
        macro_rules! reg {
            ($e:expr) => {{
                let c = $e;
                registry.register(Box::new(c.clone()))?;
                c
            }};
        }
        Ok(Self {
            l3_operations: reg!(IntCounterVec::new(
                opts(m::L3_OPERATIONS, "L3 operations completed on this rank, by kind and outcome"),
                &["kind", "outcome"]
            )?),
            l3_queue_seconds: reg!(prometheus::CounterVec::new(
                opts(m::L3_QUEUE_SECONDS, "Cumulative time L3 jobs waited in their queue"),
                &["kind"]
            )?),
            l3_backend_seconds: reg!(prometheus::CounterVec::new(
                opts(m::L3_BACKEND_SECONDS, "Cumulative time spent in store calls"),
                &["kind"]
            )?),
            l3_jobs: reg!(IntGaugeVec::new(
                opts(m::L3_JOBS, "L3 jobs queued or running on this rank"),
                &["kind", "state"]
            )?),
            l3_completed_jobs: reg!(IntCounterVec::new(
                opts(m::L3_COMPLETED_JOBS, "L3 jobs completed and polled"),
                &["kind"]
            )?),
            l3_payload_bytes: reg!(IntCounterVec::new(
                opts(m::L3_PAYLOAD_BYTES, "Successful adapter payload bytes (includes idempotent PUT hits and detached GET results)"),
                &["kind"]
            )?),
            l3_queued_payload_bytes: reg!(IntGaugeVec::new(
                opts(m::L3_QUEUED_PAYLOAD_BYTES, "Payload bytes of queued L3 jobs"),
                &["kind"]
            )?),
            l3_oldest_job_age_seconds: reg!(Gauge::with_opts(opts(
                m::L3_OLDEST_JOB_AGE_SECONDS,
                "Age of the oldest queued or running L3 job"
            ))?),
            l3_backend_calls: reg!(IntCounterVec::new(
                opts(m::L3_BACKEND_CALLS, "Store adapter invocations"),
                &["kind"]
            )?),
            l3_put_new_writes: reg!(IntCounter::with_opts(opts(
                m::L3_PUT_NEW_WRITES,
                "PUT rows that wrote a new object (idempotent hits excluded)"
            ))?),
            l3_health_state: reg!(IntGauge::with_opts(opts(
                m::L3_HEALTH_STATE,
                "L3 backend health: 0 healthy, 1 cooldown, 2 probing, 3 quarantined"
            ))?),
            l3_health_epoch: reg!(IntGauge::with_opts(opts(m::L3_HEALTH_EPOCH, "L3 backend health epoch"))?),
            l3_unproven_retirement: reg!(IntGauge::with_opts(opts(
                m::L3_UNPROVEN_RETIREMENT,
                "1 when native I/O retirement is unproven (process restart required)"
            ))?),
            l3_ready_holds: reg!(IntGauge::with_opts(opts(m::L3_READY_HOLDS, "Ready holds protecting newly read blocks"))?),
            l3_quarantined_references: reg!(IntGauge::with_opts(opts(
                m::L3_QUARANTINED_REFERENCES,
                "Host references kept by quarantined storage operations"
            ))?),
            l3_soft_timeouts: reg!(IntCounter::with_opts(opts(
                m::L3_SOFT_TIMEOUTS,
                "Waiting L3 preparations that hit their soft deadline"
            ))?),
            l3_ready_expirations: reg!(IntCounter::with_opts(opts(
                m::L3_READY_EXPIRATIONS,
                "Ready holds that expired before admission"
            ))?),
            l3_pressure_bypasses: reg!(IntCounter::with_opts(opts(
                m::L3_PRESSURE_BYPASSES,
                "Requests that bypassed L3 preparation because the pressure gate was closed"
            ))?),
            l3_dropped_backup_keys: reg!(IntCounterVec::new(
                opts(m::L3_DROPPED_BACKUP_KEYS, "Dropped backup candidate keys (occurrences), by reason"),
                &["reason"]
            )?),
            l3_admission_gate_open: reg!(IntGauge::with_opts(opts(
                m::L3_ADMISSION_GATE_OPEN,
                "1 when the L3 pressure admission gate is open"
            ))?),
            l3_admission_gate_closed_seconds: reg!(prometheus::Counter::with_opts(opts(
                m::L3_ADMISSION_GATE_CLOSED_SECONDS,
                "Agreed time the shared read/write admission gate spent closed (mirrored per TP owner)"
            ))?),
            l3_credits_in_use: reg!(IntGaugeVec::new(
                opts(m::L3_CREDITS_IN_USE, "Storage credits in use"),
                &["credit"]
            )?),
            promotion_attempted: reg!(IntCounter::with_opts(opts(
                m::PROMOTION_ATTEMPTED,
                "DFS to MEMORY promotions admitted"
            ))?),
            promotion_committed: reg!(IntCounter::with_opts(opts(
                m::PROMOTION_COMMITTED,
                "DFS to MEMORY promotions committed"
            ))?),
            promotion_failed: reg!(IntCounterVec::new(
                opts(m::PROMOTION_FAILED, "DFS to MEMORY promotions that failed, by reason"),
                &["reason"]
            )?),
            promotion_in_flight: reg!(IntGauge::with_opts(opts(m::PROMOTION_IN_FLIGHT, "Promotions in flight"))?),
            promotion_staging_bytes: reg!(IntGauge::with_opts(opts(
                m::PROMOTION_STAGING_BYTES,
                "Bytes of promotion staging in use"
            ))?),
            promotion_expired: reg!(IntCounter::with_opts(opts(
                m::PROMOTION_EXPIRED_TOTAL,
                "Admitted DFS to MEMORY promotions that expired before commit"
            ))?),
            promotion_cancelled: reg!(IntCounter::with_opts(opts(
                m::PROMOTION_CANCELLED_TOTAL,
                "Admitted DFS to MEMORY promotions cancelled before commit"
            ))?),
            promotion_rejected: reg!(IntCounterVec::new(
                opts(
                    m::PROMOTION_REJECTED_TOTAL,
                    "DFS to MEMORY promotions refused before admission, by capacity reason"
                ),
                &["reason"]
            )?),
            local_get: reg!(IntCounterVec::new(
                opts(m::LOCAL_GET_TOTAL, "Local store GETs served, by tier"),
                &["tier"]
            )?),
            dfs_reads: reg!(IntCounterVec::new(
                opts(m::DFS_READS_TOTAL, "DFS tier object reads, by result"),
                &["outcome"]
            )?),
            dfs_puts: reg!(IntCounterVec::new(
                opts(m::DFS_PUTS_TOTAL, "DFS tier PUT keys, by result"),
                &["outcome"]
            )?),
            dfs_invalid_objects: reg!(IntCounterVec::new(
                opts(
                    m::DFS_INVALID_OBJECTS_TOTAL,
                    "Invalid DFS objects found (never used), by reason"
                ),
                &["reason"]
            )?),
            dfs_invalid_removed: reg!(IntCounter::with_opts(opts(
                m::DFS_INVALID_REMOVED_TOTAL,
                "Invalid DFS objects removed so that a later PUT of their key lands"
            ))?),
            ttft_seconds: reg!(Histogram::with_opts(
                HistogramOpts::new(m::TTFT_SECONDS, "Time to first token").buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
                ])
            )?),
            prefix_tokens: reg!(IntCounterVec::new(
                opts(m::PREFIX_TOKENS, "Prompt tokens by where their KV came from"),
                &["tier"]
            )?),
            tail_candidates_queried: reg!(IntCounter::with_opts(opts(
                m::TAIL_CANDIDATES_QUERIED,
                "Tail (nonaligned) boundaries asked by issued QUERY operations"
            ))?),
            tail_blocks_queried: reg!(IntCounterVec::new(
                opts(
                    m::TAIL_BLOCKS_QUERIED,
                    "Tail blocks of the queried tail boundaries, by cache group kind"
                ),
                &["kind"]
            )?),
            tail_blocks_reused: reg!(IntCounterVec::new(
                opts(
                    m::TAIL_BLOCKS_REUSED,
                    "Tail blocks admission reused, by cache group kind"
                ),
                &["kind"]
            )?),
            tail_tokens_reused: reg!(IntCounterVec::new(
                opts(
                    m::TAIL_TOKENS_REUSED,
                    "Prompt tokens above the aligned boundary reused through a tail, by the tier of the tail's blocks"
                ),
                &["tier"]
            )?),
            requests: reg!(IntCounterVec::new(
                opts(m::REQUESTS, "Finished requests by L3 fallback reason"),
                &["fallback_reason"]
            )?),
            rounds: reg!(IntCounter::with_opts(opts(m::ROUNDS, "Scheduler rounds run"))?),
            registry,
        })
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = vec![];
        let enc = TextEncoder::new();
        if let Err(e) = enc.encode(&self.registry.gather(), &mut buf) {
            return format!("# encode error: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn metrics() -> Metrics {
        Metrics::new(&MetricLabels {
            model: "tiny".into(),
            role: "fused".into(),
            dp_rank: 0,
            tp_rank: 1,
            replica: "host-a:8000".into(),
        })
        .unwrap()
    }

    /// Series identities of an exposition: name and labels sorted by name, value dropped
    /// (the registry's constant labels come in hash order).
    fn series(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| l.rsplit_once(' ').map(|(id, _)| id))
            .map(|id| match id.split_once('{') {
                Some((name, labels)) => {
                    let mut ls: Vec<String> = labels
                        .trim_end_matches('}')
                        .split("\",")
                        .map(|l| format!("{}\"", l.trim_end_matches('"')))
                        .collect();
                    ls.sort_unstable();
                    format!("{name}{{{}}}", ls.join(","))
                }
                None => id.to_string(),
            })
            .collect()
    }

    /// Every `pub const ... = "tsl3_..."` metric name declared in names.rs.
    fn declared_names() -> Vec<String> {
        include_str!("names.rs")
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let rest = l.strip_prefix("pub const ")?;
                let (_, v) = rest.split_once("= \"")?;
                let v = v.split('"').next()?;
                (v.starts_with("tsl3_")).then(|| v.to_string())
            })
            .collect()
    }

    #[test]
    fn every_series_carries_the_rank_labels_and_no_keys() {
        let m = metrics();
        m.l3_operations
            .with_label_values(&["get", "completed"])
            .inc();
        m.prefix_tokens.with_label_values(&["l3"]).inc_by(5);
        m.ttft_seconds.observe(0.01);
        let text = m.render();
        assert!(text.contains("tsl3_l3_operations_total{"), "{text}");
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert!(line.contains("tp_rank=\"1\""), "{line}");
            assert!(line.contains("model=\"tiny\""), "{line}");
            assert!(!line.contains("tsl3-"), "no object keys: {line}");
        }
    }

    #[test]
    fn every_known_label_combination_exists_at_zero_before_any_traffic() {
        let text = metrics().render();
        let ids = series(&text);
        let has = |name: &str, labels: &str| {
            ids.iter()
                .any(|id| id.starts_with(&format!("{name}{{")) && id.contains(labels))
        };
        for k in StorageOpKind::ALL {
            for o in L3_OUTCOMES {
                let l = format!("kind=\"{}\",model", k.as_str());
                assert!(
                    ids.iter().any(|id| id.starts_with(m::L3_OPERATIONS)
                        && id.contains(&l)
                        && id.contains(&format!("outcome=\"{o}\""))),
                    "{k:?} {o}\n{text}"
                );
            }
            for st in L3_JOB_STATES {
                assert!(
                    ids.iter()
                        .any(|id| id.starts_with(&format!("{}{{", m::L3_JOBS))
                            && id.contains(&format!("kind=\"{}\"", k.as_str()))
                            && id.contains(&format!("state=\"{st}\""))),
                    "{k:?} {st}"
                );
            }
        }
        for r in DropReason::ALL {
            assert!(has(
                m::L3_DROPPED_BACKUP_KEYS,
                &format!("reason=\"{}\"", r.as_str())
            ));
        }
        for f in FallbackReason::ALL {
            assert!(has(
                m::REQUESTS,
                &format!("fallback_reason=\"{}\"", f.as_str())
            ));
        }
        for t in PREFIX_TIERS {
            assert!(has(m::PREFIX_TOKENS, &format!("tier=\"{t}\"")));
        }
        for k in TAIL_KINDS {
            assert!(has(m::TAIL_BLOCKS_QUERIED, &format!("kind=\"{k}\"")));
            assert!(has(m::TAIL_BLOCKS_REUSED, &format!("kind=\"{k}\"")));
        }
        for t in TAIL_TIERS {
            assert!(has(m::TAIL_TOKENS_REUSED, &format!("tier=\"{t}\"")));
        }
        for c in CREDITS {
            assert!(has(m::L3_CREDITS_IN_USE, &format!("credit=\"{c}\"")));
        }
        let fail: BTreeSet<_> = PROMOTION_FAIL_REASONS
            .iter()
            .map(|r| fail_reason_label(*r))
            .collect();
        assert_eq!(
            fail.len(),
            PROMOTION_FAIL_REASONS.len(),
            "labels are distinct"
        );
        for r in fail {
            assert!(has(m::PROMOTION_FAILED, &format!("reason=\"{r}\"")), "{r}");
        }
        for c in CAPACITY_REASONS {
            assert!(has(
                m::PROMOTION_REJECTED_TOTAL,
                &format!("reason=\"{}\"", capacity_label(c))
            ));
        }
        for t in LOCAL_GET_TIERS {
            assert!(has(m::LOCAL_GET_TOTAL, &format!("tier=\"{t}\"")));
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            if !line.contains("_bucket{") {
                assert!(line.ends_with(" 0"), "zero before traffic: {line}");
            }
        }
    }

    #[test]
    fn every_declared_metric_name_is_registered() {
        let text = metrics().render();
        let names = declared_names();
        assert!(names.len() >= 30, "{names:?}");
        for n in names {
            assert!(
                text.contains(&format!("# TYPE {n} ")),
                "{n} is declared in names.rs but not exported"
            );
        }
    }

    /// The dashboards' fixture exposition has exactly the series this registry exports, so
    /// its label values are the real ones (values may differ).
    #[test]
    fn the_dashboard_fixture_has_exactly_the_real_series() {
        let fixture = include_str!("../../deploy/checks/fixtures/engine-host-metrics.txt");
        let want = series(&metrics().render());
        let got = series(fixture);
        let missing: Vec<_> = want.difference(&got).collect();
        let extra: Vec<_> = got.difference(&want).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "fixture differs from Metrics::new: missing {missing:#?} extra {extra:#?} \
             (regenerate it: deploy/checks/gen_fixture.py)"
        );
    }
}
