//! The synthetic forward: prefill digest per rank, the all-reduce of rank digests, the
//! first output token, and decode steps. Deterministic; it reads only the buffers it is
//! given and the token ids.
//!
//! The reduced digest is a wrapping sum, over every row the final position attends, of a
//! position-bound row digest, whichever tier a row came from:
//! - Full groups: every row of `[0, end)`; context rows are digested as supplied.
//! - Sliding window: the rows of `[end - window, end)`. Supplied context rows older than
//!   that still shape the new tokens in a real model (through deeper layers); here each
//!   adds `digest(supplied) - digest(expected)`, zero exactly when it is right.
//! - State: the state after the last token. The supplied checkpoint at the boundary adds
//!   `digest(supplied) - digest(expected)` the same way.
//!
//! So with correct context bytes the output equals recomputation from scratch (any chunk
//! boundary, any TP size), and any wrong byte of any supplied block changes it (up to a
//! 64-bit hash collision). Each rank sums only its heads; summing the ranks' partials
//! (wrapping, like an all-reduce SUM) equals the single-rank sum.

use super::kv::{fill_prng, row_digest, row_digest_units, row_seed, Shard};
use super::profile::GroupKind;
use super::synthetic::SyntheticModel;
use super::ModelError;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The supplied context KV of one group: the blocks `required_blocks(group, context)`
/// names, in order, each exactly `block_len` bytes, from whatever tier it was restored.
/// `units`, when not empty, holds one entry per block: the `kv::unit_hash` of each
/// `digest_unit` of that block's bytes, recorded when the bytes were produced or restored;
/// the digest then reads the hashes instead of the bytes (the same value).
#[derive(Clone, Debug, Default)]
pub struct GroupContext<'a> {
    pub blocks: Vec<&'a [u8]>,
    pub units: Vec<&'a [u64]>,
}

/// The unit hashes of the blocks a step just wrote in one group (`written_blocks(group,
/// context, tokens)`, in order, from `first_block`), recorded from the bytes written: the
/// new rows' digests are read from them instead of generating each row a second time.
/// Empty: the new rows are generated for the digest.
#[derive(Clone, Debug, Default)]
pub struct GroupWritten<'a> {
    pub first_block: u64,
    pub units: Vec<&'a [u64]>,
}

pub use messages::RankDigest;

/// The all-reduced digest of a prefill (every shard's rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ReducedDigest {
    pub tokens: u64,
    pub value: u64,
}

/// What a decode step carries forward.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct DecodeState {
    pub digest: u64,
}

const FIRST_TOKEN_SEED: u64 = 0x7473_6c33_6669_7273;
const DECODE_SEED: u64 = 0x7473_6c33_6465_636f;
const SCORE_SEED: u64 = 0x7473_6c33_7363_6f72;

impl SyntheticModel {
    /// This rank's partial digest of a prefill of `tokens` (the whole prompt) whose first
    /// `context_len` tokens come from `context` (one entry per group, in group order).
    pub fn prefill_rank(
        &self,
        shard: Shard,
        tokens: &[u32],
        context_len: u64,
        context: &[GroupContext<'_>],
    ) -> Result<RankDigest, ModelError> {
        self.prefill_rank_written(shard, tokens, context_len, context, &[])
    }

    /// `prefill_rank` where the step's new rows are already written: `written` (empty, or
    /// one entry per group) holds the written blocks' unit hashes, and the new rows of
    /// full and sliding-window groups are digested from them. Equal to `prefill_rank` when
    /// the written bytes are the model's.
    pub fn prefill_rank_written(
        &self,
        shard: Shard,
        tokens: &[u32],
        context_len: u64,
        context: &[GroupContext<'_>],
        written: &[GroupWritten<'_>],
    ) -> Result<RankDigest, ModelError> {
        let end = tokens.len() as u64;
        if context_len >= end {
            return Err(ModelError::NoNewTokens {
                context: context_len,
                tokens: end,
            });
        }
        let groups = self.profile().groups.len();
        if context.len() != groups {
            return Err(ModelError::ContextGroups {
                expected: groups,
                got: context.len(),
            });
        }
        // every group's boundary rule first, so the error names the real cause
        for g in 0..groups {
            self.required_blocks(g, context_len)?;
        }
        if !written.is_empty() && written.len() != groups {
            return Err(ModelError::ContextGroups {
                expected: groups,
                got: written.len(),
            });
        }
        let none = GroupWritten::default();
        let mut sum = 0u64;
        for (g, ctx) in context.iter().enumerate() {
            let w = written.get(g).unwrap_or(&none);
            sum = sum.wrapping_add(self.group_partial(g, shard, tokens, context_len, ctx, w)?);
        }
        Ok(RankDigest {
            shard,
            tokens: end,
            value: sum,
        })
    }

    fn group_partial(
        &self,
        g: usize,
        shard: Shard,
        tokens: &[u32],
        c: u64,
        ctx: &GroupContext<'_>,
        written: &GroupWritten<'_>,
    ) -> Result<u64, ModelError> {
        let (spec, heads) = self.spec_heads(g, shard)?;
        let seed = self.seed(g)?;
        let chain = self.chain(g, tokens)?;
        let end = tokens.len() as u64;
        let required = self.required_blocks(g, c)?;
        if ctx.blocks.len() as u64 != required.end - required.start {
            return Err(ModelError::ContextBlocks {
                group: g,
                expected: (required.end - required.start) as usize,
                got: ctx.blocks.len(),
            });
        }
        for (k, block) in ctx.blocks.iter().enumerate() {
            let b = required.start + k as u64;
            let expected = self.block_len(g, b, c, shard)?;
            if block.len() as u64 != expected {
                return Err(ModelError::ContextBlockLength {
                    group: g,
                    block: b,
                    expected,
                    got: block.len() as u64,
                });
            }
        }
        let unit = self.digest_unit();
        if !ctx.units.is_empty() {
            let matches = ctx.units.len() == ctx.blocks.len()
                && ctx
                    .units
                    .iter()
                    .zip(&ctx.blocks)
                    .all(|(u, b)| u.len() * unit == b.len());
            if !matches {
                return Err(ModelError::ContextUnits { group: g });
            }
        }
        let row = spec.bytes_per_head as usize;
        let row_units = row / unit;
        let first_head = shard.index * heads;
        let mut scratch = vec![0u8; row];
        // the digest of the `i`-th row of context block `k`: from its recorded unit hashes
        // when the caller supplied them, else from its bytes
        let supplied = |k: usize, i: usize, pos: u64, head: u32, state: bool| -> u64 {
            match ctx.units.get(k) {
                Some(units) => row_digest_units(
                    seed,
                    pos,
                    head,
                    state,
                    units[i * row_units..(i + 1) * row_units].iter().copied(),
                ),
                None => row_digest(
                    seed,
                    pos,
                    head,
                    state,
                    &ctx.blocks[k][i * row..(i + 1) * row],
                    unit,
                ),
            }
        };
        let mut sum = 0u64;
        let hash_at = |p: u64| {
            chain
                .after(p as usize)
                .ok_or(ModelError::BlockBeyondPrefix {
                    group: g,
                    block: p,
                    tokens: end,
                })
        };
        let mut expected_digest = |h: u64, pos: u64, head: u32, state: bool| {
            fill_prng(row_seed(h, head, state), &mut scratch);
            row_digest(seed, pos, head, state, &scratch, unit)
        };
        match spec.kind {
            GroupKind::Full | GroupKind::SlidingWindow { .. } => {
                let final_start = match spec.kind {
                    GroupKind::SlidingWindow { window } => end.saturating_sub(window),
                    _ => 0,
                };
                for (k, block) in ctx.blocks.iter().enumerate() {
                    let start = (required.start + k as u64) * spec.block_tokens;
                    let positions = block.len() / (heads as usize * row).max(1);
                    for t in 0..positions {
                        let p = start + t as u64;
                        for j in 0..heads as usize {
                            let head = first_head + j as u32;
                            let i = t * heads as usize + j;
                            sum = sum.wrapping_add(supplied(k, i, p, head, false));
                            if p < final_start {
                                let e = expected_digest(hash_at(p + 1)?, p, head, false);
                                sum = sum.wrapping_sub(e);
                            }
                        }
                    }
                }
                // a new row's digest: from the unit hashes recorded when the step wrote it,
                // else from the row generated again
                let per_row = row_units * heads as usize;
                let written_row = |p: u64, j: usize| -> Option<&[u64]> {
                    let b = (p / spec.block_tokens).checked_sub(written.first_block)?;
                    let units = written.units.get(b as usize)?;
                    let t = (p % spec.block_tokens) as usize;
                    let at = t * per_row + j * row_units;
                    units.get(at..at + row_units)
                };
                for p in c.max(final_start)..end {
                    for j in 0..heads {
                        let head = first_head + j;
                        let d = match written_row(p, j as usize) {
                            Some(units) => {
                                row_digest_units(seed, p, head, false, units.iter().copied())
                            }
                            None => expected_digest(hash_at(p + 1)?, p, head, false),
                        };
                        sum = sum.wrapping_add(d);
                    }
                }
            }
            GroupKind::State { .. } => {
                if let Some(block) = ctx.blocks.first() {
                    let h = hash_at(c)?;
                    for j in 0..block.len() / row.max(1) {
                        let head = first_head + j as u32;
                        sum = sum.wrapping_add(supplied(0, j, c, head, true));
                        sum = sum.wrapping_sub(expected_digest(h, c, head, true));
                    }
                }
                let h = hash_at(end)?;
                for j in 0..heads {
                    sum = sum.wrapping_add(expected_digest(h, end, first_head + j, true));
                }
            }
        }
        Ok(sum)
    }

    /// The all-reduce of the ranks' partials: every shard of one TP size exactly once, all
    /// for the same prompt length; wrapping sum.
    pub fn reduce_ranks(&self, parts: &[RankDigest]) -> Result<ReducedDigest, ModelError> {
        let first = parts
            .first()
            .ok_or_else(|| ModelError::Reduce("no rank digests".into()))?;
        let count = first.shard.count;
        if parts.len() != count as usize {
            return Err(ModelError::Reduce(format!(
                "{} rank digests for {} shards",
                parts.len(),
                count
            )));
        }
        let mut seen = vec![false; count as usize];
        let mut value = 0u64;
        for p in parts {
            if p.shard.count != count || p.tokens != first.tokens {
                return Err(ModelError::Reduce(
                    "ranks disagree on shards or tokens".into(),
                ));
            }
            let slot = seen.get_mut(p.shard.index as usize).ok_or_else(|| {
                ModelError::Reduce(format!("shard {} out of range", p.shard.index))
            })?;
            if *slot {
                return Err(ModelError::Reduce(format!(
                    "shard {} reported twice",
                    p.shard.index
                )));
            }
            *slot = true;
            value = value.wrapping_add(p.value);
        }
        Ok(ReducedDigest {
            tokens: first.tokens,
            value,
        })
    }

    /// The state of a reduced prefill: what the first output token is drawn from.
    pub fn first_state(&self, reduced: ReducedDigest) -> DecodeState {
        let mut buf = [0u8; 16];
        buf[..8].copy_from_slice(&reduced.value.to_le_bytes());
        buf[8..].copy_from_slice(&reduced.tokens.to_le_bytes());
        DecodeState {
            digest: xxh3_64_with_seed(&buf, FIRST_TOKEN_SEED),
        }
    }

    /// The state after `token` followed `state`: what the next token is drawn from.
    pub fn next_state(&self, state: DecodeState, token: u32) -> DecodeState {
        DecodeState {
            digest: xxh3_64_with_seed(&token.to_le_bytes(), state.digest ^ DECODE_SEED),
        }
    }

    /// The first output token of a reduced prefill (greedy), and the state decode
    /// continues from.
    pub fn first_token(&self, reduced: ReducedDigest) -> (u32, DecodeState) {
        let state = self.first_state(reduced);
        (self.greedy_token(state), state)
    }

    /// One greedy decode step: the next token from the previous state and the last token.
    pub fn decode(&self, state: DecodeState, token: u32) -> (u32, DecodeState) {
        let next = self.next_state(state, token);
        (self.greedy_token(next), next)
    }

    /// The highest-scoring token of a state (`scores`' argmax).
    pub fn greedy_token(&self, state: DecodeState) -> u32 {
        (state.digest % self.profile().vocab.max(1) as u64) as u32
    }

    /// The synthetic model's scores over its vocabulary at a state, for sampling and
    /// log-probabilities: every token a deterministic score in [0, 8) from the state, the
    /// greedy token 9 (so the argmax is `greedy_token`). Built only for requests that
    /// sample or ask for log-probabilities.
    pub fn scores(&self, state: DecodeState) -> Vec<f32> {
        let vocab = self.profile().vocab.max(1);
        let top = self.greedy_token(state);
        (0..vocab)
            .map(|t| {
                if t == top {
                    9.0
                } else {
                    let h = xxh3_64_with_seed(&t.to_le_bytes(), state.digest ^ SCORE_SEED);
                    (h >> 40) as f32 / (1u64 << 24) as f32 * 8.0
                }
            })
            .collect()
    }

    /// Single-rank prefill (TP = 1) with supplied context.
    pub fn prefill(
        &self,
        tokens: &[u32],
        context_len: u64,
        context: &[GroupContext<'_>],
    ) -> Result<(u32, DecodeState), ModelError> {
        let part = self.prefill_rank(Shard::SINGLE, tokens, context_len, context)?;
        Ok(self.first_token(self.reduce_ranks(&[part])?))
    }

    /// Recomputation from scratch on one rank: `max_tokens` output tokens of `tokens`.
    pub fn recompute_output(
        &self,
        tokens: &[u32],
        max_tokens: usize,
    ) -> Result<Vec<u32>, ModelError> {
        let empty = vec![GroupContext::default(); self.profile().groups.len()];
        let (mut tok, mut state) = self.prefill(tokens, 0, &empty)?;
        let mut out = Vec::with_capacity(max_tokens);
        while out.len() < max_tokens {
            out.push(tok);
            (tok, state) = self.decode(state, tok);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: u32) -> Vec<u32> {
        (0..n).map(|i| (i * 31 + 11) % 997).collect()
    }

    /// The context blocks of every group at `c`, computed from tokens (a correct restore).
    fn context_of(m: &SyntheticModel, tokens: &[u32], c: u64, shard: Shard) -> Vec<Vec<Vec<u8>>> {
        (0..m.profile().groups.len())
            .map(|g| {
                m.required_blocks(g, c)
                    .unwrap()
                    .map(|b| {
                        m.kv_block_bytes(g, &tokens[..c as usize], b, shard)
                            .unwrap()
                    })
                    .collect()
            })
            .collect()
    }

    fn as_ctx(blocks: &[Vec<Vec<u8>>]) -> Vec<GroupContext<'_>> {
        blocks
            .iter()
            .map(|g| GroupContext {
                blocks: g.iter().map(|b| b.as_slice()).collect(),
                units: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn restored_prefix_matches_recomputation_for_every_profile_and_boundary() {
        for name in ["tiny", "hybrid-swa", "hybrid-state"] {
            let m = SyntheticModel::by_name(name).unwrap();
            let t = toks(27);
            let recompute = m.recompute_output(&t, 4).unwrap();
            // Nonaligned boundaries too: a partial history block and, for State, the tail
            // checkpoint taken exactly there.
            for c in [0u64, 4, 8, 10, 12, 16, 21, 24, 26] {
                let blocks = context_of(&m, &t, c, Shard::SINGLE);
                let (first, state) = m.prefill(&t, c, &as_ctx(&blocks)).unwrap();
                assert_eq!(first, recompute[0], "{name} boundary {c}");
                assert_eq!(m.decode(state, first).0, recompute[1]);
            }
        }
    }

    #[test]
    fn one_flipped_byte_of_any_context_block_changes_the_first_token() {
        for name in ["tiny", "hybrid-swa", "hybrid-state"] {
            let m = SyntheticModel::by_name(name).unwrap();
            let t = toks(30);
            for c in [16, 21] {
                let good = context_of(&m, &t, c, Shard::SINGLE);
                let (want, _) = m.prefill(&t, c, &as_ctx(&good)).unwrap();
                let mut checked = 0;
                for g in 0..good.len() {
                    for b in 0..good[g].len() {
                        for i in [0, good[g][b].len() / 2, good[g][b].len() - 1] {
                            let mut bad = good.clone();
                            bad[g][b][i] ^= 0x01;
                            let (got, _) = m.prefill(&t, c, &as_ctx(&bad)).unwrap();
                            assert_ne!(got, want, "{name} group {g} block {b} byte {i}");
                            checked += 1;
                        }
                    }
                }
                assert!(checked >= 3, "{name}: {checked} flips");
                // swapping two blocks is a wrong restore too
                if good[0].len() >= 2 {
                    let mut swapped = good.clone();
                    swapped[0].swap(0, 1);
                    let (got, _) = m.prefill(&t, c, &as_ctx(&swapped)).unwrap();
                    assert_ne!(got, want);
                }
            }
        }
    }

    #[test]
    fn multi_rank_reduction_equals_single_rank() {
        for name in ["tiny", "hybrid-swa", "hybrid-state"] {
            let m = SyntheticModel::by_name(name).unwrap();
            let t = toks(21);
            let c = 8;
            let single = m.prefill(&t, c, &as_ctx(&context_of(&m, &t, c, Shard::SINGLE)));
            let parts: Vec<RankDigest> = (0..2)
                .map(|r| {
                    let s = Shard::new(r, 2);
                    let blocks = context_of(&m, &t, c, s);
                    m.prefill_rank(s, &t, c, &as_ctx(&blocks)).unwrap()
                })
                .collect();
            assert_ne!(parts[0].value, parts[1].value);
            let reduced = m.reduce_ranks(&parts).unwrap();
            assert_eq!(m.first_token(reduced), single.unwrap());
            let rev = [parts[1], parts[0]];
            assert_eq!(m.reduce_ranks(&rev).unwrap(), reduced);
            assert!(m.reduce_ranks(&[parts[0]]).is_err());
            assert!(m.reduce_ranks(&[parts[0], parts[0]]).is_err());
            assert!(m.reduce_ranks(&[]).is_err());
        }
    }

    #[test]
    fn malformed_context_is_an_error() {
        let m = SyntheticModel::by_name("tiny").unwrap();
        let t = toks(10);
        let good = context_of(&m, &t, 8, Shard::SINGLE);
        assert!(matches!(
            m.prefill(&t, 8, &[]),
            Err(ModelError::ContextGroups { .. })
        ));
        let one = vec![vec![good[0][0].clone()]];
        assert!(matches!(
            m.prefill(&t, 8, &as_ctx(&one)),
            Err(ModelError::ContextBlocks { .. })
        ));
        let mut short = good.clone();
        short[0][1].pop();
        assert!(matches!(
            m.prefill(&t, 8, &as_ctx(&short)),
            Err(ModelError::ContextBlockLength { .. })
        ));
        assert!(matches!(
            m.prefill(&t, 10, &as_ctx(&good)),
            Err(ModelError::NoNewTokens { .. })
        ));
        let s = SyntheticModel::by_name("hybrid-state").unwrap();
        // A nonaligned boundary needs the tail checkpoint taken exactly there.
        let mut no_checkpoint = context_of(&s, &t, 4, Shard::SINGLE);
        assert_eq!(no_checkpoint[1].len(), 1, "the tail checkpoint at 4");
        no_checkpoint[1].clear();
        assert!(matches!(
            s.prefill(&t, 4, &as_ctx(&no_checkpoint)),
            Err(ModelError::ContextBlocks { group: 1, .. })
        ));
    }

    #[test]
    fn outputs_depend_on_the_prompt_and_stay_in_vocab() {
        let m = SyntheticModel::by_name("tiny").unwrap();
        let a = m.recompute_output(&toks(9), 8).unwrap();
        assert_eq!(a, m.recompute_output(&toks(9), 8).unwrap());
        let mut other = toks(9);
        other[0] += 1;
        assert_ne!(a, m.recompute_output(&other, 8).unwrap());
        assert!(a.iter().all(|t| *t < 1000));
        assert_eq!(a.len(), 8);
    }
}
