//! tsl3's model forward: a Llama-family decoder (Llama, Qwen2, Mistral) on candle whose KV
//! cache is handed in and out as plain row bytes, so the engine can keep it in its own
//! paged block cache.
//!
//! # What this crate owns
//! - the forward arithmetic: embeddings, RMSNorm, RoPE (with linear, dynamic NTK, Llama 3
//!   and YaRN scaling), grouped-query causal attention (with an optional sliding window),
//!   the SwiGLU MLP and the logits;
//! - the weights: config.json / generation_config.json parsing and safetensors loading
//!   (one file or an index of shards), plus the checkpoint identity hash;
//! - text: the tokenizer (tokenizer.json) and the chat template (tokenizer_config.json);
//! - [`init_random`], a seeded random checkpoint for tests and benchmarks.
//!
//! # What it must never do
//! It knows no engine types (blocks, schedulers, requests beyond their KV bytes), does no
//! I/O beyond reading a model directory and writing one in [`init_random`], starts no
//! threads of its own beyond the compute backend's, and never sleeps.
//!
//! # The KV row layout (the contract with the engine)
//! One row per token position. A row is
//! `[layer][kv_head][K: head_dim values][V: head_dim values]`, each value in the compute
//! dtype's little-endian encoding: f32 on CPU (`dtype_bytes = 4`); on CUDA the checkpoint's
//! dtype (bf16/f16: 2). K is stored after RoPE. A row is [`KvLayout::row_bytes`] bytes,
//! so a chunk of r rows is `r * row_bytes` bytes and the first k rows of a block are its
//! first `k * row_bytes` bytes. [`Transformer::prefill`] takes the context as such chunks
//! and returns the new positions' rows; [`RequestKv::rows`] gives any range back (e.g. a
//! decoded token's row).
//!
//! Dynamic NTK scaling recomputes frequencies from the whole sequence length, so keys
//! cached before the sequence crossed `max_position_embeddings` keep the frequencies they
//! were computed with (as in every cached implementation).

mod attention;
mod chat;
mod config;
mod error;
mod kv;
mod model;
mod random;
mod rope;
mod text;
mod weights;

#[cfg(test)]
mod tests;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, GenerationConfig, RopeScaling, TransformerConfig};
pub use error::TransformerError;
pub use kv::{KvLayout, RequestKv};
pub use model::{ComputeDevice, Prefill, Transformer};
pub use random::{
    init_random, RandomModelSpec, WeightDtype, CHATML_TEMPLATE, RANDOM_VOCAB_SIZE, SPECIAL_TOKENS,
};
pub use text::TextTokenizer;
