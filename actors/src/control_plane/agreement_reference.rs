//! The agreement as it was before the columnar records (format version 3), kept verbatim
//! for tests only: the columnar agreement must agree exactly what this one agrees and raise
//! exactly the errors it raises, for any reports.

use messages::{
    AgreedRound, ControlError, ObjectFailure, OperationId, PressureObservation, RoundReport,
    StorageDone, StorageOpKind,
};
use std::collections::{BTreeMap, BTreeSet};

use super::LEADER_RANK;

/// Operation IDs already agreed: a floor below which everything is agreed, plus the sparse
/// set above it. Bounded by the completion window, not by the number of rounds.
#[derive(Debug, Default)]
struct AgreedSet {
    floor: u64,
    above: BTreeSet<u64>,
}

impl AgreedSet {
    fn contains(&self, op: OperationId) -> bool {
        op.0 <= self.floor || self.above.contains(&op.0)
    }
    fn insert(&mut self, op: OperationId) {
        if op.0 <= self.floor {
            return;
        }
        if op.0 != self.floor + 1 {
            self.above.insert(op.0);
            return;
        }
        // The next operation in order (the common case): no set insert.
        self.floor += 1;
        while self.above.first() == Some(&(self.floor + 1)) {
            self.above.pop_first();
            self.floor += 1;
        }
    }
}

/// One operation's records so far, one slot per owner rank.
#[derive(Debug)]
struct PendingOp {
    kind: StorageOpKind,
    keys: usize,
    /// How many owners have reported.
    have: usize,
    records: Vec<Option<StorageDone>>,
}

/// The agreement state of one replica: identical on every rank.
#[derive(Debug)]
pub struct ReferenceAgreement {
    world: u32,
    last_round: Option<u64>,
    last_tick_us: Option<u64>,
    pending: BTreeMap<OperationId, PendingOp>,
    agreed: AgreedSet,
}

impl ReferenceAgreement {
    pub fn new(world: u32) -> Self {
        Self {
            world,
            last_round: None,
            last_tick_us: None,
            pending: BTreeMap::new(),
            agreed: AgreedSet::default(),
        }
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    /// Operations some but not all owners have reported (retained partial records).
    pub fn pending_operations(&self) -> Vec<OperationId> {
        self.pending.keys().copied().collect()
    }

    /// Agrees one round from every owner's report (in any order; one per rank). On error
    /// the state is unchanged and the caller must stop doing rounds.
    pub fn agree(&mut self, reports: Vec<RoundReport>) -> Result<AgreedRound, ControlError> {
        let world = self.world as usize;
        let mut by_rank: Vec<Option<RoundReport>> = (0..world).map(|_| None).collect();
        let count = reports.len();
        let mut misfit = None;
        for r in reports {
            match by_rank.get_mut(r.rank as usize) {
                Some(slot) if slot.is_none() => *slot = Some(r),
                Some(_) => {
                    misfit.get_or_insert(format!("two reports from rank {}", r.rank));
                }
                None => {
                    misfit.get_or_insert(format!("report from rank {} outside the world", r.rank));
                }
            }
        }
        let round = by_rank
            .iter()
            .flatten()
            .next()
            .map(|r| r.round)
            .unwrap_or(0);
        let fail = |message: String| ControlError::Protocol { round, message };
        if let Some(m) = misfit {
            return Err(fail(m));
        }
        if count != world || world == 0 {
            return Err(fail(format!("{count} reports for a world of {world}")));
        }
        let mut by_rank: Vec<RoundReport> = by_rank.into_iter().flatten().collect();
        if let Some(expected) = self.last_round.map(|r| r + 1) {
            if round != expected {
                return Err(fail(format!(
                    "round {round} follows round {}",
                    expected - 1
                )));
            }
        }
        for r in &by_rank {
            if r.round != round {
                return Err(fail(format!(
                    "rank {} reported round {} in round {round}",
                    r.rank, r.round
                )));
            }
        }
        // Report-level validity, in rank order so every rank raises the same error first.
        for r in &by_rank {
            if let Some(e) = &r.error {
                return Err(fail(format!(
                    "rank {} reported an invalid poll: {e}",
                    r.rank
                )));
            }
            if r.rank != LEADER_RANK && !r.frontend.is_empty() {
                return Err(fail(format!(
                    "rank {} is not the leader but carried frontend messages",
                    r.rank
                )));
            }
            for m in &r.frontend {
                if let messages::FrontendMessage::NewRequest { id, sampling, .. } = m {
                    if let Err(e) = sampling.validate() {
                        return Err(fail(format!(
                            "rank {} carried request {id:?} with invalid sampling: {e}",
                            r.rank
                        )));
                    }
                }
            }
        }
        // The admin preflight: every owner runs it in the same (agreed) round, so all or
        // none report it; the agreed result is Ok only when every owner's is.
        let preflights = by_rank
            .iter()
            .filter(|r| r.admin_preflight.is_some())
            .count();
        if preflights != 0 && preflights != by_rank.len() {
            let missing = by_rank
                .iter()
                .find(|r| r.admin_preflight.is_none())
                .map_or(0, |r| r.rank);
            return Err(fail(format!(
                "rank {missing} reported no admin preflight while another rank did"
            )));
        }
        let admin_preflight = (preflights != 0).then(|| {
            by_rank
                .iter()
                .find_map(|r| match &r.admin_preflight {
                    Some(Err(e)) => Some(Err(format!("rank {}: {e}", r.rank))),
                    _ => None,
                })
                .unwrap_or(Ok(()))
        });
        let tick_us = by_rank[LEADER_RANK as usize].clock_us;
        if let Some(prev) = self.last_tick_us {
            if tick_us < prev {
                return Err(fail(format!(
                    "leader clock moved backwards from {prev} to {tick_us} us"
                )));
            }
        }
        // Record-level validity against this round and the retained partial records, over
        // every record sorted by (operation, rank): one pass, no per-record map.
        let total: usize = by_rank.iter().map(|r| r.completions.len()).sum();
        let mut index: Vec<(OperationId, u32, u32)> = Vec::with_capacity(total);
        for (rank, r) in by_rank.iter().enumerate() {
            for (i, d) in r.completions.iter().enumerate() {
                index.push((d.op, rank as u32, i as u32));
            }
        }
        index.sort_unstable();
        let record = |rank: u32, i: u32| &by_rank[rank as usize].completions[i as usize];
        let mut group_start = 0;
        for (at, &(op, rank, i)) in index.iter().enumerate() {
            let d = record(rank, i);
            d.validate()
                .map_err(|e| fail(format!("rank {rank} sent an invalid record: {e}")))?;
            if self.agreed.contains(op) {
                return Err(fail(format!("rank {rank} sent {op} after it was agreed")));
            }
            if at == 0 || index[at - 1].0 != op {
                group_start = at;
            } else if index[at - 1].1 == rank {
                return Err(fail(format!("rank {rank} sent {op} twice")));
            }
            let (kind, keys) = match self.pending.get(&op) {
                Some(p) => {
                    if p.records[rank as usize].is_some() {
                        return Err(fail(format!("rank {rank} sent {op} twice")));
                    }
                    (p.kind, p.keys)
                }
                None => {
                    let (_, r0, i0) = index[group_start];
                    let first = record(r0, i0);
                    (first.kind, first.len())
                }
            };
            if d.kind != kind {
                return Err(fail(format!(
                    "rank {rank} reports {op} as {} but another owner as {}",
                    d.kind.as_str(),
                    kind.as_str()
                )));
            }
            if d.len() != keys {
                return Err(fail(format!(
                    "rank {rank} reports {} keys for {op} but another owner {keys}",
                    d.len()
                )));
            }
        }
        // Valid: apply.
        let pressure = by_rank
            .iter()
            .fold(PressureObservation::default(), |acc, r| acc.max(r.pressure));
        let frontend = std::mem::take(&mut by_rank[LEADER_RANK as usize].frontend);
        let mut digests: Vec<_> = by_rank
            .iter_mut()
            .flat_map(|r| std::mem::take(&mut r.digests))
            .collect();
        digests.sort();
        let mut slots: Vec<Vec<Option<StorageDone>>> = by_rank
            .into_iter()
            .map(|r| r.completions.into_iter().map(Some).collect())
            .collect();
        let mut take = |rank: u32, i: u32| slots[rank as usize][i as usize].take();
        // Groups in operation order: an operation every owner reported now is reduced at
        // once; one with retained records completes them; the rest is retained.
        let mut completions = Vec::new();
        let mut at = 0;
        while at < index.len() {
            let op = index[at].0;
            let end = index[at..]
                .iter()
                .position(|e| e.0 != op)
                .map_or(index.len(), |n| at + n);
            let group = &index[at..end];
            at = end;
            if let Some(p) = self.pending.get_mut(&op) {
                for &(_, rank, i) in group {
                    p.records[rank as usize] = take(rank, i);
                    p.have += 1;
                }
                if p.have == world {
                    if let Some(p) = self.pending.remove(&op) {
                        let records: Vec<StorageDone> = p.records.into_iter().flatten().collect();
                        completions.push(reduce_owned(op, p.kind, p.keys, records));
                        self.agreed.insert(op);
                    }
                }
            } else if group.len() == world {
                let records: Vec<StorageDone> =
                    group.iter().filter_map(|&(_, r, i)| take(r, i)).collect();
                // Validated above: every record of the group has the first one's kind and
                // key count.
                if let Some((kind, keys)) = records.first().map(|d| (d.kind, d.len())) {
                    completions.push(reduce_owned(op, kind, keys, records));
                    self.agreed.insert(op);
                }
            } else {
                let mut p = PendingOp {
                    kind: StorageOpKind::Query,
                    keys: 0,
                    have: 0,
                    records: (0..world).map(|_| None).collect(),
                };
                for &(_, rank, i) in group {
                    if let Some(d) = take(rank, i) {
                        p.kind = d.kind;
                        p.keys = d.len();
                        p.records[rank as usize] = Some(d);
                        p.have += 1;
                    }
                }
                self.pending.insert(op, p);
            }
        }
        self.last_round = Some(round);
        self.last_tick_us = Some(tick_us);
        Ok(AgreedRound {
            round,
            tick_us,
            pressure,
            frontend,
            completions,
            digests,
            admin_preflight,
        })
    }
}

/// `reduce` over owned records: the first record's vectors become the result's, so an
/// operation costs no allocation beyond its records'.
fn reduce_owned(
    op: OperationId,
    kind: StorageOpKind,
    keys: usize,
    records: Vec<StorageDone>,
) -> StorageDone {
    let mut records = records.into_iter();
    let Some(mut out) = records.next() else {
        let mut out = StorageDone::query(op, vec![true; keys], true);
        out.kind = kind;
        return out;
    };
    let mut errors = Vec::new();
    let mut rejections = Vec::new();
    if let Some(e) = out.error.take() {
        errors.push(format!("rank 0: {e}"));
    }
    if let Some(r) = out.rejection.take() {
        rejections.push((0usize, r));
    }
    out.op = op;
    out.kind = kind;
    out.success.resize(keys, false);
    out.bytes.resize(keys, 0);
    out.capacity.resize(keys, false);
    out.failures.resize(keys, None);
    let mut new_writes = u64::from(out.new_writes);
    let mut owners = 1;
    for (rank, d) in records.enumerate().map(|(i, d)| (i + 1, d)) {
        owners += 1;
        out.retired &= d.retired;
        for i in 0..keys {
            out.success[i] &= d.success[i];
            out.bytes[i] = out.bytes[i].saturating_add(d.bytes[i]);
            out.capacity[i] |= d.capacity[i];
            out.failures[i] = merge_failure(out.failures[i], d.failures[i]);
        }
        if let Some(e) = &d.error {
            errors.push(format!("rank {rank}: {e}"));
        }
        if let Some(r) = d.rejection {
            rejections.push((rank, r));
        }
        new_writes += u64::from(d.new_writes);
    }
    if rejections.len() == owners {
        out.rejection = rejections.first().map(|(_, r)| *r);
    } else {
        for (rank, r) in &rejections {
            errors.push(format!("rank {rank}: rejected ({})", r.as_str()));
        }
    }
    if !errors.is_empty() {
        out.error = Some(errors.join("; "));
    }
    // Metric only: each owner counts its own new rows; never more than the keys.
    out.new_writes = new_writes.min(keys as u64) as u32;
    out
}

/// OR-reduction of confirmed object failures: Invalid dominates Missing.
pub(super) fn merge_failure(
    a: Option<ObjectFailure>,
    b: Option<ObjectFailure>,
) -> Option<ObjectFailure> {
    match (a, b) {
        (Some(ObjectFailure::Invalid), _) | (_, Some(ObjectFailure::Invalid)) => {
            Some(ObjectFailure::Invalid)
        }
        (Some(ObjectFailure::Missing), _) | (_, Some(ObjectFailure::Missing)) => {
            Some(ObjectFailure::Missing)
        }
        _ => None,
    }
}
