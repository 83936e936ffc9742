//! Fan-out of one batched read or existence check over a few scoped threads. A large GET
//! (file reads out of the page cache, MEMORY copies) or a QUERY of many DFS objects (a
//! header read each) is split into contiguous runs of keys, one run per thread, so that
//! one job uses the cores (or, on a network filesystem, the concurrent requests) it needs
//! instead of one worker.
//!
//! It owns no state. It keeps input order, visits each key exactly once, and never
//! outlives the call: the threads are scoped, so every destination borrow ends before it
//! returns, and a panic in any run reaches the caller (the L3 worker's panic boundary)
//! only after every run stopped.

use crate::l3::store::KeyResult;
use messages::StorageKey;
use parking_lot::Mutex;

/// Bytes a run must have at least: a smaller batch is read on the calling thread alone.
pub const FAN_OUT_MIN_RUN_BYTES: usize = 8 << 20;

/// Threads a store may fan a read out over: the machine's parallelism, capped at `cap`.
pub fn fan_out_threads(cap: usize) -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(cap)
        .max(1)
}

/// Reads every key into its destination with `read`, in runs over at most `threads`
/// threads (the caller's included); results in input order.
pub fn read_fanned<F>(
    keys: &[StorageKey],
    dests: &mut [&mut [u8]],
    threads: usize,
    read: F,
) -> Vec<KeyResult>
where
    F: Fn(&StorageKey, &mut [u8]) -> KeyResult + Sync,
{
    let bytes: usize = dests.iter().map(|d| d.len()).sum();
    let runs = threads
        .min(keys.len())
        .min(bytes / FAN_OUT_MIN_RUN_BYTES)
        .max(1);
    let serial = |keys: &[StorageKey], dests: &mut [&mut [u8]]| -> Vec<KeyResult> {
        keys.iter()
            .zip(dests.iter_mut())
            .map(|(k, d)| read(k, d))
            .collect()
    };
    if runs == 1 || keys.len() != dests.len() {
        return serial(keys, dests);
    }
    let per_run = keys.len().div_ceil(runs);
    let chunks: Vec<_> = keys
        .chunks(per_run)
        .zip(dests.chunks_mut(per_run))
        .collect();
    in_runs(chunks, "tsl3-get-run", |(k, d)| serial(k, d))
}

/// Keys a run of an existence check must have at least: a smaller batch is checked on the
/// calling thread alone (a thread costs about what a few header reads do).
pub const FAN_OUT_MIN_RUN_KEYS: usize = 32;

/// Checks every key with `check(index, key)`, in runs over at most `threads` threads (the
/// caller's included); results in input order.
pub fn check_fanned<F>(keys: &[StorageKey], threads: usize, check: F) -> Vec<bool>
where
    F: Fn(usize, &StorageKey) -> bool + Sync,
{
    let runs = threads.min(keys.len() / FAN_OUT_MIN_RUN_KEYS).max(1);
    let per_run = keys.len().div_ceil(runs).max(1);
    let chunks: Vec<_> = keys.chunks(per_run).enumerate().collect();
    let serial = |(run, keys): (usize, &[StorageKey])| -> Vec<bool> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| check(run * per_run + i, k))
            .collect()
    };
    if chunks.len() <= 1 {
        return chunks.into_iter().flat_map(serial).collect();
    }
    in_runs(chunks, "tsl3-query-run", serial)
}

/// Runs `each` on every run, the calling thread and one scoped thread per further run
/// taking the next run until none is left (a thread that could not be spawned leaves its
/// runs to the others); the runs' results concatenated in run order.
fn in_runs<T: Send, R: Send>(
    runs: Vec<T>,
    name: &str,
    each: impl Fn(T) -> Vec<R> + Sync,
) -> Vec<R> {
    let count = runs.len();
    let queue = Mutex::new(runs.into_iter().enumerate());
    let out: Mutex<Vec<Option<Vec<R>>>> = Mutex::new((0..count).map(|_| None).collect());
    let work = || loop {
        let next = queue.lock().next();
        let Some((i, run)) = next else {
            break;
        };
        let r = each(run);
        out.lock()[i] = Some(r);
    };
    std::thread::scope(|s| {
        let spawned: Vec<_> = (1..count)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn_scoped(s, work)
                    .ok()
            })
            .collect();
        work();
        for h in spawned {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    });
    out.into_inner().into_iter().flatten().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn keys(n: usize) -> Vec<StorageKey> {
        (0..n).map(|i| StorageKey::new(format!("k{i}"))).collect()
    }

    /// Writes the key's index into every byte and reports it back with the thread it ran on.
    fn run(n: usize, len: usize, threads: usize) -> (Vec<KeyResult>, Vec<Vec<u8>>, usize) {
        let ks = keys(n);
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; len]; n];
        let seen = Mutex::new(HashSet::new());
        let mut dests: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let rows = read_fanned(&ks, &mut dests, threads, |k, d| {
            seen.lock().insert(std::thread::current().id());
            // With more than one run, every read waits (bounded) until a second thread
            // has joined: a batch that did not fan out fails the assertion below.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while threads > 1 && d.len() >= FAN_OUT_MIN_RUN_BYTES / 2 && seen.lock().len() < 2 {
                if std::time::Instant::now() > until {
                    break;
                }
                std::thread::yield_now();
            }
            let i: u8 = k.text()[1..].parse::<usize>().unwrap() as u8;
            d.fill(i);
            KeyResult::Ok {
                bytes: d.len() as u64,
            }
        });
        let threads_used = seen.lock().len();
        (rows, bufs, threads_used)
    }

    #[test]
    fn a_large_batch_runs_on_several_threads_in_input_order_each_key_once() {
        let (rows, bufs, used) = run(9, FAN_OUT_MIN_RUN_BYTES / 2, 3);
        assert_eq!(rows.len(), 9);
        assert!(rows.iter().all(|r| matches!(r, KeyResult::Ok { .. })));
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|x| *x == i as u8),
                "key {i} landed in its own buffer"
            );
        }
        assert!(used > 1, "the batch fanned out ({used} thread)");
    }

    #[test]
    fn a_small_batch_stays_on_the_calling_thread() {
        let (rows, bufs, used) = run(4, 1024, 4);
        assert_eq!(rows.len(), 4);
        assert_eq!(used, 1);
        assert!(bufs[3].iter().all(|x| *x == 3));
    }

    #[test]
    fn a_large_check_runs_on_several_threads_in_input_order_each_key_once() {
        let n = FAN_OUT_MIN_RUN_KEYS * 3 + 5;
        let ks = keys(n);
        let seen = Mutex::new(HashSet::new());
        let visits = Mutex::new(vec![0u32; n]);
        let got = check_fanned(&ks, 3, |i, k| {
            seen.lock().insert(std::thread::current().id());
            visits.lock()[i] += 1;
            // Until a second thread joined (bounded): a check that did not fan out fails
            // the assertion below.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while seen.lock().len() < 2 && std::time::Instant::now() < until {
                std::thread::yield_now();
            }
            assert_eq!(k.text(), format!("k{i}"), "the index is the key's own");
            i % 3 == 0
        });
        let want: Vec<bool> = (0..n).map(|i| i % 3 == 0).collect();
        assert_eq!(got, want);
        assert!(visits.lock().iter().all(|v| *v == 1));
        assert!(seen.lock().len() > 1, "the check fanned out");
    }

    #[test]
    fn a_small_check_stays_on_the_calling_thread() {
        let ks = keys(FAN_OUT_MIN_RUN_KEYS * 2 - 1);
        let me = std::thread::current().id();
        let got = check_fanned(&ks, 4, |i, _| {
            assert_eq!(std::thread::current().id(), me);
            i == 7
        });
        assert_eq!(got.iter().filter(|b| **b).count(), 1);
        assert!(got[7]);
        assert!(check_fanned(&[], 4, |_, _| true).is_empty());
    }

    #[test]
    fn a_panicking_run_reaches_the_caller_after_every_run_stopped() {
        let ks = keys(4);
        let mut bufs: Vec<Vec<u8>> = vec![vec![0u8; FAN_OUT_MIN_RUN_BYTES]; 4];
        let mut dests: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read_fanned(&ks, &mut dests, 4, |k, _| {
                if k.text() == "k3" {
                    panic!("injected");
                }
                KeyResult::Missing
            })
        }));
        assert!(r.is_err());
    }
}
