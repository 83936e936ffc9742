//! tsl3 actors: one module per actor or core, each owning its state and logic, plus the
//! pure logic beside the one that owns it. The dependency graph is layered, as the code has
//! it (docs/architecture.md draws it):
//!
//! - leaves: `clock`, `names`, `host` (the pinned Host allocation), `model` (the synthetic
//!   model and its cost model), and the `messages` crate (everything that crosses a mailbox
//!   or a socket);
//! - cores over the leaves: `cache` (pools, matcher, tail table), `storage_transfer` (the
//!   StorageTransferManager), `device` (the DeviceCopyEngine), `l3` (the executor, its pools
//!   and the stores), `control_plane` (mesh, relay, agreement);
//! - `scheduler` over cache, device's plan vocabulary (copies, slots, forward steps), model
//!   and the StorageTransferManager it asks for every storage decision; `frontend` (HTTP
//!   API, client registry, health document) over the scheduler's request events;
//!   `metrics` (every metric name; its label values come from the enums of the modules
//!   that own them);
//! - `engine` on top: the round's one owner (`engine::round`) over the ports of the
//!   executor, the device and the mesh, the event loop, the admin protocol, the exporter and
//!   the startup factory. Only `engine` knows every part; the binary only wires settings to
//!   it.

pub mod cache;
pub mod clock;
pub mod control_plane;
pub mod device;
pub mod engine;
pub mod frontend;
pub mod fuzz;
pub mod host;
pub mod id_map;
pub mod l3;
pub mod metrics;
pub mod model;
pub mod names;
pub mod row_set;
pub mod scheduler;
pub mod storage_transfer;
