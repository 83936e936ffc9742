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
/// the included-block record, the extra-blocks list and the packing's own two lists.
#[derive(Debug, Default)]
pub struct PackScratch {
    inc: Included,
    extra: Vec<RequiredBlock>,
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
    let fits = |c: Candidate| {
        let t = table.tally(c);
        let charge =
            t.blocks_at(Have::Missing) + t.blocks_at(Have::Assumed) + t.blocks_at(Have::Host);
        let keys = t.keys_at(Have::Missing);
        (
            keys <= credits.keys && charge <= credits.host_blocks,
            keys,
            charge,
        )
    };
    let (pi, (_, _, charge)) = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (i, fits(*c)))
        .find(|(_, f)| f.0)?;
    let PackScratch {
        inc,
        extra,
        boundaries,
        blocks,
    } = scratch;
    inc.reset(table);
    boundaries.clear();
    blocks.clear();
    let mut keys = 0;
    for &c in &candidates[pi..] {
        // A fallback is reserved alone: its own Host charge must fit.
        if !boundaries.is_empty() && fits(c).2 > credits.host_blocks {
            continue;
        }
        extra_blocks(table, index, inc, c, extra);
        let extra_keys: u32 = extra
            .iter()
            .map(|b| table.pages(b.addr.group as usize))
            .sum();
        if keys + extra_keys > credits.keys {
            continue;
        }
        include(table, inc, c, extra);
        keys += extra_keys;
        blocks.extend_from_slice(extra);
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

/// The missing blocks `c` requires that are not yet included, by group then position
/// (into `out`, emptied first).
fn extra_blocks(
    table: &MatchTable,
    index: &PromptIndex,
    inc: &Included,
    c: Candidate,
    out: &mut Vec<RequiredBlock>,
) {
    out.clear();
    for g in 0..table.group_count() {
        let (s, e, tail) = table.requirement(g, c.boundary);
        let (clo, chi) = inc.groups[g].covered;
        if !(s >= clo && e <= chi) {
            for k in s..e {
                if table.have(g, k) == Have::Missing && !inc.has(g, k) {
                    out.push(RequiredBlock {
                        addr: super::keys::BlockAddr::new(g, index.block_hash(g, k)),
                        slot: BlockSlot::Full(k),
                        block_index: k as u64,
                        have: Have::Missing,
                    });
                }
            }
        }
        if tail {
            if let Some((addr, Have::Missing)) = table.tail_block(c, g) {
                if !inc.tails.contains(&(addr.group, addr.hash)) {
                    out.push(RequiredBlock {
                        addr,
                        slot: BlockSlot::Tail,
                        block_index: e as u64,
                        have: Have::Missing,
                    });
                }
            }
        }
    }
}

fn include(table: &MatchTable, inc: &mut Included, c: Candidate, extra: &[RequiredBlock]) {
    for b in extra {
        match b.slot {
            BlockSlot::Full(k) => inc.set(b.addr.group as usize, k),
            BlockSlot::Tail => {
                if !inc.tails.contains(&(b.addr.group, b.addr.hash)) {
                    inc.tails.push((b.addr.group, b.addr.hash));
                }
            }
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
