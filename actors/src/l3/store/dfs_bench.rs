//! `engine-host bench dfs-put` body: create-only PUT throughput of the shared-DFS tier
//! (group-committed batches, and one object per call as before) beside a plain sequential
//! write of the same bytes into as many files with the same fsync policy (one `syncfs` and
//! one directory fsync per batch), all in one run, in fresh directories under `dir`.
//! Benchmark only: its timings are printed, never asserted.

use super::dfs::DfsStore;
use super::{KeyResult, Store};
use messages::StorageKey;
use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

#[derive(Clone, Debug, PartialEq)]
pub struct DfsPutReport {
    pub objects: usize,
    pub object_bytes: usize,
    pub batch: usize,
    pub sequential_s: f64,
    pub batched_s: f64,
    pub per_object_s: f64,
}

impl std::fmt::Display for DfsPutReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = (self.objects * self.object_bytes) as f64;
        let rate = |s: f64| bytes / s.max(1e-12) / (1u64 << 30) as f64;
        writeln!(
            f,
            "dfs-put: {} objects x {} bytes, batches of {}",
            self.objects, self.object_bytes, self.batch
        )?;
        writeln!(
            f,
            "  sequential write (one syncfs + dir fsync per batch): {:.3} s, {:.2} GiB/s",
            self.sequential_s,
            rate(self.sequential_s)
        )?;
        writeln!(
            f,
            "  DFS PUT, group-committed batches: {:.3} s, {:.2} GiB/s",
            self.batched_s,
            rate(self.batched_s)
        )?;
        writeln!(
            f,
            "  DFS PUT, one object per call (fsync per file and per directory): {:.3} s, {:.2} GiB/s",
            self.per_object_s,
            rate(self.per_object_s)
        )?;
        write!(
            f,
            "  DFS PUT (batched) / sequential write: {:.2}; one object per call / sequential write: {:.2}",
            self.sequential_s / self.batched_s.max(1e-12),
            self.sequential_s / self.per_object_s.max(1e-12)
        )
    }
}

fn key(run: &str, i: usize) -> StorageKey {
    StorageKey::new(format!("tsl3-00000000000000b1-{run}{i:08}"))
}

/// Runs the three writers over fresh directories under `dir` (removed afterwards).
pub fn bench_dfs_put(
    dir: &Path,
    objects: usize,
    object_bytes: usize,
    batch: usize,
) -> Result<DfsPutReport, String> {
    let batch = batch.max(1);
    let payload: Vec<u8> = (0..object_bytes).map(|i| (i * 31 + 7) as u8).collect();
    let io = |e: std::io::Error| e.to_string();
    // The baseline: plain files, the same bytes, one syncfs and one directory fsync per batch.
    let seq = dir.join("sequential");
    fs::create_dir_all(&seq).map_err(io)?;
    let t = Instant::now();
    for start in (0..objects).step_by(batch) {
        for i in start..(start + batch).min(objects) {
            let mut f = File::create(seq.join(format!("{i:08}"))).map_err(io)?;
            f.write_all(&payload).map_err(io)?;
        }
        let d = File::open(&seq).map_err(io)?;
        rustix::fs::syncfs(&d).map_err(|e| e.to_string())?;
        d.sync_all().map_err(io)?;
    }
    let sequential_s = t.elapsed().as_secs_f64();
    let run = |name: &str, per_call: usize| -> Result<f64, String> {
        let root = dir.join(name);
        let store = DfsStore::open(&root, 8).map_err(|e| e.to_string())?;
        let t = Instant::now();
        for start in (0..objects).step_by(per_call) {
            let keys: Vec<StorageKey> = (start..(start + per_call).min(objects))
                .map(|i| key(name, i))
                .collect();
            let srcs: Vec<&[u8]> = keys.iter().map(|_| payload.as_slice()).collect();
            let r = store.put(&keys, &srcs).map_err(|e| e.to_string())?;
            if let Some(bad) = r.iter().find(|r| !matches!(r, KeyResult::Ok { .. })) {
                return Err(format!("{name}: a PUT answered {bad:?}"));
            }
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let batched_s = run("batched", batch)?;
    let per_object_s = run("single", 1)?;
    for d in ["sequential", "batched", "single"] {
        let _ = fs::remove_dir_all(dir.join(d));
    }
    Ok(DfsPutReport {
        objects,
        object_bytes,
        batch,
        sequential_s,
        batched_s,
        per_object_s,
    })
}
