//! The round's two storage hand-offs between the StorageTransferManager and the Scheduler,
//! one direction each (DESIGN.md §3):
//! - StorageReport, manager → scheduler, after the agreed round is applied: the effects
//!   (rows to publish, references to release, waits that ended, ...), the StorageView to
//!   plan against and the backup candidates up for PUT dispatch;
//! - StorageIntent, scheduler → manager: the storage half of the plan, in plan order, which
//!   the manager commits into tickets and operations for the L3 executor.
//!
//! The StoragePlanner is the scheduler's side: it decides every planning call with the
//! shared admission rules (`admission.rs`) on its copy of the credits and records the
//! decision in the intent; the manager's commit replays the call and must reach the same
//! decision (a divergence is a protocol error). Nothing here performs I/O or reads a clock.

use super::admission::{admit_get, admit_query, backup_room, Gates};
use super::backup::BackupCandidate;
use super::credits::{CreditClass, Credits};
use super::effects::RoundEffects;
use super::lease::StorageLease;
use super::manager::Refusal;
use super::HostRef;
use messages::settings::StorageConfig;
use messages::{HostRange, OperationId, RequestId, StorageKey};
use std::collections::{BTreeSet, VecDeque};
use tracing::Span;

/// The manager's planning state as of the start of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageView {
    pub cfg: StorageConfig,
    pub gates: Gates,
    pub credits: Credits,
    /// The OperationId the next issued operation takes.
    pub next_op: u64,
    /// The serial the next StorageLease takes.
    pub next_serial: u64,
}

impl StorageView {
    /// The view of a fresh manager (no operation issued yet).
    pub fn initial(cfg: StorageConfig) -> Self {
        Self {
            credits: Credits::new(&cfg),
            cfg,
            gates: Gates::default(),
            next_op: 1,
            next_serial: 1,
        }
    }
}

/// Why an attached read's request falls back because of its backend (not its data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendTrouble {
    /// Rejected as unhealthy, or failed with a backend exception.
    Unhealthy,
    /// Rejected after quarantine, or an unretired result.
    Quarantined,
}

/// Manager → scheduler, once per round, after the agreed round is applied.
#[derive(Debug)]
pub struct StorageReport {
    pub effects: RoundEffects,
    /// Requests whose attached read (as of before this round) met backend trouble.
    pub trouble: Vec<(RequestId, BackendTrouble)>,
    pub view: StorageView,
    /// Backup candidates taken from the queue for this round's PUT dispatch (the scheduler
    /// rechecks residency; those without credits go back with `StorageIntent::Requeue`).
    pub put_candidates: Vec<BackupCandidate>,
}

/// One planning decision of the scheduler, in plan order.
#[derive(Debug)]
pub enum StorageIntent {
    /// A QUERY for a request; `expect` is the planner's decision: the operation ID and the
    /// lease serial, or the refusal.
    Query {
        request: RequestId,
        keys: Vec<StorageKey>,
        parent: Option<Span>,
        expect: Result<(OperationId, u64), Refusal>,
    },
    /// A GET of an answered QUERY's keys into reserved, pinned Host destinations.
    Get {
        request: RequestId,
        keys: Vec<StorageKey>,
        destinations: Vec<(HostRef, HostRange)>,
        parent: Option<Span>,
        expect: Result<OperationId, Refusal>,
    },
    /// A create-only PUT of resident candidates; the scheduler took a source reference on
    /// each `refs[i]`, which the ticket owns until retirement.
    Put {
        keys: Vec<StorageKey>,
        refs: Vec<HostRef>,
        ranges: Vec<HostRange>,
        expect: OperationId,
    },
    /// Candidates found not resident at dispatch (dropped as unavailable).
    Unavailable(u64),
    /// Candidates whose key was already in the same PUT (not a loss): the manager counts
    /// them coalesced and reports them forgotten.
    Coalesced(Vec<HostRef>),
    /// Candidates that found no backup credits this round: back to the queue front.
    Requeue(Vec<BackupCandidate>),
    /// A state that owned a lease ended: the lease comes back.
    Detach(StorageLease),
    /// A request aborted: its wait (if any) is detached.
    Cancel(RequestId),
}

/// The scheduler's side of storage planning for one round.
#[derive(Debug)]
pub struct StoragePlanner {
    view: StorageView,
    candidates: VecDeque<BackupCandidate>,
    intents: Vec<StorageIntent>,
}

impl StoragePlanner {
    pub fn new(cfg: StorageConfig) -> Self {
        Self {
            view: StorageView::initial(cfg),
            candidates: VecDeque::new(),
            intents: Vec::new(),
        }
    }

    /// Starts a round's planning from the manager's report.
    pub fn begin(&mut self, view: StorageView, candidates: Vec<BackupCandidate>) {
        debug_assert!(self.intents.is_empty(), "the last plan was not taken");
        self.view = view;
        self.candidates = candidates.into();
    }

    /// Ends the round's planning: every intent in plan order. Candidates not dispatched go
    /// back to the queue front.
    pub fn take_intents(&mut self) -> Vec<StorageIntent> {
        if !self.candidates.is_empty() {
            let rest: Vec<BackupCandidate> = self.candidates.drain(..).collect();
            self.intents.push(StorageIntent::Requeue(rest));
        }
        std::mem::take(&mut self.intents)
    }

    pub fn config(&self) -> &StorageConfig {
        &self.view.cfg
    }
    pub fn credits(&self) -> &Credits {
        &self.view.credits
    }
    /// False after quarantine: no new QUERY/GET/PUT for this replica.
    pub fn l3_enabled(&self) -> bool {
        !self.view.gates.quarantined
    }
    pub fn gate_closed(&self) -> bool {
        self.view.gates.gate_closed
    }
    /// Host credits not in use (what a reservation may take).
    pub fn host_credits_left(&self) -> u32 {
        let c = &self.view.credits;
        c.host_total().saturating_sub(c.hosts_used())
    }

    fn next_op(&mut self) -> OperationId {
        let op = OperationId(self.view.next_op);
        self.view.next_op += 1;
        op
    }

    /// Plans a QUERY; its soft deadline starts at the commit's tick.
    pub fn issue_query(
        &mut self,
        request: RequestId,
        keys: Vec<StorageKey>,
        parent: Option<Span>,
    ) -> Result<(OperationId, StorageLease), Refusal> {
        let decided = admit_query(
            self.view.gates,
            &mut self.view.credits,
            &self.view.cfg,
            keys.len(),
        );
        let expect = decided.map(|()| {
            let op = self.next_op();
            let serial = self.view.next_serial;
            self.view.next_serial += 1;
            (op, serial)
        });
        self.intents.push(StorageIntent::Query {
            request,
            keys,
            parent,
            expect: expect.clone(),
        });
        expect.map(|(op, serial)| (op, StorageLease { request, serial }))
    }

    /// Plans a GET into destinations the caller reserved and pinned; on a refusal the
    /// destinations stay the caller's.
    pub fn issue_get(
        &mut self,
        request: RequestId,
        keys: Vec<StorageKey>,
        destinations: Vec<(HostRef, HostRange)>,
        parent: Option<Span>,
    ) -> Result<OperationId, Refusal> {
        let decided = admit_get(
            self.view.gates,
            &mut self.view.credits,
            &self.view.cfg,
            keys.len(),
            &destinations,
        );
        let expect = decided.map(|()| self.next_op());
        self.intents.push(StorageIntent::Get {
            request,
            keys,
            destinations,
            parent,
            expect: expect.clone(),
        });
        expect
    }

    /// Hands a lease back (the state that owned it ended).
    pub fn detach(&mut self, lease: StorageLease) {
        self.intents.push(StorageIntent::Detach(lease));
    }

    /// Detaches an aborted request's wait.
    pub fn cancel(&mut self, request: RequestId) {
        self.intents.push(StorageIntent::Cancel(request));
    }

    /// Dispatches create-only PUTs from this round's candidates within the backup credits.
    /// `residency(key, host)` rechecks the Host entry: `Some(range)` means it is resident
    /// and the caller took a source reference; `None` drops the candidate as unavailable.
    /// Returns the planned PUTs' operation IDs.
    pub fn dispatch_backups(
        &mut self,
        residency: &mut dyn FnMut(&StorageKey, HostRef) -> Option<HostRange>,
    ) -> Vec<OperationId> {
        let mut issued = vec![];
        let mut unavailable = 0u64;
        let mut coalesced = vec![];
        if self.view.gates.quarantined
            || self.view.gates.gate_closed
            || self.view.gates.backups_paused
        {
            return issued;
        }
        loop {
            let room = backup_room(&self.view.credits, &self.view.cfg);
            if room == 0 || self.candidates.is_empty() {
                break;
            }
            let (mut keys, mut refs, mut ranges) = (vec![], vec![], vec![]);
            let mut batch: BTreeSet<StorageKey> = BTreeSet::new();
            while keys.len() < room {
                let Some(c) = self.candidates.pop_front() else {
                    break;
                };
                if batch.contains(&c.key) {
                    coalesced.push(c.host); // the queue coalesces keys; kept for safety
                    continue;
                }
                match residency(&c.key, c.host) {
                    Some(range) => {
                        batch.insert(c.key.clone());
                        keys.push(c.key);
                        refs.push(c.host);
                        ranges.push(range);
                    }
                    None => unavailable += 1,
                }
            }
            if keys.is_empty() {
                break;
            }
            let charged = self
                .view
                .credits
                .charge(CreditClass::Backup, 1, keys.len() as u32);
            debug_assert!(charged, "room was computed from the backup credits");
            let op = self.next_op();
            issued.push(op);
            self.intents.push(StorageIntent::Put {
                keys,
                refs,
                ranges,
                expect: op,
            });
        }
        if unavailable > 0 {
            self.intents.push(StorageIntent::Unavailable(unavailable));
        }
        if !coalesced.is_empty() {
            self.intents.push(StorageIntent::Coalesced(coalesced));
        }
        issued
    }
}
