//! DFS → MEMORY promotion shared by every promoting store.

pub mod hooks;
pub mod staging;
pub mod stats;
