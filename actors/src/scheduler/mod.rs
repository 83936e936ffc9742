//! The Scheduler: the request FSM and the CacheCoordinator of one rank, driven by agreed
//! rounds. Given the same agreed inputs every rank makes the same decisions (SPMD); only the
//! bytes differ (each rank holds its own KV heads).
//!
//! A round: `apply` (the StorageTransferManager's report of the agreed round — rows to
//! publish, references to release, waits that ended — then cancellations, new requests and
//! reduced forward digests), then `plan` (storage preparation, then admission with H2D
//! copies and forwards, then backups; the storage half is a list of StorageIntents the
//! manager commits), then the engine executes the plan and reports the D2H completion with
//! `d2h_done`, whose backup candidates go to the manager. The scheduler never holds the
//! manager: it plans against the manager's StorageView (`StoragePlanner`). It never performs
//! I/O, never touches Host or device bytes and never reads a clock: time is the agreed tick.

pub mod bench;
pub mod geometry;
pub mod request;
#[cfg(test)]
mod tests;

use crate::cache::coordinator::{
    CacheCoordinator, CacheError, CoordinatorConfig, QueryLimits, ReadyHold, Reservation,
};
use crate::cache::credits::QueryCredits;
use crate::cache::keys::{page_key, BlockAddr, PromptIndex};
use crate::device::{DeviceCopy, DeviceSlot, ForwardStep, GroupBlockTable};
use crate::frontend::FallbackReason;
use crate::model::{RankDigest, SyntheticModel};
use crate::storage_transfer::trace::RequestTrace;
use crate::storage_transfer::{
    BackendTrouble, BackupCandidate, HostRef, Refusal, RoundEffects, StorageIntent, StoragePlanner,
    StorageReport, WaitEnd,
};
use geometry::RankLayout;
use messages::settings::StorageConfig;
use messages::{
    Namespace, OperationId, PressureObservation, ProtocolError, RequestId, StorageDone,
};
use request::{Continuation, PrefetchPhase, PrefixSplit, Request, RequestState};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Static configuration of one rank's scheduler.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    pub layout: RankLayout,
    pub namespace: Namespace,
    /// None: storage disabled (no storage preparation, no backups).
    pub storage: Option<StorageConfig>,
    /// Requests admitted at once (forward candidates).
    pub max_running: usize,
    pub tail_capacity: usize,
}

/// Agreed inputs of one round, identical on every rank.
#[derive(Clone, Debug, Default)]
pub struct AgreedInputs {
    pub tick_us: u64,
    pub pressure: PressureObservation,
    pub new_requests: Vec<(RequestId, Vec<u32>, u32)>,
    pub cancellations: Vec<RequestId>,
    pub completions: Vec<StorageDone>,
    /// Every rank's partial digest of a prefill, per request.
    pub digests: Vec<(RequestId, Vec<RankDigest>)>,
}

/// What the engine executes this round, in order: storage (the scheduler's StorageIntents,
/// which the StorageTransferManager commits into operations for the executor: a
/// `Plan<StorageOp>`), H2D copies, forwards (each ordered after the copies), D2H copies
/// (then `d2h_done`).
#[derive(Debug)]
pub struct Plan<S = StorageIntent> {
    pub storage: Vec<S>,
    pub h2d: Vec<DeviceCopy>,
    pub forwards: Vec<(RequestId, ForwardStep)>,
    pub d2h: Vec<DeviceCopy>,
    /// The context length of every decode token this round produced (the device time of
    /// the round's decode steps is charged from them).
    pub decode_contexts: Vec<u64>,
    /// Debug builds: Device slots freed since the last plan, poisoned before this round's
    /// device work (crate::host::poison).
    pub poison: Vec<DeviceSlot>,
}

impl<S> Default for Plan<S> {
    fn default() -> Self {
        Self {
            storage: Vec::new(),
            h2d: Vec::new(),
            forwards: Vec::new(),
            d2h: Vec::new(),
            decode_contexts: Vec::new(),
            poison: Vec::new(),
        }
    }
}

impl<S> Plan<S> {
    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
            && self.h2d.is_empty()
            && self.forwards.is_empty()
            && self.d2h.is_empty()
    }

    /// The same device work with its storage part replaced (the committed operations).
    pub fn with_storage<T>(self, storage: Vec<T>) -> Plan<T> {
        Plan {
            storage,
            h2d: self.h2d,
            forwards: self.forwards,
            d2h: self.d2h,
            decode_contexts: self.decode_contexts,
            poison: self.poison,
        }
    }

    /// The round's modeled device time: one batched step (prefill chunks and decode
    /// tokens) with its copies at the profile's PCIe bandwidth.
    pub fn device_time_us(&self, cost: &crate::model::CostModel) -> u64 {
        let (h2d, d2h) = self.copy_bytes();
        cost.round_us(&self.step_items(), h2d, d2h)
    }

    /// The batched step items of the round's device work: every prefill chunk and every
    /// decode token (for `CostModel::round_us`).
    fn step_items(&self) -> Vec<crate::model::StepItem> {
        self.forwards
            .iter()
            .map(|(_, f)| crate::model::StepItem {
                new: (f.tokens.len() as u64).saturating_sub(f.context_len),
                context: f.context_len,
            })
            .chain(self.decode_contexts.iter().map(|c| crate::model::StepItem {
                new: 1,
                context: *c,
            }))
            .collect()
    }

    /// Bytes of the round's H2D and D2H copies.
    fn copy_bytes(&self) -> (u64, u64) {
        let sum = |v: &[DeviceCopy]| v.iter().map(|c| c.host.len).sum::<u64>();
        (sum(&self.h2d), sum(&self.d2h))
    }
}

/// What a request tells its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestEvent {
    Token(RequestId, u32),
    Finished {
        id: RequestId,
        split: PrefixSplit,
        fallback: FallbackReason,
    },
    Aborted(RequestId, String),
}

/// Counters the engine exports (mirrored on every rank).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    pub rounds: u64,
    pub admitted: u64,
    pub finished: u64,
    pub aborted: u64,
    pub prefix_device: u64,
    pub prefix_host: u64,
    pub prefix_l3: u64,
    pub computed: u64,
    pub fallback: BTreeMap<&'static str, u64>,
}

/// What a Host reference handed to the StorageTransferManager stands for.
#[derive(Clone, Copy, Debug)]
enum RefUse {
    /// A GET destination row of read `read`.
    GetRow { read: u64 },
    /// A PUT source (or a backup candidate): one page of a published Host block.
    PutSource(BlockAddr, u32),
}

/// A read's Host destinations: reserved until publication, then the Ready hold's blocks.
#[derive(Debug)]
struct ReadRecord {
    rows: Vec<HostRef>,
    released: usize,
    reservation: Option<Reservation>,
    hold: Option<ReadyHold>,
}

/// Admin work applied when no request holds cache resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminCommand {
    ClearCache,
    SetWeightVersion {
        target: u64,
        draft: Option<u64>,
    },
    /// Drop the Device (and, with `host`, the Host) cache once idle; L3 is untouched.
    ResetLocal {
        host: bool,
    },
}

impl AdminCommand {
    /// Whether the command waits for storage to be idle too (no outstanding operation, no
    /// queued backup candidate), not only for no request holding cache resources.
    pub fn waits_for_idle_storage(&self) -> bool {
        matches!(self, AdminCommand::ResetLocal { .. })
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    model: SyntheticModel,
    cache: CacheCoordinator,
    /// The storage half of planning (None: storage disabled).
    storage: Option<StoragePlanner>,
    requests: BTreeMap<RequestId, Request>,
    /// Submitted and Admissible requests, in arrival order (request IDs are assigned in
    /// arrival order, so the ordered set is the queue: O(log n) to leave or re-enter it).
    queue: BTreeSet<RequestId>,
    /// Admitted requests (Prefill or Decode): the forward candidates of each round.
    running: BTreeSet<RequestId>,
    /// New arrivals not yet considered for storage preparation (each is considered once:
    /// `storage_prepared` is one-shot).
    unprepared: VecDeque<RequestId>,
    free_scratch: Vec<u32>,
    refs: BTreeMap<HostRef, RefUse>,
    reads: BTreeMap<u64, ReadRecord>,
    next_ref: u64,
    next_read: u64,
    /// Blocks whose D2H copy is in flight this round (published by `d2h_done`).
    d2h_blocks: Vec<BlockAddr>,
    /// Host references taken for this round's H2D copies (released by `d2h_done`).
    h2d_host_refs: Vec<BlockAddr>,
    events: Vec<RequestEvent>,
    stats: SchedulerStats,
    pending_admin: VecDeque<AdminCommand>,
    /// Context lengths of this round's decode tokens (taken by `plan`).
    decode_contexts: Vec<u64>,
    /// Request spans (observation only).
    trace: RequestTrace,
    /// Debug builds: Device slots freed since the last plan (see `Plan::poison`).
    freed_device: std::sync::Arc<parking_lot::Mutex<Vec<DeviceSlot>>>,
}

fn fallback_name(f: FallbackReason) -> &'static str {
    f.as_str()
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, model: SyntheticModel) -> Result<Self, CacheError> {
        let cache = CacheCoordinator::new(
            cfg.layout.geometry.clone(),
            cfg.namespace.clone(),
            &CoordinatorConfig {
                device_blocks: cfg.layout.device_blocks.clone(),
                host_blocks: cfg.layout.host_blocks.clone(),
                tail_capacity: cfg.tail_capacity,
            },
        )?;
        let storage = cfg.storage.clone().map(StoragePlanner::new);
        let free_scratch = (0..cfg.layout.scratch_slots).rev().collect();
        let trace = RequestTrace::new(cfg.layout.shard.index);
        let mut me = Self {
            cfg,
            model,
            cache,
            storage,
            requests: BTreeMap::new(),
            queue: BTreeSet::new(),
            running: BTreeSet::new(),
            unprepared: VecDeque::new(),
            free_scratch,
            refs: BTreeMap::new(),
            reads: BTreeMap::new(),
            next_ref: 0,
            next_read: 0,
            d2h_blocks: vec![],
            h2d_host_refs: vec![],
            events: vec![],
            stats: SchedulerStats::default(),
            pending_admin: VecDeque::new(),
            decode_contexts: Vec::new(),
            trace,
            freed_device: Default::default(),
        };
        if crate::host::poison::enabled() {
            me.poison_freed_device_blocks();
        }
        Ok(me)
    }

    pub fn cache(&self) -> &CacheCoordinator {
        &self.cache
    }
    /// Calls `hook` with the Host range of every Host block the cache frees (the debug
    /// builds' poisoned-memory checker; see crate::host::poison).
    pub fn set_host_free_hook(
        &mut self,
        hook: std::sync::Arc<dyn Fn(messages::HostRange) + Send + Sync>,
    ) {
        self.cache
            .host_mut()
            .set_free_hook(std::sync::Arc::new(move |_, _, r| hook(r)));
    }

    /// Debug builds: every Device block the cache frees is named in the next plan's
    /// `poison` list, so the device fills it before any new owner writes it.
    fn poison_freed_device_blocks(&mut self) {
        let freed = self.freed_device.clone();
        let layout = self.cfg.layout.clone();
        self.cache
            .device_mut()
            .set_free_hook(std::sync::Arc::new(move |g, s, _| {
                freed.lock().push(layout.cached_slot(g as usize, s));
            }));
    }
    /// The storage contract (None: storage disabled; no StorageTransferManager serves
    /// this scheduler).
    pub fn storage_config(&self) -> Option<&StorageConfig> {
        self.cfg.storage.as_ref()
    }
    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }
    pub fn layout(&self) -> &RankLayout {
        &self.cfg.layout
    }
    pub fn namespace(&self) -> &Namespace {
        self.cache.namespace()
    }
    pub fn model(&self) -> &SyntheticModel {
        &self.model
    }
    pub fn drain_events(&mut self) -> Vec<RequestEvent> {
        std::mem::take(&mut self.events)
    }
    /// Requests not yet finished or aborted.
    pub fn live_requests(&self) -> usize {
        self.requests.len()
    }
    pub fn state_of(&self, id: RequestId) -> Option<&'static str> {
        self.requests.get(&id).map(|r| r.state.name())
    }
    /// Whether L3 work is enabled (storage configured and not quarantined).
    pub fn l3_enabled(&self) -> bool {
        self.storage.as_ref().is_some_and(|s| s.l3_enabled())
    }

    fn new_ref(&mut self, use_: RefUse) -> HostRef {
        self.next_ref += 1;
        let r = HostRef(self.next_ref);
        self.refs.insert(r, use_);
        r
    }

    // ----- apply ----------------------------------------------------------------------

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

    fn apply_effects(&mut self, fx: RoundEffects) {
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

    fn on_query_result(&mut self, id: RequestId, exists: &[bool]) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let RequestState::Prefetching { phase, .. } = &r.state else {
            return;
        };
        let PrefetchPhase::Query(plan) = phase else {
            return;
        };
        let hints = match plan.existence_hints(exists) {
            Ok(h) => h,
            Err(_) => {
                self.end_prefetch(id, Some(FallbackReason::Miss));
                return;
            }
        };
        let Some(planner) = self.storage.as_ref() else {
            return;
        };
        if planner.gate_closed() {
            self.end_prefetch(id, Some(FallbackReason::Pressure));
            return;
        }
        let host_credits = planner.host_credits_left();
        let prompt = r.prompt.clone();
        let reusable = r.reusable();
        let res = match self.cache.reserve(&prompt, reusable, &hints, host_credits) {
            Ok(res) => res,
            Err(_) => {
                self.end_prefetch(id, Some(FallbackReason::Miss));
                return;
            }
        };
        if res.is_empty() {
            let _ = self.cache.abandon(res);
            self.end_prefetch(id, Some(FallbackReason::Miss));
            return;
        }
        self.next_read += 1;
        let read = self.next_read;
        let mut dests = vec![];
        let mut rows = vec![];
        for row in &res.rows {
            let h = self.new_ref(RefUse::GetRow { read });
            rows.push(h);
            dests.push((h, row.range));
        }
        let keys = res.keys();
        let parent = self.trace.request_span(id).cloned();
        let issued = match self.storage.as_mut() {
            Some(planner) => planner.issue_get(id, keys, dests, parent),
            None => Err(Refusal::Disabled),
        };
        match issued {
            Ok(_) => {
                self.reads.insert(
                    read,
                    ReadRecord {
                        rows,
                        released: 0,
                        reservation: Some(res),
                        hold: None,
                    },
                );
                if let Some(r) = self.requests.get_mut(&id) {
                    if let RequestState::Prefetching { phase, .. } = &mut r.state {
                        *phase = PrefetchPhase::Get(read);
                    }
                }
            }
            Err(e) => {
                for h in rows {
                    self.refs.remove(&h);
                }
                let _ = self.cache.abandon(res);
                self.end_prefetch(id, Some(refusal_reason(&e)));
            }
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
    fn end_prefetch(&mut self, id: RequestId, reason: Option<FallbackReason>) {
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

    fn apply_digest(&mut self, id: RequestId, parts: &[RankDigest]) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        if !matches!(r.state, RequestState::Prefill) {
            return;
        }
        match self.model.reduce_ranks(parts) {
            Ok(reduced) => {
                let (tok, state) = self.model.first_token(reduced);
                r.output.push(tok);
                self.events.push(RequestEvent::Token(id, tok));
                if r.output.len() as u32 >= r.max_tokens {
                    self.finish(id);
                } else {
                    r.state = RequestState::Decode {
                        state,
                        last: tok,
                        fresh: true,
                    };
                }
            }
            Err(e) => self.abort(id, &format!("rank digests disagree: {e}")),
        }
    }

    /// One decode step for every decoding request (one token per round).
    fn decode_step(&mut self) {
        // At most max_running IDs: the running set, not the live requests.
        let ids: Vec<RequestId> = self.running.iter().copied().collect();
        for id in ids {
            let Some(r) = self.requests.get_mut(&id) else {
                continue;
            };
            let RequestState::Decode { state, last, fresh } = r.state else {
                continue;
            };
            if fresh {
                // The first token came from this round's digest; decode starts next round.
                r.state = RequestState::Decode {
                    state,
                    last,
                    fresh: false,
                };
                continue;
            }
            let (tok, next) = self.model.decode(state, last);
            self.decode_contexts
                .push((r.prompt.len() + r.output.len()) as u64);
            r.output.push(tok);
            self.events.push(RequestEvent::Token(id, tok));
            if r.output.len() as u32 >= r.max_tokens {
                self.finish(id);
            } else {
                r.state = RequestState::Decode {
                    state: next,
                    last: tok,
                    fresh: false,
                };
            }
        }
    }

    fn release_running(&mut self, id: RequestId) {
        self.running.remove(&id);
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let refs = std::mem::take(&mut r.device_refs);
        let scratch = std::mem::take(&mut r.scratch);
        for a in refs {
            let _ = self.cache.device_mut().release(a);
        }
        self.free_scratch.extend(scratch);
    }

    fn finish(&mut self, id: RequestId) {
        self.release_running(id);
        if let Some(mut r) = self.requests.remove(&id) {
            r.state = RequestState::Finished;
            self.trace.request_ended(id, "finished");
            self.stats.finished += 1;
            *self
                .stats
                .fallback
                .entry(fallback_name(r.fallback))
                .or_default() += 1;
            self.events.push(RequestEvent::Finished {
                id,
                split: r.split,
                fallback: r.fallback,
            });
        }
    }

    /// Aborts a request in any state; storage references stay with the manager.
    pub fn abort(&mut self, id: RequestId, why: &str) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        let prefetching = matches!(r.state, RequestState::Prefetching { .. });
        if prefetching || r.resources.ready.is_some() {
            if let Some(planner) = self.storage.as_mut() {
                planner.cancel(id);
            }
        }
        self.release_running(id);
        self.queue.remove(&id);
        if let Some(mut r) = self.requests.remove(&id) {
            r.state = RequestState::Aborted;
            self.trace.request_ended(id, "aborted");
            self.stats.aborted += 1;
            self.events.push(RequestEvent::Aborted(id, why.to_string()));
        }
    }

    // ----- admin ------------------------------------------------------------------------

    /// Queues an admin command; it applies when no request holds cache resources.
    pub fn admin(&mut self, cmd: AdminCommand) {
        self.pending_admin.push_back(cmd);
    }

    /// Drops the pending admin command unapplied (its agreed preflight failed).
    pub fn refuse_admin(&mut self) {
        self.pending_admin.pop_front();
    }

    /// Whether an admin command waits for quiescence (new work is held meanwhile).
    pub fn admin_pending(&self) -> Option<AdminCommand> {
        self.pending_admin.front().copied()
    }

    /// Whether the scheduler is quiescent for admin work: no running or preparing request.
    pub fn quiescent(&self) -> bool {
        self.requests.values().all(|r| {
            matches!(r.state, RequestState::Submitted | RequestState::Admissible)
                && r.resources.ready.is_none()
        })
    }

    /// Applies the pending admin command once quiescent, after the StorageTransferManager
    /// rejected outstanding storage operations (never draining them): `cleared` is its
    /// effects (None with storage disabled). Clears local caches and, for a weight update,
    /// moves to `new_namespace`. A failed remote deletion never reaches here: it prevents
    /// local clearing.
    pub fn apply_admin(
        &mut self,
        cleared: Option<RoundEffects>,
        new_namespace: Option<Namespace>,
    ) -> Result<(), String> {
        let cmd = self.pending_admin.pop_front();
        if let Some(fx) = cleared {
            self.apply_effects(fx);
        }
        if let Some(AdminCommand::ResetLocal { host }) = cmd {
            // Local caches only: the namespace, the tail hints of L3 objects and every
            // storage record stay; blocks storage I/O still references stay (invisible)
            // until it retires.
            for r in self.requests.values_mut() {
                r.resources.ready = None;
            }
            self.cache.reset_local(host);
            return Ok(());
        }
        // Local clearing: Ready holds are gone; every unreferenced block is freed, and the
        // blocks in-flight storage I/O still references stay (invisible) until it retires.
        for r in self.requests.values_mut() {
            r.resources.ready = None;
        }
        let ns = new_namespace.unwrap_or_else(|| self.cache.namespace().clone());
        self.cache.clear(ns.clone());
        self.cfg.namespace = ns;
        Ok(())
    }

    // ----- plan -------------------------------------------------------------------------

    /// Plans the round: storage preparation, admission (H2D copies and forwards, D2H of the
    /// new blocks) and backups.
    pub fn plan(&mut self) -> Plan {
        let mut plan = Plan {
            decode_contexts: std::mem::take(&mut self.decode_contexts),
            ..Plan::default()
        };
        if self.pending_admin.is_empty() {
            self.prepare_storage();
            self.admit(&mut plan);
        }
        self.dispatch_backups();
        if let Some(planner) = self.storage.as_mut() {
            plan.storage = planner.take_intents();
        }
        plan.poison = std::mem::take(&mut *self.freed_device.lock());
        plan
    }

    /// The span of a live request (None when untraced).
    pub fn request_span(&self, id: RequestId) -> Option<&tracing::Span> {
        self.trace.request_span(id)
    }

    fn storage_eligible(&self, r: &Request) -> bool {
        !r.resources.storage_prepared
            && self.storage.as_ref().is_some_and(|s| s.l3_enabled())
            && matches!(r.state, RequestState::Submitted)
    }

    fn prepare_storage(&mut self) {
        let ids: Vec<RequestId> = std::mem::take(&mut self.unprepared).into();
        for id in ids {
            let eligible = self
                .requests
                .get(&id)
                .is_some_and(|r| self.storage_eligible(r));
            if !eligible {
                continue;
            }
            let Some(planner) = self.storage.as_ref() else {
                return;
            };
            let cfg = planner.config();
            let q = QueryCredits {
                keys: cfg.max_keys_per_operation,
                host_blocks: planner.host_credits_left(),
            };
            let limits = QueryLimits {
                lookahead_tokens: cfg.lookahead_tokens,
                min_extension_tokens: cfg.min_extension_tokens,
            };
            let Some(r) = self.requests.get_mut(&id) else {
                continue;
            };
            r.resources.storage_prepared = true;
            let qp = self.cache.plan_query(&r.prompt, r.reusable(), q, limits);
            if qp.bypass.is_some() || qp.keys.is_empty() {
                r.state = RequestState::Admissible;
                continue;
            }
            r.resources.local_at_plan = qp.local_tokens;
            r.resources.planned_boundary = qp.boundaries.first().map_or(0, |b| b.boundary);
            let keys = qp.keys.clone();
            let Some(planner) = self.storage.as_mut() else {
                return;
            };
            let parent = self.trace.request_span(id).cloned();
            match planner.issue_query(id, keys, parent) {
                Ok((_, lease)) => {
                    r.state = RequestState::Prefetching {
                        continuation: Continuation::Submitted,
                        phase: PrefetchPhase::Query(qp),
                        lease,
                    };
                    self.queue.remove(&id);
                }
                Err(e) => {
                    r.resources.fallback = Some(refusal_reason(&e));
                    r.state = RequestState::Admissible;
                }
            }
        }
    }

    fn running(&self) -> usize {
        self.running.len()
    }

    fn admit(&mut self, plan: &mut Plan) {
        let mut running = self.running();
        while running < self.cfg.max_running {
            let Some(&id) = self.queue.first() else {
                return;
            };
            let ready = self.requests.get(&id).is_some_and(|r| {
                matches!(r.state, RequestState::Admissible)
                    || (matches!(r.state, RequestState::Submitted) && !self.storage_eligible(r))
            });
            if !ready {
                // A Submitted request still eligible for storage was just prepared above
                // unless the credits refused it; never block the head of the line on it.
                return;
            }
            match self.try_admit(id, plan) {
                Ok(true) => {
                    self.queue.pop_first();
                    running += 1;
                }
                Ok(false) => return, // no Device capacity: wait for running requests
                Err(e) => {
                    self.queue.pop_first();
                    self.abort(id, &format!("admission failed: {e}"));
                }
            }
        }
    }

    /// Admits one request: matches the real cache again, copies Host blocks to the Device,
    /// allocates the written blocks and emits the forward and the D2H of new blocks.
    fn try_admit(&mut self, id: RequestId, plan: &mut Plan) -> Result<bool, String> {
        let (prompt, reusable) = match self.requests.get(&id) {
            Some(r) => (r.prompt.clone(), r.reusable()),
            None => return Ok(true),
        };
        // Only aligned boundaries are restored (a tail block is recomputed): match over
        // aligned candidates, so a tail hit never hides the aligned prefix below it.
        let m = self.cache.admission_match_aligned(&prompt, reusable);
        let (boundary, device_tokens) = (m.boundary, m.device_tokens);
        let len = prompt.len() as u64;
        let geometry = self.cfg.layout.geometry.clone();
        let index = PromptIndex::new(&geometry, &prompt, prompt.len() as u32);
        let groups = geometry.group_count();
        // Plan every block first; take nothing until everything fits.
        let mut context: Vec<Vec<BlockAddr>> = vec![vec![]; groups];
        let mut written_full: Vec<Vec<BlockAddr>> = vec![vec![]; groups];
        let mut written_partial = vec![false; groups];
        for g in 0..groups {
            let req = self
                .model
                .required_blocks(g, boundary as u64)
                .map_err(|e| e.to_string())?;
            for k in req {
                context[g].push(BlockAddr::new(g, index.block_hash(g, k as u32)));
            }
            let wr = self
                .model
                .written_blocks(g, boundary as u64, len)
                .map_err(|e| e.to_string())?;
            let full = index.full_blocks(g) as u64;
            for k in wr {
                if k < full {
                    written_full[g].push(BlockAddr::new(g, index.block_hash(g, k as u32)));
                } else {
                    written_partial[g] = true;
                }
            }
        }
        let scratch_needed = written_partial.iter().filter(|p| **p).count();
        if scratch_needed > self.free_scratch.len() {
            return Ok(false);
        }
        let new_device: usize = context
            .iter()
            .flatten()
            .chain(written_full.iter().flatten())
            .filter(|a| !self.cache.device().contains(**a))
            .count();
        let available: u64 = (0..groups as u32)
            .map(|g| self.cache.device().available(g))
            .sum();
        if new_device as u64 > available {
            return Ok(false);
        }
        // Take references and allocate.
        let mut held: Vec<BlockAddr> = vec![];
        let mut tables: Vec<GroupBlockTable> = vec![GroupBlockTable::default(); groups];
        let mut new_written: Vec<BlockAddr> = vec![];
        let rollback = |s: &mut Self, held: &[BlockAddr]| {
            for a in held {
                let _ = s.cache.device_mut().release(*a);
            }
        };
        let mut h2d_refs = vec![];
        for g in 0..groups {
            for a in context[g].clone() {
                let slot = if self.cache.device().contains(a) {
                    if self.cache.device_mut().acquire(a).is_err() {
                        rollback(self, &held);
                        return Ok(false);
                    }
                    held.push(a);
                    self.device_slot(a)?
                } else {
                    // A Host hit: allocate a Device slot and copy the block in.
                    let range = self
                        .cache
                        .host()
                        .host_range(a)
                        .map_err(|e| format!("host block vanished: {e}"))?;
                    let mut evicted = vec![];
                    if self.cache.device_mut().allocate(a, &mut evicted).is_err() {
                        rollback(self, &held);
                        return Ok(false);
                    }
                    held.push(a);
                    let _ = self.cache.host_mut().acquire(a);
                    h2d_refs.push(a);
                    let slot = self.device_slot(a)?;
                    plan.h2d.push(DeviceCopy::h2d(range, slot, 0));
                    let _ = self.cache.device_mut().publish(a);
                    slot
                };
                tables[g].context.push(slot);
            }
            for a in written_full[g].clone() {
                let slot = if self.cache.device().contains(a) {
                    let _ = self.cache.device_mut().acquire(a);
                    held.push(a);
                    self.device_slot(a)?
                } else {
                    let mut evicted = vec![];
                    if self.cache.device_mut().allocate(a, &mut evicted).is_err() {
                        rollback(self, &held);
                        return Ok(false);
                    }
                    held.push(a);
                    new_written.push(a);
                    self.device_slot(a)?
                };
                tables[g].written.push(slot);
            }
        }
        let mut scratch = vec![];
        for (g, partial) in written_partial.iter().enumerate() {
            if *partial {
                let s = self.free_scratch.pop().ok_or("scratch slots exhausted")?;
                scratch.push(s);
                tables[g].written.push(self.cfg.layout.scratch_slot(s));
            }
        }
        // The forward writes the new blocks; they are published on the Device now (the
        // forward is ordered before any later reader of this round).
        for a in &new_written {
            let _ = self.cache.device_mut().publish(*a);
        }
        // D2H of new full blocks into Host L2 (published by `d2h_done`).
        for a in &new_written {
            if self.cache.host().state(*a).is_some() {
                continue;
            }
            let mut evicted = vec![];
            if self.cache.host_mut().allocate(*a, &mut evicted).is_err() {
                continue;
            }
            let Ok(range) = self.cache.host().host_range(*a) else {
                continue;
            };
            let slot = self.device_slot(*a)?;
            plan.d2h.push(DeviceCopy::d2h(slot, 0, range));
            self.d2h_blocks.push(*a);
        }
        self.h2d_host_refs.extend(h2d_refs);
        let step = ForwardStep {
            shard: self.cfg.layout.shard,
            tokens: prompt.clone(),
            context_len: boundary as u64,
            groups: tables,
        };
        plan.forwards.push((id, step));
        // Account the prefix split and hand the Ready hold back (admission now holds its
        // own references).
        let stm_enabled = self.storage.is_some();
        let l3_enabled = self.l3_enabled();
        let r = self.requests.get_mut(&id).ok_or("request vanished")?;
        let had_ready = r.resources.ready.is_some();
        let l3 = if had_ready {
            boundary
                .min(r.resources.planned_boundary)
                .saturating_sub(r.resources.local_at_plan.max(device_tokens))
        } else {
            0
        };
        let host = boundary.saturating_sub(device_tokens).saturating_sub(l3);
        r.split = PrefixSplit {
            device: device_tokens,
            host,
            l3,
            computed: prompt.len() as u32 - boundary,
        };
        let parent = self.cfg.layout.geometry.parent_tokens().max(1);
        let aligned = |b: u32| b / parent * parent;
        r.fallback = if !stm_enabled {
            FallbackReason::Disabled
        } else if !l3_enabled {
            FallbackReason::Quarantine
        } else if let Some(f) = r.resources.fallback {
            f
        } else if boundary >= aligned(reusable) {
            FallbackReason::None
        } else if l3 > 0 && boundary < aligned(r.resources.planned_boundary) {
            FallbackReason::Partial
        } else if l3 == 0 {
            FallbackReason::Miss
        } else {
            FallbackReason::None
        };
        r.device_refs = held;
        r.scratch = scratch;
        r.state = RequestState::Prefill;
        self.running.insert(id);
        let ready = r.resources.ready.take();
        self.stats.admitted += 1;
        self.stats.prefix_device += device_tokens as u64;
        self.stats.prefix_host += host as u64;
        self.stats.prefix_l3 += l3 as u64;
        self.stats.computed += prompt.len() as u64 - boundary as u64;
        if let (Some(lease), Some(planner)) = (ready, self.storage.as_mut()) {
            planner.detach(lease);
        }
        Ok(true)
    }

    fn device_slot(&self, a: BlockAddr) -> Result<DeviceSlot, String> {
        let idx = self
            .cache
            .device()
            .slot_index(a)
            .map_err(|e| e.to_string())?;
        Ok(self.cfg.layout.cached_slot(a.group as usize, idx))
    }

    /// The engine executed this round's copies and forwards: the D2H copies completed on
    /// every rank (the engine waits for their fence), so Host L2 publishes now and the new
    /// blocks become backup candidates (returned, for the StorageTransferManager); the H2D
    /// sources are released.
    pub fn d2h_done(&mut self) -> Vec<BackupCandidate> {
        for a in std::mem::take(&mut self.h2d_host_refs) {
            let _ = self.cache.host_mut().release(a);
        }
        let mut candidates = vec![];
        let blocks = std::mem::take(&mut self.d2h_blocks);
        for a in blocks {
            if self.cache.host_mut().publish(a).is_err() {
                continue;
            }
            let _ = self.cache.host_mut().release(a);
            if self.l3_enabled() {
                let pages = self
                    .cache
                    .geometry()
                    .group(a.group as usize)
                    .pages_per_block;
                for page in 0..pages {
                    let key = page_key(self.cache.namespace(), self.cache.geometry(), a, page);
                    let host = self.new_ref(RefUse::PutSource(a, page));
                    candidates.push(BackupCandidate { key, host });
                }
            }
        }
        candidates
    }

    /// PUT dispatch of this round's candidates: rechecks Host residency and takes a source
    /// reference on each resident page; evicted candidates are forgotten (unavailable).
    fn dispatch_backups(&mut self) {
        let Some(planner) = self.storage.as_mut() else {
            return;
        };
        let cache = &mut self.cache;
        let refs = &mut self.refs;
        let mut residency = |_key: &messages::StorageKey, h: HostRef| {
            let Some(RefUse::PutSource(addr, page)) = refs.get(&h).copied() else {
                return None;
            };
            let taken = cache.host().contains(addr).then(|| {
                let page_bytes = cache.geometry().group(addr.group as usize).page_bytes;
                let range = cache.host().page_range(addr, page, page_bytes).ok()?;
                cache.host_mut().acquire(addr).ok()?;
                Some(range)
            });
            let range = taken.flatten();
            if range.is_none() {
                refs.remove(&h);
            }
            range
        };
        planner.dispatch_backups(&mut residency);
    }
}

/// The fallback a refused planning call leaves on its request.
fn refusal_reason(e: &Refusal) -> FallbackReason {
    match e {
        Refusal::PressureClosed => FallbackReason::Pressure,
        Refusal::Disabled => FallbackReason::Quarantine,
        _ => FallbackReason::Miss,
    }
}
