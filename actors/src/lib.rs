//! tsl3 actors: one module per actor, each owning its state and logic, plus the pure logic
//! beside the actor that owns it. Actors talk only through `messages` types; only the
//! binary wires them together.

pub mod cache;
pub mod clock;
pub mod control_plane;
pub mod device;
pub mod engine;
pub mod frontend;
pub mod fuzz;
pub mod host;
pub mod l3;
pub mod metrics;
pub mod model;
pub mod names;
pub mod scheduler;
pub mod storage_transfer;
