//! The mesh handshake: both ends exchange a Hello (rank, world size, runtime_compat,
//! namespace, fresh random nonce), check it, then prove knowledge of the shared secret with
//! an HMAC-SHA256 over both Hellos (each direction binds its own Hello first, so a
//! reflected proof fails), and finally accept or refuse.
//!
//! It owns the join rules only. It must never let a peer join without a verified proof, and
//! never send the secret itself.

use super::frame::{encode_frame, read_frame, write_bytes, FrameError};
use hmac::{Hmac, Mac};
use messages::{Namespace, RUNTIME_COMPAT};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::HashSet;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// The handshake's own frame limit (Hellos are tiny).
pub const HANDSHAKE_FRAME_LIMIT: usize = 64 * 1024;
const MAGIC: &str = "tsl3-mesh";
const PROOF_DOMAIN: &[u8] = b"tsl3-mesh-proof-v1";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub rank: u32,
    pub world: u32,
    pub runtime_compat: u32,
    pub namespace: String,
    pub nonce: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandshakeFrame {
    Hello(Hello),
    Proof(Vec<u8>),
    Accept,
    Refuse(String),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    /// This end refused the peer (and told it why).
    #[error("refused the peer: {0}")]
    Refused(String),
    /// The peer refused this end.
    #[error("the peer refused: {0}")]
    PeerRefused(String),
    /// The connection failed during the handshake (worth a retry).
    #[error("handshake i/o: {0}")]
    Io(String),
}

impl HandshakeError {
    /// A refusal is definitive; an i/o failure may be retried.
    pub fn is_definitive(&self) -> bool {
        !matches!(self, HandshakeError::Io(_))
    }
}

/// What this end is and what it expects of the peer.
#[derive(Clone)]
pub struct HandshakeParams {
    pub rank: u32,
    pub world: u32,
    pub namespace: Namespace,
    pub secret: Arc<Vec<u8>>,
    pub runtime_compat: u32,
}

/// Every field but the secret, which is never formatted.
impl std::fmt::Debug for HandshakeParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeParams")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("namespace", &self.namespace)
            .field("secret", &"<redacted>")
            .field("runtime_compat", &self.runtime_compat)
            .finish()
    }
}

impl HandshakeParams {
    pub fn new(rank: u32, world: u32, namespace: Namespace, secret: Arc<Vec<u8>>) -> Self {
        Self {
            rank,
            world,
            namespace,
            secret,
            runtime_compat: RUNTIME_COMPAT,
        }
    }
}

/// Which peer ranks this end accepts.
#[derive(Clone, Debug)]
pub enum Expect {
    /// The dialer knows exactly whom it dialed.
    Rank(u32),
    /// The listener accepts any higher rank not yet joined; it claims the rank in `joined`.
    HigherThanMe(Arc<parking_lot::Mutex<HashSet<u32>>>),
}

fn proof(secret: &[u8], sender: &[u8], receiver: &[u8]) -> Result<Vec<u8>, HandshakeError> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret)
        .map_err(|e| HandshakeError::Refused(format!("unusable secret: {e}")))?;
    mac.update(PROOF_DOMAIN);
    mac.update(&(sender.len() as u64).to_be_bytes());
    mac.update(sender);
    mac.update(receiver);
    Ok(mac.finalize().into_bytes().to_vec())
}

fn verify(secret: &[u8], sender: &[u8], receiver: &[u8], tag: &[u8]) -> bool {
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(secret) else {
        return false;
    };
    mac.update(PROOF_DOMAIN);
    mac.update(&(sender.len() as u64).to_be_bytes());
    mac.update(sender);
    mac.update(receiver);
    mac.verify_slice(tag).is_ok()
}

fn io(e: FrameError) -> HandshakeError {
    HandshakeError::Io(e.to_string())
}

async fn refuse<W: AsyncWrite + Unpin>(wr: &mut W, why: String) -> HandshakeError {
    if let Ok(b) = encode_frame(&HandshakeFrame::Refuse(why.clone()), HANDSHAKE_FRAME_LIMIT) {
        let _ = write_bytes(wr, &b).await;
    }
    HandshakeError::Refused(why)
}

fn check_hello(p: &HandshakeParams, expect: &Expect, h: &Hello) -> Result<(), String> {
    if h.magic != MAGIC {
        return Err(format!("not a tsl3 mesh peer (magic {:?})", h.magic));
    }
    if h.runtime_compat != p.runtime_compat {
        return Err(format!(
            "runtime_compat mismatch: peer {}, local {}",
            h.runtime_compat, p.runtime_compat
        ));
    }
    if h.world != p.world {
        return Err(format!(
            "world size mismatch: peer {}, local {}",
            h.world, p.world
        ));
    }
    if h.namespace != p.namespace.as_str() {
        return Err(format!(
            "namespace mismatch: peer {}, local {}",
            h.namespace,
            p.namespace.as_str()
        ));
    }
    if h.rank >= p.world {
        return Err(format!("rank {} outside a world of {}", h.rank, p.world));
    }
    if h.rank == p.rank {
        return Err(format!("rank {} is this rank", h.rank));
    }
    match expect {
        Expect::Rank(r) if *r != h.rank => {
            Err(format!("dialed rank {r} but rank {} answered", h.rank))
        }
        Expect::HigherThanMe(_) if h.rank < p.rank => Err(format!(
            "rank {} must be dialed by rank {}, not dial it",
            h.rank, p.rank
        )),
        _ => Ok(()),
    }
}

/// Runs the handshake on a connected stream; returns the peer's rank.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    p: &HandshakeParams,
    expect: &Expect,
) -> Result<u32, HandshakeError> {
    let nonce: [u8; 32] = rand::random();
    let mine = Hello {
        magic: MAGIC.into(),
        rank: p.rank,
        world: p.world,
        runtime_compat: p.runtime_compat,
        namespace: p.namespace.as_str().to_string(),
        nonce: nonce.to_vec(),
    };
    let mine_bytes = messages::encode(&HandshakeFrame::Hello(mine))
        .map_err(|e| HandshakeError::Io(e.to_string()))?;
    let mut framed = (mine_bytes.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&mine_bytes);
    write_bytes(stream, &framed).await.map_err(io)?;

    // The peer's Hello, kept as its exact encoded bytes for the proof.
    let peer: HandshakeFrame = read_frame(stream, HANDSHAKE_FRAME_LIMIT)
        .await
        .map_err(io)?;
    let hello = match peer {
        HandshakeFrame::Hello(h) => h,
        HandshakeFrame::Refuse(why) => return Err(HandshakeError::PeerRefused(why)),
        other => return Err(refuse(stream, format!("expected Hello, got {other:?}")).await),
    };
    let peer_bytes = messages::encode(&HandshakeFrame::Hello(hello.clone()))
        .map_err(|e| HandshakeError::Io(e.to_string()))?;
    if hello.nonce == nonce {
        return Err(refuse(stream, "the peer echoed this end's nonce".into()).await);
    }
    if let Err(why) = check_hello(p, expect, &hello) {
        return Err(refuse(stream, why).await);
    }
    let tag = proof(&p.secret, &mine_bytes, &peer_bytes)?;
    let b = encode_frame(&HandshakeFrame::Proof(tag), HANDSHAKE_FRAME_LIMIT).map_err(io)?;
    write_bytes(stream, &b).await.map_err(io)?;
    match read_frame(stream, HANDSHAKE_FRAME_LIMIT)
        .await
        .map_err(io)?
    {
        HandshakeFrame::Proof(tag) => {
            if !verify(&p.secret, &peer_bytes, &mine_bytes, &tag) {
                return Err(refuse(
                    stream,
                    format!(
                        "authentication failed: rank {} did not prove the shared secret",
                        hello.rank
                    ),
                )
                .await);
            }
        }
        HandshakeFrame::Refuse(why) => return Err(HandshakeError::PeerRefused(why)),
        other => return Err(refuse(stream, format!("expected Proof, got {other:?}")).await),
    }
    if let Expect::HigherThanMe(joined) = expect {
        if !joined.lock().insert(hello.rank) {
            return Err(refuse(stream, format!("rank {} already joined", hello.rank)).await);
        }
    }
    let b = encode_frame(&HandshakeFrame::Accept, HANDSHAKE_FRAME_LIMIT).map_err(io)?;
    let sent = write_bytes(stream, &b).await.map_err(io);
    let answer = match sent {
        Ok(()) => read_frame(stream, HANDSHAKE_FRAME_LIMIT).await.map_err(io),
        Err(e) => Err(e),
    };
    let result = match answer {
        Ok(HandshakeFrame::Accept) => Ok(hello.rank),
        Ok(HandshakeFrame::Refuse(why)) => Err(HandshakeError::PeerRefused(why)),
        Ok(other) => Err(refuse(stream, format!("expected Accept, got {other:?}")).await),
        Err(e) => Err(e),
    };
    if result.is_err() {
        if let Expect::HigherThanMe(joined) = expect {
            joined.lock().remove(&hello.rank);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(rank: u32, ns: &str, secret: &[u8]) -> HandshakeParams {
        HandshakeParams::new(rank, 2, Namespace(ns.into()), Arc::new(secret.to_vec()))
    }

    async fn pair(
        a: HandshakeParams,
        b: HandshakeParams,
    ) -> (Result<u32, HandshakeError>, Result<u32, HandshakeError>) {
        let (mut x, mut y) = tokio::io::duplex(1 << 16);
        let joined = Arc::new(parking_lot::Mutex::new(HashSet::new()));
        let la = async move { handshake(&mut x, &a, &Expect::HigherThanMe(joined)).await };
        let lb = async move { handshake(&mut y, &b, &Expect::Rank(0)).await };
        tokio::join!(la, lb)
    }

    #[tokio::test]
    async fn matching_peers_join() {
        let (a, b) = pair(
            params(0, "tsl3-a", b"s3cret"),
            params(1, "tsl3-a", b"s3cret"),
        )
        .await;
        assert_eq!(a, Ok(1));
        assert_eq!(b, Ok(0));
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_both_ways() {
        let (a, b) = pair(
            params(0, "tsl3-a", b"s3cret"),
            params(1, "tsl3-a", b"other"),
        )
        .await;
        assert!(
            matches!(&a, Err(HandshakeError::Refused(m)) if m.contains("authentication failed")),
            "{a:?}"
        );
        assert!(
            matches!(&b, Err(HandshakeError::Refused(m)) if m.contains("authentication failed")),
            "{b:?}"
        );
    }

    #[tokio::test]
    async fn wrong_namespace_and_same_rank_are_refused() {
        let (a, b) = pair(params(0, "tsl3-a", b"k"), params(1, "tsl3-b", b"k")).await;
        assert!(
            matches!(&a, Err(HandshakeError::Refused(m)) if m.contains("namespace mismatch")),
            "{a:?}"
        );
        assert!(b.is_err());
        let (a, _) = pair(params(0, "tsl3-a", b"k"), params(0, "tsl3-a", b"k")).await;
        assert!(
            matches!(&a, Err(HandshakeError::Refused(m)) if m.contains("is this rank")),
            "{a:?}"
        );
        let mut old = params(1, "tsl3-a", b"k");
        old.runtime_compat = 1;
        let (a, _) = pair(params(0, "tsl3-a", b"k"), old).await;
        assert!(
            matches!(&a, Err(HandshakeError::Refused(m)) if m.contains("runtime_compat")),
            "{a:?}"
        );
    }

    #[test]
    fn a_reflected_proof_does_not_verify() {
        let t = proof(b"k", b"mine", b"theirs").unwrap();
        assert!(verify(b"k", b"mine", b"theirs", &t));
        assert!(!verify(b"k", b"theirs", b"mine", &t));
        assert!(!verify(b"j", b"mine", b"theirs", &t));
    }
}
