//! The OpenAI-compatible API of the leader: `GET /v1/models`, `GET /v1/models/{id}`,
//! `POST /v1/completions` and `POST /v1/chat/completions`, the shape a client such as the
//! `openai` Python package expects. It owns reading the bodies (every key either honoured
//! or refused with a 400 naming it in `param` and the message, never ignored), turning
//! each choice into an engine [`Submission`](crate::frontend::Submission), stop handling
//! and rendering (whole or as server-sent events). It never touches the cache, storage or
//! the device, and never blocks the round loop.
//!
//! Accepted by both generating endpoints: `model` (must be the served id, else 404
//! `model_not_found`), `n` (1..=64; prompts x n at most 64), `stream`,
//! `stream_options.include_usage` (only with `stream`), `stop` (a string or up to 16),
//! `stop_token_ids` (vLLM), `temperature` (default 1; 0 is greedy), `top_p`, `top_k`
//! (vLLM; -1 or 0: all), `seed` (sample j uses seed + j; without one each sample gets a
//! random seed). Accepted with no effect: `user`; at their neutral value only:
//! `presence_penalty` 0, `frequency_penalty` 0, `repetition_penalty` 1, `logit_bias` {}.
//! Completions also: `prompt`, `max_tokens` (default 16), `logprobs` (0..=20, the legacy
//! shape), `echo` (not with `logprobs`), `best_of` (1 or n); `suffix` is refused. Chat
//! also: `messages` (text content only; `name` accepted with no effect),
//! `max_completion_tokens` / `max_tokens` (default: the server's output limit),
//! `logprobs` (bool) + `top_logprobs` (0..=20), `response_format` `{"type": "text"}`,
//! `tool_choice` "none", `store` false; `tools`, `functions`, `function_call`,
//! `parallel_tool_calls` are refused. Any other key is a 400 `unknown_parameter`.
//!
//! Every choice finishes with `"length"` at `max_tokens`, or `"stop"` at a stop string
//! (not included in the text), a stop token id or an end-of-sequence token of the codec;
//! a stopped choice's engine request is cancelled (its receiver dropped), so its `tsl3`
//! tier split is null.

pub mod chat;
pub mod completions;
pub mod errors;
pub mod models;
pub mod params;
pub mod run;
pub mod stream;

pub use errors::ApiError;
#[cfg(test)]
mod tests;
