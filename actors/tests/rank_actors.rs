//! The round owner through its two adapters. The actor form (what `engine-host serve` runs:
//! the L3 executor and the DeviceCopyEngine as actors on the loop's arbiter) restores from
//! L3 what another rank backed up; the round submits committed operations to its executor
//! port in plan order, each inside its span; and one trace driven through the synchronous
//! and the actor adapters emits the same rounds — reports, operations, work and events.

use actors::clock::{ManualClock, SharedClock, SystemClock};
use actors::engine::factory::{build_rank, RankSpec};
use actors::engine::ports::{ExecutorPoll, ExecutorPort, ExecutorSnapshot, TracedOp};
use actors::engine::sync_ports::Loopback;
use actors::engine::{agree_single, ActorRank, EngineError, RankEngine, RoundWork};
use actors::l3::actor::Snapshot;
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use actors::l3::{CloseReport, ExecutorStats};
use actors::scheduler::request::PrefixSplit;
use actors::scheduler::RequestEvent;
use messages::{FrontendMessage, OperationId, RequestId, StorageOpKind};
use std::sync::Arc;
use std::time::Duration;

fn sync_rank(store: Arc<MemoryStore>, clock: SharedClock) -> RankEngine {
    let s: Arc<dyn Store> = store;
    build_rank(&RankSpec::small(true), clock, move |_| Ok(s)).unwrap()
}

fn rank(store: Arc<MemoryStore>) -> ActorRank {
    sync_rank(store, SystemClock::shared()).into_actors()
}

fn prompt() -> Vec<u32> {
    (0..40).map(|i| (i * 37 + 5) % 991).collect()
}

/// Serves one request to completion, then rounds until no storage ticket is outstanding
/// and no backup candidate waits (the backups have retired).
async fn serve(r: &mut ActorRank, id: u64, prompt: &[u32]) -> (Vec<u32>, PrefixSplit) {
    let mut tokens = vec![];
    let mut split = None;
    let mut frontend = vec![(RequestId(id), prompt.to_vec(), 3)];
    for _ in 0..50_000 {
        let head = r.head().await.unwrap();
        let agreed = agree_single(head, std::mem::take(&mut frontend), vec![]).unwrap();
        r.run_round(agreed).await.unwrap();
        for ev in r.drain_events() {
            match ev {
                RequestEvent::Token(_, t, _) => tokens.push(t),
                RequestEvent::Finished { split: s, .. } => split = Some(s),
                RequestEvent::Aborted(_, why) => panic!("aborted: {why}"),
            }
        }
        if split.is_some() {
            let stm = r.view().await.unwrap().stm.unwrap();
            if stm.outstanding_tickets == 0 && stm.queued_backup_candidates == 0 {
                break;
            }
        }
        tokio::task::yield_now().await;
    }
    (tokens, split.expect("the request finished"))
}

#[actix_rt::test]
async fn a_fresh_rank_of_actors_restores_from_l3_what_another_backed_up() {
    let store = Arc::new(MemoryStore::new());
    let p = prompt();
    let mut writer = rank(store.clone());
    let (first, split) = serve(&mut writer, 1, &p).await;
    assert_eq!(split.l3, 0, "nothing to restore yet: {split:?}");
    assert!(split.computed > 0);
    let view = writer.view().await.unwrap();
    assert!(view.executor.unwrap().kind(StorageOpKind::Put).completed > 0);
    assert!(writer.close().await.is_some());

    let mut reader = rank(store);
    let (second, split) = serve(&mut reader, 1, &p).await;
    assert!(split.l3 > 0, "the prefix came from L3: {split:?}");
    assert_eq!(first, second, "restored KV gives the recomputed tokens");
    let view = reader.view().await.unwrap();
    let stm = view.stm.unwrap();
    assert_eq!(
        stm.operation_credits_in_use, 0,
        "credits return at quiescence"
    );
    assert_eq!(stm.host_credits_in_use, 0);
    assert_eq!(view.scheduler.live_requests, 0);
    reader.close().await;
}

/// What crossed an executor port: (operation, kind, key count, inside a span).
type Seen = Vec<(OperationId, Option<StorageOpKind>, usize, bool)>;

/// An executor port that records every submitted operation, then hands it on.
struct Probe<X> {
    inner: X,
    seen: Arc<parking_lot::Mutex<Seen>>,
}

impl<X: ExecutorPort> ExecutorPort for Probe<X> {
    async fn submit(&mut self, ops: Vec<TracedOp>) -> Result<(), EngineError> {
        self.seen.lock().extend(
            ops.iter()
                .map(|(op, span)| (op.id(), op.kind(), op.keys().len(), span.is_some())),
        );
        self.inner.submit(ops).await
    }
    async fn poll(&mut self) -> Result<ExecutorPoll, EngineError> {
        self.inner.poll().await
    }
    async fn snapshot(&mut self) -> Result<ExecutorSnapshot, EngineError> {
        self.inner.snapshot().await
    }
    async fn close(self) -> Option<CloseReport> {
        self.inner.close().await
    }
}

fn idle(stats: &ExecutorStats) -> bool {
    stats.jobs.iter().all(|j| j.queued + j.running == 0)
}

/// One emitted round: this rank's report (completions and digests), the operations
/// submitted, the work and the request events.
#[derive(Debug, PartialEq)]
struct Emitted {
    completions: Vec<messages::StorageDone>,
    digests: Vec<messages::round::PrefillDigest>,
    ops: Seen,
    work: (usize, u64, usize, bool, u64, bool),
    events: Vec<RequestEvent>,
}

fn work_of(w: &RoundWork) -> (usize, u64, usize, bool, u64, bool) {
    (
        w.forwards,
        w.device_time_us,
        w.storage_ops,
        w.storage_pending,
        w.backups_queued,
        w.shutdown,
    )
}

/// The trace: four requests (two sharing a prefix, one cancelled while it runs), arriving
/// over the first rounds.
fn trace(round: u64) -> Vec<FrontendMessage> {
    let req = |id: u64, salt: u32, n: u32| FrontendMessage::NewRequest {
        id: RequestId(id),
        prompt: (0..n).map(|i| (i * 37 + salt) % 991).collect(),
        max_tokens: 3,
        // one request samples (seeded, with log-probabilities): both forms draw alike
        sampling: if id == 3 {
            messages::SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                top_k: 50,
                seed: 42,
                logprobs: Some(3),
            }
        } else {
            messages::SamplingParams::GREEDY
        },
    };
    match round {
        1 => vec![req(1, 5, 40), req(2, 9, 24)],
        3 => vec![req(3, 5, 40)],
        4 => vec![FrontendMessage::Cancel { id: RequestId(2) }],
        6 => vec![req(4, 13, 56)],
        _ => vec![],
    }
}

#[actix_rt::test]
async fn one_trace_through_the_sync_and_the_actor_adapters_emits_the_same_rounds() {
    // Both ranks read one manual clock (advanced 1 ms per round) and wait, before each head,
    // until their executor finished every submitted job: both then poll the same records.
    let clock = ManualClock::new(1_000);
    let shared: SharedClock = clock.clone();
    let sync_seen = Arc::new(parking_lot::Mutex::new(Seen::new()));
    let actor_seen = Arc::new(parking_lot::Mutex::new(Seen::new()));
    let s = sync_seen.clone();
    let mut a = sync_rank(Arc::new(MemoryStore::new()), shared.clone())
        .map_ports(|inner| Probe { inner, seen: s }, |d| d);
    let s = actor_seen.clone();
    let mut b = sync_rank(Arc::new(MemoryStore::new()), shared)
        .into_actors()
        .map_ports(|inner| Probe { inner, seen: s }, |d| d);
    let (mut mesh_a, mut mesh_b) = (Loopback::default(), Loopback::default());
    let mut ended = std::collections::BTreeSet::new();
    let mut rounds = 0;
    let mut submitted = 0;
    let mut forwards = 0;
    for round in 1..=400u64 {
        for _ in 0..10_000 {
            let a_idle = idle(&a.executor().unwrap().inner.stats());
            let b_stats = b.executor().unwrap().inner.send(Snapshot).await.unwrap();
            if a_idle && idle(b_stats.stats.as_ref().unwrap()) {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Idle executors: every completion is waiting to be polled.
        let mut report_a = actors::engine::sync_ports::now(a.head()).unwrap();
        let mut report_b = b.head().await.unwrap();
        report_a.frontend = trace(round);
        report_b.frontend = trace(round);
        let mut emitted = vec![];
        for (report, seen) in [(&report_a, &sync_seen), (&report_b, &actor_seen)] {
            seen.lock().clear();
            // Records of different worker pools arrive in any order; the agreement orders them.
            let mut completions = report.completions.clone();
            completions.sort_by_key(|d| d.op);
            emitted.push(Emitted {
                completions,
                digests: report.digests.clone(),
                ops: vec![],
                work: Default::default(),
                events: vec![],
            });
        }
        let agreed_a = mesh_a.agree(report_a).unwrap();
        let agreed_b = mesh_b.agree(report_b).unwrap();
        assert_eq!(
            agreed_a, agreed_b,
            "round {round}: the agreed rounds differ"
        );
        let work_a = actors::engine::sync_ports::now(a.run_round(agreed_a)).unwrap();
        let work_b = b.run_round(agreed_b).await.unwrap();
        for (e, (w, events, seen)) in emitted.iter_mut().zip([
            (work_a, a.drain_events(), &sync_seen),
            (work_b, b.drain_events(), &actor_seen),
        ]) {
            e.work = work_of(&w);
            e.ops = seen.lock().clone();
            for ev in &events {
                match ev {
                    RequestEvent::Finished { id, .. } | RequestEvent::Aborted(id, _) => {
                        ended.insert(*id);
                    }
                    RequestEvent::Token(..) => {}
                }
            }
            e.events = events;
        }
        assert_eq!(emitted[0], emitted[1], "round {round}");
        submitted += emitted[0].ops.len();
        forwards += emitted[0].work.0;
        clock.advance_ms(1);
        rounds = round;
        if ended.len() == 4 && work_a.storage_idle() {
            break;
        }
    }
    assert_eq!(ended.len(), 4, "every request of the trace ended");
    assert!(rounds < 400, "the trace settles");
    assert!(
        submitted >= 4 && forwards >= 4,
        "the trace exercised storage and the device: {submitted} operations, {forwards} forwards in {rounds} rounds"
    );
    let stm = a.stm().unwrap().stats();
    assert!(
        stm.last_operation_id > 0,
        "the trace exercised storage: {stm:?}"
    );
    assert!(a.close().await.is_some());
    assert!(b.close().await.is_some());
}

/// Device memory whose fences never complete (a hung device): copies and forwards run, but
/// `completed` reports nothing.
struct HungFences(actors::device::EmulatedDeviceMemory);

impl actors::device::DeviceMemory for HungFences {
    fn backend(&self) -> &'static str {
        "hung"
    }
    fn geometry(&self) -> actors::device::DeviceGeometry {
        self.0.geometry()
    }
    fn slot_address(&self, slot: u32) -> u64 {
        self.0.slot_address(slot)
    }
    fn host(&self) -> &Arc<actors::host::HostCacheStorage> {
        self.0.host()
    }
    fn enqueue(
        &mut self,
        copies: &[actors::device::ResolvedCopy],
    ) -> Result<(), actors::device::DeviceError> {
        self.0.enqueue(copies)
    }
    fn record_fence(
        &mut self,
        fence: actors::device::FenceId,
    ) -> Result<(), actors::device::DeviceError> {
        self.0.record_fence(fence)
    }
    fn completed(&mut self) -> Result<Vec<actors::device::FenceId>, actors::device::DeviceError> {
        let _ = self.0.completed()?;
        Ok(vec![])
    }
    fn read(&mut self, addr: u64, out: &mut [u8]) -> Result<(), actors::device::DeviceError> {
        self.0.read(addr, out)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), actors::device::DeviceError> {
        self.0.write(addr, data)
    }
    fn host_view(
        &mut self,
    ) -> Result<Option<actors::device::HostView<'_>>, actors::device::DeviceError> {
        self.0.host_view()
    }
    fn set_digest_unit(&mut self, unit: usize) {
        self.0.set_digest_unit(unit)
    }
}

#[actix_rt::test]
async fn a_hung_device_fence_fails_the_round_naming_the_rank_without_blocking_the_thread() {
    use actix::Actor;
    let r = sync_rank(Arc::new(MemoryStore::new()), SystemClock::shared());
    let layout = r.scheduler().layout().clone();
    let geometry =
        actors::device::DeviceGeometry::new(layout.device_slots(), layout.slot_bytes()).unwrap();
    let memory = actors::device::EmulatedDeviceMemory::new(r.host().clone(), geometry).unwrap();
    let core = actors::device::DeviceCopyEngineCore::new(
        Box::new(HungFences(memory)) as Box<dyn actors::device::DeviceMemory>
    );
    let model = r.model().clone();
    let deadline = Duration::from_millis(300);
    let mut r = r.map_ports(
        |e| actors::l3::L3ExecutorActor::new(e).start(),
        |_| actors::engine::actor_ports::DeviceActorPort {
            addr: actors::device::DeviceCopyEngine::from_core(core, model).start(),
            rank: 0,
            fence_deadline: deadline,
        },
    );
    // A task on the same thread ticks while the round waits for the fence.
    let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = ticks.clone();
    let ticker = actix_rt::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            t.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut frontend = vec![(RequestId(1), prompt(), 3)];
    let start = std::time::Instant::now();
    let mut failure = None;
    // Bounded by wall time, not by a count of rounds: a release build rounds faster than
    // the executor answers the request's QUERY, so it may take many rounds to reach the
    // forward whose D2H fence hangs.
    while start.elapsed() < Duration::from_secs(4) {
        let head = r.head().await.unwrap();
        let agreed = agree_single(head, std::mem::take(&mut frontend), vec![]).unwrap();
        if let Err(e) = r.run_round(agreed).await {
            failure = Some(e);
            break;
        }
    }
    let waited = start.elapsed();
    ticker.abort();
    let e = failure.expect("the round with the D2H fence fails");
    assert!(
        matches!(e, EngineError::FenceTimeout { rank: 0, .. }),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("rank 0") && msg.contains("300 ms"), "{msg}");
    assert!(
        waited >= deadline && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert!(
        ticks.load(std::sync::atomic::Ordering::SeqCst) >= 10,
        "the round thread kept running other work while the fence was awaited"
    );
    r.close().await;
}
