//! With no tracing subscriber the scheduler keeps no request or storage-operation spans:
//! tracing's disabled callsites make every span `Span::none()` and the bookkeeping is
//! skipped. Alone in its own test binary (one test, no subscriber anywhere in the process),
//! since a scoped subscriber on a parallel test would enable the callsites.

use actors::clock::SystemClock;
use actors::engine::agree_single;
use actors::engine::factory::{build_rank, RankSpec};
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use messages::RequestId;
use std::sync::Arc;

#[test]
fn without_a_subscriber_no_span_is_kept() {
    let spec = RankSpec::small(true);
    let store = Arc::new(MemoryStore::new());
    let mut e = build_rank(&spec, SystemClock::shared(), move |_| {
        let s: Arc<dyn Store> = store;
        Ok(s)
    })
    .unwrap();
    let prompt: Vec<u32> = (0..30).map(|i| (i * 31 + 11) % 997).collect();
    let agreed = agree_single(e.head_now(), vec![(RequestId(1), prompt, 2)], vec![]).unwrap();
    e.run_round_now(agreed).unwrap();
    assert_eq!(e.scheduler().live_requests(), 1);
    assert!(e.scheduler().request_span(RequestId(1)).is_none());
    let stm = e.stm().unwrap();
    assert_eq!(stm.stats().outstanding_tickets, 1, "the QUERY was issued");
    let op = stm.tickets().next().unwrap().op;
    assert!(
        stm.op_span(op).is_none(),
        "no bookkeeping when no subscriber is interested"
    );
    e.close_now();
}
