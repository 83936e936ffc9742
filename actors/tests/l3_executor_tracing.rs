//! The L3 executor's tracing spans carry op id, kind, key count, payload bytes and
//! outcome, and never object keys. Alone in its own test binary: tracing's per-callsite
//! interest cache races with scoped subscribers when unrelated tests run in parallel.

use actors::clock::{ManualClock, SharedClock};
use actors::host::storage::HostCacheStorage;
use actors::l3::store::faulty::{Call, Fault, FaultyStore, Gate};
use actors::l3::store::memory::MemoryStore;
use actors::l3::L3Executor;
use messages::settings::StorageRuntimeConfig;
use messages::{
    HostRange, OperationId, StorageCancelOp, StorageGetOp, StorageKey, StorageOp, StoragePutOp,
};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn key(s: &str) -> StorageKey {
    StorageKey::new(format!("tsl3-00000000000000aa-{s}"))
}

fn get(id: u64, k: &str, offset: u64) -> StorageOp {
    StorageOp::Get(StorageGetOp {
        op: OperationId(id),
        request: None,
        keys: vec![key(k)],
        destinations: vec![HostRange::new(offset, 8)],
    })
}

#[test]
fn spans_carry_op_kind_counts_and_outcome_but_never_keys() {
    let buf = Buf::default();
    let b2 = buf.clone();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || b2.clone())
        .finish();
    tracing::subscriber::with_default(sub, || {
        let store = Arc::new(FaultyStore::new(MemoryStore::new(), true));
        let gate = Gate::new();
        store.inject(Call::Get, Some(1), Fault::Gate(gate.clone()));
        let host = HostCacheStorage::new(1 << 16).unwrap();
        let clock: SharedClock = ManualClock::new(0);
        let rt = StorageRuntimeConfig {
            query_workers: 1,
            get_workers: 1,
            put_workers: 1,
            query_queue_capacity: 4,
            get_queue_capacity: 4,
            put_queue_capacity: 4,
            outstanding_limit: 16,
            health_cooldown_ms: 100,
            close_deadline_ms: 5000,
        };
        let exec = L3Executor::start(store, host.clone(), rt, clock).unwrap();
        host.write(0, &[5; 8]).unwrap();
        exec.submit(StorageOp::Put(StoragePutOp {
            op: OperationId(41),
            keys: vec![key("secret-a")],
            sources: vec![HostRange::new(0, 8)],
        }));
        assert!(exec.wait_undelivered(1, Duration::from_secs(30)));
        assert_eq!(exec.poll().0.len(), 1);
        exec.submit(get(42, "secret-a", 4096));
        gate.wait_entered(1);
        exec.submit(get(43, "secret-b", 8192));
        exec.submit(StorageOp::Cancel(StorageCancelOp {
            op: OperationId(43),
        }));
        gate.release();
        assert!(exec.wait_undelivered(2, Duration::from_secs(30)));
        assert!(!exec.close().restart_required);
    });
    let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    for needle in [
        "op=41",
        "kind=\"put\"",
        "keys=1",
        "payload_bytes=8",
        "queued",
        "started",
        "l3_backend_call",
        "outcome=\"ok\"",
        "outcome=\"cancelled\"",
    ] {
        assert!(out.contains(needle), "missing {needle} in:\n{out}");
    }
    assert!(!out.contains("secret"), "object keys leaked:\n{out}");
}
