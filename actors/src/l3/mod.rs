//! The L3 executor (seed 000: the engine host's L3 executor): immutable jobs, bounded
//! QUERY/GET/PUT queues and worker threads, the store client, completion + pressure facts,
//! queued cancellation, its private health monitor and quarantine. It never calls the
//! scheduler, a device API or a collective.
pub mod store;
