//! MemoryStore: an in-process store. Create-only PUT, exact byte counts, and failures that
//! always retire (nothing outlives a call). Used by tests and single-process deployments.
//!
//! Memory speed: a PUT copies its source into the object's buffer outside the map's lock
//! (the object is inserted, create-only, only once its copy is complete, so no reader sees
//! a partial object), and the buffers of removed objects are kept, up to a byte cap, for
//! later PUTs of the same length: a store that turns over same-sized KV pages writes into
//! memory that is already faulted in instead of fresh pages the kernel must zero first.

use super::{KeyResult, Store, StoreError};
use messages::{Namespace, StorageKey};
use parking_lot::{Mutex, RwLock};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes of removed objects' buffers a store keeps for reuse by default.
pub const DEFAULT_SPARE_BYTES: u64 = 256 << 20;

/// Buffers of removed objects, by length, kept for later PUTs (bounded in bytes).
#[derive(Debug, Default)]
struct Spare {
    by_len: HashMap<usize, Vec<Box<[u8]>>>,
    bytes: u64,
}

#[derive(Debug)]
pub struct MemoryStore {
    objects: RwLock<HashMap<StorageKey, Box<[u8]>>>,
    spare: Mutex<Spare>,
    spare_cap: u64,
    /// Adapter invocations (one per call).
    pub backend_calls: AtomicU64,
    /// PUT rows that wrote a new object (idempotent hits are not counted).
    pub new_writes: AtomicU64,
    /// PUT rows whose bytes landed in a reused buffer of a removed object.
    pub reused_buffers: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_spare_bytes(DEFAULT_SPARE_BYTES)
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }
    /// A store that keeps at most `cap` bytes of removed objects' buffers for reuse.
    pub fn with_spare_bytes(cap: u64) -> Self {
        Self {
            objects: RwLock::new(HashMap::new()),
            spare: Mutex::new(Spare::default()),
            spare_cap: cap,
            backend_calls: AtomicU64::new(0),
            new_writes: AtomicU64::new(0),
            reused_buffers: AtomicU64::new(0),
        }
    }
    pub fn len(&self) -> usize {
        self.objects.read().len()
    }
    pub fn is_empty(&self) -> bool {
        self.objects.read().is_empty()
    }
    pub fn contains(&self, key: &StorageKey) -> bool {
        self.objects.read().contains_key(key)
    }
    /// Removes one object (tests: a delete, then retired misses).
    pub fn remove(&self, key: &StorageKey) -> bool {
        let removed = self.objects.write().remove(key);
        match removed {
            Some(buf) => {
                self.recycle(buf);
                true
            }
            None => false,
        }
    }
    /// A copy of one object's bytes (an inspection helper).
    pub fn object(&self, key: &StorageKey) -> Option<Arc<[u8]>> {
        self.objects.read().get(key).map(|b| Arc::from(&b[..]))
    }
    /// Bytes of removed objects' buffers held for reuse now (never above the cap).
    pub fn spare_bytes(&self) -> u64 {
        self.spare.lock().bytes
    }

    /// Keeps a removed object's buffer for a later PUT of its length, unless the cap is
    /// reached (then it is freed).
    fn recycle(&self, buf: Box<[u8]>) {
        let len = buf.len() as u64;
        let mut sp = self.spare.lock();
        if len == 0 || sp.bytes + len > self.spare_cap {
            return;
        }
        sp.bytes += len;
        sp.by_len.entry(buf.len()).or_default().push(buf);
    }

    /// A buffer holding a copy of `src`: a spare one of its length if there is one, else a
    /// fresh allocation written once by the copy (never zeroed first).
    fn filled(&self, src: &[u8]) -> Box<[u8]> {
        let spare = {
            let mut sp = self.spare.lock();
            let b = sp.by_len.get_mut(&src.len()).and_then(Vec::pop);
            if b.is_some() {
                sp.bytes -= src.len() as u64;
            }
            b
        };
        match spare {
            Some(mut b) => {
                self.reused_buffers.fetch_add(1, Ordering::Relaxed);
                b.copy_from_slice(src);
                b
            }
            None => Box::from(src),
        }
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn failures_retire(&self) -> bool {
        true
    }

    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        self.backend_calls.fetch_add(1, Ordering::Relaxed);
        let map = self.objects.read();
        Ok(keys.iter().map(|k| map.contains_key(k)).collect())
    }

    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError> {
        self.backend_calls.fetch_add(1, Ordering::Relaxed);
        crate::l3::store::same_count("memory", keys.len(), dests.len(), "destinations")?;
        let map = self.objects.read();
        Ok(keys
            .iter()
            .zip(dests.iter_mut())
            .map(|(k, d)| match map.get(k) {
                None => KeyResult::Missing,
                Some(obj) if obj.len() == d.len() => {
                    crate::host::stream_copy(d, obj);
                    KeyResult::Ok {
                        bytes: obj.len() as u64,
                    }
                }
                Some(obj) if obj.len() < d.len() => {
                    crate::host::stream_copy(&mut d[..obj.len()], obj);
                    KeyResult::ShortRead {
                        bytes: obj.len() as u64,
                    }
                }
                Some(_) => KeyResult::Invalid,
            })
            .collect())
    }

    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError> {
        self.backend_calls.fetch_add(1, Ordering::Relaxed);
        crate::l3::store::same_count("memory", keys.len(), srcs.len(), "sources")?;
        Ok(keys
            .iter()
            .zip(srcs)
            .map(|(k, s)| {
                if self.objects.read().contains_key(k) {
                    return KeyResult::AlreadyExists;
                }
                // The copy runs outside the map's lock; the complete object is inserted
                // create-only (a racing PUT of the key that inserted first wins).
                let buf = self.filled(s);
                let mut map = self.objects.write();
                match map.entry(k.clone()) {
                    Entry::Occupied(_) => {
                        drop(map);
                        self.recycle(buf);
                        KeyResult::AlreadyExists
                    }
                    Entry::Vacant(v) => {
                        v.insert(buf);
                        self.new_writes.fetch_add(1, Ordering::Relaxed);
                        KeyResult::Ok {
                            bytes: s.len() as u64,
                        }
                    }
                }
            })
            .collect())
    }

    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        self.backend_calls.fetch_add(1, Ordering::Relaxed);
        let removed: Vec<Box<[u8]>> = {
            let mut map = self.objects.write();
            let keys: Vec<StorageKey> = map.keys().filter(|k| ns.owns(k)).cloned().collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        let n = removed.len() as u64;
        for buf in removed {
            self.recycle(buf);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> StorageKey {
        StorageKey::new(format!("tsl3-0000000000000000-{s}"))
    }

    #[test]
    fn create_only_exact_bytes_and_misses() {
        let s = MemoryStore::new();
        let r = s.put(&[k("a"), k("b")], &[b"hello", b"world!"]).unwrap();
        assert_eq!(
            r,
            vec![KeyResult::Ok { bytes: 5 }, KeyResult::Ok { bytes: 6 }]
        );
        let r = s.put(&[k("a")], &[b"HELLO"]).unwrap();
        assert_eq!(r, vec![KeyResult::AlreadyExists]);
        assert_eq!(s.new_writes.load(Ordering::Relaxed), 2);
        assert_eq!(s.query(&[k("a"), k("z")]).unwrap(), vec![true, false]);
        let mut a = [0u8; 5];
        let mut z = [0u8; 5];
        let mut long = [0u8; 8];
        let mut short = [0u8; 3];
        let r = s
            .get(
                &[k("a"), k("z"), k("b"), k("b")],
                &mut [&mut a, &mut z, &mut long, &mut short],
            )
            .unwrap();
        assert_eq!(
            r,
            vec![
                KeyResult::Ok { bytes: 5 },
                KeyResult::Missing,
                KeyResult::ShortRead { bytes: 6 },
                KeyResult::Invalid
            ]
        );
        assert_eq!(&a, b"hello", "create-only: the first value stays");
        assert_eq!(s.backend_calls.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_removed_objects_buffer_is_reused_with_the_new_bytes_and_the_spare_cap_holds() {
        let s = MemoryStore::with_spare_bytes(8);
        s.put(&[k("a"), k("b"), k("c")], &[b"AAAA", b"BBBB", b"CCCC"])
            .unwrap();
        assert!(s.remove(&k("a")) && s.remove(&k("b")) && s.remove(&k("c")));
        // Two 4-byte buffers fit under the cap of 8; the third is freed.
        assert_eq!(s.spare_bytes(), 8);
        let r = s.put(&[k("d"), k("e")], &[b"dddd", b"xyz"]).unwrap();
        assert_eq!(
            r,
            vec![KeyResult::Ok { bytes: 4 }, KeyResult::Ok { bytes: 3 }]
        );
        // Only the same length is reused, and it holds the new object's bytes only.
        assert_eq!(s.reused_buffers.load(Ordering::Relaxed), 1);
        assert_eq!(s.spare_bytes(), 4);
        assert_eq!(&*s.object(&k("d")).unwrap(), b"dddd");
        assert_eq!(&*s.object(&k("e")).unwrap(), b"xyz");
        let mut d = [0u8; 4];
        assert_eq!(
            s.get(&[k("d")], &mut [&mut d]).unwrap(),
            vec![KeyResult::Ok { bytes: 4 }]
        );
        assert_eq!(&d, b"dddd");
        // A create-only loser's copy goes back to the spare buffers, not into the map.
        assert_eq!(
            s.put(&[k("d")], &[b"DDDD"]).unwrap(),
            vec![KeyResult::AlreadyExists]
        );
        assert_eq!(&*s.object(&k("d")).unwrap(), b"dddd");
        assert_eq!(
            s.remove_namespace(&Namespace("tsl3-0000000000000000".into()))
                .unwrap(),
            2
        );
        assert!(s.spare_bytes() <= 8);
    }

    #[test]
    fn concurrent_puts_of_one_key_publish_exactly_one_whole_object() {
        let s = Arc::new(MemoryStore::new());
        let results: Vec<KeyResult> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4u8)
                .map(|i| {
                    let s = s.clone();
                    sc.spawn(move || s.put(&[k("race")], &[&[i; 4096][..]]).unwrap()[0])
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let oks = results
            .iter()
            .filter(|r| matches!(r, KeyResult::Ok { .. }))
            .count();
        assert_eq!(oks, 1, "{results:?}");
        let obj = s.object(&k("race")).unwrap();
        assert!(obj.iter().all(|b| *b == obj[0]), "one writer's bytes only");
        assert_eq!(s.new_writes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn remove_namespace_removes_only_that_namespace() {
        let s = MemoryStore::new();
        let ns1 = Namespace("tsl3-1111111111111111".into());
        let ns2 = Namespace("tsl3-2222222222222222".into());
        s.put(
            &[
                ns1.key(1, 0, 0, 0),
                ns1.key(2, 0, 0, 0),
                ns2.key(1, 0, 0, 0),
            ],
            &[b"x", b"y", b"z"],
        )
        .unwrap();
        assert_eq!(s.remove_namespace(&ns1).unwrap(), 2);
        assert_eq!(s.len(), 1);
        assert!(s.contains(&ns2.key(1, 0, 0, 0)));
    }
}
