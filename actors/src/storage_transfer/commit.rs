//! The StorageTransferManager's round steps: `begin_round` applies the agreed round and
//! writes the StorageReport the Scheduler plans against; `commit` turns the plan's
//! StorageIntents into tickets and the operations for the L3 executor (in plan order);
//! `offer_backups` takes the D2H-published blocks as backup candidates. Each planning
//! intent is replayed on the manager's own state and must reach the planner's decision:
//! a divergence is a protocol error, never a silent repair. Hand-backs (detach, cancel)
//! apply after the plan's new operations, so each new operation is decided on the credits
//! the planner saw; their effects reach the scheduler with the next report.

use super::admission::backup_room;
use super::backup::{BackupCandidate, DropReason};
use super::effects::RoundEffects;
use super::intent::{BackendTrouble, StorageIntent, StorageReport, StorageView};
use super::manager::{RoundInput, StorageTransferManager};
use super::ClearKind;
use messages::{OperationId, ProtocolError, Rejection, StorageCancelOp, StorageOp};
use std::collections::BTreeMap;
use tracing::Span;

fn diverged(op: OperationId, what: String) -> ProtocolError {
    ProtocolError::new(
        op,
        format!("scheduler and storage transfer manager diverged: {what}"),
    )
}

impl StorageTransferManager {
    /// The planning state a scheduler plans against now.
    pub fn view(&self) -> StorageView {
        StorageView {
            cfg: self.config().clone(),
            gates: self.gates(),
            credits: self.credits().clone(),
            next_op: self.last_operation_id() + 1,
            next_serial: self.lease_serial + 1,
        }
    }

    /// Applies the agreed round (tick, cancellations, completions) and reports to the
    /// scheduler: this round's effects with those deferred from the last commit, the view,
    /// and the backup candidates up for dispatch.
    pub fn begin_round(&mut self, input: RoundInput) -> Result<StorageReport, ProtocolError> {
        let attached: Vec<_> = input
            .completions
            .iter()
            .filter_map(|d| self.attached_waiter(d.op).map(|r| (d.op, r)))
            .collect();
        let trouble = input
            .completions
            .iter()
            .filter_map(|d| {
                let why = match d.rejection {
                    Some(Rejection::Unhealthy) => BackendTrouble::Unhealthy,
                    Some(Rejection::Quarantined) => BackendTrouble::Quarantined,
                    None if d.error.is_some() => BackendTrouble::Unhealthy,
                    None if !d.retired => BackendTrouble::Quarantined,
                    _ => return None,
                };
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
        let fx = self.apply_round(input)?;
        for done in &traced {
            let was_attached = attached.iter().any(|(op, _)| *op == done.op);
            self.trace.agreed(done, was_attached, &fx);
        }
        let mut effects = std::mem::take(&mut self.deferred);
        effects.extend(fx);
        self.outbox.append(&mut effects.cancels);
        effects.forgotten.extend(self.backups.take_forgotten());
        let put_candidates = self.take_put_candidates();
        Ok(StorageReport {
            effects,
            trouble,
            view: self.view(),
            put_candidates,
        })
    }

    /// Candidates for this round's PUT dispatch, oldest first, up to what the backup
    /// credits could carry now; those covered by a pending PUT coalesce here.
    fn take_put_candidates(&mut self) -> Vec<BackupCandidate> {
        let mut out = vec![];
        if self.quarantined || self.gate_closed() || backup_room(&self.credits, &self.cfg) == 0 {
            return out;
        }
        let c = &self.credits;
        let ops = (c
            .backup_operation_max()
            .saturating_sub(c.backup_operations_used()))
        .min(c.operation_total().saturating_sub(c.operations_used())) as usize;
        let budget = (c.backup_hosts_available() as usize)
            .min(ops.saturating_mul(self.cfg.max_keys_per_operation as usize));
        while out.len() < budget {
            let Some(c) = self.backups.pop_front() else {
                break;
            };
            if self.pending_put_keys.contains_key(&c.key) {
                self.backups.note_coalesced(c.host); // covered by a pending PUT: not a loss
                continue;
            }
            out.push(c);
        }
        out
    }

    /// Commits the plan's storage intents: tickets, credits and the operations to submit,
    /// in plan order (cancellations of detached reads first).
    pub fn commit(&mut self, intents: Vec<StorageIntent>) -> Result<Vec<StorageOp>, ProtocolError> {
        let mut ops: Vec<StorageOp> = std::mem::take(&mut self.outbox)
            .into_iter()
            .map(StorageOp::Cancel)
            .collect();
        let mut parents: BTreeMap<OperationId, Span> = BTreeMap::new();
        let mut handbacks = vec![];
        for intent in intents {
            match intent {
                StorageIntent::Query {
                    request,
                    keys,
                    parent,
                    expect,
                } => match (self.issue_query(request, keys), expect) {
                    (Ok((q, lease)), Ok((op, serial))) if q.op == op && lease.serial == serial => {
                        drop(lease); // the scheduler's request state owns the planned lease
                        if let Some(p) = parent {
                            parents.insert(op, p);
                        }
                        ops.push(StorageOp::Query(q));
                    }
                    (Err(got), Err(want)) if got == want => {}
                    (got, want) => {
                        let got = got.map(|(q, l)| (q.op, l.serial));
                        return Err(diverged(
                            OperationId(self.last_operation_id()),
                            format!("QUERY for {request}: planned {want:?}, committed {got:?}"),
                        ));
                    }
                },
                StorageIntent::Get {
                    request,
                    keys,
                    destinations,
                    parent,
                    expect,
                } => match (self.issue_get(request, keys, destinations), expect) {
                    (Ok(g), Ok(op)) if g.op == op => {
                        if let Some(p) = parent {
                            parents.insert(op, p);
                        }
                        ops.push(StorageOp::Get(g));
                    }
                    (Err(got), Err(want)) if got == want => {}
                    (got, want) => {
                        let got = got.map(|g| g.op);
                        return Err(diverged(
                            OperationId(self.last_operation_id()),
                            format!("GET for {request}: planned {want:?}, committed {got:?}"),
                        ));
                    }
                },
                StorageIntent::Put {
                    keys,
                    refs,
                    ranges,
                    expect,
                } => match self.issue_put(keys, refs, ranges) {
                    Ok(p) if p.op == expect => ops.push(StorageOp::Put(p)),
                    got => {
                        return Err(diverged(
                            expect,
                            format!("PUT planned as {expect}, committed {:?}", got.map(|p| p.op)),
                        ))
                    }
                },
                StorageIntent::Unavailable(n) => {
                    self.backups.count_drop(DropReason::Unavailable, n);
                }
                StorageIntent::Coalesced(hosts) => {
                    for h in hosts {
                        self.backups.note_coalesced(h);
                    }
                }
                StorageIntent::Requeue(candidates) => self.backups.requeue_front(candidates),
                other @ (StorageIntent::Detach(_) | StorageIntent::Cancel(_)) => {
                    handbacks.push(other)
                }
            }
        }
        let mut fx = RoundEffects::default();
        for h in handbacks {
            match h {
                StorageIntent::Detach(lease) => fx.extend(self.detach(lease)),
                StorageIntent::Cancel(request) => fx.extend(self.cancel(request)),
                _ => {}
            }
        }
        ops.extend(fx.cancels.drain(..).map(StorageOp::Cancel));
        self.deferred.extend(fx);
        self.trace.issued(&ops, |op| parents.get(&op));
        Ok(ops)
    }

    /// Takes blocks that a D2H completion published in Host L2 as backup candidates
    /// (nonowning). Drops and coalescing reach the scheduler with the next report.
    pub fn offer_backups(&mut self, candidates: Vec<BackupCandidate>) {
        for c in candidates {
            let _ = self.offer_backup(c.key, c.host);
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
        effects.extend(fx);
        effects.forgotten.extend(self.backups.take_forgotten());
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
