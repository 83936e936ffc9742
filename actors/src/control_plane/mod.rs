//! The ControlPlane (DESIGN.md section 4, seed 000 "Completion agreement and ordering"):
//! the per-round relay exchange among a replica's ranks over an authenticated TCP mesh, the
//! agreement of completion records and pressure, and the agreed tick.
//!
//! Layout: [`frame`] (length-prefixed msgpack frames), [`handshake`] (join rules and HMAC
//! authentication), [`mesh`] (connections, and the [`Topology`] a world rounds over),
//! [`relay`] (the all-gather; its star in `star`), [`agreement`] (pure reductions),
//! [`plane`] (the core, plain tokio), [`actor`] (the actix wrapper), [`bench`].
//!
//! A round is two phases under one deadline (reports, then "gathered" confirmations), so a
//! rank returns an agreed round only after every rank gathered every report; a rank that
//! fails a round tells its peers why (Abort) and every rank then refuses further rounds.
//! Up to four ranks exchange both phases directly (the full mesh); from five ranks on both
//! phases go through the leader (rank 0), which answers each with one frame per rank
//! (`mesh::Topology::STAR_FROM_WORLD`).
//! The residual window: a rank dying between its confirmations to different peers lets some
//! ranks agree that round; they fail at the next one.
//!
//! This module never makes storage, scheduling or admission decisions: it only agrees facts.

pub mod actor;
pub mod agreement;
pub mod bench;
pub mod frame;
pub mod handshake;
pub mod mesh;
pub mod plane;
pub mod relay;
mod star;

pub use actor::ControlPlane;
pub use agreement::{reduce, seal_gathered, seal_local_report, Agreement, LEADER_RANK};
pub use frame::FrameError;
pub use mesh::{Mesh, MeshFrame, MeshSettings, Topology};
pub use plane::ControlPlaneCore;
pub use relay::Relay;
