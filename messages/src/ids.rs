//! Identifiers. An OperationId is monotonic for the life of a StorageTransferManager, is
//! never reused and is never derived from a request slot.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The identity of one storage operation (one ticket). Monotonic, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct OperationId(pub u64);

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}

/// The identity of a client request, assigned by the frontend of the leader rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req{}", self.0)
    }
}

/// Hands out operation IDs: strictly increasing, starting at 1, never reused. It is owned
/// by the StorageTransferManager; since every rank runs the same decisions on the same
/// agreed inputs, every rank hands out the same IDs in the same order.
#[derive(Debug, Default)]
pub struct OperationIdAllocator {
    last: u64,
}

impl OperationIdAllocator {
    pub fn new() -> Self {
        Self { last: 0 }
    }

    /// The next ID. Panics only on u64 exhaustion (2^64 operations), which no process reaches.
    pub fn next_id(&mut self) -> OperationId {
        self.last = self
            .last
            .checked_add(1)
            .expect("operation id space exhausted");
        OperationId(self.last)
    }

    /// The last ID handed out (0 when none).
    pub fn last(&self) -> u64 {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_strictly_increase_and_never_repeat() {
        let mut a = OperationIdAllocator::new();
        let mut seen = std::collections::HashSet::new();
        let mut prev = 0;
        for _ in 0..10_000 {
            let id = a.next_id();
            assert!(id.0 > prev);
            assert!(seen.insert(id));
            prev = id.0;
        }
        assert_eq!(a.last(), 10_000);
    }
}
