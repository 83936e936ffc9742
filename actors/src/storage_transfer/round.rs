//! The StorageTransferManager's round, the one place where storage admission is decided:
//! `begin_round` applies the agreed round and reports its effects to the Scheduler; while
//! the Scheduler plans it asks the manager directly — `plan_query`, `plan_get` and
//! `plan_backups` decide each new operation on the manager's own credits and gates (with
//! the rules of `admission.rs`) and record it in plan order; `plan_backups` takes backup
//! candidates off the queue front only as its PUTs carry them (a candidate no credit could
//! carry this round stays queued, untouched); `end_plan` applies the plan's hand-backs after
//! its new operations (so every new operation is decided on the credits as of the start of
//! the plan; their effects reach the scheduler with the next report) and returns the
//! operations for the L3 executor, cancellations of detached reads first. `offer_backups`
//! (or one `backup_offers` batch) takes the D2H-published blocks as candidates. It never
//! performs I/O or reads a clock, and keeps no second copy of the credits to compare
//! against.

use super::admission::backup_room;
use super::backup::{BackupCandidate, BackupKey, BackupQueue, DropReason, OfferOutcome};
use super::effects::RoundEffects;
use super::lease::StorageLease;
use super::manager::{Refusal, RoundInput, StorageTransferManager};
use super::report::{BackendTrouble, HandBack, StorageReport};
use super::{ClearKind, Destinations, HostRef};
use messages::{
    HostRange, OperationId, ProtocolError, Rejection, RequestId, StorageCancelOp, StorageKey,
    StorageOp,
};
use std::collections::BTreeMap;
use tracing::Span;

/// The cache owner's residency recheck of a backup candidate (its key and reference) at PUT
/// dispatch: for a resident page whose source reference it took, the object key, the Host
/// range and the reference that names the source (the PUT's ticket holds it); or None.
pub type Residency<'a> =
    dyn FnMut(&BackupKey, HostRef) -> Option<(StorageKey, HostRange, HostRef)> + 'a;

/// The round's planning in progress, between `begin_round` and `end_plan`.
#[derive(Debug, Default)]
pub(super) struct Planning {
    /// The plan's new operations, in plan order.
    ops: Vec<StorageOp>,
    /// The request spans of the plan's traced operations.
    parents: BTreeMap<OperationId, Span>,
}

impl Planning {
    fn record(&mut self, op: StorageOp, parent: Option<Span>) {
        if let Some(p) = parent {
            self.parents.insert(op.id(), p);
        }
        self.ops.push(op);
    }
}

impl StorageTransferManager {
    /// Applies the agreed round (tick, cancellations, completions) and reports to the
    /// scheduler: this round's effects with those deferred from the last plan. A round
    /// without completions or cancellations (an idle engine's) applies only the tick and
    /// the pressure, so it also touches little of the manager.
    pub fn begin_round(&mut self, input: RoundInput) -> Result<StorageReport, ProtocolError> {
        // The effects of the last plan's hand-backs first, then this round's, in the lists
        // the scheduler handed back last round (`recycle`).
        let mut effects = self.spare.take().unwrap_or_default();
        if !self.deferred.is_empty() {
            effects.move_from(&mut self.deferred);
        }
        let trouble = if input.completions.is_empty() && input.cancellations.is_empty() {
            self.apply_tick(input.tick_us, input.pressure, &mut effects);
            Vec::new()
        } else {
            match self.apply_completions(input, &mut effects) {
                Ok(trouble) => trouble,
                Err(e) => {
                    // An invalid round appended nothing: the deferred effects wait for the
                    // next.
                    self.deferred.move_from(&mut effects);
                    return Err(e);
                }
            }
        };
        self.outbox.append(&mut effects.cancels);
        // A plan that never ended keeps its operations for the next `end_plan`.
        debug_assert!(self.planning.ops.is_empty(), "the last plan did not end");
        self.backups.drain_forgotten_into(&mut effects.forgotten);
        Ok(StorageReport { effects, trouble })
    }

    /// `begin_round`'s completions and cancellations (with the tick) into `effects`; the
    /// backend trouble they report, by waiting request. Kept out of line, so the quiet
    /// round's path stays short.
    #[inline(never)]
    fn apply_completions(
        &mut self,
        input: RoundInput,
        effects: &mut RoundEffects,
    ) -> Result<Vec<(RequestId, BackendTrouble)>, ProtocolError> {
        // The backend trouble a completion reports, if any.
        let trouble_of = |d: &messages::StorageDone| match d.rejection {
            Some(Rejection::Unhealthy) => Some(BackendTrouble::Unhealthy),
            Some(Rejection::Quarantined) => Some(BackendTrouble::Quarantined),
            None if d.error.is_some() => Some(BackendTrouble::Unhealthy),
            None if !d.retired => Some(BackendTrouble::Quarantined),
            _ => None,
        };
        // The waiters of the completions whose report or trace needs them once applied
        // (a troubled or a traced one); a plain completion looks up no ticket here.
        let attached: Vec<_> = input
            .completions
            .iter()
            .filter(|d| trouble_of(d).is_some() || self.trace.traces(d.op))
            .filter_map(|d| self.attached_waiter(d.op).map(|r| (d.op, r)))
            .collect();
        let trouble = input
            .completions
            .iter()
            .filter_map(|d| {
                let why = trouble_of(d)?;
                let (_, request) = attached.iter().find(|(op, _)| *op == d.op)?;
                Some((*request, why))
            })
            .collect();
        let traced: Vec<_> = input
            .completions
            .iter()
            .filter(|d| self.trace.traces(d.op))
            .cloned()
            .collect();
        self.apply_round_into(input, effects)?;
        for done in &traced {
            let was_attached = attached.iter().any(|(op, _)| *op == done.op);
            self.trace.agreed(done, was_attached, effects);
        }
        Ok(trouble)
    }

    /// Decides a QUERY of the plan (its soft deadline starts at the applied tick): the
    /// operation joins the plan's operations and the lease goes to the request's state.
    pub fn plan_query(
        &mut self,
        request: RequestId,
        keys: Vec<StorageKey>,
        parent: Option<Span>,
    ) -> Result<(OperationId, StorageLease), Refusal> {
        let n = keys.len();
        self.plan_query_with(request, n, move || keys, parent)
    }

    /// `plan_query` of `n` keys that `keys` makes only once the QUERY is admitted: a
    /// refused QUERY costs no key strings.
    pub fn plan_query_with(
        &mut self,
        request: RequestId,
        n: usize,
        keys: impl FnOnce() -> Vec<StorageKey>,
        parent: Option<Span>,
    ) -> Result<(OperationId, StorageLease), Refusal> {
        let (q, lease) = self.issue_query_with(request, n, keys)?;
        let op = q.op;
        self.planning.record(StorageOp::Query(q), parent);
        Ok((op, lease))
    }

    /// Decides a GET of the plan into destinations the caller reserved and pinned; on a
    /// refusal the destinations stay the caller's.
    pub fn plan_get(
        &mut self,
        request: RequestId,
        keys: Vec<StorageKey>,
        destinations: impl Into<Destinations>,
        parent: Option<Span>,
    ) -> Result<OperationId, Refusal> {
        let g = self.issue_get(request, keys, destinations)?;
        let op = g.op;
        self.planning.record(StorageOp::Get(g), parent);
        Ok(op)
    }

    /// Dispatches create-only PUTs of the plan from the queued candidates, oldest first,
    /// within the backup credits and `backup_bytes_in_flight` (a PUT only while less is
    /// outstanding, each up to a quarter of it). `residency(key, host)` rechecks the Host entry:
    /// `Some((object key, range, source))` means it is resident and the caller took a source
    /// reference, named by `source` (which the ticket then owns until retirement), and made
    /// the object key (a page's key is made only here); `None` drops the candidate as
    /// unavailable (the caller forgets it). Candidates that find no credits or bytes are never taken: they stay
    /// queued, in order.
    /// Returns the PUTs' operation IDs.
    pub fn plan_backups(&mut self, residency: &mut Residency<'_>) -> Vec<OperationId> {
        let mut issued = vec![];
        if self.backups.is_empty() {
            return issued;
        }
        let gates = self.gates();
        if gates.quarantined || gates.gate_closed || gates.backups_paused {
            return issued;
        }
        let mut unavailable = 0u64;
        // The bytes bound: a new PUT only while less than the bound is outstanding, each
        // taking keys until it carries a quarter of it (the rest wait in the queue).
        let in_flight = self.cfg.backup_bytes_in_flight;
        let per_op = (in_flight / 4).max(1);
        loop {
            let room = backup_room(&self.credits, &self.cfg);
            if room == 0 || self.backups.is_empty() || self.backup_bytes_outstanding >= in_flight {
                break;
            }
            let cap = room.min(self.backups.len());
            let (mut keys, mut backup, mut refs, mut ranges) = (
                Vec::with_capacity(cap),
                Vec::with_capacity(cap),
                Vec::with_capacity(cap),
                Vec::with_capacity(cap),
            );
            let mut bytes = 0u64;
            while keys.len() < room && bytes < per_op {
                // A taken candidate's key is pending from here (the PUT below carries it).
                let Some((c, taken)) = self
                    .backups
                    .dispatch_front(self.epoch, |c| residency(&c.key, c.host))
                else {
                    break;
                };
                // The queue holds each key once and none a pending PUT covers (an offer of
                // either coalesces), so no PUT carries a key twice or one already in flight.
                debug_assert!(!backup.contains(&c.key));
                match taken {
                    Some((key, range, source)) => {
                        bytes += range.len;
                        keys.push(key);
                        backup.push(c.key);
                        refs.push(source);
                        ranges.push(range);
                    }
                    None => unavailable += 1,
                }
            }
            if keys.is_empty() {
                break;
            }
            let put = self.put_ticket(keys, backup, refs, ranges);
            issued.push(put.op);
            self.planning.record(StorageOp::Put(put), None);
        }
        if unavailable > 0 {
            self.backups
                .count_drop(DropReason::Unavailable, unavailable);
        }
        issued
    }

    /// `plan_backups` for candidates a test offered under object keys (`BlockPage::from`
    /// a `StorageKey`): the residency check sees that key; a page no test key named is
    /// unavailable.
    #[cfg(test)]
    pub(crate) fn plan_backups_keyed(
        &mut self,
        residency: &mut dyn FnMut(&StorageKey, HostRef) -> Option<HostRange>,
    ) -> Vec<OperationId> {
        self.plan_backups(&mut |k: &BackupKey, h: HostRef| {
            let key = super::backup::named_key(k)?;
            residency(&key, h).map(|r| (key, r, h))
        })
    }

    /// Ends the plan: the hand-backs apply (after every new operation), and the operations to submit come back in plan
    /// order — cancellations of detached reads first, then the new operations, then the
    /// cancellations the hand-backs caused.
    pub fn end_plan(&mut self, handbacks: Vec<HandBack>) -> Vec<StorageOp> {
        // Nothing planned, nothing handed back, no cancellation waiting: no operation.
        if self.planning.ops.is_empty() && self.outbox.is_empty() && handbacks.is_empty() {
            return Vec::new();
        }
        // The plan's and the outbox's lists keep their buffers for the next plan; the
        // operations leave in one list made at its size.
        let mut ops = Vec::with_capacity(self.outbox.len() + self.planning.ops.len());
        ops.extend(self.outbox.drain(..).map(StorageOp::Cancel));
        ops.append(&mut self.planning.ops);
        if !handbacks.is_empty() {
            // Written straight into the deferred effects (their lists keep their buffers).
            let mut fx = std::mem::take(&mut self.deferred);
            let before = fx.cancels.len();
            for h in handbacks {
                match h {
                    HandBack::Detach(lease) => self.detach_into(lease, &mut fx),
                    HandBack::Cancel(request) => self.cancel_into(request, &mut fx),
                }
            }
            ops.extend(fx.cancels.drain(before..).map(StorageOp::Cancel));
            self.deferred = fx;
        }
        let parents = std::mem::take(&mut self.planning.parents);
        self.trace.issued(&ops, |op| parents.get(&op));
        ops
    }

    /// Takes blocks that a D2H completion published in Host L2 as backup candidates
    /// (nonowning). Drops and coalescing reach the scheduler with the next report.
    pub fn offer_backups(&mut self, candidates: impl IntoIterator<Item = BackupCandidate>) {
        let candidates = candidates.into_iter();
        let mut offers = self.backup_offers();
        offers.reserve(candidates.size_hint().0);
        for c in candidates {
            let _ = offers.offer(c);
        }
    }

    /// The offers of one batch of candidates (a round's D2H blocks), taken one by one as
    /// they are made: the gates are read once for the batch (no offer opens or closes
    /// them). A lone offer (`offer_candidate`) is a batch of one.
    pub fn backup_offers(&mut self) -> BackupOffers<'_> {
        BackupOffers {
            gate: self.offer_gate(),
            epoch: self.epoch,
            queue: &mut self.backups,
        }
    }

    /// A clear applied between rounds: rejects outstanding work without draining. Returns
    /// the effects for the scheduler and the cancellations to submit now.
    pub fn clear_now(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
    ) -> Result<(RoundEffects, Vec<StorageOp>), super::ClearRefused> {
        let mut fx = self.clear(kind, remote_deletion)?;
        let mut cancels: Vec<StorageCancelOp> = std::mem::take(&mut self.outbox);
        cancels.append(&mut fx.cancels);
        let mut effects = std::mem::take(&mut self.deferred);
        effects.move_from(&mut fx);
        self.backups.drain_forgotten_into(&mut effects.forgotten);
        let tickets = &self.tickets;
        self.trace
            .retain_outstanding(|op| tickets.contains_key(&op));
        let ops = cancels.into_iter().map(StorageOp::Cancel).collect();
        Ok((effects, ops))
    }

    /// The span of an outstanding operation (None when untraced or completed): entered
    /// while the operation is submitted.
    pub fn op_span(&self, op: OperationId) -> Option<&Span> {
        self.trace.op_span(op)
    }
}

/// A batch of backup offers (`StorageTransferManager::backup_offers`): the gates as read
/// when the batch began, and the queue the candidates go to.
pub struct BackupOffers<'m> {
    gate: Option<DropReason>,
    epoch: u64,
    queue: &'m mut BackupQueue,
}

impl BackupOffers<'_> {
    /// Room for `n` more candidates, made once for the batch.
    pub fn reserve(&mut self, n: usize) {
        if self.gate.is_none() {
            self.queue.reserve(n);
        }
    }

    /// One candidate: dropped for the batch's closed gate, or offered to the queue.
    pub fn offer(&mut self, candidate: BackupCandidate) -> OfferOutcome {
        match self.gate {
            Some(reason) => {
                self.queue.count_drop(reason, 1);
                self.queue.forget(candidate.host);
                OfferOutcome::Dropped(reason)
            }
            None => self.queue.offer(candidate, self.epoch),
        }
    }
}
