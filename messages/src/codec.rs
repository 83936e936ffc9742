//! The wire codec: msgpack (rmp-serde) inside an envelope that carries a format version.
//! Decoding never panics on hostile input: every failure is a `CodecError`.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The format version of every encoded message. A peer with another version is refused.
pub const FORMAT_VERSION: u16 = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("format version {found} is not supported (expected {expected})")]
    Version { found: u16, expected: u16 },
    #[error("malformed message: {0}")]
    Malformed(String),
    #[error("encode failed: {0}")]
    Encode(String),
}

#[derive(Serialize)]
struct EnvelopeRef<'a, T> {
    v: u16,
    body: &'a T,
}

#[derive(Deserialize)]
struct Envelope<T> {
    v: u16,
    body: T,
}

#[derive(Deserialize)]
struct VersionOnly {
    v: u16,
}

/// Encodes `value` with the current format version.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    rmp_serde::to_vec_named(&EnvelopeRef {
        v: FORMAT_VERSION,
        body: value,
    })
    .map_err(|e| CodecError::Encode(e.to_string()))
}

/// Decodes a value encoded by [`encode`]; a different format version or any malformed byte
/// sequence is an error, never a panic.
///
/// One pass in the common case: the envelope and its body decode together; only when that
/// fails is the version read alone, so a peer of another version gets a version error
/// rather than a malformed one.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let version_error = |found: u16| CodecError::Version {
        found,
        expected: FORMAT_VERSION,
    };
    match rmp_serde::from_slice::<Envelope<T>>(bytes) {
        Ok(env) if env.v == FORMAT_VERSION => Ok(env.body),
        Ok(env) => Err(version_error(env.v)),
        Err(e) => match rmp_serde::from_slice::<VersionOnly>(bytes) {
            Ok(only) if only.v != FORMAT_VERSION => Err(version_error(only.v)),
            _ => Err(CodecError::Malformed(e.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::*;
    use crate::OperationId;

    #[test]
    fn round_trip_storage_done() {
        let done = StorageDone::get(
            OperationId(7),
            vec![true, false],
            vec![4096, 0],
            vec![None, Some(ObjectFailure::Missing)],
            true,
        );
        let bytes = encode(&done).unwrap();
        let back: StorageDone = decode(&bytes).unwrap();
        assert_eq!(back, done);
    }

    #[test]
    fn a_record_of_many_keys_round_trips_in_its_compact_form() {
        let n = 130;
        let mut done = StorageDone::get(
            OperationId(9),
            (0..n).map(|i| i % 3 == 0).collect(),
            (0..n).map(|i| i as u64 * 7).collect(),
            (0..n)
                .map(|i| match i % 5 {
                    1 => Some(ObjectFailure::Missing),
                    2 => Some(ObjectFailure::Invalid),
                    _ => None,
                })
                .collect(),
            false,
        );
        done.capacity = (0..n).map(|i| i % 7 == 0).collect();
        done.rejection = Some(Rejection::Quarantined);
        done.error = Some("boom".into());
        done.new_writes = 3;
        let bytes = encode(&done).unwrap();
        assert_eq!(decode::<StorageDone>(&bytes).unwrap(), done);
        // Masks are bitsets: 130 keys' flags take a few words, not a map entry per key.
        let named =
            rmp_serde::to_vec_named(&(&done.success, &done.failures, &done.capacity)).unwrap();
        assert!(
            bytes.len() < named.len(),
            "{} vs {}",
            bytes.len(),
            named.len()
        );
    }

    #[test]
    fn a_record_whose_masks_disagree_with_its_keys_is_malformed() {
        let done = StorageDone::query(OperationId(3), vec![true; 4], true);
        let mut w = WireDone::from(done.clone());
        w.2 = 70; // 70 keys claimed, one mask word and 4 byte counts sent
        let bytes = encode(&w).unwrap();
        assert!(matches!(
            decode::<StorageDone>(&bytes),
            Err(CodecError::Malformed(m)) if m.contains("do not match")
        ));
        // The masks match the keys but one byte count is missing.
        let mut w = WireDone::from(done.clone());
        w.4.pop();
        let bytes = encode(&w).unwrap();
        assert!(matches!(
            decode::<StorageDone>(&bytes),
            Err(CodecError::Malformed(m)) if m.contains("do not match")
        ));
        let mut w = WireDone::from(done.clone());
        w.5 = vec![1];
        w.6 = vec![1]; // key 0 both missing and invalid
        let bytes = encode(&w).unwrap();
        assert!(matches!(
            decode::<StorageDone>(&bytes),
            Err(CodecError::Malformed(m)) if m.contains("both missing and invalid")
        ));
    }

    #[test]
    fn wrong_version_is_refused() {
        let bytes = rmp_serde::to_vec_named(&EnvelopeRef { v: 99, body: &1u32 }).unwrap();
        assert_eq!(
            decode::<u32>(&bytes),
            Err(CodecError::Version {
                found: 99,
                expected: FORMAT_VERSION
            })
        );
    }

    /// A peer of another version whose body this version cannot read at all is still
    /// refused for its version (not as malformed), so the operator sees the real cause.
    #[test]
    fn another_version_with_an_unreadable_body_is_refused_for_its_version() {
        let bytes = rmp_serde::to_vec_named(&EnvelopeRef {
            v: FORMAT_VERSION + 1,
            body: &"a body of another shape",
        })
        .unwrap();
        assert_eq!(
            decode::<StorageDone>(&bytes),
            Err(CodecError::Version {
                found: FORMAT_VERSION + 1,
                expected: FORMAT_VERSION
            })
        );
        // The same unreadable body at this version is malformed.
        let bytes = rmp_serde::to_vec_named(&EnvelopeRef {
            v: FORMAT_VERSION,
            body: &"a body of another shape",
        })
        .unwrap();
        assert!(matches!(
            decode::<StorageDone>(&bytes),
            Err(CodecError::Malformed(_))
        ));
    }

    #[test]
    fn truncated_and_garbage_input_is_an_error() {
        let done = StorageDone::query(OperationId(1), vec![true; 8], true);
        let bytes = encode(&done).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode::<StorageDone>(&bytes[..cut]).is_err(), "cut {cut}");
        }
        assert!(decode::<StorageDone>(&[0xc1, 0xff, 0x00]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = decode::<StorageDone>(&data);
            let _ = decode::<StorageOp>(&data);
        }
    }
}
