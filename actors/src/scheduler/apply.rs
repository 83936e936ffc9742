//! Applying an agreed round: the StorageTransferManager applies its storage half and
//! reports (backend trouble, the round's effects), then cancellations, the round's effects
//! (forgotten and re-offered candidates, query results — whose GET the manager decides at
//! once —, published GET rows becoming a Ready hold, ended waits, expired Ready holds,
//! released Host references), new arrivals and prefill digests, then the round's decode
//! step.
//!
//! It never admits a request to the Device (admit.rs) and never decides a storage operation
//! itself (an answered QUERY goes to prepare.rs, which asks the manager); it never performs
//! I/O and never reads a clock: deadlines arrive as the manager's `waits_ended`.

use super::request::{PrefetchPhase, Request, RequestState};
use super::{AgreedInputs, NewRequest, Scheduler};
use crate::cache::coordinator::CacheCoordinator;
use crate::frontend::FallbackReason;
use crate::storage_transfer::{
    BackendTrouble, HandBack, HostRef, RoundEffects, RoundInput, StorageReport,
    StorageTransferManager, WaitEnd,
};
use messages::{OperationId, ProtocolError, RequestId, TokenLogprobs};
use std::collections::{BTreeMap, BTreeSet};

/// The storage half of an agreed round, for the StorageTransferManager (the completions
/// move; the scheduler keeps the rest).
fn storage_input(agreed: &mut AgreedInputs) -> RoundInput {
    RoundInput {
        tick_us: agreed.tick_us,
        pressure: agreed.pressure,
        cancellations: agreed.cancellations.clone(),
        completions: std::mem::take(&mut agreed.completions),
    }
}

impl Scheduler {
    /// Applies one agreed round: the StorageTransferManager (None with storage disabled)
    /// applies the tick, the cancellations and the completions to its tickets and reports,
    /// then cancellations, new requests and prefill digests. An answered QUERY's GET is
    /// decided by the manager here; it joins the plan that follows.
    pub fn apply(
        &mut self,
        mut input: AgreedInputs,
        mut storage: Option<&mut StorageTransferManager>,
    ) -> Result<(), ProtocolError> {
        let report = match (storage.as_deref_mut(), self.cfg.storage.is_some()) {
            (Some(stm), true) => Some(stm.begin_round(storage_input(&mut input))?),
            (None, false) => None,
            _ => {
                return Err(ProtocolError::new(
                    OperationId(0),
                    "a storage report and the storage configuration disagree",
                ));
            }
        };
        self.stats.rounds += 1;
        let AgreedInputs {
            new_requests,
            cancellations,
            completions,
            digests,
            logprobs,
            ..
        } = input;
        match (report, storage) {
            (Some(StorageReport { effects, trouble }), Some(stm)) => {
                self.l3_enabled = stm.l3_enabled();
                self.note_backend_trouble(&trouble);
                for id in &cancellations {
                    self.abort(*id, "cancelled by the client");
                }
                self.apply_effects(effects, Some(stm));
            }
            _ => {
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
        }
        for NewRequest {
            id,
            prompt,
            max_tokens,
            sampling,
        } in new_requests
        {
            if self.requests.contains_key(&id) || prompt.is_empty() {
                continue;
            }
            self.trace.request_arrived(id, prompt.len());
            self.requests.insert(
                id,
                Request::sampled(id, prompt, max_tokens.max(1), sampling),
            );
            // With storage, an arrival joins the admission queue once prepared (unless its
            // QUERY takes it out of the line first: no insertion to undo).
            if self.cfg.storage.is_some() {
                self.unprepared.push(id);
            } else {
                self.queue.insert(id);
            }
        }
        let mut logprobs: BTreeMap<RequestId, TokenLogprobs> = logprobs.into_iter().collect();
        for (id, parts) in digests {
            let lp = logprobs.remove(&id);
            self.apply_digest(id, &parts, lp);
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

    /// Applies the manager's effects; `storage` decides the GETs of answered QUERYs (None:
    /// the effects of a clear, which carry no query results).
    pub(super) fn apply_effects(
        &mut self,
        mut fx: Box<RoundEffects>,
        mut storage: Option<&mut StorageTransferManager>,
    ) {
        // A quiet round's effects: nothing to apply, the lists go straight back.
        if fx.is_empty() {
            if let Some(stm) = storage {
                stm.recycle(fx);
            }
            return;
        }
        // Candidates that left the backup queue without a PUT (forgotten) and those a
        // capacity rejection re-queued hold nothing here: a candidate's reference takes an
        // entry only at dispatch, and gives it back when its PUT settles (below).
        // Query results: reserve destinations and read, or fall back to local admission.
        for q in fx.query_results.drain(..) {
            self.on_query_result(q.request, &q.exists, storage.as_deref_mut());
        }
        // Publication of fully successful, retired rows of attached GETs, request by
        // request in request order (sorted once; each request's references sorted for the
        // lookups).
        // (In the scheduler's own list, kept for the next round.)
        let mut published = std::mem::take(&mut self.published);
        let mut readied = std::mem::take(&mut self.readied);
        published.clear();
        readied.clear();
        published.extend(fx.publish.iter().map(|r| (r.request, r.host)));
        published.sort_unstable();
        published.dedup();
        for rows in published.chunk_by(|a, b| a.0 == b.0) {
            if self.on_get_published(rows[0].0, rows) {
                readied.push(rows[0].0);
            }
        }
        self.published = published;
        for (req, why) in fx.waits_ended.drain(..) {
            // A GET that published above ended its wait as a Ready hold: its request has
            // left Prefetching, so the end of its wait changes nothing (not looked up).
            if why == WaitEnd::Completed && readied.binary_search(&req).is_ok() {
                continue;
            }
            self.on_wait_ended(req, why);
        }
        self.readied = readied;
        for req in fx.ready_expired.drain(..) {
            if let Some(r) = self.requests.get_mut(&req) {
                r.resources.ready = None;
            }
        }
        // A settled GET releases its rows together: each run of one read's rows finds the
        // read once.
        for run in
            fx.release.chunk_by(
                |a, b| match (super::get_row_of(*a), super::get_row_of(*b)) {
                    (Some((x, _)), Some((y, _))) => x == y,
                    _ => false,
                },
            )
        {
            match super::get_row_of(run[0]) {
                Some((read, _)) => self.on_read_rows_released(read, run),
                None => self.on_release(run[0]),
            }
        }
        fx.release.clear();
        // The emptied lists go back to the manager for the next round's effects.
        if let Some(stm) = storage {
            stm.recycle(fx);
        }
    }

    /// `rows`: the request's published references (all of request `id`), sorted. True when
    /// the request left Prefetching (it now holds Ready).
    fn on_get_published(&mut self, id: RequestId, rows: &[(RequestId, HostRef)]) -> bool {
        let Some(r) = self.requests.get_mut(&id) else {
            return false;
        };
        let RequestState::Prefetching {
            phase: PrefetchPhase::Get(read),
            ..
        } = &r.state
        else {
            return false;
        };
        let read = *read;
        let Some(rec) = self.reads.get_mut(&read) else {
            return false;
        };
        let Some(res) = rec.reservation.take() else {
            return false;
        };
        // Per row, whether it published (in the scheduler's kept list). The row references
        // rise with the row, and `rows` is sorted: one merge of the two, no search per row.
        let ok = &mut self.row_ok;
        ok.clear();
        let mut p = 0;
        ok.extend((0..rec.released_rows.len()).map(|i| {
            let h = super::get_row_ref(read, i);
            while rows.get(p).is_some_and(|(_, r)| *r < h) {
                p += 1;
            }
            rows.get(p).is_some_and(|(_, r)| *r == h)
        }));
        match self.cache.publish_host(res, ok) {
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
        true
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
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        if matches!(r.state, RequestState::Prefetching { .. }) {
            self.end_prefetch(id, reason);
        } else if reason.is_some() && r.resources.fallback.is_none() {
            // A Ready hold's wait ended (admission, expiry): its lease is stale now.
            r.resources.fallback = reason;
        }
    }

    /// Ends a Prefetching state: the request continues to ordinary admission. The lease is
    /// handed back (a stale one does nothing).
    pub(super) fn end_prefetch(&mut self, id: RequestId, reason: Option<FallbackReason>) {
        let Self {
            requests,
            cache,
            queue,
            handbacks,
            ..
        } = self;
        if let Some(r) = requests.get_mut(&id) {
            end_prefetch_in(r, id, reason, cache, queue, handbacks);
        }
    }

    /// Puts a request back into the admission queue at its arrival position.
    fn queue_front_by_arrival(&mut self, id: RequestId) {
        self.queue.insert(id);
    }

    /// The manager no longer holds `h`. A re-queued PUT source keeps its candidate record
    /// (the Host pin is released; dispatch rechecks residency).
    /// Released rows of GET `read` (`rows`: their references, all of that read): each row
    /// counts once (a repeated release of one row changes nothing), and the last one ends
    /// the read, freeing what it still holds.
    fn on_read_rows_released(&mut self, read: u64, rows: &[HostRef]) {
        let Some(rec) = self.reads.get_mut(&read) else {
            return;
        };
        for h in rows {
            let Some((_, row)) = super::get_row_of(*h) else {
                continue;
            };
            // A repeated release of one row (or a row past the read's) changes nothing.
            rec.released_rows.insert(row);
        }
        if rec.released_rows.count() < rec.released_rows.len() {
            return;
        }
        if let Some(rec) = self.reads.remove(&read) {
            if let Some(res) = rec.reservation {
                let _ = self.cache.abandon(res);
            }
            if let Some(hold) = rec.hold {
                let _ = self.cache.release_hold(hold);
            }
        }
    }

    /// A released PUT source: its held Host reference is given back (a re-offered
    /// candidate takes a new one at its next dispatch).
    fn on_release(&mut self, h: HostRef) {
        debug_assert!(
            super::get_row_of(h).is_none(),
            "GET rows: on_read_rows_released"
        );
        if let Some(held) = self.put_sources.take(h) {
            let _ = self.cache.host_mut().release_held(held);
        }
    }
}

/// `Scheduler::end_prefetch` on request `id` found already (`r`), beside the parts it
/// touches: the answered or abandoned plan's lists go back to the cache owner, the request
/// rejoins the admission queue at its arrival position and its lease is handed back.
pub(super) fn end_prefetch_in(
    r: &mut Request,
    id: RequestId,
    reason: Option<FallbackReason>,
    cache: &CacheCoordinator,
    queue: &mut BTreeSet<RequestId>,
    handbacks: &mut Vec<HandBack>,
) {
    if reason.is_some() && r.resources.fallback.is_none() {
        r.resources.fallback = reason;
    }
    let state = std::mem::replace(&mut r.state, RequestState::Admissible);
    let RequestState::Prefetching {
        lease,
        continuation: _,
        phase,
    } = state
    else {
        r.state = state;
        return;
    };
    if let PrefetchPhase::Query(plan) = phase {
        cache.recycle_plan(plan);
    }
    queue.insert(id);
    handbacks.push(HandBack::Detach(lease));
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::{AgreedInputs, RequestEvent};
    use crate::frontend::FallbackReason;
    use messages::{OperationId, RequestId, StorageDone, StorageOp};

    fn cancel(ids: &[u64]) -> AgreedInputs {
        AgreedInputs {
            cancellations: ids.iter().map(|i| RequestId(*i)).collect(),
            ..AgreedInputs::default()
        }
    }

    #[test]
    fn cancelling_a_queued_request_aborts_it_and_frees_its_place() {
        let mut rig = rig_with(false, 64, 1);
        let (a, b) = (prompt(16, 1), prompt(16, 2));
        let plan = rig.arrive(&[(1, &a, 4), (2, &b, 4)]);
        assert_eq!(plan.forwards.len(), 1, "max_running 1");
        assert_eq!(rig.s.state_of(RequestId(2)), Some("submitted"));
        rig.apply(cancel(&[2]));
        let events = rig.s.drain_events();
        assert!(events.contains(&RequestEvent::Aborted(
            RequestId(2),
            "cancelled by the client".into()
        )));
        assert!(finished(&events, 2).is_none());
        assert_eq!(rig.s.state_of(RequestId(2)), None);
        assert!(!rig.s.queue.contains(&RequestId(2)));
        assert_eq!(rig.s.live_requests(), 1);
        assert_eq!(rig.s.stats().aborted, 1);
    }

    #[test]
    fn cancelling_a_running_request_releases_its_device_blocks_and_scratch() {
        let mut rig = rig_without_tails(false);
        let scratch = rig.s.free_scratch.len();
        let p = prompt(30, 3);
        let plan = rig.arrive(&[(1, &p, 4)]);
        assert_eq!(plan.forwards.len(), 1);
        rig.d2h_done();
        let held = rig.s.requests[&RequestId(1)].device_refs.clone();
        assert_eq!(held.len(), 7, "seven full blocks of 30 tokens");
        assert_eq!(rig.s.free_scratch.len(), scratch - 1, "the partial block");
        assert_eq!(rig.s.cache().device().available(0), 64 - 7);
        rig.apply(cancel(&[1]));
        assert!(rig.s.running.is_empty());
        assert_eq!(rig.s.free_scratch.len(), scratch);
        // The blocks stay cached but unreferenced: evictable, so available again.
        assert_eq!(rig.s.cache().device().available(0), 64);
        assert!(held.iter().all(|a| rig.s.cache().device().contains(*a)));
    }

    #[test]
    fn a_prefill_digest_emits_the_first_token_then_one_token_per_round() {
        let mut rig = rig(false);
        let p = prompt(12, 4);
        let plan = rig.arrive(&[(1, &p, 3)]);
        rig.d2h_done();
        rig.apply(AgreedInputs {
            digests: digests_of(&plan),
            ..AgreedInputs::default()
        });
        let events = rig.s.drain_events();
        assert!(matches!(
            events[..],
            [RequestEvent::Token(RequestId(1), ..)]
        ));
        assert_eq!(rig.s.state_of(RequestId(1)), Some("decode"));
        // The first decode token comes the round after the digest's.
        let plan = rig.plan();
        assert!(plan.decode_contexts.is_empty());
        rig.apply(AgreedInputs::default());
        assert_eq!(rig.s.drain_events().len(), 1);
        assert_eq!(rig.plan().decode_contexts, vec![13]);
        rig.apply(AgreedInputs::default());
        let events = rig.s.drain_events();
        assert!(matches!(events[0], RequestEvent::Token(RequestId(1), ..)));
        let Some(RequestEvent::Finished { split, .. }) = finished(&events, 1) else {
            panic!("{events:?}");
        };
        assert_eq!(split.computed, 12);
        assert_eq!(rig.s.live_requests(), 0);
        assert_eq!(rig.s.stats().finished, 1);
    }

    #[test]
    fn disagreeing_rank_digests_abort_the_request() {
        let mut rig = rig(false);
        let p = prompt(12, 5);
        let plan = rig.arrive(&[(1, &p, 3)]);
        let mut digests = digests_of(&plan);
        let extra = digests[0].1[0];
        digests[0].1.push(extra); // two digests for a world of one
        rig.apply(AgreedInputs {
            digests,
            ..AgreedInputs::default()
        });
        let events = rig.s.drain_events();
        assert!(
            matches!(&events[..], [RequestEvent::Aborted(RequestId(1), why)] if why.contains("rank digests disagree")),
            "{events:?}"
        );
        assert!(rig.s.running.is_empty());
    }

    #[test]
    fn a_completion_while_storage_is_disabled_is_a_protocol_error() {
        let mut rig = rig(false);
        let input = AgreedInputs {
            completions: vec![StorageDone::query(OperationId(7), vec![true], true)],
            ..AgreedInputs::default()
        };
        let err = rig.s.apply(input, None).unwrap_err();
        assert!(err.to_string().contains("storage is disabled"), "{err}");
    }

    #[test]
    fn a_tick_past_the_soft_deadline_ends_the_query_wait() {
        let mut rig = rig(true);
        let p = prompt(32, 6);
        let plan = rig.arrive(&[(1, &p, 2)]);
        assert!(matches!(plan.storage[..], [StorageOp::Query(_)]));
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefetching"));
        // The QUERY is never answered: before the deadline the wait goes on.
        rig.apply(AgreedInputs::default());
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefetching"));
        rig.plan();
        rig.apply(AgreedInputs {
            tick_us: (rig.round + 1) * ROUND_US + SOFT_DEADLINE_MS * 1_000,
            ..AgreedInputs::default()
        });
        assert_eq!(rig.s.state_of(RequestId(1)), Some("admissible"));
        let r = &rig.s.requests[&RequestId(1)];
        assert_eq!(r.resources.fallback, Some(FallbackReason::Deadline));
        assert!(rig.s.queue.contains(&RequestId(1)));
        // It is admitted next, without a second QUERY.
        let plan = rig.plan();
        assert_eq!(plan.forwards.len(), 1);
        assert!(!plan
            .storage
            .iter()
            .any(|o| matches!(o, StorageOp::Query(_))));
    }

    /// Request 1 arrives with `p`, its QUERY finds every key: the plan that issues its GET.
    fn get_after_a_full_hit(rig: &mut Rig, p: &[u32]) -> super::super::Plan<StorageOp> {
        let plan = rig.arrive(&[(1, p, 2)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        let exists = vec![true; q.keys.len()];
        rig.round(AgreedInputs {
            completions: vec![StorageDone::query(q.op, exists, true)],
            ..AgreedInputs::default()
        })
    }

    /// The plan's one storage operation, a GET.
    fn the_get(plan: &super::super::Plan<StorageOp>) -> &messages::StorageGetOp {
        let [StorageOp::Get(g)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        g
    }

    #[test]
    fn query_hits_become_a_get_whose_publication_admits_with_an_l3_split() {
        let mut rig = rig(true);
        let plan = get_after_a_full_hit(&mut rig, &prompt(32, 7));
        let g = the_get(&plan);
        assert!(plan.forwards.is_empty(), "still prefetching");
        let n = g.keys.len();
        let lens = g.destinations.iter().map(|d| d.len).collect();
        rig.apply(AgreedInputs {
            completions: vec![StorageDone::get(
                g.op,
                vec![true; n],
                lens,
                vec![None; n],
                true,
            )],
            ..AgreedInputs::default()
        });
        assert_eq!(rig.s.state_of(RequestId(1)), Some("admissible"));
        assert!(rig.s.requests[&RequestId(1)].resources.ready.is_some());
        let plan = rig.plan();
        assert_eq!(plan.forwards.len(), 1);
        // Every key existed, the tail at the exact request bound (31) too.
        assert_eq!(
            plan.h2d.len(),
            8,
            "the L3 blocks and the tail are copied in from Host"
        );
        let r = &rig.s.requests[&RequestId(1)];
        assert_eq!((r.split.device, r.split.host, r.split.l3), (0, 0, 31));
        // Counted: 31 tokens from L3 and one computed; the tail above 28 is three tokens
        // of one Full block, reused from L3.
        let stats = rig.s.stats();
        assert_eq!((stats.prefix_l3, stats.computed), (31, 1));
        assert_eq!(stats.tail_tokens_reused, [0, 0, 3]);
        assert_eq!(stats.tail_blocks_reused, [1, 0, 0]);
        let [(_, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(step.context_len, 31);
        // The restored tail (28..31) is copied into the block the forward writes.
        let t = &step.groups[0];
        assert_eq!(
            step.copy_on_write,
            vec![crate::device::SlotCopy {
                from: *t.context.last().unwrap(),
                to: t.written[0],
            }]
        );
        assert_ne!(t.context.last(), t.written.first());
        assert_eq!(r.fallback, FallbackReason::None);
        assert!(r.resources.ready.is_none(), "admission took the Ready hold");
    }

    /// A GET whose every row failed publishes nothing: its wait ends (Completed) without a
    /// Ready hold, and that end alone moves the request on to ordinary admission, in the
    /// same round as another request's GET that published (whose wait's end is passed
    /// over: it holds Ready already).
    #[test]
    fn a_get_that_publishes_nothing_ends_its_prefetch_beside_one_that_published() {
        let mut rig = rig(true);
        let (p1, p2) = (prompt(32, 7), prompt(32, 8));
        let plan = rig.arrive(&[(1, &p1, 2), (2, &p2, 2)]);
        let answers = plan
            .storage
            .iter()
            .map(|op| match op {
                StorageOp::Query(q) => StorageDone::query(q.op, vec![true; q.keys.len()], true),
                other => panic!("{other:?}"),
            })
            .collect();
        let plan = rig.round(AgreedInputs {
            completions: answers,
            ..AgreedInputs::default()
        });
        let gets: Vec<messages::StorageGetOp> = plan
            .storage
            .iter()
            .map(|op| match op {
                StorageOp::Get(g) => g.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(gets.len(), 2);
        assert_eq!(gets[0].request, Some(RequestId(1)));
        let done = |g: &messages::StorageGetOp, ok: bool| {
            let n = g.keys.len();
            StorageDone::get(
                g.op,
                vec![ok; n],
                g.destinations.iter().map(|d| d.len).collect(),
                vec![None; n],
                true,
            )
        };
        rig.apply(AgreedInputs {
            completions: vec![done(&gets[0], true), done(&gets[1], false)],
            ..AgreedInputs::default()
        });
        let (one, two) = (
            &rig.s.requests[&RequestId(1)],
            &rig.s.requests[&RequestId(2)],
        );
        assert_eq!(rig.s.state_of(RequestId(1)), Some("admissible"));
        assert!(one.resources.ready.is_some(), "request 1 holds Ready");
        assert_eq!(rig.s.state_of(RequestId(2)), Some("admissible"));
        assert!(two.resources.ready.is_none(), "request 2 published nothing");
        assert!(rig.s.queue.contains(&RequestId(1)) && rig.s.queue.contains(&RequestId(2)));
        let plan = rig.plan();
        assert_eq!(plan.forwards.len(), 2, "both are admitted");
        assert_eq!(rig.s.requests[&RequestId(1)].split.l3, 31);
        assert_eq!(rig.s.requests[&RequestId(2)].split.l3, 0, "recomputed");
    }

    /// An arrival under the ID of a live request changes nothing of that request, and an
    /// empty prompt never becomes a request.
    #[test]
    fn a_repeated_request_id_or_an_empty_prompt_is_passed_over() {
        let mut rig = rig(false);
        let (p, q) = (prompt(32, 12), prompt(12, 13));
        let plan = rig.arrive(&[(1, &p, 2)]);
        assert_eq!(plan.forwards.len(), 1);
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefill"));
        let plan = rig.arrive(&[(1, &q, 5), (2, &[], 2)]);
        assert!(plan.forwards.is_empty(), "{:?}", plan.forwards);
        let r = &rig.s.requests[&RequestId(1)];
        assert_eq!(r.prompt, p, "the first arrival's prompt");
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefill"));
        assert!(!rig.s.requests.contains_key(&RequestId(2)));
    }

    /// The backend trouble a QUERY's completion reports becomes its waiting request's
    /// fallback reason: a rejection for an unhealthy or a quarantined backend, a backend
    /// error, and an unretired completion without an error.
    #[test]
    fn a_troubled_query_completion_names_the_waiting_requests_fallback() {
        use messages::{Rejection, StorageOpKind};
        type Completion = fn(OperationId, usize) -> StorageDone;
        let cases: [(Completion, FallbackReason); 4] = [
            (
                |op, n| StorageDone::rejected(op, StorageOpKind::Query, n, Rejection::Unhealthy),
                FallbackReason::Unhealthy,
            ),
            (
                |op, n| StorageDone::rejected(op, StorageOpKind::Query, n, Rejection::Quarantined),
                FallbackReason::Quarantine,
            ),
            (
                |op, n| StorageDone::failed(op, StorageOpKind::Query, n, true, "sdk error"),
                FallbackReason::Unhealthy,
            ),
            (
                |op, n| StorageDone::query(op, vec![false; n], false),
                FallbackReason::Quarantine,
            ),
        ];
        for (i, (done, reason)) in cases.into_iter().enumerate() {
            let mut rig = rig(true);
            let plan = rig.arrive(&[(1, &prompt(32, 20 + i as u32), 2)]);
            let [StorageOp::Query(q)] = &plan.storage[..] else {
                panic!("{:?}", plan.storage);
            };
            rig.apply(AgreedInputs {
                completions: vec![done(q.op, q.keys.len())],
                ..AgreedInputs::default()
            });
            let r = &rig.s.requests[&RequestId(1)];
            assert_eq!(r.resources.fallback, Some(reason), "case {i}");
        }
    }

    /// A GET whose rows published around a failed one: the Ready hold covers the blocks
    /// below the failed row only (the rows above it published, but a prefix cannot skip a
    /// block), so admission restores that prefix from L3 and recomputes the rest.
    #[test]
    fn a_get_with_a_failed_middle_row_restores_the_blocks_below_it() {
        let mut rig = rig(true);
        let plan = get_after_a_full_hit(&mut rig, &prompt(32, 11));
        let g = the_get(&plan);
        let n = g.keys.len();
        assert!(n > 4, "{n} rows");
        // Row 3 (the fourth block, tokens 12..16) fails; every other row succeeds.
        let mut success = vec![true; n];
        success[3] = false;
        let mut failures = vec![None; n];
        failures[3] = Some(messages::ObjectFailure::Missing);
        rig.apply(AgreedInputs {
            completions: vec![StorageDone::get(
                g.op,
                success,
                g.destinations.iter().map(|d| d.len).collect(),
                failures,
                true,
            )],
            ..AgreedInputs::default()
        });
        assert!(rig.s.requests[&RequestId(1)].resources.ready.is_some());
        let plan = rig.plan();
        let [(_, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(step.context_len, 12, "three blocks restored");
        let r = &rig.s.requests[&RequestId(1)];
        assert_eq!((r.split.device, r.split.host, r.split.l3), (0, 0, 12));
        assert_eq!(
            rig.s.stats().rounds,
            rig.round,
            "each applied round counted"
        );
    }

    /// An answered QUERY's plan hands its lists back to the cache owner, whether its GET
    /// is planned or the answer is a miss, and the next arrival's QUERY takes them.
    #[test]
    fn an_answered_querys_plan_lends_its_lists_to_the_next_query() {
        let mut rig = rig(true);
        assert_eq!(rig.s.cache.spare_plans(), 0);
        let plan = get_after_a_full_hit(&mut rig, &prompt(32, 9));
        assert!(matches!(&plan.storage[..], [StorageOp::Get(_)]));
        assert_eq!(rig.s.cache.spare_plans(), 1, "the GET's QUERY plan");
        let plan = rig.arrive(&[(2, &prompt(32, 10), 2)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        assert_eq!(rig.s.cache.spare_plans(), 0, "taken by the next QUERY");
        let exists = vec![false; q.keys.len()];
        rig.round(AgreedInputs {
            completions: vec![StorageDone::query(q.op, exists, true)],
            ..AgreedInputs::default()
        });
        assert_eq!(rig.s.cache.spare_plans(), 1, "a missed QUERY's plan");
    }

    #[test]
    fn a_get_row_reference_names_its_read_and_row_and_counts_once_when_released() {
        assert_eq!(
            super::super::get_row_of(crate::storage_transfer::HostRef(7)),
            None,
            "a PUT source's"
        );
        let h = super::super::get_row_ref(12_345, 678);
        assert_eq!(super::super::get_row_of(h), Some((12_345, 678)));
        // A GET planned from an answered QUERY: its rows are the read's references.
        let mut rig = rig(true);
        let plan = get_after_a_full_hit(&mut rig, &prompt(32, 8));
        let g = the_get(&plan);
        let refs = rig.stm.as_ref().unwrap().ticket(g.op).unwrap().refs.clone();
        let rows: Vec<(u64, usize)> = refs
            .iter()
            .map(|h| super::super::get_row_of(*h).unwrap())
            .collect();
        let read = rows[0].0;
        assert_eq!(rows, (0..refs.len()).map(|i| (read, i)).collect::<Vec<_>>());
        assert!(
            rig.s.put_sources.is_empty(),
            "GET rows take no PUT source entries"
        );
        // Releasing one row twice counts it once: the read stays until every row is back.
        // (Twice in one run of releases and again in a later one.)
        rig.s.on_read_rows_released(read, &[refs[0], refs[0]]);
        rig.s.on_read_rows_released(read, &refs[..1]);
        rig.s.on_read_rows_released(read, &refs[1..refs.len() - 1]);
        assert!(rig.s.reads.contains_key(&read), "one row still out");
        rig.s.on_read_rows_released(read, &refs[refs.len() - 1..]);
        assert!(!rig.s.reads.contains_key(&read));
    }
}
