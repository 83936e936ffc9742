//! Cross-process flat-KV transfer (seed 000, "test/runtime/test_l3_flat_kv_e2e.py"): a
//! writer process computes one prompt's packed history (Full) and state (State checkpoint)
//! blocks on the emulated device, copies them D2H into Host, PUTs them through the L3
//! executor and exits. A fresh reader process then allocates new Host and device buffers,
//! GETs the objects into different Host offsets and H2Ds them into different device slots,
//! checks exact bytes (and that every byte outside the restored blocks is untouched), runs
//! the forward over the restored prefix against recomputation, deletes the objects and
//! verifies safely retired misses.
//!
//! Both roles are this test binary re-entered with TSL3_FLAT_KV_TEST_CHILD (writer|reader).
//! The local store (a temporary directory) always runs; the Mooncake case is gated like
//! mooncake_live.rs: without MOONCAKE_REQUIRE_MASTER=1 a missing library or master skips
//! loudly ("SKIPPED: ..." on stderr), with it, it fails.

use actors::clock::SystemClock;
use actors::device::{
    DeviceCopy, DeviceCopyBatch, DeviceCopyEngineCore, DeviceGeometry, DeviceMemory, DeviceSlot,
    EmulatedDeviceMemory, FenceId, ForwardStep, GroupBlockTable,
};
use actors::host::HostCacheStorage;
use actors::l3::store::local::{LocalStore, LocalStoreConfig, DEFAULT_PROMOTION_TTL_US};
use actors::l3::store::mooncake::{live, MooncakeStore};
use actors::l3::store::Store;
use actors::l3::{L3Executor, Submitted};
use actors::model::{Shard, SyntheticModel};
use actors::names::env;
use messages::settings::{MooncakeStoreSettings, StorageRuntimeConfig};
use messages::{
    HostRange, Namespace, ObjectFailure, OperationId, StorageDone, StorageGetOp, StorageKey,
    StorageOp, StoragePutOp, StorageQueryOp,
};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

const PROFILE: &str = "hybrid-state";
/// Tokens of the stored prefix (a multiple of the State checkpoint interval, 8).
const BOUNDARY: u64 = 40;
const HOST_SENTINEL: u8 = 0xA5;
const DEVICE_SENTINEL: u8 = 0x5A;

// ---------------------------------------------------------------------------------------
// What both processes derive from the namespace alone.

/// One stored block: its group, block index, byte length and key.
struct Block {
    group: usize,
    block: u64,
    len: u64,
    key: StorageKey,
}

struct Plan {
    model: SyntheticModel,
    /// The whole prompt: the stored prefix plus one new token.
    tokens: Vec<u32>,
    /// The blocks a request whose prefix ends at BOUNDARY needs, group by group.
    blocks: Vec<Block>,
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn plan(ns: &Namespace) -> Plan {
    let model = SyntheticModel::by_name(PROFILE).unwrap();
    let salt = fnv(&ns.0);
    let mut x = salt | 1;
    let vocab = model.profile().vocab as u64;
    let tokens: Vec<u32> = (0..=BOUNDARY)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab) as u32
        })
        .collect();
    let content = ((salt as u128) << 64) | 0xf1a7;
    let mut blocks = vec![];
    for g in 0..model.profile().groups.len() {
        for b in model.required_blocks(g, BOUNDARY).unwrap() {
            blocks.push(Block {
                group: g,
                block: b,
                len: model.block_len(g, b, BOUNDARY, Shard::SINGLE).unwrap(),
                key: ns.key(content, g as u32, b as u32, 0),
            });
        }
    }
    Plan {
        model,
        tokens,
        blocks,
    }
}

impl Plan {
    fn keys(&self) -> Vec<StorageKey> {
        self.blocks.iter().map(|b| b.key.clone()).collect()
    }
    /// The exact bytes of a stored block, from the model (never from the writer).
    fn expected(&self, b: &Block) -> Vec<u8> {
        self.model
            .kv_block_bytes(
                b.group,
                &self.tokens[..BOUNDARY as usize],
                b.block,
                Shard::SINGLE,
            )
            .unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// Stores and the executor.

fn mooncake_settings() -> MooncakeStoreSettings {
    live::settings_from_env().unwrap()
}

/// `local:<dir>` or `mooncake` (a pure client with the Host buffer registered).
fn open_store(spec: &str, host: &Arc<HostCacheStorage>) -> Arc<dyn Store> {
    if let Some(dir) = spec.strip_prefix("local:") {
        let cfg = LocalStoreConfig {
            dir: dir.into(),
            memory_bytes: 1 << 20,
            promotion_workers: 1,
            staging_bytes: 1 << 20,
            max_promotions_in_flight: 4,
            dfs_io_concurrency: 2,
            promotion_ttl_us: DEFAULT_PROMOTION_TTL_US,
            promote_after_get: false,
        };
        Arc::new(LocalStore::open(&cfg, SystemClock::shared()).unwrap())
    } else {
        assert_eq!(spec, "mooncake");
        let m = MooncakeStore::connect(&mooncake_settings()).unwrap();
        m.register_host(host).unwrap();
        Arc::new(m)
    }
}

fn runtime() -> StorageRuntimeConfig {
    StorageRuntimeConfig {
        query_workers: 1,
        get_workers: 2,
        put_workers: 2,
        query_queue_capacity: 4,
        get_queue_capacity: 4,
        put_queue_capacity: 4,
        outstanding_limit: 16,
        health_cooldown_ms: 1000,
        close_deadline_ms: 10_000,
    }
}

/// Submits one operation and returns its completion (a bounded wait on the executor's
/// settlement, not a timing).
fn run_op(exec: &L3Executor, op: StorageOp) -> StorageDone {
    let id = op.id();
    assert_eq!(exec.submit(op), Submitted::Queued);
    assert!(exec.wait_undelivered(1, Duration::from_secs(120)));
    let (mut done, _) = exec.poll();
    assert_eq!(done.len(), 1, "{done:?}");
    let d = done.pop().unwrap();
    assert_eq!(d.op, id);
    d.validate().unwrap();
    d
}

fn wait_fence(e: &mut DeviceCopyEngineCore<EmulatedDeviceMemory>, f: FenceId) {
    for _ in 0..1000 {
        if e.poll_fences().unwrap().contains(&f) {
            return;
        }
    }
    panic!("fence {f:?} never completed");
}

// ---------------------------------------------------------------------------------------
// The two roles.

fn writer(spec: &str, ns: &Namespace) {
    let p = plan(ns);
    let m = &p.model;
    let host = HostCacheStorage::new(64 * 1024).unwrap();
    let slot_bytes = m.profile().max_shard_block_bytes(1).unwrap();
    let mem = EmulatedDeviceMemory::new(host.clone(), DeviceGeometry::new(32, slot_bytes).unwrap())
        .unwrap();
    let mut e = DeviceCopyEngineCore::new(mem);
    // Prefill of the whole prompt from an empty context: every written block gets a slot.
    let end = p.tokens.len() as u64;
    let mut next = 0u32;
    let mut slot_of = std::collections::HashMap::new();
    let mut groups = vec![];
    for g in 0..m.profile().groups.len() {
        let mut t = GroupBlockTable::default();
        for b in m.written_blocks(g, 0, end).unwrap() {
            slot_of.insert((g, b), DeviceSlot(next));
            t.written.push(DeviceSlot(next));
            next += 1;
        }
        groups.push(t);
    }
    e.forward(
        m,
        &ForwardStep {
            shard: Shard::SINGLE,
            tokens: p.tokens.clone(),
            context_len: 0,
            groups,
            sampling: messages::SamplingParams::GREEDY,
            copy_on_write: vec![],
        },
    )
    .unwrap();
    // D2H of the stored blocks, packed back to back in Host.
    let mut offset = 0;
    let sources: Vec<HostRange> = p
        .blocks
        .iter()
        .map(|b| {
            let r = HostRange::new(offset, b.len);
            offset += b.len;
            r
        })
        .collect();
    let d2h = DeviceCopyBatch::new(
        p.blocks
            .iter()
            .zip(&sources)
            .map(|(b, r)| DeviceCopy::d2h(slot_of[&(b.group, b.block)], 0, *r))
            .collect(),
    );
    let f = e.submit(&d2h).unwrap();
    wait_fence(&mut e, f);
    for (b, r) in p.blocks.iter().zip(&sources) {
        assert_eq!(host.read(*r).unwrap(), p.expected(b), "D2H of g{}", b.group);
    }
    // PUT through the executor.
    let store = open_store(spec, &host);
    let exec = L3Executor::start(store, host.clone(), runtime(), SystemClock::shared()).unwrap();
    let put = run_op(
        &exec,
        StorageOp::Put(StoragePutOp {
            op: OperationId(1),
            keys: p.keys(),
            sources,
        }),
    );
    assert!(put.fully_succeeded(), "{put:?}");
    assert!(put.retired);
    assert_eq!(
        put.new_writes as usize,
        p.blocks.len(),
        "fresh keys: {put:?}"
    );
    let q = run_op(
        &exec,
        StorageOp::Query(StorageQueryOp {
            op: OperationId(2),
            request: None,
            keys: p.keys(),
        }),
    );
    assert_eq!(q.success, vec![true; p.blocks.len()]);
    let report = exec.close();
    assert!(!report.restart_required, "{report:?}");
    assert!(report.store_closed, "{report:?}");
    println!("FLAT-KV WRITER DONE {}", p.blocks.len());
}

fn reader(spec: &str, ns: &Namespace) {
    let p = plan(ns);
    let m = &p.model;
    let n = p.blocks.len();
    // New buffers of other sizes than the writer's, filled with sentinels.
    let host_len = 96 * 1024;
    let host = HostCacheStorage::new(host_len).unwrap();
    host.write(0, &vec![HOST_SENTINEL; host_len as usize])
        .unwrap();
    let slot_bytes = m.profile().max_shard_block_bytes(1).unwrap() + 32;
    let slots = 48u32;
    let mem = EmulatedDeviceMemory::new(
        host.clone(),
        DeviceGeometry::new(slots, slot_bytes).unwrap(),
    )
    .unwrap();
    let mut e = DeviceCopyEngineCore::new(mem);
    for s in 0..slots {
        e.write_slot(
            DeviceSlot(s),
            0,
            &vec![DEVICE_SENTINEL; slot_bytes as usize],
        )
        .unwrap();
    }
    // Destinations: reversed block order, unaligned, with gaps between them.
    let mut dests = vec![HostRange::new(0, 0); n];
    let mut offset = 4096 + 7;
    for i in (0..n).rev() {
        dests[i] = HostRange::new(offset, p.blocks[i].len);
        offset += p.blocks[i].len + 37;
    }
    let store = open_store(spec, &host);
    let exec = L3Executor::start(
        store.clone(),
        host.clone(),
        runtime(),
        SystemClock::shared(),
    )
    .unwrap();
    let get = run_op(
        &exec,
        StorageOp::Get(StorageGetOp {
            op: OperationId(1),
            request: None,
            keys: p.keys(),
            destinations: dests.clone(),
        }),
    );
    assert!(get.fully_succeeded(), "{get:?}");
    assert!(get.retired);
    assert_eq!(
        get.bytes,
        p.blocks.iter().map(|b| b.len).collect::<Vec<_>>()
    );
    // Host: exact bytes inside the destinations, the sentinel everywhere else.
    let mut want_host = vec![HOST_SENTINEL; host_len as usize];
    for (b, r) in p.blocks.iter().zip(&dests) {
        want_host[r.offset as usize..r.end() as usize].copy_from_slice(&p.expected(b));
    }
    let restored_host = host.read(HostRange::new(0, host_len)).unwrap();
    assert!(
        restored_host == want_host,
        "Host bytes differ from the model's blocks or outside the destinations"
    );
    // H2D into other slots than the writer's (descending from the top), slot offset 0.
    let slot_of: Vec<DeviceSlot> = (0..n as u32).map(|i| DeviceSlot(slots - 1 - i)).collect();
    let h2d = DeviceCopyBatch::new(
        dests
            .iter()
            .zip(&slot_of)
            .map(|(r, s)| DeviceCopy::h2d(*r, *s, 0))
            .collect(),
    );
    let f = e.submit(&h2d).unwrap();
    wait_fence(&mut e, f);
    let mut want_arena = vec![DEVICE_SENTINEL; (slots as u64 * slot_bytes) as usize];
    for (b, s) in p.blocks.iter().zip(&slot_of) {
        let at = e.memory().slot_address(s.0) as usize;
        want_arena[at..at + b.len as usize].copy_from_slice(&p.expected(b));
    }
    assert!(
        e.memory().arena() == want_arena.as_slice(),
        "device bytes differ from the model's blocks or outside the restored blocks"
    );
    // The forward over the restored prefix (one new token) equals recomputation.
    let end = p.tokens.len() as u64;
    let mut free = (0..slots - n as u32).map(DeviceSlot);
    let groups: Vec<GroupBlockTable> = (0..m.profile().groups.len())
        .map(|g| GroupBlockTable {
            context: p
                .blocks
                .iter()
                .zip(&slot_of)
                .filter(|(b, _)| b.group == g)
                .map(|(_, s)| *s)
                .collect(),
            written: m
                .written_blocks(g, BOUNDARY, end)
                .unwrap()
                .map(|_| free.next().unwrap())
                .collect(),
        })
        .collect();
    let out = e
        .forward(
            m,
            &ForwardStep {
                shard: Shard::SINGLE,
                tokens: p.tokens.clone(),
                context_len: BOUNDARY,
                groups,
                sampling: messages::SamplingParams::GREEDY,
                copy_on_write: vec![],
            },
        )
        .unwrap();
    assert_eq!(out.new_tokens, 1);
    let got = m.first_token(m.reduce_ranks(&[out.digest]).unwrap()).0;
    assert_eq!(got, m.recompute_output(&p.tokens, 1).unwrap()[0]);
    // Delete, then every key is a safely retired miss that leaves the Host bytes alone.
    assert_eq!(store.remove_namespace(ns).unwrap(), n as u64);
    let q = run_op(
        &exec,
        StorageOp::Query(StorageQueryOp {
            op: OperationId(2),
            request: None,
            keys: p.keys(),
        }),
    );
    assert_eq!(q.success, vec![false; n], "{q:?}");
    let miss = run_op(
        &exec,
        StorageOp::Get(StorageGetOp {
            op: OperationId(3),
            request: None,
            keys: p.keys(),
            destinations: dests,
        }),
    );
    assert!(miss.retired, "{miss:?}");
    assert!(miss.rejection.is_none() && miss.error.is_none(), "{miss:?}");
    assert_eq!(miss.success, vec![false; n]);
    assert_eq!(miss.failures, vec![Some(ObjectFailure::Missing); n]);
    assert!(
        host.read(HostRange::new(0, host_len)).unwrap() == restored_host,
        "a retired miss wrote into Host"
    );
    let report = exec.close();
    assert!(!report.restart_required, "{report:?}");
    assert!(report.store_closed, "{report:?}");
    println!("FLAT-KV READER DONE {n}");
}

// ---------------------------------------------------------------------------------------
// The parent: one child process per role, in turn.

/// Runs this test binary's `test` in a child with `role`; returns its stdout.
fn child(test: &str, role: &str, spec: &str, ns: &Namespace) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env::FLAT_KV_TEST_CHILD, role)
        .env(env::FLAT_KV_TEST_STORE, spec)
        .env(env::FLAT_KV_TEST_NAMESPACE, &*ns.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{role} failed: {}\n{stdout}",
        out.status
    );
    stdout
}

/// In a child: runs its role and returns true.
fn as_child() -> bool {
    let Ok(role) = std::env::var(env::FLAT_KV_TEST_CHILD) else {
        return false;
    };
    let spec = std::env::var(env::FLAT_KV_TEST_STORE).unwrap();
    let ns = Namespace(std::env::var(env::FLAT_KV_TEST_NAMESPACE).unwrap().into());
    match role.as_str() {
        "writer" => writer(&spec, &ns),
        "reader" => reader(&spec, &ns),
        other => panic!("unknown role {other}"),
    }
    true
}

/// A namespace no earlier run used (the shared Mooncake master keeps objects across runs),
/// in the `tsl3-<16 hex>` form every store accepts.
fn fresh_namespace(tag: &str) -> Namespace {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let h = fnv(&format!("flat-kv.{tag}+{}-{nanos:x}", std::process::id()));
    Namespace(format!("tsl3-{h:016x}").into())
}

fn writer_then_reader(test: &str, spec: &str, ns: &Namespace) {
    let n = plan(ns).blocks.len();
    assert_eq!(
        n, 11,
        "10 Full blocks and the State checkpoint at the boundary"
    );
    let w = child(test, "writer", spec, ns);
    assert!(w.contains(&format!("FLAT-KV WRITER DONE {n}")), "{w}");
    // The writer process has exited (reaped above) before the reader allocates anything.
    let r = child(test, "reader", spec, ns);
    assert!(r.contains(&format!("FLAT-KV READER DONE {n}")), "{r}");
}

#[test]
fn flat_kv_crosses_processes_through_the_local_store() {
    if as_child() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("local:{}", dir.path().display());
    writer_then_reader(
        "flat_kv_crosses_processes_through_the_local_store",
        &spec,
        &fresh_namespace("local"),
    );
}

/// Whether the shared Mooncake instance is reachable (else skipped loudly or failed).
fn mooncake_available(test: &str) -> bool {
    live::settings_or_skip(test).is_some()
}

#[test]
fn flat_kv_crosses_processes_through_mooncake() {
    const TEST: &str = "flat_kv_crosses_processes_through_mooncake";
    if as_child() {
        return;
    }
    if !mooncake_available(TEST) {
        return;
    }
    writer_then_reader(TEST, "mooncake", &fresh_namespace("mooncake"));
}
