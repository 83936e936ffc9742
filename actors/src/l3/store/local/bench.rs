//! `engine-host bench promotion`: DFS → MEMORY promotion throughput against a plain file
//! read + memcpy of the same bytes, measured side by side in one run; the ratio is the last
//! printed line. It only measures; it never changes store behaviour.

use super::{LocalStore, LocalStoreConfig, DEFAULT_PROMOTION_TTL_US};
use crate::clock::SystemClock;
use crate::l3::store::dfs::DfsStore;
use crate::l3::store::{PromotionResult, Store, StoreError};
use messages::StorageKey;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Figures of one benchmark run.
#[derive(Clone, Copy, Debug)]
pub struct PromotionBench {
    pub objects: usize,
    pub object_bytes: usize,
    /// Plain `fs::read` + memcpy, bytes per second.
    pub baseline_bytes_per_s: f64,
    /// `prefetch_to_memory` into an empty MEMORY tier, bytes per second.
    pub promotion_bytes_per_s: f64,
    /// promotion / baseline.
    pub ratio: f64,
}

/// Writes `objects` objects of `object_bytes` under `dir`, fills the MEMORY tier once
/// (untimed in the ratio, its rate printed), then times (a) a plain file read plus a memcpy
/// of every object and (b) evicting and promoting all of them again, each `rounds` times
/// alternately, with `workers` promotion workers. Prints figures; the ratio last.
pub fn bench_promotion(
    dir: &Path,
    objects: usize,
    object_bytes: usize,
    workers: u32,
    rounds: usize,
) -> Result<PromotionBench, StoreError> {
    let total = (objects * object_bytes) as u64;
    let cfg = LocalStoreConfig {
        dir: dir.to_path_buf(),
        memory_bytes: total.max(1),
        promotion_workers: workers.max(1),
        staging_bytes: total.max(1),
        max_promotions_in_flight: objects.max(1) as u32,
        dfs_io_concurrency: workers.max(1) * 2,
        promotion_ttl_us: DEFAULT_PROMOTION_TTL_US,
        promote_after_get: false,
    };
    let dfs = Arc::new(DfsStore::open(dir, cfg.dfs_io_concurrency)?);
    let keys: Vec<StorageKey> = (0..objects)
        .map(|i| StorageKey::new(format!("tsl3-00000000000b3ec4-obj{i}")))
        .collect();
    let payload: Vec<Vec<u8>> = (0..objects)
        .map(|i| (0..object_bytes).map(|j| (i * 31 + j * 7) as u8).collect())
        .collect();
    for (k, p) in keys.iter().zip(&payload) {
        dfs.put_one(k, p);
    }
    let paths: Vec<_> = keys.iter().filter_map(|k| dfs.object_path(k)).collect();
    let promote = |store: &LocalStore| -> Result<f64, StoreError> {
        let t = Instant::now();
        let r = store.prefetch_to_memory(&keys)?;
        let s = t.elapsed().as_secs_f64();
        if let Some(bad) = r.iter().find(|r| **r != PromotionResult::Committed) {
            return Err(StoreError::new(
                "bench",
                format!("promotion result {bad:?}"),
            ));
        }
        Ok(s)
    };
    // One store for the run, as in a serving process. Its first fill writes fresh memory
    // (reported apart: on a VM a first touch costs far more than the copy); every timed
    // round then promotes all keys again into the tier emptied by eviction, whose spare
    // buffers keep that memory.
    let store = LocalStore::with_dfs(dfs.clone(), &cfg, SystemClock::shared())?;
    let first_fill_s = promote(&store)?;
    let mut baseline_s = 0.0;
    let mut promotion_s = 0.0;
    let mut sink = vec![0u8; object_bytes];
    for _ in 0..rounds.max(1) {
        let t = Instant::now();
        for p in &paths {
            let bytes = std::fs::read(p)
                .map_err(|e| StoreError::new("bench", format!("read {}: {e}", p.display())))?;
            let body = bytes
                .get(bytes.len().saturating_sub(object_bytes)..)
                .unwrap_or(&[]);
            sink[..body.len()].copy_from_slice(body);
        }
        baseline_s += t.elapsed().as_secs_f64();
        for k in &keys {
            if !store.evict_memory(k) {
                return Err(StoreError::new(
                    "bench",
                    format!("{k} was not resident after its promotion"),
                ));
            }
        }
        promotion_s += promote(&store)?;
    }
    std::hint::black_box(&sink);
    let moved = (total as f64) * rounds.max(1) as f64;
    let baseline = moved / baseline_s.max(1e-9);
    let promotion = moved / promotion_s.max(1e-9);
    let b = PromotionBench {
        objects,
        object_bytes,
        baseline_bytes_per_s: baseline,
        promotion_bytes_per_s: promotion,
        ratio: promotion / baseline,
    };
    println!("objects={objects} object_bytes={object_bytes} workers={workers} rounds={rounds}");
    println!(
        "file read + memcpy: {:.1} MiB/s",
        baseline / (1 << 20) as f64
    );
    println!(
        "DFS -> MEMORY promotion, first fill (fresh memory, untimed in the ratio): {:.1} MiB/s",
        total as f64 / first_fill_s.max(1e-9) / (1 << 20) as f64
    );
    println!(
        "DFS -> MEMORY promotion: {:.1} MiB/s",
        promotion / (1 << 20) as f64
    );
    println!("ratio promotion/baseline: {:.3}", b.ratio);
    Ok(b)
}
