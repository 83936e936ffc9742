//! With no tracing subscriber the scheduler keeps no request or storage-operation spans:
//! tracing's disabled callsites make every span `Span::none()` and the bookkeeping is
//! skipped. Alone in its own test binary (one test, no subscriber anywhere in the process),
//! since a scoped subscriber on a parallel test would enable the callsites.

use actors::clock::SystemClock;
use actors::device::DeviceBackendChoice;
use actors::engine::agree_single;
use actors::engine::factory::{build_rank, RankSpec};
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use messages::settings::{PressureWatermark, StorageConfig, StorageRuntimeConfig};
use messages::RequestId;
use std::sync::Arc;

#[test]
fn without_a_subscriber_no_span_is_kept() {
    let storage = (
        StorageConfig {
            operation_credits: 16,
            max_host_blocks: 512,
            max_keys_per_operation: 256,
            lookahead_tokens: 0,
            negative_metadata_capacity: 64,
            backup_candidate_capacity: 256,
            soft_deadline_ms: 60_000,
            ready_hold_ms: 60_000,
            min_extension_tokens: 1,
            pressure_high: PressureWatermark {
                queued_jobs: 10_000,
                queued_bytes: 1 << 40,
                oldest_age_ms: 600_000,
            },
            pressure_low: PressureWatermark {
                queued_jobs: 5_000,
                queued_bytes: 1 << 39,
                oldest_age_ms: 300_000,
            },
        },
        StorageRuntimeConfig {
            query_workers: 1,
            get_workers: 1,
            put_workers: 1,
            query_queue_capacity: 32,
            get_queue_capacity: 32,
            put_queue_capacity: 32,
            outstanding_limit: 64,
            health_cooldown_ms: 1000,
            close_deadline_ms: 2000,
        },
    );
    let spec = RankSpec {
        profile: "tiny".into(),
        rank: 0,
        world: 1,
        device_blocks: 64,
        host_blocks: 256,
        max_running: 4,
        checkpoint: String::new(),
        target_weight_version: 1,
        draft_weight_version: None,
        storage: Some(storage),
        device: DeviceBackendChoice::Emulated,
    };
    let store = Arc::new(MemoryStore::new());
    let mut e = build_rank(&spec, SystemClock::shared(), move |_| {
        let s: Arc<dyn Store> = store;
        Ok(s)
    })
    .unwrap();
    let prompt: Vec<u32> = (0..30).map(|i| (i * 31 + 11) % 997).collect();
    let agreed = agree_single(e.head(), vec![(RequestId(1), prompt, 2)], vec![]).unwrap();
    e.run_round(agreed).unwrap();
    assert_eq!(e.scheduler().live_requests(), 1);
    assert!(e.scheduler().request_span(RequestId(1)).is_none());
    let stm = e.scheduler().stm().unwrap();
    assert_eq!(stm.stats().outstanding_tickets, 1, "the QUERY was issued");
    let op = stm.tickets().next().unwrap().op;
    assert!(
        e.scheduler().op_span(op).is_none(),
        "no bookkeeping when no subscriber is interested"
    );
    e.close();
}
