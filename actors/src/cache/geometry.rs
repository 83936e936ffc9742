//! Cache geometry: the cache groups (Full history, sliding window, State checkpoints),
//! their block sizes in tokens (mixed granularities under one LCM parent block), their
//! bytes per page and block, and page sharding with page-cyclic owner translation.
//!
//! It owns the startup validation of the layout (a head-partitioned field in a page-sharded
//! group is rejected: changing the page owner must not change what an object's bytes mean)
//! and the layout inputs of the namespace (`layout_signature`, `page_shard_counts`). It must
//! never depend on Host allocation IDs or cyclic owner ranks for anything that reaches a key.

use std::fmt::Write as _;
use std::sync::Arc;
use thiserror::Error;

/// The fixed two-slot checkpoint contract of State groups: one State block (a recurrent-state
/// checkpoint at a boundary) is exactly two pages (slots).
pub const STATE_CHECKPOINT_SLOTS: u32 = 2;

/// What a group needs at a boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// Full history: every block up to the boundary.
    Full,
    /// Sliding-window attention: only the blocks of the window's lookback.
    SlidingWindow { window_tokens: u32 },
    /// Recurrent state: a checkpoint exactly at the boundary (block size = checkpoint
    /// interval).
    State,
}

/// A field (tensor) stored in a group's pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldSpec {
    pub name: String,
    /// Whether the field is partitioned by attention heads across TP ranks.
    pub head_partitioned: bool,
}

/// One cache group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSpec {
    pub name: String,
    pub kind: GroupKind,
    /// Tokens per block (checkpoint interval for State groups).
    pub block_tokens: u32,
    /// Pages per block; each page is one storage object (key).
    pub pages_per_block: u32,
    /// Bytes per page.
    pub page_bytes: u64,
    /// Page sharding: the number of TP ranks that split a block's pages cyclically
    /// (1 = replicated).
    pub shard_count: u32,
    pub dtype: String,
    pub fields: Vec<FieldSpec>,
}

impl GroupSpec {
    fn new(name: &str, kind: GroupKind, block_tokens: u32, pages: u32, page_bytes: u64) -> Self {
        Self {
            name: name.to_string(),
            kind,
            block_tokens,
            pages_per_block: pages,
            page_bytes,
            shard_count: 1,
            dtype: "u8".to_string(),
            fields: Vec::new(),
        }
    }

    /// A Full history group.
    pub fn full(name: &str, block_tokens: u32, pages: u32, page_bytes: u64) -> Self {
        Self::new(name, GroupKind::Full, block_tokens, pages, page_bytes)
    }

    /// A sliding-window group with a window of `window_tokens`.
    pub fn sliding_window(
        name: &str,
        window_tokens: u32,
        block_tokens: u32,
        pages: u32,
        page_bytes: u64,
    ) -> Self {
        let kind = GroupKind::SlidingWindow { window_tokens };
        Self::new(name, kind, block_tokens, pages, page_bytes)
    }

    /// A State group: checkpoints every `interval_tokens`, two slots of `slot_bytes` each.
    pub fn state(name: &str, interval_tokens: u32, slot_bytes: u64) -> Self {
        let pages = STATE_CHECKPOINT_SLOTS;
        Self::new(name, GroupKind::State, interval_tokens, pages, slot_bytes)
    }

    /// The same group, page-sharded over `shard_count` ranks.
    pub fn sharded(mut self, shard_count: u32) -> Self {
        self.shard_count = shard_count;
        self
    }

    /// The same group with one more field.
    pub fn with_field(mut self, name: &str, head_partitioned: bool) -> Self {
        self.fields.push(FieldSpec {
            name: name.to_string(),
            head_partitioned,
        });
        self
    }

    pub fn with_dtype(mut self, dtype: &str) -> Self {
        self.dtype = dtype.to_string();
        self
    }

    /// Bytes of one block (all its pages).
    pub fn block_bytes(&self) -> u64 {
        self.page_bytes.saturating_mul(self.pages_per_block as u64)
    }

    pub fn is_page_sharded(&self) -> bool {
        self.shard_count > 1
    }
}

/// A startup validation error: the field and the rule it breaks.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("cache geometry {field}: {rule}")]
pub struct GeometryError {
    pub field: String,
    pub rule: String,
}

fn bad(field: impl Into<String>, rule: impl Into<String>) -> GeometryError {
    GeometryError {
        field: field.into(),
        rule: rule.into(),
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The validated geometry of one rank's cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheGeometry {
    groups: Vec<GroupSpec>,
    attention_tp_size: u32,
    attention_tp_rank: u32,
    /// The chain layout, which also holds the LCM parent block's tokens.
    chains: Arc<ChainLayout>,
}

/// Where a prompt's chain hashes go (`PromptIndex`): one chain per distinct block size of
/// the groups (groups sharing a block size share it), plus the LCM parent chain that names
/// tails when no group has the parent's block size. Worked out once per geometry and
/// shared by every prompt's index, so an index holds only its hashes.
#[derive(Debug, PartialEq, Eq)]
pub struct ChainLayout {
    /// Block tokens of each chain.
    pub sizes: Vec<u32>,
    /// The chain each group hashes on.
    pub group_chain: Vec<usize>,
    /// Block tokens of each group.
    pub block_tokens: Vec<u32>,
    /// The LCM parent chain.
    pub parent_chain: usize,
    pub parent_tokens: u32,
}

impl ChainLayout {
    fn of(groups: &[GroupSpec], parent_tokens: u32) -> Self {
        let mut sizes: Vec<u32> = Vec::new();
        let mut chain_of = |b: u32| match sizes.iter().position(|s| *s == b) {
            Some(p) => p,
            None => {
                sizes.push(b);
                sizes.len() - 1
            }
        };
        let group_chain = groups.iter().map(|g| chain_of(g.block_tokens)).collect();
        let parent_chain = chain_of(parent_tokens);
        Self {
            sizes,
            group_chain,
            block_tokens: groups.iter().map(|g| g.block_tokens).collect(),
            parent_chain,
            parent_tokens,
        }
    }
}

impl CacheGeometry {
    /// Validates the layout (startup).
    pub fn new(
        groups: Vec<GroupSpec>,
        attention_tp_size: u32,
        attention_tp_rank: u32,
    ) -> Result<Self, GeometryError> {
        if groups.is_empty() {
            return Err(bad("groups", "at least one cache group is required"));
        }
        if attention_tp_size == 0 {
            return Err(bad("attention_tp_size", "must be positive"));
        }
        if attention_tp_rank >= attention_tp_size {
            return Err(bad("attention_tp_rank", "must be below attention_tp_size"));
        }
        let mut lcm: u64 = 1;
        for (i, g) in groups.iter().enumerate() {
            let f = |x: &str| format!("groups[{i}].{x}");
            if g.block_tokens == 0 {
                return Err(bad(f("block_tokens"), "must be positive"));
            }
            if g.pages_per_block == 0 {
                return Err(bad(f("pages_per_block"), "must be positive"));
            }
            if g.page_bytes == 0 {
                return Err(bad(f("page_bytes"), "must be positive"));
            }
            match g.kind {
                GroupKind::SlidingWindow { window_tokens: 0 } => {
                    return Err(bad(f("window_tokens"), "must be positive"));
                }
                GroupKind::State if g.pages_per_block != STATE_CHECKPOINT_SLOTS => {
                    return Err(bad(
                        f("pages_per_block"),
                        "a State checkpoint has exactly two slots (fixed two-slot contract)",
                    ));
                }
                _ => {}
            }
            if g.shard_count == 0 {
                return Err(bad(f("shard_count"), "must be positive"));
            }
            if !attention_tp_size.is_multiple_of(g.shard_count) {
                return Err(bad(f("shard_count"), "must divide attention_tp_size"));
            }
            if g.is_page_sharded() {
                if let Some(field) = g.fields.iter().find(|x| x.head_partitioned) {
                    return Err(bad(
                        f("fields"),
                        format!(
                            "head-partitioned field '{}' in a page-sharded group: changing the \
                             page owner must not change what an object's bytes mean",
                            field.name
                        ),
                    ));
                }
            }
            lcm = lcm / gcd(lcm, g.block_tokens as u64) * g.block_tokens as u64;
            if lcm > u32::MAX as u64 / 4 {
                return Err(bad(f("block_tokens"), "the LCM parent block is too large"));
            }
        }
        Ok(Self {
            chains: Arc::new(ChainLayout::of(&groups, lcm as u32)),
            groups,
            attention_tp_size,
            attention_tp_rank,
        })
    }

    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    pub fn group(&self, g: usize) -> &GroupSpec {
        &self.groups[g]
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    pub fn attention_tp_rank(&self) -> u32 {
        self.attention_tp_rank
    }

    pub fn attention_tp_size(&self) -> u32 {
        self.attention_tp_size
    }

    /// Tokens of the LCM parent block: the aligned boundaries are its multiples.
    pub fn parent_tokens(&self) -> u32 {
        self.chains.parent_tokens
    }

    /// Where a prompt's chain hashes go (shared by every index of this geometry).
    pub fn chain_layout(&self) -> &Arc<ChainLayout> {
        &self.chains
    }

    /// Blocks of group `g` inside one LCM parent block.
    pub fn blocks_per_parent(&self, g: usize) -> u32 {
        self.parent_tokens() / self.groups[g].block_tokens
    }

    /// The key's shard field for group `g`: the payload replica
    /// (attention_tp_rank // shard_count). Replicated groups (shard_count 1) thereby keep
    /// rank-local keys.
    pub fn key_shard(&self, g: usize) -> u32 {
        self.attention_tp_rank / self.groups[g].shard_count
    }

    /// Page-cyclic owner translation: the TP rank (of this rank's payload replica) that owns
    /// page `page` of block `block_index` of group `g`. Pages are dealt cyclically over the
    /// group's `shard_count` ranks by their index within the group's page sequence.
    pub fn page_owner(&self, g: usize, block_index: u64, page: u32) -> u32 {
        let spec = &self.groups[g];
        let s = spec.shard_count as u64;
        let replica = self.key_shard(g) as u64;
        let global = block_index
            .wrapping_mul(spec.pages_per_block as u64)
            .wrapping_add(page as u64);
        (replica * s + global % s) as u32
    }

    /// Whether this rank copies page `page` of block `block_index` of group `g`.
    pub fn owns_page(&self, g: usize, block_index: u64, page: u32) -> bool {
        self.page_owner(g, block_index, page) == self.attention_tp_rank
    }

    /// The cache layout signature (groups, strides, dtype, fields): a namespace input.
    pub fn layout_signature(&self) -> String {
        let mut s = String::new();
        for (i, g) in self.groups.iter().enumerate() {
            if i > 0 {
                s.push(';');
            }
            let kind = match g.kind {
                GroupKind::Full => "full".to_string(),
                GroupKind::SlidingWindow { window_tokens } => format!("swa{window_tokens}"),
                GroupKind::State => "state".to_string(),
            };
            let _ = write!(
                s,
                "{kind}:b{}:p{}x{}:{}",
                g.block_tokens, g.pages_per_block, g.page_bytes, g.dtype
            );
            for f in &g.fields {
                let _ = write!(
                    s,
                    ":{}{}",
                    f.name,
                    if f.head_partitioned { "/h" } else { "" }
                );
            }
        }
        s
    }

    /// The ordered shard counts of page-sharded groups; empty when every group is
    /// replicated (all-replicated layouts keep their namespace).
    pub fn page_shard_counts(&self) -> Vec<u32> {
        if self.groups.iter().all(|g| !g.is_page_sharded()) {
            return Vec::new();
        }
        self.groups.iter().map(|g| g.shard_count).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mixed() -> Vec<GroupSpec> {
        vec![
            GroupSpec::full("attn", 16, 1, 64),
            GroupSpec::sliding_window("swa", 64, 32, 1, 32),
            GroupSpec::state("mamba", 64, 48),
        ]
    }

    #[test]
    fn lcm_parent_of_mixed_granularities() {
        let g = CacheGeometry::new(mixed(), 1, 0).unwrap();
        assert_eq!(g.parent_tokens(), 64);
        assert_eq!(g.blocks_per_parent(0), 4);
        assert_eq!(g.blocks_per_parent(1), 2);
        assert_eq!(g.blocks_per_parent(2), 1);
        let g = CacheGeometry::new(
            vec![
                GroupSpec::full("a", 16, 1, 1),
                GroupSpec::full("b", 24, 1, 1),
            ],
            1,
            0,
        )
        .unwrap();
        assert_eq!(g.parent_tokens(), 48);
    }

    #[test]
    fn startup_rejects_head_partitioned_field_in_page_sharded_group() {
        let groups = vec![GroupSpec::full("attn", 16, 4, 64)
            .sharded(2)
            .with_field("k", true)];
        let err = CacheGeometry::new(groups, 2, 0).unwrap_err();
        assert_eq!(err.field, "groups[0].fields");
        assert!(err.rule.contains("head-partitioned"), "{err}");
        // The same field is fine in a replicated group, and a latent field in a sharded one.
        let ok = vec![GroupSpec::full("attn", 16, 4, 64).with_field("k", true)];
        assert!(CacheGeometry::new(ok, 2, 0).is_ok());
        let ok = vec![GroupSpec::full("mla", 16, 4, 64)
            .sharded(2)
            .with_field("latent", false)];
        assert!(CacheGeometry::new(ok, 2, 0).is_ok());
    }

    #[test]
    fn validation_names_the_field() {
        let e = CacheGeometry::new(vec![], 1, 0).unwrap_err();
        assert_eq!(e.field, "groups");
        let e = CacheGeometry::new(vec![GroupSpec::full("a", 0, 1, 1)], 1, 0).unwrap_err();
        assert_eq!(e.field, "groups[0].block_tokens");
        let mut s = GroupSpec::state("s", 64, 8);
        s.pages_per_block = 3;
        let e = CacheGeometry::new(vec![s], 1, 0).unwrap_err();
        assert_eq!(e.field, "groups[0].pages_per_block");
        let e =
            CacheGeometry::new(vec![GroupSpec::full("a", 16, 2, 1).sharded(3)], 4, 0).unwrap_err();
        assert_eq!(e.field, "groups[0].shard_count");
        let e = CacheGeometry::new(vec![GroupSpec::full("a", 16, 2, 1)], 2, 2).unwrap_err();
        assert_eq!(e.field, "attention_tp_rank");
    }

    #[test]
    fn page_cyclic_owner_translation_and_replica_keys() {
        // TP 4, pages dealt over 2 ranks: replicas {0,1} and {2,3}.
        let groups = vec![
            GroupSpec::full("mla", 16, 3, 64).sharded(2),
            GroupSpec::state("s", 16, 8),
        ];
        for rank in 0..4u32 {
            let g = CacheGeometry::new(groups.clone(), 4, rank).unwrap();
            assert_eq!(
                g.key_shard(0),
                rank / 2,
                "sharded keys name the payload replica"
            );
            assert_eq!(
                g.key_shard(1),
                rank,
                "replicated state keeps rank-local keys"
            );
            // Every page of a block has exactly one owner inside the replica.
            for block in 0..3u64 {
                for page in 0..3u32 {
                    let owner = g.page_owner(0, block, page);
                    assert_eq!(owner / 2, rank / 2);
                    assert_eq!(owner % 2, ((block * 3 + page as u64) % 2) as u32);
                    assert_eq!(g.owns_page(0, block, page), owner == rank);
                }
                assert!(g.owns_page(1, block, 0), "replicated pages are all local");
            }
        }
    }

    #[test]
    fn layout_signature_and_shard_counts() {
        let a = CacheGeometry::new(mixed(), 1, 0).unwrap();
        assert_eq!(
            a.layout_signature(),
            "full:b16:p1x64:u8;swa64:b32:p1x32:u8;state:b64:p2x48:u8"
        );
        assert!(
            a.page_shard_counts().is_empty(),
            "all-replicated keeps namespace"
        );
        let mut groups = mixed();
        groups[0] = GroupSpec::full("attn", 16, 2, 64).sharded(2);
        let b = CacheGeometry::new(groups, 2, 1).unwrap();
        assert_eq!(b.page_shard_counts(), vec![2, 1, 1]);
        assert_ne!(a.layout_signature(), b.layout_signature());
    }
}
