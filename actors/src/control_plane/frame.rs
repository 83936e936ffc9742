//! Length-prefixed frames on the rank mesh: a 4-byte big-endian body length, then a body
//! encoded by `messages::codec` (msgpack inside a format-versioned envelope).
//!
//! This module owns framing and the frame size limit. It must never allocate a body larger
//! than the limit or panic on hostile bytes: every bad frame is a [`FrameError`].

use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes of the length prefix.
pub const HEADER_BYTES: usize = 4;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The connection ended cleanly at a frame boundary.
    #[error("connection closed")]
    Closed,
    /// The connection ended inside a frame.
    #[error("truncated frame: connection ended after {got} of {want} bytes")]
    Truncated { got: usize, want: usize },
    #[error("frame of {len} bytes exceeds the {limit}-byte limit")]
    Oversized { len: usize, limit: usize },
    #[error("empty frame")]
    Empty,
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("i/o error: {0}")]
    Io(String),
}

/// Encodes `value` as one frame (header + body). Refuses a body over `limit`.
pub fn encode_frame<T: Serialize>(value: &T, limit: usize) -> Result<Vec<u8>, FrameError> {
    let body = messages::encode(value).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if body.len() > limit || body.len() > u32::MAX as usize {
        return Err(FrameError::Oversized {
            len: body.len(),
            limit,
        });
    }
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// The body length a header announces, checked against the limit.
pub fn body_len(header: [u8; HEADER_BYTES], limit: usize) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > limit {
        return Err(FrameError::Oversized { len, limit });
    }
    Ok(len)
}

/// Decodes a frame body.
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    messages::decode(body).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Decodes the first frame of `buf`: `Ok(None)` when more bytes are needed, else the value
/// and the bytes consumed. The same checks as [`read_frame`], over a byte slice.
pub fn decode_frame<T: DeserializeOwned>(
    buf: &[u8],
    limit: usize,
) -> Result<Option<(T, usize)>, FrameError> {
    let Some(header) = buf.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let mut h = [0u8; HEADER_BYTES];
    h.copy_from_slice(header);
    let len = body_len(h, limit)?;
    let Some(body) = buf.get(HEADER_BYTES..HEADER_BYTES + len) else {
        return Ok(None);
    };
    Ok(Some((decode_body(body)?, HEADER_BYTES + len)))
}

/// Reads one frame. A clean end before any header byte is [`FrameError::Closed`].
pub async fn read_frame<T: DeserializeOwned, R: AsyncRead + Unpin>(
    rd: &mut R,
    limit: usize,
) -> Result<T, FrameError> {
    let mut header = [0u8; HEADER_BYTES];
    let got = read_full(rd, &mut header).await?;
    if got == 0 {
        return Err(FrameError::Closed);
    }
    if got < HEADER_BYTES {
        return Err(FrameError::Truncated {
            got,
            want: HEADER_BYTES,
        });
    }
    let len = body_len(header, limit)?;
    let mut body = vec![0u8; len];
    let got = read_full(rd, &mut body).await?;
    if got < len {
        return Err(FrameError::Truncated {
            got: HEADER_BYTES + got,
            want: HEADER_BYTES + len,
        });
    }
    decode_body(&body)
}

/// Writes pre-encoded frame bytes and flushes.
pub async fn write_bytes<W: AsyncWrite + Unpin>(
    wr: &mut W,
    bytes: &[u8],
) -> Result<(), FrameError> {
    wr.write_all(bytes)
        .await
        .map_err(|e| FrameError::Io(e.to_string()))?;
    wr.flush().await.map_err(|e| FrameError::Io(e.to_string()))
}

/// Encodes and writes one frame.
pub async fn write_frame<T: Serialize, W: AsyncWrite + Unpin>(
    wr: &mut W,
    value: &T,
    limit: usize,
) -> Result<(), FrameError> {
    let bytes = encode_frame(value, limit)?;
    write_bytes(wr, &bytes).await
}

/// Reads until `buf` is full or the stream ends; returns the bytes read.
async fn read_full<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut [u8]) -> Result<usize, FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match rd.read(&mut buf[got..]).await {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(FrameError::Io(e.to_string())),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::{OperationId, RoundReport, StorageDone};

    fn report() -> RoundReport {
        let mut r = RoundReport::idle(1, 3, 99);
        r.completions
            .push(StorageDone::query(OperationId(1), vec![true; 4], true));
        r
    }

    #[test]
    fn frame_round_trips_and_reports_consumed_bytes() {
        let bytes = encode_frame(&report(), 1 << 20).unwrap();
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes);
        let (back, used): (RoundReport, usize) = decode_frame(&two, 1 << 20).unwrap().unwrap();
        assert_eq!(back, report());
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn partial_input_needs_more_and_oversized_is_refused() {
        let bytes = encode_frame(&report(), 1 << 20).unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(
                decode_frame::<RoundReport>(&bytes[..cut], 1 << 20),
                Ok(None)
            );
        }
        let small = bytes.len() - HEADER_BYTES - 1;
        assert!(matches!(
            decode_frame::<RoundReport>(&bytes, small),
            Err(FrameError::Oversized { .. })
        ));
        assert!(matches!(
            encode_frame(&report(), small),
            Err(FrameError::Oversized { .. })
        ));
        assert_eq!(
            decode_frame::<RoundReport>(&[0, 0, 0, 0], 16),
            Err(FrameError::Empty)
        );
    }

    #[tokio::test]
    async fn truncated_stream_is_an_error_not_a_close() {
        let bytes = encode_frame(&report(), 1 << 20).unwrap();
        let mut cut = &bytes[..bytes.len() - 1];
        let e = read_frame::<RoundReport, _>(&mut cut, 1 << 20)
            .await
            .unwrap_err();
        assert!(matches!(e, FrameError::Truncated { .. }), "{e}");
        let mut empty: &[u8] = &[];
        assert_eq!(
            read_frame::<RoundReport, _>(&mut empty, 1 << 20).await,
            Err(FrameError::Closed)
        );
        let mut garbage: &[u8] = &[0, 0, 0, 3, 0xc1, 0xc1, 0xc1];
        assert!(matches!(
            read_frame::<RoundReport, _>(&mut garbage, 1 << 20).await,
            Err(FrameError::Malformed(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode_frame::<RoundReport>(&data, 1 << 16);
            let _ = decode_frame::<StorageDone>(&data, 1 << 16);
        }

        #[test]
        fn random_bodies_behind_a_valid_header_never_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 1..512)) {
            let mut data = (body.len() as u32).to_be_bytes().to_vec();
            data.extend_from_slice(&body);
            let r = decode_frame::<RoundReport>(&data, 1 << 16);
            proptest::prop_assert!(r.is_err() || matches!(r, Ok(Some(_))));
        }
    }
}
