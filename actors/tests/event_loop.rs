//! The event loop as a harness runs it (Quickwit-style): the real actor set of a rank (the
//! L3 executor and the DeviceCopyEngine as actors, the round owner holding the Scheduler
//! and the StorageTransferManager) driven by `engine::event_loop::run` over a loopback
//! ControlPlane, fed through the frontend inbox like the HTTP side feeds it. It serves
//! requests, answers an admin command, quits cleanly on a stop (drained, every client
//! answered, the executor closed), and fails every client with the round's cause when the
//! mesh fails.

use actors::clock::SystemClock;
use actors::engine::admin::AdminContext;
use actors::engine::event_loop::{self, LoopConfig, LoopShared};
use actors::engine::factory::{build_rank, RankSpec};
use actors::engine::ports::MeshPort;
use actors::engine::sync_ports::Loopback;
use actors::frontend::health::RankHealth;
use actors::frontend::{AdminCommand, AdminSubmission, FrontendInbox, Submission, TokenEvent};
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use actors::metrics::{MetricLabels, Metrics};
use messages::{AgreedRound, ControlError, RoundReport};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Rig {
    submissions: flume::Sender<Submission>,
    admin: flume::Sender<AdminSubmission>,
    shared: Arc<LoopShared>,
    store: Arc<MemoryStore>,
}

fn rig(inbox_capacity: usize) -> (Rig, FrontendInbox, LoopConfig, actors::engine::ActorRank) {
    let store = Arc::new(MemoryStore::new());
    let s: Arc<dyn Store> = store.clone();
    let spec = RankSpec::small(true);
    let engine = build_rank(&spec, SystemClock::shared(), {
        let s = s.clone();
        move |_| Ok(s)
    })
    .unwrap()
    .into_actors();
    let (stx, submissions) = flume::bounded(inbox_capacity);
    let (atx, admin) = flume::bounded(4);
    let shared = Arc::new(LoopShared {
        metrics: Metrics::new(&MetricLabels {
            model: "test".into(),
            role: "test".into(),
            dp_rank: 0,
            tp_rank: 0,
            replica: "harness".into(),
        })
        .unwrap(),
        health: Arc::new(RankHealth::new(false)),
        stop: Default::default(),
        done: Default::default(),
        ended: Default::default(),
        local_store: None,
    });
    let cfg = LoopConfig {
        leader: true,
        shutdown_drain: Duration::from_secs(10),
        emulate_device_time: false,
        admin: AdminContext {
            spec,
            store: Some(s),
            reset_idle_wait_us: 60_000_000,
        },
    };
    (
        Rig {
            submissions: stx,
            admin: atx,
            shared,
            store,
        },
        FrontendInbox {
            submissions,
            admin,
            wake: Default::default(),
        },
        cfg,
        engine,
    )
}

fn submit(rig: &Rig, salt: u32) -> flume::Receiver<TokenEvent> {
    let (events, rx) = flume::unbounded();
    rig.submissions
        .send(Submission {
            prompt: (0..40).map(|i| (i * 37 + salt) % 991).collect(),
            max_tokens: 3,
            sampling: messages::SamplingParams::GREEDY,
            events,
        })
        .unwrap();
    rx
}

/// Every event of one request, until it is done or failed.
async fn answer(rx: &flume::Receiver<TokenEvent>) -> Vec<TokenEvent> {
    let mut out = vec![];
    loop {
        match tokio::time::timeout(Duration::from_secs(30), rx.recv_async()).await {
            Ok(Ok(ev)) => {
                let last = !matches!(ev, TokenEvent::Token(..));
                out.push(ev);
                if last {
                    return out;
                }
            }
            other => panic!("no answer: {other:?} after {out:?}"),
        }
    }
}

#[actix_rt::test]
async fn the_loop_serves_answers_admin_and_quits_cleanly_on_stop() {
    let (rig, inbox, cfg, engine) = rig(16);
    let shared = rig.shared.clone();
    let handle = actix_rt::spawn(event_loop::run(
        cfg,
        engine,
        Loopback::default(),
        inbox,
        shared.clone(),
    ));
    let clients: Vec<_> = (0..3).map(|i| submit(&rig, i)).collect();
    for rx in &clients {
        let evs = answer(rx).await;
        assert_eq!(evs.len(), 4, "three tokens and done: {evs:?}");
        assert!(matches!(evs[3], TokenEvent::Done { .. }), "{evs:?}");
    }
    // An admin command applies once quiescent and answers its client.
    let (reply, result) = flume::bounded(1);
    rig.admin
        .send(AdminSubmission {
            command: AdminCommand::ClearCache,
            reply,
        })
        .unwrap();
    let cleared = tokio::time::timeout(Duration::from_secs(30), result.recv_async())
        .await
        .expect("the admin command is answered")
        .unwrap();
    assert!(
        cleared.as_ref().is_ok_and(|m| m.contains("cleared")),
        "{cleared:?}"
    );
    // A request held across the stop still finishes; then the loop drains and quits.
    let late = submit(&rig, 9);
    let first = tokio::time::timeout(Duration::from_secs(30), late.recv_async())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, TokenEvent::Token(..)), "{first:?}");
    shared.stop.store(true, Ordering::SeqCst);
    let start = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("the loop quits")
        .expect("the loop task ran to its end");
    assert!(result.is_ok(), "{result:?}");
    assert!(start.elapsed() < Duration::from_secs(30));
    let rest: Vec<_> = late.drain().collect();
    assert!(
        rest.iter().any(|e| matches!(e, TokenEvent::Done { .. })),
        "the held request finished before the quit: {rest:?}"
    );
    // After the quit: a new submission is never taken (the inbox is gone with the loop).
    let (events, _rx) = flume::unbounded();
    assert!(rig
        .submissions
        .send(Submission {
            prompt: vec![1],
            max_tokens: 1,
            sampling: messages::SamplingParams::GREEDY,
            events,
        })
        .is_err());
    // The exporter ran, the health says stopping, and the backups landed in the store.
    let text = shared.metrics.render();
    assert!(text.contains("tsl3_rounds_total"), "metrics exported");
    let (ready, doc) = shared.health.render();
    assert!(!ready, "a stopped rank is not ready: {doc}");
    assert!(!rig.store.is_empty(), "the drain landed the backups");
}

/// A mesh that fails at a given round (a dead peer).
struct FailAt {
    inner: Loopback,
    round: u64,
}

impl MeshPort for FailAt {
    async fn exchange(&mut self, report: RoundReport) -> Result<AgreedRound, ControlError> {
        if report.round >= self.round {
            return Err(ControlError::Disconnected {
                rank: 1,
                round: report.round,
                detail: "connection reset".into(),
            });
        }
        self.inner.exchange(report).await
    }
}

#[actix_rt::test]
async fn a_failed_round_fails_every_client_with_its_cause_and_ends_the_loop() {
    let (rig, inbox, cfg, engine) = rig(16);
    let shared = rig.shared.clone();
    // Requests queued before the loop starts: the first rounds take them, then the mesh
    // fails while they run.
    let clients: Vec<_> = (0..3).map(|i| submit(&rig, i)).collect();
    let mesh = FailAt {
        inner: Loopback::default(),
        round: 3,
    };
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        event_loop::run(cfg, engine, mesh, inbox, shared.clone()),
    )
    .await
    .expect("the loop ends");
    let err = result.expect_err("the round failed");
    assert_eq!(err.round, 3);
    assert!(err.cause.contains("rank 1 disconnected"), "{err}");
    for rx in &clients {
        let evs: Vec<_> = rx.drain().collect();
        let failed = evs.iter().find_map(|e| match e {
            TokenEvent::Failed(why) => Some(why.clone()),
            _ => None,
        });
        let why = failed.unwrap_or_else(|| panic!("every client fails: {evs:?}"));
        assert!(why.contains("the replica failed in round 3"), "{why}");
    }
    let failure = actors::frontend::HealthSource::failure(&*shared.health);
    assert!(failure.is_some_and(|f| f.contains("round 3")));
}
