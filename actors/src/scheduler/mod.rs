//! The Scheduler: the request FSM and the CacheCoordinator of one rank, driven by agreed
//! rounds. Given the same agreed inputs every rank makes the same decisions (SPMD); only the
//! bytes differ (each rank holds its own KV heads).
//!
//! A round: `apply` (the StorageTransferManager applies the agreed round and reports — rows
//! to publish, references to release, waits that ended — then cancellations, new requests
//! and reduced forward digests), then `plan` (storage preparation, then admission with H2D
//! copies and forwards, then backups), then the engine executes the plan and reports the
//! D2H completion with `d2h_done`, whose backup candidates go to the manager. Every storage
//! decision (QUERY, GET, PUT: operation ID, lease or refusal) is the manager's, asked
//! directly while the round is applied and planned; the scheduler keeps no copy of the
//! credits and only queues its hand-backs (detach, cancel) for the plan's end. It never
//! performs I/O, never touches Host or device bytes and never reads a clock: time is the
//! agreed tick.
//!
//! By concern: `apply.rs` (applying the agreed round and the manager's effects),
//! `lifecycle.rs` (digests, decode, finish, abort), `prepare.rs` (QUERY and GET planning),
//! `admit.rs` (Device admission), `backups.rs` (D2H publication and backup candidates),
//! `admin.rs` (admin commands and quiescence), `plan.rs` (the Plan and the order of a
//! round's planning). This file keeps the Scheduler's state, its constructor and accessors.

mod admin;
mod admit;
mod apply;
mod backups;
pub mod bench;
pub mod geometry;
mod lifecycle;
mod plan;
mod prepare;
mod put_sources;
pub mod request;
#[cfg(test)]
mod tests;

pub use admin::AdminCommand;
pub use plan::Plan;

use crate::cache::coordinator::{
    CacheCoordinator, CacheError, CoordinatorConfig, ReadyHold, Reservation,
};
use crate::cache::keys::BlockAddr;
use crate::cache::pool::{HeldBlock, Host};
use crate::device::{DecodeStep, DeviceSlot};
use crate::frontend::FallbackReason;
use crate::id_map::IdMap;
use crate::model::{RankDigest, SyntheticModel};
use crate::row_set::RowSet;
use crate::storage_transfer::trace::RequestTrace;
use crate::storage_transfer::{HandBack, HostRef};
use geometry::RankLayout;
use messages::settings::StorageConfig;
use messages::{
    Namespace, PressureObservation, RequestId, SamplingParams, StorageDone, TokenLogprobs,
};
use put_sources::PutSources;
use request::{PrefixSplit, Request};
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

/// A request as the agreed round brings it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewRequest {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
}

/// A greedy request (tests, benchmarks, tools).
impl From<(RequestId, Vec<u32>, u32)> for NewRequest {
    fn from((id, prompt, max_tokens): (RequestId, Vec<u32>, u32)) -> Self {
        Self {
            id,
            prompt,
            max_tokens,
            sampling: SamplingParams::GREEDY,
        }
    }
}

/// Agreed inputs of one round, identical on every rank.
#[derive(Clone, Debug, Default)]
pub struct AgreedInputs {
    pub tick_us: u64,
    pub pressure: PressureObservation,
    pub new_requests: Vec<NewRequest>,
    pub cancellations: Vec<RequestId>,
    pub completions: Vec<StorageDone>,
    /// Every rank's partial digest of a forward step, per request.
    pub digests: Vec<(RequestId, Vec<RankDigest>)>,
    /// The log-probabilities a backend that draws tokens on the device reported with a
    /// step's digest (only for requests that asked for them).
    pub logprobs: Vec<(RequestId, TokenLogprobs)>,
}

/// What a request tells its client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestEvent {
    /// The next output token, with its log-probabilities when the request asked for them.
    Token(RequestId, u32, Option<TokenLogprobs>),
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
    /// Finished requests by fallback reason, indexed as `FallbackReason::ALL`.
    pub fallback: [u64; FallbackReason::ALL.len()],
    /// Tails: boundaries queried, tail blocks queried and reused by group kind (full,
    /// sliding window, state), tokens above the aligned boundary reused by tier (device,
    /// host, l3).
    pub tail_candidates_queried: u64,
    pub tail_blocks_queried: [u64; 3],
    pub tail_blocks_reused: [u64; 3],
    pub tail_tokens_reused: [u64; 3],
}

/// The index of a group kind in the tail statistics (full, sliding window, state).
pub(crate) fn tail_kind(kind: crate::cache::GroupKind) -> usize {
    match kind {
        crate::cache::GroupKind::Full => 0,
        crate::cache::GroupKind::SlidingWindow { .. } => 1,
        crate::cache::GroupKind::State => 2,
    }
}

/// A GET destination row's reference names its read and row itself (the top bit set, the
/// read above `GET_ROW_BITS`, the row below), so a read's rows take no entry anywhere;
/// backup candidates and PUT sources are named below it (`put_sources`).
const GET_ROW: u64 = 1 << 63;
const GET_ROW_BITS: u32 = 24;
/// The most rows one GET may have (its row index must fit below the read).
const GET_ROWS_MAX: usize = 1 << GET_ROW_BITS;

/// The reference of row `row` of read `read` (`row < GET_ROWS_MAX`).
fn get_row_ref(read: u64, row: usize) -> HostRef {
    debug_assert!(row < GET_ROWS_MAX && read < 1 << (63 - GET_ROW_BITS));
    HostRef(GET_ROW | read << GET_ROW_BITS | row as u64)
}

/// The read and row a GET destination reference names (None: a PUT source's).
fn get_row_of(h: HostRef) -> Option<(u64, usize)> {
    (h.0 & GET_ROW != 0).then(|| {
        let v = h.0 & !GET_ROW;
        (v >> GET_ROW_BITS, (v & (GET_ROWS_MAX as u64 - 1)) as usize)
    })
}

/// A read's Host destinations: reserved until publication, then the Ready hold's blocks.
#[derive(Debug)]
struct ReadRecord {
    /// The destination rows (row `i`'s reference is `get_row_ref(read, i)`) the manager
    /// has released.
    released_rows: RowSet,
    reservation: Option<Reservation>,
    hold: Option<ReadyHold>,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    model: SyntheticModel,
    cache: CacheCoordinator,
    /// Leases and waits given up since the last plan ended, in order: the manager applies
    /// them when the plan ends, after the plan's new operations.
    handbacks: Vec<HandBack>,
    /// Whether L3 work is enabled: storage configured and, as of the manager's last
    /// report, not quarantined (quarantine begins only while a round is applied).
    l3_enabled: bool,
    requests: BTreeMap<RequestId, Request>,
    /// Submitted and Admissible requests, in arrival order (request IDs are assigned in
    /// arrival order, so the ordered set is the queue: O(log n) to leave or re-enter it).
    /// With storage, an arrival joins it when the plan has prepared it, unless a QUERY
    /// took it out of the line.
    queue: BTreeSet<RequestId>,
    /// Admitted requests (Prefill or Decode): the forward candidates of each round.
    running: BTreeSet<RequestId>,
    /// New arrivals not yet considered for storage preparation (each is considered once:
    /// `storage_prepared` is one-shot), not yet in `queue`.
    unprepared: Vec<RequestId>,
    /// The lists the existence hints of each applied QUERY answer are made in (their
    /// buffers serve the next answer; what they hold is read only during its reservation).
    hints: crate::cache::coordinator::ExistenceHints,
    /// The per-row outcome of the GET being published (its buffer serves the next one).
    row_ok: Vec<bool>,
    /// The round's published GET rows by request (its buffer serves the next round).
    published: Vec<(RequestId, HostRef)>,
    /// The requests whose GET published this round and now hold Ready, by request (its
    /// buffer serves the next round).
    readied: Vec<RequestId>,
    free_scratch: Vec<u32>,
    /// The held source of each dispatched PUT's reference, from dispatch to settlement.
    put_sources: PutSources,
    /// Reads in flight or held Ready, by read number (lookups only).
    reads: IdMap<u64, ReadRecord>,
    next_read: u64,
    /// Blocks whose D2H copy is in flight this round (published by `d2h_done`).
    d2h_blocks: Vec<BlockAddr>,
    /// Host references taken for this round's H2D copies (released by `d2h_done`).
    h2d_host_refs: Vec<HeldBlock<Host>>,
    events: Vec<RequestEvent>,
    stats: SchedulerStats,
    pending_admin: VecDeque<AdminCommand>,
    /// Context lengths of this round's decode tokens (taken by `plan`).
    decode_contexts: Vec<u64>,
    /// The forward backend draws tokens on the device (the transformer): a prefill's
    /// digest carries the drawn token and every decode step is a device step.
    device_draws: bool,
    /// This round's device decode steps (taken by `plan`).
    device_decodes: Vec<(RequestId, DecodeStep)>,
    /// Requests whose device-side state (the backend's KV of generated tokens) ends with
    /// this round (taken by `plan`).
    device_released: Vec<RequestId>,
    /// Request spans (observation only).
    trace: RequestTrace,
    /// Debug builds: Device slots freed since the last plan (see `Plan::poison`).
    freed_device: std::sync::Arc<parking_lot::Mutex<Vec<DeviceSlot>>>,
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
        let l3_enabled = cfg.storage.is_some();
        let free_scratch = (0..cfg.layout.scratch_slots).rev().collect();
        let trace = RequestTrace::new(cfg.layout.shard.index);
        let mut me = Self {
            cfg,
            model,
            cache,
            handbacks: Vec::new(),
            l3_enabled,
            requests: BTreeMap::new(),
            queue: BTreeSet::new(),
            running: BTreeSet::new(),
            unprepared: Vec::new(),
            hints: Default::default(),
            row_ok: Vec::new(),
            published: Vec::new(),
            readied: Vec::new(),
            free_scratch,
            put_sources: PutSources::default(),
            reads: IdMap::default(),
            next_read: 0,
            d2h_blocks: vec![],
            h2d_host_refs: vec![],
            events: vec![],
            stats: SchedulerStats::default(),
            pending_admin: VecDeque::new(),
            decode_contexts: Vec::new(),
            device_draws: false,
            device_decodes: Vec::new(),
            device_released: Vec::new(),
            trace,
            freed_device: Default::default(),
        };
        if crate::host::poison::enabled() {
            me.poison_freed_device_blocks();
        }
        Ok(me)
    }

    /// A backend that draws tokens on the device: prefill digests carry the drawn token,
    /// and each further token is a device decode step of the plan.
    pub fn with_device_draws(mut self) -> Self {
        self.device_draws = true;
        self
    }
    pub fn device_draws(&self) -> bool {
        self.device_draws
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
    /// Some request is live and every live one waits on a storage completion (a QUERY or
    /// GET in flight): nothing is queued, running or unprepared, so no round can make
    /// progress before a completion, an arrival or a deadline. O(1).
    pub fn waits_only_on_storage(&self) -> bool {
        !self.requests.is_empty()
            && self.running.is_empty()
            && self.queue.is_empty()
            && self.unprepared.is_empty()
            && self.pending_admin.is_empty()
    }
    pub fn state_of(&self, id: RequestId) -> Option<&'static str> {
        self.requests.get(&id).map(|r| r.state.name())
    }
    /// Whether L3 work is enabled (storage configured and not quarantined).
    pub fn l3_enabled(&self) -> bool {
        self.l3_enabled
    }

    /// The span of a live request (None when untraced).
    pub fn request_span(&self, id: RequestId) -> Option<&tracing::Span> {
        self.trace.request_span(id)
    }
}
