//! SyntheticModel: a profile bound to its group seeds, and the block geometry of its KV:
//! which blocks a boundary needs, which blocks a step writes, and the exact bytes of any
//! block on any shard. Pure: callers supply every buffer.

use super::kv::{fill_prng, group_seed, row_seed, PrefixChain, Shard};
use super::profile::{GroupKind, GroupSpec, ModelProfile};
use super::ModelError;
use std::ops::Range;

#[derive(Clone, Debug)]
pub struct SyntheticModel {
    profile: ModelProfile,
    seeds: Vec<u64>,
    digest_unit: usize,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn kind_tag(kind: GroupKind) -> u64 {
    match kind {
        GroupKind::Full => 1,
        GroupKind::SlidingWindow { window } => 2 ^ (window << 8),
        GroupKind::State {
            checkpoint_interval,
        } => 3 ^ (checkpoint_interval << 8),
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b.max(1))
}

impl SyntheticModel {
    pub fn new(profile: ModelProfile) -> Self {
        let seeds = profile
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| group_seed(profile.name, i, kind_tag(g.kind)))
            .collect();
        let digest_unit = profile
            .groups
            .iter()
            .fold(0, |u, g| gcd(u, g.bytes_per_head))
            .max(1) as usize;
        Self {
            profile,
            seeds,
            digest_unit,
        }
    }

    /// The bytes a row digest hashes at a time: the greatest common divisor of every
    /// group's row size, so every row of every group is a whole number of units (see
    /// `kv::unit_hash`).
    pub fn digest_unit(&self) -> usize {
        self.digest_unit
    }

    pub fn by_name(name: &str) -> Result<Self, ModelError> {
        Ok(Self::new(ModelProfile::by_name(name)?))
    }

    pub fn profile(&self) -> &ModelProfile {
        &self.profile
    }

    pub(crate) fn seed(&self, group: usize) -> Result<u64, ModelError> {
        self.seeds
            .get(group)
            .copied()
            .ok_or(ModelError::NoSuchGroup(group))
    }

    /// The chained prefix hashes of `group` over `tokens`.
    pub fn chain(&self, group: usize, tokens: &[u32]) -> Result<PrefixChain, ModelError> {
        Ok(PrefixChain::new(self.seed(group)?, tokens))
    }

    /// The group's spec and this shard's local head count, validated.
    pub(crate) fn spec_heads(
        &self,
        group: usize,
        shard: Shard,
    ) -> Result<(GroupSpec, u32), ModelError> {
        let spec = *self.profile.group(group)?;
        let heads = spec
            .local_heads(shard.count)
            .map_err(|_| ModelError::BadShard {
                index: shard.index,
                count: shard.count,
                kv_heads: spec.kv_heads,
            })?;
        if shard.index >= shard.count {
            return Err(ModelError::BadShard {
                index: shard.index,
                count: shard.count,
                kv_heads: spec.kv_heads,
            });
        }
        Ok((spec, heads))
    }

    /// Tokens block `block` of a token group holds in a sequence of `tokens` tokens; for a
    /// State group, the checkpoint position of block `block`.
    fn block_extent(
        spec: &GroupSpec,
        group: usize,
        block: u64,
        tokens: u64,
    ) -> Result<(u64, u64), ModelError> {
        let beyond = ModelError::BlockBeyondPrefix {
            group,
            block,
            tokens,
        };
        match spec.kind {
            GroupKind::State { .. } => {
                // Block b is the checkpoint at the end of interval b, or at the sequence's
                // end for the interval in progress (a tail checkpoint).
                let start = block.checked_mul(spec.block_tokens).ok_or(beyond.clone())?;
                if start >= tokens {
                    return Err(beyond);
                }
                Ok((start.saturating_add(spec.block_tokens).min(tokens), 0))
            }
            _ => {
                let start = block.checked_mul(spec.block_tokens).ok_or(beyond.clone())?;
                if start >= tokens {
                    return Err(beyond);
                }
                Ok((start, spec.block_tokens.min(tokens - start)))
            }
        }
    }

    /// Byte length of block `block` of `group` on `shard` when the sequence has `tokens`
    /// tokens (a partial last block of a token group is shorter).
    pub fn block_len(
        &self,
        group: usize,
        block: u64,
        tokens: u64,
        shard: Shard,
    ) -> Result<u64, ModelError> {
        let (spec, heads) = self.spec_heads(group, shard)?;
        let (_, ntok) = Self::block_extent(&spec, group, block, tokens)?;
        let row = heads as u64 * spec.bytes_per_head;
        Ok(match spec.kind {
            GroupKind::State { .. } => row,
            _ => ntok * row,
        })
    }

    /// Fills `out` with block `block` of `group` on `shard` for the prefix `tokens` (the
    /// block's tokens must all be in `tokens`' range, a partial last block is allowed).
    pub fn fill_kv_block(
        &self,
        group: usize,
        tokens: &[u32],
        block: u64,
        shard: Shard,
        out: &mut [u8],
    ) -> Result<(), ModelError> {
        let chain = self.chain(group, tokens)?;
        self.fill_block_from(group, &chain, block, shard, 0, out)
    }

    /// The bytes of block `block` of `group` on `shard` for the prefix `tokens`.
    pub fn kv_block_bytes(
        &self,
        group: usize,
        tokens: &[u32],
        block: u64,
        shard: Shard,
    ) -> Result<Vec<u8>, ModelError> {
        let len = self.block_len(group, block, tokens.len() as u64, shard)?;
        let mut out = vec![0u8; len as usize];
        self.fill_kv_block(group, tokens, block, shard, &mut out)?;
        Ok(out)
    }

    /// Fills the rows of block `block` whose position is at least `from_position` (token
    /// groups; rows before it are left untouched). A State block is always filled whole.
    /// `out` is the block's full length for the chain's sequence.
    pub fn fill_block_from(
        &self,
        group: usize,
        chain: &PrefixChain,
        block: u64,
        shard: Shard,
        from_position: u64,
        out: &mut [u8],
    ) -> Result<(), ModelError> {
        let (spec, heads) = self.spec_heads(group, shard)?;
        let tokens = chain.len() as u64;
        let expected = self.block_len(group, block, tokens, shard)?;
        if out.len() as u64 != expected {
            return Err(ModelError::BufferLength {
                expected,
                got: out.len() as u64,
            });
        }
        let row = spec.bytes_per_head as usize;
        let first_head = shard.index * heads;
        let (start, ntok) = Self::block_extent(&spec, group, block, tokens)?;
        match spec.kind {
            GroupKind::State { .. } => {
                let h = chain
                    .after(start as usize)
                    .ok_or(ModelError::BlockBeyondPrefix {
                        group,
                        block,
                        tokens,
                    })?;
                for (k, r) in out.chunks_exact_mut(row).enumerate() {
                    fill_prng(row_seed(h, first_head + k as u32, true), r);
                }
            }
            _ => {
                for t in 0..ntok {
                    let p = start + t;
                    if p < from_position {
                        continue;
                    }
                    let h = chain
                        .after(p as usize + 1)
                        .ok_or(ModelError::BlockBeyondPrefix {
                            group,
                            block,
                            tokens,
                        })?;
                    let base = t as usize * heads as usize * row;
                    for k in 0..heads as usize {
                        let r = &mut out[base + k * row..base + (k + 1) * row];
                        fill_prng(row_seed(h, first_head + k as u32, false), r);
                    }
                }
            }
        }
        Ok(())
    }

    /// Blocks of `group` a request whose reused prefix ends at `boundary` must supply, in
    /// order: Full every block; SWA the blocks covering the last `window` tokens; State the
    /// checkpoint taken exactly at the boundary (none at 0): block `b/interval - 1` when
    /// aligned, else the tail checkpoint, block `b/interval`.
    pub fn required_blocks(&self, group: usize, boundary: u64) -> Result<Range<u64>, ModelError> {
        let spec = self.profile.group(group)?;
        let bt = spec.block_tokens;
        Ok(match spec.kind {
            GroupKind::Full => 0..div_ceil(boundary, bt),
            GroupKind::SlidingWindow { window } => {
                (boundary.saturating_sub(window) / bt.max(1))..div_ceil(boundary, bt)
            }
            GroupKind::State {
                checkpoint_interval,
            } => {
                if boundary == 0 {
                    0..0
                } else if checkpoint_interval == 0 {
                    return Err(ModelError::UnalignedStateBoundary {
                        group,
                        boundary,
                        interval: checkpoint_interval,
                    });
                } else if boundary.is_multiple_of(checkpoint_interval) {
                    let b = boundary / checkpoint_interval;
                    (b - 1)..b
                } else {
                    // The tail checkpoint taken exactly at a nonaligned boundary.
                    let b = boundary / checkpoint_interval;
                    b..b + 1
                }
            }
        })
    }

    /// Blocks of `group` a step from `context` to `end` tokens writes: token groups every
    /// block holding a position in `[context, end)`; State groups the checkpoint of every
    /// interval ending in `(context, end]` and, when `end` is nonaligned, the tail
    /// checkpoint at `end`.
    pub fn written_blocks(
        &self,
        group: usize,
        context: u64,
        end: u64,
    ) -> Result<Range<u64>, ModelError> {
        let spec = self.profile.group(group)?;
        let bt = spec.block_tokens.max(1);
        if end <= context {
            return Ok(0..0);
        }
        Ok((context / bt)..div_ceil(end, bt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: u32, salt: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 + salt).collect()
    }

    #[test]
    fn same_prefix_same_bytes_any_change_changes_later_blocks() {
        let m = SyntheticModel::by_name("tiny").unwrap();
        let a = toks(16, 1);
        let b0 = m.kv_block_bytes(0, &a, 0, Shard::SINGLE).unwrap();
        assert_eq!(b0.len(), 4 * 16);
        assert_eq!(b0, m.kv_block_bytes(0, &a, 0, Shard::SINGLE).unwrap());
        // a longer sequence does not change an earlier block
        assert_eq!(
            b0,
            m.kv_block_bytes(0, &toks(20, 1), 0, Shard::SINGLE).unwrap()
        );
        for changed in 0..16usize {
            let mut b = a.clone();
            b[changed] += 1;
            for block in 0..4u64 {
                let x = m.kv_block_bytes(0, &a, block, Shard::SINGLE).unwrap();
                let y = m.kv_block_bytes(0, &b, block, Shard::SINGLE).unwrap();
                let block_end = (block + 1) * 4;
                if (changed as u64) < block_end {
                    assert_ne!(x, y, "token {changed} must change block {block}");
                } else {
                    assert_eq!(x, y, "token {changed} must not change block {block}");
                }
            }
        }
    }

    #[test]
    fn shards_split_the_heads_of_the_whole_block() {
        let m = SyntheticModel::by_name("tiny").unwrap();
        let a = toks(8, 3);
        let whole = m.kv_block_bytes(0, &a, 1, Shard::SINGLE).unwrap();
        let s0 = m.kv_block_bytes(0, &a, 1, Shard::new(0, 2)).unwrap();
        let s1 = m.kv_block_bytes(0, &a, 1, Shard::new(1, 2)).unwrap();
        // layout [token][head][bytes]: shard k holds head k of every token
        for t in 0..4 {
            assert_eq!(&whole[t * 16..t * 16 + 8], &s0[t * 8..t * 8 + 8]);
            assert_eq!(&whole[t * 16 + 8..t * 16 + 16], &s1[t * 8..t * 8 + 8]);
        }
        assert!(matches!(
            m.kv_block_bytes(0, &a, 1, Shard::new(2, 2)),
            Err(ModelError::BadShard { .. })
        ));
        assert!(m.kv_block_bytes(0, &a, 1, Shard::new(0, 3)).is_err());
    }

    #[test]
    fn partial_blocks_and_bounds() {
        let m = SyntheticModel::by_name("tiny").unwrap();
        let a = toks(6, 0);
        assert_eq!(m.block_len(0, 1, 6, Shard::SINGLE).unwrap(), 2 * 16);
        let full = m.kv_block_bytes(0, &toks(8, 0), 1, Shard::SINGLE).unwrap();
        let part = m.kv_block_bytes(0, &a, 1, Shard::SINGLE).unwrap();
        assert_eq!(&full[..32], &part[..]);
        assert!(matches!(
            m.kv_block_bytes(0, &a, 2, Shard::SINGLE),
            Err(ModelError::BlockBeyondPrefix { .. })
        ));
        let mut short = [0u8; 3];
        assert!(matches!(
            m.fill_kv_block(0, &a, 0, Shard::SINGLE, &mut short),
            Err(ModelError::BufferLength { .. })
        ));
        assert!(matches!(
            m.kv_block_bytes(5, &a, 0, Shard::SINGLE),
            Err(ModelError::NoSuchGroup(5))
        ));
        assert!(m.kv_block_bytes(0, &a, u64::MAX, Shard::SINGLE).is_err());
    }

    #[test]
    fn groups_differ_and_required_sets_follow_kinds() {
        let m = SyntheticModel::by_name("hybrid-swa").unwrap();
        let a = toks(12, 5);
        assert_ne!(
            m.kv_block_bytes(0, &a, 0, Shard::SINGLE).unwrap(),
            m.kv_block_bytes(1, &a, 0, Shard::SINGLE).unwrap()
        );
        assert_eq!(m.required_blocks(0, 10).unwrap(), 0..3);
        assert_eq!(m.required_blocks(1, 10).unwrap(), 0..3); // tokens 2..10
        assert_eq!(m.required_blocks(1, 20).unwrap(), 3..5); // tokens 12..20
        assert_eq!(m.required_blocks(1, 0).unwrap(), 0..0);
        assert_eq!(m.written_blocks(1, 10, 13).unwrap(), 2..4);
        let s = SyntheticModel::by_name("hybrid-state").unwrap();
        assert_eq!(s.required_blocks(1, 16).unwrap(), 1..2);
        assert_eq!(s.required_blocks(1, 0).unwrap(), 0..0);
        // a nonaligned boundary: the tail checkpoint of the interval in progress
        assert_eq!(s.required_blocks(1, 12).unwrap(), 1..2);
        // the checkpoints at 16 and 24 and the tail checkpoint at 25
        assert_eq!(s.written_blocks(1, 8, 25).unwrap(), 1..4);
        assert_eq!(s.written_blocks(1, 8, 24).unwrap(), 1..3);
        assert_eq!(s.written_blocks(1, 8, 8).unwrap(), 0..0);
        // a checkpoint is a function of its whole prefix
        let b = toks(16, 5);
        let mut c = b.clone();
        c[0] ^= 1;
        assert_ne!(
            s.kv_block_bytes(1, &b, 1, Shard::SINGLE).unwrap(),
            s.kv_block_bytes(1, &c, 1, Shard::SINGLE).unwrap()
        );
        assert_eq!(s.block_len(1, 1, 16, Shard::SINGLE).unwrap(), 64);
        // block 1 of a 15-token sequence is the tail checkpoint at 15; block 2 is beyond
        assert_eq!(s.block_len(1, 1, 15, Shard::SINGLE).unwrap(), 64);
        assert!(s.block_len(1, 2, 15, Shard::SINGLE).is_err());
        // the tail checkpoint at 12 is the state after 12 tokens: another prefix's
        // checkpoint at the same block differs
        let long = toks(16, 5);
        assert_ne!(
            s.kv_block_bytes(1, &long[..12], 1, Shard::SINGLE).unwrap(),
            s.kv_block_bytes(1, &long[..13], 1, Shard::SINGLE).unwrap()
        );
    }
}
