//! tsl3 vocabulary: every type that crosses a mailbox or a socket, its codec and its
//! validation. This crate owns no state and does no I/O; actors depend on it and never on
//! each other (the dependency picture is a star around `messages`).
//!
//! Nouns follow seed 000: StorageQueryOp / StorageGetOp / StoragePutOp / StorageCancelOp,
//! StorageDone, PressureSnapshot, HealthState, OperationId.

pub mod codec;
pub mod columns;
pub mod identity;
pub mod ids;
pub mod ops;
pub mod pressure;
pub mod round;
pub mod sampling;
pub mod settings;
pub mod storage_key;

pub use codec::{decode, encode, CodecError, FORMAT_VERSION};
pub use columns::{CompletionColumns, DoneView};
pub use identity::{DeploymentIdentity, Namespace, RUNTIME_COMPAT};
pub use ids::{OperationId, OperationIdAllocator, RequestId};
pub use ops::{
    HostRange, ObjectFailure, ProtocolError, Rejection, StorageCancelOp, StorageDone, StorageGetOp,
    StorageKey, StorageOp, StorageOpKind, StoragePutOp, StorageQueryOp,
};
pub use pressure::{
    HealthState, HealthStatus, KindPressure, PressureObservation, PressureSnapshot,
};
pub use round::{
    AdminCommand, AgreedRound, ControlError, ExchangeRound, FrontendMessage, GatheredReport,
    PrefillDigest, RankDigest, RoundReport, Shard,
};
pub use sampling::{SamplingParams, TokenLogprobs, MAX_TOP_LOGPROBS};
