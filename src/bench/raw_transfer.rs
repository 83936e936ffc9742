//! Restore time beyond raw transfer (issue #14's measure): how much longer a restore takes
//! than the copies it cannot avoid, each run at this machine's memcpy bandwidth measured in
//! the same bench run. A cohort's restore time is its TTFT p50 minus the Device cohort's
//! (same prompt, nothing moved: the HTTP, scheduling and last-token forward every cohort
//! pays); its raw transfer is the restored bytes times the hops they must cross (Host → Device
//! for a Host hit; store → Host and Host → Device for an L3 hit), divided by the bandwidth.
//!
//! Beside it, the page-cache read bandwidth: positioned reads of files the kernel caches,
//! the speed a DFS-warm GET's file reads can reach on this machine before their checksum.
//!
//! It owns only measurement and arithmetic; it must never be used as a test of timing.

use std::time::Instant;

/// The hops a cohort's restored bytes cross; None for cohorts with no memory-speed restore
/// (recompute, device, a cold page cache, misses, partial hits).
pub fn hops(cohort: &str) -> Option<u32> {
    match cohort {
        "host" => Some(1),
        "l3-dfs-warm" | "l3-memory" | "l3-mooncake" => Some(2),
        _ => None,
    }
}

/// memcpy bandwidth in bytes per second over `threads` threads, each copying its share of
/// a `bytes`-long buffer (both buffers touched first), the best of `reps` copies.
pub fn memcpy_bandwidth(bytes: usize, threads: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let share = (bytes / threads).max(1);
    let mut src: Vec<Vec<u8>> = (0..threads).map(|t| vec![t as u8 + 1; share]).collect();
    let mut dst: Vec<Vec<u8>> = (0..threads).map(|_| vec![0u8; share]).collect();
    let mut best = f64::INFINITY;
    for rep in 0..reps.max(1) {
        for s in &mut src {
            s[0] = rep as u8; // a different first byte each copy
        }
        let t = Instant::now();
        std::thread::scope(|sc| {
            for (d, s) in dst.iter_mut().zip(&src) {
                sc.spawn(move || d.copy_from_slice(s));
            }
        });
        best = best.min(t.elapsed().as_secs_f64());
        std::hint::black_box(&dst);
    }
    (share * threads) as f64 / best.max(1e-9)
}

/// Page-cache read bandwidth in bytes per second: `files` files of `file_bytes` each,
/// written under `dir` and read once (so the kernel's page cache holds them), then read
/// with positioned reads over `threads` threads, each file into its own region of its
/// thread's destination (touched first: as a GET lands in Host memory, not in a buffer the
/// CPU cache holds), the best of `reps` passes. The files are removed afterwards.
pub fn page_cache_read_bandwidth(
    dir: &std::path::Path,
    files: usize,
    file_bytes: usize,
    threads: usize,
    reps: usize,
) -> Result<f64, String> {
    use std::os::unix::fs::FileExt;
    let err = |p: &std::path::Path, e: std::io::Error| format!("{}: {e}", p.display());
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let paths: Vec<std::path::PathBuf> = (0..files.max(1))
        .map(|i| dir.join(format!("read-bandwidth-{i}")))
        .collect();
    let fill: Vec<u8> = (0..file_bytes).map(|i| (i * 131 + 7) as u8).collect();
    for p in &paths {
        std::fs::write(p, &fill).map_err(|e| err(p, e))?;
    }
    let threads = threads.max(1);
    let per_thread = paths.len().div_ceil(threads);
    let mut dests: Vec<Vec<u8>> = (0..threads)
        .map(|_| vec![1u8; per_thread * file_bytes.max(1)])
        .collect();
    let mut pass = || -> Result<f64, String> {
        let t = Instant::now();
        std::thread::scope(|sc| {
            let handles: Vec<_> = dests
                .iter_mut()
                .enumerate()
                .map(|(th, dest)| {
                    let paths = &paths;
                    sc.spawn(move || -> Result<(), String> {
                        let regions = dest.chunks_mut(file_bytes.max(1));
                        for (p, region) in paths.iter().skip(th).step_by(threads).zip(regions) {
                            let f = std::fs::File::open(p).map_err(|e| err(p, e))?;
                            f.read_exact_at(region, 0).map_err(|e| err(p, e))?;
                        }
                        std::hint::black_box(&dest);
                        Ok(())
                    })
                })
                .collect();
            for h in handles {
                h.join()
                    .map_err(|_| "a read thread panicked".to_string())??;
            }
            Ok::<(), String>(())
        })?;
        Ok(t.elapsed().as_secs_f64())
    };
    let result = (|| {
        pass()?; // the first pass touches the buffers and settles the cache
        let mut best = f64::INFINITY;
        for _ in 0..reps.max(1) {
            best = best.min(pass()?);
        }
        Ok((paths.len() * file_bytes) as f64 / best.max(1e-9))
    })();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    result
}

/// One cohort's figure.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BeyondRaw {
    pub cohort: &'static str,
    pub tokens: u64,
    pub restored_bytes: f64,
    pub hops: u32,
    pub restore_ms: f64,
    pub raw_ms: f64,
    /// restore ÷ raw − 1 (the target is ≤ 0.2).
    pub beyond: f64,
}

/// The figure from two p50s (ms), the restored bytes and the measured bandwidth (B/s).
pub fn beyond_raw(
    cohort: &'static str,
    tokens: u64,
    cohort_p50_ms: f64,
    device_p50_ms: f64,
    restored_bytes: f64,
    bandwidth: f64,
) -> Option<BeyondRaw> {
    let hops = hops(cohort)?;
    if restored_bytes <= 0.0 || bandwidth <= 0.0 || !cohort_p50_ms.is_finite() {
        return None;
    }
    let raw_ms = f64::from(hops) * restored_bytes / bandwidth * 1e3;
    let restore_ms = (cohort_p50_ms - device_p50_ms).max(0.0);
    Some(BeyondRaw {
        cohort,
        tokens,
        restored_bytes,
        hops,
        restore_ms,
        raw_ms,
        beyond: restore_ms / raw_ms - 1.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_cache_reads_measure_their_files_and_remove_them() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("bw");
        let bw = page_cache_read_bandwidth(&dir, 4, 64 << 10, 2, 2).unwrap();
        assert!(bw.is_finite() && bw > 0.0, "{bw}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "files removed");
        let file = d.path().join("a-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(
            page_cache_read_bandwidth(&file.join("below"), 1, 16, 1, 1).is_err(),
            "an unusable directory is an error"
        );
    }

    #[test]
    fn an_l3_hit_crosses_two_hops_and_a_host_hit_one() {
        assert_eq!(hops("host"), Some(1));
        assert_eq!(hops("l3-dfs-warm"), Some(2));
        assert_eq!(hops("l3-memory"), Some(2));
        assert_eq!(hops("l3-dfs-cold"), None, "disk speed, not memory speed");
        assert_eq!(hops("recompute"), None);
    }

    #[test]
    fn the_excess_is_restore_over_raw_minus_one() {
        // 1 GB over 2 hops at 10 GB/s is 200 ms raw; 260 ms of restore is 30% beyond.
        let f = beyond_raw("l3-memory", 16384, 280.0, 20.0, 1e9, 10e9).unwrap();
        assert!((f.raw_ms - 200.0).abs() < 1e-9);
        assert!((f.restore_ms - 260.0).abs() < 1e-9);
        assert!((f.beyond - 0.3).abs() < 1e-9);
        assert!(beyond_raw("miss", 1, 1.0, 0.0, 1e9, 1e9).is_none());
        assert!(beyond_raw("host", 1, f64::NAN, 0.0, 1e9, 1e9).is_none());
        assert!(beyond_raw("host", 1, 10.0, 0.0, 0.0, 1e9).is_none());
    }

    #[test]
    fn memcpy_bandwidth_is_positive_and_finite() {
        let b = memcpy_bandwidth(1 << 20, 2, 2);
        assert!(b.is_finite() && b > 0.0, "{b}");
    }
}
