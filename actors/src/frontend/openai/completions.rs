//! `POST /v1/completions`: the body read into prompts and a [`Generation`] (`prompt` as a
//! string, a list of strings, a list of token ids or a list of token-id lists; `max_tokens`
//! (default 16); integer `logprobs`; `echo`; `best_of` only equal to `n` or 1; `suffix`
//! refused), the choices submitted (choice index = prompt index * n + sample index), and
//! the answer rendered in the legacy `text_completion` shape, whole or streamed. It never
//! touches the engine beyond submitting and reading events.

use super::errors::ApiError;
use super::params::{check_prompt, shared, Body, Generation, MAX_CHOICES};
use super::run::{self, Accounting, Outcome, Tok};
use super::stream::{self, Envelope, Shape};
use crate::frontend::api::RequestLimits;
use crate::frontend::server::FrontendState;
use crate::frontend::text::TextCodec;
use actix_web::HttpResponse;
use serde_json::{json, Value};
use std::sync::Arc;

/// One prompt: its tokens and its text (what `echo` prepends).
#[derive(Clone, Debug, PartialEq)]
pub struct PromptIn {
    pub tokens: Vec<u32>,
    pub text: String,
}

/// A completion request, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionPlan {
    pub prompts: Vec<PromptIn>,
    pub generation: Generation,
    pub echo: bool,
}

/// Reads a completion body against the served model.
pub fn parse(
    bytes: &[u8],
    limits: &RequestLimits,
    codec: &dyn TextCodec,
    model: &str,
) -> Result<CompletionPlan, ApiError> {
    let mut body = Body::parse(bytes)?;
    let mut g = shared(&mut body, model)?;
    let prompt = body
        .take("prompt")
        .ok_or_else(|| ApiError::invalid("prompt", "prompt is required"))?;
    let prompts = prompts(prompt, codec)?;
    for p in &prompts {
        check_prompt(&p.tokens, limits, "prompt")?;
    }
    if prompts.len() * g.n as usize > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!("prompts x n must be at most {MAX_CHOICES}"),
        ));
    }
    g.max_tokens = body.u32("max_tokens")?.unwrap_or(16);
    g.logprobs = match body.u32("logprobs")? {
        None => None,
        Some(k) if k <= u32::from(messages::MAX_TOP_LOGPROBS) => Some(k as u8),
        Some(k) => {
            return Err(ApiError::invalid(
                "logprobs",
                format!(
                    "logprobs must be at most {}, got {k}",
                    messages::MAX_TOP_LOGPROBS
                ),
            ))
        }
    };
    let echo = body.bool("echo")?.unwrap_or(false);
    if echo && g.logprobs.is_some() {
        return Err(ApiError::unsupported(
            "echo",
            "echo with logprobs needs the prompt's log-probabilities, which are not computed",
        ));
    }
    if let Some(b) = body.u32("best_of")? {
        if b != 1 && b != g.n {
            return Err(ApiError::unsupported(
                "best_of",
                "only best_of equal to n (or 1) is accepted",
            ));
        }
    }
    body.refuse("suffix", "no insertion after the completion")?;
    body.finish()?;
    g.validate(limits, "max_tokens")?;
    Ok(CompletionPlan {
        prompts,
        generation: g,
        echo,
    })
}

fn prompts(v: Value, codec: &dyn TextCodec) -> Result<Vec<PromptIn>, ApiError> {
    let text = |s: String| -> Result<PromptIn, ApiError> {
        let tokens = codec
            .encode(&s)
            .map_err(|m| ApiError::invalid("prompt", format!("prompt: {m}")))?;
        Ok(PromptIn { tokens, text: s })
    };
    let ids = |a: &[Value]| -> Result<PromptIn, ApiError> {
        let tokens = a
            .iter()
            .map(|v| super::params::as_u32("prompt", v))
            .collect::<Result<Vec<u32>, _>>()?;
        let text = codec.decode(&tokens);
        Ok(PromptIn { tokens, text })
    };
    let shape = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
        )
    };
    match v {
        Value::String(s) => Ok(vec![text(s)?]),
        Value::Array(a) if a.is_empty() => {
            Err(ApiError::invalid("prompt", "prompt must not be empty"))
        }
        Value::Array(a) => match &a[0] {
            Value::String(_) => a
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => text(s),
                    _ => Err(shape()),
                })
                .collect(),
            Value::Number(_) => Ok(vec![ids(&a)?]),
            Value::Array(_) => a
                .iter()
                .map(|v| match v {
                    Value::Array(inner) => ids(inner),
                    _ => Err(shape()),
                })
                .collect(),
            _ => Err(shape()),
        },
        _ => Err(shape()),
    }
}

/// The legacy `logprobs` object of `tokens`, their text offsets counted from `offset`.
fn legacy_logprobs(codec: &dyn TextCodec, tokens: &[Tok], offset: &mut usize) -> Value {
    let mut texts = vec![];
    let mut lps = vec![];
    let mut tops = vec![];
    let mut offsets = vec![];
    for t in tokens {
        let s = codec.token_text(t.id);
        offsets.push(*offset);
        *offset += s.chars().count();
        texts.push(s);
        lps.push(t.logprobs.as_ref().map(|l| l.logprob()));
        let top: serde_json::Map<String, Value> = t
            .logprobs
            .iter()
            .flat_map(|l| l.top().collect::<Vec<_>>())
            .map(|(id, lp)| (codec.token_text(id), json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// `POST /v1/completions` once the body is read.
pub async fn handle(state: &FrontendState, bytes: &[u8]) -> HttpResponse {
    let plan = match parse(bytes, &state.limits, &*state.codec, &state.model) {
        Ok(p) => p,
        Err(e) => return e.response(),
    };
    let g = &plan.generation;
    let mut jobs = vec![];
    for p in &plan.prompts {
        for j in 0..g.n {
            jobs.push((p.tokens.clone(), g.sampling(j)));
        }
    }
    let count = jobs.len();
    let receivers = match state.submit_all(jobs, g.max_tokens) {
        Ok(r) => r,
        Err(e) => return e.response(),
    };
    let pieces = run::pieces(receivers, state.codec.clone(), state.stops(g));
    let accounting = Accounting {
        prompt_tokens: plan.prompts.iter().map(|p| p.tokens.len() as u32).collect(),
        n: g.n,
    };
    let id = run::request_id("cmpl");
    let created = run::now_secs();
    let echoes: Vec<String> = plan
        .prompts
        .iter()
        .flat_map(|p| (0..g.n).map(move |_| p.text.clone()))
        .collect();
    if g.stream {
        let shape = Chunks {
            codec: state.codec.clone(),
            echo: plan.echo,
            echoes,
            offsets: vec![0; count],
            logprobs: g.logprobs.is_some(),
        };
        let envelope = Envelope {
            id,
            object: "text_completion",
            created,
            model: state.model.clone(),
        };
        return stream::respond(shape, envelope, pieces, accounting, g.include_usage);
    }
    let outcomes = match run::collect(pieces, count).await {
        Ok(o) => o,
        Err(e) => return e.response(),
    };
    let finished: Vec<_> = outcomes
        .iter()
        .map(|o| (o.output.len() as u32, o.usage))
        .collect();
    let choices: Vec<Value> = outcomes
        .iter()
        .zip(echoes)
        .enumerate()
        .map(|(i, (o, echo))| choice(&*state.codec, i, o, plan.echo.then_some(echo), g))
        .collect();
    let first = outcomes
        .first()
        .map(|o| run::tsl3(o.usage, &o.output))
        .unwrap_or_default();
    HttpResponse::Ok().json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": state.model,
        "choices": choices,
        "usage": accounting.usage(&finished),
        "tsl3": first,
    }))
}

fn choice(
    codec: &dyn TextCodec,
    index: usize,
    o: &Outcome,
    echo: Option<String>,
    g: &Generation,
) -> Value {
    let logprobs = g
        .logprobs
        .map(|_| legacy_logprobs(codec, &o.tokens, &mut 0));
    let text = match echo {
        Some(e) => format!("{e}{}", o.text),
        None => o.text.clone(),
    };
    json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": o.finish_reason})
}

/// The streamed choice objects of a completion.
struct Chunks {
    codec: Arc<dyn TextCodec>,
    echo: bool,
    echoes: Vec<String>,
    offsets: Vec<usize>,
    logprobs: bool,
}

impl Shape for Chunks {
    fn opening(&mut self, index: u32) -> Option<Value> {
        let text = self.echoes.get(index as usize).filter(|_| self.echo)?;
        Some(json!({"index": index, "text": text, "logprobs": null, "finish_reason": null}))
    }
    fn text(&mut self, index: u32, text: &str, tokens: &[Tok]) -> Value {
        let logprobs = match self.offsets.get_mut(index as usize) {
            Some(off) if self.logprobs => legacy_logprobs(&*self.codec, tokens, off),
            _ => Value::Null,
        };
        json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": null})
    }
    fn finish(&mut self, index: u32, reason: &str) -> Value {
        json!({"index": index, "text": "", "logprobs": null, "finish_reason": reason})
    }
}
