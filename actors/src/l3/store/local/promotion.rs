//! The local store's MEMORY tier as a promotion target (`promotion::PromotionTarget`,
//! `TierAdmission`): a reservation is a `MemoryTarget` allocated from the tier's budget
//! (evicting unleased replicas in LRU order) and charged but not allocated: the verified
//! staging buffer becomes its memory (`adopt`, through its fence; `PROMOTION_CHUNK` pieces
//! are the chunked `write` path), committed by publishing it as the key's replica, aborted by fencing it. Admission
//! asks the tier itself: residency, the allocation cap and the eviction watermark.
//!
//! It must never publish a fenced or partially written target (only the engine's verified
//! commit reaches `publish`), and never return a target's bytes to the budget on abort: they
//! return when the writer's last handle drops.

use super::memory_tier::{AdoptError, MemoryTarget, MemoryTier};
use crate::l3::store::dfs::ObjectIdentity;
use crate::l3::store::promotion::stats::FailReason;
use crate::l3::store::promotion::{Adoption, PromotionTarget, TierAdmission, WriteError};
use crate::l3::store::{CapacityReason, PromotionFailure, PromotionResult, StoreError};
use messages::StorageKey;
use std::sync::Arc;

/// Bytes copied into a target between fence checks.
pub const PROMOTION_CHUNK: usize = 256 * 1024;

impl TierAdmission for MemoryTier {
    fn resident(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        Ok(keys.iter().map(|k| self.contains(k)).collect())
    }
    fn holds(&self, key: &StorageKey) -> bool {
        self.contains(key)
    }
    /// Larger than the whole tier: Allocation; more than eviction could free: Watermark.
    fn check_capacity(&self, len: u64) -> Result<(), CapacityReason> {
        if len > self.budget().capacity() {
            Err(CapacityReason::Allocation)
        } else if !self.admits(len) {
            Err(CapacityReason::Watermark)
        } else {
            Ok(())
        }
    }
}

impl PromotionTarget for MemoryTier {
    type Target = Arc<MemoryTarget>;
    const CHUNK: usize = PROMOTION_CHUNK;

    fn reserve(
        &self,
        key: &StorageKey,
        attempt_id: u64,
        source: &ObjectIdentity,
    ) -> Result<Arc<MemoryTarget>, CapacityReason> {
        // Charged now, backed by the staged buffer itself in `adopt`.
        self.allocate_unbacked(key, attempt_id, source.len)
    }

    /// A spare buffer of a replica that left (see `memory_tier`): the staging read then
    /// writes memory the process already touched.
    fn staging_buffer(&self, len: usize) -> Option<Vec<u8>> {
        self.budget().take_spare(len)
    }

    /// The verified staging buffer becomes the replica's memory: no copy, no second hash.
    fn adopt(&self, t: &Arc<MemoryTarget>, staged: Vec<u8>) -> Adoption {
        match t.adopt(staged) {
            Ok(()) => Adoption::Landed,
            Err(AdoptError::Fenced) => Adoption::Refused(WriteError::Aborted),
            Err(AdoptError::Length) => Adoption::Refused(WriteError::Failed(FailReason::Failure(
                PromotionFailure::Checksum,
            ))),
        }
    }

    fn write(
        &self,
        t: &Arc<MemoryTarget>,
        offset: usize,
        chunk: &[u8],
        landed: &mut xxhash_rust::xxh3::Xxh3,
    ) -> Result<(), WriteError> {
        t.write_chunk_hashed(offset, chunk, landed)
            .map_err(|_| WriteError::Aborted)
    }

    /// A replica already resident (a write-through PUT won) stays: MEMORY is readable
    /// either way, and this target is dropped.
    fn commit(&self, t: Arc<MemoryTarget>) -> PromotionResult {
        self.publish(t);
        PromotionResult::Committed
    }

    fn abort(&self, t: &Arc<MemoryTarget>) {
        t.fence();
    }

    fn is_aborted(&self, t: &Arc<MemoryTarget>) -> bool {
        t.is_fenced()
    }
}
