//! Storage preparation, the read transaction's planning: which requests are eligible, the
//! QUERY of each new arrival, the GET an answered QUERY leads to (Host destinations
//! reserved), and the fallback reason a refused planning call leaves.
//!
//! Every QUERY and GET is decided by the StorageTransferManager, asked directly (operation
//! ID and lease, or the refusal); this module never decides storage admission itself and
//! never performs I/O. It never decides Device admission (admit.rs does): a request it does
//! not prepare goes on to ordinary admission.

use super::apply::end_prefetch_in;
use super::request::{Continuation, PrefetchPhase, Request, RequestState};
use super::{tail_kind, ReadRecord, Scheduler, SchedulerStats};
use crate::cache::coordinator::{CacheCoordinator, ExistenceHints, QueryLimits};
use crate::cache::credits::QueryCredits;
use crate::cache::geometry::CacheGeometry;
use crate::frontend::FallbackReason;
use crate::row_set::RowSet;
use crate::storage_transfer::trace::RequestTrace;
use crate::storage_transfer::{Destinations, Refusal, StorageTransferManager};
use messages::RequestId;
use std::collections::BTreeSet;

/// The fallback a refused planning call leaves on its request.
fn refusal_reason(e: &Refusal) -> FallbackReason {
    match e {
        Refusal::PressureClosed => FallbackReason::Pressure,
        Refusal::Disabled => FallbackReason::Quarantine,
        _ => FallbackReason::Miss,
    }
}

impl Scheduler {
    pub(super) fn storage_eligible(&self, r: &Request) -> bool {
        Self::eligible(self.l3_enabled, r)
    }

    fn eligible(l3_enabled: bool, r: &Request) -> bool {
        !r.resources.storage_prepared && l3_enabled && matches!(r.state, RequestState::Submitted)
    }

    /// Considers each new arrival once. The arrivals' IDs are assigned in arrival order, so
    /// they are (almost always) one dense run at the top of the request table: one search
    /// finds the run's first entry and the walk visits each arrival in turn, instead of one
    /// table search per arrival. The walk runs only when the run spans fewer than twice as
    /// many IDs as there are arrivals, so it never visits more than twice the arrivals;
    /// sparse IDs (which the frontend never assigns, but the scheduler accepts) are
    /// searched for one by one.
    pub(super) fn prepare_storage(&mut self, stm: &mut StorageTransferManager) {
        let mut ids = std::mem::take(&mut self.unprepared);
        if !ids.is_sorted() {
            ids.sort_unstable();
        }
        let Self {
            requests,
            cache,
            trace,
            cfg,
            stats,
            queue,
            l3_enabled,
            ..
        } = self;
        let mut p = Preparer {
            cache,
            trace,
            geometry: &cfg.layout.geometry,
            stats,
            queue,
            l3_enabled: *l3_enabled,
        };
        if let (Some(&first), Some(&last)) = (ids.first(), ids.last()) {
            let dense = last.0 - first.0 < 2 * ids.len() as u64;
            if dense {
                let mut next = ids.iter().copied().peekable();
                for (&id, r) in requests.range_mut(first..=last) {
                    // Arrivals the table no longer holds (or duplicates) are passed over.
                    while next.next_if(|n| *n < id).is_some() {}
                    if next.next_if_eq(&id).is_some() {
                        p.prepare(stm, id, r);
                    }
                }
            } else {
                for &id in &ids {
                    if let Some(r) = requests.get_mut(&id) {
                        p.prepare(stm, id, r);
                    }
                }
            }
        }
        ids.clear();
        self.unprepared = ids;
    }

    /// An attached QUERY was answered: `exists` per key, in its plan's row order (the
    /// GET's keys are made again for the rows it reads: a page key is a reference count
    /// and its numbers, as cheap as a copy).
    pub(super) fn on_query_result(
        &mut self,
        id: RequestId,
        exists: &[bool],
        storage: Option<&mut StorageTransferManager>,
    ) {
        // The hints are made in the scheduler's own lists, kept for the next answer.
        let mut hints = std::mem::take(&mut self.hints);
        self.answer_query(id, exists, storage, &mut hints);
        self.hints = hints;
    }

    /// `on_query_result` with the lists its existence hints are made in.
    fn answer_query(
        &mut self,
        id: RequestId,
        exists: &[bool],
        storage: Option<&mut StorageTransferManager>,
        hints: &mut ExistenceHints,
    ) {
        // The request is found once; the other parts are borrowed beside it.
        let Self {
            requests,
            cache,
            trace,
            reads,
            next_read,
            queue,
            handbacks,
            ..
        } = self;
        let Some(r) = requests.get_mut(&id) else {
            return;
        };
        let RequestState::Prefetching { phase, .. } = &r.state else {
            return;
        };
        let PrefetchPhase::Query(plan) = phase else {
            return;
        };
        if plan.existence_hints_into(exists, hints).is_err() {
            end_prefetch_in(r, id, Some(FallbackReason::Miss), cache, queue, handbacks);
            return;
        }
        let Some(stm) = storage else {
            return;
        };
        if stm.gate_closed() {
            end_prefetch_in(
                r,
                id,
                Some(FallbackReason::Pressure),
                cache,
                queue,
                handbacks,
            );
            return;
        }
        // No block is known to exist: a reservation could only assume what local data
        // already holds, so it would reserve nothing (a Miss). Decided without matching.
        if hints.is_empty() {
            end_prefetch_in(r, id, Some(FallbackReason::Miss), cache, queue, handbacks);
            return;
        }
        let host_credits = stm.host_credits_left();
        let reusable = r.reusable();
        let whole = r.whole_index(cache);
        let mut res = match cache.reserve_in(Some(&whole), &r.prompt, reusable, hints, host_credits)
        {
            Ok(res) => res,
            Err(_) => {
                end_prefetch_in(r, id, Some(FallbackReason::Miss), cache, queue, handbacks);
                return;
            }
        };
        if res.is_empty() {
            let _ = cache.abandon(res);
            end_prefetch_in(r, id, Some(FallbackReason::Miss), cache, queue, handbacks);
            return;
        }
        if res.rows.len() >= super::GET_ROWS_MAX {
            let _ = cache.abandon(res);
            end_prefetch_in(r, id, Some(FallbackReason::Miss), cache, queue, handbacks);
            return;
        }
        *next_read += 1;
        let read = *next_read;
        let rows = res.rows.len();
        let mut dests = Destinations::with_capacity(rows);
        for (i, row) in res.rows.iter().enumerate() {
            dests.push(super::get_row_ref(read, i), row.range);
        }
        // The GET takes the reservation's page keys (its rows keep their pages and ranges).
        let keys = std::mem::take(&mut res.keys);
        let parent = trace.request_span(id).cloned();
        match stm.plan_get(id, keys, dests, parent) {
            Ok(_) => {
                reads.insert(
                    read,
                    ReadRecord {
                        released_rows: RowSet::none(rows),
                        reservation: Some(res),
                        hold: None,
                    },
                );
                if let RequestState::Prefetching { phase, .. } = &mut r.state {
                    // The answered plan's lists serve the next QUERYs.
                    if let PrefetchPhase::Query(plan) =
                        std::mem::replace(phase, PrefetchPhase::Get(read))
                    {
                        cache.recycle_plan(plan);
                    }
                }
            }
            Err(e) => {
                let _ = cache.abandon(res);
                end_prefetch_in(r, id, Some(refusal_reason(&e)), cache, queue, handbacks);
            }
        }
    }
}

/// The scheduler parts one arrival's preparation touches, borrowed beside the request
/// table (so the arrivals can be walked while each is prepared).
struct Preparer<'a> {
    cache: &'a CacheCoordinator,
    trace: &'a RequestTrace,
    geometry: &'a CacheGeometry,
    stats: &'a mut SchedulerStats,
    queue: &'a mut BTreeSet<RequestId>,
    l3_enabled: bool,
}

impl Preparer<'_> {
    /// One arrival: it waits on its QUERY, out of the admission queue, or joins the queue.
    fn prepare(&mut self, stm: &mut StorageTransferManager, id: RequestId, r: &mut Request) {
        if !self.plan_query(stm, id, r) {
            self.queue.insert(id);
        }
    }

    /// The bound check, then the QUERY the manager admits (or the refusal the request falls
    /// back with). True when a QUERY was planned.
    fn plan_query(
        &mut self,
        stm: &mut StorageTransferManager,
        id: RequestId,
        r: &mut Request,
    ) -> bool {
        if !Scheduler::eligible(self.l3_enabled, r) {
            return false;
        }
        r.resources.storage_prepared = true;
        // Credits exhausted: every QUERY would be refused, so none is planned (a
        // credit-starved round costs no matching per arrival). The reason counts only
        // if admission then falls short of the reusable bound.
        if let Some(e) = stm.query_credits_refusal() {
            r.resources.storage_refused = Some(refusal_reason(&e));
            r.state = RequestState::Admissible;
            return false;
        }
        // The page keys are made only for a QUERY the manager admits (most refusals,
        // e.g. exhausted credits, then cost no key strings).
        let whole = r.whole_index(self.cache);
        // Local data already covers the bound (a repeated prompt): nothing to QUERY,
        // decided from the bound's own blocks without a match table.
        if self
            .cache
            .local_covers_bound(&whole, &r.prompt, r.reusable())
        {
            r.state = RequestState::Admissible;
            return false;
        }
        let cfg = stm.config();
        let q = QueryCredits {
            keys: cfg.max_keys_per_operation,
            host_blocks: stm.host_credits_left(),
        };
        let limits = QueryLimits {
            lookahead_tokens: cfg.lookahead_tokens,
            min_extension_tokens: cfg.min_extension_tokens,
        };
        let qp = self
            .cache
            .plan_query_rows_in(Some(&whole), &r.prompt, r.reusable(), q, limits);
        if qp.bypass.is_some() || qp.rows.is_empty() {
            r.state = RequestState::Admissible;
            return false;
        }
        r.resources.local_at_plan = qp.local_tokens;
        r.resources.planned_boundary = qp.boundaries.first().map_or(0, |b| b.boundary);
        let parent = self.trace.request_span(id).cloned();
        let cache = self.cache;
        let n = qp.rows.len();
        match stm.plan_query_with(id, n, || cache.query_keys(&qp), parent) {
            Ok((_, lease)) => {
                for b in qp.boundaries.iter().filter(|b| b.tail.is_some()) {
                    self.stats.tail_candidates_queried += 1;
                    for g in self.geometry.groups() {
                        if !b.boundary.is_multiple_of(g.block_tokens.max(1)) {
                            self.stats.tail_blocks_queried[tail_kind(g.kind)] += 1;
                        }
                    }
                }
                r.state = RequestState::Prefetching {
                    continuation: Continuation::Submitted,
                    phase: PrefetchPhase::Query(qp),
                    lease,
                };
                true
            }
            Err(e) => {
                r.resources.fallback = Some(refusal_reason(&e));
                r.state = RequestState::Admissible;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::refusal_reason;
    use crate::frontend::FallbackReason;
    use crate::storage_transfer::Refusal;
    use messages::{RequestId, StorageOp};

    #[test]
    fn an_eligible_arrival_gets_one_query_and_leaves_the_queue() {
        let mut rig = rig(true);
        let p = prompt(32, 1);
        let plan = rig.arrive(&[(1, &p, 2)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        assert_eq!(q.request, Some(RequestId(1)));
        assert_eq!(
            q.keys.len(),
            8,
            "seven aligned blocks and the tail at the reusable bound"
        );
        assert!(plan.forwards.is_empty());
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefetching"));
        assert!(!rig.s.queue.contains(&RequestId(1)));
        assert!(rig.s.requests[&RequestId(1)].resources.storage_prepared);
        assert!(rig.s.unprepared.is_empty());
    }

    /// The arrivals' QUERYs, by request.
    fn queried(plan: &super::super::Plan<StorageOp>) -> Vec<RequestId> {
        let mut ids: Vec<RequestId> = plan
            .storage
            .iter()
            .filter_map(|op| match op {
                StorageOp::Query(q) => q.request,
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn arrivals_out_of_order_sparse_or_around_an_older_request_are_each_prepared_once() {
        let mut rig = rig(true);
        let (a, b, c, d) = (
            prompt(32, 11),
            prompt(32, 12),
            prompt(32, 13),
            prompt(32, 14),
        );
        // Round 1: request 5 arrives and is prepared.
        let plan = rig.arrive(&[(5, &a, 2)]);
        assert_eq!(queried(&plan), [RequestId(5)]);
        // Round 2: 6 and 4 (listed out of order) around the prepared 5: the dense walk
        // passes over 5 and prepares each arrival.
        let plan = rig.arrive(&[(6, &b, 2), (4, &c, 2)]);
        assert_eq!(queried(&plan), [RequestId(4), RequestId(6)]);
        // Round 3: IDs far apart (not dense): each is searched on its own.
        let plan = rig.arrive(&[(1000, &d, 2), (2, &a, 2)]);
        assert_eq!(queried(&plan), [RequestId(2), RequestId(1000)]);
        for id in [2, 4, 5, 6, 1000] {
            let r = &rig.s.requests[&RequestId(id)];
            assert!(r.resources.storage_prepared, "request {id}");
            assert_eq!(rig.s.state_of(RequestId(id)), Some("prefetching"));
        }
        assert!(rig.s.unprepared.is_empty());
    }

    #[test]
    fn only_a_request_on_a_query_in_flight_lets_the_loop_wait_for_storage() {
        let mut rig = rig(true);
        assert!(
            !rig.s.waits_only_on_storage(),
            "no live request: quiet, not waiting"
        );
        let p = prompt(32, 6);
        rig.apply(arrivals(&[(1, &p, 2)]));
        assert!(
            !rig.s.waits_only_on_storage(),
            "unprepared: the plan has work"
        );
        let plan = rig.plan();
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        assert!(rig.s.waits_only_on_storage(), "the QUERY is in flight");
        let exists = vec![false; q.keys.len()];
        let plan = rig.round(query_done(q.op, exists));
        assert_eq!(plan.forwards.len(), 1);
        assert!(
            !rig.s.waits_only_on_storage(),
            "running: the next round decodes"
        );
    }

    #[test]
    fn storage_disabled_plans_no_storage_and_admits_at_once() {
        let mut rig = rig(false);
        let p = prompt(32, 2);
        rig.apply(arrivals(&[(1, &p, 2)]));
        let plan = rig.s.plan(None);
        assert!(plan.storage.is_empty());
        assert_eq!(plan.forwards.len(), 1);
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefill"));
        assert!(!rig.s.requests[&RequestId(1)].resources.storage_prepared);
    }

    #[test]
    fn a_prompt_with_nothing_reusable_bypasses_the_query() {
        let mut rig = rig(true);
        let p = prompt(1, 3); // the forward computes the last token: nothing to look up
        let plan = rig.arrive(&[(1, &p, 2)]);
        assert!(!plan
            .storage
            .iter()
            .any(|o| matches!(o, StorageOp::Query(_))));
        assert_eq!(plan.forwards.len(), 1);
        assert!(rig.s.requests[&RequestId(1)].resources.storage_prepared);
    }

    #[test]
    fn a_query_with_no_hit_falls_back_to_admission_as_a_miss() {
        let mut rig = rig(true);
        let p = prompt(32, 4);
        let plan = rig.arrive(&[(1, &p, 2)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        let exists = vec![false; q.keys.len()];
        let plan = rig.round(query_done(q.op, exists));
        assert!(!plan.storage.iter().any(|o| matches!(o, StorageOp::Get(_))));
        assert_eq!(plan.forwards.len(), 1);
        let r = &rig.s.requests[&RequestId(1)];
        assert_eq!(r.fallback, FallbackReason::Miss);
        assert_eq!(r.split.computed, 32);
    }

    #[test]
    fn a_prepared_request_is_no_longer_storage_eligible() {
        let mut rig = rig(true);
        let p = prompt(32, 5);
        rig.apply(arrivals(&[(1, &p, 2)]));
        let r = &rig.s.requests[&RequestId(1)];
        assert!(rig.s.storage_eligible(r));
        rig.plan();
        let r = &rig.s.requests[&RequestId(1)];
        assert!(!rig.s.storage_eligible(r), "prefetching, and prepared once");
    }

    #[test]
    fn refusals_map_to_their_fallback_reasons() {
        assert_eq!(
            refusal_reason(&Refusal::PressureClosed),
            FallbackReason::Pressure
        );
        assert_eq!(
            refusal_reason(&Refusal::Disabled),
            FallbackReason::Quarantine
        );
        assert_eq!(
            refusal_reason(&Refusal::OperationCredits),
            FallbackReason::Miss
        );
    }

    #[test]
    fn with_the_credits_exhausted_an_arrival_plans_no_query_and_reports_a_miss_only_if_it_computes()
    {
        let mut rig = rig(true);
        // A prompt computed once (its QUERY missed everywhere), then held by the Device.
        let held = prompt(32, 40);
        let plan = rig.arrive(&[(100, &held, 1)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        let plan = rig.round(query_done(q.op, vec![false; q.keys.len()]));
        assert_eq!(plan.forwards.len(), 1);
        rig.d2h_done();
        rig.apply(super::super::AgreedInputs {
            digests: digests_of(&plan),
            ..Default::default()
        });
        // Eight distinct arrivals take the eight operation credits with their QUERYs.
        let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(32, 50 + i)).collect();
        let arriving: Vec<(u64, &[u32], u32)> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| (i as u64 + 1, &p[..], 2))
            .collect();
        let plan = rig.arrive(&arriving);
        let queries = plan
            .storage
            .iter()
            .filter(|o| matches!(o, StorageOp::Query(_)))
            .count();
        assert_eq!(queries, 8);
        assert_eq!(
            rig.stm.as_ref().unwrap().query_credits_refusal(),
            Some(Refusal::OperationCredits)
        );
        // A new prompt and the held one arrive: neither is queried.
        let fresh = prompt(32, 90);
        let plan = rig.arrive(&[(20, &fresh, 2), (21, &held, 2)]);
        assert!(plan.storage.is_empty(), "{:?}", plan.storage);
        assert_eq!(plan.forwards.len(), 2, "both admitted at once");
        let r = &rig.s.requests[&RequestId(20)];
        assert!(r.resources.storage_prepared, "considered once");
        assert_eq!(r.resources.storage_refused, Some(FallbackReason::Miss));
        assert_eq!(
            r.fallback,
            FallbackReason::Miss,
            "computed: L3 was not asked"
        );
        let r = &rig.s.requests[&RequestId(21)];
        assert_eq!(
            r.fallback,
            FallbackReason::None,
            "the Device held its prefix"
        );
    }

    fn query_done(op: messages::OperationId, exists: Vec<bool>) -> super::super::AgreedInputs {
        super::super::AgreedInputs {
            completions: vec![messages::StorageDone::query(op, exists, true)],
            ..Default::default()
        }
    }
}
