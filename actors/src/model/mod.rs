//! The synthetic model: the shipped forward backend, deterministic and honest.
//!
//! It owns the model's arithmetic only: profiles (groups, bytes, vocabulary, cost model),
//! the KV bytes of every (group, position, head, shard) as a function of the token prefix,
//! and the forward (prefill digest, first token, decode). It never touches device or Host
//! memory itself (the DeviceCopyEngine gathers and writes blocks), never sleeps, and never
//! reads a clock: device time is a number from the cost model.
//!
//! Honesty: the first output token is a digest of every KV byte of the context. Each rank
//! digests the rows it holds (one row = one KV head at one position) into a wrapping sum of
//! position-bound row digests; the ranks' partial sums are reduced by wrapping addition
//! (an all-reduce SUM), so the reduced value is the same for any TP size and equals
//! single-rank recomputation. A restored prefix that is wrong in one byte changes the
//! output. See `forward.rs` for how sliding-window and State groups keep that property.
//!
//! Beside it, for both forward backends: `sampling.rs` (one rule drawing a token from
//! scores under a request's sampling parameters) and `checkpoint.rs` (a model
//! directory's cache geometry, read from its config.json; the transformer's arithmetic is
//! the `transformer` crate's).

pub mod checkpoint;
pub mod cost;
pub mod forward;
pub mod kv;
pub mod profile;
pub mod sampling;
pub mod synthetic;

pub use cost::{CostModel, PublishedPoint, StepItem};
pub use forward::{DecodeState, GroupContext, GroupWritten, RankDigest, ReducedDigest};
pub use kv::{PrefixChain, Shard};
pub use profile::{GroupKind, GroupSpec, ModelProfile};
pub use synthetic::SyntheticModel;

/// A request the synthetic model cannot serve as asked. Never a panic.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model profile {0:?}")]
    UnknownProfile(String),
    #[error("no cache group {0}")]
    NoSuchGroup(usize),
    #[error("shard {index} of {count} does not divide {kv_heads} KV heads")]
    BadShard {
        index: u32,
        count: u32,
        kv_heads: u32,
    },
    #[error("group {group} block {block} lies beyond a prefix of {tokens} tokens")]
    BlockBeyondPrefix {
        group: usize,
        block: u64,
        tokens: u64,
    },
    #[error("buffer of {got} bytes where {expected} are needed")]
    BufferLength { expected: u64, got: u64 },
    #[error("group {group}: boundary {boundary} is not a multiple of the checkpoint interval {interval}")]
    UnalignedStateBoundary {
        group: usize,
        boundary: u64,
        interval: u64,
    },
    #[error("context has {got} groups, the profile {expected}")]
    ContextGroups { expected: usize, got: usize },
    #[error("group {group}: context has {got} blocks, the boundary needs {expected}")]
    ContextBlocks {
        group: usize,
        expected: usize,
        got: usize,
    },
    #[error("group {group} block {block}: {got} bytes where {expected} are needed")]
    ContextBlockLength {
        group: usize,
        block: u64,
        expected: u64,
        got: u64,
    },
    #[error("group {group}: the context's unit hashes do not cover its blocks' bytes")]
    ContextUnits { group: usize },
    #[error("a prefill needs new tokens: context {context}, prompt {tokens}")]
    NoNewTokens { context: u64, tokens: u64 },
    #[error("rank reduction: {0}")]
    Reduce(String),
    #[error("model directory: {0}")]
    Checkpoint(String),
}
