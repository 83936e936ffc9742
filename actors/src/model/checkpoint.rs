//! A Hugging Face model directory as the cache sees it: the cache geometry derived from
//! its config.json (one Full group whose blocks hold `block_tokens` KV rows of the
//! transformer crate's row layout: every layer's K and V of every KV head per token), and
//! the rule that a TP size other than one is refused for this backend.
//!
//! It reads config.json only (no weights) and never touches memory: the forward itself is
//! `device::transformer`.

use super::cost::CostModel;
use super::profile::{GroupKind, GroupSpec, ModelProfile};
use super::ModelError;
use std::path::Path;
use transformer::TransformerConfig;

/// Bytes of one KV value on the CPU compute path (f32).
pub const CPU_VALUE_BYTES: u64 = 4;

/// The profile name of every model directory (its identity enters the namespace through
/// the checkpoint hash, not the name).
pub const TRANSFORMER_PROFILE: &str = "transformer";

/// The cache geometry of a model directory's config: one Full group; a "head" of the
/// geometry is one (layer, KV head) pair holding K then V (`2 * head_dim` values), so a
/// token's row is `layers * kv_heads * 2 * head_dim * value_bytes` bytes. No modeled device
/// time: the forward's time is the time it computes.
pub fn profile_of(config: &TransformerConfig, block_tokens: u64, value_bytes: u64) -> ModelProfile {
    let heads = (config.num_hidden_layers * config.num_key_value_heads) as u32;
    ModelProfile {
        name: TRANSFORMER_PROFILE,
        vocab: config.vocab_size as u32,
        groups: vec![GroupSpec {
            kind: GroupKind::Full,
            block_tokens,
            kv_heads: heads,
            bytes_per_head: 2 * config.head_dim as u64 * value_bytes,
        }],
        cost: CostModel {
            fixed_us: 0.0,
            per_token_us: 0.0,
            per_token_context_ns: 0.0,
            pcie_bytes_per_s: 0.0,
        },
    }
}

/// The config of `dir` and its geometry at `block_tokens` on `world` ranks (refused unless
/// one: the transformer backend does not split a layer's heads across ranks).
pub fn read(
    dir: &Path,
    block_tokens: u64,
    world: u32,
) -> Result<(TransformerConfig, ModelProfile), ModelError> {
    let config =
        TransformerConfig::from_dir(dir).map_err(|e| ModelError::Checkpoint(e.to_string()))?;
    if world != 1 {
        return Err(ModelError::Checkpoint(format!(
            "{}: the transformer backend runs a model directory on one rank (TP = 1); \
             {world} ranks were asked for",
            dir.display()
        )));
    }
    if block_tokens == 0 {
        return Err(ModelError::Checkpoint(
            "block_tokens must be at least 1".into(),
        ));
    }
    let profile = profile_of(&config, block_tokens, CPU_VALUE_BYTES);
    Ok((config, profile))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_geometry_holds_one_kv_row_per_token_and_tp_above_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        transformer::init_random(dir.path(), &transformer::RandomModelSpec::default()).unwrap();
        let (config, profile) = read(dir.path(), 16, 1).unwrap();
        let m =
            transformer::Transformer::load(dir.path(), transformer::ComputeDevice::Cpu).unwrap();
        let g = profile.groups[0];
        assert_eq!(
            g.bytes_per_token_or_checkpoint(),
            m.kv_layout().row_bytes() as u64
        );
        assert_eq!(g.block_tokens, 16);
        assert_eq!(profile.vocab as usize, config.vocab_size);
        let e = read(dir.path(), 16, 2).unwrap_err().to_string();
        assert!(e.contains("TP = 1") && e.contains("2 ranks"), "{e}");
        let e = read(&dir.path().join("nope"), 16, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json"), "{e}");
    }
}
