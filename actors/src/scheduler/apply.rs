//! Applying an agreed round: the StorageTransferManager's report (its view, the backup
//! candidates, backend trouble), cancellations, the round's effects (forgotten and
//! re-offered candidates, query results, published GET rows becoming a Ready hold, ended
//! waits, expired Ready holds, released Host references), new arrivals and prefill
//! digests, then the round's decode step.
//!
//! It never admits a request to the Device (admit.rs) and never plans a storage operation
//! itself (an answered QUERY goes to prepare.rs); it never performs I/O and never reads a
//! clock: deadlines arrive as the manager's `waits_ended`.

use super::request::{PrefetchPhase, Request, RequestState};
use super::{AgreedInputs, RefUse, Scheduler};
use crate::frontend::FallbackReason;
use crate::storage_transfer::{BackendTrouble, HostRef, RoundEffects, StorageReport, WaitEnd};
use messages::{OperationId, ProtocolError, RequestId};
use std::collections::{BTreeMap, BTreeSet};

impl Scheduler {
    /// Applies one agreed round: the StorageTransferManager's report of it (which already
    /// applied the tick, the cancellations and the completions to its tickets; None with
    /// storage disabled), then cancellations, new requests and prefill digests.
    pub fn apply(
        &mut self,
        input: AgreedInputs,
        report: Option<StorageReport>,
    ) -> Result<(), ProtocolError> {
        self.stats.rounds += 1;
        let AgreedInputs {
            new_requests,
            cancellations,
            completions,
            digests,
            ..
        } = input;
        match (report, self.storage.as_mut()) {
            (Some(report), Some(planner)) => {
                let StorageReport {
                    effects,
                    trouble,
                    view,
                    put_candidates,
                } = report;
                planner.begin(view, put_candidates);
                self.note_backend_trouble(&trouble);
                for id in &cancellations {
                    self.abort(*id, "cancelled by the client");
                }
                self.apply_effects(effects);
            }
            (None, None) => {
                if let Some(d) = completions.first() {
                    return Err(ProtocolError::new(
                        d.op,
                        "a storage completion arrived while storage is disabled",
                    ));
                }
                for id in &cancellations {
                    self.abort(*id, "cancelled by the client");
                }
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(ProtocolError::new(
                    OperationId(0),
                    "a storage report and the storage configuration disagree",
                ));
            }
        }
        for (id, prompt, max_tokens) in new_requests {
            if self.requests.contains_key(&id) || prompt.is_empty() {
                continue;
            }
            self.trace.request_arrived(id, prompt.len());
            self.requests
                .insert(id, Request::new(id, prompt, max_tokens.max(1)));
            self.queue.insert(id);
            self.unprepared.push_back(id);
        }
        for (id, parts) in digests {
            self.apply_digest(id, &parts);
        }
        self.decode_step();
        Ok(())
    }

    /// A read that the executor rejected as unhealthy (or that failed with a backend
    /// exception), or rejected after quarantine, records why its request falls back.
    fn note_backend_trouble(&mut self, trouble: &[(RequestId, BackendTrouble)]) {
        for (req, why) in trouble {
            let why = match why {
                BackendTrouble::Unhealthy => FallbackReason::Unhealthy,
                BackendTrouble::Quarantined => FallbackReason::Quarantine,
            };
            if let Some(r) = self.requests.get_mut(req) {
                r.resources.fallback.get_or_insert(why);
            }
        }
    }

    pub(super) fn apply_effects(&mut self, fx: RoundEffects) {
        // Candidates that left the backup queue without a PUT: forget their (nonowning)
        // references. A PUT rejected for capacity re-queues its candidate: its source
        // reference is released below but the candidate's record stays.
        for h in &fx.forgotten {
            if matches!(self.refs.get(h), Some(RefUse::PutSource(..))) {
                self.refs.remove(h);
            }
        }
        let reoffered: BTreeSet<HostRef> = fx.reoffer.iter().map(|c| c.host).collect();
        // Query results: reserve destinations and read, or fall back to local admission.
        for q in fx.query_results {
            self.on_query_result(q.request, &q.exists);
        }
        // Publication of fully successful, retired rows of attached GETs.
        let mut published: BTreeMap<RequestId, BTreeSet<HostRef>> = BTreeMap::new();
        for row in &fx.publish {
            published.entry(row.request).or_default().insert(row.host);
        }
        for (req, rows) in published {
            self.on_get_published(req, &rows);
        }
        for (req, why) in fx.waits_ended {
            self.on_wait_ended(req, why);
        }
        for req in fx.ready_expired {
            if let Some(r) = self.requests.get_mut(&req) {
                r.resources.ready = None;
            }
        }
        for h in fx.release {
            self.on_release(h, reoffered.contains(&h));
        }
    }

    fn on_get_published(&mut self, id: RequestId, rows: &BTreeSet<HostRef>) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let RequestState::Prefetching {
            phase: PrefetchPhase::Get(read),
            ..
        } = &r.state
        else {
            return;
        };
        let read = *read;
        let Some(rec) = self.reads.get_mut(&read) else {
            return;
        };
        let Some(res) = rec.reservation.take() else {
            return;
        };
        let ok: Vec<bool> = rec.rows.iter().map(|h| rows.contains(h)).collect();
        match self.cache.publish_host(res, &ok) {
            Ok(hold) => rec.hold = Some(hold),
            Err(_) => {
                // A length mismatch keeps the destinations held (never published or freed).
            }
        }
        // The wait continues as a Ready hold: the lease moves to the admission resources.
        let state = std::mem::replace(&mut r.state, RequestState::Admissible);
        if let RequestState::Prefetching { lease, .. } = state {
            r.resources.ready = Some(lease);
        }
        self.queue_front_by_arrival(id);
    }

    fn on_wait_ended(&mut self, id: RequestId, why: WaitEnd) {
        let reason = match why {
            WaitEnd::Completed => None,
            WaitEnd::SoftTimeout => Some(FallbackReason::Deadline),
            WaitEnd::Pressure => Some(FallbackReason::Pressure),
            WaitEnd::Detached => {
                if self.l3_enabled() {
                    None
                } else {
                    Some(FallbackReason::Quarantine)
                }
            }
        };
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        if matches!(r.state, RequestState::Prefetching { .. }) {
            self.end_prefetch(id, reason);
        } else if let Some(r) = self.requests.get_mut(&id) {
            // A Ready hold's wait ended (admission, expiry): its lease is stale now.
            if reason.is_some() && r.resources.fallback.is_none() {
                r.resources.fallback = reason;
            }
        }
    }

    /// Ends a Prefetching state: the request continues to ordinary admission. The lease is
    /// handed back (a stale one does nothing).
    pub(super) fn end_prefetch(&mut self, id: RequestId, reason: Option<FallbackReason>) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        if reason.is_some() && r.resources.fallback.is_none() {
            r.resources.fallback = reason;
        }
        let state = std::mem::replace(&mut r.state, RequestState::Admissible);
        let RequestState::Prefetching {
            lease,
            continuation: _,
            phase: _,
        } = state
        else {
            r.state = state;
            return;
        };
        self.queue_front_by_arrival(id);
        if let Some(planner) = self.storage.as_mut() {
            planner.detach(lease);
        }
    }

    /// Puts a request back into the admission queue at its arrival position.
    fn queue_front_by_arrival(&mut self, id: RequestId) {
        self.queue.insert(id);
    }

    /// The manager no longer holds `h`. A re-queued PUT source keeps its candidate record
    /// (the Host pin is released; dispatch rechecks residency).
    fn on_release(&mut self, h: HostRef, reoffered: bool) {
        match self.refs.get(&h).copied() {
            Some(RefUse::GetRow { read }) => {
                self.refs.remove(&h);
                let done = match self.reads.get_mut(&read) {
                    Some(rec) => {
                        rec.released += 1;
                        rec.released >= rec.rows.len()
                    }
                    None => false,
                };
                if done {
                    if let Some(rec) = self.reads.remove(&read) {
                        if let Some(res) = rec.reservation {
                            let _ = self.cache.abandon(res);
                        }
                        if let Some(hold) = rec.hold {
                            let _ = self.cache.release_hold(hold);
                        }
                    }
                }
            }
            Some(RefUse::PutSource(addr, _)) => {
                if !reoffered {
                    self.refs.remove(&h);
                }
                let _ = self.cache.host_mut().release(addr);
            }
            None => {}
        }
    }
}
