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

/// `engine-host bench dfs-get`: a warm-cache GET of the shared-DFS tier (read(2) straight
/// into the destination, checksummed in the same pass, fanned out as the store does) beside
/// a memcpy of the same bytes into the same destinations over the same threads, rounds
/// interleaved in one run: the GET's time beyond raw transfer for the store -> Host hop.
#[derive(Clone, Debug, PartialEq)]
pub struct DfsGetReport {
    pub objects: usize,
    pub object_bytes: usize,
    pub batch: usize,
    pub threads: usize,
    /// Best round of each, seconds.
    pub memcpy_s: f64,
    pub get_s: f64,
    pub rounds: usize,
}

impl std::fmt::Display for DfsGetReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = (self.objects * self.object_bytes) as f64;
        let rate = |s: f64| bytes / s.max(1e-12) / 1e9;
        writeln!(
            f,
            "dfs-get: {} objects x {} bytes in the page cache, GETs of {} keys over {} threads, best of {} interleaved rounds",
            self.objects, self.object_bytes, self.batch, self.threads, self.rounds
        )?;
        writeln!(
            f,
            "  memcpy of the same bytes into the same destinations: {:.1} ms, {:.2} GB/s",
            self.memcpy_s * 1e3,
            rate(self.memcpy_s)
        )?;
        writeln!(
            f,
            "  DFS GET (read(2) into the destination, checksummed): {:.1} ms, {:.2} GB/s",
            self.get_s * 1e3,
            rate(self.get_s)
        )?;
        write!(
            f,
            "  DFS GET beyond memcpy: {:+.0}%",
            (self.get_s / self.memcpy_s.max(1e-12) - 1.0) * 100.0
        )
    }
}

/// Writes `objects` objects of `object_bytes` under `dir` (removed afterwards), reads them
/// once to warm the page cache, then runs `rounds` rounds of memcpy and GET, each over
/// every object into the same destinations, and keeps each one's best.
pub fn bench_dfs_get(
    dir: &Path,
    objects: usize,
    object_bytes: usize,
    batch: usize,
    rounds: usize,
) -> Result<DfsGetReport, String> {
    let batch = batch.max(1);
    let root = dir.join("get");
    let store = DfsStore::open(&root, 8).map_err(|e| e.to_string())?;
    let threads = store.fan_out();
    let payload: Vec<u8> = (0..object_bytes).map(|i| (i * 31 + 7) as u8).collect();
    let keys: Vec<StorageKey> = (0..objects).map(|i| key("get", i)).collect();
    for (chunk, start) in keys.chunks(batch).zip((0..objects).step_by(batch)) {
        let srcs: Vec<&[u8]> = chunk.iter().map(|_| payload.as_slice()).collect();
        let r = store.put(chunk, &srcs).map_err(|e| e.to_string())?;
        if let Some(bad) = r.iter().find(|r| !matches!(r, KeyResult::Ok { .. })) {
            return Err(format!("PUT of object {start}.. answered {bad:?}"));
        }
    }
    // Destinations written once before timing (as Host memory is touched at startup).
    let mut dest = vec![1u8; objects * object_bytes];
    let source = vec![7u8; objects * object_bytes];
    let get = |dest: &mut [u8]| -> Result<f64, String> {
        let t = Instant::now();
        for (ks, ds) in keys
            .chunks(batch)
            .zip(dest.chunks_mut(batch * object_bytes))
        {
            let mut dests: Vec<&mut [u8]> = ds.chunks_mut(object_bytes).collect();
            let r = store.get(ks, &mut dests).map_err(|e| e.to_string())?;
            if let Some(bad) = r.iter().find(|r| !matches!(r, KeyResult::Ok { .. })) {
                return Err(format!("a GET answered {bad:?}"));
            }
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let memcpy = |dest: &mut [u8]| -> f64 {
        let per = dest.len().div_ceil(threads).max(1);
        let t = Instant::now();
        std::thread::scope(|s| {
            for (d, src) in dest.chunks_mut(per).zip(source.chunks(per)) {
                s.spawn(move || {
                    for (d, src) in d
                        .chunks_mut(object_bytes.max(1))
                        .zip(src.chunks(object_bytes.max(1)))
                    {
                        d.copy_from_slice(src);
                    }
                });
            }
        });
        t.elapsed().as_secs_f64()
    };
    get(&mut dest)?; // warms the page cache
    let (mut memcpy_s, mut get_s) = (f64::MAX, f64::MAX);
    for _ in 0..rounds.max(1) {
        memcpy_s = memcpy_s.min(memcpy(&mut dest));
        get_s = get_s.min(get(&mut dest)?);
        if dest[..object_bytes] != payload[..] {
            return Err("a GET landed other bytes than were written".into());
        }
    }
    let _ = fs::remove_dir_all(&root);
    Ok(DfsGetReport {
        objects,
        object_bytes,
        batch,
        threads,
        memcpy_s,
        get_s,
        rounds: rounds.max(1),
    })
}
