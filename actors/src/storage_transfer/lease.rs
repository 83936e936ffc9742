//! StorageLease and the read wait it names. The request state that waits on a QUERY or GET
//! (Prefetching) and the Ready hold after it own one StorageLease; the Host references stay
//! with the StorageTransferManager's tickets. Ending the state hands the lease back
//! (`StorageTransferManager::detach`), which detaches the request from its ticket: a
//! detached ticket's completion can never publish. The lease is a plain, non-Clone token:
//! it has no Drop side effects, and a lease whose wait already ended (soft timeout,
//! pressure, cancellation, clear) is stale and detaching it does nothing.

use messages::{OperationId, RequestId};

/// The request's claim on its storage wait. Not Clone: exactly one owner.
#[must_use = "a StorageLease must be handed back with StorageTransferManager::detach"]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct StorageLease {
    pub(crate) request: RequestId,
    pub(crate) serial: u64,
}

impl StorageLease {
    pub fn request(&self) -> RequestId {
        self.request
    }
}

/// Where a read wait stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitPhase {
    /// Waiting on an issued QUERY.
    Query(OperationId),
    /// QUERY answered; the scheduler may issue a GET (the soft deadline keeps running).
    QueryDone,
    /// Waiting on an issued GET.
    Get(OperationId),
    /// The GET published rows; the Ready hold protects them until admission or expiry.
    Ready { op: OperationId, expires_us: u64 },
}

/// Why a wait ended (reported in `RoundEffects::waits_ended`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitEnd {
    /// The operation completed (a GET may have left a Ready hold; see `publish`).
    Completed,
    /// The soft deadline passed: local admission continues; native I/O is untouched.
    SoftTimeout,
    /// The pressure gate closed while the request was in QUERY.
    Pressure,
    /// Cancellation, a clear, or quarantine of the replica detached the request.
    Detached,
}

/// One request's wait record inside the manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub serial: u64,
    pub phase: WaitPhase,
    /// Soft deadline (from QUERY issue, queue wait included).
    pub deadline_us: u64,
}

impl Wait {
    /// The ticket this wait is attached to, if any.
    pub fn ticket(&self) -> Option<OperationId> {
        match self.phase {
            WaitPhase::Query(op) | WaitPhase::Get(op) => Some(op),
            WaitPhase::Ready { op, .. } => Some(op),
            WaitPhase::QueryDone => None,
        }
    }
    /// Still waiting (not yet a Ready hold).
    pub fn is_waiting(&self) -> bool {
        !matches!(self.phase, WaitPhase::Ready { .. })
    }
}
