//! The actor form of a rank (what `engine-host serve` runs): the Scheduler and the
//! StorageTransferManager behind typed mailboxes, driven round by round by RankActors, on a
//! real L3 executor and MemoryStore. Also one actor wired to a probe: the
//! StorageTransferManagerActor sends committed operations to its executor recipient in plan
//! order.

use actix::{Actor, Context, Handler};
use actors::clock::SystemClock;
use actors::engine::actors::RankActors;
use actors::engine::agree_single;
use actors::engine::factory::{build_rank, small_storage, RankSpec};
use actors::l3::actor::SubmitTraced;
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use actors::scheduler::request::PrefixSplit;
use actors::scheduler::RequestEvent;
use actors::storage_transfer::actor::{BeginRound, CommitPlan, StorageTransferManagerActor};
use actors::storage_transfer::{RoundInput, StorageIntent, StoragePlanner, StorageTransferManager};
use messages::{OperationId, RequestId, StorageKey, StorageOp};
use std::sync::Arc;

fn rank(store: Arc<MemoryStore>) -> RankActors {
    let s: Arc<dyn Store> = store;
    build_rank(&RankSpec::small(true), SystemClock::shared(), move |_| {
        Ok(s)
    })
    .unwrap()
    .into_actors()
}

fn prompt() -> Vec<u32> {
    (0..40).map(|i| (i * 37 + 5) % 991).collect()
}

/// Serves one request to completion, then rounds until no storage ticket is outstanding
/// and no backup candidate waits (the backups have retired).
async fn serve(r: &mut RankActors, id: u64, prompt: &[u32]) -> (Vec<u32>, PrefixSplit) {
    let mut tokens = vec![];
    let mut split = None;
    let mut frontend = vec![(RequestId(id), prompt.to_vec(), 3)];
    for _ in 0..50_000 {
        let head = r.head().await.unwrap();
        let agreed = agree_single(head, std::mem::take(&mut frontend), vec![]).unwrap();
        r.run_round(agreed).await.unwrap();
        for ev in r.take_events() {
            match ev {
                RequestEvent::Token(_, t) => tokens.push(t),
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
    assert!(
        view.executor
            .unwrap()
            .kind(messages::StorageOpKind::Put)
            .completed
            > 0
    );
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

/// Records what the manager sends to its executor.
#[derive(Default)]
struct ProbeExecutor {
    seen: Arc<parking_lot::Mutex<Vec<(StorageOp, bool)>>>,
}

impl Actor for ProbeExecutor {
    type Context = Context<Self>;
}

impl Handler<SubmitTraced> for ProbeExecutor {
    type Result = ();
    fn handle(&mut self, m: SubmitTraced, _: &mut Context<Self>) {
        let mut seen = self.seen.lock();
        for (op, span) in m.0 {
            seen.push((op, span.is_some()));
        }
    }
}

fn key(i: u32) -> StorageKey {
    StorageKey::new(format!("tsl3-0000000000000000/k{i}"))
}

#[actix_rt::test]
async fn the_manager_actor_commits_a_plan_and_submits_it_in_plan_order() {
    let cfg = small_storage().0;
    let probe = ProbeExecutor::default();
    let seen = probe.seen.clone();
    let probe = probe.start();
    let stm = StorageTransferManagerActor::new(
        StorageTransferManager::new(cfg.clone()),
        probe.recipient(),
    )
    .start();
    let report = stm
        .send(BeginRound(RoundInput {
            tick_us: 1_000,
            ..RoundInput::default()
        }))
        .await
        .unwrap()
        .unwrap();
    let mut planner = StoragePlanner::new(cfg);
    planner.begin(report.view, report.put_candidates);
    let mut planned = vec![];
    for r in 1..=3u64 {
        let (op, lease) = planner
            .issue_query(RequestId(r), vec![key(r as u32)], None)
            .unwrap();
        planned.push(op);
        let _ = lease; // the requests stay waiting
    }
    let committed = stm
        .send(CommitPlan(planner.take_intents()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(committed.submitted, 3);
    assert_eq!(committed.outstanding_tickets, 3);
    // The probe handles the submission after the commit's reply: a round trip through its
    // mailbox orders after it.
    probe_drain(&stm).await;
    let seen = seen.lock();
    let ids: Vec<OperationId> = seen.iter().map(|(op, _)| op.id()).collect();
    assert_eq!(ids, planned, "submitted in plan order with the planned IDs");
    assert!(seen.iter().all(|(op, _)| matches!(op, StorageOp::Query(_))));
    assert_eq!(
        seen.iter().map(|(op, _)| op.request()).collect::<Vec<_>>(),
        vec![Some(RequestId(1)), Some(RequestId(2)), Some(RequestId(3))]
    );
}

/// A second, empty commit through the same mailboxes: its reply comes after the probe
/// handled the first commit's submission (both actors share this test's arbiter).
async fn probe_drain(stm: &actix::Addr<StorageTransferManagerActor>) {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    let _ = stm.send(CommitPlan(Vec::new())).await;
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

#[actix_rt::test]
async fn a_plan_the_manager_would_decide_differently_is_a_protocol_error() {
    let cfg = small_storage().0;
    let probe = ProbeExecutor::default().start();
    let stm = StorageTransferManagerActor::new(StorageTransferManager::new(cfg), probe.recipient())
        .start();
    // The planner believes operation 7 comes next; the manager's next ID is 1.
    let intents = vec![StorageIntent::Query {
        request: RequestId(1),
        keys: vec![key(1)],
        parent: None,
        expect: Ok((OperationId(7), 1)),
    }];
    let err = stm.send(CommitPlan(intents)).await.unwrap().unwrap_err();
    assert!(err.to_string().contains("diverged"), "{err}");
}
