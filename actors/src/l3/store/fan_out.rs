//! Fan-out of one batched read over a few scoped threads. A large GET (file reads out of
//! the page cache, MEMORY copies) is split into contiguous runs of keys, one run per
//! thread, so that one GET job uses the cores the copy needs instead of one worker.
//!
//! It owns no state. It keeps input order, reads each key exactly once, and never
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
        .enumerate()
        .collect();
    let count = chunks.len();
    let queue = Mutex::new(chunks.into_iter());
    let out: Mutex<Vec<Option<Vec<KeyResult>>>> = Mutex::new(vec![None; count]);
    // Every thread takes the next run until none is left: a thread that could not be
    // spawned leaves its runs to the others (the caller always works).
    let work = || loop {
        let next = queue.lock().next();
        let Some((i, (k, d))) = next else {
            break;
        };
        let r = serial(k, d);
        out.lock()[i] = Some(r);
    };
    std::thread::scope(|s| {
        let spawned: Vec<_> = (1..count)
            .filter_map(|_| {
                std::thread::Builder::new()
                    .name("tsl3-get-run".into())
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
