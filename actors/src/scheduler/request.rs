//! The request FSM (seed 000 "Request state"): Submitted → Prefetching{continuation} →
//! (Ready hold) → Prefill → Decode → Finished | Aborted. The Prefetching state and the
//! Ready hold own the StorageLease; whatever ends the state hands the lease back.
//! A Prefetching request owns no Device pages or slot and is never a forward candidate.

use crate::cache::coordinator::{CacheCoordinator, QueryPlan};
use crate::cache::keys::PromptIndex;
use crate::frontend::FallbackReason;
use crate::model::DecodeState;
use crate::storage_transfer::StorageLease;
use messages::{RequestId, SamplingParams};

/// What resumes when the L3 wait ends (the PD bootstrap ACK updates it; a fused engine
/// host always resumes Submitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Continuation {
    Bootstrapping,
    Submitted,
}

/// The read transaction's progress while Prefetching.
#[derive(Debug)]
pub enum PrefetchPhase {
    /// QUERY issued; the plan names its keys' blocks.
    Query(QueryPlan),
    /// GET issued; the read record (destinations, then the Ready hold) has this id.
    Get(u64),
}

#[derive(Debug)]
pub enum RequestState {
    Submitted,
    Prefetching {
        continuation: Continuation,
        phase: PrefetchPhase,
        lease: StorageLease,
    },
    /// Waiting for admission (Device capacity); may carry a Ready hold.
    Admissible,
    /// The forward ran; waiting for the reduced digest of every rank.
    Prefill,
    Decode {
        state: DecodeState,
        last: u32,
        /// The first token was produced this round.
        fresh: bool,
    },
    /// A device decode step is planned; waiting for its digest (the drawn token).
    Stepping,
    Finished,
    Aborted,
}

impl RequestState {
    pub fn name(&self) -> &'static str {
        match self {
            RequestState::Submitted => "submitted",
            RequestState::Prefetching { .. } => "prefetching",
            RequestState::Admissible => "admissible",
            RequestState::Prefill => "prefill",
            RequestState::Decode { .. } | RequestState::Stepping => "decode",
            RequestState::Finished => "finished",
            RequestState::Aborted => "aborted",
        }
    }
}

/// AdmissionResources: the input context, the one-shot storage_prepared bit and the
/// optional Ready hold (its lease), carried across the pre-admission transitions.
#[derive(Debug, Default)]
pub struct AdmissionResources {
    pub storage_prepared: bool,
    pub ready: Option<StorageLease>,
    /// The longest boundary the L3 read planned (for the partial-hit reason).
    pub planned_boundary: u32,
    /// The local hit when the read was planned (tokens above it came from L3).
    pub local_at_plan: u32,
    /// Why L3 did not supply the whole planned prefix, when known.
    pub fallback: Option<FallbackReason>,
    /// Why L3 was not asked at all, when the credits were exhausted before the request's
    /// QUERY was planned: the reason only if admission then falls short of the reusable
    /// bound (a local hit that covers it needed no L3).
    pub storage_refused: Option<FallbackReason>,
}

/// Where a request's prefix came from and what was computed (reported to the client).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixSplit {
    pub device: u32,
    pub host: u32,
    pub l3: u32,
    pub computed: u32,
}

#[derive(Debug)]
pub struct Request {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub sampling: SamplingParams,
    pub state: RequestState,
    pub resources: AdmissionResources,
    pub output: Vec<u32>,
    pub split: PrefixSplit,
    pub fallback: FallbackReason,
    /// Device blocks this request holds references on while running.
    pub device_refs: Vec<crate::cache::keys::BlockAddr>,
    /// Scratch slots (partial blocks) this request holds while running.
    pub scratch: Vec<u32>,
    /// The chain hashes of the whole prompt, made the first time the request is matched
    /// and reused by every later match, query plan and reservation (`whole_index`).
    pub index: Option<PromptIndex>,
}

impl Request {
    pub fn new(id: RequestId, prompt: Vec<u32>, max_tokens: u32) -> Self {
        Self::sampled(id, prompt, max_tokens, SamplingParams::GREEDY)
    }

    pub fn sampled(
        id: RequestId,
        prompt: Vec<u32>,
        max_tokens: u32,
        sampling: SamplingParams,
    ) -> Self {
        Self {
            id,
            prompt,
            max_tokens,
            sampling,
            state: RequestState::Submitted,
            resources: AdmissionResources::default(),
            output: vec![],
            split: PrefixSplit::default(),
            fallback: FallbackReason::None,
            device_refs: vec![],
            scratch: vec![],
            index: None,
        }
    }

    /// The index of the whole prompt, hashed once per request, with the tail identity at
    /// the reusable bound (asked by every match of the request when tails are on) worked
    /// out once too.
    pub fn whole_index(&mut self, cache: &CacheCoordinator) -> PromptIndex {
        let prompt = &self.prompt;
        self.index
            .get_or_insert_with(|| Self::index_of(prompt, cache))
            .clone()
    }

    /// `whole_index` moved out of the request (admission, its last reader: a request
    /// admitted never matches again, one left queued gets it back): no reference count is
    /// written on the index's line, which a request queued long ago finds cold.
    pub fn take_whole_index(&mut self, cache: &CacheCoordinator) -> PromptIndex {
        match self.index.take() {
            Some(index) => index,
            None => Self::index_of(&self.prompt, cache),
        }
    }

    fn index_of(prompt: &[u32], cache: &CacheCoordinator) -> PromptIndex {
        let bound = (prompt.len() as u32).saturating_sub(1);
        let index = PromptIndex::new(cache.geometry(), prompt, prompt.len() as u32);
        if cache.tails_enabled() {
            index.with_tail_at(prompt, bound)
        } else {
            index
        }
    }

    /// The reusable request bound: every token but the last (the forward always computes at
    /// least one token).
    pub fn reusable(&self) -> u32 {
        (self.prompt.len() as u32).saturating_sub(1)
    }
}
