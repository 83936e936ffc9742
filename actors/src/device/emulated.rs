//! Host-emulated device memory (the default backend, and what CI runs): a separate Vec<u8>
//! arena of N device slots and an in-order queue standing in for a stream. Copies execute
//! when fences are polled (like asynchronous DMA that reads its Host source late), so a
//! Host range must stay owned until its fence completes. A large run of copies in one
//! direction is split over two threads. An optional per-poll step limit
//! lets tests observe fences that have not completed yet. It never sleeps.

use super::geometry::DeviceGeometry;
use super::memory::{DeviceMemory, HostView, ResolvedCopy};
use super::ops::{CopyDirection, DeviceError, FenceId};
use super::unit_hashes::UnitHashes;
use crate::host::{stream_copy, HostCacheStorage};
use messages::HostRange;
use std::collections::VecDeque;
use std::sync::Arc;

/// A run of copies in one direction at least this large is split over two threads.
pub const PARALLEL_RUN_BYTES: u64 = 16 << 20;

/// Where a run of copies of these lengths (summing to `total`) splits into two shares of
/// about equal bytes: the first share is the copies before the returned index.
fn halfway(lens: impl Iterator<Item = u64>, total: u64) -> usize {
    let mut acc = 0u64;
    let mut split = 0usize;
    for len in lens {
        if acc * 2 >= total {
            break;
        }
        acc += len;
        split += 1;
    }
    split
}

/// Whether ranges sorted by start are pairwise disjoint.
fn disjoint(sorted: impl Iterator<Item = (u64, u64)>) -> bool {
    let mut prev_end = None;
    for (start, end) in sorted {
        if prev_end.is_some_and(|e| e > start) {
            return false;
        }
        prev_end = Some(end);
    }
    true
}

/// Runs `work` over two shares of `parts` of about equal bytes (`len` of each, summing to
/// `total`): the second on a scoped thread (the second core plays the DMA engine), the
/// first on this one. A panic of the other thread is an error naming `what`.
fn on_two_threads<P: Send, R: Send>(
    parts: &mut [P],
    total: u64,
    len: impl Fn(&P) -> u64,
    work: impl Fn(&mut [P]) -> R + Sync,
    what: &str,
) -> Result<(R, R), DeviceError> {
    let split = halfway(parts.iter().map(&len), total);
    let (first, second) = parts.split_at_mut(split);
    let (mine, other) = std::thread::scope(|scope| {
        let other = scope.spawn(|| work(second));
        (work(first), other.join())
    });
    let other = other.map_err(|_| DeviceError::Backend {
        backend: "emulated",
        message: format!("{what} copy thread panicked"),
    })?;
    Ok((mine, other))
}

#[derive(Debug)]
enum Pending {
    Copy(ResolvedCopy),
    Fence(FenceId),
}

#[derive(Debug)]
pub struct EmulatedDeviceMemory {
    host: Arc<HostCacheStorage>,
    geometry: DeviceGeometry,
    arena: Vec<u8>,
    units: UnitHashes,
    split_runs: u64,
    split_d2h_runs: u64,
    queue: VecDeque<Pending>,
    done: Vec<FenceId>,
    step_limit: Option<usize>,
}

impl EmulatedDeviceMemory {
    /// A zeroed arena of `geometry.slots` slots bound to `host`.
    pub fn new(host: Arc<HostCacheStorage>, geometry: DeviceGeometry) -> Result<Self, DeviceError> {
        let total = geometry.total_bytes()?;
        let mut arena = vec![0u8; total];
        // Device memory is resident: touch every page of the arena now, so no copy or
        // forward pays a first-touch page fault a GPU's memory never would.
        for page in arena.chunks_mut(4096) {
            page[0] = std::hint::black_box(0);
        }
        let units = UnitHashes::new(geometry.slots as usize, geometry.slot_bytes as usize);
        Ok(Self {
            host,
            geometry,
            arena,
            units,
            split_runs: 0,
            split_d2h_runs: 0,
            queue: VecDeque::new(),
            done: Vec::new(),
            step_limit: None,
        })
    }

    /// At most `limit` copies execute per poll (`None`: all queued work). Tests use it to
    /// hold fences incomplete without sleeping.
    pub fn set_step_limit(&mut self, limit: Option<usize>) {
        self.step_limit = limit;
    }

    /// The unit-hash records of the arena's slots (test and verification helper).
    pub fn unit_hashes(&self) -> &UnitHashes {
        &self.units
    }

    /// H2D runs executed on two threads so far (test and verification helper).
    pub fn split_h2d_runs(&self) -> u64 {
        self.split_runs
    }

    /// D2H runs executed on two threads so far (test and verification helper).
    pub fn split_d2h_runs(&self) -> u64 {
        self.split_d2h_runs
    }

    /// The whole arena (test and verification helper).
    pub fn arena(&self) -> &[u8] {
        &self.arena
    }

    fn execute(&mut self, c: ResolvedCopy) -> Result<(), DeviceError> {
        let fail = |m: String| DeviceError::Backend {
            backend: "emulated",
            message: m,
        };
        let start = usize::try_from(c.device_addr).map_err(|_| fail("address".into()))?;
        let end = start
            .checked_add(c.len as usize)
            .filter(|e| *e <= self.arena.len())
            .ok_or_else(|| fail(format!("device range {}+{} outside arena", start, c.len)))?;
        let dev = &mut self.arena[start..end];
        let range = HostRange::new(c.host_offset, c.len);
        match c.direction {
            CopyDirection::D2H => {
                // SAFETY: the engine owns this destination range until the batch's fence
                // completes (the scheduler's destination reference); the range was
                // bounds-checked by the engine and again by `range_mut`. Tested: bytes
                // outside copied ranges stay untouched.
                let dst = unsafe { self.host.range_mut(range) }.map_err(|e| fail(e.to_string()))?;
                stream_copy(dst, dev);
            }
            CopyDirection::H2D => {
                // SAFETY: the source range is held (source reference) until the fence
                // completes, so no one writes it while this copy reads it.
                let src = unsafe { self.host.range(range) }.map_err(|e| fail(e.to_string()))?;
                // the restored bytes' unit hashes, taken from what landed as it landed
                let hashes = self.units.copy_hashed(start, dev, src);
                self.units.store(start, dev.len(), hashes);
            }
        }
        Ok(())
    }

    /// A run of H2D copies large enough to split (`PARALLEL_RUN_BYTES`) whose device
    /// destinations are pairwise disjoint executes on two threads, each copying and
    /// hashing its share (a DMA engine runs beside the host thread; here the second core
    /// plays it). False, having done nothing, when the run is small or overlaps: the copies
    /// then run one by one, in order.
    fn execute_h2d_run(&mut self, run: &[ResolvedCopy]) -> Result<bool, DeviceError> {
        let total: u64 = run.iter().map(|c| c.len).sum();
        if run.len() < 2 || total < PARALLEL_RUN_BYTES {
            return Ok(false);
        }
        let mut order: Vec<(usize, usize, ResolvedCopy)> = Vec::with_capacity(run.len());
        for c in run {
            let r = self.arena_range(c.device_addr, c.len as usize)?;
            order.push((r.start, r.end, *c));
        }
        order.sort_unstable_by_key(|(start, _, _)| *start);
        if !disjoint(order.iter().map(|(s, e, _)| (*s as u64, *e as u64))) {
            return Ok(false);
        }
        // carve the disjoint destinations out of the arena, in address order
        let mut parts: Vec<(usize, &mut [u8], &[u8])> = Vec::with_capacity(order.len());
        let mut rest: &mut [u8] = &mut self.arena;
        let mut at = 0usize;
        for (start, end, c) in &order {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(start - at);
            let (dst, tail) = tail.split_at_mut(end - start);
            rest = tail;
            at = *end;
            let range = HostRange::new(c.host_offset, c.len);
            // SAFETY: the source range is held (source reference) until the fence
            // completes, so no one writes it while this copy reads it; the engine
            // bounds-checked it and `range` checks it again. Tested: a split run lands the
            // same bytes and records as one-by-one copies.
            let src = unsafe { self.host.range(range) }.map_err(|e| DeviceError::Backend {
                backend: "emulated",
                message: e.to_string(),
            })?;
            parts.push((*start, dst, src));
        }
        let units = &self.units;
        let copy_share =
            |share: &mut [(usize, &mut [u8], &[u8])]| -> Vec<(usize, usize, Option<Vec<u64>>)> {
                share
                    .iter_mut()
                    .map(|(addr, dst, src)| {
                        let hashes = units.copy_hashed(*addr, dst, src);
                        (*addr, dst.len(), hashes)
                    })
                    .collect()
            };
        let (a, b) = on_two_threads(
            &mut parts,
            total,
            |p| p.1.len() as u64,
            copy_share,
            "an H2D",
        )?;
        for (addr, len, hashes) in a.into_iter().chain(b) {
            self.units.store(addr, len, hashes);
        }
        self.split_runs += 1;
        Ok(true)
    }

    /// A run of D2H copies large enough to split (`PARALLEL_RUN_BYTES`) whose Host
    /// destinations are pairwise disjoint executes on two threads, each copying its share
    /// out of the arena (which no copy of the run writes). False, having done nothing, when
    /// the run is small or its destinations overlap: the copies then run one by one.
    fn execute_d2h_run(&mut self, run: &[ResolvedCopy]) -> Result<bool, DeviceError> {
        let total: u64 = run.iter().map(|c| c.len).sum();
        if run.len() < 2 || total < PARALLEL_RUN_BYTES {
            return Ok(false);
        }
        let mut order: Vec<(u64, u64, std::ops::Range<usize>)> = Vec::with_capacity(run.len());
        for c in run {
            let end = c
                .host_offset
                .checked_add(c.len)
                .ok_or(DeviceError::Backend {
                    backend: "emulated",
                    message: format!("host range {}+{} overflows", c.host_offset, c.len),
                })?;
            order.push((
                c.host_offset,
                end,
                self.arena_range(c.device_addr, c.len as usize)?,
            ));
        }
        order.sort_unstable_by_key(|(start, _, _)| *start);
        if !disjoint(order.iter().map(|(s, e, _)| (*s, *e))) {
            return Ok(false);
        }
        let arena: &[u8] = &self.arena;
        let mut parts: Vec<(&mut [u8], &[u8])> = Vec::with_capacity(order.len());
        for (start, end, dev) in &order {
            // SAFETY: the engine owns each destination range until the batch's fence
            // completes (the scheduler's destination reference), and the ranges of this
            // run are pairwise disjoint (checked above), so no two slices alias; `range_mut`
            // bounds-checks each. Tested: a split run lands the same Host bytes as one-by-one
            // copies, and bytes outside the copied ranges stay untouched.
            let dst = unsafe { self.host.range_mut(HostRange::new(*start, end - start)) }.map_err(
                |e| DeviceError::Backend {
                    backend: "emulated",
                    message: e.to_string(),
                },
            )?;
            parts.push((dst, &arena[dev.clone()]));
        }
        let copy_share = |share: &mut [(&mut [u8], &[u8])]| {
            for (dst, src) in share.iter_mut() {
                stream_copy(dst, src);
            }
        };
        on_two_threads(&mut parts, total, |p| p.0.len() as u64, copy_share, "a D2H")?;
        self.split_d2h_runs += 1;
        Ok(true)
    }

    /// Runs queued work; `limit` bounds the copies executed. Completed fences go to `done`.
    fn progress(&mut self, limit: Option<usize>) -> Result<(), DeviceError> {
        let mut copies = 0usize;
        while let Some(front) = self.queue.front() {
            match front {
                Pending::Fence(f) => {
                    self.done.push(*f);
                    self.queue.pop_front();
                }
                Pending::Copy(c) => {
                    let c = *c;
                    if limit.is_some_and(|l| copies >= l) {
                        break;
                    }
                    // a run of copies in one direction up to the next fence or the other
                    // direction, within the limit
                    let room = limit.map_or(usize::MAX, |l| l - copies);
                    let run: Vec<ResolvedCopy> = self
                        .queue
                        .iter()
                        .take(room)
                        .map_while(|p| match p {
                            Pending::Copy(r) if r.direction == c.direction => Some(*r),
                            _ => None,
                        })
                        .collect();
                    let split = match c.direction {
                        CopyDirection::H2D => self.execute_h2d_run(&run)?,
                        CopyDirection::D2H => self.execute_d2h_run(&run)?,
                    };
                    if !split {
                        // one by one, in stream order (the run is built once)
                        for (i, r) in run.iter().enumerate() {
                            if let Err(e) = self.execute(*r) {
                                self.queue.drain(..i + 1);
                                return Err(e);
                            }
                        }
                    }
                    self.queue.drain(..run.len());
                    copies += run.len();
                }
            }
        }
        Ok(())
    }

    fn arena_range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, DeviceError> {
        let start = usize::try_from(addr).ok();
        start
            .and_then(|s| s.checked_add(len).map(|e| s..e))
            .filter(|r| r.end <= self.arena.len())
            .ok_or(DeviceError::Backend {
                backend: "emulated",
                message: format!("device range {addr}+{len} outside arena"),
            })
    }
}

impl DeviceMemory for EmulatedDeviceMemory {
    fn backend(&self) -> &'static str {
        "emulated"
    }

    fn geometry(&self) -> DeviceGeometry {
        self.geometry
    }

    fn slot_address(&self, slot: u32) -> u64 {
        slot as u64 * self.geometry.slot_bytes
    }

    fn host(&self) -> &Arc<HostCacheStorage> {
        &self.host
    }

    fn enqueue(&mut self, copies: &[ResolvedCopy]) -> Result<(), DeviceError> {
        self.queue.extend(copies.iter().copied().map(Pending::Copy));
        Ok(())
    }

    fn record_fence(&mut self, fence: FenceId) -> Result<(), DeviceError> {
        self.queue.push_back(Pending::Fence(fence));
        Ok(())
    }

    fn completed(&mut self) -> Result<Vec<FenceId>, DeviceError> {
        self.progress(self.step_limit)?;
        Ok(std::mem::take(&mut self.done))
    }

    fn read(&mut self, device_addr: u64, out: &mut [u8]) -> Result<(), DeviceError> {
        self.progress(None)?;
        let r = self.arena_range(device_addr, out.len())?;
        out.copy_from_slice(&self.arena[r]);
        Ok(())
    }

    fn write(&mut self, device_addr: u64, data: &[u8]) -> Result<(), DeviceError> {
        self.progress(None)?;
        let r = self.arena_range(device_addr, data.len())?;
        self.units.invalidate(r.start, data.len());
        self.arena[r].copy_from_slice(data);
        Ok(())
    }

    fn set_digest_unit(&mut self, unit: usize) {
        self.units.set_unit(unit);
    }

    fn host_view(&mut self) -> Result<Option<HostView<'_>>, DeviceError> {
        self.progress(None)?;
        Ok(Some(HostView {
            arena: &mut self.arena,
            units: &mut self.units,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{disjoint, halfway};

    #[test]
    fn a_run_splits_where_the_first_share_reaches_half_its_bytes() {
        assert_eq!(halfway([4u64, 4, 4, 4].into_iter(), 16), 2);
        assert_eq!(halfway([10u64, 1, 1].into_iter(), 12), 1);
        assert_eq!(halfway([1u64, 1, 10].into_iter(), 12), 3);
        assert_eq!(halfway(std::iter::empty(), 0), 0);
    }

    #[test]
    fn ranges_that_touch_are_disjoint_and_ranges_that_share_a_byte_are_not() {
        assert!(disjoint([(0, 4), (4, 8), (10, 12)].into_iter()));
        assert!(!disjoint([(0, 5), (4, 8)].into_iter()));
        assert!(disjoint(std::iter::empty()));
    }
}
