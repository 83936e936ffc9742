//! The group matcher: for one prompt, which boundaries are legal, i.e. where Full history
//! has every block, the sliding window has its lookback, and State has a checkpoint exactly
//! at the boundary, at a chosen availability level.
//!
//! One table serves every caller with the same masks and key traversal: query planning
//! (Missing blocks are assumed to exist and become keys), reservation (existence hints
//! stand in as `Assumed`), and admission (real Device + published Host). Availability
//! levels are ordered (Device > Host > Assumed > Missing), so a mask is a minimum level.
//! The matcher allocates nothing and never mutates a pool.

use super::geometry::{CacheGeometry, GroupKind};
use super::keys::{BlockAddr, PromptIndex};
use super::tail::TailCandidate;

/// Where a block is available, best source first in the ordering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Have {
    /// Not local and not known to exist in L3.
    Missing = 0,
    /// Temporarily assumed to exist (query planning) or known to exist in L3 (hint).
    Assumed = 1,
    /// A published Host L2 entry.
    Host = 2,
    /// A published Device L1 entry.
    Device = 3,
}

impl Have {
    pub const LEVELS: [Have; 4] = [Have::Missing, Have::Assumed, Have::Host, Have::Device];
}

/// Which block of a group a requirement names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlockSlot {
    /// Complete block `k` of the group.
    Full(u32),
    /// The group's partial block (or nonaligned checkpoint) ending at the boundary.
    Tail,
}

/// One block a boundary requires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequiredBlock {
    pub addr: BlockAddr,
    pub slot: BlockSlot,
    /// Position of the block in the group's page sequence (owner translation).
    pub block_index: u64,
    pub have: Have,
}

/// A candidate boundary: aligned (a multiple of the LCM parent) or a tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub boundary: u32,
    /// Index into the table's tails.
    pub tail: Option<usize>,
}

/// Counts of a boundary's required blocks and keys by availability level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub blocks: [u32; 4],
    pub keys: [u32; 4],
}

impl Tally {
    pub fn blocks_at(&self, h: Have) -> u32 {
        self.blocks[h as usize]
    }
    pub fn keys_at(&self, h: Have) -> u32 {
        self.keys[h as usize]
    }
    /// Whether every required block is available at level `min` or better.
    pub fn legal_at(&self, min: Have) -> bool {
        self.blocks[..min as usize].iter().all(|c| *c == 0)
    }
}

#[derive(Clone, Debug)]
struct GroupTable {
    kind: GroupKind,
    block_tokens: u32,
    pages: u32,
    have: Vec<Have>,
    /// counts[i][h]: blocks with level h among blocks [0, i) (one allocation per group).
    counts: Vec<[u32; 4]>,
    /// Set while a rebuild's clamp pass has already classified this group's first blocks.
    classified: bool,
}

impl Default for GroupTable {
    fn default() -> Self {
        Self {
            kind: GroupKind::Full,
            block_tokens: 1,
            pages: 0,
            have: Vec::new(),
            counts: Vec::new(),
            classified: false,
        }
    }
}

impl GroupTable {
    fn count(&self, h: Have, start: u32, end: u32) -> u32 {
        self.counts[end as usize][h as usize] - self.counts[start as usize][h as usize]
    }

    /// The complete-block range [start, end) and whether a tail block is needed at `b`.
    fn requirement(&self, b: u32) -> (u32, u32, bool) {
        requirement(self.kind, self.block_tokens, b)
    }
}

/// A group's requirement at boundary `b`: the complete-block range [start, end) it needs
/// and whether it needs a tail block (Full history: every block below `b`; the sliding
/// window: its lookback; State: the checkpoint exactly at `b`).
pub fn requirement(kind: GroupKind, block_tokens: u32, b: u32) -> (u32, u32, bool) {
    let bt = block_tokens.max(1);
    let partial = !b.is_multiple_of(bt);
    match kind {
        GroupKind::Full => (0, b / bt, partial),
        GroupKind::SlidingWindow { window_tokens } => {
            ((b - window_tokens.min(b)) / bt, b / bt, partial)
        }
        GroupKind::State => {
            if b == 0 || partial {
                (0, 0, partial)
            } else {
                (b / bt - 1, b / bt, false)
            }
        }
    }
}

/// Where a block is available: the one question a match table asks of each block it
/// classifies (given the block's address and its place: complete block `k` of its group,
/// or the group's tail block). Any `FnMut(BlockAddr, BlockSlot) -> Have` answers it; the
/// CacheCoordinator answers with its pools (`PoolLevels`), inlined into the table's loops.
pub trait Availability {
    fn level(&mut self, addr: BlockAddr, slot: BlockSlot) -> Have;
}

impl<F: FnMut(BlockAddr, BlockSlot) -> Have> Availability for F {
    fn level(&mut self, addr: BlockAddr, slot: BlockSlot) -> Have {
        self(addr, slot)
    }
}

/// The per-request match table. Its buffers outlive one request: `rebuild` refills them for
/// the next prompt, so a caller that keeps a table (the CacheCoordinator keeps one) matches
/// without allocating once the buffers have grown to its prompts' size.
#[derive(Clone, Debug, Default)]
pub struct MatchTable {
    hi: u32,
    parent_tokens: u32,
    groups: Vec<GroupTable>,
    /// The tail candidates this prompt carries, sorted by boundary.
    tails: Vec<TailCandidate>,
    /// Per tail candidate and group (`tails.len() * groups.len()`, tail-major): the tail
    /// block's address and level (None when the group is aligned at the tail's boundary).
    tail_blocks: Vec<Option<(BlockAddr, Have)>>,
    /// Token bytes for hashing tail identities.
    scratch: Vec<u8>,
    /// Per level: the highest boundary a candidate legal at that level can have
    /// (`legal_ceiling`), worked out once per rebuild.
    ceilings: [u32; 4],
}

impl MatchTable {
    /// Classifies every complete block of every group up to `hi` (clamped to the index) and
    /// each tail candidate's blocks with `avail` (given each block's address and its place:
    /// complete block `k` of its group, or the group's tail block). With `clamp`, callers
    /// that only ask for legality at that level or better let the table stop above the
    /// first Full-history block below it (no boundary past it can be legal at that level).
    pub fn build(
        geometry: &CacheGeometry,
        index: &PromptIndex,
        tokens: &[u32],
        hi: u32,
        tails: &[TailCandidate],
        clamp: Option<Have>,
        avail: impl FnMut(BlockAddr, BlockSlot) -> Have,
    ) -> Self {
        let mut table = Self::default();
        table.rebuild(geometry, index, tokens, hi, tails, clamp, avail, false);
        table
    }

    /// `build` into this table's buffers (what it held before is replaced). A tail candidate
    /// that does not carry this prompt's identity at its boundary is passed over, unless
    /// `tails_exact` says every tail is known to carry it (each made from `index` and
    /// `tokens`, as the CacheCoordinator makes them): then none is hashed again.
    #[allow(clippy::too_many_arguments)]
    pub fn rebuild(
        &mut self,
        geometry: &CacheGeometry,
        index: &PromptIndex,
        tokens: &[u32],
        hi: u32,
        tails: &[TailCandidate],
        clamp: Option<Have>,
        mut avail: impl Availability,
        tails_exact: bool,
    ) {
        debug_assert!(
            !tails_exact
                || tails.iter().all(|t| t.boundary > index.len()
                    || t.boundary.is_multiple_of(index.parent_tokens().max(1))
                    || index.tail_identity(&mut Vec::new(), tokens, t.boundary) == t.hash)
        );
        let mut hi = hi.min(index.len());
        let specs = geometry.groups();
        self.groups.resize_with(specs.len(), GroupTable::default);
        for (gt, spec) in self.groups.iter_mut().zip(specs) {
            gt.kind = spec.kind;
            gt.block_tokens = spec.block_tokens;
            gt.pages = spec.pages_per_block;
            gt.have.clear();
            gt.counts.clear();
            gt.classified = false;
        }
        if let Some(min) = clamp {
            for (g, (spec, gt)) in specs.iter().zip(self.groups.iter_mut()).enumerate() {
                if spec.kind != GroupKind::Full {
                    continue;
                }
                gt.classified = true;
                let n = hi / spec.block_tokens;
                // The group's hashes as one slice (its chain located once, not per block).
                for (k, &hash) in (0..n).zip(index.block_hashes(g)) {
                    let h = avail.level(BlockAddr::new(g, hash), BlockSlot::Full(k));
                    gt.have.push(h);
                    if h < min {
                        hi = hi.min((k + 1) * spec.block_tokens);
                        break;
                    }
                }
            }
        }
        for (g, gt) in self.groups.iter_mut().enumerate() {
            let n = hi / gt.block_tokens;
            if gt.classified {
                gt.have.truncate(n as usize);
            } else {
                gt.have.extend(
                    (0..n)
                        .zip(index.block_hashes(g))
                        .map(|(k, &hash)| avail.level(BlockAddr::new(g, hash), BlockSlot::Full(k))),
                );
            }
            let mut run = [0u32; 4];
            gt.counts.push(run);
            for h in &gt.have {
                run[*h as usize] += 1;
                gt.counts.push(run);
            }
        }
        self.ceilings = [u32::MAX; 4];
        for gt in self.groups.iter().filter(|g| g.kind == GroupKind::Full) {
            // Per level: the first block below it ends the group's leading run there.
            let mut run = [gt.have.len(); 4];
            for (k, h) in gt.have.iter().enumerate() {
                for r in run.iter_mut().skip(*h as usize + 1) {
                    *r = (*r).min(k);
                }
                if run[1..].iter().all(|r| *r <= k) {
                    break;
                }
            }
            let bt = gt.block_tokens.max(1);
            for (ceiling, run) in self.ceilings.iter_mut().zip(run) {
                let limit = (run as u32).saturating_add(1).saturating_mul(bt) - 1;
                *ceiling = (*ceiling).min(limit);
            }
        }
        let l = index.parent_tokens();
        self.tails.clear();
        self.tails.extend(
            tails
                .iter()
                .filter(|t| t.boundary > 0 && t.boundary <= hi && t.boundary % l != 0),
        );
        // A candidate must carry this prompt's exact tail identity (checked before the
        // duplicates at one boundary go, so a foreign one cannot displace the prompt's own).
        if !tails_exact {
            let scratch = &mut self.scratch;
            self.tails
                .retain(|t| index.tail_identity(scratch, tokens, t.boundary) == t.hash);
        }
        self.tails.sort();
        self.tails.dedup_by_key(|t| t.boundary);
        self.tail_blocks.clear();
        for t in &self.tails {
            for (g, gt) in self.groups.iter().enumerate() {
                if t.boundary % gt.block_tokens == 0 {
                    self.tail_blocks.push(None);
                    continue;
                }
                // A group on the LCM parent chain hashes its partial block exactly as the
                // tail identity does: the candidate's (exact) identity is that hash.
                let hash = if index.on_parent_chain(g) {
                    t.hash
                } else {
                    index.tail_block_hash(&mut self.scratch, tokens, g, t.boundary)
                };
                let addr = BlockAddr::new(g, hash);
                self.tail_blocks
                    .push(Some((addr, avail.level(addr, BlockSlot::Tail))));
            }
        }
        self.hi = hi;
        self.parent_tokens = l;
    }

    /// The highest boundary the table covers.
    pub fn hi(&self) -> u32 {
        self.hi
    }

    pub fn tail(&self, i: usize) -> TailCandidate {
        self.tails[i]
    }

    /// Candidate boundaries in (lo, hi], longest first: aligned multiples of the LCM parent
    /// block and the table's tails.
    pub fn candidates(&self, lo: u32) -> Vec<Candidate> {
        self.candidates_iter(lo).collect()
    }

    /// `candidates` without collecting them (longest first, allocation-free).
    pub fn candidates_iter(&self, lo: u32) -> impl Iterator<Item = Candidate> + '_ {
        self.candidates_in(lo, u32::MAX)
    }

    /// The candidates in (lo, top], longest first: the walk starts at `top` (the candidates
    /// above it are never visited, as a legal ceiling or a lookahead bound allows).
    pub fn candidates_in(&self, lo: u32, top: u32) -> impl Iterator<Item = Candidate> + '_ {
        let l = self.parent_tokens;
        let mut ti = self.tails.partition_point(|t| t.boundary <= top);
        let mut a = self.hi.min(top) / l * l;
        let mut done = false;
        std::iter::from_fn(move || loop {
            if done {
                return None;
            }
            if ti > 0 && self.tails[ti - 1].boundary > a {
                let b = self.tails[ti - 1].boundary;
                ti -= 1;
                if b > lo {
                    return Some(Candidate {
                        boundary: b,
                        tail: Some(ti),
                    });
                }
                continue;
            }
            if a <= lo || a == 0 {
                done = true;
                return None;
            }
            let c = Candidate {
                boundary: a,
                tail: None,
            };
            a -= l;
            return Some(c);
        })
    }

    /// The counts of a candidate's required blocks and keys by level.
    pub fn tally(&self, c: Candidate) -> Tally {
        let mut t = Tally::default();
        for (g, gt) in self.groups.iter().enumerate() {
            let (s, e, tail) = gt.requirement(c.boundary);
            for h in Have::LEVELS {
                let n = gt.count(h, s, e);
                t.blocks[h as usize] += n;
                t.keys[h as usize] += n * gt.pages;
            }
            if tail {
                let h = self.tail_have(c, g);
                t.blocks[h as usize] += 1;
                t.keys[h as usize] += gt.pages;
            }
        }
        t
    }

    fn tail_have(&self, c: Candidate, g: usize) -> Have {
        match c.tail.and_then(|i| self.tail_block_at(i, g)) {
            Some((_, h)) => h,
            // A partial block of a boundary that is no tail candidate: never available.
            None => Have::Missing,
        }
    }

    /// Whether `c` is legal with every requirement at level `min` or better.
    pub fn legal(&self, c: Candidate, min: Have) -> bool {
        self.tally(c).legal_at(min)
    }

    /// The longest legal candidate above `lo` at level `min` (boundary 0 when none).
    pub fn longest(&self, lo: u32, min: Have) -> Option<Candidate> {
        self.candidates_in(lo, self.legal_ceiling(min))
            .find(|c| self.legal(*c, min))
    }

    /// The highest boundary a candidate legal at `min` can have: a Full-history group needs
    /// every complete block below the boundary at `min` or better (and its tail block, in
    /// the block after them), so no boundary past its first block below `min` is legal.
    /// Candidates above it are never visited (u32::MAX: no Full group).
    pub fn legal_ceiling(&self, min: Have) -> u32 {
        self.ceilings[min as usize]
    }

    /// `(longest(lo, min), longest(lo, strict))` for `strict` at or above `min`, in one
    /// pass: a candidate legal at `strict` is legal at `min`, so the scan stops at the
    /// first one legal at `strict`, each candidate tallied once.
    pub fn longest_pair(
        &self,
        lo: u32,
        min: Have,
        strict: Have,
    ) -> (Option<Candidate>, Option<Candidate>) {
        debug_assert!(strict >= min);
        let (ceiling_min, ceiling_strict) = (self.legal_ceiling(min), self.legal_ceiling(strict));
        let mut first = None;
        for c in self.candidates_in(lo, ceiling_min) {
            let t = self.tally(c);
            if first.is_none() && t.legal_at(min) {
                first = Some(c);
            }
            if c.boundary <= ceiling_strict && t.legal_at(strict) {
                return (first.or(Some(c)), Some(c));
            }
        }
        (first, None)
    }

    /// The blocks `c` requires, by group then position (tail last).
    pub fn required_blocks(&self, index: &PromptIndex, c: Candidate) -> Vec<RequiredBlock> {
        let mut out = Vec::new();
        self.required_blocks_into(index, c, &mut out);
        out
    }

    /// `required_blocks` into `out` (emptied first).
    pub fn required_blocks_into(
        &self,
        index: &PromptIndex,
        c: Candidate,
        out: &mut Vec<RequiredBlock>,
    ) {
        out.clear();
        for (g, gt) in self.groups.iter().enumerate() {
            let (s, e, tail) = gt.requirement(c.boundary);
            for k in s..e {
                out.push(RequiredBlock {
                    addr: BlockAddr::new(g, index.block_hash(g, k)),
                    slot: BlockSlot::Full(k),
                    block_index: k as u64,
                    have: gt.have[k as usize],
                });
            }
            if tail {
                if let Some((addr, have)) = c.tail.and_then(|i| self.tail_block_at(i, g)) {
                    out.push(RequiredBlock {
                        addr,
                        slot: BlockSlot::Tail,
                        block_index: (c.boundary / gt.block_tokens) as u64,
                        have,
                    });
                }
            }
        }
    }

    /// Group `g`'s complete-block range at `b` and whether it needs a tail block.
    pub fn requirement(&self, g: usize, b: u32) -> (u32, u32, bool) {
        self.groups[g].requirement(b)
    }

    /// The level of complete block `k` of group `g`.
    pub fn have(&self, g: usize, k: u32) -> Have {
        self.groups[g].have[k as usize]
    }

    /// Complete blocks of group `g` the table classifies.
    pub fn blocks(&self, g: usize) -> u32 {
        self.groups[g].have.len() as u32
    }

    pub fn pages(&self, g: usize) -> u32 {
        self.groups[g].pages
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// The longest aligned boundary (a multiple of the LCM parent) at or below `c`, as a
    /// candidate: with Full history only, `c` requires every block it requires.
    pub fn aligned_floor(&self, c: Candidate) -> Candidate {
        let l = self.parent_tokens.max(1);
        Candidate {
            boundary: c.boundary / l * l,
            tail: None,
        }
    }

    /// Whether every group keeps Full history: a boundary then requires every block below
    /// it, so a shorter aligned boundary requires a subset of a longer one's blocks.
    pub fn full_history_only(&self) -> bool {
        self.groups.iter().all(|g| g.kind == GroupKind::Full)
    }

    fn tail_block_at(&self, i: usize, g: usize) -> Option<(BlockAddr, Have)> {
        self.tail_blocks[i * self.groups.len() + g]
    }

    /// Group `g`'s tail block at candidate `c`, if it has one.
    pub fn tail_block(&self, c: Candidate, g: usize) -> Option<(BlockAddr, Have)> {
        c.tail.and_then(|i| self.tail_block_at(i, g))
    }
}
