//! DFS → MEMORY promotion (seed 003, notes/dfs-promotion.md): the one engine behind every
//! promoting store's `prefetch_to_memory`. `engine` owns admission, per-key dedup, the
//! workers, settlement, expiry and cancellation; `staging` and `stats` are the budget and
//! the counters it charges; `hooks` pause a worker at a named stage in tests; `background`
//! runs the workers at background CPU priority. A store
//! supplies only its MEMORY tier, through two small traits: `TierAdmission` (what the tier
//! already holds, and whether an object of a given size could fit) and `PromotionTarget`
//! (reserve, write, commit or abort one promoted object). The implementations live beside
//! their stores: `local::promotion` (the in-process MEMORY tier) and `tiered::promotion`
//! (Mooncake).
//!
//! Nothing here knows which tier it writes, publishes a target other than through the
//! target's own `commit`, or reads a DFS object except through `DfsStore`'s validated reads.

pub mod background;
pub mod engine;
pub mod hooks;
pub mod staging;
pub mod stats;
#[cfg(test)]
mod tests;

pub use engine::{
    Attempt, AttemptState, Expiry, PinTable, PromotionEngine, PromotionLimits, PromotionTicket,
    SourcePin, Task,
};

use crate::l3::store::dfs::{ObjectIdentity, ReadError};
use crate::l3::store::{CapacityReason, PromotionFailure, PromotionResult, StoreError};
use messages::StorageKey;
use stats::FailReason;

/// Why a target write did not land.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteError {
    /// The target was aborted under the writer: it stops and writes nothing more (whoever
    /// aborted it settled the attempt).
    Aborted,
    /// The tier refused or failed the write: the attempt fails for this reason.
    Failed(FailReason),
}

/// What `PromotionTarget::adopt` did with a staged object.
#[derive(Debug)]
pub enum Adoption {
    /// The target now owns the staged buffer as its bytes (no copy).
    Landed,
    /// Refused, as `write` would have refused it.
    Refused(WriteError),
    /// The tier lands objects through `write` instead: the staged buffer, back.
    Declined(Vec<u8>),
}

/// Where a promoted object lands: one target per attempt, reserved after the source is
/// staged and revalidated, written once by one writer, then committed (made readable) or
/// aborted. Nothing is readable before `commit`.
pub trait PromotionTarget: Send + Sync + std::fmt::Debug + 'static {
    /// A reserved target, shared by its writer and its attempt record (to abort it).
    type Target: Clone + Send + Sync + std::fmt::Debug + 'static;
    /// Bytes the engine hands `write` at a time (`usize::MAX`: the whole object at once).
    const CHUNK: usize;
    /// Reserves a target for `source.len` bytes of `key` on behalf of `attempt_id`.
    fn reserve(
        &self,
        key: &StorageKey,
        attempt_id: u64,
        source: &ObjectIdentity,
    ) -> Result<Self::Target, CapacityReason>;
    /// Lands `chunk` at `offset` unless the target was aborted, and feeds `landed` the
    /// bytes as they now are in the target (the engine compares its digest with the
    /// source's checksum before the commit).
    fn write(
        &self,
        t: &Self::Target,
        offset: usize,
        chunk: &[u8],
        landed: &mut xxhash_rust::xxh3::Xxh3,
    ) -> Result<(), WriteError>;
    /// Offers the target the whole staged object, already verified against the source
    /// identity by the read that filled it (its checksum computed in that same pass): a
    /// tier whose target is process memory keeps the buffer itself, so the object is not
    /// copied again. The default declines (the engine then copies it through `write`).
    fn adopt(&self, _t: &Self::Target, staged: Vec<u8>) -> Adoption {
        Adoption::Declined(staged)
    }
    /// An empty buffer of capacity `len` for the staging read, from memory the tier kept
    /// (None: the read allocates). The default keeps none.
    fn staging_buffer(&self, _len: usize) -> Option<Vec<u8>> {
        None
    }
    /// Makes a fully written, verified target readable: Committed, or AlreadyInMemory
    /// where the tier kept an earlier copy. Called once, under the attempt's lock.
    fn commit(&self, t: Self::Target) -> PromotionResult;
    /// Stops every later write of the target and unlinks it. Idempotent.
    fn abort(&self, t: &Self::Target);
    fn is_aborted(&self, t: &Self::Target) -> bool;
}

/// What admission asks the tier before any attempt exists.
pub trait TierAdmission {
    /// Whether each key is readable in the tier now: one answer per key, in order. An
    /// error fails the whole trigger.
    fn resident(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError>;
    /// A cheap local answer, asked again under the live-attempt lock so that a commit
    /// that just finished is seen. A tier whose residency is a remote query answers false.
    fn holds(&self, _key: &StorageKey) -> bool {
        false
    }
    /// Whether an object of `len` bytes could be admitted now.
    fn check_capacity(&self, _len: u64) -> Result<(), CapacityReason> {
        Ok(())
    }
}

/// A tier the engine can promote into.
pub trait PromotionTier: PromotionTarget + TierAdmission {}
impl<T: PromotionTarget + TierAdmission> PromotionTier for T {}

/// Why a DFS read of an admitted attempt's source failed.
pub fn read_failure_reason(e: &ReadError) -> PromotionFailure {
    match e {
        ReadError::Missing => PromotionFailure::SourceChanged,
        ReadError::Invalid(_) => PromotionFailure::Checksum,
        ReadError::Io(_) => PromotionFailure::Io,
    }
}

/// Maps a failed DFS source read to seed 003's result (`at_admission`: before any attempt
/// exists, a vanished source is simply missing).
pub fn read_failure(e: &ReadError, at_admission: bool) -> PromotionResult {
    match e {
        ReadError::Missing if at_admission => PromotionResult::MissingSource,
        e => PromotionResult::Failed(read_failure_reason(e)),
    }
}

/// Whether `len` bytes with xxh3 `digest` are exactly the object `identity` names.
pub fn matches_identity(len: u64, digest: u64, identity: &ObjectIdentity) -> bool {
    len == identity.len && digest == identity.checksum
}
