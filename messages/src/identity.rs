//! Deployment identity and the L3 namespace (DESIGN.md section 5, seed 000 "Read
//! transaction" epoch paragraph and "Completion agreement" geometry paragraph).
//!
//! The namespace hash covers: checkpoint identity, target and draft weight versions, the
//! cache layout signature, KVP/QCP/linear-attention TP geometry, the ordered shard counts of
//! page-sharded groups, and runtime_compat = 2 (the single compatibility epoch). It must
//! never cover DP replica IDs, Host allocation IDs or cyclic owner ranks: the type below has
//! no field for them.

use crate::ops::StorageKey;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_128;

/// The single compatibility epoch of this implementation's producer and storage contract.
pub const RUNTIME_COMPAT: u32 = 2;

/// The literal prefix of every object key.
pub const KEY_PREFIX: &str = "tsl3-";

/// The static deployment identity, collected once at startup, plus the explicit weight
/// versions. A weight update changes only `target_weight_version` / `draft_weight_version`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentIdentity {
    /// Checkpoint identity (e.g. model name + revision).
    pub checkpoint: String,
    pub target_weight_version: u64,
    pub draft_weight_version: Option<u64>,
    /// Cache layout signature: groups, strides, dtype (see CacheGeometry::layout_signature).
    pub layout_signature: String,
    /// KV-parallel / query-context-parallel / linear-attention TP geometry.
    pub kvp: u32,
    pub qcp: u32,
    pub linear_attn_tp: u32,
    /// Ordered shard counts of page-sharded groups (empty when all groups are replicated:
    /// all-replicated layouts keep their namespace).
    pub page_shard_counts: Vec<u32>,
}

impl DeploymentIdentity {
    /// The same static identity with explicit weight versions (a weight update).
    pub fn with_weight_versions(&self, target: u64, draft: Option<u64>) -> Self {
        let mut next = self.clone();
        next.target_weight_version = target;
        next.draft_weight_version = draft;
        next
    }

    /// The namespace this identity names.
    pub fn namespace(&self) -> Namespace {
        // A canonical, versioned encoding of every included input, then a stable 128-bit hash.
        let mut canon = String::new();
        canon.push_str(&format!("runtime_compat={RUNTIME_COMPAT}\n"));
        canon.push_str(&format!("checkpoint={}\n", escape(&self.checkpoint)));
        canon.push_str(&format!("target={}\n", self.target_weight_version));
        match self.draft_weight_version {
            Some(d) => canon.push_str(&format!("draft={d}\n")),
            None => canon.push_str("draft=none\n"),
        }
        canon.push_str(&format!("layout={}\n", escape(&self.layout_signature)));
        canon.push_str(&format!(
            "kvp={} qcp={} linattn_tp={}\n",
            self.kvp, self.qcp, self.linear_attn_tp
        ));
        if !self.page_shard_counts.is_empty() {
            let counts: Vec<String> = self
                .page_shard_counts
                .iter()
                .map(|c| c.to_string())
                .collect();
            canon.push_str(&format!("shards={}\n", counts.join(",")));
        }
        let h = xxh3_128(canon.as_bytes());
        Namespace(format!("{KEY_PREFIX}{:016x}", (h >> 64) as u64 ^ (h as u64)).into())
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// An L3 namespace: `tsl3-<16 hex digits>`. Every object key starts with it, so purging a
/// namespace is a prefix removal and a rotated namespace makes old objects unreachable.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Namespace(pub Arc<str>);

impl Namespace {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The object key of one page of one block: namespace + content hash + group + page
    /// offset + shard (the payload replica, attention_tp_rank // shard_count, for
    /// page-sharded groups; the rank for replicated state groups that keep rank-local keys).
    pub fn key(&self, content_hash: u128, group: u32, page: u32, shard: u32) -> StorageKey {
        // Held as its parts (see `StorageKey`): keys are made per page on every QUERY, GET
        // and PUT, so making one shares the namespace text and copies the page's numbers.
        StorageKey::page(&self.0, content_hash, group, page, shard)
    }

    /// Whether a key belongs to this namespace.
    pub fn owns(&self, key: &StorageKey) -> bool {
        key.has_namespace_prefix(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_have_the_documented_layout() {
        let short = Namespace("tsl3-0123456789abcdef".into());
        // A long namespace: the same layout.
        let long = Namespace(format!("tsl3-{}", "x".repeat(150)).into());
        for (ns, (h, g, p, sh)) in [&short, &long].into_iter().flat_map(|ns| {
            [
                (0u128, 0u32, 0u32, 0u32),
                (u128::MAX, u32::MAX, 7, 1_000_000),
                (0x1234_5678_9abc_def0_0fed_cba9_8765_4321, 3, 10, 42),
            ]
            .map(|c| (ns, c))
        }) {
            assert_eq!(
                ns.key(h, g, p, sh).text(),
                format!("{}-{:032x}-g{}-p{}-s{}", ns.0, h, g, p, sh)
            );
        }
    }

    fn id() -> DeploymentIdentity {
        DeploymentIdentity {
            checkpoint: "synthetic/tiny@1".into(),
            target_weight_version: 1,
            draft_weight_version: None,
            layout_signature: "full:16x64:u8".into(),
            kvp: 1,
            qcp: 1,
            linear_attn_tp: 1,
            page_shard_counts: vec![],
        }
    }

    #[test]
    fn namespace_is_stable_and_prefixed() {
        let a = id().namespace();
        assert_eq!(a, id().namespace());
        assert!(a.as_str().starts_with("tsl3-"));
        assert_eq!(a.as_str().len(), 5 + 16);
    }

    #[test]
    fn every_included_input_changes_the_namespace() {
        let base = id().namespace();
        let mut variants = vec![];
        let mut v = id();
        v.checkpoint.push('x');
        variants.push(v);
        variants.push(id().with_weight_versions(2, None));
        variants.push(id().with_weight_versions(1, Some(1)));
        let mut v = id();
        v.layout_signature = "full:16x64:f16".into();
        variants.push(v);
        let mut v = id();
        v.kvp = 2;
        variants.push(v);
        let mut v = id();
        v.qcp = 2;
        variants.push(v);
        let mut v = id();
        v.linear_attn_tp = 2;
        variants.push(v);
        let mut v = id();
        v.page_shard_counts = vec![2];
        variants.push(v);
        let mut v = id();
        v.page_shard_counts = vec![2, 1];
        let mut w = id();
        w.page_shard_counts = vec![1, 2];
        assert_ne!(v.namespace(), w.namespace(), "shard count order matters");
        variants.push(v);
        let mut seen = std::collections::HashSet::new();
        seen.insert(base.clone());
        for v in variants {
            assert!(
                seen.insert(v.namespace()),
                "{v:?} aliased another namespace"
            );
        }
    }

    #[test]
    fn keys_carry_namespace_hash_group_page_shard() {
        let ns = id().namespace();
        let k = ns.key(0xabc, 1, 2, 3);
        assert!(k.text().starts_with(ns.as_str()));
        assert!(k.text().ends_with("-g1-p2-s3"));
        assert!(ns.owns(&k));
        let other = id().with_weight_versions(9, None).namespace();
        assert!(!other.owns(&k));
    }
}
