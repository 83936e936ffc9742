//! The in-process MEMORY tier of the local store: a byte budget, resident replicas in LRU
//! order, leases that keep a replica from eviction while it is read, and MEMORY targets.
//! A target is an Arc'd buffer with a `fenced` flag: fencing (fail, expire, remove) stops
//! every later write and unlinks it, and its bytes return to the budget only when the last
//! Arc drops, i.e. when its writer has drained. It must never return a target's bytes to
//! the budget on elapsed time alone, and never let a reader see an unpublished target.
//!
//! A target's bytes are written once, never zeroed first: chunk writes append in order
//! (or rewrite bytes already landed), and a promotion hands the target its verified staging
//! buffer whole (`adopt`), so a promoted object crosses memory once, in the DFS read. Only
//! a target holding exactly its reserved length is ever published.
//!
//! Spare buffers: the memory of a replica that left (evicted, removed, fenced) is kept for
//! the next target or promotion read of the same size, as long as replicas plus spares fit
//! the budget; a reservation that needs the room drops spares first. A refill of the tier
//! then writes memory the process already touched instead of faulting fresh pages (on a
//! VM that returns freed pages to its host, a first touch ran at 1.1-1.4 GB/s here against
//! 6.7-18.8 GB/s for a second pass). A spare's old bytes are never read: a buffer is handed
//! out empty (length 0) and only what is written after that becomes its content.

use messages::{Namespace, StorageKey};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64;

use crate::l3::store::CapacityReason;

/// Buffers kept for reuse, by capacity.
#[derive(Debug, Default)]
struct Spares {
    by_capacity: HashMap<usize, Vec<Vec<u8>>>,
    bytes: u64,
}

/// The MEMORY byte budget, charged by targets from allocation until their last Arc drops.
#[derive(Debug)]
pub struct MemoryBudget {
    capacity: u64,
    used: AtomicU64,
    /// Bytes of fenced targets not yet drained (their writer still holds them).
    fenced_outstanding: AtomicU64,
    /// Memory of replicas that left, kept while `used` plus spares fit `capacity`.
    spares: Mutex<Spares>,
}

impl MemoryBudget {
    fn new(capacity: u64) -> Self {
        Self {
            capacity,
            used: AtomicU64::new(0),
            fenced_outstanding: AtomicU64::new(0),
            spares: Mutex::new(Spares::default()),
        }
    }

    /// An empty buffer whose capacity is exactly `len`, if a spare one is kept.
    pub fn take_spare(&self, len: usize) -> Option<Vec<u8>> {
        if len == 0 {
            return None;
        }
        let mut sp = self.spares.lock();
        let class = sp.by_capacity.get_mut(&len)?;
        let v = class.pop()?;
        if class.is_empty() {
            sp.by_capacity.remove(&len);
        }
        sp.bytes -= v.capacity() as u64;
        Some(v)
    }

    /// Keeps `v`'s memory for a later target when replicas plus spares still fit the
    /// budget; drops it otherwise.
    fn keep_spare(&self, mut v: Vec<u8>) {
        let cap = v.capacity();
        if cap == 0 {
            return;
        }
        v.clear();
        let mut sp = self.spares.lock();
        let total = self
            .used()
            .saturating_add(sp.bytes)
            .saturating_add(cap as u64);
        if total <= self.capacity {
            sp.bytes += cap as u64;
            sp.by_capacity.entry(cap).or_default().push(v);
        }
    }

    /// Drops spares until replicas plus spares fit the budget again (after a reservation).
    fn trim_spares(&self) {
        let mut dropped = Vec::new();
        {
            let mut guard = self.spares.lock();
            let Spares { by_capacity, bytes } = &mut *guard;
            let room = self.capacity.saturating_sub(self.used());
            while *bytes > room {
                let Some(&cap) = by_capacity.keys().next() else {
                    break;
                };
                let Some(class) = by_capacity.get_mut(&cap) else {
                    break;
                };
                if let Some(v) = class.pop() {
                    *bytes -= v.capacity() as u64;
                    dropped.push(v);
                }
                if class.is_empty() {
                    by_capacity.remove(&cap);
                }
            }
        }
        drop(dropped); // freed outside the lock
    }

    /// Bytes of spare buffers kept for reuse.
    pub fn spare_bytes(&self) -> u64 {
        self.spares.lock().bytes
    }

    fn try_reserve(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.capacity)
            })
            .is_ok()
    }
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
    pub fn fenced_outstanding(&self) -> u64 {
        self.fenced_outstanding.load(Ordering::Acquire)
    }
}

/// A target write was refused: the target is fenced (or the write falls outside it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fenced;

/// Why a target refused a whole buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdoptError {
    Fenced,
    /// Not exactly the reserved length, or bytes already landed.
    Length,
}

/// One MEMORY allocation: written by one writer, then published as a replica (or fenced).
#[derive(Debug)]
pub struct MemoryTarget {
    key: StorageKey,
    target_id: u64,
    /// The promotion attempt that owns it (0: a write-through PUT).
    attempt_id: u64,
    /// The bytes charged to the budget: the object's length once fully written.
    len: u64,
    /// What landed so far (at most `len` bytes, written in order).
    data: RwLock<Vec<u8>>,
    fenced: AtomicBool,
    budget: Arc<MemoryBudget>,
}

impl MemoryTarget {
    pub fn key(&self) -> &StorageKey {
        &self.key
    }
    pub fn target_id(&self) -> u64 {
        self.target_id
    }
    pub fn attempt_id(&self) -> u64 {
        self.attempt_id
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether every reserved byte landed.
    pub fn is_complete(&self) -> bool {
        self.data.read().len() as u64 == self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Writes one chunk unless fenced; the check and the copy happen under the write lock,
    /// so no byte lands after `fence` returned.
    pub fn write_chunk(&self, offset: usize, bytes: &[u8]) -> Result<(), Fenced> {
        self.write_with(offset, bytes, |_| {})
    }

    /// `write_chunk`, then hashes the bytes now in the target (still in cache) into `h`:
    /// the writer's checksum of what it wrote, in the same pass as the copy.
    pub fn write_chunk_hashed(
        &self,
        offset: usize,
        bytes: &[u8],
        h: &mut xxhash_rust::xxh3::Xxh3,
    ) -> Result<(), Fenced> {
        self.write_with(offset, bytes, |landed| h.update(landed))
    }

    fn write_with(
        &self,
        offset: usize,
        bytes: &[u8],
        then: impl FnOnce(&[u8]),
    ) -> Result<(), Fenced> {
        let mut d = self.data.write();
        if self.fenced.load(Ordering::Acquire) {
            return Err(Fenced);
        }
        let end = offset.checked_add(bytes.len()).ok_or(Fenced)?;
        if end as u64 > self.len || offset > d.len() {
            return Err(Fenced); // past the reservation, or a gap: never written
        }
        if end > d.len() {
            // Appends the new tail (no zeroing); rewrites any bytes already landed.
            let landed = d.len();
            d[offset..landed].copy_from_slice(&bytes[..landed - offset]);
            d.extend_from_slice(&bytes[landed - offset..]);
        } else {
            d[offset..end].copy_from_slice(bytes);
        }
        then(&d[offset..end]);
        Ok(())
    }

    /// Takes `bytes` as the target's whole content (no copy) unless fenced, partly written
    /// already, or not exactly the reserved length; under the write lock, like a chunk
    /// write, so nothing lands after `fence` returned.
    pub fn adopt(&self, bytes: Vec<u8>) -> Result<(), AdoptError> {
        let mut d = self.data.write();
        if self.fenced.load(Ordering::Acquire) {
            return Err(AdoptError::Fenced);
        }
        if !d.is_empty() || bytes.len() as u64 != self.len {
            return Err(AdoptError::Length);
        }
        *d = bytes;
        Ok(())
    }

    /// Stops every later write. Idempotent.
    pub fn fence(&self) {
        let _d = self.data.write();
        if !self.fenced.swap(true, Ordering::AcqRel) {
            self.budget
                .fenced_outstanding
                .fetch_add(self.len, Ordering::AcqRel);
        }
    }

    pub fn checksum(&self) -> u64 {
        xxh3_64(&self.data.read())
    }

    /// A copy of the bytes (verification helper).
    pub fn to_vec(&self) -> Vec<u8> {
        self.data.read().to_vec()
    }

    /// Copies the replica into `dest` with the store contract: exact → Ok; a longer
    /// destination → ShortRead; a shorter one → Invalid.
    pub fn read_into(&self, dest: &mut [u8]) -> crate::l3::store::KeyResult {
        use crate::l3::store::KeyResult;
        let d = self.data.read();
        let len = d.len();
        if len > dest.len() {
            return KeyResult::Invalid;
        }
        crate::host::stream_copy(&mut dest[..len], &d);
        if len < dest.len() {
            KeyResult::ShortRead { bytes: len as u64 }
        } else {
            KeyResult::Ok { bytes: len as u64 }
        }
    }
}

impl Drop for MemoryTarget {
    /// The last owner is gone (the writer drained): the bytes return to the budget.
    fn drop(&mut self) {
        let len = self.len;
        if *self.fenced.get_mut() {
            self.budget
                .fenced_outstanding
                .fetch_sub(len, Ordering::AcqRel);
        }
        self.budget.used.fetch_sub(len, Ordering::AcqRel);
        self.budget.keep_spare(std::mem::take(self.data.get_mut()));
    }
}

#[derive(Debug)]
struct Resident {
    target: Arc<MemoryTarget>,
    last_use: u64,
    leases: u32,
}

#[derive(Debug, Default)]
struct TierState {
    map: HashMap<StorageKey, Resident>,
    lru: BTreeMap<u64, StorageKey>,
    tick: u64,
    /// Bytes of resident, unleased replicas (what eviction could free).
    evictable_bytes: u64,
}

impl TierState {
    fn touch(&mut self, key: &StorageKey) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(r) = self.map.get_mut(key) {
            self.lru.remove(&r.last_use);
            r.last_use = tick;
            self.lru.insert(tick, key.clone());
        }
    }
    fn unlink(&mut self, key: &StorageKey) -> Option<Arc<MemoryTarget>> {
        let r = self.map.remove(key)?;
        self.lru.remove(&r.last_use);
        if r.leases == 0 {
            self.evictable_bytes -= r.target.len();
        }
        Some(r.target)
    }
}

/// Counters of the MEMORY tier.
#[derive(Debug, Default)]
pub struct TierStats {
    pub evictions: AtomicU64,
    pub published: AtomicU64,
    pub insert_skipped_full: AtomicU64,
}

/// The MEMORY tier.
#[derive(Debug)]
pub struct MemoryTier {
    state: Mutex<TierState>,
    budget: Arc<MemoryBudget>,
    next_target: AtomicU64,
    pub stats: TierStats,
}

/// A lease on a resident replica: it cannot be evicted while the lease lives.
#[derive(Debug)]
pub struct Lease<'a> {
    tier: &'a MemoryTier,
    target: Arc<MemoryTarget>,
}

impl Lease<'_> {
    pub fn target(&self) -> &MemoryTarget {
        &self.target
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut st = self.tier.state.lock();
        let key = self.target.key.clone();
        if let Some(r) = st.map.get_mut(&key) {
            if r.target.target_id == self.target.target_id {
                r.leases -= 1;
                if r.leases == 0 {
                    let len = r.target.len();
                    st.evictable_bytes += len;
                }
            }
        }
    }
}

impl MemoryTier {
    pub fn new(capacity: u64) -> Self {
        Self {
            state: Mutex::new(TierState::default()),
            budget: Arc::new(MemoryBudget::new(capacity)),
            next_target: AtomicU64::new(1),
            stats: TierStats::default(),
        }
    }

    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    pub fn contains(&self, key: &StorageKey) -> bool {
        self.state.lock().map.contains_key(key)
    }

    pub fn resident_count(&self) -> usize {
        self.state.lock().map.len()
    }

    /// Whether `len` more bytes could be made available by evicting unleased replicas:
    /// the watermark gate of admission (leased replicas and live/fenced targets stay).
    pub fn admits(&self, len: u64) -> bool {
        let st = self.state.lock();
        let pinned = self.budget.used().saturating_sub(st.evictable_bytes);
        pinned
            .checked_add(len)
            .is_some_and(|t| t <= self.budget.capacity)
    }

    /// A lease on a resident replica (bumps its LRU position).
    pub fn lease(&self, key: &StorageKey) -> Option<Lease<'_>> {
        let mut st = self.state.lock();
        st.touch(key);
        let r = st.map.get_mut(key)?;
        r.leases += 1;
        let first = r.leases == 1;
        let target = r.target.clone();
        if first {
            st.evictable_bytes -= target.len();
        }
        Some(Lease { tier: self, target })
    }

    /// Allocates a target of `len` bytes (capacity only: its memory is first written by
    /// the chunk writes), evicting unleased replicas in LRU order if needed.
    pub fn allocate(
        &self,
        key: &StorageKey,
        attempt_id: u64,
        len: u64,
    ) -> Result<Arc<MemoryTarget>, CapacityReason> {
        self.charge(key, attempt_id, len, true)
    }

    /// Charges a target of `len` bytes to the budget (evicting like `allocate`) without
    /// allocating its memory: its bytes arrive whole through `MemoryTarget::adopt`.
    pub fn allocate_unbacked(
        &self,
        key: &StorageKey,
        attempt_id: u64,
        len: u64,
    ) -> Result<Arc<MemoryTarget>, CapacityReason> {
        self.charge(key, attempt_id, len, false)
    }

    fn charge(
        &self,
        key: &StorageKey,
        attempt_id: u64,
        len: u64,
        backed: bool,
    ) -> Result<Arc<MemoryTarget>, CapacityReason> {
        if len > self.budget.capacity {
            return Err(CapacityReason::Allocation);
        }
        let size = usize::try_from(len).map_err(|_| CapacityReason::Allocation)?;
        loop {
            if self.budget.try_reserve(len) {
                let spare = if backed {
                    self.budget.take_spare(size)
                } else {
                    None
                };
                self.budget.trim_spares();
                let mut data = spare.unwrap_or_default();
                if backed && data.capacity() < size && data.try_reserve_exact(size).is_err() {
                    self.budget.used.fetch_sub(len, Ordering::AcqRel);
                    return Err(CapacityReason::Allocation);
                }
                return Ok(Arc::new(MemoryTarget {
                    key: key.clone(),
                    target_id: self.next_target.fetch_add(1, Ordering::Relaxed),
                    attempt_id,
                    len,
                    data: RwLock::new(data),
                    fenced: AtomicBool::new(false),
                    budget: self.budget.clone(),
                }));
            }
            // Evict one unleased replica (dropped outside the lock), then retry.
            let victim = {
                let mut st = self.state.lock();
                let k = st
                    .lru
                    .values()
                    .find(|k| st.map.get(*k).is_some_and(|r| r.leases == 0))
                    .cloned();
                match k {
                    Some(k) => st.unlink(&k),
                    None => return Err(CapacityReason::Allocation),
                }
            };
            if victim.is_some() {
                self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            }
            drop(victim);
        }
    }

    /// Publishes a fully written, unfenced target as the key's replica. If a replica is
    /// already resident it stays (create-only): returns false and the target is dropped.
    pub fn publish(&self, target: Arc<MemoryTarget>) -> bool {
        if target.is_fenced() || !target.is_complete() {
            return false;
        }
        let mut st = self.state.lock();
        if st.map.contains_key(&target.key) {
            return false;
        }
        st.tick += 1;
        let tick = st.tick;
        let len = target.len();
        st.lru.insert(tick, target.key.clone());
        st.map.insert(
            target.key.clone(),
            Resident {
                target,
                last_use: tick,
                leases: 0,
            },
        );
        st.evictable_bytes += len;
        self.stats.published.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Best-effort insertion of a copy (write-through PUT): skipped when MEMORY is full.
    pub fn insert_copy(&self, key: &StorageKey, bytes: &[u8]) -> bool {
        if self.contains(key) {
            return false;
        }
        let Ok(t) = self.allocate_unbacked(key, 0, bytes.len() as u64) else {
            self.stats
                .insert_skipped_full
                .fetch_add(1, Ordering::Relaxed);
            return false;
        };
        // One copy into memory written once (never zeroed first): a spare buffer of this
        // size when one is kept.
        let mut copy = self.budget.take_spare(bytes.len()).unwrap_or_default();
        copy.extend_from_slice(bytes);
        if t.adopt(copy).is_err() {
            return false;
        }
        self.publish(t)
    }

    /// Evicts one unleased replica. Returns false when absent or leased.
    pub fn evict(&self, key: &StorageKey) -> bool {
        let victim = {
            let mut st = self.state.lock();
            match st.map.get(key) {
                Some(r) if r.leases == 0 => st.unlink(key),
                _ => None,
            }
        };
        if victim.is_some() {
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        }
        victim.is_some()
    }

    /// Fences and unlinks a replica regardless of leases (an administrative removal:
    /// holders keep their Arc; the bytes return when the last one drops).
    pub fn remove(&self, key: &StorageKey) -> bool {
        let t = self.state.lock().unlink(key);
        match t {
            Some(t) => {
                t.fence();
                true
            }
            None => false,
        }
    }

    /// Removes every replica of a namespace. Returns how many.
    pub fn remove_namespace(&self, ns: &Namespace) -> u64 {
        let victims: Vec<Arc<MemoryTarget>> = {
            let mut st = self.state.lock();
            let keys: Vec<StorageKey> = st.map.keys().filter(|k| ns.owns(k)).cloned().collect();
            keys.iter().filter_map(|k| st.unlink(k)).collect()
        };
        for t in &victims {
            t.fence();
        }
        victims.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l3::store::KeyResult;

    fn k(s: &str) -> StorageKey {
        StorageKey::new(format!("tsl3-0000000000000001-{s}"))
    }

    #[test]
    fn a_replica_that_left_lends_its_memory_to_the_next_target_of_its_size_and_no_old_byte_shows() {
        let t = MemoryTier::new(100);
        assert!(t.insert_copy(&k("a"), &[7; 40]));
        assert_eq!(t.budget().spare_bytes(), 0);
        assert!(t.evict(&k("a")));
        assert_eq!(
            t.budget().spare_bytes(),
            40,
            "the evicted replica's buffer is kept"
        );
        // The next target of that size takes it, empty: only its own writes show.
        let target = t.allocate(&k("b"), 1, 40).unwrap();
        assert_eq!(t.budget().spare_bytes(), 0);
        assert!(
            target.to_vec().is_empty(),
            "no byte of the old replica is visible"
        );
        target.write_chunk(0, &[9; 16]).unwrap();
        assert_eq!(target.to_vec(), vec![9; 16]);
        assert!(!target.is_complete() && !t.publish(target.clone()));
        target.write_chunk(16, &[9; 24]).unwrap();
        assert!(t.publish(target));
        let mut dest = [0u8; 40];
        assert_eq!(
            t.lease(&k("b")).unwrap().target().read_into(&mut dest),
            KeyResult::Ok { bytes: 40 }
        );
        assert_eq!(dest, [9; 40]);
        // An insert of that size takes a spare too.
        assert!(t.evict(&k("b")));
        assert!(t.insert_copy(&k("c"), &[5; 40]));
        assert_eq!(t.budget().spare_bytes(), 0);
        let mut dest = [0u8; 40];
        t.lease(&k("c")).unwrap().target().read_into(&mut dest);
        assert_eq!(dest, [5; 40]);
    }

    #[test]
    fn replicas_and_spares_together_never_exceed_the_budget() {
        let t = MemoryTier::new(100);
        assert!(t.insert_copy(&k("a"), &[1; 40]));
        assert!(t.insert_copy(&k("b"), &[2; 40]));
        assert!(t.evict(&k("a")) && t.evict(&k("b")));
        assert_eq!(t.budget().spare_bytes(), 80);
        // A target of another size needs room: spares go until both fit.
        let c = t.allocate(&k("c"), 1, 30).unwrap();
        assert_eq!(t.budget().used(), 30);
        assert_eq!(t.budget().spare_bytes(), 40);
        assert!(t.budget().used() + t.budget().spare_bytes() <= 100);
        let d = t.allocate(&k("d"), 2, 70).unwrap();
        assert_eq!(t.budget().spare_bytes(), 0, "a full budget keeps no spare");
        // What leaves becomes spare while replicas plus spares still fit.
        drop(c);
        assert_eq!(t.budget().spare_bytes(), 30);
        drop(d);
        assert_eq!(t.budget().spare_bytes(), 100);
        assert_eq!(t.budget().used(), 0);
    }

    #[test]
    fn lru_eviction_skips_leased_replicas() {
        let t = MemoryTier::new(30);
        assert!(t.insert_copy(&k("a"), &[1; 10]));
        assert!(t.insert_copy(&k("b"), &[2; 10]));
        assert!(t.insert_copy(&k("c"), &[3; 10]));
        let lease_a = t.lease(&k("a")).unwrap();
        // "a" is the oldest but leased: "b" goes.
        assert!(t.insert_copy(&k("d"), &[4; 10]));
        assert!(t.contains(&k("a")) && !t.contains(&k("b")));
        assert!(!t.evict(&k("a")), "a leased replica is not evictable");
        drop(lease_a);
        assert!(t.evict(&k("a")));
        assert_eq!(t.budget().used(), 20);
        assert_eq!(t.stats.evictions.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn fenced_target_keeps_its_bytes_until_the_writer_drops() {
        let t = MemoryTier::new(10);
        let target = t.allocate(&k("x"), 7, 10).unwrap();
        assert_eq!(
            t.allocate(&k("y"), 8, 1).unwrap_err(),
            CapacityReason::Allocation
        );
        target.write_chunk(0, &[1; 5]).unwrap();
        target.fence();
        assert_eq!(target.write_chunk(5, &[1; 5]), Err(Fenced));
        assert_eq!(t.budget().fenced_outstanding(), 10);
        assert!(
            !t.publish(target.clone()),
            "a fenced target is never published"
        );
        assert_eq!(t.budget().used(), 10, "no reuse before the writer drains");
        drop(target);
        assert_eq!(t.budget().used(), 0);
        assert_eq!(t.budget().fenced_outstanding(), 0);
        assert!(t.allocate(&k("y"), 8, 10).is_ok());
    }

    #[test]
    fn a_target_is_published_only_once_every_reserved_byte_landed() {
        let t = MemoryTier::new(100);
        let part = t.allocate(&k("p"), 1, 10).unwrap();
        part.write_chunk(0, &[1; 4]).unwrap();
        assert_eq!(
            part.write_chunk(6, &[1; 4]),
            Err(Fenced),
            "a gap is never written"
        );
        assert_eq!(
            part.write_chunk(4, &[1; 7]),
            Err(Fenced),
            "past the reservation"
        );
        assert!(!part.is_complete());
        assert!(
            !t.publish(part.clone()),
            "a partial target is never published"
        );
        assert!(!t.contains(&k("p")));
        part.write_chunk(4, &[2; 6]).unwrap();
        assert!(part.is_complete());
        assert_eq!(part.to_vec(), [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        assert!(t.publish(part));
        // A whole buffer: refused when it is not exactly the reservation or once fenced.
        let a = t.allocate_unbacked(&k("a"), 2, 3).unwrap();
        assert_eq!(a.adopt(vec![9; 4]), Err(AdoptError::Length));
        assert!(!t.publish(a.clone()), "nothing landed yet");
        a.fence();
        assert_eq!(a.adopt(vec![9; 3]), Err(AdoptError::Fenced));
        drop(a);
        let b = t.allocate_unbacked(&k("b"), 3, 3).unwrap();
        assert_eq!(
            t.budget().used(),
            13,
            "an unbacked target is charged in full"
        );
        b.adopt(vec![7; 3]).unwrap();
        assert_eq!(b.adopt(vec![7; 3]), Err(AdoptError::Length), "written once");
        assert!(t.publish(b));
        let mut dest = [0u8; 3];
        assert_eq!(
            t.lease(&k("b")).unwrap().target().read_into(&mut dest),
            crate::l3::store::KeyResult::Ok { bytes: 3 }
        );
        assert_eq!(dest, [7; 3]);
    }

    #[test]
    fn watermark_counts_only_evictable_bytes() {
        let t = MemoryTier::new(20);
        t.insert_copy(&k("a"), &[0; 10]);
        assert!(t.admits(20));
        let _l = t.lease(&k("a")).unwrap();
        assert!(!t.admits(11));
        assert!(t.admits(10));
    }
}
