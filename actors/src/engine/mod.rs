//! The round's one owner (DESIGN.md §3-4). `RankEngine` holds one rank's two deterministic
//! cores — the Scheduler and the StorageTransferManager, together in `RoundPipeline` — and
//! runs every step of a round exactly once, in `round.rs`: the head feedback point (poll the
//! executor into this rank's report), apply → plan of the agreed round (the manager decides
//! every storage operation while the scheduler plans), dispatch in plan order (storage to
//! the executor, copies and forwards to the device), the tail (forward digests, D2H
//! publication, backup offers), and the admin steps.
//!
//! The executor, the device and the ControlPlane are reached through the small traits of
//! `ports`: `sync_ports` plugs in their cores (tests, benchmarks, tools: `RankEngine`'s
//! `*_now` methods), `actor_ports` their actors' mailboxes (`engine-host serve`). Nothing
//! else in the crate runs a round.
//!
//! This module never talks to other ranks: the mesh port exchanges the report and hands
//! back the agreed round.

pub mod actor_ports;
pub mod admin;
pub mod event_loop;
pub mod exporter;
pub mod factory;
pub mod pipeline;
#[cfg(test)]
mod pipeline_tests;
pub mod ports;
mod round;
pub mod sync_ports;
#[cfg(test)]
mod tail_tests;
#[cfg(test)]
mod tests;

pub use round::{
    agree_single, ActorRank, AdminError, RankEngine, RankView, RoundWork, SchedulerView,
};

use crate::device::DeviceError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("protocol error: {0}")]
    Protocol(#[from] messages::ProtocolError),
    #[error("control plane: {0}")]
    Control(#[from] messages::ControlError),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    #[error("an actor's mailbox closed: {0}")]
    Mailbox(actix::MailboxError),
    /// The device did not complete a fence in time (a hung device): the replica fails
    /// instead of hanging.
    #[error("rank {rank}: device fence {fence} did not complete within {deadline_ms} ms")]
    FenceTimeout {
        rank: u32,
        fence: u64,
        deadline_ms: u64,
    },
}
