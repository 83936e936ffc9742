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
use actors::l3::store::mooncake::MooncakeStore;
use actors::l3::store::{KeyResult, Store};
use actors::names::env;
use messages::settings::MooncakeStoreSettings;
use messages::{HostRange, Namespace, StorageKey};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WRITER_ENV: &str = "TSL3_MOONCAKE_LIVE_WRITER";
const PAGE: usize = 64 * 1024;

fn required() -> bool {
    std::env::var(env::MOONCAKE_REQUIRE_MASTER).is_ok_and(|v| v == "1")
}

/// The shared instance's settings, or None (skipped loudly) when it is not configured.
fn shared(test: &str) -> Option<MooncakeStoreSettings> {
    let lib = std::env::var(env::MOONCAKE_STORE_LIBRARY).unwrap_or_default();
    let master = std::env::var(env::MOONCAKE_MASTER).unwrap_or_default();
    if lib.is_empty() || master.is_empty() {
        let why = format!(
            "{test}: ${} or ${} unset (run deploy/mooncake/install.sh, start.sh and source env.sh)",
            env::MOONCAKE_STORE_LIBRARY,
            env::MOONCAKE_MASTER
        );
        assert!(!required(), "{} is 1 but {why}", env::MOONCAKE_REQUIRE_MASTER);
        eprintln!("SKIPPED: {why}");
        return None;
    }
    let metadata = std::env::var(env::MOONCAKE_METADATA_SERVER)
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "P2PHANDSHAKE".into());
    Some(settings(&lib, &master, &metadata, "default"))
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
    Namespace(format!("tsl3live.{tag}+{}-{nanos:x}", std::process::id()))
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
    (0..n).map(|p| ns.key(0xabc0 + p as u128, 0, p, shard)).collect()
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
        assert!(self.script("start.sh", what, &[]), "start.sh {what} for {}", self.name);
    }
    fn stop(&self, what: &str) {
        assert!(self.script("stop.sh", what, &[]), "stop.sh {what} for {}", self.name);
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

    // A short destination, an absent key: facts, not call failures.
    let absent = ns.key(0xdead, 0, 0, 0);
    let got = get_into_host(&store, &host, &[absent.clone()], &[0], PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Missing]);
    assert_eq!(store.query(&[absent, ks[0].clone()]).unwrap(), vec![false, true]);

    // Removal of the namespace leaves safely retired misses.
    let removed = store.remove_namespace(&ns).unwrap();
    assert_eq!(removed, 8);
    assert_eq!(store.query(&ks).unwrap(), vec![false; 8]);
    let got = get_into_host(&store, &host, &ks, &dst_offsets, PAGE).unwrap();
    assert_eq!(got, vec![KeyResult::Missing; 8]);
    assert!(store.counters.backend_calls.load(Ordering::Relaxed) >= 9);
    store.close().unwrap();
}
