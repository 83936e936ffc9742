//! Live tests of MooncakeStore against a real Mooncake master and an independent storage
//! owner (deploy/mooncake/: install.sh, start.sh, env.sh). The shared instance comes from
//! the environment (MOONCAKE_STORE_LIBRARY, MOONCAKE_MASTER, MOONCAKE_METADATA_SERVER);
//! tests that stop or fill a master start their own instance on their own ports through the
//! deploy scripts, so they never disturb the shared one. Without MOONCAKE_REQUIRE_MASTER=1
//! a missing library or master skips loudly ("SKIPPED: ..."); with it, it fails.
//!
//! Waiting on external processes uses bounded polls of their observable state (the
//! master's readiness, an object becoming readable), never asserted timings.

use actors::host::HostCacheStorage;
use actors::l3::store::mooncake::{live, MooncakeStore};
use actors::l3::store::{KeyResult, Store};
use actors::names::env;
use messages::settings::MooncakeStoreSettings;
use messages::{HostRange, Namespace, StorageKey};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const WRITER_ENV: &str = "TSL3_MOONCAKE_LIVE_WRITER";
const PAGE: usize = 64 * 1024;

/// The shared instance's settings, or None (skipped loudly) when there is no library or no
/// master listening.
fn shared(test: &str) -> Option<MooncakeStoreSettings> {
    live::settings_or_skip(test)
}

fn settings(lib: &str, master: &str, metadata: &str, tenant: &str) -> MooncakeStoreSettings {
    MooncakeStoreSettings {
        library_path: lib.into(),
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata.into(),
        master_server_addr: master.into(),
        protocol: "tcp".into(),
        device_name: String::new(),
        global_segment_size: 0,
        local_buffer_size: 0,
        tenant_id: tenant.into(),
        dfs_dir: String::new(),
    }
}

fn connect(s: &MooncakeStoreSettings) -> MooncakeStore {
    MooncakeStore::connect(s).unwrap_or_else(|e| panic!("connect to {}: {e}", s.master_server_addr))
}

/// A namespace no earlier run used (PUT is create-only).
fn fresh_namespace(tag: &str) -> Namespace {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Namespace(format!("tsl3live.{tag}+{}-{nanos:x}", std::process::id()).into())
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn keys(ns: &Namespace, n: u32, shard: u32) -> Vec<StorageKey> {
    (0..n)
        .map(|p| ns.key(0xabc0 + p as u128, 0, p, shard))
        .collect()
}

/// PUT `n` pages from `host` at `offsets`.
fn put_from_host(
    store: &MooncakeStore,
    host: &HostCacheStorage,
    keys: &[StorageKey],
    offsets: &[u64],
    len: usize,
) -> Vec<KeyResult> {
    let srcs: Vec<&[u8]> = offsets
        .iter()
        // SAFETY (test): these ranges are written by this test only, before the call.
        .map(|o| unsafe { host.range(HostRange::new(*o, len as u64)) }.unwrap())
        .collect();
    store.put(keys, &srcs).unwrap()
}

fn get_into_host(
    store: &MooncakeStore,
    host: &HostCacheStorage,
    keys: &[StorageKey],
    offsets: &[u64],
    len: usize,
) -> Result<Vec<KeyResult>, actors::l3::store::StoreError> {
    let mut dests: Vec<&mut [u8]> = offsets
        .iter()
        // SAFETY (test): disjoint ranges owned by this test for the call.
        .map(|o| unsafe { host.range_mut(HostRange::new(*o, len as u64)) }.unwrap())
        .collect();
    store.get(keys, &mut dests)
}

// ---------------------------------------------------------------------------------------
// Separate instances started through the deploy scripts.

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/mooncake")
}

struct Instance {
    name: String,
    ports: [u16; 4],
    segment: String,
    extra: String,
}

impl Instance {
    /// `base` .. `base + 3` become the rpc, metadata-http, metrics (the master's admin
    /// server) and owner ports. Keep them below Linux's ephemeral range (32768-60999 by
    /// default) and away from the 12000-17000 band the transfer engine draws its own
    /// ports from: a CI run once lost the tenants master to "Address already in use" on
    /// 50112, a port any outgoing connection could have been holding.
    fn new(name: &str, base: u16, segment: &str) -> Self {
        Self {
            name: name.into(),
            ports: [base, base + 1, base + 2, base + 3],
            segment: segment.into(),
            extra: String::new(),
        }
    }
    fn script(&self, script: &str, arg: &str, extra_env: &[(&str, &str)]) -> bool {
        let mut c = Command::new("bash");
        c.arg(deploy_dir().join(script))
            .arg(arg)
            .env("MOONCAKE_INSTANCE", &self.name)
            .env("MOONCAKE_RPC_PORT", self.ports[0].to_string())
            .env("MOONCAKE_HTTP_PORT", self.ports[1].to_string())
            .env("MOONCAKE_METRICS_PORT", self.ports[2].to_string())
            .env("MOONCAKE_OWNER_PORT", self.ports[3].to_string())
            .env("MOONCAKE_SEGMENT_SIZE", &self.segment)
            .env("MOONCAKE_MASTER_EXTRA_ARGS", &self.extra);
        for (k, v) in extra_env {
            c.env(k, v);
        }
        c.status().map(|s| s.success()).unwrap_or(false)
    }
    fn start(&self, what: &str) {
        // One startup at a time: the tests of this file run in parallel, and several
        // masters and owners starting together on a small machine can outlast the start
        // script's readiness wait.
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            self.script("start.sh", what, &[]),
            "start.sh {what} for {}",
            self.name
        );
    }
    fn stop(&self, what: &str) {
        assert!(
            self.script("stop.sh", what, &[]),
            "stop.sh {what} for {}",
            self.name
        );
    }
    fn kill(&self, what: &str) {
        assert!(
            self.script("stop.sh", what, &[("MOONCAKE_STOP_SIGNAL", "KILL")]),
            "kill {what} for {}",
            self.name
        );
    }
    fn settings(&self, base: &MooncakeStoreSettings) -> MooncakeStoreSettings {
        settings(
            &base.library_path,
            &format!("127.0.0.1:{}", self.ports[0]),
            &format!("http://127.0.0.1:{}/metadata", self.ports[1]),
            &base.tenant_id,
        )
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.script("stop.sh", "all", &[]);
    }
}

/// Polls `f` until it returns Some, for at most `limit` (a bound, not an assertion).
fn poll<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------------

#[test]
fn byte_round_trips_into_different_host_offsets() {
    let Some(s) = shared("byte_round_trips_into_different_host_offsets") else {
        return;
    };
    let store = connect(&s);
    let host = HostCacheStorage::new(64 * PAGE as u64).unwrap();
    store.register_host(&host).unwrap();
    let ns = fresh_namespace("rt");
    let ks = keys(&ns, 8, 0);
    let src_offsets: Vec<u64> = (0..8).map(|i| (i * PAGE) as u64).collect();
    let payloads: Vec<Vec<u8>> = (0..8).map(|i| pattern(i, PAGE)).collect();
    for (o, p) in src_offsets.iter().zip(&payloads) {
        host.write(*o, p).unwrap();
    }
    assert_eq!(store.query(&ks).unwrap(), vec![false; 8]);
    let put = put_from_host(&store, &host, &ks, &src_offsets, PAGE);
    assert_eq!(put, vec![KeyResult::Ok { bytes: PAGE as u64 }; 8]);
    assert_eq!(store.counters.new_writes.load(Ordering::Relaxed), 8);
    assert_eq!(store.counters.put_successes.load(Ordering::Relaxed), 8);
    assert_eq!(store.query(&ks).unwrap(), vec![true; 8]);

    // Read back, reversed, into other offsets, with guard bytes between destinations.
    let dst_offsets: Vec<u64> = (0..8).map(|i| ((40 - 3 * i) * PAGE) as u64 + 512).collect();
    let rev: Vec<StorageKey> = ks.iter().rev().cloned().collect();
    let got = get_into_host(&store, &host, &rev, &dst_offsets, PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: PAGE as u64 }; 8]);
    for (i, o) in dst_offsets.iter().enumerate() {
        let bytes = host.read(HostRange::new(*o, PAGE as u64)).unwrap();
        assert!(bytes == payloads[7 - i], "page {} at offset {o}", 7 - i);
    }
    // Destinations are written exactly: the bytes just before the first destination
    // (untouched zero Host memory) stay zero.
    assert!(host
        .read(HostRange::new(dst_offsets[0] - 512, 512))
        .unwrap()
        .iter()
        .all(|b| *b == 0));

    // A read shorter than its destination, an absent key: facts, not call failures.
    let got = get_into_host(&store, &host, &ks[..1], &[0], 2 * PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::ShortRead { bytes: PAGE as u64 }]);
    let absent = ns.key(0xdead, 0, 0, 0);
    let got = get_into_host(&store, &host, std::slice::from_ref(&absent), &[0], PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Missing]);
    assert_eq!(
        store.query(&[absent, ks[0].clone()]).unwrap(),
        vec![false, true]
    );

    // Removal of the namespace leaves safely retired misses, and spares a longer namespace
    // that starts with this one and a '-'.
    let longer = Namespace(format!("{}-x", ns.0).into());
    let spared = longer.key(0xabc0, 0, 0, 0);
    assert_eq!(
        store
            .put(std::slice::from_ref(&spared), &[&payloads[0]])
            .unwrap(),
        vec![KeyResult::Ok { bytes: PAGE as u64 }]
    );
    let removed = store.remove_namespace(&ns).unwrap();
    assert_eq!(removed, 8);
    assert_eq!(
        store.query(std::slice::from_ref(&spared)).unwrap(),
        vec![true]
    );
    assert_eq!(store.remove_namespace(&longer).unwrap(), 1);
    assert_eq!(store.query(&ks).unwrap(), vec![false; 8]);
    let got = get_into_host(&store, &host, &ks, &dst_offsets, PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Missing; 8]);
    assert_eq!(store.counters.backend_calls.load(Ordering::Relaxed), 13);
    store.close().unwrap();
}

#[test]
fn objects_outlive_their_writer() {
    // Writer mode: this same test, re-entered in a subprocess (global_segment_size = 0).
    if let Ok(ns) = std::env::var(WRITER_ENV) {
        let s = shared("objects_outlive_their_writer (writer)").expect("writer without a master");
        let store = connect(&s);
        assert_eq!(s.global_segment_size, 0);
        let ns = Namespace(ns.into());
        let ks = keys(&ns, 4, 0);
        let payloads: Vec<Vec<u8>> = (0..4).map(|i| pattern(100 + i, PAGE)).collect();
        let srcs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
        assert_eq!(
            store.put(&ks, &srcs).unwrap(),
            vec![KeyResult::Ok { bytes: PAGE as u64 }; 4]
        );
        return;
    }
    let Some(s) = shared("objects_outlive_their_writer") else {
        return;
    };
    let ns = fresh_namespace("outlive");
    let writer = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "objects_outlive_their_writer", "--nocapture"])
        .env(WRITER_ENV, &*ns.0)
        .output()
        .unwrap();
    assert!(
        writer.status.success(),
        "the writer subprocess failed: {}",
        String::from_utf8_lossy(&writer.stderr)
    );
    // The writer has exited; a new reader with a new Host allocation restores the objects.
    let store = connect(&s);
    let host = HostCacheStorage::new(8 * PAGE as u64).unwrap();
    store.register_host(&host).unwrap();
    let ks = keys(&ns, 4, 0);
    assert_eq!(store.query(&ks).unwrap(), vec![true; 4]);
    let offsets: Vec<u64> = (0..4).map(|i| ((7 - i) * PAGE) as u64).collect();
    let got = get_into_host(&store, &host, &ks, &offsets, PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: PAGE as u64 }; 4]);
    for (i, o) in offsets.iter().enumerate() {
        assert!(
            host.read(HostRange::new(*o, PAGE as u64)).unwrap() == pattern(100 + i as u64, PAGE)
        );
    }
    assert_eq!(store.remove_namespace(&ns).unwrap(), 4);
    let got = get_into_host(&store, &host, &ks, &offsets, PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Missing; 4]);
}

#[test]
fn kvp_owner_relocation_restores_at_another_offset() {
    let Some(s) = shared("kvp_owner_relocation_restores_at_another_offset") else {
        return;
    };
    // Two cyclic owners (ranks 0 and 1 of a page-sharded group with shard_count 2) name the
    // same payload replica (rank / shard_count = 0): the key has no rank and no Host offset.
    let ns = fresh_namespace("kvp");
    let shard_count = 2;
    let key_of_rank = |rank: u32, page: u32| ns.key(0x5eed, 1, page, rank / shard_count);
    assert_eq!(key_of_rank(0, 3), key_of_rank(1, 3));

    // Owner rank 0 writes page 3 from its Host allocation at offset 5 pages.
    let writer = connect(&s);
    let host_a = HostCacheStorage::new(16 * PAGE as u64).unwrap();
    writer.register_host(&host_a).unwrap();
    let payload = pattern(0x3, PAGE);
    host_a.write(5 * PAGE as u64, &payload).unwrap();
    let put = put_from_host(
        &writer,
        &host_a,
        &[key_of_rank(0, 3)],
        &[5 * PAGE as u64],
        PAGE,
    );
    assert_eq!(put, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    writer.close().unwrap();
    drop(writer);
    drop(host_a);

    // Owner rank 1, another client and another allocation, restores it at offset 2 pages + 4 KiB.
    let reader = connect(&s);
    let host_b = HostCacheStorage::new(4 * PAGE as u64).unwrap();
    reader.register_host(&host_b).unwrap();
    let at = 2 * PAGE as u64 + 4096;
    let got = get_into_host(&reader, &host_b, &[key_of_rank(1, 3)], &[at], PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    assert!(host_b.read(HostRange::new(at, PAGE as u64)).unwrap() == payload);
    // A second create-only PUT of the same key from the new owner is a success and keeps the
    // first bytes (this master answers 0, not -705, and does not overwrite).
    host_b.write(0, &pattern(0x4, PAGE)).unwrap();
    let again = put_from_host(&reader, &host_b, &[key_of_rank(1, 3)], &[0], PAGE);
    assert!(
        matches!(again[0], KeyResult::Ok { .. } | KeyResult::AlreadyExists),
        "{again:?}"
    );
    let got = get_into_host(&reader, &host_b, &[key_of_rank(0, 3)], &[PAGE as u64], PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    assert!(
        host_b
            .read(HostRange::new(PAGE as u64, PAGE as u64))
            .unwrap()
            == payload
    );
    assert_eq!(reader.remove_namespace(&ns).unwrap(), 1);
}

#[test]
fn tenant_isolation() {
    let Some(s) = shared("tenant_isolation") else {
        return;
    };
    let payload = pattern(0x7e, 4096);
    let with_tenant = |base: &MooncakeStoreSettings, t: &str| {
        connect(&settings(
            &base.library_path,
            &base.master_server_addr,
            &base.metadata_server,
            t,
        ))
    };

    // 1. A master started with --enable_multi_tenants and a quota policy isolates tenants.
    let mut inst = Instance::new("tenants", 27110, "64MB");
    let policy =
        std::env::temp_dir().join(format!("tsl3-mooncake-tenants-{}.yaml", std::process::id()));
    std::fs::write(
        &policy,
        "version: 1\ntenants:\n  - name: tsl3-a\n    quota: 16777216\n  - name: tsl3-b\n    quota: 16777216\n",
    )
    .unwrap();
    inst.extra = format!(
        "--enable_multi_tenants=true --tenant_quota_connector_uri={}",
        policy.display()
    );
    inst.start("all");
    let strict = inst.settings(&s);
    let (a, b) = (
        with_tenant(&strict, "tsl3-a"),
        with_tenant(&strict, "tsl3-b"),
    );
    assert_eq!(a.tenant(), "tsl3-a");
    let ns = fresh_namespace("tenant");
    let k = keys(&ns, 1, 0);
    assert_eq!(
        a.put(&k, &[&payload]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );
    assert_eq!(a.query(&k).unwrap(), vec![true]);
    assert_eq!(b.query(&k).unwrap(), vec![false]);
    let mut d = vec![0u8; 4096];
    assert_eq!(
        b.get(&k, &mut [&mut d[..]]).unwrap(),
        vec![KeyResult::Missing]
    );
    assert!(d.iter().all(|x| *x == 0));
    // A namespace removal in one tenant leaves the other's objects alone.
    assert_eq!(b.remove_namespace(&ns).unwrap(), 0);
    assert_eq!(
        a.get(&k, &mut [&mut d[..]]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );
    assert!(d == payload);
    // The same key in tenant b is a separate object.
    let other = pattern(0x7f, 4096);
    assert_eq!(
        b.put(&k, &[&other]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );
    assert_eq!(
        b.get(&k, &mut [&mut d[..]]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );
    assert!(d == other);
    // A tenant missing from the policy cannot write: an unretired failure
    // (TENANT_NOT_REGISTERED, -1701), as the contract reads any other negative code.
    let c = with_tenant(&strict, "tsl3-unregistered");
    assert_eq!(
        c.put(&keys(&ns, 1, 1), &[&payload]).unwrap(),
        vec![KeyResult::Failed {
            code: -1701,
            retired: false
        }]
    );
    let _ = std::fs::remove_file(&policy);

    // 2. Observed on this version: a master without --enable_multi_tenants (the shared
    // one) does NOT isolate tenants: setup_with_tenant is accepted and every tenant sees
    // every object. Deployments that need isolation must enable strict tenants.
    let (x, y) = (with_tenant(&s, "tsl3-x"), with_tenant(&s, "tsl3-y"));
    let ns = fresh_namespace("tenant-shared");
    let k = keys(&ns, 1, 0);
    assert_eq!(
        x.put(&k, &[&payload]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );
    assert_eq!(y.query(&k).unwrap(), vec![true]);
    assert_eq!(y.remove_namespace(&ns).unwrap(), 1);
}

#[test]
fn recovery_after_a_master_restart() {
    let Some(s) = shared("recovery_after_a_master_restart") else {
        return;
    };
    let inst = Instance::new("restart", 27130, "64MB");
    inst.start("all");
    let store = connect(&inst.settings(&s));
    let ns = fresh_namespace("restart");
    let page = pattern(0x11, 4096);
    let before = keys(&ns, 1, 0);
    assert_eq!(
        store.put(&before, &[&page]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );

    inst.stop("master");
    // While the master is down: PUT and GET rows are unretired failures (RPC_FAIL), and a
    // QUERY fails as a whole call; none is a miss, a capacity rejection or a success.
    let down = keys(&ns, 1, 1);
    let put = store.put(&down, &[&page]).unwrap();
    assert!(
        matches!(put[0], KeyResult::Failed { retired: false, .. }),
        "{put:?}"
    );
    assert!(store.query(&before).is_err());
    let mut d = vec![0u8; 4096];
    let got = store.get(&before, &mut [&mut d[..]]).unwrap();
    assert!(
        matches!(got[0], KeyResult::Failed { retired: false, .. }),
        "{got:?}"
    );

    inst.start("master");
    inst.start("ready");
    // The same client recovers once the master serves again and the owner has remounted.
    let after = keys(&ns, 1, 2);
    let put = poll(Duration::from_secs(30), || {
        store
            .put(&after, &[&page])
            .ok()
            .filter(|r| r[0] != KeyResult::Capacity)
    })
    .expect("no PUT answer after the restart");
    assert_eq!(put, vec![KeyResult::Ok { bytes: 4096 }]);
    assert_eq!(store.query(&after).unwrap(), vec![true]);
    assert_eq!(
        store.get(&after, &mut [&mut d[..]]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );
    assert!(d == page);
    // The master keeps metadata in memory: objects written before the restart are
    // retired misses afterwards (their bytes are unreachable without metadata).
    assert_eq!(
        store.get(&before, &mut [&mut d[..]]).unwrap(),
        vec![KeyResult::Missing]
    );
}

#[test]
fn storage_owner_killed_mid_run() {
    let Some(s) = shared("storage_owner_killed_mid_run") else {
        return;
    };
    let inst = Instance::new("ownerkill", 27140, "64MB");
    inst.start("all");
    let store = connect(&inst.settings(&s));
    let ns = fresh_namespace("ownerkill");
    let page = pattern(0x22, 4096);
    let written = keys(&ns, 1, 0);
    assert_eq!(
        store.put(&written, &[&page]).unwrap(),
        vec![KeyResult::Ok { bytes: 4096 }]
    );

    inst.kill("owner");
    // The bytes are gone with their owner. First the master still has the metadata: GETs
    // fail unretired (TRANSFER_FAIL) and PUTs too; once the master drops the dead owner's
    // segment, GETs are retired misses and PUTs are allocation rejections (Capacity).
    let mut d = vec![0u8; 4096];
    let mut first = None;
    let mut fresh = 100;
    let settled = poll(Duration::from_secs(30), || {
        let got = store.get(&written, &mut [&mut d[..]]).unwrap()[0];
        assert!(
            matches!(
                got,
                KeyResult::Failed { retired: false, .. } | KeyResult::Missing
            ),
            "GET after the owner died: {got:?}"
        );
        fresh += 1;
        let put = store.put(&keys(&ns, 1, fresh), &[&page]).unwrap()[0];
        assert!(
            matches!(
                put,
                KeyResult::Failed { retired: false, .. } | KeyResult::Capacity
            ),
            "PUT after the owner died: {put:?}"
        );
        first.get_or_insert((got, put));
        (got == KeyResult::Missing && put == KeyResult::Capacity).then_some(())
    });
    assert!(
        settled.is_some(),
        "the master never dropped the dead owner's segment"
    );
    let (got, put) = first.unwrap();
    assert!(
        matches!(
            got,
            KeyResult::Failed {
                code: -800,
                retired: false
            }
        ),
        "{got:?}"
    );
    assert!(
        matches!(
            put,
            KeyResult::Failed {
                code: -800,
                retired: false
            }
        ),
        "{put:?}"
    );
    assert!(d.iter().all(|b| *b == 0), "no bytes came from a dead owner");
    assert_eq!(store.query(&written).unwrap(), vec![false]);
}

#[test]
fn full_segment_is_capacity_not_failure() {
    let Some(s) = shared("full_segment_is_capacity_not_failure") else {
        return;
    };
    let inst = Instance::new("capacity", 27150, "16MB");
    inst.start("all");
    let store = connect(&inst.settings(&s));
    let ns = fresh_namespace("capacity");
    let mib = 1usize << 20;
    let big = pattern(0x33, mib);
    let ks = keys(&ns, 24, 0);
    let srcs: Vec<&[u8]> = (0..24).map(|_| big.as_slice()).collect();
    let put = store.put(&ks, &srcs).unwrap();
    let ok = put
        .iter()
        .filter(|r| **r == KeyResult::Ok { bytes: mib as u64 })
        .count();
    let capacity = put.iter().filter(|r| **r == KeyResult::Capacity).count();
    // 24 MiB into a 16 MiB segment: the master rejects the overflow with -200 per page,
    // immediately, and nothing else fails.
    assert_eq!(ok + capacity, 24, "{put:?}");
    assert!(ok > 0 && capacity > 0, "{put:?}");
    assert_eq!(store.counters.new_writes.load(Ordering::Relaxed), ok as u64);
    assert_eq!(
        store.counters.put_successes.load(Ordering::Relaxed),
        ok as u64
    );
    // Accepted pages are whole; rejected ones are absent (the scheduler re-offers them).
    // The full segment also triggers the master's eviction, which may drop an accepted
    // page: that reads as a retired miss, never as other bytes.
    let mut d = vec![0u8; mib];
    let mut readable = 0;
    for (k, r) in ks.iter().zip(&put) {
        d.fill(0);
        let got = store
            .get(std::slice::from_ref(k), &mut [&mut d[..]])
            .unwrap()[0];
        if *r == KeyResult::Capacity {
            assert_eq!(got, KeyResult::Missing);
        } else if got == KeyResult::Missing {
            assert!(d.iter().all(|b| *b == 0));
        } else {
            assert_eq!(got, KeyResult::Ok { bytes: mib as u64 });
            assert!(d == big);
            readable += 1;
        }
    }
    assert!(readable > 0);
    // After the namespace is removed the rejected pages fit.
    let removed = store.remove_namespace(&ns).unwrap();
    assert!(removed >= readable && removed <= ok as u64, "{removed}");
    let retry: Vec<StorageKey> = ks
        .iter()
        .zip(&put)
        .filter(|(_, r)| **r == KeyResult::Capacity)
        .map(|(k, _)| k.clone())
        .collect();
    let srcs: Vec<&[u8]> = retry.iter().map(|_| big.as_slice()).collect();
    let again = store.put(&retry, &srcs).unwrap();
    assert!(
        again
            .iter()
            .all(|r| *r == KeyResult::Ok { bytes: mib as u64 }),
        "{again:?}"
    );
}

#[test]
fn bench_runs_both_clients_against_the_same_master() {
    let Some(s) = shared("bench_runs_both_clients_against_the_same_master") else {
        return;
    };
    let Ok(python) = std::env::var(env::MOONCAKE_PYTHON) else {
        live::skip(
            "bench_runs_both_clients_against_the_same_master",
            "$MOONCAKE_PYTHON unset (source deploy/mooncake/env.sh)",
        );
        return;
    };
    // A small run (the figures are reported, never asserted): both clients verify bytes.
    let r =
        actors::l3::store::mooncake::bench::bench_mooncake(&s, &python, 16, 64 * 1024, 1).unwrap();
    assert!(r.tsl3.put_gib_s > 0.0 && r.python.get_gib_s > 0.0);
    eprintln!("{}", r.render());
}
