//! KV byte primitives of the synthetic model: the per-group chained prefix hash, the
//! xxh3-seeded PRNG that fills a row, and the row digest. Pure functions; they never
//! allocate device or Host memory.
//!
//! A row is the bytes of one KV head for one token position (token groups), or of one head
//! of a State checkpoint. Row bytes are a function of (group, head, prefix hash at that
//! position), and the prefix hash chains every token before it: a different token anywhere
//! in the prefix changes every later row.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

pub use messages::Shard;

/// Seed of one group's prefix chain: distinct per profile, group index and kind.
pub fn group_seed(profile: &str, group: usize, kind_tag: u64) -> u64 {
    let mut text = Vec::with_capacity(profile.len() + 24);
    text.extend_from_slice(b"tsl3-synthetic/");
    text.extend_from_slice(profile.as_bytes());
    text.extend_from_slice(&(group as u64).to_le_bytes());
    text.extend_from_slice(&kind_tag.to_le_bytes());
    xxh3_64(&text)
}

/// Chained prefix hashes of one group: `after(p)` covers tokens `[0, p)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixChain {
    hashes: Vec<u64>,
}

impl PrefixChain {
    pub fn new(seed: u64, tokens: &[u32]) -> Self {
        let mut hashes = Vec::with_capacity(tokens.len() + 1);
        let mut h = seed;
        hashes.push(h);
        for t in tokens {
            h = xxh3_64_with_seed(&t.to_le_bytes(), h);
            hashes.push(h);
        }
        Self { hashes }
    }

    /// Number of tokens the chain covers.
    pub fn len(&self) -> usize {
        self.hashes.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hash of the prefix of `p` tokens (`p <= len()`).
    pub fn after(&self, p: usize) -> Option<u64> {
        self.hashes.get(p).copied()
    }
}

const STATE_TAG: u64 = 0x5354_4154_4500_0000;

/// Seed of a row: the prefix hash through the row's token (or the checkpoint position for
/// State rows) and the global head index.
pub fn row_seed(prefix_hash: u64, head: u32, state: bool) -> u64 {
    let tag = if state { STATE_TAG } else { 0 } ^ head as u64;
    xxh3_64_with_seed(&tag.to_le_bytes(), prefix_hash)
}

/// Fills `out` from a SplitMix64 stream seeded by `seed`.
pub fn fill_prng(seed: u64, out: &mut [u8]) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut chunks = out.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&next().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let v = next().to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&v[..n]);
    }
}

/// Hash of one digest unit of row bytes. A row's bytes are digested unit by unit (the
/// model's `digest_unit`, which divides every row), so a device that records unit hashes
/// when a block's bytes are produced or restored lets a forward digest that block without
/// reading its bytes again.
pub fn unit_hash(bytes: &[u8]) -> u64 {
    crate::host::bulk_hash::xxh3_64(bytes)
}

/// Digest of one row at its place from its unit hashes, in order: (group seed, position,
/// global head, kind) and bytes. Position-bound, so moving a row to another slot or
/// position changes the digest.
pub fn row_digest_units(
    group_seed: u64,
    position: u64,
    head: u32,
    state: bool,
    units: impl IntoIterator<Item = u64>,
) -> u64 {
    let mut place = [0u8; 24];
    place[..8].copy_from_slice(&position.to_le_bytes());
    place[8..16].copy_from_slice(&(head as u64).to_le_bytes());
    place[16..].copy_from_slice(&(if state { STATE_TAG } else { 0 }).to_le_bytes());
    let mut acc = xxh3_64_with_seed(&place, group_seed);
    for u in units {
        acc = xxh3_64_with_seed(&u.to_le_bytes(), acc);
    }
    acc
}

/// Digest of one row at its place, from its bytes (`unit` > 0 divides `bytes.len()`):
/// equal to `row_digest_units` over the bytes' unit hashes.
pub fn row_digest(
    group_seed: u64,
    position: u64,
    head: u32,
    state: bool,
    bytes: &[u8],
    unit: usize,
) -> u64 {
    row_digest_units(
        group_seed,
        position,
        head,
        state,
        bytes.chunks(unit.max(1)).map(unit_hash),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_every_earlier_token() {
        let a = PrefixChain::new(7, &[1, 2, 3, 4]);
        let b = PrefixChain::new(7, &[1, 9, 3, 4]);
        assert_eq!(a.after(1), b.after(1));
        for p in 2..=4 {
            assert_ne!(a.after(p), b.after(p));
        }
        assert_ne!(PrefixChain::new(8, &[1]).after(1), a.after(1));
        assert_eq!(a.len(), 4);
        assert_eq!(a.after(5), None);
    }

    #[test]
    fn prng_is_deterministic_and_seed_sensitive() {
        let mut x = [0u8; 21];
        let mut y = [0u8; 21];
        fill_prng(1, &mut x);
        fill_prng(1, &mut y);
        assert_eq!(x, y);
        fill_prng(2, &mut y);
        assert_ne!(x, y);
        assert!(x.iter().any(|b| *b != 0));
    }

    #[test]
    fn a_row_digest_from_bytes_equals_the_digest_from_its_unit_hashes() {
        let mut row = [0u8; 64];
        fill_prng(3, &mut row);
        for unit in [8usize, 16, 32, 64] {
            let units: Vec<u64> = row.chunks(unit).map(unit_hash).collect();
            assert_eq!(
                row_digest(11, 5, 2, false, &row, unit),
                row_digest_units(11, 5, 2, false, units)
            );
        }
        let d = row_digest(11, 5, 2, false, &row, 16);
        assert_ne!(d, row_digest(11, 6, 2, false, &row, 16), "position-bound");
        assert_ne!(d, row_digest(11, 5, 3, false, &row, 16), "head-bound");
        assert_ne!(d, row_digest(11, 5, 2, true, &row, 16), "kind-bound");
        row[63] ^= 1;
        assert_ne!(
            d,
            row_digest(11, 5, 2, false, &row, 16),
            "every byte counts"
        );
    }
}
