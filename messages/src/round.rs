//! The round's relay vocabulary (seed 000 "Completion agreement and ordering"; DESIGN.md
//! section 4): each owner's [`RoundReport`], the leader's [`FrontendMessage`]s riding it,
//! the [`AgreedRound`] every rank receives, and the [`ControlError`] that fails a round.
//!
//! This module owns types only: no I/O, no reduction logic (that lives beside the
//! ControlPlane actor). A report never carries a wall-clock timestamp other than the
//! owner's monotonic `clock_us`; only the leader's becomes the agreed tick.

use crate::columns::CompletionColumns;
use crate::ids::RequestId;
use crate::ops::StorageDone;
use crate::pressure::PressureObservation;
use crate::sampling::{SamplingParams, TokenLogprobs};
use serde::{Deserialize, Serialize};

/// An administrative command entered at the leader's frontend: the one vocabulary of the
/// HTTP side, the relay and the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminCommand {
    /// Drop every cached prefix (Device and Host) on every rank.
    ClearCache,
    /// An explicit weight update: the namespace rotates to the new versions.
    SetWeightVersion { target: u64, draft: Option<u64> },
    /// Drop this replica's local caches only, once idle (no request holds cache
    /// resources, no storage operation is outstanding, no backup candidate is queued):
    /// the Device (L1) always, the Host (L2) when `host`. L3 is untouched.
    ResetLocal { host: bool },
}

impl AdminCommand {
    /// A local reset waits for storage to be idle as well as for quiescence (the backups in
    /// flight land first).
    pub fn waits_for_idle_storage(&self) -> bool {
        matches!(self, AdminCommand::ResetLocal { .. })
    }
}

/// A message from the leader rank's frontend. It rides the leader's report so every rank
/// sees it in the same round; the control plane treats it as opaque.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FrontendMessage {
    NewRequest {
        id: RequestId,
        prompt: Vec<u32>,
        max_tokens: u32,
        /// How its tokens are chosen (every rank draws the same token).
        #[serde(default)]
        sampling: SamplingParams,
    },
    Cancel {
        id: RequestId,
    },
    Admin(AdminCommand),
    /// The leader is shutting down with no request in flight: every rank stops after this
    /// round, so no rank sees another disappear.
    Shutdown,
}

/// Which part of the KV heads a rank holds: shard `index` of `count` (TP rank of TP size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// The whole model on one rank.
    pub const SINGLE: Shard = Shard { index: 0, count: 1 };

    pub fn new(index: u32, count: u32) -> Self {
        Self { index, count }
    }
}

/// One rank's partial digest of a prefill (the synthetic model's all-reduce input): what a
/// forward computes on this rank's shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RankDigest {
    pub shard: Shard,
    pub tokens: u64,
    pub value: u64,
}

/// A rank's digest of one request's forward step (a prefill, or a decode step of a backend
/// that decodes on the device), sent at the tail feedback point of the round that ran the
/// forward and gathered with the next round's reports.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PrefillDigest {
    pub request: RequestId,
    pub digest: RankDigest,
    /// A backend that draws the token on the device (the transformer: `digest.value` is
    /// the token) reports its log-probabilities here when the request asked for them.
    #[serde(default)]
    pub logprobs: Option<TokenLogprobs>,
}

/// One owner's report for one round (the head feedback point).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoundReport {
    /// The reporting owner's attention-TP rank.
    pub rank: u32,
    /// The round this report belongs to; every rank exchanges the same round.
    pub round: u64,
    /// The owner's monotonic clock in microseconds (only the leader's becomes the tick).
    pub clock_us: u64,
    /// The three pressure observations of this owner's executor.
    pub pressure: PressureObservation,
    /// Completion records that became final on this owner since its last report; each
    /// record is sent exactly once. On the wire they travel as [`CompletionColumns`].
    #[serde(with = "crate::columns::records")]
    pub completions: Vec<StorageDone>,
    /// Set when this owner's poll was invalid (a local record failed validation); every
    /// owner then raises the same protocol error.
    pub error: Option<String>,
    /// Frontend messages: only the leader's report may carry them.
    pub frontend: Vec<FrontendMessage>,
    /// This owner's prefill digests of the last round's forwards.
    #[serde(default)]
    pub digests: Vec<PrefillDigest>,
    /// This owner's result of the admin preflight it ran after the last round (the
    /// synchronous remote namespace deletion of a clear; Ok when there is nothing to
    /// delete). Every owner runs it in the same round, so all or none report it.
    #[serde(default)]
    pub admin_preflight: Option<Result<(), String>>,
}

impl RoundReport {
    /// An idle report: no completions, no pressure, no frontend messages.
    pub fn idle(rank: u32, round: u64, clock_us: u64) -> Self {
        Self {
            rank,
            round,
            clock_us,
            pressure: PressureObservation::default(),
            completions: Vec::new(),
            error: None,
            frontend: Vec::new(),
            digests: Vec::new(),
            admin_preflight: None,
        }
    }
}

/// A report as the relay gathers it: a [`RoundReport`] whose completion records are
/// [`CompletionColumns`] (decoded from a peer's frame without a per-record allocation, or
/// built once from this rank's own records). Its wire form is the RoundReport's: the same
/// fields under the same names, so either type decodes what the other encodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatheredReport {
    pub rank: u32,
    pub round: u64,
    pub clock_us: u64,
    pub pressure: PressureObservation,
    pub completions: CompletionColumns,
    pub error: Option<String>,
    pub frontend: Vec<FrontendMessage>,
    #[serde(default)]
    pub digests: Vec<PrefillDigest>,
    #[serde(default)]
    pub admin_preflight: Option<Result<(), String>>,
}

impl GatheredReport {
    /// The gathered form of a report. A record with no columnar form (per-key masks of
    /// different lengths) fails with its validation error.
    pub fn try_from_report(r: RoundReport) -> Result<Self, crate::ProtocolError> {
        let columns = CompletionColumns::from_records(&r.completions)?;
        Ok(Self::from_parts(r, columns))
    }

    /// A report's fields with `completions` in place of its records (which are dropped).
    pub fn from_parts(r: RoundReport, completions: CompletionColumns) -> Self {
        Self {
            completions,
            rank: r.rank,
            round: r.round,
            clock_us: r.clock_us,
            pressure: r.pressure,
            error: r.error,
            frontend: r.frontend,
            digests: r.digests,
            admin_preflight: r.admin_preflight,
        }
    }

    /// Back to a report of owned records.
    pub fn into_report(self) -> RoundReport {
        RoundReport {
            completions: self.completions.to_records(),
            rank: self.rank,
            round: self.round,
            clock_us: self.clock_us,
            pressure: self.pressure,
            error: self.error,
            frontend: self.frontend,
            digests: self.digests,
            admin_preflight: self.admin_preflight,
        }
    }
}

/// The agreed result of one round, identical on every rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgreedRound {
    pub round: u64,
    /// The leader's clock: the round's tick (delivered every round, idle ones included).
    pub tick_us: u64,
    /// Field-wise MAX of every owner's pressure observation.
    pub pressure: PressureObservation,
    /// The leader's frontend messages, in the order the leader sent them.
    pub frontend: Vec<FrontendMessage>,
    /// Operations every owner has now reported, reduced across owners, ordered by
    /// OperationId.
    pub completions: Vec<StorageDone>,
    /// Every owner's prefill digests, ordered by (request, shard).
    #[serde(default)]
    pub digests: Vec<PrefillDigest>,
    /// The agreed admin preflight: Ok only when every owner's succeeded; otherwise the
    /// first failing owner's error (rank order). Every owner then applies (or refuses)
    /// the admin command alike.
    #[serde(default)]
    pub admin_preflight: Option<Result<(), String>>,
}

/// Why a round failed. After any of these the ControlPlane refuses further rounds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ControlError {
    /// A peer's report did not arrive within the round deadline (a stalled rank).
    #[error("rank {rank} did not report round {round} within {deadline_ms} ms")]
    Timeout {
        rank: u32,
        round: u64,
        deadline_ms: u64,
    },
    /// A peer's connection closed (a dead rank).
    #[error("rank {rank} disconnected in round {round}: {detail}")]
    Disconnected {
        rank: u32,
        round: u64,
        detail: String,
    },
    /// A peer sent a malformed, truncated or oversized frame.
    #[error("protocol error: rank {rank} sent a bad frame in round {round}: {detail}")]
    Frame {
        rank: u32,
        round: u64,
        detail: String,
    },
    /// An invalid report: every rank raises this same error for the same round.
    #[error("protocol error in round {round}: {message}")]
    Protocol { round: u64, message: String },
    /// The mesh could not be set up (connect deadline, refused handshake, bad settings).
    #[error("control plane setup failed: {0}")]
    Setup(String),
    /// An earlier round failed; the control plane does no further rounds.
    #[error("control plane stopped after an earlier failure: {0}")]
    Stopped(String),
}

impl ControlError {
    /// The rank this error blames, when it names one.
    pub fn blamed_rank(&self) -> Option<u32> {
        match self {
            ControlError::Timeout { rank, .. }
            | ControlError::Disconnected { rank, .. }
            | ControlError::Frame { rank, .. } => Some(*rank),
            _ => None,
        }
    }
}

/// The round loop's request to the ControlPlane: exchange this rank's report, return the
/// agreed round.
#[derive(Clone, Debug)]
pub struct ExchangeRound(pub RoundReport);

impl actix::Message for ExchangeRound {
    type Result = Result<AgreedRound, ControlError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode, OperationId};

    #[test]
    fn only_a_local_reset_waits_for_idle_storage() {
        assert!(AdminCommand::ResetLocal { host: true }.waits_for_idle_storage());
        assert!(AdminCommand::ResetLocal { host: false }.waits_for_idle_storage());
        assert!(!AdminCommand::ClearCache.waits_for_idle_storage());
        let update = AdminCommand::SetWeightVersion {
            target: 2,
            draft: None,
        };
        assert!(!update.waits_for_idle_storage());
    }

    #[test]
    fn report_round_trips_through_the_codec() {
        let mut r = RoundReport::idle(1, 9, 1234);
        r.completions
            .push(StorageDone::query(OperationId(4), vec![true, false], true));
        r.frontend.push(FrontendMessage::NewRequest {
            id: RequestId(3),
            prompt: vec![1, 2, 3],
            max_tokens: 8,
            sampling: SamplingParams {
                temperature: 0.5,
                top_p: 0.9,
                top_k: 40,
                seed: 7,
                logprobs: Some(2),
            },
        });
        r.frontend
            .push(FrontendMessage::Admin(AdminCommand::SetWeightVersion {
                target: 2,
                draft: Some(1),
            }));
        let back: RoundReport = decode(&encode(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn a_gathered_report_has_the_wire_form_of_its_report() {
        let mut r = RoundReport::idle(2, 5, 77);
        r.completions = vec![
            StorageDone::query(OperationId(9), vec![true, false, true], true),
            StorageDone::rejected(
                OperationId(4),
                crate::StorageOpKind::Put,
                2,
                crate::Rejection::QueueFull,
            ),
        ];
        r.error = Some("x".into());
        r.admin_preflight = Some(Err("no".into()));
        let g = GatheredReport::try_from_report(r.clone()).unwrap();
        let bytes = encode(&r).unwrap();
        assert_eq!(
            encode(&g).unwrap(),
            bytes,
            "the same bytes from either form"
        );
        assert_eq!(decode::<GatheredReport>(&bytes).unwrap(), g);
        assert_eq!(g.clone().into_report(), r);
        assert_eq!(g.completions.len(), 2);
        let mut bad = r;
        bad.completions[0].bytes.pop();
        assert!(GatheredReport::try_from_report(bad.clone()).is_err());
        assert!(encode(&bad).is_err(), "unequal masks cannot be sent");
    }

    #[test]
    fn errors_name_the_rank() {
        let e = ControlError::Timeout {
            rank: 2,
            round: 17,
            deadline_ms: 500,
        };
        assert_eq!(
            e.to_string(),
            "rank 2 did not report round 17 within 500 ms"
        );
        assert_eq!(e.blamed_rank(), Some(2));
        let back: ControlError = decode(&encode(&e).unwrap()).unwrap();
        assert_eq!(back, e);
    }
}
