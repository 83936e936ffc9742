//! StorageTransferManager: applies an agreed round in the seed's order — tick (soft
//! deadlines, Ready expiry, the pressure gate), then cancellations, then completions — so an
//! already expired or detached read can never publish a late result; its planning calls
//! (QUERY, GET, backup offers, the PUT ticket) are the decisions the Scheduler asks for
//! during a plan (`round.rs`). It owns every storage ticket and its Host references until
//! the agreed completion proves retirement. It never reads a clock, never performs I/O and
//! never frees a reference of an Issued or Quarantined ticket.

use super::admission::{admit_get, admit_query, Gates};
use super::backup::{BackupCandidate, BackupKey, BackupQueue, DropReason, OfferOutcome};
use super::credits::{CreditClass, Credits};
use super::deadline::{ready_expiry_us, soft_deadline_us, DeadlineQueue};
use super::effects::{PublishRow, QueryResult, RoundEffects};
use super::gate::{GateTransition, PressureGate};
use super::lease::{StorageLease, Wait, WaitEnd, WaitPhase};
use super::negative::NegativeMetadata;
use super::round::Planning;
use super::stats::StmStats;
use super::ticket::{Ticket, TicketState};
use super::trace::OperationTrace;
use super::{Destinations, HostRef};
use crate::id_map::{id_map, sorted_keys, IdMap};
use messages::settings::StorageConfig;
use messages::{
    HostRange, OperationId, OperationIdAllocator, PressureObservation, ProtocolError, RequestId,
    StorageCancelOp, StorageDone, StorageGetOp, StorageKey, StorageOpKind, StoragePutOp,
    StorageQueryOp,
};
use std::collections::hash_map::Entry;

/// The agreed inputs of one round, as the control plane delivers them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundInput {
    /// The agreed tick (the TP leader's monotonic clock), microseconds.
    pub tick_us: u64,
    /// Pressure, MAX-reduced across owners.
    pub pressure: PressureObservation,
    /// Client cancellations entering at the loop head.
    pub cancellations: Vec<RequestId>,
    /// Agreed completions (AND/OR-reduced across owners).
    pub completions: Vec<StorageDone>,
}

/// Why a planning call was refused. A refusal changes nothing except counters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("L3 work is stopped for this replica after quarantine")]
    Disabled,
    #[error("the pressure gate is closed")]
    PressureClosed,
    #[error("operation credits are exhausted")]
    OperationCredits,
    #[error("Host credits are exhausted")]
    HostCredits,
    #[error("an operation needs at least one key")]
    NoKeys,
    #[error("{0} keys exceed max_keys_per_operation ({1})")]
    TooManyKeys(usize, u32),
    #[error("{0} already has a storage wait")]
    AlreadyWaiting(RequestId),
    #[error("{0} has no answered QUERY to read for")]
    NotWaiting(RequestId),
    #[error("malformed operation: {0}")]
    Malformed(String),
}

#[derive(Debug)]
pub struct StorageTransferManager {
    pub(super) cfg: StorageConfig,
    ids: OperationIdAllocator,
    /// Unsettled tickets by operation (a hash table: walks in operation order sort first).
    pub(super) tickets: IdMap<OperationId, Ticket>,
    /// Waits and Ready holds by request (likewise).
    waits: IdMap<RequestId, Wait>,
    deadlines: DeadlineQueue,
    ready_expiry: DeadlineQueue,
    /// The entries a tick popped from either queue (emptied after each use).
    due_now: Vec<(u64, RequestId)>,
    pub(super) credits: Credits,
    gate: PressureGate,
    pub(super) backups: BackupQueue,
    negative: NegativeMetadata,
    /// Payload bytes of the backup PUTs issued and not yet settled
    /// (`StorageConfig::backup_bytes_in_flight` bounds new ones).
    pub(super) backup_bytes_outstanding: u64,
    now_us: u64,
    lease_serial: u64,
    pub(crate) epoch: u64,
    pub(super) quarantined: bool,
    /// Effects of the last commit's hand-backs and offers, for the next report.
    pub(super) deferred: RoundEffects,
    /// Emptied effects handed back by the scheduler (`recycle`): the next round's effects
    /// reuse their buffers.
    pub(super) spare: Option<Box<RoundEffects>>,
    /// Cancellations of detached reads, submitted with the next commit.
    pub(super) outbox: Vec<StorageCancelOp>,
    /// Spans of outstanding operations (observation only).
    pub(super) trace: OperationTrace,
    /// The round's planning in progress (between `begin_round` and `end_plan`).
    pub(super) planning: Planning,
    quarantined_refs: u64,
    ready_holds: u64,
    soft_timeouts: u64,
    ready_expirations: u64,
    pressure_bypasses: u64,
    /// Capacity backoff (agreed tick domain): no backup PUT is dispatched before
    /// `capacity_retry_at_us` after the store rejected keys for lack of space.
    capacity_retry_at_us: u64,
    capacity_backoff_us: u64,
}

/// Whether a soft-deadline entry (`due`, `request`) is still the request's: it waits on a
/// QUERY or GET with that very deadline (an ended wait's entry stays queued until due).
fn soft_deadline_live(waits: &IdMap<RequestId, Wait>, due: u64, request: RequestId) -> bool {
    waits
        .get(&request)
        .is_some_and(|w| w.is_waiting() && w.deadline_us == due)
}

/// Whether a Ready-expiry entry is still the request's: it holds Ready data expiring then.
fn ready_expiry_live(waits: &IdMap<RequestId, Wait>, due: u64, request: RequestId) -> bool {
    matches!(
        waits.get(&request).map(|w| w.phase),
        Some(WaitPhase::Ready { expires_us, .. }) if expires_us == due
    )
}

/// The first wait after a PUT's capacity rejection; it doubles on every further rejection
/// up to `CAPACITY_BACKOFF_MAX_US` and resets when a PUT lands a new write without one. A
/// full store is then retried a few times a second at most, never in a loop.
pub const CAPACITY_BACKOFF_MIN_US: u64 = 100_000;
pub const CAPACITY_BACKOFF_MAX_US: u64 = 5_000_000;

impl StorageTransferManager {
    pub fn new(cfg: StorageConfig) -> Self {
        Self {
            credits: Credits::new(&cfg),
            gate: PressureGate::new(&cfg),
            backups: BackupQueue::new(cfg.backup_candidate_capacity),
            negative: NegativeMetadata::new(cfg.negative_metadata_capacity),
            cfg,
            ids: OperationIdAllocator::new(),
            tickets: id_map(),
            waits: id_map(),
            deadlines: DeadlineQueue::new(),
            ready_expiry: DeadlineQueue::new(),
            due_now: Vec::new(),
            backup_bytes_outstanding: 0,
            now_us: 0,
            lease_serial: 0,
            epoch: 0,
            quarantined: false,
            deferred: RoundEffects::default(),
            spare: None,
            outbox: Vec::new(),
            trace: OperationTrace::default(),
            planning: Planning::default(),
            quarantined_refs: 0,
            ready_holds: 0,
            soft_timeouts: 0,
            ready_expirations: 0,
            pressure_bypasses: 0,
            capacity_retry_at_us: 0,
            capacity_backoff_us: 0,
        }
    }

    /// New backup PUTs wait: the store just said it is full (the capacity backoff), or the
    /// I/O backlog is past the low watermark (backups yield so reads keep admission).
    fn backups_paused(&self) -> bool {
        self.now_us < self.capacity_retry_at_us || self.gate.sheds_backups()
    }

    /// Backups wait for the capacity backoff until this agreed tick (0: none).
    pub fn capacity_retry_at_us(&self) -> u64 {
        self.capacity_retry_at_us
    }

    /// Names the rank on this manager's operation spans.
    pub fn with_trace_rank(mut self, rank: u32) -> Self {
        self.trace = OperationTrace::new(rank);
        self
    }

    // ----- queries -------------------------------------------------------------------

    pub fn config(&self) -> &StorageConfig {
        &self.cfg
    }
    /// The last applied tick.
    pub fn now_us(&self) -> u64 {
        self.now_us
    }
    /// False after quarantine: no new QUERY/GET/PUT for this replica. Ordinary computation
    /// and L2 hits continue (the scheduler's side).
    pub fn l3_enabled(&self) -> bool {
        !self.quarantined
    }
    pub fn gate_closed(&self) -> bool {
        self.gate.is_closed()
    }
    pub fn ticket(&self, op: OperationId) -> Option<&Ticket> {
        self.tickets.get(&op)
    }
    /// Unsettled tickets, in operation order.
    pub fn tickets(&self) -> impl Iterator<Item = &Ticket> {
        sorted_keys(&self.tickets)
            .into_iter()
            .filter_map(|op| self.tickets.get(&op))
    }
    /// The request attached to a ticket, if any. A detached ticket never publishes.
    pub fn attached_waiter(&self, op: OperationId) -> Option<RequestId> {
        self.tickets.get(&op).and_then(|t| t.waiter)
    }
    /// Whether a request is still waiting on QUERY/GET (not a Ready hold).
    pub fn is_waiting(&self, request: RequestId) -> bool {
        self.waits.get(&request).is_some_and(|w| w.is_waiting())
    }
    pub fn wait_phase(&self, request: RequestId) -> Option<WaitPhase> {
        self.waits.get(&request).map(|w| w.phase)
    }
    /// Requests still waiting, in request order.
    pub fn waiting_requests(&self) -> Vec<RequestId> {
        let mut waiting: Vec<RequestId> = self
            .waits
            .iter()
            .filter(|(_, w)| w.is_waiting())
            .map(|(r, _)| *r)
            .collect();
        waiting.sort_unstable();
        waiting
    }
    /// The references a request's Ready hold keeps, in key order.
    pub fn ready_refs(&self, request: RequestId) -> Vec<HostRef> {
        match self.waits.get(&request).map(|w| w.phase) {
            Some(WaitPhase::Ready { op, .. }) => self
                .tickets
                .get(&op)
                .map(|t| t.held_refs())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
    pub fn is_negative(&self, key: &StorageKey) -> bool {
        self.negative.contains(key)
    }
    /// The last OperationId issued (0 when none).
    pub fn last_operation_id(&self) -> u64 {
        self.ids.last()
    }
    /// Tickets not yet settled.
    pub fn outstanding_tickets(&self) -> u64 {
        self.tickets.len() as u64
    }
    pub fn credits(&self) -> &Credits {
        &self.credits
    }
    /// The refusal any QUERY would get now for want of credits (operation or Host), with
    /// the gates open: the planner skips planning such a QUERY. None when the credits
    /// admit one, or when a gate decides instead (quarantine, pressure: those refusals are
    /// counted where a planned QUERY meets them).
    pub fn query_credits_refusal(&self) -> Option<Refusal> {
        if self.quarantined || self.gate.is_closed() {
            None
        } else {
            super::admission::query_credit_refusal(&self.credits)
        }
    }

    /// Host credits not in use (what a reservation may take).
    pub fn host_credits_left(&self) -> u32 {
        self.credits
            .host_total()
            .saturating_sub(self.credits.hosts_used())
    }
    pub fn queued_candidates(&self) -> usize {
        self.backups.len()
    }

    /// The queued backup candidates, oldest first (tests).
    #[cfg(test)]
    pub(crate) fn queued_candidate_list(&self) -> Vec<BackupCandidate> {
        self.backups.candidates()
    }

    pub fn stats(&self) -> StmStats {
        StmStats {
            operation_credits_in_use: self.credits.operations_used(),
            host_credits_in_use: self.credits.hosts_used(),
            backup_operation_credits_in_use: self.credits.backup_operations_used(),
            backup_host_credits_in_use: self.credits.backup_hosts_used(),
            outstanding_tickets: self.tickets.len() as u64,
            waiting_requests: self.waits.values().filter(|w| w.is_waiting()).count() as u64,
            ready_holds: self.ready_holds,
            quarantined_refs: self.quarantined_refs,
            soft_timeouts: self.soft_timeouts,
            ready_expirations: self.ready_expirations,
            pressure_bypasses: self.pressure_bypasses,
            dropped_backup_keys: self.backups.dropped_all(),
            coalesced_backup_keys: self.backups.coalesced(),
            queued_backup_candidates: self.backups.len() as u64,
            negative_entries: self.negative.len() as u64,
            gate_closed: self.gate.is_closed(),
            gate_closed_us: self.gate.closed_us(self.now_us),
            l3_enabled: !self.quarantined,
            last_operation_id: self.ids.last(),
        }
    }

    // ----- the round ------------------------------------------------------------------

    /// Apply one agreed round: tick, then cancellations, then completions. The completions
    /// are validated first, all of them, so an invalid record changes nothing.
    pub fn apply_round(&mut self, input: RoundInput) -> Result<RoundEffects, ProtocolError> {
        let mut fx = RoundEffects::default();
        self.apply_round_into(input, &mut fx)?;
        Ok(fx)
    }

    /// `apply_round`, its effects appended to `fx` (nothing is appended when the round is
    /// invalid).
    pub(super) fn apply_round_into(
        &mut self,
        input: RoundInput,
        fx: &mut RoundEffects,
    ) -> Result<(), ProtocolError> {
        let mut completions = input.completions;
        completions.sort_by_key(|d| d.op);
        self.validate_completions(&completions)?;
        self.apply_tick(input.tick_us, input.pressure, fx);
        for request in input.cancellations {
            self.cancel_into(request, fx);
        }
        for done in &mut completions {
            self.apply_completion(done, fx);
        }
        Ok(())
    }

    /// Validates the round's completions, sorted by operation (so a twice-completed
    /// operation is two neighbours).
    fn validate_completions(&self, completions: &[StorageDone]) -> Result<(), ProtocolError> {
        let mut last = None;
        for d in completions {
            d.validate()?;
            if last.replace(d.op) == Some(d.op) {
                return Err(ProtocolError::new(d.op, "completed twice in one round"));
            }
            let t = self
                .tickets
                .get(&d.op)
                .ok_or_else(|| ProtocolError::new(d.op, "completion of an unknown operation"))?;
            if t.state != TicketState::Issued {
                return Err(ProtocolError::new(d.op, "operation already completed"));
            }
            if t.kind != d.kind {
                return Err(ProtocolError::new(
                    d.op,
                    format!(
                        "{} completion for a {} operation",
                        d.kind.as_str(),
                        t.kind.as_str()
                    ),
                ));
            }
            if d.len() != t.rows() {
                return Err(ProtocolError::new(
                    d.op,
                    format!("{} key results for {} keys", d.len(), t.rows()),
                ));
            }
        }
        Ok(())
    }

    /// Takes back a round's effects once the scheduler has applied them: emptied, their
    /// buffers serve the next round (a steady state allocates no effect lists).
    pub fn recycle(&mut self, mut fx: Box<RoundEffects>) {
        if !fx.is_empty() {
            fx.clear();
        }
        self.spare = Some(fx);
    }

    pub(super) fn apply_tick(
        &mut self,
        tick_us: u64,
        pressure: PressureObservation,
        fx: &mut RoundEffects,
    ) {
        self.now_us = self.now_us.max(tick_us);
        let now = self.now_us;
        if !self.deadlines.is_empty() || !self.ready_expiry.is_empty() {
            self.expire(now, fx);
        }
        self.observe_pressure(pressure, now, fx);
    }

    /// Soft deadlines and Ready expiries due at `now`.
    fn expire(&mut self, now: u64, fx: &mut RoundEffects) {
        // A popped entry counts only while its request still waits with that due tick (an
        // ended deadline's entry stays in the queue until it comes due).
        // The due entries are popped into the manager's own list, kept for the next tick.
        let mut due_now = std::mem::take(&mut self.due_now);
        self.deadlines.pop_due_into(now, &mut due_now);
        for &(due, request) in &due_now {
            if soft_deadline_live(&self.waits, due, request) {
                self.soft_timeouts += 1;
                self.end_wait(request, WaitEnd::SoftTimeout, fx);
            }
        }
        self.ready_expiry.pop_due_into(now, &mut due_now);
        for &(due, request) in &due_now {
            if ready_expiry_live(&self.waits, due, request) {
                self.ready_expirations += 1;
                fx.ready_expired.push(request);
                self.end_ready(request, fx);
            }
        }
        due_now.clear();
        self.due_now = due_now;
        let waits = &self.waits;
        self.deadlines
            .retain_if_stale(waits.len(), |due, r| soft_deadline_live(waits, due, r));
        self.ready_expiry
            .retain_if_stale(waits.len(), |due, r| ready_expiry_live(waits, due, r));
    }

    /// The pressure gate observes this round's pressure: closing, it ends every QUERY wait
    /// and drops the queued backup candidates.
    fn observe_pressure(&mut self, pressure: PressureObservation, now: u64, fx: &mut RoundEffects) {
        if self.gate.observe_at(pressure, now) == GateTransition::Closed {
            // In request order (the table's own order is not).
            let mut in_query: Vec<RequestId> = self
                .waits
                .iter()
                .filter(|(_, w)| matches!(w.phase, WaitPhase::Query(_) | WaitPhase::QueryDone))
                .map(|(r, _)| *r)
                .collect();
            in_query.sort_unstable();
            for request in in_query {
                self.pressure_bypasses += 1;
                self.end_wait(request, WaitEnd::Pressure, fx);
            }
            self.backups.drop_all(DropReason::Pressure);
        }
    }

    /// End a request's QUERY/GET wait: detach it from its ticket (which keeps its
    /// references until retirement) and emit a cancellation for the still-outstanding read.
    fn end_wait(&mut self, request: RequestId, reason: WaitEnd, fx: &mut RoundEffects) {
        let Some(w) = self.waits.remove(&request) else {
            return;
        };
        debug_assert!(w.is_waiting());
        if let Some(op) = w.ticket() {
            if let Some(t) = self.tickets.get_mut(&op) {
                if t.waiter == Some(request) {
                    t.waiter = None;
                    if t.state == TicketState::Issued && !t.cancel_sent {
                        t.cancel_sent = true;
                        fx.cancels.push(StorageCancelOp { op });
                    }
                }
            }
        }
        fx.waits_ended.push((request, reason));
    }

    /// End a Ready hold: the ticket settles and releases the held references.
    fn end_ready(&mut self, request: RequestId, fx: &mut RoundEffects) {
        let Some(w) = self.waits.remove(&request) else {
            return;
        };
        if let WaitPhase::Ready { op, .. } = w.phase {
            self.ready_holds = self.ready_holds.saturating_sub(1);
            if let Some(t) = self.tickets.get_mut(&op) {
                t.waiter = None;
            }
            self.settle(op, fx);
        }
    }

    /// Ends a request's wait (detached) or its Ready hold: a client cancellation (from
    /// `RoundInput::cancellations`) or a clear (`reject_outstanding`). Native I/O references
    /// stay with the ticket until retirement.
    pub(super) fn cancel_into(&mut self, request: RequestId, fx: &mut RoundEffects) {
        match self.waits.get(&request).map(|w| w.phase) {
            Some(WaitPhase::Ready { .. }) => self.end_ready(request, fx),
            Some(_) => self.end_wait(request, WaitEnd::Detached, fx),
            None => {}
        }
    }

    /// Hand back a lease: whatever ended the request's state (admission after acquiring
    /// its own Host references, a local publication satisfying the wait, an abort). A stale
    /// lease (its wait already ended) does nothing.
    pub fn detach(&mut self, lease: StorageLease) -> RoundEffects {
        let mut fx = RoundEffects::default();
        self.detach_into(lease, &mut fx);
        fx
    }

    /// `detach` into the caller's effects (no effects of its own to merge).
    pub(super) fn detach_into(&mut self, lease: StorageLease, fx: &mut RoundEffects) {
        if self
            .waits
            .get(&lease.request)
            .is_some_and(|w| w.serial == lease.serial)
        {
            self.cancel_into(lease.request, fx);
        }
    }

    /// Settles a ticket: its credits return and its held references are released. Returns
    /// the settled ticket (removed), so a caller may move its keys out instead of copying.
    fn settle(&mut self, op: OperationId, fx: &mut RoundEffects) -> Option<Ticket> {
        // One search of the ticket table: the entry found is the one removed.
        let Entry::Occupied(mut e) = self.tickets.entry(op) else {
            return None;
        };
        let (ops, hosts) = e.get_mut().settle(&mut fx.release)?;
        let t = e.remove();
        if t.kind == StorageOpKind::Put {
            self.backup_bytes_outstanding =
                self.backup_bytes_outstanding.saturating_sub(t.put_bytes);
        }
        self.credits.release(t.class, ops, hosts);
        fx.settled.push(op);
        Some(t)
    }

    /// The references of ticket `op` after `settle` returned `settled` (moved out of the
    /// removed ticket; copied when it stayed, which an Issued ticket never does).
    fn settled_refs(&self, op: OperationId, settled: Option<Ticket>) -> Vec<HostRef> {
        match settled {
            Some(t) => t.refs,
            None => self
                .tickets
                .get(&op)
                .map(|t| t.refs.clone())
                .unwrap_or_default(),
        }
    }

    /// Applies one validated completion (its QUERY existence mask moves into the effects).
    fn apply_completion(&mut self, done: &mut StorageDone, fx: &mut RoundEffects) {
        let op = done.op;
        let Some(t) = self.tickets.get(&op) else {
            return;
        };
        let (kind, waiter, epoch) = (t.kind, t.waiter, t.epoch);
        if kind == StorageOpKind::Get && done.failures.iter().any(|f| f.is_some()) {
            for (i, f) in done.failures.iter().enumerate() {
                if f.is_some() {
                    if let Some(key) = t.keys.get(i) {
                        if self.negative.record(key) {
                            fx.negative.push(key.clone());
                        }
                    }
                }
            }
        }
        // Only a PUT's outcome needs the ticket's backup keys and references after
        // settlement: they move out of the settled ticket; a GET reads its keys from the
        // ticket in place.
        let backup_keys = if kind == StorageOpKind::Put {
            self.unpend_put_keys(op, epoch)
        } else {
            Vec::new()
        };
        // QUERY touches no supplied Host payload: its failure retains no buffer, so an
        // unretired QUERY quarantines nothing.
        if !done.retired && kind != StorageOpKind::Query {
            self.quarantine(op, fx);
            return;
        }
        let clean = done.rejection.is_none() && done.error.is_none();
        match kind {
            StorageOpKind::Query => {
                self.settle(op, fx);
                if let Some(request) = waiter {
                    if clean {
                        if let Some(w) = self.waits.get_mut(&request) {
                            w.phase = WaitPhase::QueryDone;
                        }
                        fx.query_results.push(QueryResult {
                            request,
                            op,
                            exists: std::mem::take(&mut done.success),
                        });
                    } else {
                        self.finish_wait(request, fx);
                    }
                }
            }
            StorageOpKind::Get => {
                let Some(request) = waiter.filter(|_| clean) else {
                    self.settle(op, fx);
                    if let Some(request) = waiter {
                        self.finish_wait(request, fx);
                    }
                    return;
                };
                let mut published = 0usize;
                if let Some(t) = self.tickets.get_mut(&op) {
                    for i in 0..t.keys.len() {
                        if done.success.get(i).copied().unwrap_or(false) {
                            published += 1;
                            fx.publish.push(PublishRow {
                                op,
                                request,
                                key_index: i,
                                host: t.refs[i],
                            });
                        } else if let Some(r) = t.release_row(i) {
                            self.credits.release(t.class, 0, 1);
                            fx.release.push(r);
                        }
                    }
                    if published > 0 {
                        t.state = TicketState::Completed;
                    }
                }
                if published == 0 {
                    self.settle(op, fx);
                    self.finish_wait(request, fx);
                    return;
                }
                let expires_us = ready_expiry_us(&self.cfg, self.now_us);
                if let Some(w) = self.waits.get_mut(&request) {
                    w.phase = WaitPhase::Ready { op, expires_us };
                }
                self.ready_expiry.insert(expires_us, request);
                self.ready_holds += 1;
                fx.waits_ended.push((request, WaitEnd::Completed));
            }
            StorageOpKind::Put => {
                let settled = self.settle(op, fx);
                let refs = self.settled_refs(op, settled);
                let rejected = done.capacity.iter().any(|c| *c);
                if rejected && epoch == self.epoch {
                    self.capacity_backoff_us = (self.capacity_backoff_us * 2)
                        .clamp(CAPACITY_BACKOFF_MIN_US, CAPACITY_BACKOFF_MAX_US);
                    self.capacity_retry_at_us = self.now_us + self.capacity_backoff_us;
                } else if done.new_writes > 0 {
                    self.capacity_backoff_us = 0;
                }
                for (i, (&backup, &host)) in backup_keys.iter().zip(&refs).enumerate() {
                    if done.success.get(i).copied().unwrap_or(false) {
                        fx.backed_up.push(backup);
                    } else if done.capacity.get(i).copied().unwrap_or(false) && epoch == self.epoch
                    {
                        let candidate = BackupCandidate { key: backup, host };
                        if !matches!(
                            self.offer_candidate(candidate.clone()),
                            OfferOutcome::Dropped(_)
                        ) {
                            fx.reoffer.push(candidate);
                        }
                    }
                }
            }
        }
    }

    /// End an attached wait because its operation completed without a Ready hold.
    fn finish_wait(&mut self, request: RequestId, fx: &mut RoundEffects) {
        if self.waits.remove(&request).is_some() {
            fx.waits_ended.push((request, WaitEnd::Completed));
        }
    }

    fn quarantine(&mut self, op: OperationId, fx: &mut RoundEffects) {
        let Some(t) = self.tickets.get_mut(&op) else {
            return;
        };
        let waiter = t.waiter;
        let refs = t.quarantine();
        self.quarantined_refs += refs.len() as u64;
        fx.quarantined.extend(refs);
        if let Some(request) = waiter {
            self.finish_wait(request, fx);
        }
        if !self.quarantined {
            self.quarantined = true;
            self.backups.drop_all(DropReason::Disabled);
        }
    }

    /// Takes PUT `op`'s backup keys off the pending table (those of its epoch) and returns
    /// them, row by row.
    fn unpend_put_keys(&mut self, op: OperationId, epoch: u64) -> Vec<BackupKey> {
        let keys = self
            .tickets
            .get_mut(&op)
            .map(|t| std::mem::take(&mut t.backup))
            .unwrap_or_default();
        for key in &keys {
            self.backups.unpend(key, epoch);
        }
        keys
    }

    // ----- planning -------------------------------------------------------------------

    /// Issue a QUERY for a request; its soft deadline starts now (the current tick).
    pub fn issue_query(
        &mut self,
        request: RequestId,
        keys: Vec<StorageKey>,
    ) -> Result<(StorageQueryOp, StorageLease), Refusal> {
        let n = keys.len();
        self.issue_query_with(request, n, move || keys)
    }

    /// `issue_query` of `n` keys that `keys` makes only once the QUERY is admitted (a
    /// refusal builds none). `keys()` must return exactly `n` keys.
    pub fn issue_query_with(
        &mut self,
        request: RequestId,
        n: usize,
        keys: impl FnOnce() -> Vec<StorageKey>,
    ) -> Result<(StorageQueryOp, StorageLease), Refusal> {
        if self.quarantined {
            return Err(Refusal::Disabled);
        }
        if self.waits.contains_key(&request) {
            return Err(Refusal::AlreadyWaiting(request));
        }
        let gates = self.gates();
        if let Err(e) = admit_query(gates, &mut self.credits, &self.cfg, n) {
            if e == Refusal::PressureClosed {
                self.pressure_bypasses += 1;
            }
            return Err(e);
        }
        let keys = keys();
        debug_assert_eq!(keys.len(), n, "the admitted key count");
        let op = self.ids.next_id();
        // The keys go out with the operation only: the ticket counts them.
        self.tickets.insert(
            op,
            Ticket::query(op, keys.len(), request, self.epoch, self.now_us),
        );
        let deadline_us = soft_deadline_us(&self.cfg, self.now_us);
        self.lease_serial += 1;
        let serial = self.lease_serial;
        self.waits.insert(
            request,
            Wait {
                serial,
                phase: WaitPhase::Query(op),
                deadline_us,
            },
        );
        self.deadlines.insert(deadline_us, request);
        Ok((
            StorageQueryOp {
                op,
                request: Some(request),
                keys,
            },
            StorageLease { request, serial },
        ))
    }

    /// Issue a GET for a request whose QUERY was answered: fixed keys into fixed Host
    /// destinations the caller has allocated and pinned. The caller checks `gate_closed()`
    /// and the credits before allocating destinations; on a refusal the destinations stay
    /// the caller's. The ticket takes those references
    /// and releases them only at agreed retirement (or keeps them, quarantined).
    pub fn issue_get(
        &mut self,
        request: RequestId,
        keys: Vec<StorageKey>,
        destinations: impl Into<Destinations>,
    ) -> Result<StorageGetOp, Refusal> {
        let destinations = destinations.into();
        if self.quarantined {
            return Err(Refusal::Disabled);
        }
        if self.wait_phase(request) != Some(WaitPhase::QueryDone) {
            return Err(Refusal::NotWaiting(request));
        }
        let gates = self.gates();
        admit_get(
            gates,
            &mut self.credits,
            &self.cfg,
            keys.len(),
            &destinations,
        )?;
        let op = self.ids.next_id();
        let Destinations { refs, ranges } = destinations;
        self.tickets.insert(
            op,
            Ticket::new(
                op,
                StorageOpKind::Get,
                CreditClass::Read,
                keys.clone(),
                refs,
                Some(request),
                self.epoch,
                self.now_us,
            ),
        );
        if let Some(w) = self.waits.get_mut(&request) {
            w.phase = WaitPhase::Get(op);
        }
        Ok(StorageGetOp {
            op,
            request: Some(request),
            keys,
            destinations: ranges,
        })
    }

    /// The planning gates of this moment.
    pub(crate) fn gates(&self) -> Gates {
        Gates {
            quarantined: self.quarantined,
            gate_closed: self.gate.is_closed(),
            backups_paused: self.backups_paused(),
        }
    }

    /// Offer a nonowning backup candidate (after a D2H completion published Host L2).
    pub fn offer_backup(&mut self, key: impl Into<BackupKey>, host: HostRef) -> OfferOutcome {
        self.offer_candidate(BackupCandidate {
            key: key.into(),
            host,
        })
    }

    pub(super) fn offer_candidate(&mut self, candidate: BackupCandidate) -> OfferOutcome {
        self.backup_offers().offer(candidate)
    }

    /// Why an offer now is dropped at once (None: it goes to the queue): writes disabled (a
    /// zero write budget, or L3 quarantined), else the pressure gate closed.
    pub(super) fn offer_gate(&self) -> Option<DropReason> {
        if self.quarantined || self.credits.write_budget_zero() {
            Some(DropReason::Disabled)
        } else if self.gate.is_closed() {
            Some(DropReason::Pressure)
        } else {
            None
        }
    }

    /// Creates the ticket of a create-only PUT whose sources the cache owner has rechecked
    /// and referenced; charges the backup credits. The caller (`plan_backups`) checked the
    /// gates and that the keys fit the backup room, and its dispatch marked the backup keys
    /// pending (`BackupQueue::dispatch_front`) until the PUT completes.
    pub(super) fn put_ticket(
        &mut self,
        keys: Vec<StorageKey>,
        backup: Vec<BackupKey>,
        refs: Vec<HostRef>,
        ranges: Vec<HostRange>,
    ) -> StoragePutOp {
        debug_assert!(!keys.is_empty() && keys.len() == refs.len() && keys.len() == ranges.len());
        debug_assert_eq!(keys.len(), backup.len());
        let charged = self
            .credits
            .charge(CreditClass::Backup, 1, keys.len() as u32);
        debug_assert!(charged, "room was computed from the backup credits");
        let op = self.ids.next_id();
        let bytes = ranges.iter().map(|r| r.len).sum::<u64>();
        self.backup_bytes_outstanding += bytes;
        // The object keys and ranges go out with the operation only: the ticket names its
        // rows by their backup keys and references.
        self.tickets.insert(
            op,
            Ticket::new(
                op,
                StorageOpKind::Put,
                CreditClass::Backup,
                Vec::new(),
                refs,
                None,
                self.epoch,
                self.now_us,
            )
            .with_backup(backup, bytes),
        );
        StoragePutOp {
            op,
            keys,
            sources: ranges,
        }
    }

    // ----- used by clear.rs -----------------------------------------------------------

    /// Reject every outstanding storage operation without draining: detach all waits,
    /// drop Ready holds and candidates, cancel outstanding tickets. In-flight tickets keep
    /// their references until retirement; quarantined tickets keep theirs forever.
    pub(crate) fn reject_outstanding(&mut self, fx: &mut RoundEffects) {
        for request in sorted_keys(&self.waits) {
            self.cancel_into(request, fx);
        }
        self.backups.drop_all(DropReason::Cleanup);
        for op in sorted_keys(&self.tickets) {
            let Some(t) = self.tickets.get_mut(&op) else {
                continue;
            };
            if t.state == TicketState::Issued && !t.cancel_sent {
                t.cancel_sent = true;
                fx.cancels.push(StorageCancelOp { op: t.op });
            }
        }
        self.negative.clear();
        self.epoch += 1;
    }
}
