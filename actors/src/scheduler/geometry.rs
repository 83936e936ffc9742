//! The bridge from a model profile to the cache geometry and the device slot layout of one
//! rank. Pure: it computes sizes and slot numbers, allocates nothing.

use crate::cache::geometry::{CacheGeometry, GroupSpec};
use crate::device::DeviceSlot;
use crate::model::profile::{GroupKind as ModelGroupKind, ModelProfile};
use crate::model::Shard;

/// Sizes of one rank's pools, per cache group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankLayout {
    pub geometry: CacheGeometry,
    pub shard: Shard,
    /// Device blocks per group (cached, content-addressed).
    pub device_blocks: Vec<u32>,
    /// Host blocks per group.
    pub host_blocks: Vec<u32>,
    /// Bytes of one block of each group on this rank (all its pages).
    pub block_bytes: Vec<u64>,
    /// Private device slots for partial (tail) blocks of running requests.
    pub scratch_slots: u32,
}

impl RankLayout {
    /// The cache geometry of `profile` on rank `rank` of `world` (heads split across ranks;
    /// every group keeps rank-local keys; token groups have one page per block, State
    /// checkpoints two).
    pub fn new(
        profile: &ModelProfile,
        rank: u32,
        world: u32,
        device_blocks: u32,
        host_blocks: u32,
        scratch_slots: u32,
    ) -> Result<Self, String> {
        let shard = Shard {
            index: rank,
            count: world,
        };
        let mut groups = vec![];
        let mut block_bytes = vec![];
        for (i, g) in profile.groups.iter().enumerate() {
            let bytes = g.shard_block_bytes(world).map_err(|e| e.to_string())?;
            let bt =
                u32::try_from(g.block_tokens).map_err(|_| format!("group {i}: block too large"))?;
            let name = format!("g{i}");
            let spec = match g.kind {
                ModelGroupKind::Full => GroupSpec::full(&name, bt, 1, bytes),
                ModelGroupKind::SlidingWindow { window } => {
                    let w = u32::try_from(window)
                        .map_err(|_| format!("group {i}: window too large"))?;
                    GroupSpec::sliding_window(&name, w, bt, 1, bytes)
                }
                ModelGroupKind::State { .. } => {
                    // The fixed two-slot checkpoint contract: one checkpoint spans two
                    // pages (slots) of half its bytes, rounded up.
                    let slot = bytes.div_ceil(2);
                    GroupSpec::state(&name, bt, slot)
                }
            };
            let spec = spec.with_field("kv_heads", true);
            block_bytes.push(spec.block_bytes());
            groups.push(spec);
        }
        let geometry = CacheGeometry::new(groups, world, rank).map_err(|e| e.to_string())?;
        let n = profile.groups.len();
        Ok(Self {
            geometry,
            shard,
            device_blocks: vec![device_blocks; n],
            host_blocks: vec![host_blocks; n],
            block_bytes,
            scratch_slots,
        })
    }

    /// Bytes of the largest block: the size of one device slot.
    pub fn slot_bytes(&self) -> u64 {
        self.block_bytes.iter().copied().max().unwrap_or(1)
    }

    /// Device slots in all: every group's cached blocks, then the scratch slots.
    pub fn device_slots(&self) -> u32 {
        self.device_blocks.iter().sum::<u32>() + self.scratch_slots
    }

    /// The device slot of a cached block (group, index in the group's pool).
    pub fn cached_slot(&self, group: usize, index: u32) -> DeviceSlot {
        let base: u32 = self.device_blocks[..group].iter().sum();
        DeviceSlot(base + index)
    }

    /// The device slot of scratch slot `i`.
    pub fn scratch_slot(&self, i: u32) -> DeviceSlot {
        DeviceSlot(self.device_blocks.iter().sum::<u32>() + i)
    }

    /// Bytes of the Host allocation the Host pool addresses.
    pub fn host_bytes(&self) -> u64 {
        self.host_blocks
            .iter()
            .zip(&self.block_bytes)
            .map(|(n, b)| *n as u64 * b)
            .sum()
    }
}
