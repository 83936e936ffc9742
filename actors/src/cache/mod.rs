//! The CacheCoordinator's pure logic (owned by the Scheduler actor): cache geometry, prefix
//! identity and keys, tails, the Device and Host block pools, the group matcher, query-credit
//! packing, and the coordinator that drives read/write transactions over them.
//!
//! Nothing here runs an actor, touches Host bytes, or talks to a store. Results never
//! depend on hash-map iteration order: maps are used for lookups only, outputs are ordered.

pub mod coordinator;
pub mod credits;
pub mod geometry;
pub mod keys;
pub mod matcher;
pub mod pool;
pub mod tail;

pub use coordinator::{
    AdmissionMatch, Bypass, CacheCoordinator, CacheError, CoordinatorConfig, ExistenceHints,
    HintedBlock, PlacedBlock, PlannedBoundary, QueryLimits, QueryPlan, QueryRow, ReadyHold,
    Reservation, TransferRow,
};
pub use credits::QueryCredits;
pub use geometry::{CacheGeometry, GeometryError, GroupKind, GroupSpec};
pub use keys::{BlockAddr, ContentHash};
pub use pool::{BlockPool, Device, Host};
pub use tail::{TailCandidate, TailTable};

pub mod bench;
#[cfg(test)]
mod tests;
