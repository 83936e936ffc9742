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

#[derive(Clone, Debug)]
struct TailEntry {
    candidate: TailCandidate,
    /// Per group: the tail block's address and level (None when the group is aligned at the
    /// tail's boundary).
    blocks: Vec<Option<(BlockAddr, Have)>>,
}

/// The per-request match table.
#[derive(Clone, Debug)]
pub struct MatchTable {
    hi: u32,
    parent_tokens: u32,
    groups: Vec<GroupTable>,
    tails: Vec<TailEntry>,
}

impl MatchTable {
    /// Classifies every complete block of every group up to `hi` (clamped to the index) and
    /// each tail candidate's blocks with `avail`. With `clamp`, callers that only ask for
    /// legality at that level or better let the table stop above the first Full-history
    /// block below it (no boundary past it can be legal at that level).
    pub fn build(
        geometry: &CacheGeometry,
        index: &PromptIndex,
        tokens: &[u32],
        hi: u32,
        tails: &[TailCandidate],
        clamp: Option<Have>,
        mut avail: impl FnMut(BlockAddr) -> Have,
    ) -> Self {
        let mut hi = hi.min(index.len());
        let specs = geometry.groups();
        let mut early: Vec<Option<Vec<Have>>> = vec![None; specs.len()];
        if let Some(min) = clamp {
            for (g, spec) in specs.iter().enumerate() {
                if spec.kind != GroupKind::Full {
                    continue;
                }
                let n = hi / spec.block_tokens;
                let mut have = Vec::with_capacity(n as usize);
                for k in 0..n {
                    let h = avail(BlockAddr::new(g, index.block_hash(g, k)));
                    have.push(h);
                    if h < min {
                        hi = hi.min((k + 1) * spec.block_tokens);
                        break;
                    }
                }
                early[g] = Some(have);
            }
        }
        let groups = specs
            .iter()
            .enumerate()
            .map(|(g, spec)| {
                let n = hi / spec.block_tokens;
                let have = match early[g].take() {
                    Some(mut have) => {
                        have.truncate(n as usize);
                        have
                    }
                    None => (0..n)
                        .map(|k| avail(BlockAddr::new(g, index.block_hash(g, k))))
                        .collect(),
                };
                let mut counts: Vec<[u32; 4]> = Vec::with_capacity(have.len() + 1);
                let mut run = [0u32; 4];
                counts.push(run);
                for h in &have {
                    run[*h as usize] += 1;
                    counts.push(run);
                }
                GroupTable {
                    kind: spec.kind,
                    block_tokens: spec.block_tokens,
                    pages: spec.pages_per_block,
                    have,
                    counts,
                }
            })
            .collect::<Vec<_>>();
        let mut scratch = Vec::new();
        let mut entries: Vec<TailEntry> = Vec::new();
        let l = index.parent_tokens();
        let mut sorted: Vec<TailCandidate> = tails
            .iter()
            .filter(|t| t.boundary > 0 && t.boundary <= hi && t.boundary % l != 0)
            .copied()
            .collect();
        sorted.sort();
        sorted.dedup_by_key(|t| t.boundary);
        // A candidate must carry this prompt's exact tail identity.
        sorted.retain(|t| index.tail_identity(&mut scratch, tokens, t.boundary) == t.hash);
        for t in sorted {
            let blocks = groups
                .iter()
                .enumerate()
                .map(|(g, gt)| {
                    if t.boundary % gt.block_tokens == 0 {
                        return None;
                    }
                    let addr = BlockAddr::new(
                        g,
                        index.tail_block_hash(&mut scratch, tokens, g, t.boundary),
                    );
                    Some((addr, avail(addr)))
                })
                .collect();
            entries.push(TailEntry {
                candidate: t,
                blocks,
            });
        }
        Self {
            hi,
            parent_tokens: index.parent_tokens(),
            groups,
            tails: entries,
        }
    }

    /// The highest boundary the table covers.
    pub fn hi(&self) -> u32 {
        self.hi
    }

    pub fn tail(&self, i: usize) -> TailCandidate {
        self.tails[i].candidate
    }

    /// Candidate boundaries in (lo, hi], longest first: aligned multiples of the LCM parent
    /// block and the table's tails.
    pub fn candidates(&self, lo: u32) -> Vec<Candidate> {
        self.candidates_iter(lo).collect()
    }

    /// `candidates` without collecting them (longest first, allocation-free).
    pub fn candidates_iter(&self, lo: u32) -> impl Iterator<Item = Candidate> + '_ {
        let l = self.parent_tokens;
        let mut ti = self.tails.len();
        let mut a = self.hi / l * l;
        let mut done = false;
        std::iter::from_fn(move || loop {
            if done {
                return None;
            }
            if ti > 0 && self.tails[ti - 1].candidate.boundary > a {
                let b = self.tails[ti - 1].candidate.boundary;
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
        match c.tail.and_then(|i| self.tails[i].blocks[g]) {
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
        self.candidates_iter(lo).find(|c| self.legal(*c, min))
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
        let mut first = None;
        for c in self.candidates_iter(lo) {
            let t = self.tally(c);
            if first.is_none() && t.legal_at(min) {
                first = Some(c);
            }
            if t.legal_at(strict) {
                return (first.or(Some(c)), Some(c));
            }
        }
        (first, None)
    }

    /// The blocks `c` requires, by group then position (tail last).
    pub fn required_blocks(&self, index: &PromptIndex, c: Candidate) -> Vec<RequiredBlock> {
        let mut out = Vec::new();
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
                if let Some((addr, have)) = c.tail.and_then(|i| self.tails[i].blocks[g]) {
                    out.push(RequiredBlock {
                        addr,
                        slot: BlockSlot::Tail,
                        block_index: (c.boundary / gt.block_tokens) as u64,
                        have,
                    });
                }
            }
        }
        out
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

    /// Group `g`'s tail block at candidate `c`, if it has one.
    pub fn tail_block(&self, c: Candidate, g: usize) -> Option<(BlockAddr, Have)> {
        c.tail.and_then(|i| self.tails[i].blocks[g])
    }
}
