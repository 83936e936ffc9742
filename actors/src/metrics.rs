//! Prometheus metrics of one engine host: one registry whose constant labels identify model,
//! role, DP rank and TP rank. This module owns registration and rendering only; values are
//! set from snapshots by the engine host at most once a second (and when storage turns
//! pending or idle). Metrics never feed a decision.

use crate::names::metric as m;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};
use std::collections::HashMap;

/// The labels every series carries.
#[derive(Clone, Debug)]
pub struct MetricLabels {
    pub model: String,
    pub role: String,
    pub dp_rank: u32,
    pub tp_rank: u32,
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
    pub l3_credits_in_use: IntGaugeVec,
    pub promotion_attempted: IntCounter,
    pub promotion_committed: IntCounter,
    pub promotion_failed: IntCounterVec,
    pub promotion_in_flight: IntGauge,
    pub promotion_staging_bytes: IntGauge,
    pub ttft_seconds: Histogram,
    pub prefix_tokens: IntCounterVec,
    pub requests: IntCounterVec,
    pub rounds: IntCounter,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

impl Metrics {
    pub fn new(labels: &MetricLabels) -> prometheus::Result<Self> {
        let mut constant = HashMap::new();
        constant.insert("model".to_string(), labels.model.clone());
        constant.insert("role".to_string(), labels.role.clone());
        constant.insert("dp_rank".to_string(), labels.dp_rank.to_string());
        constant.insert("tp_rank".to_string(), labels.tp_rank.to_string());
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
            ttft_seconds: reg!(Histogram::with_opts(
                HistogramOpts::new(m::TTFT_SECONDS, "Time to first token").buckets(vec![
                    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0
                ])
            )?),
            prefix_tokens: reg!(IntCounterVec::new(
                opts(m::PREFIX_TOKENS, "Prompt tokens by where their KV came from"),
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

    #[test]
    fn every_series_carries_the_rank_labels_and_no_keys() {
        let m = Metrics::new(&MetricLabels {
            model: "tiny".into(),
            role: "fused".into(),
            dp_rank: 0,
            tp_rank: 1,
        })
        .unwrap();
        m.l3_operations.with_label_values(&["get", "ok"]).inc();
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
}
