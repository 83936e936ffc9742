//! The Mooncake adapter's return-code contract (seed 000, "Retirement and maintenance"), as
//! pure functions from a C result to a KeyResult fact. It owns the meaning of every code
//! tsl3 relies on; it never calls the library and never decides scheduling (re-offer,
//! quarantine and negative metadata belong to the scheduler and the executor).
//!
//! - GET: exactly the expected byte count proves success; a nonnegative short read is a
//!   retired failure; OBJECT_NOT_FOUND (-704) is a retired metadata miss; any other
//!   negative code is an unretired failure.
//! - PUT: 0 is a written object; OBJECT_ALREADY_EXISTS (-705) is idempotent success with no
//!   native write; NO_AVAILABLE_HANDLE (-200) is the master's allocation rejection before
//!   any source transfer (retired, re-offered by the scheduler, never a quarantine); any
//!   other negative code is an unretired failure.
//! - A slot the library left unwritten, a read longer than its destination or a positive
//!   PUT code is a malformed result: the whole call fails (StoreError), and since Mooncake
//!   does not prove retirement then, `failures_retire()` is false.

use super::super::KeyResult;

pub const OK: i64 = 0;
pub const INTERNAL_ERROR: i64 = -1;
pub const NO_AVAILABLE_HANDLE: i64 = -200;
pub const INVALID_PARAMS: i64 = -600;
pub const OBJECT_NOT_FOUND: i64 = -704;
pub const OBJECT_ALREADY_EXISTS: i64 = -705;
pub const OBJECT_HAS_LEASE: i64 = -706;
pub const TRANSFER_FAIL: i64 = -800;
pub const RPC_FAIL: i64 = -900;

/// A result the contract cannot read: the call as a whole fails.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed Mooncake result: {0}")]
pub struct Malformed(pub String);

/// One GET row: `code` is `batch_get_into`'s per-key result, `expected` the destination length.
pub fn get_result(code: i64, expected: u64) -> Result<KeyResult, Malformed> {
    if code == super::ffi::UNWRITTEN_I64 {
        return Err(Malformed("a GET result slot was left unwritten".into()));
    }
    if code >= 0 {
        let bytes = code as u64;
        return match bytes.cmp(&expected) {
            std::cmp::Ordering::Equal => Ok(KeyResult::Ok { bytes }),
            std::cmp::Ordering::Less => Ok(KeyResult::ShortRead { bytes }),
            std::cmp::Ordering::Greater => Err(Malformed(format!(
                "read {bytes} bytes into a {expected}-byte destination"
            ))),
        };
    }
    Ok(match code {
        OBJECT_NOT_FOUND => KeyResult::Missing,
        other => KeyResult::Failed {
            code: other,
            retired: false,
        },
    })
}

/// One PUT row: `code` is `batch_put_from`'s per-key result, `bytes` the source length.
pub fn put_result(code: i32, bytes: u64) -> Result<KeyResult, Malformed> {
    if code == super::ffi::UNWRITTEN_I32 {
        return Err(Malformed("a PUT result slot was left unwritten".into()));
    }
    Ok(match code as i64 {
        OK => KeyResult::Ok { bytes },
        OBJECT_ALREADY_EXISTS => KeyResult::AlreadyExists,
        NO_AVAILABLE_HANDLE => KeyResult::Capacity,
        c if c > 0 => return Err(Malformed(format!("positive PUT result {c}"))),
        c => KeyResult::Failed {
            code: c,
            retired: false,
        },
    })
}

/// One QUERY row of `batch_is_exist`: 1 exists, 0 or OBJECT_NOT_FOUND absent. Any other
/// code fails the call (QUERY has no per-key failure; it touches no Host payload).
pub fn exist_result(code: i32) -> Result<bool, Malformed> {
    match code as i64 {
        1 => Ok(true),
        0 | OBJECT_NOT_FOUND => Ok(false),
        c if c == super::ffi::UNWRITTEN_I32 as i64 => {
            Err(Malformed("a QUERY result slot was left unwritten".into()))
        }
        c => Err(Malformed(format!("existence check failed with {c}"))),
    }
}

/// Whether a PUT row counts as success for the scheduler (a written or already present
/// object) and whether it was a new native write.
pub fn put_success(r: &KeyResult) -> (bool, bool) {
    match r {
        KeyResult::Ok { .. } => (true, true),
        KeyResult::AlreadyExists => (true, false),
        _ => (false, false),
    }
}

/// `^<namespace>-` followed by the rest of Namespace::key's format, with every regex
/// metacharacter of the namespace escaped, so that `remove_by_regex` removes exactly the
/// namespace's objects: not those of a longer namespace that merely starts with this one
/// and a '-'.
pub fn namespace_pattern(namespace: &str) -> String {
    let mut p = String::with_capacity(namespace.len() * 2 + 2);
    p.push('^');
    for c in namespace.chars() {
        if matches!(
            c,
            '\\' | '.' | '^' | '$' | '|' | '?' | '*' | '+' | '(' | ')' | '[' | ']' | '{' | '}'
        ) {
            p.push('\\');
        }
        p.push(c);
    }
    p.push_str("-[0-9a-f]{32}-g[0-9]+-p[0-9]+-s[0-9]+$");
    p
}

#[cfg(test)]
mod tests {
    use super::super::ffi::{UNWRITTEN_I32, UNWRITTEN_I64};
    use super::*;

    #[test]
    fn get_exact_bytes_prove_success() {
        assert_eq!(get_result(65536, 65536), Ok(KeyResult::Ok { bytes: 65536 }));
        assert_eq!(get_result(0, 0), Ok(KeyResult::Ok { bytes: 0 }));
    }

    #[test]
    fn get_short_read_is_retired_failure() {
        assert_eq!(
            get_result(100, 4096),
            Ok(KeyResult::ShortRead { bytes: 100 })
        );
        assert_eq!(get_result(0, 4096), Ok(KeyResult::ShortRead { bytes: 0 }));
    }

    #[test]
    fn get_not_found_is_retired_miss() {
        assert_eq!(get_result(-704, 4096), Ok(KeyResult::Missing));
    }

    #[test]
    fn get_other_negative_is_unretired() {
        for code in [-1, -10, -200, -600, -705, -706, -800, -900, -901, -1700] {
            assert_eq!(
                get_result(code, 4096),
                Ok(KeyResult::Failed {
                    code,
                    retired: false
                }),
                "{code}"
            );
        }
    }

    #[test]
    fn get_malformed_results_fail_the_call() {
        assert!(get_result(4097, 4096).is_err());
        assert!(get_result(UNWRITTEN_I64, 4096).is_err());
    }

    #[test]
    fn put_codes() {
        assert_eq!(put_result(0, 64), Ok(KeyResult::Ok { bytes: 64 }));
        assert_eq!(put_result(-705, 64), Ok(KeyResult::AlreadyExists));
        assert_eq!(put_result(-200, 64), Ok(KeyResult::Capacity));
        for code in [-1, -10, -101, -500, -600, -704, -800, -900, -1700] {
            assert_eq!(
                put_result(code, 64),
                Ok(KeyResult::Failed {
                    code: code as i64,
                    retired: false
                }),
                "{code}"
            );
        }
        assert!(put_result(1, 64).is_err());
        assert!(put_result(UNWRITTEN_I32, 64).is_err());
    }

    #[test]
    fn put_success_keeps_idempotent_hits_apart_from_new_writes() {
        assert_eq!(put_success(&KeyResult::Ok { bytes: 1 }), (true, true));
        assert_eq!(put_success(&KeyResult::AlreadyExists), (true, false));
        assert_eq!(put_success(&KeyResult::Capacity), (false, false));
        assert_eq!(
            put_success(&KeyResult::Failed {
                code: -800,
                retired: false
            }),
            (false, false)
        );
    }

    #[test]
    fn exist_codes() {
        assert_eq!(exist_result(1), Ok(true));
        assert_eq!(exist_result(0), Ok(false));
        assert_eq!(exist_result(-704), Ok(false));
        assert!(exist_result(-900).is_err());
        assert!(exist_result(2).is_err());
        assert!(exist_result(UNWRITTEN_I32).is_err());
    }

    #[test]
    fn namespace_pattern_escapes_metacharacters() {
        const REST: &str = "-[0-9a-f]{32}-g[0-9]+-p[0-9]+-s[0-9]+$";
        assert_eq!(
            namespace_pattern("tsl3.v1+x"),
            format!("^tsl3\\.v1\\+x{REST}")
        );
        assert_eq!(
            namespace_pattern("a(b)[c]{d}|e*f?g^h$i\\j"),
            format!("^a\\(b\\)\\[c\\]\\{{d\\}}\\|e\\*f\\?g\\^h\\$i\\\\j{REST}")
        );
        assert_eq!(namespace_pattern("plain"), format!("^plain{REST}"));
    }
}
