//! Query-credit packing: which boundaries a QUERY covers and which missing blocks it asks
//! for, within the available key and Host credits.
//!
//! The primary boundary is the longest candidate whose complete missing dependencies fit:
//! its missing keys within the key credits, its new destinations plus warm Host references
//! within the Host credits (each CacheBlock charged as one potentially pinned LCM parent).
//! Shorter fallback boundaries contribute their distinct missing keys only when the whole
//! additional set fits. Because the primary is packed first, historical State checkpoints
//! can never crowd out the prompt-end checkpoint needed for the longest restore. Packing
//! never allocates or pins anything.

use super::keys::ContentHash;
use super::keys::PromptIndex;
use super::matcher::{BlockSlot, Candidate, Have, MatchTable, RequiredBlock};

/// Credits available to one QUERY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryCredits {
    /// Object keys the query may carry.
    pub keys: u32,
    /// Logical Host block references (max_host_blocks share) a later GET may hold.
    pub host_blocks: u32,
}

/// One boundary the packing covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackedBoundary {
    pub candidate: Candidate,
    /// Keys this boundary added to the query (0 when earlier boundaries supplied them).
    pub new_keys: u32,
}

/// The result of packing: its lists live in the scratch that packed it (read them, then
/// pack again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packing<'s> {
    /// Primary first, then fallbacks longest first.
    pub boundaries: &'s [PackedBoundary],
    /// Missing blocks to ask for, in query order, without duplicates.
    pub blocks: &'s [RequiredBlock],
    pub keys: u32,
    /// The primary's Host charge: new destinations plus warm Host references.
    pub host_blocks: u32,
}

/// Buffers one packing reuses from the last (lent by the coordinator's match scratch):
/// the included-block record and the packing's own two lists.
#[derive(Debug, Default)]
pub struct PackScratch {
    inc: Included,
    boundaries: Vec<PackedBoundary>,
    blocks: Vec<RequiredBlock>,
}

/// Per-group record of the complete blocks already asked for.
#[derive(Debug, Default)]
struct Included {
    /// One flag per complete block of every group, group after group (`offset`).
    bits: Vec<bool>,
    /// Per group: where its flags start in `bits`, and a range [lo, hi) whose missing
    /// blocks are all included.
    groups: Vec<IncludedGroup>,
    /// Tail blocks asked for (a QUERY asks for a few at most: searched linearly).
    tails: Vec<(u32, ContentHash)>,
}

#[derive(Clone, Copy, Debug)]
struct IncludedGroup {
    offset: usize,
    covered: (u32, u32),
}

impl Included {
    /// Empties the record for `table`'s groups, in the buffers it already has.
    fn reset(&mut self, table: &MatchTable) {
        self.groups.clear();
        self.tails.clear();
        let mut offset = 0;
        for g in 0..table.group_count() {
            self.groups.push(IncludedGroup {
                offset,
                covered: (0, 0),
            });
            offset += table.blocks(g) as usize;
        }
        self.bits.clear();
        self.bits.resize(offset, false);
    }

    fn has(&self, g: usize, k: u32) -> bool {
        self.bits[self.groups[g].offset + k as usize]
    }

    fn set(&mut self, g: usize, k: u32) {
        let i = self.groups[g].offset + k as usize;
        self.bits[i] = true;
    }

    /// Records `b` as asked for when it is a tail block (once).
    fn ask_tail(&mut self, b: &RequiredBlock) {
        let key = (b.addr.group, b.addr.hash);
        if b.slot == BlockSlot::Tail && !self.tails.contains(&key) {
            self.tails.push(key);
        }
    }
}

/// A candidate's missing keys and its Host charge: new destinations (missing or assumed
/// blocks) plus warm Host references.
fn needs(table: &MatchTable, c: Candidate) -> (u32, u32) {
    let t = table.tally(c);
    let charge = t.blocks_at(Have::Missing) + t.blocks_at(Have::Assumed) + t.blocks_at(Have::Host);
    (t.keys_at(Have::Missing), charge)
}

/// The Host charge of `c` when its missing keys and its charge fit `credits`.
fn fit_charge(table: &MatchTable, c: Candidate, credits: QueryCredits) -> Option<u32> {
    let (keys, charge) = needs(table, c);
    (keys <= credits.keys && charge <= credits.host_blocks).then_some(charge)
}

/// The primary: the first of the candidates (longest first) that fits `credits`, and its
/// Host charge. The first candidate is tried first (credits seldom bind). With Full
/// history only (`bisect`), the candidates whose aligned floor (the longest aligned
/// boundary at or below them) does not fit are passed over by bisection: a candidate
/// requires every block its floor requires (a superset at every level), so it cannot fit
/// where its floor does not, and the floors fall with the candidates, so "the floor does
/// not fit" holds for a leading run. The walk then goes on one by one from the first
/// candidate whose floor fits: past at most the tails of one aligned step, it reaches an
/// aligned candidate that fits. A long prompt whose keys exceed the QUERY's key credit
/// tallies a few dozen candidates instead of every one above the primary (the test
/// `the_bisected_primary_is_the_first_candidate_that_fits` compares the two walks).
fn primary(
    table: &MatchTable,
    candidates: &[Candidate],
    credits: QueryCredits,
    bisect: bool,
) -> Option<(usize, u32)> {
    let first = candidates.first()?;
    if let Some(charge) = fit_charge(table, *first, credits) {
        return Some((0, charge));
    }
    let from = if bisect && table.full_history_only() {
        1 + candidates[1..]
            .partition_point(|c| fit_charge(table, table.aligned_floor(*c), credits).is_none())
    } else {
        1
    };
    candidates[from..]
        .iter()
        .enumerate()
        .find_map(|(i, c)| fit_charge(table, *c, credits).map(|charge| (from + i, charge)))
}

/// Packs the candidates (longest first, all above the complete local hit), in the buffers
/// of `scratch`.
pub fn pack<'s>(
    scratch: &'s mut PackScratch,
    table: &MatchTable,
    index: &PromptIndex,
    candidates: &[Candidate],
    credits: QueryCredits,
) -> Option<Packing<'s>> {
    pack_with(scratch, table, index, candidates, credits, true)
}

/// `pack`; `skip_covered` passes over the fallbacks that add nothing (`adds_nothing`, or
/// an aligned fallback of Full-history groups) without working out their extra blocks, and
/// finds the primary by bisection (false only in the test that checks it changes no
/// packing: every candidate is then tallied from the top).
fn pack_with<'s>(
    scratch: &'s mut PackScratch,
    table: &MatchTable,
    index: &PromptIndex,
    candidates: &[Candidate],
    credits: QueryCredits,
    skip_covered: bool,
) -> Option<Packing<'s>> {
    let (pi, charge) = primary(table, candidates, credits, skip_covered)?;
    if skip_covered && table.full_history_only() {
        return Some(pack_full_history(
            scratch,
            table,
            index,
            &candidates[pi..],
            credits,
            charge,
        ));
    }
    let PackScratch {
        inc,
        boundaries,
        blocks,
    } = scratch;
    inc.reset(table);
    boundaries.clear();
    blocks.clear();
    let mut keys = 0;
    // (With Full history only and `skip_covered`, `pack_full_history` packed it above.)
    for &c in &candidates[pi..] {
        // A fallback is reserved alone: its own Host charge must fit.
        if !boundaries.is_empty() && needs(table, c).1 > credits.host_blocks {
            continue;
        }
        if skip_covered && !boundaries.is_empty() && adds_nothing(table, inc, c) {
            boundaries.push(PackedBoundary {
                candidate: c,
                new_keys: 0,
            });
            continue;
        }
        // The extra blocks are written at the end of the packing's own list and cut off
        // again when they do not fit (no second list to copy from).
        let start = blocks.len();
        extra_blocks(table, index, inc, c, blocks);
        let Some(extra_keys) = fit_extra(table, blocks, start, keys, credits) else {
            continue;
        };
        include(table, inc, c, &blocks[start..]);
        keys += extra_keys;
        boundaries.push(PackedBoundary {
            candidate: c,
            new_keys: extra_keys,
        });
    }
    Some(Packing {
        boundaries,
        blocks,
        keys,
        host_blocks: charge,
    })
}

/// `pack_with` (skipping what adds nothing) when every group keeps Full history, from the
/// first candidate that fits (`candidates[0]`, whose Host charge is `charge`): a candidate
/// then requires every complete block below it, so once a primary is packed a fallback's
/// complete blocks are all among the primary's and only its tail blocks can add keys. The
/// same packing as the general walk without its per-block record of included blocks (the
/// test `skipping_fallbacks_that_add_nothing_changes_no_packing` compares the two).
fn pack_full_history<'s>(
    scratch: &'s mut PackScratch,
    table: &MatchTable,
    index: &PromptIndex,
    candidates: &[Candidate],
    credits: QueryCredits,
    charge: u32,
) -> Packing<'s> {
    let PackScratch {
        inc,
        boundaries,
        blocks,
    } = scratch;
    inc.tails.clear();
    boundaries.clear();
    blocks.clear();
    let mut keys = 0;
    for &c in candidates {
        let primary = boundaries.is_empty();
        if !primary {
            // An aligned fallback requires a subset of the primary's blocks.
            if c.tail.is_none() {
                boundaries.push(PackedBoundary {
                    candidate: c,
                    new_keys: 0,
                });
                continue;
            }
            // A fallback is reserved alone: its own Host charge must fit.
            if needs(table, c).1 > credits.host_blocks {
                continue;
            }
        }
        // The blocks this candidate adds, by group: the primary's missing complete blocks,
        // then each missing tail block not yet asked for.
        let start = blocks.len();
        for g in 0..table.group_count() {
            let (s, e, tail) = table.requirement(g, c.boundary);
            if primary {
                let missing = (s..e).filter(|k| table.have(g, *k) == Have::Missing);
                blocks.extend(missing.map(|k| missing_block(index, g, k)));
            }
            if tail {
                blocks.extend(missing_tail(table, &inc.tails, c, g, e));
            }
        }
        let Some(extra_keys) = fit_extra(table, blocks, start, keys, credits) else {
            continue;
        };
        for b in &blocks[start..] {
            inc.ask_tail(b);
        }
        keys += extra_keys;
        boundaries.push(PackedBoundary {
            candidate: c,
            new_keys: extra_keys,
        });
    }
    Packing {
        boundaries,
        blocks,
        keys,
        host_blocks: charge,
    }
}

/// Whether `c` needs no block that is not yet included, and including it would change no
/// record: each group's requirement is empty or inside its covered range, and its
/// tail blocks are local, assumed or already asked for. (A shorter fallback of Full-history
/// groups is such a candidate: `extra_blocks` and `include` are then skipped.)
fn adds_nothing(table: &MatchTable, inc: &Included, c: Candidate) -> bool {
    (0..table.group_count()).all(|g| {
        let (s, e, tail) = table.requirement(g, c.boundary);
        let (clo, chi) = inc.groups[g].covered;
        let blocks = s == e || (s >= clo && e <= chi);
        let tail_block = !tail
            || match table.tail_block(c, g) {
                Some((addr, Have::Missing)) => inc.tails.contains(&(addr.group, addr.hash)),
                _ => true,
            };
        blocks && tail_block
    })
}

/// The missing blocks `c` requires that are not yet included, by group then position
/// (appended to `out`).
fn extra_blocks(
    table: &MatchTable,
    index: &PromptIndex,
    inc: &Included,
    c: Candidate,
    out: &mut Vec<RequiredBlock>,
) {
    for g in 0..table.group_count() {
        let (s, e, tail) = table.requirement(g, c.boundary);
        let (clo, chi) = inc.groups[g].covered;
        if !(s >= clo && e <= chi) {
            let missing = (s..e).filter(|k| table.have(g, *k) == Have::Missing && !inc.has(g, *k));
            out.extend(missing.map(|k| missing_block(index, g, k)));
        }
        if tail {
            out.extend(missing_tail(table, &inc.tails, c, g, e));
        }
    }
}

/// The keys of the blocks a candidate added at the end of `blocks` (from `start`) when
/// they fit the key credits beside the `keys` already packed; otherwise they are cut off
/// again (None).
fn fit_extra(
    table: &MatchTable,
    blocks: &mut Vec<RequiredBlock>,
    start: usize,
    keys: u32,
    credits: QueryCredits,
) -> Option<u32> {
    let extra: u32 = blocks[start..]
        .iter()
        .map(|b| table.pages(b.addr.group as usize))
        .sum();
    if keys + extra > credits.keys {
        blocks.truncate(start);
        return None;
    }
    Some(extra)
}

/// Complete block `k` of group `g`, missing: a block the QUERY asks for.
fn missing_block(index: &PromptIndex, g: usize, k: u32) -> RequiredBlock {
    RequiredBlock {
        addr: super::keys::BlockAddr::new(g, index.block_hash(g, k)),
        slot: BlockSlot::Full(k),
        block_index: k as u64,
        have: Have::Missing,
    }
}

/// Group `g`'s tail block at `c` (after its `e` complete blocks) when it is missing and not
/// asked for yet (`asked`).
fn missing_tail(
    table: &MatchTable,
    asked: &[(u32, ContentHash)],
    c: Candidate,
    g: usize,
    e: u32,
) -> Option<RequiredBlock> {
    match table.tail_block(c, g) {
        Some((addr, Have::Missing)) if !asked.contains(&(addr.group, addr.hash)) => {
            Some(RequiredBlock {
                addr,
                slot: BlockSlot::Tail,
                block_index: e as u64,
                have: Have::Missing,
            })
        }
        _ => None,
    }
}

fn include(table: &MatchTable, inc: &mut Included, c: Candidate, extra: &[RequiredBlock]) {
    for b in extra {
        match b.slot {
            BlockSlot::Full(k) => inc.set(b.addr.group as usize, k),
            BlockSlot::Tail => inc.ask_tail(b),
        }
    }
    for g in 0..table.group_count() {
        let (s, e, _) = table.requirement(g, c.boundary);
        let (clo, chi) = inc.groups[g].covered;
        inc.groups[g].covered = if clo == chi {
            (s, e)
        } else if e >= clo && s <= chi {
            (s.min(clo), e.max(chi))
        } else {
            (clo, chi)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::geometry::{CacheGeometry, GroupSpec};
    use crate::cache::tail::TailCandidate;

    /// A 203-token prompt of spread-out tokens, its index, and its tail candidates at
    /// `bounds` (those that are tails under `g`).
    fn prompt_with_tails(
        g: &CacheGeometry,
        bounds: &[u32],
    ) -> (Vec<u32>, PromptIndex, Vec<TailCandidate>) {
        let p: Vec<u32> = (0..203u32)
            .map(|i| i.wrapping_mul(2654435761) % 977)
            .collect();
        let index = PromptIndex::new(g, &p, p.len() as u32);
        let tails = bounds
            .iter()
            .filter_map(|b| TailCandidate::at(&index, &p, *b))
            .collect();
        (p, index, tails)
    }

    /// Skipping the fallbacks that add nothing changes no packing: the same boundaries, new
    /// keys, blocks and charge as working out every fallback's extra blocks, over Full
    /// (one group, and two of different block sizes: the Full-history walk,
    /// `pack_full_history`, against the general one), sliding-window and State groups,
    /// tails, mixed availability and tight credits.
    #[test]
    fn skipping_fallbacks_that_add_nothing_changes_no_packing() {
        let geometries = [
            vec![GroupSpec::full("attn", 4, 2, 64)],
            vec![
                GroupSpec::full("attn", 4, 2, 64),
                GroupSpec::full("wide", 12, 1, 64),
            ],
            vec![
                GroupSpec::full("attn", 16, 1, 64),
                GroupSpec::state("ssm", 32, 8),
            ],
            vec![
                GroupSpec::full("attn", 8, 1, 64),
                GroupSpec::sliding_window("swa", 24, 8, 1, 64),
            ],
        ];
        let levels = [Have::Missing, Have::Assumed, Have::Host, Have::Device];
        let mut compared = 0;
        for groups in geometries {
            let g = CacheGeometry::new(groups, 1, 0).unwrap();
            let (p, index, tails) = prompt_with_tails(&g, &[203, 150, 97, 61]);
            for seed in 0u64..48 {
                let table = MatchTable::build(&g, &index, &p, 203, &tails, None, |a, _| {
                    let h = a.hash.as_u128() as u64 ^ seed.wrapping_mul(0x9E37_79B9);
                    match seed % 3 {
                        0 => levels[(h % 4) as usize],
                        1 => levels[(h % 2) as usize],
                        _ => Have::Missing,
                    }
                });
                let candidates: Vec<Candidate> = table.candidates_iter(0).collect();
                // Tight key and Host credits, and every Host credit up to the whole set
                // (a fallback whose own charge lands exactly on it is packed).
                let tight = [(9, 12), (30, 40), (30, 4), (30, 7), (60, 10)];
                let sweep = tight
                    .into_iter()
                    .chain((0..=56).map(|h| (1 << 20, h)))
                    .chain([(1 << 20, 1 << 20)]);
                for (keys, host_blocks) in sweep {
                    let credits = QueryCredits { keys, host_blocks };
                    let (mut fast, mut full) = (PackScratch::default(), PackScratch::default());
                    let a = pack_with(&mut fast, &table, &index, &candidates, credits, true);
                    let b = pack_with(&mut full, &table, &index, &candidates, credits, false);
                    assert_eq!(a, b, "seed {seed} credits {credits:?}");
                    // Within the credits: the keys asked for, and each boundary's own Host
                    // charge (a fallback is reserved alone).
                    if let Some(x) = a {
                        assert!(x.keys <= credits.keys, "seed {seed} credits {credits:?}");
                        for pb in x.boundaries {
                            let charge = needs(&table, pb.candidate).1;
                            assert!(charge <= credits.host_blocks, "seed {seed} {pb:?}");
                        }
                    }
                    compared += usize::from(a.is_some_and(|x| x.boundaries.len() > 1));
                }
            }
        }
        assert!(
            compared > 20,
            "packings with fallbacks compared: {compared}"
        );
    }

    /// The primary search asked to bisect finds the same candidate and charge as the plain
    /// first-fit walk (each candidate's `fit_charge` from the top): with Full history it
    /// bisects (one and two Full groups, tails whose partial blocks are missing while the
    /// block above is local, where a candidate's own fit is not monotone); with a
    /// sliding-window or State group a candidate does not require every block its aligned
    /// floor requires, so "the floor does not fit" is no leading run and it must walk one
    /// by one. Every availability mix and a sweep of key and Host credits.
    #[test]
    fn the_bisected_primary_is_the_first_candidate_that_fits() {
        let geometries = [
            vec![GroupSpec::full("attn", 4, 2, 64)],
            vec![
                GroupSpec::full("attn", 4, 2, 64),
                GroupSpec::full("wide", 12, 1, 64),
            ],
            vec![
                GroupSpec::full("attn", 8, 1, 64),
                GroupSpec::sliding_window("swa", 24, 8, 1, 64),
            ],
            vec![
                GroupSpec::full("attn", 16, 1, 64),
                GroupSpec::state("ssm", 32, 8),
            ],
            vec![GroupSpec::sliding_window("swa", 16, 4, 2, 64)],
        ];
        let levels = [Have::Missing, Have::Assumed, Have::Host, Have::Device];
        // Primaries found deep in the candidates, with Full history only and without.
        let (mut compared, mut deep) = (0, [0usize; 2]);
        for groups in geometries {
            let g = CacheGeometry::new(groups, 1, 0).unwrap();
            let (p, index, tails) = prompt_with_tails(&g, &[203, 150, 149, 97, 61, 2]);
            for seed in 0u64..64 {
                let table = MatchTable::build(&g, &index, &p, 203, &tails, None, |a, slot| {
                    let h = a.hash.as_u128() as u64 ^ seed.wrapping_mul(0x9E37_79B9);
                    match (seed % 4, slot) {
                        // Tail blocks missing, complete blocks mostly local.
                        (0, BlockSlot::Tail) => Have::Missing,
                        (0, _) => levels[1 + (h % 3) as usize],
                        (1, _) => levels[(h % 4) as usize],
                        (2, _) => levels[(h % 2) as usize],
                        _ => levels[usize::from(h.is_multiple_of(5)) * 3],
                    }
                });
                let kind = usize::from(!table.full_history_only());
                for lo in [0, 12, 100] {
                    let candidates: Vec<Candidate> = table.candidates_iter(lo).collect();
                    for keys in (0..=120).step_by(3) {
                        for host_blocks in [0, 5, 17, 40, 1 << 20] {
                            let credits = QueryCredits { keys, host_blocks };
                            let first_fit = candidates.iter().enumerate().find_map(|(i, c)| {
                                fit_charge(&table, *c, credits).map(|charge| (i, charge))
                            });
                            let found = primary(&table, &candidates, credits, true);
                            assert_eq!(found, first_fit, "seed {seed} lo {lo} credits {credits:?}");
                            compared += 1;
                            deep[kind] += usize::from(first_fit.is_some_and(|(i, _)| i > 8));
                        }
                    }
                }
            }
        }
        assert!(
            deep.iter().all(|d| *d > 100),
            "primaries found deep in the candidates: {deep:?} of {compared}"
        );
    }
}
