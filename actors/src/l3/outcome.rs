//! Turns a store's per-key results into StorageDone facts (seed 000, "Retirement and
//! maintenance") and classifies each result for the health monitor. Pure: it never calls
//! the store, never touches Host memory and never decides negative-cache policy.
//!
//! Rules: GET success is exactly the expected bytes; a short read is a retired Invalid
//! object failure; Missing and Invalid are retired object failures. PUT AlreadyExists is
//! idempotent success (not a new write); PUT Capacity is a retired per-key rejection.
//! `Failed { retired: false }` makes the operation unretired. An exception or a malformed
//! result (wrong length, a result impossible for the kind) retires as the store declares
//! in `failures_retire()`. QUERY touches no payload, so a failed QUERY is always retired.

use super::store::{KeyResult, StoreError};
use messages::{ObjectFailure, OperationId, StorageDone, StorageOpKind};

/// A settled operation: its fact and whether it indicates a backend outage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    pub done: StorageDone,
    pub outage: bool,
}

impl Settled {
    fn failed(op: OperationId, kind: StorageOpKind, n: usize, retired: bool, e: String) -> Self {
        Self {
            done: StorageDone::failed(op, kind, n, retired, e),
            outage: true,
        }
    }
}

pub(crate) fn settle_query(
    op: OperationId,
    n: usize,
    result: Result<Vec<bool>, StoreError>,
) -> Settled {
    match result {
        Ok(exists) if exists.len() == n => Settled {
            done: StorageDone::query(op, exists, true),
            outage: false,
        },
        Ok(exists) => Settled::failed(
            op,
            StorageOpKind::Query,
            n,
            true,
            format!(
                "malformed query result: {} entries for {n} keys",
                exists.len()
            ),
        ),
        Err(e) => Settled::failed(op, StorageOpKind::Query, n, true, e.to_string()),
    }
}

fn malformed(len: usize, n: usize) -> String {
    format!("malformed result: {len} entries for {n} keys")
}

/// One result per key, or why the call failed (an exception or a malformed result; its
/// retirement then follows `failures_retire`).
fn per_key(n: usize, result: Result<Vec<KeyResult>, StoreError>) -> Result<Vec<KeyResult>, String> {
    match result {
        Err(e) => Err(e.to_string()),
        Ok(r) if r.len() != n => Err(malformed(r.len(), n)),
        Ok(r) => Ok(r),
    }
}

/// `expected[i]` is the destination length of key i.
pub(crate) fn settle_get(
    op: OperationId,
    expected: &[u64],
    result: Result<Vec<KeyResult>, StoreError>,
    failures_retire: bool,
) -> Settled {
    let kind = StorageOpKind::Get;
    let n = expected.len();
    let results = match per_key(n, result) {
        Ok(r) => r,
        Err(why) => return Settled::failed(op, kind, n, failures_retire, why),
    };
    let mut done = StorageDone::get(op, vec![false; n], vec![0; n], vec![None; n], true);
    let mut outage = false;
    let mut errors = vec![];
    for (i, (r, want)) in results.iter().zip(expected).enumerate() {
        match *r {
            KeyResult::Ok { bytes } if bytes == *want => {
                done.success[i] = true;
                done.bytes[i] = bytes;
            }
            KeyResult::Ok { bytes } | KeyResult::ShortRead { bytes } if bytes < *want => {
                done.bytes[i] = bytes;
                done.failures[i] = Some(ObjectFailure::Invalid);
            }
            KeyResult::ShortRead { .. } | KeyResult::Invalid => {
                done.failures[i] = Some(ObjectFailure::Invalid);
            }
            KeyResult::Missing => done.failures[i] = Some(ObjectFailure::Missing),
            KeyResult::Failed { code, retired } => {
                outage = true;
                done.retired &= retired;
                errors.push(format!("key {i}: native failure {code}"));
            }
            KeyResult::Ok { .. } | KeyResult::AlreadyExists | KeyResult::Capacity => {
                return Settled::failed(
                    op,
                    kind,
                    n,
                    failures_retire,
                    format!("malformed get result at key {i}: {r:?}"),
                );
            }
        }
    }
    if !errors.is_empty() {
        done.error = Some(errors.join("; "));
    }
    Settled { done, outage }
}

/// `expected[i]` is the source length of key i.
pub(crate) fn settle_put(
    op: OperationId,
    expected: &[u64],
    result: Result<Vec<KeyResult>, StoreError>,
    failures_retire: bool,
) -> Settled {
    let kind = StorageOpKind::Put;
    let n = expected.len();
    let results = match per_key(n, result) {
        Ok(r) => r,
        Err(why) => return Settled::failed(op, kind, n, failures_retire, why),
    };
    let mut done = StorageDone::put(op, vec![false; n], vec![0; n], vec![false; n], true);
    let mut outage = false;
    let mut errors = vec![];
    for (i, (r, want)) in results.iter().zip(expected).enumerate() {
        match *r {
            KeyResult::Ok { bytes } if bytes == *want => {
                done.success[i] = true;
                done.bytes[i] = bytes;
                done.new_writes += 1;
            }
            KeyResult::AlreadyExists => {
                done.success[i] = true;
                done.bytes[i] = *want;
            }
            KeyResult::Capacity => done.capacity[i] = true,
            KeyResult::Failed { code, retired } => {
                outage = true;
                done.retired &= retired;
                errors.push(format!("key {i}: native failure {code}"));
            }
            KeyResult::Ok { .. }
            | KeyResult::Missing
            | KeyResult::ShortRead { .. }
            | KeyResult::Invalid => {
                return Settled::failed(
                    op,
                    kind,
                    n,
                    failures_retire,
                    format!("malformed put result at key {i}: {r:?}"),
                );
            }
        }
    }
    if !errors.is_empty() {
        done.error = Some(errors.join("; "));
    }
    Settled { done, outage }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OP: OperationId = OperationId(9);

    #[test]
    fn get_results_map_to_facts_and_misses_are_not_outages() {
        let s = settle_get(
            OP,
            &[4, 4, 4, 4],
            Ok(vec![
                KeyResult::Ok { bytes: 4 },
                KeyResult::Missing,
                KeyResult::ShortRead { bytes: 2 },
                KeyResult::Invalid,
            ]),
            false,
        );
        assert!(!s.outage);
        let d = &s.done;
        d.validate().unwrap();
        assert!(d.retired);
        assert_eq!(d.success, vec![true, false, false, false]);
        assert_eq!(d.bytes, vec![4, 0, 2, 0]);
        assert_eq!(
            d.failures,
            vec![
                None,
                Some(ObjectFailure::Missing),
                Some(ObjectFailure::Invalid),
                Some(ObjectFailure::Invalid)
            ]
        );
    }

    #[test]
    fn unretired_key_makes_the_operation_unretired_and_is_an_outage() {
        let s = settle_get(
            OP,
            &[4, 4],
            Ok(vec![
                KeyResult::Ok { bytes: 4 },
                KeyResult::Failed {
                    code: -1,
                    retired: false,
                },
            ]),
            true,
        );
        assert!(s.outage);
        assert!(!s.done.retired);
        assert_eq!(s.done.failures, vec![None, None], "no object evidence");
        s.done.validate().unwrap();
    }

    #[test]
    fn put_capacity_and_already_exists_are_not_outages() {
        let s = settle_put(
            OP,
            &[3, 3, 3],
            Ok(vec![
                KeyResult::Ok { bytes: 3 },
                KeyResult::AlreadyExists,
                KeyResult::Capacity,
            ]),
            false,
        );
        assert!(!s.outage);
        assert!(s.done.retired);
        assert_eq!(s.done.success, vec![true, true, false]);
        assert_eq!(s.done.capacity, vec![false, false, true]);
        assert_eq!(s.done.new_writes, 1);
        assert_eq!(s.done.bytes, vec![3, 3, 0]);
        s.done.validate().unwrap();
    }

    #[test]
    fn malformed_and_exceptions_follow_failures_retire_but_query_always_retires() {
        for retire in [true, false] {
            let s = settle_get(OP, &[1, 1], Ok(vec![KeyResult::Missing]), retire);
            assert!(s.outage);
            assert_eq!(s.done.retired, retire);
            assert!(s.done.error.as_deref().unwrap().contains("malformed"));
            let s = settle_put(OP, &[1], Err(StoreError::new("x", "boom")), retire);
            assert_eq!(s.done.retired, retire);
            let s = settle_put(OP, &[1], Ok(vec![KeyResult::Missing]), retire);
            assert_eq!(s.done.retired, retire);
            assert!(s.outage);
        }
        let q = settle_query(OP, 2, Ok(vec![true]));
        assert!(q.outage && q.done.retired);
        let q = settle_query(OP, 2, Err(StoreError::new("x", "down")));
        assert!(q.outage && q.done.retired);
        let q = settle_query(OP, 2, Ok(vec![true, false]));
        assert!(!q.outage);
        assert_eq!(q.done.success, vec![true, false]);
    }
}
