//! Exports snapshots of the rank (scheduler, StorageTransferManager, L3 executor, health)
//! into the Prometheus registry: at most once a second, and whenever storage turns pending
//! or idle. Counters advance by the difference between cumulative snapshots. Metrics never
//! feed a decision; this module only reads. The local store's promotion funnel and GET tiers
//! come from the `LocalStore` the serve code hands over (`Exporter::with_local`).

use crate::engine::RankView;
use crate::frontend::FallbackReason;
use crate::l3::store::dfs::{DfsStore, InvalidReason};
use crate::l3::store::local::LocalStore;
use crate::l3::store::promotion::stats::PromotionStats;
use crate::l3::store::tiered::TieredStore;
use crate::metrics::{
    capacity_label, fail_reason_label, Metrics, CAPACITY_REASONS, DFS_PUT_RESULTS,
    DFS_READ_RESULTS, L3_JOB_STATES, L3_OUTCOMES, LOCAL_GET_TIERS, PREFIX_TIERS,
    PROMOTION_FAIL_REASONS, TAIL_KINDS, TAIL_TIERS,
};
use crate::storage_transfer::DropReason;
use messages::StorageOpKind;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A store with DFS -> MEMORY promotion whose statistics the exporter reads: the local store
/// (in-process MEMORY tier) or the tiered store (Mooncake as the MEMORY tier).
#[derive(Clone)]
pub enum PromotingStore {
    Local(Arc<LocalStore>),
    Tiered(Arc<TieredStore>),
}

impl PromotingStore {
    fn promotion_stats(&self) -> &PromotionStats {
        match self {
            PromotingStore::Local(l) => l.promotion_stats(),
            PromotingStore::Tiered(t) => t.promotion_stats(),
        }
    }
    fn staging_used(&self) -> u64 {
        match self {
            PromotingStore::Local(l) => l.staging().used(),
            PromotingStore::Tiered(t) => t.staging().used(),
        }
    }
    fn dfs(&self) -> &DfsStore {
        match self {
            PromotingStore::Local(l) => l.dfs(),
            PromotingStore::Tiered(t) => t.dfs(),
        }
    }
    /// GETs served by the MEMORY tier and by the DFS tier.
    fn gets(&self) -> [u64; 2] {
        match self {
            PromotingStore::Local(l) => [
                l.stats.memory_hits.load(Ordering::Relaxed),
                l.stats.dfs_reads.load(Ordering::Relaxed),
            ],
            PromotingStore::Tiered(t) => [
                t.stats.memory_hits.load(Ordering::Relaxed),
                t.stats.dfs_reads.load(Ordering::Relaxed),
            ],
        }
    }
}

#[derive(Default)]
pub struct Exporter {
    last: Option<Instant>,
    was_pending: bool,
    prev: BTreeMap<String, u64>,
    local: Option<PromotingStore>,
}

impl Exporter {
    /// An exporter that also reads the promotion and GET statistics of the rank's store
    /// when it promotes (the local store, or Mooncake over a DFS tier).
    pub fn with_local(local: Option<PromotingStore>) -> Self {
        Self {
            local,
            ..Self::default()
        }
    }

    /// Advances a counter to the cumulative value `now` (never backwards).
    fn advance(&mut self, key: String, now: u64) -> u64 {
        let prev = self.prev.insert(key, now).unwrap_or(0);
        now.saturating_sub(prev)
    }

    /// Whether an export is due: once a second, and whenever storage work starts or ends
    /// (`pending`: storage tickets are outstanding).
    pub fn due(&mut self, pending: bool) -> bool {
        let due = self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        if !due && pending == self.was_pending {
            return false;
        }
        self.was_pending = pending;
        self.last = Some(Instant::now());
        true
    }

    /// Exports a rank's counters (advancing the cumulative ones) and its round's health.
    pub fn export(
        &mut self,
        m: &Metrics,
        view: &RankView,
        health: &crate::frontend::health::RankHealth,
        round: u64,
    ) {
        let s = &view.scheduler.stats;
        let d = self.advance("rounds".into(), s.rounds);
        m.rounds.inc_by(d);
        let tiers = [s.prefix_device, s.prefix_host, s.prefix_l3, s.computed];
        for (tier, v) in PREFIX_TIERS.into_iter().zip(tiers) {
            let d = self.advance(format!("prefix/{tier}"), v);
            m.prefix_tokens.with_label_values(&[tier]).inc_by(d);
        }
        let d = self.advance("tail/queried".into(), s.tail_candidates_queried);
        m.tail_candidates_queried.inc_by(d);
        for (i, k) in TAIL_KINDS.into_iter().enumerate() {
            let d = self.advance(format!("tail/queried/{k}"), s.tail_blocks_queried[i]);
            m.tail_blocks_queried.with_label_values(&[k]).inc_by(d);
            let d = self.advance(format!("tail/reused/{k}"), s.tail_blocks_reused[i]);
            m.tail_blocks_reused.with_label_values(&[k]).inc_by(d);
        }
        for (i, t) in TAIL_TIERS.into_iter().enumerate() {
            let d = self.advance(format!("tail/tokens/{t}"), s.tail_tokens_reused[i]);
            m.tail_tokens_reused.with_label_values(&[t]).inc_by(d);
        }
        for f in FallbackReason::ALL {
            let v = s.fallback[f.index()];
            let d = self.advance(format!("fallback/{}", f.as_str()), v);
            m.requests.with_label_values(&[f.as_str()]).inc_by(d);
        }
        if let Some(st) = &view.stm {
            m.l3_ready_holds.set(st.ready_holds as i64);
            m.l3_quarantined_references.set(st.quarantined_refs as i64);
            let d = self.advance("soft_timeouts".into(), st.soft_timeouts);
            m.l3_soft_timeouts.inc_by(d);
            let d = self.advance("ready_expirations".into(), st.ready_expirations);
            m.l3_ready_expirations.inc_by(d);
            let d = self.advance("pressure_bypasses".into(), st.pressure_bypasses);
            m.l3_pressure_bypasses.inc_by(d);
            for r in DropReason::ALL {
                let d = self.advance(format!("drop/{}", r.as_str()), st.dropped(r));
                m.l3_dropped_backup_keys
                    .with_label_values(&[r.as_str()])
                    .inc_by(d);
            }
            m.l3_admission_gate_open
                .set(if st.gate_closed { 0 } else { 1 });
            let d = self.advance("gate_closed_us".into(), st.gate_closed_us);
            m.l3_admission_gate_closed_seconds.inc_by(d as f64 / 1e6);
            m.l3_credits_in_use
                .with_label_values(&["operation"])
                .set(st.operation_credits_in_use as i64);
            m.l3_credits_in_use
                .with_label_values(&["host"])
                .set(st.host_credits_in_use as i64);
        }
        if let Some(st) = &view.executor {
            for k in StorageOpKind::ALL {
                let ks = st.kind(k);
                let kind = k.as_str();
                let outcomes = [
                    ks.completed.saturating_sub(ks.failed),
                    ks.failed,
                    ks.rejected,
                    ks.cancelled,
                ];
                for (outcome, v) in L3_OUTCOMES.into_iter().zip(outcomes) {
                    let d = self.advance(format!("ops/{kind}/{outcome}"), v);
                    m.l3_operations
                        .with_label_values(&[kind, outcome])
                        .inc_by(d);
                }
                let d = self.advance(format!("completed/{kind}"), ks.completed);
                m.l3_completed_jobs.with_label_values(&[kind]).inc_by(d);
                let d = self.advance(format!("bytes/{kind}"), ks.payload_bytes);
                m.l3_payload_bytes.with_label_values(&[kind]).inc_by(d);
                let d = self.advance(format!("calls/{kind}"), ks.backend_calls);
                m.l3_backend_calls.with_label_values(&[kind]).inc_by(d);
                let d = self.advance(format!("queue_us/{kind}"), ks.queue_time_us_total);
                m.l3_queue_seconds
                    .with_label_values(&[kind])
                    .inc_by(d as f64 / 1e6);
                let d = self.advance(format!("backend_us/{kind}"), ks.backend_time_us_total);
                m.l3_backend_seconds
                    .with_label_values(&[kind])
                    .inc_by(d as f64 / 1e6);
                let j = st.jobs[k.index()];
                for (state, v) in L3_JOB_STATES.into_iter().zip([j.queued, j.running]) {
                    m.l3_jobs.with_label_values(&[kind, state]).set(v as i64);
                }
            }
            let d = self.advance("new_writes".into(), st.kind(StorageOpKind::Put).new_writes);
            m.l3_put_new_writes.inc_by(d);
            let p = view.pressure;
            for k in StorageOpKind::ALL {
                m.l3_queued_payload_bytes
                    .with_label_values(&[k.as_str()])
                    .set(p.queued[k.index()].payload_bytes as i64);
            }
            m.l3_oldest_job_age_seconds
                .set(p.oldest_age_us as f64 / 1e6);
            if let Some(h) = view.health {
                m.l3_health_state.set(h.state.as_gauge());
                m.l3_health_epoch.set(h.epoch as i64);
            }
            let unproven = st.jobs.iter().any(|j| j.unretired > 0);
            m.l3_unproven_retirement.set(unproven as i64);
        }
        if let Some(local) = self.local.clone() {
            self.export_local(m, &local);
        }
        health.record_round(crate::frontend::health::RoundHealth {
            round,
            namespace: view.scheduler.namespace.as_str().to_string(),
            live_requests: view.scheduler.live_requests,
            storage: view.health,
            l3_enabled: view.scheduler.l3_enabled,
        });
    }

    /// DFS -> MEMORY promotion funnel, staging and GET tiers of the local store.
    fn export_local(&mut self, m: &Metrics, local: &PromotingStore) {
        let ps = local.promotion_stats();
        let f = ps.funnel();
        for (key, v, c) in [
            ("promo/attempted", f.attempted, &m.promotion_attempted),
            ("promo/committed", f.committed, &m.promotion_committed),
            ("promo/expired", f.expired, &m.promotion_expired),
            ("promo/cancelled", f.cancelled, &m.promotion_cancelled),
        ] {
            let d = self.advance(key.into(), v);
            c.inc_by(d);
        }
        for r in PROMOTION_FAIL_REASONS {
            let label = fail_reason_label(r);
            let d = self.advance(format!("promo/failed/{label}"), ps.failed_by(r));
            m.promotion_failed.with_label_values(&[label]).inc_by(d);
        }
        for c in CAPACITY_REASONS {
            let label = capacity_label(c);
            let d = self.advance(format!("promo/rejected/{label}"), ps.rejected_by(c));
            m.promotion_rejected.with_label_values(&[label]).inc_by(d);
        }
        m.promotion_in_flight.set(f.in_flight as i64);
        m.promotion_staging_bytes.set(local.staging_used() as i64);
        let gets = local.gets();
        for (tier, v) in LOCAL_GET_TIERS.into_iter().zip(gets) {
            let d = self.advance(format!("local_get/{tier}"), v);
            m.local_get.with_label_values(&[tier]).inc_by(d);
        }
        self.export_dfs(m, local.dfs());
    }

    /// The DFS tier's read and PUT results and the invalid objects it found.
    fn export_dfs(&mut self, m: &Metrics, dfs: &DfsStore) {
        let s = &dfs.stats;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        let reads = [
            &s.reads_ok,
            &s.reads_missing,
            &s.reads_invalid,
            &s.reads_failed,
        ];
        self.advance_each(
            "dfs_read",
            |l, d| m.dfs_reads.with_label_values(&[l]).inc_by(d),
            DFS_READ_RESULTS,
            reads.map(load),
        );
        let puts = [
            &s.objects_written,
            &s.already_exists,
            &s.puts_capacity,
            &s.puts_failed,
        ];
        self.advance_each(
            "dfs_put",
            |l, d| m.dfs_puts.with_label_values(&[l]).inc_by(d),
            DFS_PUT_RESULTS,
            puts.map(load),
        );
        self.advance_each(
            "dfs_invalid",
            |l, d| m.dfs_invalid_objects.with_label_values(&[l]).inc_by(d),
            InvalidReason::ALL.map(|r| r.as_str()),
            InvalidReason::ALL.map(|r| s.invalid(r)),
        );
        let d = self.advance("dfs_invalid_removed".into(), load(&s.invalid_removed));
        m.dfs_invalid_removed.inc_by(d);
    }

    /// Advances one labelled counter per (label, cumulative value).
    fn advance_each<const N: usize>(
        &mut self,
        key: &str,
        inc: impl Fn(&str, u64),
        labels: [&str; N],
        values: [u64; N],
    ) {
        for (label, v) in labels.into_iter().zip(values) {
            let d = self.advance(format!("{key}/{label}"), v);
            inc(label, d);
        }
    }
}
