//! Host (L2) memory: the shared Host allocation that holds L2 pages and L3 destinations.
pub mod storage;
pub use storage::{HostCacheStorage, HostError};
