//! The rank mesh: one authenticated TCP connection between every pair of ranks of a
//! replica. Rank i listens on its own address; it dials every lower rank (with retry until
//! the connect deadline) and accepts every higher rank. Each connection then gets a reader
//! task (frames in, as [`PeerEvent`]s on one channel); frames out are written by the caller
//! (`broadcast`, `send_to`). Which connections a round uses is the [`Topology`]'s choice:
//! every pair, or the leader's spokes only (the other connections then carry aborts).
//!
//! It owns sockets and their tasks; it must never interpret reports (that is the relay's
//! and agreement's job) and never admit a peer the handshake refused.

use super::agreement::LEADER_RANK;
use super::frame::{encode_frame, read_frame, write_bytes, FrameError};
use super::handshake::{handshake, Expect, HandshakeError, HandshakeParams};
use messages::{ControlError, GatheredReport, Namespace, RoundReport};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The read buffer of one peer connection.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Settings of one rank's control plane.
#[derive(Clone)]
pub struct MeshSettings {
    pub rank: u32,
    pub world: u32,
    /// "host:port" of every rank, in rank order (this rank's entry is where it listens).
    pub peers: Vec<String>,
    pub namespace: Namespace,
    /// The shared secret every rank of the replica holds.
    pub secret: Vec<u8>,
    /// How long mesh setup may take (dial retries and handshakes included).
    pub connect_deadline: Duration,
    /// How long a round may wait for every peer's report.
    pub round_deadline: Duration,
    /// The largest frame accepted or sent.
    pub max_frame_bytes: usize,
    /// Which connections carry a round; `None` is [`Topology::for_world`]. Every rank of a
    /// replica must use the same (the benchmark sets it to compare the two side by side;
    /// nothing a user configures reaches it).
    pub topology: Option<Topology>,
}

/// Every field but the secret, which is never formatted.
impl std::fmt::Debug for MeshSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshSettings")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("peers", &self.peers)
            .field("namespace", &self.namespace)
            .field("secret", &"<redacted>")
            .field("connect_deadline", &self.connect_deadline)
            .field("round_deadline", &self.round_deadline)
            .field("max_frame_bytes", &self.max_frame_bytes)
            .field("topology", &self.topology)
            .finish()
    }
}

impl MeshSettings {
    pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

    pub fn new(rank: u32, peers: Vec<String>, namespace: Namespace, secret: Vec<u8>) -> Self {
        Self {
            rank,
            world: peers.len() as u32,
            peers,
            namespace,
            secret,
            connect_deadline: Duration::from_secs(30),
            round_deadline: Duration::from_secs(10),
            max_frame_bytes: Self::DEFAULT_MAX_FRAME_BYTES,
            topology: None,
        }
    }

    /// The topology rounds use.
    pub fn topology(&self) -> Topology {
        self.topology
            .unwrap_or_else(|| Topology::for_world(self.world))
    }

    pub fn validate(&self) -> Result<(), ControlError> {
        let bad = |m: String| Err(ControlError::Setup(m));
        if self.world == 0 {
            return bad("world size must be at least 1".into());
        }
        if self.peers.len() != self.world as usize {
            return bad(format!(
                "{} peer addresses for a world of {}",
                self.peers.len(),
                self.world
            ));
        }
        if self.rank >= self.world {
            return bad(format!(
                "rank {} outside a world of {}",
                self.rank, self.world
            ));
        }
        if self.world > 1 && self.secret.is_empty() {
            return bad("a mesh of more than one rank needs a shared secret".into());
        }
        if self.round_deadline.is_zero() {
            return bad("round deadline must be positive".into());
        }
        if self.max_frame_bytes < 1024 {
            return bad("frame limit below 1 KiB".into());
        }
        Ok(())
    }

    fn params(&self) -> HandshakeParams {
        HandshakeParams::new(
            self.rank,
            self.world,
            self.namespace.clone(),
            Arc::new(self.secret.clone()),
        )
    }
}

/// Which connections carry a round (see `relay`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Every rank sends its report and its confirmation to every peer: two message delays,
    /// 2·w·(w−1) frames a round.
    FullMesh,
    /// Every rank sends its report and its confirmation to the leader only, which answers
    /// with the gathered set and then with the agreement: four message delays, 4·(w−1)
    /// frames a round. Where the ranks share a host's cores, frames (each a write, a wakeup
    /// and a read) cost more than message delays from five ranks on.
    Star,
}

impl Topology {
    /// The smallest world that rounds over the star. `bench agreement` on a 2-core machine
    /// (2026-12-04, idle rounds, star ÷ full mesh p50): 1.48x and 1.94x at 3 ranks, 1.30x at
    /// 4, 0.96x and 0.75x at 5, 0.78x and 0.72x at 6, 0.44x at 8.
    pub const STAR_FROM_WORLD: u32 = 5;

    pub fn for_world(world: u32) -> Self {
        if world >= Self::STAR_FROM_WORLD {
            Self::Star
        } else {
            Self::FullMesh
        }
    }
}

/// The largest frame a rank accepts from the leader of a star: the gathered set holds one
/// report of up to `max_frame_bytes` per rank.
pub fn gathered_frame_limit(max_frame_bytes: usize, world: u32) -> usize {
    max_frame_bytes.saturating_mul(world.max(1) as usize)
}

/// What crosses an established connection. Generic over how a report is held: as owned
/// records ([`RoundReport`], the default) or as the columns the relay gathers
/// ([`GatheredReport`]); both have the same wire form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum MeshFrame<R = RoundReport> {
    Report(R),
    /// The sender has gathered every report of this round (the relay's second phase).
    Gathered(u64),
    /// The star's leader to every other rank: every rank's report of one round, in rank
    /// order, each encoded on its own by `messages::encode` (the leader's answer to the
    /// first phase; a rank decodes every report but its own, which it kept).
    All(Vec<bytes::Bytes>),
    /// The star's leader to every other rank: every rank confirmed this round; agree it.
    Agreed(u64),
    /// The sender failed a round; the carried error names the cause (e.g. the dead rank).
    Abort(ControlError),
}

/// What a reader task saw on one peer's connection. A frame moves through the event
/// channel unboxed: a few hundred bytes of column headers copied, not another allocation.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum PeerEvent {
    Frame(MeshFrame<GatheredReport>),
    Closed(String),
    Bad(FrameError),
}

/// Why a broadcast did not reach every peer.
#[derive(Debug)]
pub enum BroadcastError {
    Encode(FrameError),
    Failed(u32, FrameError),
    Stalled(u32),
}

/// The established mesh of one rank.
pub struct Mesh {
    rank: u32,
    world: u32,
    max_frame_bytes: usize,
    topology: Topology,
    writers: Vec<Option<OwnedWriteHalf>>,
    events: mpsc::UnboundedReceiver<(u32, PeerEvent)>,
    tasks: Vec<JoinHandle<()>>,
    /// Frames written to peers since the mesh was set up (each counted once per peer).
    frames_sent: u64,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl Mesh {
    /// Binds this rank's address and sets up the mesh.
    pub async fn establish(settings: &MeshSettings) -> Result<Self, ControlError> {
        settings.validate()?;
        if settings.world == 1 {
            return Ok(Self::assemble(settings, Vec::new()));
        }
        let addr = &settings.peers[settings.rank as usize];
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| ControlError::Setup(format!("cannot listen on {addr}: {e}")))?;
        Self::establish_with_listener(settings, listener).await
    }

    /// Sets up the mesh with an already bound listener (tests bind port 0 first).
    pub async fn establish_with_listener(
        settings: &MeshSettings,
        listener: TcpListener,
    ) -> Result<Self, ControlError> {
        settings.validate()?;
        let deadline = Instant::now() + settings.connect_deadline;
        let params = settings.params();
        let (tx, mut rx) = mpsc::unbounded_channel::<Result<(u32, TcpStream), ControlError>>();
        let mut tasks = Vec::new();
        for peer in 0..settings.rank {
            let addr = settings.peers[peer as usize].clone();
            let params = params.clone();
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                let r = dial(&addr, peer, &params, deadline).await;
                let _ = tx.send(r);
            }));
        }
        let higher = settings.world - settings.rank - 1;
        let joined = Arc::new(parking_lot::Mutex::new(HashSet::new()));
        let last_refusal = Arc::new(parking_lot::Mutex::new(None::<String>));
        if higher > 0 {
            let params = params.clone();
            let tx = tx.clone();
            let joined = joined.clone();
            let last_refusal = last_refusal.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    let (mut s, from) = match listener.accept().await {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "mesh accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let params = params.clone();
                    let tx = tx.clone();
                    let joined = joined.clone();
                    let last_refusal = last_refusal.clone();
                    tokio::spawn(async move {
                        let expect = Expect::HigherThanMe(joined);
                        match tokio::time::timeout_at(deadline, handshake(&mut s, &params, &expect))
                            .await
                        {
                            Ok(Ok(peer)) => {
                                let _ = s.set_nodelay(true);
                                let _ = tx.send(Ok((peer, s)));
                            }
                            Ok(Err(e)) => {
                                tracing::warn!(%from, error = %e, "mesh handshake refused");
                                *last_refusal.lock() = Some(format!("{from}: {e}"));
                            }
                            Err(_) => {}
                        }
                    });
                }
            }));
        }
        drop(tx);
        let mut conns: Vec<Option<TcpStream>> = (0..settings.world).map(|_| None).collect();
        let mut missing = settings.world - 1;
        let result = loop {
            if missing == 0 {
                break Ok(());
            }
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Ok((peer, s)))) => {
                    if conns[peer as usize].is_none() {
                        conns[peer as usize] = Some(s);
                        missing -= 1;
                    }
                }
                Ok(Some(Err(e))) => break Err(e),
                Ok(None) => break Err(ControlError::Setup("mesh setup tasks ended".into())),
                Err(_) => {
                    let absent: Vec<String> = conns
                        .iter()
                        .enumerate()
                        .filter(|(i, c)| c.is_none() && *i as u32 != settings.rank)
                        .map(|(i, _)| i.to_string())
                        .collect();
                    let refusal = last_refusal
                        .lock()
                        .clone()
                        .map(|r| format!("; last refusal: {r}"))
                        .unwrap_or_default();
                    break Err(ControlError::Setup(format!(
                        "rank(s) {} did not join within {} ms{refusal}",
                        absent.join(", "),
                        settings.connect_deadline.as_millis()
                    )));
                }
            }
        };
        for t in &tasks {
            t.abort();
        }
        result?;
        let streams = conns
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| c.map(|s| (i as u32, s)))
            .collect();
        Ok(Self::assemble(settings, streams))
    }

    fn assemble(settings: &MeshSettings, streams: Vec<(u32, TcpStream)>) -> Self {
        let (etx, erx) = mpsc::unbounded_channel();
        let mut writers: Vec<Option<OwnedWriteHalf>> = (0..settings.world).map(|_| None).collect();
        let mut tasks = Vec::new();
        let limit = settings.max_frame_bytes;
        let star = settings.topology() == Topology::Star;
        for (peer, s) in streams {
            let (rd, wr) = s.into_split();
            // A star's leader sends the gathered set: up to one report per rank.
            let limit = if star && peer == LEADER_RANK {
                gathered_frame_limit(limit, settings.world)
            } else {
                limit
            };
            // Buffered: a frame's header and body (and often the next frame) in one read.
            let mut rd = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, rd);
            let rtx = etx.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    match read_frame::<MeshFrame<GatheredReport>, _>(&mut rd, limit).await {
                        Ok(f) => {
                            if rtx.send((peer, PeerEvent::Frame(f))).is_err() {
                                return;
                            }
                        }
                        Err(FrameError::Closed) => {
                            let _ = rtx.send((peer, PeerEvent::Closed("connection closed".into())));
                            return;
                        }
                        Err(FrameError::Io(e)) => {
                            let _ = rtx.send((peer, PeerEvent::Closed(e)));
                            return;
                        }
                        Err(e) => {
                            let _ = rtx.send((peer, PeerEvent::Bad(e)));
                            return;
                        }
                    }
                }
            }));
            writers[peer as usize] = Some(wr);
        }
        Self {
            rank: settings.rank,
            world: settings.world,
            max_frame_bytes: limit,
            topology: settings.topology(),
            writers,
            events: erx,
            tasks,
            frames_sent: 0,
        }
    }

    /// Whether the connection to `peer` can still carry frames out (a failed or stalled
    /// write drops it).
    pub fn is_connected(&self, peer: u32) -> bool {
        self.writers.get(peer as usize).is_some_and(|w| w.is_some())
    }

    /// Frames written to peers since the mesh was set up.
    pub fn frames_sent(&self) -> u64 {
        self.frames_sent
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn world(&self) -> u32 {
        self.world
    }

    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Which connections carry a round.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// Encodes a frame once and writes it to every peer concurrently, returning only once
    /// every write reached its socket (so a caller that stops driving the runtime right
    /// after cannot strand a frame). The first failing peer is named; a write still pending
    /// at `deadline` fails as [`BroadcastError::Stalled`].
    pub async fn broadcast<R: Serialize>(
        &mut self,
        frame: &MeshFrame<R>,
        deadline: Instant,
    ) -> Result<(), BroadcastError> {
        self.broadcast_excusing(frame, deadline, |_| false).await
    }

    /// Like `broadcast`, but a failed write to a peer for which `excused(peer)` holds is no
    /// error (its connection is still dropped): a peer that already confirmed the round
    /// and left needs nothing more of it.
    pub async fn broadcast_excusing<R: Serialize>(
        &mut self,
        frame: &MeshFrame<R>,
        deadline: Instant,
        excused: impl Fn(u32) -> bool,
    ) -> Result<(), BroadcastError> {
        self.broadcast_within(frame, self.max_frame_bytes, deadline, excused)
            .await
    }

    /// Like `broadcast_excusing`, with a frame limit of `limit` bytes instead of the mesh's
    /// (the star's gathered set).
    pub async fn broadcast_within<R: Serialize>(
        &mut self,
        frame: &MeshFrame<R>,
        limit: usize,
        deadline: Instant,
        excused: impl Fn(u32) -> bool,
    ) -> Result<(), BroadcastError> {
        if self.writers.iter().all(|w| w.is_none()) {
            return Ok(()); // a world of one: the exchange with itself sends nothing
        }
        let bytes = encode_frame(frame, limit).map_err(BroadcastError::Encode)?;
        self.frames_sent += self.writers.iter().filter(|w| w.is_some()).count() as u64;
        let writes = self
            .writers
            .iter_mut()
            .enumerate()
            .filter_map(|(peer, w)| w.as_mut().map(|w| (peer as u32, w)))
            .map(|(peer, w)| {
                let bytes = &bytes;
                async move {
                    match tokio::time::timeout_at(deadline, write_bytes(w, bytes)).await {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(e)) => Err(BroadcastError::Failed(peer, e)),
                        Err(_) => Err(BroadcastError::Stalled(peer)),
                    }
                }
            });
        let results = futures::future::join_all(writes).await;
        let mut first = None;
        for r in results {
            if let Err(e) = r {
                // A connection that failed or stalled mid-frame can carry no further frame.
                let peer = match &e {
                    BroadcastError::Failed(p, _) | BroadcastError::Stalled(p) => Some(*p),
                    BroadcastError::Encode(_) => None,
                };
                if let Some(w) = peer.and_then(|p| self.writers.get_mut(p as usize)) {
                    *w = None;
                }
                if peer.is_some_and(&excused) {
                    continue;
                }
                first.get_or_insert(e);
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Writes one frame to one peer, returning once it reached the socket; a failed or
    /// stalled write drops that connection (it can carry no further frame).
    pub async fn send_to<R: Serialize>(
        &mut self,
        peer: u32,
        frame: &MeshFrame<R>,
        deadline: Instant,
    ) -> Result<(), BroadcastError> {
        let bytes = encode_frame(frame, self.max_frame_bytes).map_err(BroadcastError::Encode)?;
        let Some(slot) = self.writers.get_mut(peer as usize) else {
            return Err(BroadcastError::Failed(
                peer,
                FrameError::Io(format!("no rank {peer} in a world of {}", self.world)),
            ));
        };
        let Some(w) = slot.as_mut() else {
            return Err(BroadcastError::Failed(
                peer,
                FrameError::Io("connection already dropped".into()),
            ));
        };
        self.frames_sent += 1;
        let r = match tokio::time::timeout_at(deadline, write_bytes(w, &bytes)).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => BroadcastError::Failed(peer, e),
            Err(_) => BroadcastError::Stalled(peer),
        };
        *slot = None;
        Err(r)
    }

    /// An event already queued, without waiting.
    pub fn try_next_event(&mut self) -> Option<(u32, PeerEvent)> {
        self.events.try_recv().ok()
    }

    /// The next event from any peer.
    pub async fn next_event(&mut self) -> Option<(u32, PeerEvent)> {
        self.events.recv().await
    }
}

/// Dials a lower rank until it answers the handshake or the deadline passes.
async fn dial(
    addr: &str,
    peer: u32,
    params: &HandshakeParams,
    deadline: Instant,
) -> Result<(u32, TcpStream), ControlError> {
    let mut backoff = Duration::from_millis(10);
    let mut last = String::from("no attempt");
    loop {
        if Instant::now() >= deadline {
            return Err(ControlError::Setup(format!(
                "rank {peer} at {addr} did not answer before the connect deadline: {last}"
            )));
        }
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(mut s)) => {
                match tokio::time::timeout_at(
                    deadline,
                    handshake(&mut s, params, &Expect::Rank(peer)),
                )
                .await
                {
                    Ok(Ok(r)) => {
                        let _ = s.set_nodelay(true);
                        return Ok((r, s));
                    }
                    Ok(Err(e)) if e.is_definitive() => {
                        return Err(handshake_error(peer, e));
                    }
                    Ok(Err(e)) => last = e.to_string(),
                    Err(_) => last = "handshake timed out".into(),
                }
            }
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "connect timed out".into(),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_millis(250));
    }
}

fn handshake_error(peer: u32, e: HandshakeError) -> ControlError {
    ControlError::Setup(format!("handshake with rank {peer}: {e}"))
}
