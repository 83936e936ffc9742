//! The L3 executor (seed 000, "Controller queues, monitor and bounds"): separate bounded
//! QUERY/GET/PUT queues (flume) and worker pools, a total outstanding-operation limit,
//! the completion poll that returns new StorageDone facts and the pressure snapshot under
//! one lock, queued cancellation, the private HealthMonitor, quarantine, and close.
//!
//! Semantics: `submit` never fails. Every job command settles exactly once through `poll`:
//! either as the fact of its run or as a `StorageDone::rejected` completion (Unhealthy,
//! QueueFull, OutstandingLimit, Shutdown, Quarantined, Invalid, or Cancelled for a queued
//! job cancelled before it started). A Cancel command creates no ticket and no completion
//! of its own. The outstanding limit counts tracked jobs (queued, running, and finished but
//! unretired) plus undelivered completions, rejections included.
//!
//! A cancelled queue item is inert but keeps its slot in the kind's bounded flume queue
//! until a worker discards it, so queue memory stays bounded even while workers are busy;
//! the pressure snapshot and the outstanding count exclude it as soon as it is settled.
//!
//! Time: every observable timestamp (queue/backend time, pressure age, cooldown) reads
//! the injected Clock. Only two waits use real time, because no manual clock can end a
//! blocking wait: `close`'s worker-join deadline and `wait_undelivered`'s safety timeout.
//!
//! It never calls the scheduler, a device API or a collective; workers receive immutable
//! keys and Host byte ranges only. `poll` and `health` never call storage.

use super::health::HealthMonitor;
use super::job::{Job, JobSpec};
use super::pressure::JobTable;
pub(crate) use super::pressure::Phase;
use super::stats::{add, Counters, ExecutorStats, JobGauges};
use super::worker;
use crate::clock::SharedClock;
use crate::host::storage::HostCacheStorage;
use crate::l3::store::Store;
use messages::{
    settings::StorageRuntimeConfig, HealthState, OperationId, PressureSnapshot, Rejection,
    StorageDone, StorageOp, StorageOpKind,
};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{field, info_span, Span};

/// Why the executor could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid executor setting {0}: must be greater than 0")]
    Zero(&'static str),
    #[error("could not spawn an executor worker: {0}")]
    Spawn(String),
}

/// What `submit` did with one command (informational; the facts arrive through `poll`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// The job is queued on its kind's queue.
    Queued,
    /// The command was rejected; a `StorageDone::rejected` completion awaits `poll`.
    Rejected(Rejection),
    /// Cancel: the queued job became inert; a `Rejection::Cancelled` completion awaits
    /// `poll`.
    CancelAcknowledged,
    /// Cancel: the job is unknown, already settled, or started (started I/O keeps its own
    /// lifetime and settles normally).
    CancelIgnored,
}

/// The result of `close`.
#[derive(Debug)]
pub struct CloseReport {
    /// Native retirement is unknown (a quarantined job, or a worker still inside a store
    /// call at the deadline): the store and the Host allocation are kept for the process.
    pub restart_required: bool,
    pub quarantined: bool,
    /// Workers that did not exit before the close deadline (left detached).
    pub unjoined_workers: usize,
    /// `Store::close` was called and succeeded.
    pub store_closed: bool,
    pub store_error: Option<String>,
    /// Completions not yet polled, including the Shutdown rejections of queued jobs.
    pub completions: Vec<StorageDone>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub jobs: JobTable,
    pub completions: Vec<StorageDone>,
    pub health: HealthMonitor,
    pub closing: bool,
}

impl State {
    fn outstanding(&self) -> usize {
        self.jobs.len() + self.completions.len()
    }
}

/// What workers and the executor share.
pub(crate) struct Shared {
    pub store: Arc<dyn Store>,
    pub host: Arc<HostCacheStorage>,
    pub clock: SharedClock,
    pub runtime: StorageRuntimeConfig,
    pub failures_retire: bool,
    pub promotion: bool,
    pub state: Mutex<State>,
    pub settled: Condvar,
    /// Woken with every completion: the round loop of a rank whose requests all wait on
    /// storage sleeps on it (a permit is kept when nobody waits, so no wake is lost).
    pub completed: Arc<tokio::sync::Notify>,
    pub counters: Counters,
}

impl Shared {
    /// Pushes a completion and wakes waiters (caller holds the lock).
    pub fn push(&self, st: &mut State, done: StorageDone) {
        st.completions.push(done);
        self.settled.notify_all();
        self.completed.notify_one();
    }
}

pub struct L3Executor {
    shared: Arc<Shared>,
    senders: Option<[flume::Sender<Arc<Job>>; 3]>,
    workers: Vec<JoinHandle<()>>,
    /// Each worker sends its index when it exits.
    exited: flume::Receiver<usize>,
    closed: bool,
}

impl std::fmt::Debug for L3Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L3Executor")
            .field("store", &self.shared.store.name())
            .field("workers", &self.workers.len())
            .finish()
    }
}

fn rejection_span(kind: StorageOpKind, op: OperationId, keys: usize, bytes: u64) -> Span {
    info_span!(
        "l3_op",
        op = op.0,
        kind = kind.as_str(),
        keys,
        payload_bytes = bytes,
        outcome = field::Empty
    )
}

impl L3Executor {
    /// Starts the worker pools. Worker threads inherit the caller's tracing dispatcher.
    pub fn start(
        store: Arc<dyn Store>,
        host: Arc<HostCacheStorage>,
        runtime: StorageRuntimeConfig,
        clock: SharedClock,
    ) -> Result<Self, StartError> {
        for (name, v) in [
            ("query_workers", runtime.query_workers),
            ("get_workers", runtime.get_workers),
            ("put_workers", runtime.put_workers),
            ("query_queue_capacity", runtime.query_queue_capacity),
            ("get_queue_capacity", runtime.get_queue_capacity),
            ("put_queue_capacity", runtime.put_queue_capacity),
            ("outstanding_limit", runtime.outstanding_limit),
        ] {
            if v == 0 {
                return Err(StartError::Zero(name));
            }
        }
        let shared = Arc::new(Shared {
            failures_retire: store.failures_retire(),
            promotion: store.capabilities().promotion,
            store,
            host,
            clock,
            state: Mutex::new(State {
                jobs: JobTable::default(),
                completions: vec![],
                health: HealthMonitor::new(runtime.health_cooldown_ms.saturating_mul(1000)),
                closing: false,
            }),
            runtime: runtime.clone(),
            settled: Condvar::new(),
            completed: Arc::new(tokio::sync::Notify::new()),
            counters: Counters::default(),
        });
        let dispatch = tracing::dispatcher::get_default(|d| d.clone());
        let (exit_tx, exited) = flume::unbounded();
        let mut workers = vec![];
        let mut senders = vec![];
        for (kind, n, cap) in [
            (
                StorageOpKind::Query,
                runtime.query_workers,
                runtime.query_queue_capacity,
            ),
            (
                StorageOpKind::Get,
                runtime.get_workers,
                runtime.get_queue_capacity,
            ),
            (
                StorageOpKind::Put,
                runtime.put_workers,
                runtime.put_queue_capacity,
            ),
        ] {
            let (tx, rx) = flume::bounded::<Arc<Job>>(cap as usize);
            senders.push(tx);
            for i in 0..n {
                let index = workers.len();
                let (shared, rx, exit, dispatch) = (
                    shared.clone(),
                    rx.clone(),
                    exit_tx.clone(),
                    dispatch.clone(),
                );
                let h = std::thread::Builder::new()
                    .name(format!("l3-{}-{i}", kind.as_str()))
                    .spawn(move || {
                        tracing::dispatcher::with_default(&dispatch, || {
                            worker::run(&shared, &rx, exit, index)
                        })
                    });
                match h {
                    Ok(h) => workers.push(h),
                    Err(e) => {
                        // Workers already started exit once the senders drop.
                        return Err(StartError::Spawn(e.to_string()));
                    }
                }
            }
        }
        let senders: [flume::Sender<Arc<Job>>; 3] = match senders.try_into() {
            Ok(s) => s,
            Err(_) => return Err(StartError::Spawn("queue setup".into())),
        };
        Ok(Self {
            shared,
            senders: Some(senders),
            workers,
            exited,
            closed: false,
        })
    }

    /// Submits one command. Never fails: see the module docs for the settlement rule.
    pub fn submit(&self, op: StorageOp) -> Submitted {
        if let StorageOp::Cancel(c) = op {
            return self.cancel(c.op);
        }
        let kind = op.kind().unwrap_or(StorageOpKind::Query);
        let (id, n, bytes) = (op.id(), op.keys().len(), op.payload_bytes());
        let c = self.shared.counters.kind(kind);
        add(&c.submitted, 1);
        let span = rejection_span(kind, id, n, bytes);
        let spec = JobSpec::check(op, &self.shared.host);
        let now = self.shared.clock.now_us();
        let mut st = self.shared.state.lock();
        let verdict = match spec {
            _ if st.closing => Err(Rejection::Shutdown),
            _ if st.health.is_quarantined() => Err(Rejection::Quarantined),
            Err((_, why)) => {
                tracing::warn!(parent: &span, reason = %why, "invalid storage command");
                Err(Rejection::Invalid)
            }
            Ok(_) if st.jobs.contains_key(&id) => {
                tracing::warn!(parent: &span, "duplicate operation id");
                Err(Rejection::Invalid)
            }
            Ok(_) if st.outstanding() >= self.shared.runtime.outstanding_limit as usize => {
                Err(Rejection::OutstandingLimit)
            }
            Ok(spec) => self.enqueue(&mut st, spec, now, span.clone()),
        };
        match verdict {
            Ok(()) => Submitted::Queued,
            Err(why) => {
                add(&c.rejected, 1);
                span.record("outcome", why.as_str());
                tracing::info!(parent: &span, outcome = why.as_str(), "rejected");
                self.shared
                    .push(&mut st, StorageDone::rejected(id, kind, n, why));
                Submitted::Rejected(why)
            }
        }
    }

    fn enqueue(
        &self,
        st: &mut State,
        spec: JobSpec,
        now: u64,
        span: Span,
    ) -> Result<(), Rejection> {
        let Some(senders) = self.senders.as_ref() else {
            return Err(Rejection::Shutdown);
        };
        let adm = st.health.admit(now)?;
        let (id, kind) = (spec.op, spec.kind);
        let job = Arc::new(Job::new(spec, adm, now, span));
        st.jobs.insert(id, job.clone(), now);
        match senders[kind.index()].try_send(job.clone()) {
            Ok(()) => {
                tracing::debug!(parent: &job.span, probe = adm.probe, epoch = adm.epoch, "queued");
                Ok(())
            }
            Err(e) => {
                st.jobs.remove(&id);
                st.health.release_probe(adm);
                Err(match e {
                    flume::TrySendError::Full(_) => Rejection::QueueFull,
                    flume::TrySendError::Disconnected(_) => Rejection::Shutdown,
                })
            }
        }
    }

    fn cancel(&self, op: OperationId) -> Submitted {
        let mut st = self.shared.state.lock();
        let Some(t) = st.jobs.get(&op) else {
            return Submitted::CancelIgnored;
        };
        if t.phase != Phase::Queued || !t.job.try_cancel() {
            return Submitted::CancelIgnored;
        }
        let job = t.job.clone();
        st.jobs.remove(&op);
        self.settle_inert(&mut st, &job, Rejection::Cancelled);
        add(&self.shared.counters.kind(job.kind).cancelled, 1);
        Submitted::CancelAcknowledged
    }

    /// A queued job that will never run: its completion is a rejection.
    fn settle_inert(&self, st: &mut State, job: &Job, why: Rejection) {
        st.health.release_probe(job.admission);
        job.span.record("outcome", why.as_str());
        tracing::info!(parent: &job.span, outcome = why.as_str(), "cancelled");
        self.shared.push(
            st,
            StorageDone::rejected(job.op, job.kind, job.keys.len(), why),
        );
    }

    /// New completions and the pressure snapshot, under one lock. O(1) in the tracked jobs
    /// (the table keeps their pressure) and never calls storage.
    pub fn poll(&self) -> (Vec<StorageDone>, PressureSnapshot) {
        let now = self.shared.clock.now_us();
        let mut st = self.shared.state.lock();
        let done = std::mem::take(&mut st.completions);
        (done, st.jobs.snapshot(now))
    }

    /// Notified whenever a completion awaits `poll` (one stored permit when no task waits).
    pub fn completion_wake(&self) -> Arc<tokio::sync::Notify> {
        self.shared.completed.clone()
    }

    /// Health with its epoch. Never consumes the recovery probe.
    pub fn health(&self) -> HealthState {
        let now = self.shared.clock.now_us();
        self.shared.state.lock().health.state(now)
    }

    /// Counter snapshot plus current job gauges.
    pub fn stats(&self) -> ExecutorStats {
        let mut gauges = [JobGauges::default(); 3];
        {
            let st = self.shared.state.lock();
            for t in st.jobs.values() {
                let g = &mut gauges[t.job.kind.index()];
                match t.phase {
                    Phase::Queued => g.queued += 1,
                    Phase::Running => g.running += 1,
                    Phase::Unretired => g.unretired += 1,
                }
            }
            for d in &st.completions {
                gauges[d.kind.index()].undelivered += 1;
            }
        }
        self.shared.counters.read(gauges)
    }

    /// Blocks until at least `n` completions await `poll`, or `timeout` passes (a safety
    /// net for tests and the benchmark; no decision reads it). Returns whether they do.
    pub fn wait_undelivered(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.state.lock();
        while st.completions.len() < n {
            if self
                .shared
                .settled
                .wait_until(&mut st, deadline)
                .timed_out()
            {
                return st.completions.len() >= n;
            }
        }
        true
    }

    /// Stops admission and makes every queued job inert (settled as Shutdown).
    fn stop_admission(&mut self) {
        {
            let mut st = self.shared.state.lock();
            st.closing = true;
            let queued: Vec<Arc<Job>> = st
                .jobs
                .values()
                .filter(|t| t.phase == Phase::Queued)
                .map(|t| t.job.clone())
                .collect();
            for job in queued {
                if job.try_cancel() {
                    st.jobs.remove(&job.op);
                    self.settle_inert(&mut st, &job, Rejection::Shutdown);
                    add(&self.shared.counters.kind(job.kind).cancelled, 1);
                }
            }
        }
        // Workers drain the inert items and exit once the queues are empty.
        self.senders = None;
    }

    /// Joins the workers with the configured deadline, then closes the store, unless native
    /// retirement is unknown: then it keeps the store and the Host allocation for the
    /// process and reports that a restart is required.
    pub fn close(mut self) -> CloseReport {
        self.closed = true;
        self.stop_admission();
        let deadline =
            Instant::now() + Duration::from_millis(self.shared.runtime.close_deadline_ms);
        let total = self.workers.len();
        let mut exited = vec![false; total];
        let mut count = 0;
        while count < total {
            match self.exited.recv_deadline(deadline) {
                Ok(i) if i < total && !exited[i] => {
                    exited[i] = true;
                    count += 1;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let mut unjoined = 0;
        for (i, h) in std::mem::take(&mut self.workers).into_iter().enumerate() {
            if exited[i] {
                // The worker left its loop; joining waits only for its thread to return.
                let _ = h.join();
            } else {
                unjoined += 1; // still inside a store call: left detached
            }
        }
        let (quarantined, unretired, completions) = {
            let mut st = self.shared.state.lock();
            let unretired = st.jobs.values().any(|t| t.phase != Phase::Queued);
            (
                st.health.is_quarantined(),
                unretired,
                std::mem::take(&mut st.completions),
            )
        };
        let restart_required = quarantined || unretired || unjoined > 0;
        let (mut store_closed, mut store_error) = (false, None);
        if restart_required {
            self.shared.host.retain_for_process();
            // Keep the store client for the process: dropping the last reference could
            // release the client (and deregister the Host buffer) under unretired I/O.
            std::mem::forget(Arc::clone(&self.shared.store));
            tracing::error!(
                quarantined,
                unjoined_workers = unjoined,
                "L3 native retirement unknown: store kept for the process, restart required"
            );
        } else {
            match self.shared.store.close() {
                Ok(()) => store_closed = true,
                Err(e) => store_error = Some(e.to_string()),
            }
        }
        CloseReport {
            restart_required,
            quarantined,
            unjoined_workers: unjoined,
            store_closed,
            store_error,
            completions,
        }
    }
}

impl Drop for L3Executor {
    /// Dropping without `close` stops admission and lets workers exit on their own; it
    /// never blocks and never closes the store.
    fn drop(&mut self) {
        if !self.closed {
            self.stop_admission();
        }
    }
}
