//! Prefix identity: the chained content hash of every block of every group, the block
//! address (group, content hash) and the object keys of a block's pages.
//!
//! A block's content hash is xxh3-128 over (parent hash, token count, tokens), so it names
//! the whole prefix chain up to the block's end. Keys are
//! `Namespace::key(content hash, group, page, shard)`. This module never derives anything
//! from Host allocation IDs, slot indices or cyclic owner ranks.

use super::geometry::{CacheGeometry, ChainLayout};
use messages::{Namespace, StorageKey};
use std::hash::{BuildHasher, Hasher};
use xxhash_rust::xxh3::xxh3_128;

/// A 128-bit content hash, stored as two u64 halves (8-byte alignment keeps pool entries
/// small). Ordering equals the ordering of the u128 value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ContentHash {
    hi: u64,
    lo: u64,
}

impl ContentHash {
    /// The parent of the first block of every chain.
    pub const ROOT: ContentHash = ContentHash { hi: 0, lo: 0 };

    pub fn from_u128(v: u128) -> Self {
        Self {
            hi: (v >> 64) as u64,
            lo: v as u64,
        }
    }

    pub fn as_u128(self) -> u128 {
        ((self.hi as u128) << 64) | self.lo as u128
    }
}

impl std::hash::Hash for ContentHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Already uniformly distributed: one word suffices for table lookups.
        state.write_u64(self.lo ^ self.hi.rotate_left(17));
    }
}

/// A pass-through hasher for `ContentHash` keys (lookups only; results never depend on a
/// map's iteration order).
#[derive(Clone, Copy, Default)]
pub struct ContentHasher(u64);

impl Hasher for ContentHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

/// Builds `ContentHasher`s.
#[derive(Clone, Copy, Default)]
pub struct BuildContentHasher;

impl BuildHasher for BuildContentHasher {
    type Hasher = ContentHasher;
    fn build_hasher(&self) -> ContentHasher {
        ContentHasher(0)
    }
}

/// One step of the chain: the hash of `tokens` appended to the prefix named by `parent`.
/// The token count is hashed too, so a partial (tail) block never aliases a full one.
pub fn chain_hash(scratch: &mut Vec<u8>, parent: ContentHash, tokens: &[u32]) -> ContentHash {
    // Small blocks hash from a stack buffer (no allocation); larger ones use `scratch`.
    const STACK: usize = 256;
    let need = 20 + 4 * tokens.len();
    if need <= STACK {
        let mut buf = [0u8; STACK];
        buf[..8].copy_from_slice(&parent.hi.to_le_bytes());
        buf[8..16].copy_from_slice(&parent.lo.to_le_bytes());
        buf[16..20].copy_from_slice(&(tokens.len() as u32).to_le_bytes());
        for (i, t) in tokens.iter().enumerate() {
            buf[20 + 4 * i..24 + 4 * i].copy_from_slice(&t.to_le_bytes());
        }
        return ContentHash::from_u128(xxh3_128(&buf[..need]));
    }
    scratch.clear();
    scratch.reserve(need);
    scratch.extend_from_slice(&parent.hi.to_le_bytes());
    scratch.extend_from_slice(&parent.lo.to_le_bytes());
    scratch.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        scratch.extend_from_slice(&t.to_le_bytes());
    }
    ContentHash::from_u128(xxh3_128(scratch))
}

/// A block of one group, addressed by its content hash (a full block or a tail block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockAddr {
    pub group: u32,
    pub hash: ContentHash,
}

impl BlockAddr {
    pub fn new(group: usize, hash: ContentHash) -> Self {
        Self {
            group: group as u32,
            hash,
        }
    }
}

/// The object key of page `page` of a block.
pub fn page_key(
    ns: &Namespace,
    geometry: &CacheGeometry,
    addr: BlockAddr,
    page: u32,
) -> StorageKey {
    let shard = geometry.key_shard(addr.group as usize);
    ns.key(addr.hash.as_u128(), addr.group, page, shard)
}

/// The per-prompt chain hashes of every group (groups sharing a block size share one chain)
/// plus the LCM parent chain that names tails. Built once per prompt; `limited` views a
/// shorter prefix of the same hashes (a chain's first k hashes do not depend on what
/// follows), so a request hashes its prompt once however many boundaries it asks about.
///
/// The hashes are one shared list, chain after chain (the geometry's `ChainLayout` says
/// which chain each group uses; every chain begins at ROOT, which is not stored; chain c
/// holds `hashed / sizes[c]` hashes): an index is one allocation, and reading it long after
/// it was made (admission of a request prepared at arrival) waits for one cold line, then
/// reads on (a 32-token prompt's 8 hashes of 4-token blocks and the list's 16 bytes of
/// reference counts: 144 bytes).
#[derive(Clone, Debug)]
pub struct PromptIndex {
    /// Tokens this view covers (a prefix of the hashed ones).
    len: u32,
    /// Tokens hashed: the extent of every chain in `hashes`.
    hashed: u32,
    layout: std::sync::Arc<ChainLayout>,
    /// Chain c's hash after k >= 1 full blocks: `hashes[start(c) + k - 1]`.
    hashes: std::sync::Arc<[ContentHash]>,
    /// One tail identity worked out ahead (`with_tail_at`): its boundary and hash. Every
    /// view keeps it; `tail_identity` at that boundary hashes nothing.
    known_tail: Option<(u32, ContentHash)>,
}

impl PromptIndex {
    /// Hashes the first `upto` tokens (clamped to the prompt) for every group.
    pub fn new(geometry: &CacheGeometry, tokens: &[u32], upto: u32) -> Self {
        let len = upto.min(tokens.len() as u32);
        let layout = geometry.chain_layout();
        let total: usize = layout.sizes.iter().map(|&b| (len / b) as usize).sum();
        // One allocation of the final size (a repeated value is an exact-size source),
        // written in place while no other reference to it exists yet.
        let mut hashes: std::sync::Arc<[ContentHash]> =
            std::iter::repeat_n(ContentHash::ROOT, total).collect();
        let Some(out) = std::sync::Arc::get_mut(&mut hashes) else {
            unreachable!("an Arc just made has one owner");
        };
        let mut scratch = Vec::new();
        let mut at = 0;
        for &b in &layout.sizes {
            let mut h = ContentHash::ROOT;
            for block in tokens[..len as usize].chunks_exact(b as usize) {
                h = chain_hash(&mut scratch, h, block);
                out[at] = h;
                at += 1;
            }
        }
        Self {
            len,
            hashed: len,
            layout: layout.clone(),
            hashes,
            known_tail: None,
        }
    }

    /// Folds one hash of each of the list's first four cache lines (a read ahead: the
    /// caller issues the loads of an index made long ago beside its other cold reads).
    pub fn first_lines(&self) -> u64 {
        self.hashes
            .iter()
            .step_by(4)
            .take(4)
            .fold(0, |acc, h| acc ^ h.lo)
    }

    /// Where chain `c` starts in `hashes`.
    #[inline]
    fn start(&self, c: usize) -> usize {
        self.layout.sizes[..c]
            .iter()
            .map(|&b| (self.hashed / b) as usize)
            .sum()
    }

    /// Where chain `c` ends in `hashes` (the last chain ends the list).
    #[inline]
    fn end(&self, c: usize) -> usize {
        if c + 1 >= self.layout.sizes.len() {
            self.hashes.len()
        } else {
            self.start(c + 1)
        }
    }

    /// Chain `c`'s hash after `k` full blocks (ROOT for none; `k` within the chain: the
    /// caller's index covers it).
    #[inline]
    fn chain_prefix(&self, c: usize, k: u32) -> ContentHash {
        match k {
            0 => ContentHash::ROOT,
            k => self.chain_block(c, k - 1),
        }
    }

    /// Chain `c`'s hash of block `k` (after k + 1 full blocks; within the chain).
    #[inline]
    fn chain_block(&self, c: usize, k: u32) -> ContentHash {
        let i = self.start(c) + k as usize;
        debug_assert!(i < self.end(c));
        self.hashes[i]
    }

    /// Chain `c`'s hashes after 1, 2, ... full blocks.
    #[inline]
    fn chain_blocks(&self, c: usize) -> &[ContentHash] {
        &self.hashes[self.start(c)..self.end(c)]
    }

    /// The same index, with the tail identity at `boundary` worked out now (a request
    /// asks about its reusable bound at QUERY planning, reservation and admission).
    /// Unchanged when `boundary` is aligned to the parent block or past the index.
    pub fn with_tail_at(mut self, tokens: &[u32], boundary: u32) -> Self {
        if boundary > 0
            && boundary <= self.len
            && !boundary.is_multiple_of(self.layout.parent_tokens)
        {
            let h = self.hash_tail(&mut Vec::new(), tokens, boundary);
            self.known_tail = Some((boundary, h));
        }
        self
    }

    /// The same hashes viewed up to `upto` tokens (clamped to this index): what
    /// `PromptIndex::new(geometry, tokens, upto)` would build, without hashing again.
    pub fn limited(&self, upto: u32) -> PromptIndex {
        PromptIndex {
            len: upto.min(self.len),
            ..self.clone()
        }
    }

    /// Tokens covered by this index.
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Complete blocks of group `g` inside the index.
    pub fn full_blocks(&self, g: usize) -> u32 {
        self.len / self.layout.block_tokens[g]
    }

    /// The content hash of block `k` (0-based, complete) of group `g`.
    pub fn block_hash(&self, g: usize, k: u32) -> ContentHash {
        self.chain_block(self.layout.group_chain[g], k)
    }

    /// The content hashes of group `g`'s complete blocks inside the index, block 0 first
    /// (`block_hash(g, k)` is element k).
    #[inline]
    pub fn block_hashes(&self, g: usize) -> &[ContentHash] {
        let chain = self.chain_blocks(self.layout.group_chain[g]);
        let n = (self.full_blocks(g) as usize).min(chain.len());
        &chain[..n]
    }

    /// The hash of the prefix after `k` complete blocks of group `g` (k = 0: ROOT).
    pub fn prefix_hash(&self, g: usize, k: u32) -> ContentHash {
        self.chain_prefix(self.layout.group_chain[g], k)
    }

    /// Whether group `g` hashes on the LCM parent chain (its blocks are parent blocks), so
    /// that its partial block at a boundary hashes exactly as the tail identity there.
    pub fn on_parent_chain(&self, g: usize) -> bool {
        self.layout.group_chain[g] == self.layout.parent_chain
    }

    /// The LCM parent chain hash after `k` parent blocks.
    pub fn parent_hash(&self, k: u32) -> ContentHash {
        self.chain_prefix(self.layout.parent_chain, k)
    }

    pub fn parent_tokens(&self) -> u32 {
        self.layout.parent_tokens
    }

    /// The hash of group `g`'s partial block ending at `boundary` (boundary not a multiple
    /// of the group's block size, boundary <= len).
    pub fn tail_block_hash(
        &self,
        scratch: &mut Vec<u8>,
        tokens: &[u32],
        g: usize,
        boundary: u32,
    ) -> ContentHash {
        if self.on_parent_chain(g) {
            // The LCM parent chain's partial block is the tail identity there.
            return self.tail_identity(scratch, tokens, boundary);
        }
        let b = self.layout.block_tokens[g];
        let k = boundary / b;
        chain_hash(
            scratch,
            self.prefix_hash(g, k),
            &tokens[(k * b) as usize..boundary as usize],
        )
    }

    /// The tail identity at `boundary`: the LCM parent chain at the aligned boundary below
    /// it, extended by the remaining tokens (`tokens`: the prompt this index hashed).
    pub fn tail_identity(
        &self,
        scratch: &mut Vec<u8>,
        tokens: &[u32],
        boundary: u32,
    ) -> ContentHash {
        match self.known_tail {
            Some((b, h)) if b == boundary => {
                debug_assert_eq!(h, self.hash_tail(scratch, tokens, boundary));
                h
            }
            _ => self.hash_tail(scratch, tokens, boundary),
        }
    }

    fn hash_tail(&self, scratch: &mut Vec<u8>, tokens: &[u32], boundary: u32) -> ContentHash {
        let p = self.layout.parent_tokens;
        let k = boundary / p;
        chain_hash(
            scratch,
            self.parent_hash(k),
            &tokens[(k * p) as usize..boundary as usize],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::geometry::GroupSpec;
    use messages::DeploymentIdentity;

    fn geo() -> CacheGeometry {
        CacheGeometry::new(
            vec![
                GroupSpec::full("a", 4, 2, 8),
                GroupSpec::sliding_window("w", 8, 4, 1, 8),
                GroupSpec::state("s", 8, 8),
            ],
            1,
            0,
        )
        .unwrap()
    }

    /// Every chain of the one list an index keeps holds exactly its own hashes: groups of 4
    /// and 6 tokens (two chains) and the LCM parent of 12 (a third, named by no group),
    /// each checked against hashing its blocks one by one.
    #[test]
    fn each_chain_of_an_index_is_the_chain_hashed_alone() {
        let g = CacheGeometry::new(
            vec![
                GroupSpec::full("a", 4, 1, 8),
                GroupSpec::full("b", 6, 1, 8),
                GroupSpec::state("s", 4, 8),
            ],
            1,
            0,
        )
        .unwrap();
        let layout = g.chain_layout();
        assert_eq!(layout.sizes, vec![4, 6, 12]);
        assert_eq!(layout.group_chain, vec![0, 1, 0]);
        assert_eq!(layout.parent_chain, 2);
        let p: Vec<u32> = (0..40).map(|i| i * 5 % 17).collect();
        let mut s = Vec::new();
        let chain = |b: usize, k: usize, s: &mut Vec<u8>| {
            (0..k).fold(ContentHash::ROOT, |h, i| {
                chain_hash(s, h, &p[i * b..(i + 1) * b])
            })
        };
        for upto in [0, 5, 12, 23, 40] {
            let index = PromptIndex::new(&g, &p, upto);
            for (grp, b) in [(0usize, 4usize), (1, 6), (2, 4)] {
                assert_eq!(index.full_blocks(grp) as usize, upto as usize / b);
                for k in 0..index.full_blocks(grp) {
                    let want = chain(b, k as usize + 1, &mut s);
                    assert_eq!(index.block_hash(grp, k), want, "{upto} {grp} {k}");
                    assert_eq!(index.block_hashes(grp)[k as usize], want);
                    assert_eq!(index.prefix_hash(grp, k + 1), want);
                }
            }
            for k in 0..=upto / 12 {
                assert_eq!(
                    index.parent_hash(k),
                    chain(12, k as usize, &mut s),
                    "{upto} {k}"
                );
            }
        }
    }

    #[test]
    fn the_read_ahead_takes_one_hash_of_each_of_the_first_four_lines() {
        let g = CacheGeometry::new(vec![GroupSpec::full("a", 4, 1, 8)], 1, 0).unwrap();
        let p: Vec<u32> = (0..100).map(|i| i * 3 % 29).collect();
        let index = PromptIndex::new(&g, &p, 100);
        let want = [0u32, 4, 8, 12]
            .iter()
            .fold(0, |acc, &k| acc ^ index.block_hash(0, k).lo);
        assert_eq!(index.first_lines(), want);
        // A short index reads what it has; an empty one reads nothing.
        let short = PromptIndex::new(&g, &p, 20);
        let want = [0u32, 4]
            .iter()
            .fold(0, |acc, &k| acc ^ short.block_hash(0, k).lo);
        assert_eq!(short.first_lines(), want);
        assert_eq!(PromptIndex::new(&g, &p, 3).first_lines(), 0);
    }

    #[test]
    fn a_limited_view_is_the_index_of_the_shorter_prefix() {
        let g = geo();
        let p: Vec<u32> = (0..45).map(|i| i * 7 % 31).collect();
        let whole = PromptIndex::new(&g, &p, 45);
        let mut s = Vec::new();
        for upto in [0, 3, 8, 17, 24, 44, 45, 99] {
            let view = whole.limited(upto);
            let built = PromptIndex::new(&g, &p, upto);
            assert_eq!(view.len(), built.len(), "{upto}");
            for grp in 0..3 {
                assert_eq!(view.full_blocks(grp), built.full_blocks(grp), "{upto}");
                for k in 0..built.full_blocks(grp) {
                    assert_eq!(view.block_hash(grp, k), built.block_hash(grp, k));
                    assert_eq!(view.prefix_hash(grp, k), built.prefix_hash(grp, k));
                }
            }
            for k in 0..=built.len() / built.parent_tokens() {
                assert_eq!(view.parent_hash(k), built.parent_hash(k));
            }
            for b in 1..=built.len() {
                if b % 4 != 0 {
                    assert_eq!(
                        view.tail_block_hash(&mut s, &p, 0, b),
                        built.tail_block_hash(&mut s, &p, 0, b)
                    );
                }
                assert_eq!(
                    view.tail_identity(&mut s, &p, b),
                    built.tail_identity(&mut s, &p, b)
                );
            }
        }
        // a view never reaches past what was hashed
        assert_eq!(PromptIndex::new(&g, &p, 20).limited(40).len(), 20);
    }

    /// A tail identity worked out ahead is the hash of its tokens, kept by every view;
    /// other boundaries are still hashed from theirs, and a parent-chain group's partial
    /// block is the tail identity there.
    #[test]
    fn a_tail_identity_worked_out_ahead_is_the_hash_of_its_tokens() {
        let g = geo();
        let p: Vec<u32> = (0..45).map(|i| i * 11 % 37).collect();
        let plain = PromptIndex::new(&g, &p, 45);
        let mut s = Vec::new();
        let direct = |b: u32| {
            let k = b / 8;
            chain_hash(
                &mut Vec::new(),
                plain.parent_hash(k),
                &p[(k * 8) as usize..b as usize],
            )
        };
        let ahead = PromptIndex::new(&g, &p, 45).with_tail_at(&p, 44);
        assert_eq!(ahead.known_tail, Some((44, direct(44))));
        let view = ahead.limited(44);
        assert_eq!(view.known_tail, ahead.known_tail);
        assert_eq!(view.tail_identity(&mut s, &p, 44), direct(44));
        for b in [43, 41, 9, 1] {
            assert_eq!(view.tail_identity(&mut s, &p, b), direct(b), "{b}");
            assert_ne!(direct(b), direct(44), "{b}");
        }
        // Aligned (or past the index): nothing is worked out ahead.
        assert_eq!(
            PromptIndex::new(&g, &p, 45).with_tail_at(&p, 40).known_tail,
            None
        );
        assert_eq!(
            PromptIndex::new(&g, &p, 45).with_tail_at(&p, 46).known_tail,
            None
        );
        // Group 2 (8-token checkpoints) lies on the parent chain, group 0 (4-token blocks)
        // does not.
        assert!(ahead.on_parent_chain(2) && !ahead.on_parent_chain(0));
        assert_eq!(ahead.tail_block_hash(&mut s, &p, 2, 44), direct(44));
        assert_eq!(ahead.tail_block_hash(&mut s, &p, 2, 43), direct(43));
        assert_eq!(
            ahead.tail_block_hash(&mut s, &p, 0, 43),
            plain.tail_block_hash(&mut s, &p, 0, 43)
        );
        assert_ne!(ahead.tail_block_hash(&mut s, &p, 0, 43), direct(43));
    }

    #[test]
    fn chain_names_the_whole_prefix() {
        let g = geo();
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[1] = 99;
        let ia = PromptIndex::new(&g, &a, 32);
        let ib = PromptIndex::new(&g, &b, 32);
        // A change in block 0 changes every later block's hash.
        for k in 0..8 {
            assert_ne!(ia.block_hash(0, k), ib.block_hash(0, k));
        }
        // Same block size shares the chain; key group keeps them apart.
        assert_eq!(ia.block_hash(0, 3), ia.block_hash(1, 3));
        assert_eq!(ia.block_hash(2, 1), ia.parent_hash(2));
        // Deterministic.
        assert_eq!(
            ia.block_hash(2, 3),
            PromptIndex::new(&g, &a, 32).block_hash(2, 3)
        );
        // Token count is hashed: a tail never aliases.
        let mut s = Vec::new();
        let t = ia.tail_block_hash(&mut s, &a, 0, 6);
        assert_ne!(t, ia.block_hash(0, 1));
        let z = chain_hash(&mut s, ContentHash::ROOT, &[0, 0]);
        assert_ne!(z, chain_hash(&mut s, ContentHash::ROOT, &[0]));
    }

    #[test]
    fn keys_use_group_page_and_payload_replica() {
        let id = DeploymentIdentity {
            checkpoint: "c".into(),
            target_weight_version: 1,
            draft_weight_version: None,
            layout_signature: geo().layout_signature(),
            kvp: 1,
            qcp: 1,
            linear_attn_tp: 1,
            page_shard_counts: vec![],
        };
        let ns = id.namespace();
        let g = geo();
        let addr = BlockAddr::new(0, ContentHash::from_u128(0xfeed));
        let k = page_key(&ns, &g, addr, 1);
        assert_eq!(k, ns.key(0xfeed, 0, 1, 0));
        assert_eq!(
            ContentHash::from_u128(u128::MAX - 3).as_u128(),
            u128::MAX - 3
        );
    }
}
