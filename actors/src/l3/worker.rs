//! An L3 worker thread: takes immutable jobs from its kind's queue, skips inert
//! (cancelled) items, calls the store with the job's Host byte ranges, and settles the job
//! under the executor's lock; after a GET settled, it triggers the promotion of what the
//! GET read (seed 003's trigger, detached: it runs on the store's workers). It never calls
//! the scheduler, a device API or a collective, and it never decides retirement beyond
//! what the store's results state.

use super::executor::{Phase, Shared};
use super::job::Job;
use super::outcome::{settle_get, settle_put, settle_query, Settled};
use super::stats::add;
use crate::l3::store::{KeyResult, StoreError};
use messages::{StorageKey, StorageOpKind};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use tracing::info_span;

/// Signals the executor's close when the worker exits (also on unwinding).
pub(crate) struct ExitGuard(flume::Sender<usize>, usize);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

pub(crate) fn run(
    shared: &Arc<Shared>,
    rx: &flume::Receiver<Arc<Job>>,
    exit: flume::Sender<usize>,
    index: usize,
) {
    let _guard = ExitGuard(exit, index);
    while let Ok(job) = rx.recv() {
        if !job.try_start() {
            continue; // inert: cancelled while queued, already settled
        }
        let started = shared.clock.now_us();
        {
            let mut st = shared.state.lock();
            st.jobs.set_phase(&job.op, Phase::Running);
        }
        tracing::debug!(parent: &job.span, "started");
        let (settled, read) = {
            let call = info_span!(parent: &job.span, "l3_backend_call", call = job.kind.as_str());
            let _e = call.enter();
            execute(shared, &job)
        };
        let finished = shared.clock.now_us();
        finish(shared, &job, settled, started, finished);
        if shared.promotion && !read.is_empty() {
            promote(shared, &job, &read);
        }
    }
}

/// Seed 003's trigger for what a GET just read, after the GET settled: the promotion runs
/// on the store's own workers, from the store's own source, so it touches no Host byte and
/// never delays the request (the read went straight into Host).
fn promote(shared: &Shared, job: &Job, read: &[StorageKey]) {
    let c = shared.counters.kind(job.kind);
    add(&c.backend_calls, 1);
    let r = catch_unwind(AssertUnwindSafe(|| shared.store.promote_detached(read)));
    match r {
        Ok(Ok(started)) => tracing::debug!(parent: &job.span, started, "promotion"),
        Ok(Err(e)) => tracing::debug!(parent: &job.span, error = %e, "promotion not started"),
        Err(_) => tracing::warn!(parent: &job.span, "promotion trigger panicked"),
    }
}

fn panicked(store: &'static str) -> StoreError {
    StoreError::new(store, "store call panicked")
}

/// Runs the job's store call; for a GET, also the keys it read in full (to promote).
fn execute(shared: &Shared, job: &Job) -> (Settled, Vec<StorageKey>) {
    let store = &shared.store;
    let c = shared.counters.kind(job.kind);
    let name = store.name();
    add(&c.backend_calls, 1);
    match job.kind {
        StorageOpKind::Query => {
            let r = catch_unwind(AssertUnwindSafe(|| store.query(&job.keys)))
                .unwrap_or_else(|_| Err(panicked(name)));
            (settle_query(job.op, job.keys.len(), r), Vec::new())
        }
        StorageOpKind::Get => {
            let r = catch_unwind(AssertUnwindSafe(|| get(shared, job)))
                .unwrap_or_else(|_| Err(panicked(name)));
            let lengths = job.expected_lengths();
            let read = match (&r, shared.promotion) {
                (Ok(rows), true) => job
                    .keys
                    .iter()
                    .zip(rows.iter().zip(&lengths))
                    .filter(
                        |(_, (row, len))| matches!(row, KeyResult::Ok { bytes } if bytes == *len),
                    )
                    .map(|(k, _)| k.clone())
                    .collect(),
                _ => Vec::new(),
            };
            (
                settle_get(job.op, &lengths, r, shared.failures_retire),
                read,
            )
        }
        StorageOpKind::Put => {
            let r = catch_unwind(AssertUnwindSafe(|| put(shared, job)))
                .unwrap_or_else(|_| Err(panicked(name)));
            (
                settle_put(job.op, &job.expected_lengths(), r, shared.failures_retire),
                Vec::new(),
            )
        }
    }
}

fn get(shared: &Shared, job: &Job) -> Result<Vec<KeyResult>, StoreError> {
    let mut dests = Vec::with_capacity(job.ranges.len());
    for r in &job.ranges {
        // SAFETY: the range was bounds-checked at submission and the job's destinations
        // are pairwise disjoint (JobSpec::check, tested); the StorageTransferManager holds
        // exclusive destination references on them until this job retires, so nothing
        // else reads or writes these bytes while the slices live.
        let d = unsafe { shared.host.range_mut(*r) }
            .map_err(|e| StoreError::new("executor", e.to_string()))?;
        dests.push(d);
    }
    let results = shared.store.get(&job.keys, &mut dests)?;
    if crate::host::poison::enabled() {
        // A store that answers Ok must have written the bytes: an exact-length success over
        // a still-poisoned destination is a store that lied.
        for ((r, d), range) in results.iter().zip(&dests).zip(&job.ranges) {
            if matches!(r, KeyResult::Ok { bytes } if *bytes == d.len() as u64) {
                poison_guard(crate::host::poison::check(
                    "a GET destination",
                    range.offset,
                    d,
                ));
            }
        }
    }
    Ok(results)
}

/// Debug builds: a poison read is a memory-safety bug, never a storage outcome; the process
/// stops at once, loudly, rather than let the bytes become KV.
fn poison_guard(r: Result<(), crate::host::poison::PoisonRead>) {
    if let Err(e) = r {
        eprintln!("{e}");
        std::process::abort();
    }
}

fn put(shared: &Shared, job: &Job) -> Result<Vec<KeyResult>, StoreError> {
    let mut srcs = Vec::with_capacity(job.ranges.len());
    for r in &job.ranges {
        // SAFETY: bounds-checked at submission; the StorageTransferManager holds source
        // references on these bytes until the job retires, so no writer touches them.
        let s = unsafe { shared.host.range(*r) }
            .map_err(|e| StoreError::new("executor", e.to_string()))?;
        srcs.push(s);
    }
    if crate::host::poison::enabled() {
        for (s, range) in srcs.iter().zip(&job.ranges) {
            poison_guard(crate::host::poison::check(
                "a backup PUT's source",
                range.offset,
                s,
            ));
        }
    }
    shared.store.put(&job.keys, &srcs)
}

fn finish(shared: &Shared, job: &Job, settled: Settled, started: u64, finished: u64) {
    let c = shared.counters.kind(job.kind);
    let done = settled.done;
    add(&c.completed, 1);
    add(
        &c.queue_time_us_total,
        started.saturating_sub(job.queued_us),
    );
    add(&c.backend_time_us_total, finished.saturating_sub(started));
    let ok_bytes: u64 = done
        .bytes
        .iter()
        .zip(&done.success)
        .filter(|(_, s)| **s)
        .map(|(b, _)| *b)
        .sum();
    add(&c.payload_bytes, ok_bytes);
    add(&c.new_writes, done.new_writes as u64);
    if done.error.is_some() {
        add(&c.failed, 1);
    }
    let outcome = if !done.retired {
        "quarantined"
    } else if done.error.is_some() {
        "failed"
    } else if done.success.iter().all(|s| *s) {
        "ok"
    } else {
        "partial"
    };
    job.span.record("outcome", outcome);
    let mut st = shared.state.lock();
    if done.retired {
        st.jobs.remove(&job.op);
    } else {
        add(&c.quarantined_refs, job.keys.len() as u64);
        st.health.quarantine();
        st.jobs.set_phase(&job.op, Phase::Unretired);
        tracing::error!(parent: &job.span, outcome, "quarantined: unretired result");
    }
    st.health.record(job.admission, settled.outage, finished);
    tracing::info!(parent: &job.span, outcome, outage = settled.outage, "completed");
    shared.push(&mut st, done);
}
