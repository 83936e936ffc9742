//! Negative metadata: a bounded FIFO of objects confirmed missing or invalid by an agreed
//! GET (StorageDone.failures). Rejections (health, queue, shutdown), queued cancellation,
//! backend exceptions and QUERY misses carry no object evidence and never enter it. The
//! FIFO only ages entries out; it never re-probes or repairs objects.

use messages::StorageKey;
use std::collections::{HashSet, VecDeque};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegativeMetadata {
    capacity: usize,
    fifo: VecDeque<StorageKey>,
    present: HashSet<StorageKey>,
}

impl NegativeMetadata {
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity.max(1) as usize,
            fifo: VecDeque::new(),
            present: HashSet::new(),
        }
    }

    /// Record confirmed evidence. Returns true when the key is new; the oldest entry leaves
    /// when the FIFO is full. A key already present keeps its place.
    pub fn record(&mut self, key: &StorageKey) -> bool {
        if self.present.contains(key) {
            return false;
        }
        if self.fifo.len() >= self.capacity {
            if let Some(old) = self.fifo.pop_front() {
                self.present.remove(&old);
            }
        }
        self.fifo.push_back(key.clone());
        self.present.insert(key.clone());
        true
    }

    pub fn contains(&self, key: &StorageKey) -> bool {
        self.present.contains(key)
    }
    pub fn len(&self) -> usize {
        self.fifo.len()
    }
    pub fn is_empty(&self) -> bool {
        self.fifo.is_empty()
    }
    pub fn clear(&mut self) {
        self.fifo.clear();
        self.present.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> StorageKey {
        StorageKey::new(s)
    }

    #[test]
    fn bounded_fifo_ages_out_oldest() {
        let mut n = NegativeMetadata::new(2);
        assert!(n.record(&k("a")));
        assert!(!n.record(&k("a")));
        assert!(n.record(&k("b")));
        assert!(n.record(&k("c")));
        assert!(!n.contains(&k("a")));
        assert!(n.contains(&k("b")) && n.contains(&k("c")));
        assert_eq!(n.len(), 2);
    }

    proptest::proptest! {
        /// The FIFO against a list of its keys, oldest first: a new key goes at the back
        /// (the oldest leaves a full list), a present one keeps its place, a clear empties.
        #[test]
        fn the_negative_fifo_keeps_every_promise_of_its_model(
            capacity in 0u32..4,
            steps in proptest::collection::vec(proptest::option::of(0u8..6), 1..40),
        ) {
            let mut n = NegativeMetadata::new(capacity);
            let mut model: VecDeque<u8> = VecDeque::new();
            let cap = capacity.max(1) as usize;
            for st in steps {
                match st {
                    Some(x) => {
                        let new = !model.contains(&x);
                        if new {
                            if model.len() >= cap {
                                model.pop_front();
                            }
                            model.push_back(x);
                        }
                        proptest::prop_assert_eq!(n.record(&k(&x.to_string())), new);
                    }
                    None => {
                        n.clear();
                        model.clear();
                    }
                }
                proptest::prop_assert_eq!(n.len(), model.len());
                proptest::prop_assert_eq!(n.is_empty(), model.is_empty());
                for x in 0u8..6 {
                    proptest::prop_assert_eq!(n.contains(&k(&x.to_string())), model.contains(&x));
                }
            }
        }
    }
}
