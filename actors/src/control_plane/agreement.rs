//! Completion agreement: the pure reduction of one round's reports into an [`AgreedRound`]
//! (seed 000 "Completion agreement and ordering"). It owns the partial owner records
//! retained across rounds and the set of already agreed operations.
//!
//! Records arrive as columns ([`GatheredReport`]): each record is validated and folded as a
//! borrowed view (masks as 64-key words), every record of the round is visited once in
//! (operation, rank) order, and an operation's reduction allocates only its agreed record.
//!
//! It must never do I/O or read a clock: the tick is the leader's reported clock, and every
//! rank that feeds the same reports in the same order gets the same result or the same
//! protocol error.

use messages::{
    AgreedRound, CompletionColumns, ControlError, DoneView, GatheredReport, ObjectFailure,
    OperationId, PressureObservation, Rejection, RoundReport, StorageDone, StorageOpKind,
};
use std::collections::{BTreeMap, BTreeSet};

/// The rank whose clock becomes the tick and whose frontend messages ride the round.
pub const LEADER_RANK: u32 = 0;

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

/// The reduction of one operation's owner records so far (seed 000: success and retirement
/// AND, confirmed missing/invalid and capacity OR, bytes summed, rejection only when every
/// owner rejected), folded record by record from columnar views: masks as 64-key words,
/// errors and rejections tagged with their rank so the result does not depend on the order
/// records arrive in.
#[derive(Clone, Debug)]
struct Acc {
    kind: StorageOpKind,
    keys: usize,
    /// Which owners have reported (one slot per rank) and how many.
    have: Vec<bool>,
    owners: usize,
    success: Vec<u64>,
    missing: Vec<u64>,
    invalid: Vec<u64>,
    capacity: Vec<u64>,
    bytes: Vec<u64>,
    retired: bool,
    new_writes: u64,
    errors: Vec<(u32, String)>,
    rejections: Vec<(u32, Rejection)>,
}

impl Acc {
    fn new(kind: StorageOpKind, keys: usize, world: usize) -> Self {
        let mut a = Self {
            kind,
            keys,
            have: Vec::new(),
            owners: 0,
            success: Vec::new(),
            missing: Vec::new(),
            invalid: Vec::new(),
            capacity: Vec::new(),
            bytes: Vec::new(),
            retired: true,
            new_writes: 0,
            errors: Vec::new(),
            rejections: Vec::new(),
        };
        a.reset(kind, keys, world);
        a
    }

    /// The empty reduction (the identity of every fold), reusing the buffers.
    fn reset(&mut self, kind: StorageOpKind, keys: usize, world: usize) {
        let words = keys.div_ceil(64);
        self.kind = kind;
        self.keys = keys;
        self.have.clear();
        self.have.resize(world, false);
        self.owners = 0;
        for (m, fill) in [
            (&mut self.success, !0u64),
            (&mut self.missing, 0),
            (&mut self.invalid, 0),
            (&mut self.capacity, 0),
        ] {
            m.clear();
            m.resize(words, fill);
        }
        self.bytes.clear();
        self.bytes.resize(keys, 0);
        self.retired = true;
        self.new_writes = 0;
        self.errors.clear();
        self.rejections.clear();
    }

    /// Folds one owner's (validated, same kind and key count) record in.
    fn fold(&mut self, rank: u32, d: DoneView<'_>) {
        if let Some(h) = self.have.get_mut(rank as usize) {
            *h = true;
        }
        self.owners += 1;
        for (c, (((s, m), i), cap)) in self
            .success
            .iter_mut()
            .zip(&mut self.missing)
            .zip(&mut self.invalid)
            .zip(&mut self.capacity)
            .enumerate()
        {
            let [ds, dm, di, dc] = d.masks(c);
            *s &= ds;
            *m |= dm;
            *i |= di;
            *cap |= dc;
        }
        for (acc, b) in self.bytes.iter_mut().zip(d.bytes()) {
            *acc = acc.saturating_add(*b);
        }
        self.retired &= d.retired();
        self.new_writes += u64::from(d.new_writes());
        if let Some(e) = d.error() {
            self.errors.push((rank, e.to_string()));
        }
        if let Some(r) = d.rejection() {
            self.rejections.push((rank, r));
        }
    }

    fn has(&self, rank: u32) -> bool {
        self.have.get(rank as usize).copied().unwrap_or(false)
    }

    /// The agreed record: errors in rank order, then (unless every owner rejected) the
    /// rejections in rank order.
    fn finish(&mut self, op: OperationId) -> StorageDone {
        let n = self.keys;
        let bit = |m: &[u64], i: usize| m.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1);
        self.errors.sort_by_key(|(r, _)| *r);
        self.rejections.sort_by_key(|(r, _)| *r);
        let mut messages: Vec<String> = self
            .errors
            .iter()
            .map(|(r, e)| format!("rank {r}: {e}"))
            .collect();
        let mut rejection = None;
        if self.rejections.len() == self.owners {
            rejection = self.rejections.first().map(|(_, r)| *r);
        } else {
            for (rank, r) in &self.rejections {
                messages.push(format!("rank {rank}: rejected ({})", r.as_str()));
            }
        }
        StorageDone {
            op,
            kind: self.kind,
            success: (0..n).map(|i| bit(&self.success, i)).collect(),
            bytes: self.bytes.clone(),
            failures: (0..n)
                .map(|i| {
                    if bit(&self.invalid, i) {
                        Some(ObjectFailure::Invalid)
                    } else if bit(&self.missing, i) {
                        Some(ObjectFailure::Missing)
                    } else {
                        None
                    }
                })
                .collect(),
            capacity: (0..n).map(|i| bit(&self.capacity, i)).collect(),
            retired: self.retired,
            rejection,
            error: (!messages.is_empty()).then(|| messages.join("; ")),
            // Metric only: each owner counts its own new rows; never more than the keys.
            new_writes: self.new_writes.min(n as u64) as u32,
        }
    }
}

/// One record of the round: (operation, rank, index in that rank's columns).
type Entry = (u64, u32, u32);

/// The agreement state of one replica: identical on every rank.
#[derive(Debug)]
pub struct Agreement {
    world: u32,
    last_round: Option<u64>,
    last_tick_us: Option<u64>,
    /// Operations some but not all owners have reported: their reduction so far.
    pending: BTreeMap<OperationId, Acc>,
    agreed: AgreedSet,
    /// Reused every round: the round's records in (operation, rank) order.
    index: Vec<Entry>,
    /// Reused for every operation every owner reports in one round.
    scratch: Acc,
    /// Rounds with records agreed column by column (tests check both paths are taken).
    #[cfg(test)]
    aligned_rounds: usize,
}

impl Agreement {
    pub fn new(world: u32) -> Self {
        Self {
            world,
            last_round: None,
            last_tick_us: None,
            pending: BTreeMap::new(),
            agreed: AgreedSet::default(),
            index: Vec::new(),
            scratch: Acc::new(StorageOpKind::Query, 0, world as usize),
            #[cfg(test)]
            aligned_rounds: 0,
        }
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    /// Operations some but not all owners have reported (retained partial records).
    pub fn pending_operations(&self) -> Vec<OperationId> {
        self.pending.keys().copied().collect()
    }

    /// Agrees one round from every owner's report of owned records (in any order; one per
    /// rank): the same agreement as [`Self::agree_gathered`] over their columns. On error
    /// the state is unchanged and the caller must stop doing rounds.
    pub fn agree(&mut self, reports: Vec<RoundReport>) -> Result<AgreedRound, ControlError> {
        // A record whose per-key masks differ in length has no columnar form (it can never
        // cross the mesh): it is left out of the columns and its validation error raised
        // where the record-level checks reach it in (operation, rank, index) order.
        let mut unencodable: Option<Unencodable> = None;
        let gathered = reports
            .into_iter()
            .map(|mut r| {
                let rank = r.rank;
                if !r.completions.iter().all(equal_lengths) {
                    let mut kept = Vec::with_capacity(r.completions.len());
                    for (i, d) in r.completions.iter().enumerate() {
                        if equal_lengths(d) {
                            kept.push(i as u32);
                            continue;
                        }
                        let at = (d.op.0, rank, i as u32);
                        if unencodable.as_ref().is_none_or(|u| at < u.at) {
                            let e = d.validate().err().map(|e| e.to_string());
                            unencodable = Some(Unencodable {
                                at,
                                kept: Vec::new(),
                                message: format!(
                                    "rank {rank} sent an invalid record: {}",
                                    e.unwrap_or_default()
                                ),
                            });
                        }
                    }
                    if let Some(u) = unencodable.as_mut().filter(|u| u.at.1 == rank) {
                        u.kept = kept;
                    }
                    r.completions.retain(equal_lengths);
                }
                let columns = CompletionColumns::from_records(&r.completions);
                r.completions = Vec::new();
                match columns {
                    Ok(c) => GatheredReport::from_parts(r, c),
                    // Only a report of over 2^32 keys: an invalid poll.
                    Err(e) => {
                        r.error.get_or_insert(e.to_string());
                        GatheredReport::from_parts(r, CompletionColumns::default())
                    }
                }
            })
            .collect();
        self.agree_inner(gathered, unencodable)
    }

    /// Agrees one round from every owner's gathered report (in any order; one per rank).
    /// On error the state is unchanged and the caller must stop doing rounds.
    pub fn agree_gathered(
        &mut self,
        reports: Vec<GatheredReport>,
    ) -> Result<AgreedRound, ControlError> {
        self.agree_inner(reports, None)
    }

    fn agree_inner(
        &mut self,
        reports: Vec<GatheredReport>,
        unencodable: Option<Unencodable>,
    ) -> Result<AgreedRound, ControlError> {
        let world = self.world as usize;
        let mut by_rank: Vec<Option<GatheredReport>> = (0..world).map(|_| None).collect();
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
        let mut by_rank: Vec<GatheredReport> = by_rank.into_iter().flatten().collect();
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
        let fast = unencodable
            .is_none()
            .then(|| self.agree_aligned(&by_rank))
            .flatten();
        let completions = match fast {
            Some(completions) => completions,
            None => self.agree_records(&by_rank, unencodable, &fail)?,
        };
        let pressure = by_rank
            .iter()
            .fold(PressureObservation::default(), |acc, r| acc.max(r.pressure));
        let frontend = std::mem::take(&mut by_rank[LEADER_RANK as usize].frontend);
        let mut digests: Vec<_> = by_rank
            .iter_mut()
            .flat_map(|r| std::mem::take(&mut r.digests))
            .collect();
        digests.sort();
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

    /// The record-by-record agreement of a round `agree_aligned` does not reduce: every
    /// record in (operation, rank) order (each report's records are one run, sorted when
    /// its owner sealed it, and the stable sort merges the runs in O(records x log ranks);
    /// no per-record allocation or map), checked, then applied. On error nothing is
    /// applied.
    fn agree_records(
        &mut self,
        by_rank: &[GatheredReport],
        unencodable: Option<Unencodable>,
        fail: &dyn Fn(String) -> ControlError,
    ) -> Result<Vec<StorageDone>, ControlError> {
        let world = by_rank.len();
        let mut index = std::mem::take(&mut self.index);
        index.clear();
        let first = by_rank[0].completions.op_ids();
        if first.windows(2).all(|w| w[0] < w[1])
            && by_rank.iter().all(|r| r.completions.op_ids() == first)
        {
            // Every owner reported the same operations (the common case): already in order.
            for (i, &op) in first.iter().enumerate() {
                index.extend((0..world as u32).map(|rank| (op, rank, i as u32)));
            }
        } else {
            for (rank, r) in by_rank.iter().enumerate() {
                let ops = r.completions.op_ids();
                index.extend(
                    ops.iter()
                        .enumerate()
                        .map(|(i, &op)| (op, rank as u32, i as u32)),
                );
            }
            index.sort();
        }
        let checked = self.check_records(by_rank, &index, unencodable, fail);
        if let Err(e) = checked {
            self.index = index;
            return Err(e);
        }
        let completions = self.apply_records(by_rank, &index);
        self.index = index;
        Ok(completions)
    }

    /// The round in which every owner reported the same new operations, in increasing
    /// order, with the same kinds and key counts, every record valid and none retained or
    /// agreed before (the steady state): reduced column by column, one pass per rank over
    /// its report (masks word by word, bytes key by key). None (nothing changed) for any
    /// other round, which the record-by-record path agrees.
    fn agree_aligned(&mut self, by_rank: &[GatheredReport]) -> Option<Vec<StorageDone>> {
        let world = by_rank.len();
        let first = &by_rank.first()?.completions;
        let ops = first.op_ids();
        let (lo, hi) = (*ops.first()?, *ops.last()?);
        let same_kinds = |c: &CompletionColumns| {
            c.kinds_and_flags()
                .iter()
                .zip(first.kinds_and_flags())
                .all(|(a, b)| a & 0b11 == b & 0b11)
        };
        if !ops.windows(2).all(|w| w[0] < w[1])
            || !by_rank.iter().all(|r| {
                let c = &r.completions;
                c.op_ids() == ops && c.key_ends() == first.key_ends() && same_kinds(c)
            })
            || self
                .pending
                .range(OperationId(lo)..=OperationId(hi))
                .next()
                .is_some()
            || ops.iter().any(|&op| self.agreed.contains(OperationId(op)))
            || !by_rank.iter().all(|r| r.completions.all_valid())
        {
            return None;
        }
        let [s0, m0, i0, c0] = first.mask_words();
        let (mut success, mut missing, mut invalid, mut capacity) =
            (s0.to_vec(), m0.to_vec(), i0.to_vec(), c0.to_vec());
        let mut bytes = first.all_bytes().to_vec();
        let mut retired = vec![true; ops.len()];
        let mut new_writes = vec![0u64; ops.len()];
        // Errors and rejections, (record, rank) tagged, in rank order.
        let mut notes: Vec<(u32, u32, Option<&str>, Option<Rejection>)> = Vec::new();
        for (rank, r) in by_rank.iter().enumerate() {
            let c = &r.completions;
            if rank > 0 {
                let [s, m, i, cap] = c.mask_words();
                success.iter_mut().zip(s).for_each(|(a, b)| *a &= b);
                missing.iter_mut().zip(m).for_each(|(a, b)| *a |= b);
                invalid.iter_mut().zip(i).for_each(|(a, b)| *a |= b);
                capacity.iter_mut().zip(cap).for_each(|(a, b)| *a |= b);
                bytes
                    .iter_mut()
                    .zip(c.all_bytes())
                    .for_each(|(a, b)| *a = a.saturating_add(*b));
            }
            for (g, d) in c.iter().enumerate() {
                retired[g] &= d.retired();
                new_writes[g] += u64::from(d.new_writes());
                let (e, rej) = (d.error(), d.rejection());
                if e.is_some() || rej.is_some() {
                    notes.push((g as u32, rank as u32, e, rej));
                }
            }
        }
        notes.sort_by_key(|n| (n.0, n.1));
        let bit = |m: &[u64], k: usize| m.get(k / 64).is_some_and(|w| w >> (k % 64) & 1 == 1);
        let mut out = Vec::with_capacity(ops.len());
        let mut note = 0;
        let mut start = 0usize;
        for (g, (&op, &end)) in ops.iter().zip(first.key_ends()).enumerate() {
            let (s, end) = (start, end as usize);
            start = end;
            let n = end - s;
            let kind = first.get(g).map_or(StorageOpKind::Query, |d| d.kind());
            let mut error = None;
            let mut rejection = None;
            let here = note;
            while notes.get(note).is_some_and(|x| x.0 as usize == g) {
                note += 1;
            }
            if note > here {
                let mine = &notes[here..note];
                let mut messages: Vec<String> = mine
                    .iter()
                    .filter_map(|(_, r, e, _)| e.map(|e| format!("rank {r}: {e}")))
                    .collect();
                let rejected = mine.iter().filter(|x| x.3.is_some()).count();
                if rejected == world {
                    rejection = mine.iter().find_map(|x| x.3);
                } else {
                    for (_, rank, _, r) in mine {
                        if let Some(r) = r {
                            messages.push(format!("rank {rank}: rejected ({})", r.as_str()));
                        }
                    }
                }
                error = (!messages.is_empty()).then(|| messages.join("; "));
            }
            out.push(StorageDone {
                op: OperationId(op),
                kind,
                success: (s..end).map(|k| bit(&success, k)).collect(),
                bytes: bytes.get(s..end).map_or_else(Vec::new, <[u64]>::to_vec),
                failures: (s..end)
                    .map(|k| {
                        if bit(&invalid, k) {
                            Some(ObjectFailure::Invalid)
                        } else if bit(&missing, k) {
                            Some(ObjectFailure::Missing)
                        } else {
                            None
                        }
                    })
                    .collect(),
                capacity: (s..end).map(|k| bit(&capacity, k)).collect(),
                retired: retired[g],
                rejection,
                error,
                new_writes: new_writes[g].min(n as u64) as u32,
            });
            self.agreed.insert(OperationId(op));
        }
        #[cfg(test)]
        {
            self.aligned_rounds += 1;
        }
        Some(out)
    }

    /// Record-level validity against this round and the retained partial records, in
    /// (operation, rank) order so every rank raises the same error first.
    fn check_records(
        &self,
        by_rank: &[GatheredReport],
        index: &[Entry],
        mut unencodable: Option<Unencodable>,
        fail: &dyn Fn(String) -> ControlError,
    ) -> Result<(), ControlError> {
        let view = |rank: u32, i: u32| {
            by_rank
                .get(rank as usize)
                .and_then(|r| r.completions.get(i as usize))
        };
        let mut at = 0;
        while at < index.len() {
            let op = index[at].0;
            let end = index[at..]
                .iter()
                .position(|e| e.0 != op)
                .map_or(index.len(), |n| at + n);
            let group = &index[at..end];
            at = end;
            let pending = self.pending.get(&OperationId(op));
            let (kind, keys) = match (pending, view(group[0].1, group[0].2)) {
                (Some(p), _) => (p.kind, p.keys),
                (None, Some(first)) => (first.kind(), first.len()),
                (None, None) => continue,
            };
            let op = OperationId(op);
            for (k, &(_, rank, i)) in group.iter().enumerate() {
                if unencodable
                    .as_ref()
                    .is_some_and(|u| u.reached(op.0, rank, i))
                {
                    if let Some(u) = unencodable.take() {
                        return Err(fail(u.message));
                    }
                }
                let Some(d) = view(rank, i) else { continue };
                d.validate()
                    .map_err(|e| fail(format!("rank {rank} sent an invalid record: {e}")))?;
                if self.agreed.contains(op) {
                    return Err(fail(format!("rank {rank} sent {op} after it was agreed")));
                }
                if k > 0 && group[k - 1].1 == rank {
                    return Err(fail(format!("rank {rank} sent {op} twice")));
                }
                if pending.is_some_and(|p| p.has(rank)) {
                    return Err(fail(format!("rank {rank} sent {op} twice")));
                }
                if d.kind() != kind {
                    return Err(fail(format!(
                        "rank {rank} reports {op} as {} but another owner as {}",
                        d.kind().as_str(),
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
        }
        match unencodable {
            Some(u) => Err(fail(u.message)),
            None => Ok(()),
        }
    }

    /// Groups in operation order: an operation every owner reported now is reduced at
    /// once; one with retained records completes them; the rest is retained.
    fn apply_records(&mut self, by_rank: &[GatheredReport], index: &[Entry]) -> Vec<StorageDone> {
        let world = self.world as usize;
        let view = |rank: u32, i: u32| {
            by_rank
                .get(rank as usize)
                .and_then(|r| r.completions.get(i as usize))
        };
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
            let op = OperationId(op);
            if let Some(p) = self.pending.get_mut(&op) {
                for &(_, rank, i) in group {
                    if let Some(d) = view(rank, i) {
                        p.fold(rank, d);
                    }
                }
                if p.owners == world {
                    if let Some(mut p) = self.pending.remove(&op) {
                        completions.push(p.finish(op));
                        self.agreed.insert(op);
                    }
                }
                continue;
            }
            let Some(first) = view(group[0].1, group[0].2) else {
                continue;
            };
            // Validated above: every record of the group has the first one's kind and key
            // count.
            let acc = if group.len() == world {
                &mut self.scratch
            } else {
                self.pending
                    .entry(op)
                    .or_insert_with(|| Acc::new(first.kind(), first.len(), world))
            };
            acc.reset(first.kind(), first.len(), world);
            for &(_, rank, i) in group {
                if let Some(d) = view(rank, i) {
                    acc.fold(rank, d);
                }
            }
            if group.len() == world {
                completions.push(self.scratch.finish(op));
                self.agreed.insert(op);
            }
        }
        completions
    }
}

/// The first record (in (operation, rank, index) order) of [`Agreement::agree`]'s reports
/// that has no columnar form, and its error.
#[derive(Debug)]
struct Unencodable {
    /// Operation, rank and index in that rank's report.
    at: (u64, u32, u32),
    /// The report indices of that rank's records that are in its columns.
    kept: Vec<u32>,
    message: String,
}

impl Unencodable {
    /// Whether the checks, at column record `i` of `rank` for `op`, have reached it.
    fn reached(&self, op: u64, rank: u32, i: u32) -> bool {
        let index = if rank == self.at.1 {
            self.kept.get(i as usize).copied().unwrap_or(u32::MAX)
        } else {
            i
        };
        (op, rank, index) > self.at
    }
}

fn equal_lengths(d: &StorageDone) -> bool {
    let n = d.success.len();
    d.bytes.len() == n && d.failures.len() == n && d.capacity.len() == n
}

/// Reduces one operation's owner records (rank order, all valid, equal key counts):
/// success and retirement AND, confirmed missing/invalid and capacity OR, bytes summed
/// (each owner copies only its own rows), rejection only when every owner rejected.
/// Records whose per-key masks differ in length (never valid) reduce to an unretired
/// failure naming the first such record.
pub fn reduce(
    op: OperationId,
    kind: StorageOpKind,
    keys: usize,
    records: &[StorageDone],
) -> StorageDone {
    let columns = match CompletionColumns::from_records(records) {
        Ok(c) => c,
        Err(e) => return StorageDone::failed(op, kind, keys, false, e.to_string()),
    };
    let mut acc = Acc::new(kind, keys, records.len());
    for (rank, d) in columns.iter().enumerate() {
        acc.fold(rank as u32, d);
    }
    acc.finish(op)
}

/// Validates this owner's local records before the exchange, inside the same error
/// boundary: an invalid record turns the report into an error report (its records are not
/// sent) so that every owner raises the same protocol error. A valid report's records are
/// put in operation order (the order agreement visits them in).
pub fn seal_local_report(mut report: RoundReport) -> RoundReport {
    if report.error.is_some() {
        report.completions.clear();
        return report;
    }
    let sorted = report.completions.windows(2).all(|w| w[0].op < w[1].op);
    let mut seen = BTreeSet::new();
    for d in &report.completions {
        if let Err(e) = d.validate() {
            report.error = Some(e.to_string());
            break;
        }
        // Strictly increasing operations cannot repeat one: no set needed.
        if !sorted && !seen.insert(d.op) {
            report.error = Some(format!("{} appears twice in one poll", d.op));
            break;
        }
    }
    if report.error.is_some() {
        report.completions.clear();
    } else if !sorted {
        report.completions.sort_by_key(|d| d.op);
    }
    report
}

/// [`seal_local_report`], then the sealed report in the columns it is sent and agreed in.
pub fn seal_gathered(report: RoundReport) -> GatheredReport {
    let mut sealed = seal_local_report(report);
    let columns = CompletionColumns::from_records(&sealed.completions);
    sealed.completions = Vec::new();
    match columns {
        Ok(c) => GatheredReport::from_parts(sealed, c),
        // Sealed records have equal mask lengths: only a report of over 2^32 keys.
        Err(e) => {
            sealed.error = Some(e.to_string());
            GatheredReport::from_parts(sealed, CompletionColumns::default())
        }
    }
}

/// The agreement before the columnar records, for the equivalence tests.
#[cfg(test)]
#[path = "agreement_reference.rs"]
#[allow(dead_code)]
mod reference;
#[cfg(test)]
use reference::merge_failure;

#[cfg(test)]
mod tests {
    use super::*;

    /// The reduction as the contract states it, record by record from an all-true start:
    /// the reference `reduce` must equal.
    fn reference_reduce(
        op: OperationId,
        kind: StorageOpKind,
        keys: usize,
        records: &[StorageDone],
    ) -> StorageDone {
        let mut out = StorageDone::query(op, vec![true; keys], true);
        out.kind = kind;
        let mut errors = Vec::new();
        let mut new_writes: u64 = 0;
        for (rank, d) in records.iter().enumerate() {
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
            new_writes += u64::from(d.new_writes);
        }
        let rejections: Vec<Rejection> = records.iter().filter_map(|d| d.rejection).collect();
        if !records.is_empty() && rejections.len() == records.len() {
            out.rejection = rejections.first().copied();
        } else {
            for (rank, d) in records.iter().enumerate() {
                if let Some(r) = d.rejection {
                    errors.push(format!("rank {rank}: rejected ({})", r.as_str()));
                }
            }
        }
        if !errors.is_empty() {
            out.error = Some(errors.join("; "));
        }
        out.new_writes = new_writes.min(keys as u64) as u32;
        out
    }

    proptest::proptest! {
        #[test]
        fn reduce_equals_the_record_by_record_reduction(
            world in 1usize..5,
            keys in 0usize..6,
            seed in proptest::collection::vec(proptest::num::u64::ANY, 20),
        ) {
            let mut x = seed.iter().copied().cycle();
            let mut next = move || x.next().unwrap_or(0);
            let records: Vec<StorageDone> = (0..world)
                .map(|_| {
                    let mut d = StorageDone::get(
                        OperationId(7),
                        (0..keys).map(|_| next() % 3 != 0).collect(),
                        (0..keys).map(|_| next() % 100).collect(),
                        (0..keys)
                            .map(|_| match next() % 4 {
                                0 => Some(ObjectFailure::Missing),
                                1 => Some(ObjectFailure::Invalid),
                                _ => None,
                            })
                            .collect(),
                        next() % 4 != 0,
                    );
                    d.capacity = (0..keys).map(|_| next() % 5 == 0).collect();
                    d.rejection = (next() % 3 == 0).then_some(Rejection::Shutdown);
                    d.error = (next() % 4 == 0).then(|| format!("e{}", next() % 9));
                    d.new_writes = (next() % 3) as u32;
                    d
                })
                .collect();
            let want = reference_reduce(OperationId(7), StorageOpKind::Get, keys, &records);
            proptest::prop_assert_eq!(reduce(OperationId(7), StorageOpKind::Get, keys, &records), want);
        }
    }

    #[test]
    fn the_agreed_set_compacts_into_its_floor() {
        let mut s = AgreedSet::default();
        for n in [3u64, 1, 5, 2] {
            s.insert(OperationId(n));
        }
        assert_eq!(s.floor, 3);
        assert_eq!(s.above.iter().copied().collect::<Vec<_>>(), vec![5]);
        assert!(s.contains(OperationId(2)) && s.contains(OperationId(5)));
        assert!(!s.contains(OperationId(4)));
        s.insert(OperationId(4));
        assert_eq!(s.floor, 5);
        assert!(s.above.is_empty());
    }

    #[test]
    fn the_admin_preflight_is_agreed_only_when_every_owner_succeeded() {
        let with = |rank, p: Option<Result<(), String>>| {
            let mut r = RoundReport::idle(rank, 0, 1);
            r.admin_preflight = p;
            r
        };
        let mut ag = Agreement::new(3);
        let all_ok = ag
            .agree((0..3).map(|r| with(r, Some(Ok(())))).collect())
            .unwrap();
        assert_eq!(all_ok.admin_preflight, Some(Ok(())));
        let mut ag = Agreement::new(3);
        let one_failed = ag
            .agree(vec![
                with(0, Some(Ok(()))),
                with(1, Some(Err("store unreachable".into()))),
                with(2, Some(Ok(()))),
            ])
            .unwrap();
        assert_eq!(
            one_failed.admin_preflight,
            Some(Err("rank 1: store unreachable".into())),
            "one failed deletion refuses the clear on every rank"
        );
        let mut ag = Agreement::new(3);
        let none = ag.agree((0..3).map(|r| with(r, None)).collect()).unwrap();
        assert_eq!(none.admin_preflight, None);
        let mut ag = Agreement::new(3);
        let e = ag
            .agree(vec![
                with(0, Some(Ok(()))),
                with(1, None),
                with(2, Some(Ok(()))),
            ])
            .unwrap_err();
        assert!(
            e.to_string().contains("rank 1 reported no admin preflight"),
            "{e}"
        );
    }

    #[test]
    fn a_protocol_error_leaves_the_state_unchanged() {
        let mut ag = Agreement::new(2);
        let q = |n| StorageDone::query(OperationId(n), vec![true], true);
        let mut r0 = RoundReport::idle(0, 0, 1);
        r0.completions = vec![q(1)];
        let mut r1 = RoundReport::idle(1, 0, 1);
        r1.completions = vec![q(2), q(2)];
        assert!(ag.agree(vec![r0.clone(), r1]).is_err());
        assert!(ag.pending_operations().is_empty());
        assert_eq!(ag.last_round, None);
        assert!(
            Agreement::new(0).agree(vec![]).is_err(),
            "an empty world never agrees"
        );
    }
}

#[cfg(test)]
mod equivalence {
    use super::reference::ReferenceAgreement;
    use super::*;
    use messages::{FrontendMessage, RequestId};

    /// A small deterministic generator (xorshift), so one proptest seed draws a scenario.
    struct Gen(u64);
    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn one_in(&mut self, n: u64) -> bool {
            self.next().is_multiple_of(n)
        }
    }

    /// A record of `op`: mostly valid and consistent with the other owners' (kind and key
    /// count follow the operation), sometimes not, in every way the checks look at.
    fn record(g: &mut Gen, op: u64, steady: bool) -> StorageDone {
        let kind = if !steady && g.one_in(12) {
            StorageOpKind::ALL[(g.next() % 3) as usize]
        } else {
            StorageOpKind::ALL[(op % 3) as usize]
        };
        let keys = if !steady && g.one_in(12) {
            (g.next() % 5) as usize
        } else {
            [1usize, 3, 0, 70, 2][(op % 5) as usize]
        };
        // Whether this record may break a validity rule: always off the steady state, one
        // in eight on it (a steady round is otherwise all valid, so the column path sees
        // every kind with its keys, not only the records no rule can catch).
        let faults = !steady || g.one_in(8);
        let mut d = StorageDone::query(OperationId(op), vec![false; keys], !g.one_in(6));
        d.kind = kind;
        for i in 0..keys {
            match g.next() % 5 {
                0 | 1 => d.success[i] = true,
                2 if kind == StorageOpKind::Get || (faults && g.one_in(10)) => {
                    d.failures[i] = Some(if g.one_in(2) {
                        ObjectFailure::Missing
                    } else {
                        ObjectFailure::Invalid
                    })
                }
                3 if kind == StorageOpKind::Put || (faults && g.one_in(10)) => d.capacity[i] = true,
                _ => {}
            }
            if faults && d.success[i] && g.one_in(40) {
                d.failures[i] = Some(ObjectFailure::Missing);
            }
            if kind != StorageOpKind::Query || (faults && g.one_in(40)) {
                d.bytes[i] = [0, 4096, u64::MAX - 1][(g.next() % 3) as usize];
            }
        }
        if g.one_in(5) {
            d.rejection = Some(Rejection::QueueFull);
            if !faults || !g.one_in(10) {
                d.retired = true;
                d.success.iter_mut().for_each(|s| *s = false);
                d.failures.iter_mut().for_each(|f| *f = None);
            }
        }
        if g.one_in(4) {
            d.error = Some(format!("e{}", g.next() % 3));
        }
        if kind == StorageOpKind::Put || (faults && g.one_in(30)) {
            let past = u64::from(faults);
            d.new_writes = (g.next() % (keys as u64 + 1 + past)) as u32;
        }
        if !steady && g.one_in(60) {
            d.bytes.push(1); // no columnar form
        }
        d
    }

    fn scenario(seed: u64, world: u32, rounds: u64) -> Vec<Vec<RoundReport>> {
        let mut g = Gen(seed | 1);
        let mut next_op = 1u64;
        (0..rounds)
            .map(|round| {
                let fresh = g.next() % 4;
                let ops: Vec<u64> = (next_op..next_op + fresh).collect();
                next_op += fresh;
                // The steady state: every owner reports the same new operations, in order.
                let steady = g.one_in(2);
                let mut reports: Vec<RoundReport> = (0..world)
                    .map(|rank| {
                        let mut r = RoundReport::idle(rank, round, 10 * round + 5);
                        if steady {
                            r.completions =
                                ops.iter().map(|&op| record(&mut g, op, true)).collect();
                            return r;
                        }
                        for &op in &ops {
                            if !g.one_in(3) {
                                r.completions.push(record(&mut g, op, false));
                            }
                        }
                        // A late owner of an earlier operation, or a repeat.
                        if next_op > 1 && g.one_in(3) {
                            let op = 1 + g.next() % next_op.saturating_sub(1).max(1);
                            r.completions.push(record(&mut g, op, false));
                        }
                        if g.one_in(2) {
                            r.completions.reverse();
                        }
                        if g.one_in(80) {
                            r.error = Some("bad poll".into());
                        }
                        if g.one_in(80) {
                            r.frontend
                                .push(FrontendMessage::Cancel { id: RequestId(1) });
                        }
                        r.pressure.queued_jobs = g.next() % 9;
                        r
                    })
                    .collect();
                if g.one_in(100) {
                    reports[0].round += 1;
                }
                if g.one_in(2) {
                    reports.reverse();
                }
                reports
            })
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]
        /// For any reports, round after round: the columnar agreement (fed records, and fed
        /// the columns decoded from the wire) agrees exactly what the agreement before it
        /// agreed, raises exactly its errors and retains the same partial records.
        #[test]
        fn the_columnar_agreement_is_the_record_agreement(
            seed in proptest::num::u64::ANY,
            world in 1u32..5,
            rounds in 1u64..8,
        ) {
            let mut old = ReferenceAgreement::new(world);
            let mut new = Agreement::new(world);
            let mut wire = Agreement::new(world);
            let mut wire_ok = true;
            for reports in scenario(seed, world, rounds) {
                let want = old.agree(reports.clone());
                let encodable = reports
                    .iter()
                    .all(|r| GatheredReport::try_from_report(r.clone()).is_ok());
                if encodable && wire_ok {
                    let gathered: Vec<GatheredReport> = reports
                        .iter()
                        .map(|r| {
                            let bytes = messages::encode(r).map_err(|e| e.to_string())?;
                            messages::decode(&bytes).map_err(|e| e.to_string())
                        })
                        .collect::<Result<_, String>>()
                        .map_err(proptest::test_runner::TestCaseError::fail)?;
                    proptest::prop_assert_eq!(&wire.agree_gathered(gathered), &want);
                } else {
                    wire_ok = false;
                }
                let got = new.agree(reports);
                proptest::prop_assert_eq!(&got, &want);
                proptest::prop_assert_eq!(new.pending_operations(), old.pending_operations());
                if want.is_err() {
                    break;
                }
            }
        }
    }

    /// Records with no columnar form (per-key masks of unequal length) from two ranks, the
    /// later rank's at the lower operation: the error names the first in operation order,
    /// as the record agreement does, whichever rank gathered first.
    #[test]
    fn the_first_unencodable_record_in_operation_order_is_the_one_named() {
        let q = |n| StorageDone::query(OperationId(n), vec![true], true);
        let unequal = |n| {
            let mut d = q(n);
            d.bytes.push(1);
            d
        };
        for ranks in [[0u32, 1], [1, 0]] {
            let reports: Vec<RoundReport> = ranks
                .iter()
                .map(|&rank| {
                    let mut r = RoundReport::idle(rank, 0, 1);
                    r.completions = if rank == 0 {
                        vec![q(1), unequal(5)]
                    } else {
                        vec![unequal(3), q(1)]
                    };
                    r
                })
                .collect();
            let want = ReferenceAgreement::new(2).agree(reports.clone());
            let got = Agreement::new(2).agree(reports);
            assert_eq!(got, want);
            let e = got.unwrap_err().to_string();
            assert!(
                e.contains("rank 1 sent an invalid record: protocol error on op3"),
                "{e}"
            );
        }
    }

    /// An invalid record ahead of an unencodable one of the same rank and operation is
    /// the first fault (report order within a rank), so its error is the one named.
    #[test]
    fn an_invalid_record_before_an_unencodable_one_of_its_rank_is_named_first() {
        let mut invalid = StorageDone::query(OperationId(3), vec![false], true);
        invalid.failures[0] = Some(ObjectFailure::Missing);
        let mut unequal = StorageDone::query(OperationId(3), vec![true], true);
        unequal.bytes.push(1);
        let mut r0 = RoundReport::idle(0, 0, 1);
        r0.completions = vec![invalid, unequal];
        let reports = vec![r0, RoundReport::idle(1, 0, 1)];
        let want = ReferenceAgreement::new(2).agree(reports.clone());
        let got = Agreement::new(2).agree(reports);
        assert_eq!(got, want);
        let e = got.unwrap_err().to_string();
        assert!(e.contains("query cannot report read failures"), "{e}");
    }

    /// A world of two gathers one report per rank: a second report from a rank, or one
    /// from outside the world, is a protocol error.
    #[test]
    fn a_rank_reports_once_and_only_inside_the_world() {
        let twice = vec![RoundReport::idle(0, 0, 1), RoundReport::idle(0, 0, 1)];
        let e = Agreement::new(2).agree(twice).unwrap_err().to_string();
        assert!(e.contains("two reports from rank 0"), "{e}");
        let outside = vec![RoundReport::idle(0, 0, 1), RoundReport::idle(5, 0, 1)];
        let e = Agreement::new(2).agree(outside).unwrap_err().to_string();
        assert!(e.contains("report from rank 5 outside the world"), "{e}");
    }

    #[test]
    fn the_scenarios_take_both_the_column_and_the_record_path() {
        let (mut aligned, mut by_record, mut keyed_puts) = (0, 0, 0);
        for seed in 0..1000u64 {
            let mut ag = Agreement::new(1 + (seed % 4) as u32);
            for reports in scenario(seed, ag.world(), 6) {
                let with_records = reports.iter().any(|r| !r.completions.is_empty());
                // PUTs with keys from more than one owner: what the column path's joins
                // and caps act on (counted, since a round could reach the path only with
                // records that carry nothing to join).
                let puts = match &reports[..] {
                    [first, _, ..] => first
                        .completions
                        .iter()
                        .filter(|d| d.kind == StorageOpKind::Put && !d.success.is_empty())
                        .count(),
                    _ => 0,
                };
                let before = ag.aligned_rounds;
                let Ok(_) = ag.agree(reports) else { break };
                if ag.aligned_rounds > before {
                    aligned += 1;
                    keyed_puts += puts;
                } else if with_records {
                    by_record += 1;
                }
            }
        }
        assert!(
            aligned > 100 && by_record > 30 && keyed_puts > 20,
            "{aligned} column rounds, {by_record} record rounds, {keyed_puts} PUTs with keys from several owners on the column path"
        );
    }

    /// The column path (every owner reports the same operations, in order) joins capacity
    /// rejections with OR and sums new writes, capped at the operation's keys — also for
    /// an operation that is not the round's first, whose keys start past zero.
    #[test]
    fn the_column_path_joins_capacity_and_caps_new_writes_per_operation() {
        let put = |op, capacity: Vec<bool>, new_writes| {
            let n = capacity.len();
            let mut d =
                StorageDone::put(OperationId(op), vec![false; n], vec![0; n], capacity, true);
            d.new_writes = new_writes;
            d
        };
        let report = |rank, first: StorageDone, second: StorageDone| {
            let mut r = RoundReport::idle(rank, 0, 1);
            r.completions = vec![first, second];
            r
        };
        let reports = vec![
            report(
                0,
                put(1, vec![true], 1),
                put(2, vec![true, false, false], 2),
            ),
            report(
                1,
                put(1, vec![false], 0),
                put(2, vec![false, false, true], 3),
            ),
        ];
        let want = ReferenceAgreement::new(2).agree(reports.clone()).unwrap();
        let mut ag = Agreement::new(2);
        let got = ag.agree(reports).unwrap();
        assert_eq!(ag.aligned_rounds, 1, "the column path agreed the round");
        assert_eq!(got, want);
        let [one, two] = &got.completions[..] else {
            panic!("two agreed operations: {:?}", got.completions);
        };
        assert_eq!(one.capacity, vec![true]);
        assert_eq!(one.new_writes, 1);
        assert_eq!(two.capacity, vec![true, false, true]);
        // 2 + 3 new writes over 3 keys: capped at the keys.
        assert_eq!(two.new_writes, 3);
    }

    #[test]
    fn sealing_orders_the_records_and_still_finds_a_repeat() {
        let q = |n| StorageDone::query(OperationId(n), vec![true], true);
        let mut r = RoundReport::idle(0, 0, 1);
        r.completions = vec![q(9), q(2), q(5)];
        let sealed = seal_local_report(r.clone());
        assert_eq!(
            sealed
                .completions
                .iter()
                .map(|d| d.op.0)
                .collect::<Vec<_>>(),
            vec![2, 5, 9]
        );
        r.completions.push(q(2));
        let sealed = seal_local_report(r);
        assert!(sealed.completions.is_empty());
        assert_eq!(
            sealed.error.as_deref(),
            Some("op2 appears twice in one poll")
        );
        let g = seal_gathered(RoundReport::idle(0, 0, 1));
        assert!(g.completions.is_empty() && g.error.is_none());
    }

    /// Records already in order skip the repeat set: only strictly increasing ones do. A
    /// repeat next to itself, in an otherwise ordered poll, is still found, and a poll in
    /// descending order comes out ascending.
    #[test]
    fn sealing_trusts_only_strictly_increasing_records() {
        let q = |n| StorageDone::query(OperationId(n), vec![true], true);
        let sealed_ops = |ops: &[u64]| {
            let mut r = RoundReport::idle(0, 0, 1);
            r.completions = ops.iter().map(|&n| q(n)).collect();
            let s = seal_local_report(r);
            (
                s.completions.iter().map(|d| d.op.0).collect::<Vec<_>>(),
                s.error,
            )
        };
        assert_eq!(
            sealed_ops(&[1, 3, 3]),
            (vec![], Some("op3 appears twice in one poll".into()))
        );
        assert_eq!(
            sealed_ops(&[4, 4]),
            (vec![], Some("op4 appears twice in one poll".into()))
        );
        assert_eq!(sealed_ops(&[9, 5, 2]), (vec![2, 5, 9], None));
        assert_eq!(sealed_ops(&[2, 5, 9]), (vec![2, 5, 9], None));
    }

    #[test]
    fn an_operation_retained_across_rounds_reduces_as_if_reported_at_once() {
        let get = |rank: u64| {
            let mut d = StorageDone::get(
                OperationId(3),
                (0..70).map(|i| !(i + rank).is_multiple_of(3)).collect(),
                (0..70).map(|i| i * rank).collect(),
                (0..70)
                    .map(|i| match (i + rank) % 3 {
                        0 if rank == 1 => Some(ObjectFailure::Invalid),
                        0 => Some(ObjectFailure::Missing),
                        _ => None,
                    })
                    .collect(),
                rank != 2,
            );
            d.error = (rank != 1).then(|| format!("r{rank}"));
            d
        };
        let at_once = {
            let mut ag = Agreement::new(3);
            let rs = (0..3)
                .map(|r| {
                    let mut rep = RoundReport::idle(r, 0, 1);
                    rep.completions = vec![get(u64::from(r))];
                    rep
                })
                .collect();
            ag.agree(rs).unwrap().completions
        };
        let mut ag = Agreement::new(3);
        let mut agreed = vec![];
        for (round, rank) in [(0u64, 2u32), (1, 0), (2, 1)] {
            let rs = (0..3)
                .map(|r| {
                    let mut rep = RoundReport::idle(r, round, 1);
                    if r == rank {
                        rep.completions = vec![get(u64::from(r))];
                    }
                    rep
                })
                .collect();
            agreed.extend(ag.agree(rs).unwrap().completions);
        }
        assert_eq!(agreed, at_once);
        assert_eq!(agreed[0].error.as_deref(), Some("rank 0: r0; rank 2: r2"));
        assert_eq!(agreed[0].failures[2], Some(ObjectFailure::Invalid));
        assert!(!agreed[0].retired);
    }
}
