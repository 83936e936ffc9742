//! The hash of the tables keyed by a sequential ID (the StorageTransferManager's tickets by
//! OperationId and waits by RequestId, the Scheduler's Host references and reads) or by
//! integers already uniform (the backup queue's Host pages, named by content hash): one
//! multiply per integer. Such keys do not come from a client, so a keyed SipHash costs
//! more than it protects, and an ordered map pays a tree walk and node copies of large
//! tickets on every insert and removal.
//!
//! It owns no table and must never be used where iteration order reaches a decision: the
//! order of a hash table is not the ID order, so a caller that walks one in order sorts the
//! IDs first (`sorted_keys`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// A table keyed by a sequential ID.
pub type IdMap<K, V> = HashMap<K, V, BuildIdHasher>;

/// A new, empty `IdMap`.
pub fn id_map<K, V>() -> IdMap<K, V> {
    HashMap::with_hasher(BuildIdHasher)
}

/// The keys of `map`, in ascending order (for the walks whose order is observable).
pub fn sorted_keys<K: Ord + Copy, V>(map: &IdMap<K, V>) -> Vec<K> {
    let mut keys: Vec<K> = map.keys().copied().collect();
    keys.sort_unstable();
    keys
}

/// Fibonacci hashing of a u64: consecutive IDs land far apart in the high bits (the table's
/// control tags) and stay a permutation in the low bits (its bucket index).
#[derive(Default)]
pub struct IdHasher(u64);

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(GOLDEN);
    }
    // Other integers (a page's group and index, its content hash) mix in the same way,
    // one multiply per word, not one per byte.
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u128(&mut self, v: u128) {
        self.write_u64(v as u64);
        self.write_u64((v >> 64) as u64);
    }
}

/// Builds `IdHasher`s (fixed: the same on every rank and run).
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildIdHasher;

impl BuildHasher for BuildIdHasher {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::{OperationId, RequestId};
    use std::collections::BTreeSet;
    use std::hash::Hash;

    fn hash_of<K: Hash>(k: &K) -> u64 {
        BuildIdHasher.hash_one(k)
    }

    #[test]
    fn sequential_ids_spread_over_the_control_tags_and_the_buckets() {
        // hashbrown takes its 7-bit tag from the top bits and the bucket from the low ones:
        // 1024 consecutive IDs must use many tags and distinct low 10 bits.
        let hashes: Vec<u64> = (1..=1024).map(|i| hash_of(&OperationId(i))).collect();
        let tags: BTreeSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        let buckets: BTreeSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        assert!(tags.len() >= 100, "{} tags", tags.len());
        assert_eq!(buckets.len(), 1024);
        assert_ne!(hash_of(&OperationId(7)), hash_of(&RequestId(8)));
    }

    #[test]
    fn sorted_keys_walk_in_id_order_whatever_the_insertion_order() {
        let mut m = id_map();
        for i in [9u64, 2, 700, 5, 1, 64] {
            m.insert(RequestId(i), i);
        }
        m.remove(&RequestId(5));
        let keys: Vec<u64> = sorted_keys(&m).into_iter().map(|r| r.0).collect();
        assert_eq!(keys, vec![1, 2, 9, 64, 700]);
        assert_eq!(m[&RequestId(700)], 700);
    }
}
