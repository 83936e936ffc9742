//! The Mooncake store (any `Store` in tests) as a promotion target (seed 003
//! `batch_prefetch_to_memory` with Mooncake as the MEMORY tier), plus the tiered store's
//! promotion limits and the pure mappings of the tier's answers.
//!
//! Mooncake allocates the MEMORY target inside one create-only PUT call, which copies from
//! our staging buffer and publishes the object only when the copy completed; the ffi layer
//! never keeps a source pointer beyond the call. So a reservation here is only a record of
//! the key and its source identity; the write is the whole object in one piece, hashed and
//! verified against that identity before the PUT (never PUT bytes that failed
//! verification), and then the PUT; the commit reports what the PUT found. No partially
//! written replica is ever readable, and no target of ours outlives the call, so there is
//! nothing to abort: the tiered store never expires or cancels an attempt, and its purge
//! waits behind the engine's barrier for PUTs in progress, so no promotion recreates a
//! purged object. Mooncake's create-only semantics decide between two instances promoting
//! the same key (the first value stays; both are readable).
//!
//! It must never PUT bytes that failed verification and never PUT outside `write`.

use crate::l3::store::dfs::ObjectIdentity;
use crate::l3::store::promotion::stats::FailReason;
use crate::l3::store::promotion::{
    matches_identity, PromotionEngine, PromotionTarget, PromotionTicket, TierAdmission, WriteError,
};
use crate::l3::store::{
    CapacityReason, KeyResult, PromotionFailure, PromotionResult, Store, StoreError,
};
use messages::StorageKey;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

pub use crate::l3::store::promotion::hooks::PromotionHooks as TierHooks;
pub use crate::l3::store::promotion::read_failure;

/// The tiered store's promotion engine and tickets.
pub type TierPromotion = PromotionEngine<MooncakeTarget>;
pub type TierTicket = PromotionTicket<MooncakeTarget>;

/// Limits of the promotion machinery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierLimits {
    pub workers: u32,
    pub staging_bytes: u64,
    pub max_in_flight: u32,
}

/// Maps the MEMORY tier's answer to one promotion PUT row to seed 003's result. An
/// already-exists answer means a readable replica: the promotion's goal holds.
pub fn put_outcome(r: &KeyResult) -> PromotionResult {
    match r {
        KeyResult::Ok { .. } => PromotionResult::Committed,
        KeyResult::AlreadyExists => PromotionResult::AlreadyInMemory,
        KeyResult::Capacity => PromotionResult::Capacity(CapacityReason::Allocation),
        _ => PromotionResult::Failed(PromotionFailure::Io),
    }
}

/// Whether staged bytes are exactly the object the identity names.
pub fn verified(staged: &[u8], identity: &ObjectIdentity) -> bool {
    matches_identity(staged.len() as u64, xxh3_64(staged), identity)
}

/// The MEMORY tier of a tiered store, as the promotion engine's target.
pub struct MooncakeTarget {
    pub(crate) memory: Arc<dyn Store>,
}

impl MooncakeTarget {
    pub fn new(memory: Arc<dyn Store>) -> Self {
        Self { memory }
    }
}

impl std::fmt::Debug for MooncakeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakeTarget")
            .field("memory", &self.memory.name())
            .finish()
    }
}

/// One reserved promotion PUT: the key, the identity its bytes must match, and whether
/// the PUT found the object already there.
#[derive(Debug)]
pub struct MooncakePut {
    key: StorageKey,
    source: ObjectIdentity,
    existed: AtomicBool,
}

impl TierAdmission for MooncakeTarget {
    /// One MEMORY existence query for the batch.
    fn resident(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        let hits = self.memory.query(keys)?;
        if hits.len() != keys.len() {
            return Err(StoreError::new(
                "tiered",
                "MEMORY query answered a different number of keys",
            ));
        }
        Ok(hits)
    }
}

impl PromotionTarget for MooncakeTarget {
    type Target = Arc<MooncakePut>;
    /// One create-only PUT of the whole object.
    const CHUNK: usize = usize::MAX;

    /// Mooncake allocates inside the PUT: nothing to reserve yet.
    fn reserve(
        &self,
        key: &StorageKey,
        _attempt_id: u64,
        source: &ObjectIdentity,
    ) -> Result<Arc<MooncakePut>, CapacityReason> {
        Ok(Arc::new(MooncakePut {
            key: key.clone(),
            source: *source,
            existed: AtomicBool::new(false),
        }))
    }

    /// Hashes the whole staged object (the bytes the PUT copies), refuses it unless it is
    /// exactly the source, then issues one create-only PUT from it.
    fn write(
        &self,
        t: &Arc<MooncakePut>,
        offset: usize,
        chunk: &[u8],
        landed: &mut xxhash_rust::xxh3::Xxh3,
    ) -> Result<(), WriteError> {
        let fail = |r: FailReason| Err(WriteError::Failed(r));
        landed.update(chunk);
        if offset != 0 || !matches_identity(chunk.len() as u64, landed.digest(), &t.source) {
            return fail(FailReason::Failure(PromotionFailure::Checksum));
        }
        let io = FailReason::Failure(PromotionFailure::Io);
        match self.memory.put(std::slice::from_ref(&t.key), &[chunk]) {
            Ok(rows) if rows.len() == 1 => match put_outcome(&rows[0]) {
                PromotionResult::Committed => Ok(()),
                PromotionResult::AlreadyInMemory => {
                    t.existed.store(true, Ordering::Release);
                    Ok(())
                }
                PromotionResult::Capacity(c) => fail(FailReason::Capacity(c)),
                PromotionResult::Failed(f) => fail(FailReason::Failure(f)),
                _ => fail(io),
            },
            Ok(_) => fail(io),
            Err(e) => {
                tracing::warn!(key = %t.key, error = %e, "promotion PUT into MEMORY failed");
                fail(io)
            }
        }
    }

    /// The PUT already published: an already-exists answer is a readable replica too.
    fn commit(&self, t: Arc<MooncakePut>) -> PromotionResult {
        if t.existed.load(Ordering::Acquire) {
            PromotionResult::AlreadyInMemory
        } else {
            PromotionResult::Committed
        }
    }

    /// A PUT cannot be stopped part-way and publishes only complete objects: nothing to do.
    fn abort(&self, _t: &Arc<MooncakePut>) {}

    fn is_aborted(&self, _t: &Arc<MooncakePut>) -> bool {
        false
    }
}
