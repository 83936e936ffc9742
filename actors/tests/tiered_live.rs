//! Live tests of TieredStore: a real Mooncake master and storage owner as the MEMORY tier
//! (deploy/mooncake/: install.sh, start.sh, env.sh) over a temporary DFS root. The instance
//! comes from the environment (MOONCAKE_STORE_LIBRARY, MOONCAKE_MASTER,
//! MOONCAKE_METADATA_SERVER). Without MOONCAKE_REQUIRE_MASTER=1 a missing library or
//! master skips loudly ("SKIPPED: ..."); with it, it fails. The master keeps objects across
//! runs, so every test uses a namespace no earlier run used (pid + time). Threads are
//! ordered with gates, never sleeps.

use actors::l3::store::dfs::{DfsStore, DFS_HEADER_LEN};
use actors::l3::store::faulty::Gate;
use actors::l3::store::mooncake::{live, MooncakeStore};
use actors::l3::store::tiered::promotion::TierLimits;
use actors::l3::store::tiered::TieredStore;
use actors::l3::store::{KeyResult, PromotionFailure, PromotionResult as R, Store};
use messages::settings::MooncakeStoreSettings;
use messages::{Namespace, StorageKey};
use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

const PAGE: usize = 64 * 1024;

/// The instance's settings, or None (skipped loudly) without a library or a master.
fn shared(test: &str) -> Option<MooncakeStoreSettings> {
    live::settings_or_skip(test)
}

/// A tiered store over a fresh client and a temporary DFS root, keeping the Mooncake
/// handle for its own get/is_exist and counters.
struct Rig {
    _dir: tempfile::TempDir,
    mooncake: Arc<MooncakeStore>,
    store: TieredStore,
    ns: Namespace,
}

fn rig(test: &str, tag: u64) -> Option<Rig> {
    let s = shared(test)?;
    let mooncake = Arc::new(
        MooncakeStore::connect(&s)
            .unwrap_or_else(|e| panic!("connect to {}: {e}", s.master_server_addr)),
    );
    let dir = tempfile::tempdir().unwrap();
    let dfs = Arc::new(DfsStore::open(dir.path().join("dfs"), 4).unwrap());
    let limits = TierLimits {
        workers: 2,
        staging_bytes: 16 * PAGE as u64,
        max_in_flight: 16,
    };
    let store = TieredStore::with_tiers(mooncake.clone(), dfs, limits).unwrap();
    Some(Rig {
        _dir: dir,
        mooncake,
        store,
        ns: fresh_namespace(tag),
    })
}

/// A DFS-valid namespace (`tsl3-<16 hex>`) no earlier run used (PUT is create-only).
fn fresh_namespace(tag: u64) -> Namespace {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let pid = std::process::id() as u64;
    Namespace(
        format!(
            "tsl3-{:016x}",
            nanos ^ pid.rotate_left(40) ^ tag.rotate_left(20)
        )
        .into(),
    )
}

fn pattern(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..PAGE)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

impl Rig {
    fn key(&self, n: u32) -> StorageKey {
        self.ns.key(0xabc0 + n as u128, 0, n, 0)
    }
    fn put_dfs(&self, n: u32) {
        let r = self
            .store
            .dfs()
            .put(&[self.key(n)], &[&pattern(n as u64)])
            .unwrap();
        assert_eq!(r, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    }
    fn in_mooncake(&self, n: u32) -> bool {
        self.mooncake.query(&[self.key(n)]).unwrap()[0]
    }
    fn new_writes(&self) -> u64 {
        self.mooncake.counters.new_writes.load(Ordering::SeqCst)
    }
    fn quiescent(&self) {
        let f = self.store.promotion_stats().funnel();
        assert!(f.holds(), "{f:?}");
        assert_eq!(f.in_flight, 0);
        assert_eq!(self.store.staging().used(), 0);
    }
    fn cleanup(&self) {
        self.store.remove_namespace(&self.ns).unwrap();
        assert!(!self.in_mooncake(1));
        self.store.close().unwrap();
    }
}

#[test]
fn a_dfs_only_key_commits_into_mooncake_and_a_later_get_is_served_from_mooncake() {
    let Some(r) = rig("a_dfs_only_key_commits_into_mooncake", 1) else {
        return;
    };
    r.put_dfs(1);
    assert!(!r.in_mooncake(1));
    let before = r.new_writes();
    assert_eq!(
        r.store.prefetch_to_memory(&[r.key(1)]).unwrap(),
        vec![R::Committed]
    );
    assert_eq!(r.new_writes() - before, 1);
    // Mooncake's own is_exist and get see the replica with the DFS object's exact bytes.
    assert!(r.in_mooncake(1));
    let mut direct = vec![0u8; PAGE];
    let got = r.mooncake.get(&[r.key(1)], &mut [&mut direct[..]]).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    assert_eq!(direct, pattern(1));
    // The tiered GET is a MEMORY hit.
    let mut buf = vec![0u8; PAGE];
    let got = r.store.get(&[r.key(1)], &mut [&mut buf[..]]).unwrap();
    assert_eq!(got, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    assert_eq!(buf, pattern(1));
    assert_eq!(r.store.stats.memory_hits.load(Ordering::Relaxed), 1);
    assert_eq!(r.store.stats.dfs_reads.load(Ordering::Relaxed), 0);
    r.quiescent();
    r.cleanup();
}

#[test]
fn memory_hits_missing_sources_and_duplicates_answer_in_input_order() {
    let Some(r) = rig("memory_hits_missing_sources_and_duplicates", 2) else {
        return;
    };
    // Key 1: written through (both tiers). Key 2: DFS only. Key 3: nowhere.
    let w = r.store.put(&[r.key(1)], &[&pattern(1)]).unwrap();
    assert_eq!(w, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    assert!(r.in_mooncake(1));
    r.put_dfs(2);
    assert_eq!(
        r.store.query(&[r.key(1), r.key(2), r.key(3)]).unwrap(),
        vec![true, true, false]
    );
    let before = r.new_writes();
    let batch = [r.key(2), r.key(3), r.key(1), r.key(2), r.key(3), r.key(1)];
    assert_eq!(
        r.store.prefetch_to_memory(&batch).unwrap(),
        vec![
            R::Committed,
            R::MissingSource,
            R::AlreadyInMemory,
            R::Committed,
            R::MissingSource,
            R::AlreadyInMemory
        ]
    );
    assert_eq!(
        r.new_writes() - before,
        1,
        "one PUT for the duplicated key 2"
    );
    assert!(r.in_mooncake(2) && !r.in_mooncake(3));
    // A second trigger finds both readable in MEMORY.
    assert_eq!(
        r.store.prefetch_to_memory(&[r.key(1), r.key(2)]).unwrap(),
        vec![R::AlreadyInMemory, R::AlreadyInMemory]
    );
    assert_eq!(r.store.promotion_stats().funnel().attempted, 1);
    r.quiescent();
    r.cleanup();
}

#[test]
fn a_corrupted_dfs_object_fails_checksum_and_nothing_lands_in_mooncake() {
    let Some(r) = rig("a_corrupted_dfs_object_fails_checksum", 3) else {
        return;
    };
    r.put_dfs(1);
    let path = r.store.dfs().object_path(&r.key(1)).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(DFS_HEADER_LEN as u64 + 100))
        .unwrap();
    f.write_all(&[0x5A; 16]).unwrap();
    drop(f);
    let before = r.new_writes();
    assert_eq!(
        r.store.prefetch_to_memory(&[r.key(1)]).unwrap(),
        vec![R::Failed(PromotionFailure::Checksum)]
    );
    assert_eq!(r.new_writes(), before);
    assert!(!r.in_mooncake(1));
    let mut buf = vec![0u8; PAGE];
    // The failed promotion proved the object invalid and removed it: now a miss, and the
    // key's next backup can land.
    assert_eq!(
        r.store.get(&[r.key(1)], &mut [&mut buf[..]]).unwrap(),
        vec![KeyResult::Missing]
    );
    assert_eq!(
        r.store
            .dfs()
            .stats
            .invalid_removed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    r.quiescent();
    r.cleanup();
}

#[test]
fn concurrent_triggers_admit_once_and_put_once() {
    let Some(r) = rig("concurrent_triggers_admit_once", 4) else {
        return;
    };
    r.put_dfs(1);
    r.put_dfs(2);
    let gate = Gate::new();
    *r.store.hooks().before_put.lock() = Some(gate.clone());
    let before = r.new_writes();
    let first = r.store.submit_prefetch(&[r.key(1), r.key(2)]).unwrap();
    gate.wait_entered(2);
    // Two more triggers while both attempts are held before their PUT.
    let second = r.store.submit_prefetch(&[r.key(2), r.key(1)]).unwrap();
    let third = r.store.submit_prefetch(&[r.key(1)]).unwrap();
    let ids = first.attempt_ids();
    assert_eq!(second.attempt_ids(), vec![ids[1], ids[0]]);
    assert_eq!(third.attempt_ids(), vec![ids[0]]);
    gate.release();
    let waiter = std::thread::spawn(move || second.wait());
    assert_eq!(first.wait(), vec![R::Committed, R::Committed]);
    assert_eq!(third.wait(), vec![R::Committed]);
    assert_eq!(waiter.join().unwrap(), vec![R::Committed, R::Committed]);
    assert_eq!(gate.entered(), 2);
    assert_eq!(r.new_writes() - before, 2, "one PUT per key");
    let stats = r.store.promotion_stats();
    assert_eq!(stats.funnel().attempted, 2);
    assert_eq!(stats.joined.load(Ordering::Relaxed), 3);
    assert!(r.in_mooncake(1) && r.in_mooncake(2));
    r.quiescent();
    r.cleanup();
}

#[test]
fn write_through_lands_in_both_tiers_and_dfs_serves_a_mooncake_miss() {
    let Some(r) = rig("write_through_lands_in_both_tiers", 5) else {
        return;
    };
    let w = r.store.put(&[r.key(1)], &[&pattern(1)]).unwrap();
    assert_eq!(w, vec![KeyResult::Ok { bytes: PAGE as u64 }]);
    assert!(r.in_mooncake(1));
    assert!(r.store.dfs().stat(&r.key(1)).is_ok());
    // Drop only the MEMORY copy: the DFS copy serves the GET.
    r.mooncake.remove_namespace(&r.ns).unwrap();
    assert!(!r.in_mooncake(1));
    let mut buf = vec![0u8; PAGE];
    assert_eq!(
        r.store.get(&[r.key(1)], &mut [&mut buf[..]]).unwrap(),
        vec![KeyResult::Ok { bytes: PAGE as u64 }]
    );
    assert_eq!(buf, pattern(1));
    assert_eq!(r.store.stats.dfs_reads.load(Ordering::Relaxed), 1);
    // A re-PUT is idempotent (DFS AlreadyExists) and writes nothing new to MEMORY.
    let before = r.new_writes();
    assert_eq!(
        r.store.put(&[r.key(1)], &[&pattern(1)]).unwrap(),
        vec![KeyResult::AlreadyExists]
    );
    assert_eq!(r.new_writes(), before);
    r.cleanup();
}
