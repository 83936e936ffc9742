//! The wire codec: msgpack (rmp-serde) inside an envelope that carries a format version.
//! Decoding never panics on hostile input: every failure is a `CodecError`.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The format version of every encoded message. A peer with another version is refused.
pub const FORMAT_VERSION: u16 = 1;

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
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let version: VersionOnly =
        rmp_serde::from_slice(bytes).map_err(|e| CodecError::Malformed(e.to_string()))?;
    if version.v != FORMAT_VERSION {
        return Err(CodecError::Version {
            found: version.v,
            expected: FORMAT_VERSION,
        });
    }
    let env: Envelope<T> =
        rmp_serde::from_slice(bytes).map_err(|e| CodecError::Malformed(e.to_string()))?;
    Ok(env.body)
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
