//! MemoryStore: an in-process store. Create-only PUT, exact byte counts, and failures that
//! always retire (nothing outlives a call). Used by tests and single-process deployments.

use super::{KeyResult, Store, StoreError};
use messages::{Namespace, StorageKey};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: RwLock<HashMap<StorageKey, Arc<[u8]>>>,
    /// Adapter invocations (one per call).
    pub backend_calls: AtomicU64,
    /// PUT rows that wrote a new object (idempotent hits are not counted).
    pub new_writes: AtomicU64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
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
        self.objects.write().remove(key).is_some()
    }
    pub fn object(&self, key: &StorageKey) -> Option<Arc<[u8]>> {
        self.objects.read().get(key).cloned()
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
                    d.copy_from_slice(obj);
                    KeyResult::Ok {
                        bytes: obj.len() as u64,
                    }
                }
                Some(obj) if obj.len() < d.len() => {
                    d[..obj.len()].copy_from_slice(obj);
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
        let mut map = self.objects.write();
        Ok(keys
            .iter()
            .zip(srcs)
            .map(|(k, s)| {
                if map.contains_key(k) {
                    KeyResult::AlreadyExists
                } else {
                    map.insert(k.clone(), Arc::from(*s));
                    self.new_writes.fetch_add(1, Ordering::Relaxed);
                    KeyResult::Ok {
                        bytes: s.len() as u64,
                    }
                }
            })
            .collect())
    }

    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        self.backend_calls.fetch_add(1, Ordering::Relaxed);
        let mut map = self.objects.write();
        let before = map.len();
        map.retain(|k, _| !ns.owns(k));
        Ok((before - map.len()) as u64)
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
