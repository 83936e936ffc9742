//! One request's choices in flight: each choice (a prompt and a sample) is its own
//! [`Submission`]; its token events become [`Piece`]s — text deltas (held back across an
//! incomplete UTF-8 sequence or a possible stop string), then one finish — and the
//! choices' pieces are merged as they come. A choice that meets a stop string, a stop
//! token id or an end-of-sequence token finishes with `"stop"` and drops its event
//! receiver, which cancels its engine request. It never renders JSON for the client
//! (completions.rs and chat.rs do) and never blocks.

use super::errors::ApiError;
use crate::frontend::api::PrefixUsage;
use crate::frontend::text::{TextCodec, TextStream};
use crate::frontend::TokenEvent;
use futures::stream::{BoxStream, SelectAll, StreamExt};
use messages::TokenLogprobs;
use serde_json::{json, Value};
use std::sync::Arc;

/// One output token and its log-probabilities (when asked for).
#[derive(Clone, Debug, PartialEq)]
pub struct Tok {
    pub id: u32,
    pub logprobs: Option<TokenLogprobs>,
}

/// What a choice yields as its events arrive.
#[derive(Debug)]
pub enum Piece {
    /// New text of choice `index`, with the tokens it came from (tokens whose text is held
    /// back ride a later piece).
    Text {
        index: u32,
        text: String,
        tokens: Vec<Tok>,
    },
    /// Choice `index` is finished. `usage` is the engine's tier split, unknown (None) when
    /// the choice stopped early and its request was cancelled; `output` is every token it
    /// produced (a stop token included).
    Finish {
        index: u32,
        reason: &'static str,
        usage: Option<PrefixUsage>,
        output: Vec<u32>,
    },
    Failed(ApiError),
}

/// What ends a choice with `"stop"`.
#[derive(Debug, Default)]
pub struct Stops {
    pub strings: Vec<String>,
    /// The request's stop token ids and the model's end-of-sequence tokens.
    pub token_ids: Vec<u32>,
    /// The choice's `max_tokens`: a stop at the last allowed token cancels nothing (the
    /// engine finishes the request with it), so the choice waits for the engine's finish
    /// and keeps its tier split.
    pub max_tokens: u32,
}

/// The merged pieces of every choice of one request.
pub type Pieces = SelectAll<BoxStream<'static, Piece>>;

/// One choice's state between events.
struct ChoiceRun {
    index: u32,
    /// None once finished: dropping it cancels the engine request.
    rx: Option<flume::Receiver<TokenEvent>>,
    codec: Arc<dyn TextCodec>,
    stops: Arc<Stops>,
    text: TextStream,
    pending: Vec<Tok>,
    output: Vec<u32>,
    /// A stop met at the last allowed token: the finish (with usage) comes from the
    /// engine's Done, with reason "stop".
    stopped_last: bool,
}

impl ChoiceRun {
    /// A stop was met: finish now (cancelling the engine request), or, at the last allowed
    /// token, wait for the engine's Done to finish with its usage.
    fn stop(&mut self, v: &mut Vec<Piece>) {
        if self.output.len() as u32 >= self.stops.max_tokens {
            self.stopped_last = true;
        } else {
            v.extend(self.finish("stop", None));
        }
    }

    async fn next(mut self) -> Option<(Vec<Piece>, Self)> {
        let ev = self.rx.as_ref()?.recv_async().await;
        let pieces = match ev {
            Ok(TokenEvent::Token(_, _)) if self.stopped_last => vec![],
            Ok(TokenEvent::Token(id, logprobs)) => {
                self.output.push(id);
                if self.stops.token_ids.contains(&id) {
                    let step = self.text.step(&*self.codec, &self.stops.strings, true);
                    let mut v = self.flush(step.delta);
                    self.stop(&mut v);
                    v
                } else {
                    self.text.push(id);
                    self.pending.push(Tok { id, logprobs });
                    let step = self.text.step(&*self.codec, &self.stops.strings, false);
                    let mut v = self.flush(step.delta);
                    if step.stopped {
                        self.stop(&mut v);
                    }
                    v
                }
            }
            Ok(TokenEvent::Done {
                usage,
                finish_reason,
            }) => {
                let step = if self.stopped_last {
                    Default::default()
                } else {
                    self.text.step(&*self.codec, &self.stops.strings, true)
                };
                let mut v = self.flush(step.delta);
                let reason = if step.stopped || self.stopped_last {
                    "stop"
                } else {
                    finish_reason
                };
                v.extend(self.finish(reason, Some(usage)));
                v
            }
            Ok(TokenEvent::Failed(m)) => {
                self.rx = None;
                vec![Piece::Failed(ApiError::unavailable(
                    "engine_unavailable",
                    m,
                ))]
            }
            Err(_) => {
                self.rx = None;
                vec![Piece::Failed(ApiError::unavailable(
                    "engine_error",
                    "the engine stopped before the request finished",
                ))]
            }
        };
        Some((pieces, self))
    }

    fn flush(&mut self, delta: String) -> Vec<Piece> {
        if delta.is_empty() {
            return vec![];
        }
        vec![Piece::Text {
            index: self.index,
            text: delta,
            tokens: std::mem::take(&mut self.pending),
        }]
    }

    fn finish(&mut self, reason: &'static str, usage: Option<PrefixUsage>) -> Vec<Piece> {
        self.rx = None;
        let mut v = vec![];
        if !self.pending.is_empty() {
            v.push(Piece::Text {
                index: self.index,
                text: String::new(),
                tokens: std::mem::take(&mut self.pending),
            });
        }
        v.push(Piece::Finish {
            index: self.index,
            reason,
            usage,
            output: std::mem::take(&mut self.output),
        });
        v
    }
}

/// The merged pieces of the choices whose event receivers are `receivers` (choice index =
/// position).
pub fn pieces(
    receivers: Vec<flume::Receiver<TokenEvent>>,
    codec: Arc<dyn TextCodec>,
    stops: Stops,
) -> Pieces {
    let stops = Arc::new(stops);
    futures::stream::select_all(receivers.into_iter().enumerate().map(|(i, rx)| {
        let run = ChoiceRun {
            index: i as u32,
            rx: Some(rx),
            codec: codec.clone(),
            stops: stops.clone(),
            text: TextStream::default(),
            pending: vec![],
            output: vec![],
            stopped_last: false,
        };
        futures::stream::unfold(run, ChoiceRun::next)
            .flat_map(futures::stream::iter)
            .boxed()
    }))
}

/// A finished choice, collected whole (the non-streamed answer).
#[derive(Debug, Default)]
pub struct Outcome {
    pub text: String,
    /// The tokens of `text`, with their log-probabilities.
    pub tokens: Vec<Tok>,
    pub output: Vec<u32>,
    pub finish_reason: &'static str,
    pub usage: Option<PrefixUsage>,
}

/// Every choice run to its end; the first failure fails the request (and drops the other
/// choices' receivers, cancelling them).
pub async fn collect(mut pieces: Pieces, count: usize) -> Result<Vec<Outcome>, ApiError> {
    let mut out: Vec<Outcome> = (0..count).map(|_| Outcome::default()).collect();
    while let Some(p) = pieces.next().await {
        match p {
            Piece::Text {
                index,
                text,
                tokens,
            } => {
                if let Some(o) = out.get_mut(index as usize) {
                    o.text.push_str(&text);
                    o.tokens.extend(tokens);
                }
            }
            Piece::Finish {
                index,
                reason,
                usage,
                output,
            } => {
                if let Some(o) = out.get_mut(index as usize) {
                    o.finish_reason = reason;
                    o.usage = usage;
                    o.output = output;
                }
            }
            Piece::Failed(e) => return Err(e),
        }
    }
    Ok(out)
}

/// How a request's prompts and samples map to choices, for its usage.
#[derive(Clone, Debug)]
pub struct Accounting {
    /// Each prompt's length; choice `i * n + j` is sample `j` of prompt `i`.
    pub prompt_tokens: Vec<u32>,
    pub n: u32,
}

impl Accounting {
    /// OpenAI's `usage`: each prompt counted once, every choice's tokens, and as cached the
    /// tiers' tokens of each prompt's first sample (unknown counts as 0).
    pub fn usage(&self, finished: &[(u32, Option<PrefixUsage>)]) -> Value {
        let prompt: u32 = self.prompt_tokens.iter().sum();
        let completion: u32 = finished.iter().map(|(n, _)| n).sum();
        let cached: u32 = (0..self.prompt_tokens.len())
            .filter_map(|i| finished.get(i * self.n as usize))
            .filter_map(|(_, u)| u.map(|u| u.cached()))
            .sum();
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }
}

/// The `tsl3` object of one choice: where its prefix came from and its output tokens (the
/// tier split is null for a choice cancelled at a stop before the engine reported it).
pub fn tsl3(usage: Option<PrefixUsage>, output: &[u32]) -> Value {
    json!({
        "device": usage.map(|u| u.device),
        "host": usage.map(|u| u.host),
        "l3": usage.map(|u| u.l3),
        "computed": usage.map(|u| u.computed),
        "fallback_reason": usage.map(|u| u.fallback_reason),
        "output_tokens": output,
    })
}

/// `cmpl-`/`chatcmpl-` and 96 random bits in hex: unique across processes.
pub fn request_id(prefix: &str) -> String {
    let bits = rand::random::<u128>() & ((1u128 << 96) - 1);
    format!("{prefix}-{bits:024x}")
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
