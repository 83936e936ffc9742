//! Host (L2) memory: the shared Host allocation that holds L2 pages and L3 destinations,
//! the debug builds' poisoned-memory checker over it, and the bulk copy and bulk hash of
//! KV bytes.
pub mod bulk_hash;
pub mod poison;
pub mod storage;
pub mod stream_copy;
pub use storage::{HostCacheStorage, HostError};
pub use stream_copy::stream_copy;
