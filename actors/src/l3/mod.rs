//! The L3 executor (seed 000: the engine host's L3 executor): immutable jobs, bounded
//! QUERY/GET/PUT queues and worker threads, the store client, completion + pressure facts,
//! queued cancellation, its private health monitor and quarantine. It never calls the
//! scheduler, a device API or a collective.
pub mod actor;
pub mod bench;
pub mod executor;
mod health;
mod job;
mod outcome;
mod pressure;
pub mod stats;
pub mod store;
#[cfg(test)]
mod tests;
mod worker;

pub use actor::{ExecutorSnapshot, L3ExecutorActor};
pub use executor::{CloseReport, L3Executor, StartError, Submitted};
pub use stats::{ExecutorStats, JobGauges, KindStats};
