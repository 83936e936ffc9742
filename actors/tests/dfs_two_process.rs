//! Two engine-host processes share one DFS directory: both race to create the same new
//! objects (create-only across processes) and both promote the same keys into their own
//! MEMORY tier concurrently; each ends with every object readable with exact bytes.
//! The children are this same test binary, re-entered with `TSL3_DFS_TEST_CHILD=promoter`.

use actors::clock::SystemClock;
use actors::l3::store::dfs::DfsStore;
use actors::l3::store::local::{LocalStore, LocalStoreConfig, DEFAULT_PROMOTION_TTL_US};
use actors::l3::store::{KeyResult, PromotionResult, Store};
use actors::names::env::{DFS_TEST_CHILD, DFS_TEST_DIR};
use messages::StorageKey;
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};

const TEST_NAME: &str = "two_processes_promote_the_same_keys_from_one_directory";
const SEEDED: usize = 16;
const RACED: usize = 8;
const LEN: usize = 96 * 1024 + 7;

fn seeded(i: usize) -> StorageKey {
    StorageKey::new(format!("tsl3-0000000000002b0c-seeded{i}"))
}
fn raced(i: usize) -> StorageKey {
    StorageKey::new(format!("tsl3-0000000000002b0c-raced{i}"))
}
fn payload(key: &StorageKey) -> Vec<u8> {
    let seed = key.text().bytes().fold(7u8, |a, b| a.wrapping_mul(31) ^ b);
    (0..LEN)
        .map(|i| seed.wrapping_add((i % 241) as u8))
        .collect()
}

/// Child role: wait for "go", race the creates, promote everything, read it all back.
fn promoter() {
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go).unwrap();
    assert_eq!(go.trim(), "go");
    let dir = std::env::var(DFS_TEST_DIR).unwrap();
    let cfg = LocalStoreConfig {
        dir: dir.into(),
        memory_bytes: ((SEEDED + RACED) * LEN) as u64,
        promotion_workers: 4,
        staging_bytes: ((SEEDED + RACED) * LEN) as u64,
        max_promotions_in_flight: 64,
        dfs_io_concurrency: 4,
        promotion_ttl_us: DEFAULT_PROMOTION_TTL_US,
        promote_after_get: false,
    };
    let store = LocalStore::open(&cfg, SystemClock::shared()).unwrap();
    let raced_keys: Vec<StorageKey> = (0..RACED).map(raced).collect();
    let raced_data: Vec<Vec<u8>> = raced_keys.iter().map(payload).collect();
    let srcs: Vec<&[u8]> = raced_data.iter().map(|v| v.as_slice()).collect();
    for r in store.put(&raced_keys, &srcs).unwrap() {
        assert!(
            matches!(r, KeyResult::Ok { .. } | KeyResult::AlreadyExists),
            "{r:?}"
        );
    }
    let seeded_keys: Vec<StorageKey> = (0..SEEDED).map(seeded).collect();
    let r = store.prefetch_to_memory(&seeded_keys).unwrap();
    assert_eq!(r, vec![PromotionResult::Committed; SEEDED]);
    let r = store.prefetch_to_memory(&raced_keys).unwrap();
    assert!(r.iter().all(|r| r.readable()), "{r:?}");
    for k in seeded_keys.iter().chain(&raced_keys) {
        let mut d = vec![0u8; LEN];
        let r = store.get(std::slice::from_ref(k), &mut [&mut d]).unwrap();
        assert_eq!(r, vec![KeyResult::Ok { bytes: LEN as u64 }], "{k}");
        assert_eq!(d, payload(k), "{k}");
    }
    let hits = store
        .stats
        .memory_hits
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        hits,
        (SEEDED + RACED) as u64,
        "every read served from MEMORY"
    );
    assert!(store.promotion_stats().funnel().holds());
    let mut out = std::io::stdout();
    writeln!(out, "PROMOTER OK").unwrap();
    out.flush().unwrap();
}

#[test]
fn two_processes_promote_the_same_keys_from_one_directory() {
    if std::env::var(DFS_TEST_CHILD).as_deref() == Ok("promoter") {
        promoter();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dfs = DfsStore::open(dir.path(), 4).unwrap();
    for i in 0..SEEDED {
        let k = seeded(i);
        assert_eq!(
            dfs.put_one(&k, &payload(&k)),
            KeyResult::Ok { bytes: LEN as u64 }
        );
    }
    let spawn = || {
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(DFS_TEST_CHILD, "promoter")
            .env(DFS_TEST_DIR, dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut children = [spawn(), spawn()];
    // Both are started before either may go: their creates and promotions overlap.
    for c in children.iter_mut() {
        writeln!(c.stdin.as_mut().unwrap(), "go").unwrap();
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("PROMOTER OK"),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Exactly one object per raced key, with exact bytes.
    for i in 0..RACED {
        let k = raced(i);
        let (_, bytes) = dfs.read_object(&k).unwrap();
        assert_eq!(bytes, payload(&k));
    }
    let names = std::fs::read_dir(dir.path().join("tsl3-0000000000002b0c"))
        .unwrap()
        .count();
    assert_eq!(names, SEEDED + RACED, "no temporary file remains");
}
