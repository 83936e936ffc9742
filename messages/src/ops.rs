//! Storage commands (the storage subset of plan.cache) and their completion fact,
//! StorageDone. The read-only kind of each command is fixed by its type. Validation here
//! is the one rule set that every owner applies to its local records before the relay
//! exchange and that agreement applies to every peer's records.

use crate::ids::{OperationId, RequestId};
pub use crate::storage_key::StorageKey;
use serde::{Deserialize, Serialize};

/// A byte range of the shared Host allocation (HostCacheStorage), addressed by offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostRange {
    pub offset: u64,
    pub len: u64,
}

impl HostRange {
    pub fn new(offset: u64, len: u64) -> Self {
        Self { offset, len }
    }
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
    pub fn overlaps(&self, other: &HostRange) -> bool {
        self.offset < other.end() && other.offset < self.end()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum StorageOpKind {
    Query,
    Get,
    Put,
}

impl StorageOpKind {
    pub const ALL: [StorageOpKind; 3] =
        [StorageOpKind::Query, StorageOpKind::Get, StorageOpKind::Put];
    pub fn as_str(&self) -> &'static str {
        match self {
            StorageOpKind::Query => "query",
            StorageOpKind::Get => "get",
            StorageOpKind::Put => "put",
        }
    }
    pub fn index(&self) -> usize {
        *self as usize
    }
}

/// QUERY: existence of immutable keys. Reserves no Device pages or batch slots and
/// touches no Host payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageQueryOp {
    pub op: OperationId,
    pub request: Option<RequestId>,
    pub keys: Vec<StorageKey>,
}

/// GET: fixed backend keys into fixed Host destinations (offset, length per key).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageGetOp {
    pub op: OperationId,
    pub request: Option<RequestId>,
    pub keys: Vec<StorageKey>,
    pub destinations: Vec<HostRange>,
}

/// PUT: create-only writes of fixed keys from fixed Host sources.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoragePutOp {
    pub op: OperationId,
    pub keys: Vec<StorageKey>,
    pub sources: Vec<HostRange>,
}

/// CANCEL names an existing operation; it creates no ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageCancelOp {
    pub op: OperationId,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StorageOp {
    Query(StorageQueryOp),
    Get(StorageGetOp),
    Put(StoragePutOp),
    Cancel(StorageCancelOp),
}

impl StorageOp {
    pub fn id(&self) -> OperationId {
        match self {
            StorageOp::Query(q) => q.op,
            StorageOp::Get(g) => g.op,
            StorageOp::Put(p) => p.op,
            StorageOp::Cancel(c) => c.op,
        }
    }
    /// The request a read serves (None for PUT and CANCEL).
    pub fn request(&self) -> Option<RequestId> {
        match self {
            StorageOp::Query(q) => q.request,
            StorageOp::Get(g) => g.request,
            StorageOp::Put(_) | StorageOp::Cancel(_) => None,
        }
    }
    /// The kind of job this command creates; None for Cancel (no ticket).
    pub fn kind(&self) -> Option<StorageOpKind> {
        match self {
            StorageOp::Query(_) => Some(StorageOpKind::Query),
            StorageOp::Get(_) => Some(StorageOpKind::Get),
            StorageOp::Put(_) => Some(StorageOpKind::Put),
            StorageOp::Cancel(_) => None,
        }
    }
    pub fn keys(&self) -> &[StorageKey] {
        match self {
            StorageOp::Query(q) => &q.keys,
            StorageOp::Get(g) => &g.keys,
            StorageOp::Put(p) => &p.keys,
            StorageOp::Cancel(_) => &[],
        }
    }
    /// Payload bytes the job moves (0 for QUERY and Cancel).
    pub fn payload_bytes(&self) -> u64 {
        match self {
            StorageOp::Get(g) => g.destinations.iter().map(|r| r.len).sum(),
            StorageOp::Put(p) => p.sources.iter().map(|r| r.len).sum(),
            _ => 0,
        }
    }
    /// Structural validity: ranges match keys one to one and are non-empty.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let (keys, ranges) = match self {
            StorageOp::Get(g) => (g.keys.len(), g.destinations.as_slice()),
            StorageOp::Put(p) => (p.keys.len(), p.sources.as_slice()),
            _ => return Ok(()),
        };
        if keys != ranges.len() {
            return Err(ProtocolError::new(
                self.id(),
                format!("{} keys but {} Host ranges", keys, ranges.len()),
            ));
        }
        if ranges.iter().any(|r| r.len == 0) {
            return Err(ProtocolError::new(self.id(), "empty Host range"));
        }
        Ok(())
    }
}

/// A confirmed object-level failure of a GET: the only evidence that may enter negative
/// metadata. QUERY and PUT can never report one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ObjectFailure {
    /// The backend proved the object absent (e.g. Mooncake -704) before any transfer.
    Missing,
    /// The object exists but is not the expected object (short read, checksum, size).
    Invalid,
}

/// Why an operation did not run. A rejection carries no object evidence and is retired
/// (no Host buffer was handed to the store).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rejection {
    /// The health monitor is cooling down after an outage.
    Unhealthy,
    /// The kind's bounded queue is full.
    QueueFull,
    /// The total outstanding-operation limit is reached.
    OutstandingLimit,
    /// The executor is closing or closed.
    Shutdown,
    /// Cancelled while still queued: the item became inert and never ran.
    Cancelled,
    /// The executor quarantined a job and rejects all further submissions.
    Quarantined,
    /// The command failed structural validation.
    Invalid,
}

impl Rejection {
    pub fn as_str(&self) -> &'static str {
        match self {
            Rejection::Unhealthy => "unhealthy",
            Rejection::QueueFull => "queue_full",
            Rejection::OutstandingLimit => "outstanding_limit",
            Rejection::Shutdown => "shutdown",
            Rejection::Cancelled => "cancelled",
            Rejection::Quarantined => "quarantined",
            Rejection::Invalid => "invalid",
        }
    }
}

/// The completion fact of one operation on one owner.
///
/// Per-key masks (all of equal length, one entry per key of the operation):
/// - `success`: QUERY: the object exists; GET: exactly the expected bytes landed in the
///   destination; PUT: the object exists after the create-only write (an idempotent
///   OBJECT_ALREADY_EXISTS is success). A row this owner does not own (page-cyclic groups)
///   reports success with 0 bytes and no failure.
/// - `bytes`: bytes transferred for this key (0 for QUERY).
/// - `failures`: confirmed object failures (GET only).
/// - `capacity`: PUT only: a retired capacity rejection (Mooncake -200); the page stays
///   unacknowledged for the scheduler to re-offer.
///
/// `retired` is operation-wide: the store has provably stopped touching every Host buffer
/// of the operation. An unretired result quarantines every reference of the job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "WireDone", try_from = "WireDone")]
pub struct StorageDone {
    pub op: OperationId,
    pub kind: StorageOpKind,
    pub success: Vec<bool>,
    pub bytes: Vec<u64>,
    pub failures: Vec<Option<ObjectFailure>>,
    pub capacity: Vec<bool>,
    pub retired: bool,
    /// Set when the operation never ran; it then carries no evidence.
    pub rejection: Option<Rejection>,
    /// A backend exception or malformed result (retirement then follows the store's
    /// `failures_retire()` contract and is reflected in `retired`).
    pub error: Option<String>,
    /// Count of PUT rows that were new native writes (as opposed to idempotent hits).
    pub new_writes: u32,
}

/// The compact wire form of a [`StorageDone`] (format version 2): a positional tuple, the
/// operation kind and rejection as small integers, and the per-key masks as bitsets of 64
/// keys per word (missing and invalid as two masks), so a record costs a few words however
/// many keys it has and decodes without a field name or a per-key map.
#[derive(Serialize, Deserialize)]
pub(crate) struct WireDone(
    pub(crate) OperationId,
    pub(crate) u8,
    pub(crate) u32,
    pub(crate) Vec<u64>,
    pub(crate) Vec<u64>,
    pub(crate) Vec<u64>,
    pub(crate) Vec<u64>,
    pub(crate) Vec<u64>,
    pub(crate) bool,
    pub(crate) Option<u8>,
    pub(crate) Option<String>,
    pub(crate) u32,
);

pub(crate) const REJECTIONS: [Rejection; 7] = [
    Rejection::Unhealthy,
    Rejection::QueueFull,
    Rejection::OutstandingLimit,
    Rejection::Shutdown,
    Rejection::Cancelled,
    Rejection::Quarantined,
    Rejection::Invalid,
];

fn pack(n: usize, bit: impl Fn(usize) -> bool) -> Vec<u64> {
    let mut words = vec![0u64; n.div_ceil(64)];
    for (i, w) in words.iter_mut().enumerate() {
        for b in 0..64.min(n - i * 64) {
            if bit(i * 64 + b) {
                *w |= 1 << b;
            }
        }
    }
    words
}

fn bit(words: &[u64], i: usize) -> bool {
    words[i / 64] >> (i % 64) & 1 == 1
}

impl From<StorageDone> for WireDone {
    fn from(d: StorageDone) -> Self {
        let n = d.success.len();
        let failures = &d.failures;
        let failure = |f: ObjectFailure| pack(n, |i| failures.get(i) == Some(&Some(f)));
        WireDone(
            d.op,
            d.kind.index() as u8,
            n as u32,
            pack(n, |i| d.success[i]),
            d.bytes,
            failure(ObjectFailure::Missing),
            failure(ObjectFailure::Invalid),
            pack(n, |i| d.capacity.get(i) == Some(&true)),
            d.retired,
            d.rejection
                .map(|r| REJECTIONS.iter().position(|x| *x == r).unwrap_or(0) as u8),
            d.error,
            d.new_writes,
        )
    }
}

impl TryFrom<WireDone> for StorageDone {
    type Error = String;
    fn try_from(w: WireDone) -> Result<Self, String> {
        let WireDone(
            op,
            kind,
            n,
            success,
            bytes,
            missing,
            invalid,
            capacity,
            retired,
            rej,
            error,
            new_writes,
        ) = w;
        let n = n as usize;
        let words = n.div_ceil(64);
        if [&success, &missing, &invalid, &capacity]
            .iter()
            .any(|m| m.len() != words)
            || bytes.len() != n
        {
            return Err(format!("{op}: masks or byte counts do not match {n} keys"));
        }
        let kind = *StorageOpKind::ALL
            .get(kind as usize)
            .ok_or_else(|| format!("{op}: unknown operation kind {kind}"))?;
        let rejection = match rej {
            None => None,
            Some(r) => Some(
                *REJECTIONS
                    .get(r as usize)
                    .ok_or_else(|| format!("{op}: unknown rejection {r}"))?,
            ),
        };
        let mut failures = Vec::with_capacity(n);
        for i in 0..n {
            failures.push(match (bit(&missing, i), bit(&invalid, i)) {
                (false, false) => None,
                (true, false) => Some(ObjectFailure::Missing),
                (false, true) => Some(ObjectFailure::Invalid),
                (true, true) => return Err(format!("{op}: key {i} is both missing and invalid")),
            });
        }
        Ok(StorageDone {
            op,
            kind,
            success: (0..n).map(|i| bit(&success, i)).collect(),
            bytes,
            failures,
            capacity: (0..n).map(|i| bit(&capacity, i)).collect(),
            retired,
            rejection,
            error,
            new_writes,
        })
    }
}

impl StorageDone {
    fn blank(op: OperationId, kind: StorageOpKind, n: usize, retired: bool) -> Self {
        Self {
            op,
            kind,
            success: vec![false; n],
            bytes: vec![0; n],
            failures: vec![None; n],
            capacity: vec![false; n],
            retired,
            rejection: None,
            error: None,
            new_writes: 0,
        }
    }

    pub fn query(op: OperationId, exists: Vec<bool>, retired: bool) -> Self {
        let mut d = Self::blank(op, StorageOpKind::Query, exists.len(), retired);
        d.success = exists;
        d
    }

    pub fn get(
        op: OperationId,
        success: Vec<bool>,
        bytes: Vec<u64>,
        failures: Vec<Option<ObjectFailure>>,
        retired: bool,
    ) -> Self {
        let mut d = Self::blank(op, StorageOpKind::Get, success.len(), retired);
        d.success = success;
        d.bytes = bytes;
        d.failures = failures;
        d
    }

    pub fn put(
        op: OperationId,
        success: Vec<bool>,
        bytes: Vec<u64>,
        capacity: Vec<bool>,
        retired: bool,
    ) -> Self {
        let mut d = Self::blank(op, StorageOpKind::Put, success.len(), retired);
        d.success = success;
        d.bytes = bytes;
        d.capacity = capacity;
        d
    }

    /// An operation that never ran: no evidence, retired.
    pub fn rejected(op: OperationId, kind: StorageOpKind, n: usize, why: Rejection) -> Self {
        let mut d = Self::blank(op, kind, n, true);
        d.rejection = Some(why);
        d
    }

    /// A failed backend call: no per-key evidence; retirement as the store guarantees.
    pub fn failed(
        op: OperationId,
        kind: StorageOpKind,
        n: usize,
        retired: bool,
        error: impl Into<String>,
    ) -> Self {
        let mut d = Self::blank(op, kind, n, retired);
        d.error = Some(error.into());
        d
    }

    pub fn len(&self) -> usize {
        self.success.len()
    }

    pub fn is_empty(&self) -> bool {
        self.success.is_empty()
    }

    /// Every key succeeded and the operation retired.
    pub fn fully_succeeded(&self) -> bool {
        self.retired
            && self.rejection.is_none()
            && self.error.is_none()
            && self.success.iter().all(|s| *s)
    }

    /// The validation every owner applies to a record before it is exchanged or agreed.
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let n = self.success.len();
        let err = |m: String| Err(ProtocolError::new(self.op, m));
        if self.bytes.len() != n || self.failures.len() != n || self.capacity.len() != n {
            return err(format!(
                "per-key masks differ in length: success {}, bytes {}, failures {}, capacity {}",
                n,
                self.bytes.len(),
                self.failures.len(),
                self.capacity.len()
            ));
        }
        // The first key reporting success beside a failure or a capacity rejection, found
        // without a branch per key (a QUERY's answers alternate unpredictably).
        let contradictory = self
            .success
            .iter()
            .zip(&self.failures)
            .zip(&self.capacity)
            .position(|((s, f), c)| *s & (f.is_some() | *c));
        if let Some(i) = contradictory {
            return err(if self.failures[i].is_some() {
                format!("key {i} reports success and an object failure")
            } else {
                format!("key {i} reports success and a capacity rejection")
            });
        }
        if self.kind != StorageOpKind::Get && self.failures.iter().any(|f| f.is_some()) {
            return err(format!(
                "{} cannot report read failures",
                self.kind.as_str()
            ));
        }
        if self.kind != StorageOpKind::Put && self.capacity.iter().any(|c| *c) {
            return err(format!(
                "{} cannot report capacity rejections",
                self.kind.as_str()
            ));
        }
        if self.kind == StorageOpKind::Query && self.bytes.iter().any(|b| *b != 0) {
            return err("query cannot report transferred bytes".into());
        }
        if self.kind != StorageOpKind::Put && self.new_writes != 0 {
            return err("only put reports new writes".into());
        }
        if self.new_writes as usize > n {
            return err("more new writes than keys".into());
        }
        if self.rejection.is_some() {
            if !self.retired {
                return err("a rejected operation is always retired".into());
            }
            if self.success.iter().any(|s| *s) || self.failures.iter().any(|f| f.is_some()) {
                return err("a rejected operation carries no per-key facts".into());
            }
        }
        Ok(())
    }
}

/// A protocol error: a record or frame that violates the contract. Every owner raises the
/// same error when one owner's report is invalid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("protocol error on {op}: {message}")]
pub struct ProtocolError {
    pub op: OperationId,
    pub message: String,
}

impl ProtocolError {
    pub fn new(op: OperationId, message: impl Into<String>) -> Self {
        Self {
            op,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op() -> OperationId {
        OperationId(3)
    }

    #[test]
    fn valid_records_pass() {
        StorageDone::query(op(), vec![true, false], true)
            .validate()
            .unwrap();
        StorageDone::get(
            op(),
            vec![true, false],
            vec![10, 0],
            vec![None, Some(ObjectFailure::Missing)],
            true,
        )
        .validate()
        .unwrap();
        StorageDone::put(
            op(),
            vec![true, false],
            vec![10, 0],
            vec![false, true],
            true,
        )
        .validate()
        .unwrap();
        StorageDone::rejected(op(), StorageOpKind::Get, 4, Rejection::Unhealthy)
            .validate()
            .unwrap();
    }

    #[test]
    fn unequal_masks_are_rejected() {
        let d = StorageDone::get(op(), vec![true, true], vec![1, 1], vec![None, None], true);
        // Each of the other masks one entry short, alone.
        let cuts: [&dyn Fn(&mut StorageDone); 3] = [
            &|d| d.bytes.truncate(1),
            &|d| d.failures.truncate(1),
            &|d| d.capacity.truncate(1),
        ];
        for (i, cut) in cuts.iter().enumerate() {
            let mut bad = d.clone();
            cut(&mut bad);
            let e = bad.validate().unwrap_err();
            assert!(e.message.contains("differ in length"), "case {i}: {e}");
        }
    }

    /// Fully succeeded: retired, neither rejected nor failed as a whole, every key a success.
    #[test]
    fn fully_succeeded_needs_every_key_retirement_and_no_error() {
        let ok = StorageDone::get(op(), vec![true, true], vec![1, 1], vec![None, None], true);
        assert!(ok.fully_succeeded());
        assert!(!ok.is_empty());
        let spoiled: [&dyn Fn(&mut StorageDone); 4] = [
            &|d| d.retired = false,
            &|d| d.rejection = Some(Rejection::QueueFull),
            &|d| d.error = Some("backend exception".into()),
            &|d| d.success[1] = false,
        ];
        for (i, spoil) in spoiled.iter().enumerate() {
            let mut d = ok.clone();
            spoil(&mut d);
            assert!(!d.fully_succeeded(), "case {i}: {d:?}");
        }
        assert!(StorageDone::query(op(), vec![], true).is_empty());
    }

    #[test]
    fn success_cannot_be_a_failure() {
        let d = StorageDone::get(
            op(),
            vec![true],
            vec![1],
            vec![Some(ObjectFailure::Invalid)],
            true,
        );
        assert!(d
            .validate()
            .unwrap_err()
            .message
            .contains("success and an object failure"));
    }

    #[test]
    fn query_and_put_cannot_report_read_failures() {
        let mut q = StorageDone::query(op(), vec![false], true);
        q.failures[0] = Some(ObjectFailure::Missing);
        assert!(q
            .validate()
            .unwrap_err()
            .message
            .contains("query cannot report read failures"));
        let mut p = StorageDone::put(op(), vec![false], vec![0], vec![false], true);
        p.failures[0] = Some(ObjectFailure::Invalid);
        assert!(p
            .validate()
            .unwrap_err()
            .message
            .contains("put cannot report read failures"));
    }

    #[test]
    fn capacity_only_on_put_and_rejections_carry_no_evidence() {
        let mut g = StorageDone::get(op(), vec![false], vec![0], vec![None], true);
        g.capacity[0] = true;
        assert!(g.validate().is_err());
        let mut r = StorageDone::rejected(op(), StorageOpKind::Query, 1, Rejection::QueueFull);
        r.success[0] = true;
        assert!(r.validate().is_err());
        let mut r2 = StorageDone::rejected(op(), StorageOpKind::Query, 1, Rejection::QueueFull);
        r2.retired = false;
        assert!(r2.validate().is_err());
    }

    #[test]
    fn cancel_creates_no_kind_and_ranges_must_match_keys() {
        let c = StorageOp::Cancel(StorageCancelOp { op: op() });
        assert_eq!(c.kind(), None);
        let g = StorageOp::Get(StorageGetOp {
            op: op(),
            request: None,
            keys: vec![StorageKey::new("k")],
            destinations: vec![],
        });
        assert!(g.validate().is_err());
    }

    #[test]
    fn host_ranges_overlap() {
        assert!(HostRange::new(0, 10).overlaps(&HostRange::new(9, 1)));
        assert!(!HostRange::new(0, 10).overlaps(&HostRange::new(10, 1)));
        // Adjacent either way round: no overlap.
        assert!(!HostRange::new(10, 1).overlaps(&HostRange::new(0, 10)));
        assert!(HostRange::new(9, 1).overlaps(&HostRange::new(0, 10)));
    }

    /// What the executor reads of each command: its request, kind, keys and payload, and
    /// the structural check for every kind.
    #[test]
    fn each_command_names_its_request_kind_keys_and_payload() {
        let keys = vec![StorageKey::new("a"), StorageKey::new("b")];
        let ranges = vec![HostRange::new(0, 4096), HostRange::new(8192, 100)];
        let query = StorageOp::Query(StorageQueryOp {
            op: op(),
            request: Some(RequestId(5)),
            keys: keys.clone(),
        });
        let get = StorageOp::Get(StorageGetOp {
            op: op(),
            request: Some(RequestId(6)),
            keys: keys.clone(),
            destinations: ranges.clone(),
        });
        let put = StorageOp::Put(StoragePutOp {
            op: op(),
            keys: keys.clone(),
            sources: ranges.clone(),
        });
        let cancel = StorageOp::Cancel(StorageCancelOp { op: op() });
        let seen: Vec<_> = [&query, &get, &put, &cancel]
            .iter()
            .map(|o| (o.request(), o.kind(), o.keys().len(), o.payload_bytes()))
            .collect();
        assert_eq!(
            seen,
            vec![
                (Some(RequestId(5)), Some(StorageOpKind::Query), 2, 0),
                (Some(RequestId(6)), Some(StorageOpKind::Get), 2, 4196),
                (None, Some(StorageOpKind::Put), 2, 4196),
                (None, None, 0, 0),
            ]
        );
        assert_eq!(get.keys(), &keys[..]);
        for o in [&query, &get, &put, &cancel] {
            assert_eq!(o.validate(), Ok(()), "{o:?}");
        }
        // A PUT is checked like a GET: one non-empty range per key.
        let short = StorageOp::Put(StoragePutOp {
            op: op(),
            keys: keys.clone(),
            sources: ranges[..1].to_vec(),
        });
        assert!(short
            .validate()
            .unwrap_err()
            .message
            .contains("2 keys but 1 Host ranges"));
        let empty = StorageOp::Put(StoragePutOp {
            op: op(),
            keys,
            sources: vec![HostRange::new(0, 4096), HostRange::new(4096, 0)],
        });
        assert!(empty
            .validate()
            .unwrap_err()
            .message
            .contains("empty Host range"));
    }

    #[test]
    fn rejections_have_distinct_names() {
        let names: Vec<&str> = super::REJECTIONS.iter().map(|r| r.as_str()).collect();
        let mut distinct = names.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), names.len(), "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase() || c == '_')),
            "{names:?}"
        );
        assert_eq!(Rejection::QueueFull.as_str(), "queue_full");
    }
}
