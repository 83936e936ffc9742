//! The `Store` trait: what the L3 executor's workers call, on worker threads only. A store
//! reports facts (per-key results, and whether a failed call stopped touching the Host
//! buffers) and never makes scheduling decisions. Implementations: `memory` (in-process),
//! `faulty` (fault injection for tests). The DFS, local and Mooncake stores live beside
//! them.

pub mod dfs;
pub mod dfs_bench;
pub mod fan_out;
pub mod faulty;
pub mod local;
pub mod memory;
pub mod mooncake;
pub mod promotion;
pub mod tiered;

use messages::{Namespace, StorageKey};

/// The result of one key of a GET or PUT, as a fact.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyResult {
    /// GET: `bytes` landed in the destination. PUT: a new object of `bytes` was written.
    Ok { bytes: u64 },
    /// PUT only: create-only rejection because the object exists: idempotent success, no
    /// native write.
    AlreadyExists,
    /// GET: the object is absent (a retired metadata miss, before any transfer).
    Missing,
    /// GET: a nonnegative short read (a retired failure; the object is not what was asked).
    ShortRead { bytes: u64 },
    /// GET: the object exists but failed validation (length, checksum): retired.
    Invalid,
    /// PUT: the backend's allocation rejection before any source transfer: retired; the
    /// scheduler re-offers the page.
    Capacity,
    /// Any other failure. `retired` states whether the store provably stopped touching
    /// this key's buffer.
    Failed { code: i64, retired: bool },
}

/// A failed call as a whole (an exception): retirement then follows `failures_retire()`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{store}: {message}")]
pub struct StoreError {
    pub store: &'static str,
    pub message: String,
}

impl StoreError {
    pub fn new(store: &'static str, message: impl Into<String>) -> Self {
        Self {
            store,
            message: message.into(),
        }
    }
}

/// Why a promotion could not run for lack of resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CapacityReason {
    Quota,
    Allocation,
    Watermark,
    InFlightCap,
}

/// Why a promotion failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PromotionFailure {
    Busy,
    Fenced,
    Expired,
    SourceChanged,
    Io,
    Checksum,
}

/// Seed 003's per-key result of `batch_prefetch_to_memory`, in input order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PromotionResult {
    AlreadyInMemory,
    Committed,
    MissingSource,
    Unsupported,
    Capacity(CapacityReason),
    Failed(PromotionFailure),
}

impl PromotionResult {
    /// MEMORY was readable when completion was observed (not a residency promise).
    pub fn readable(&self) -> bool {
        matches!(
            self,
            PromotionResult::AlreadyInMemory | PromotionResult::Committed
        )
    }
}

/// What a store can do, detected explicitly: a store without promotion keeps the
/// ordinary query/get path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCapabilities {
    /// The executor triggers `promote_detached` with what each GET read.
    pub promotion: bool,
}

/// The shape check every store's `get` and `put` starts with: one Host buffer per key.
pub fn same_count(
    store: &'static str,
    keys: usize,
    buffers: usize,
    what: &str,
) -> Result<(), StoreError> {
    if keys == buffers {
        Ok(())
    } else {
        Err(StoreError::new(
            store,
            format!("keys and {what} differ in count ({keys} keys, {buffers} {what})"),
        ))
    }
}

/// A storage backend. All calls block; the executor calls them only on its worker threads.
pub trait Store: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Whether a failed call or malformed result guarantees the store stopped accessing
    /// the supplied Host buffers. Not an operation's success flag.
    fn failures_retire(&self) -> bool;

    fn capabilities(&self) -> StoreCapabilities {
        StoreCapabilities::default()
    }

    /// Existence of each key (touches no Host payload). One entry per key, in order.
    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError>;

    /// Reads each key into its destination (whose length is the expected object length).
    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError>;

    /// Create-only writes of each key from its source.
    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError>;

    /// Removes every object of a namespace (a synchronous administrative call). Returns the
    /// number of objects removed where the store knows it.
    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError>;

    /// Seed 003's batch trigger: one result per key, in input order. Stores without the
    /// capability answer Unsupported for every key.
    fn prefetch_to_memory(&self, keys: &[StorageKey]) -> Result<Vec<PromotionResult>, StoreError> {
        Ok(vec![PromotionResult::Unsupported; keys.len()])
    }

    /// Seed 003's trigger after a read: starts the promotion of `keys` (a GET just read
    /// them into Host straight from wherever they were readable) and returns without
    /// waiting, so the promotion never sits on the request's path; the MEMORY replica
    /// serves later reads. Returns the number of promotions left running. Stores without
    /// the capability start nothing.
    fn promote_detached(&self, _keys: &[StorageKey]) -> Result<usize, StoreError> {
        Ok(0)
    }

    /// Releases the client. Called only when every job has provably retired.
    fn close(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
