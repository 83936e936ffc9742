//! `POST /v1/chat/completions`: `messages` (roles system, user, assistant; `content` a
//! string or a list of `{type: "text", text}` parts) rendered through the codec's chat
//! template to one prompt, `max_completion_tokens` / `max_tokens` (default: the most the
//! server allows), boolean `logprobs` with `top_logprobs`, and the shared parameters;
//! `tools`, `tool_choice` (other than "none"), `functions`, `function_call` and a
//! `response_format` other than text are refused. The answer is `chat.completion`, or
//! `chat.completion.chunk`s whose first delta is the assistant role. It never touches the
//! engine beyond submitting and reading events.

use super::errors::ApiError;
use super::params::{check_prompt, shared, Body, Generation};
use super::run::{self, Accounting, Tok};
use super::stream::{self, Envelope, Shape};
use crate::frontend::api::RequestLimits;
use crate::frontend::server::FrontendState;
use crate::frontend::text::{ChatMessage, TextCodec};
use actix_web::HttpResponse;
use serde_json::{json, Value};
use std::sync::Arc;

/// A chat request, read and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatPlan {
    pub prompt: Vec<u32>,
    pub generation: Generation,
}

fn messages(v: Value) -> Result<Vec<ChatMessage>, ApiError> {
    let Value::Array(list) = v else {
        return Err(ApiError::invalid("messages", "messages must be a list"));
    };
    if list.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |k: &str| format!("messages[{i}].{k}");
            let Value::Object(mut m) = m else {
                return Err(ApiError::invalid(
                    format!("messages[{i}]"),
                    format!("messages[{i}] must be an object"),
                ));
            };
            let role = match m.remove("role") {
                Some(Value::String(r)) if ["system", "user", "assistant"].contains(&r.as_str()) => r,
                _ => {
                    return Err(ApiError::invalid(
                        at("role"),
                        format!("{} must be one of system, user, assistant", at("role")),
                    ))
                }
            };
            let content = match m.remove("content") {
                Some(Value::String(s)) => s,
                Some(Value::Array(parts)) => {
                    let mut s = String::new();
                    for p in parts {
                        match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(t)) => s.push_str(t),
                            _ => {
                                return Err(ApiError::unsupported(
                                    &at("content"),
                                    "only text parts ({\"type\": \"text\", \"text\": ...}) are accepted",
                                ))
                            }
                        }
                    }
                    s
                }
                _ => {
                    return Err(ApiError::invalid(
                        at("content"),
                        format!("{} must be a string or a list of text parts", at("content")),
                    ))
                }
            };
            // `name` has no effect on the template; anything else is refused by name.
            m.remove("name");
            if let Some(k) = m.keys().next() {
                return Err(ApiError::unsupported(&at(k), "not accepted in a message"));
            }
            Ok(ChatMessage { role, content })
        })
        .collect()
}

/// Reads a chat body against the served model.
pub fn parse(
    bytes: &[u8],
    limits: &RequestLimits,
    codec: &dyn TextCodec,
    model: &str,
) -> Result<ChatPlan, ApiError> {
    let mut body = Body::parse(bytes)?;
    let mut g = shared(&mut body, model)?;
    let msgs = messages(
        body.take("messages")
            .ok_or_else(|| ApiError::invalid("messages", "messages is required"))?,
    )?;
    let text = codec
        .chat_prompt(&msgs)
        .map_err(|m| ApiError::invalid("messages", format!("the chat template: {m}")))?;
    let prompt = codec
        .encode_chat(&text)
        .map_err(|m| ApiError::invalid("messages", format!("messages: {m}")))?;
    check_prompt(&prompt, limits, "messages")?;
    let max_key = if body.has("max_completion_tokens") {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let a = body.u32("max_completion_tokens")?;
    let b = body.u32("max_tokens")?;
    g.max_tokens = a.or(b).unwrap_or(limits.max_output_tokens);
    let logprobs = body.bool("logprobs")?.unwrap_or(false);
    let top = body.u32("top_logprobs")?;
    g.logprobs = match (logprobs, top) {
        (false, None) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs set to true",
            ))
        }
        (true, k) => {
            let k = k.unwrap_or(0);
            if k > u32::from(messages::MAX_TOP_LOGPROBS) {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!(
                        "top_logprobs must be at most {}, got {k}",
                        messages::MAX_TOP_LOGPROBS
                    ),
                ));
            }
            Some(k as u8)
        }
    };
    match body.take("response_format") {
        None => {}
        Some(v)
            if v.get("type").and_then(Value::as_str) == Some("text")
                && v.as_object().is_some_and(|o| o.len() == 1) => {}
        Some(_) => {
            return Err(ApiError::unsupported(
                "response_format",
                "only {\"type\": \"text\"} is accepted",
            ))
        }
    }
    match body.take("tool_choice") {
        None => {}
        Some(Value::String(s)) if s == "none" => {}
        Some(_) => return Err(ApiError::unsupported("tool_choice", "no tool calling")),
    }
    body.refuse("tools", "no tool calling")?;
    body.refuse("functions", "no function calling")?;
    body.refuse("function_call", "no function calling")?;
    body.refuse("parallel_tool_calls", "no tool calling")?;
    match body.take("store") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => return Err(ApiError::unsupported("store", "completions are not stored")),
    }
    body.finish()?;
    g.validate(limits, max_key)?;
    Ok(ChatPlan {
        prompt,
        generation: g,
    })
}

/// The chat `logprobs` entries of `tokens`.
fn content_logprobs(codec: &dyn TextCodec, tokens: &[Tok]) -> Vec<Value> {
    let entry = |id: u32, lp: f32| {
        let s = codec.token_text(id);
        json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})
    };
    tokens
        .iter()
        .map(|t| {
            let (lp, top) = match &t.logprobs {
                Some(l) => (l.logprob(), l.top().map(|(id, lp)| entry(id, lp)).collect()),
                None => (0.0, vec![]),
            };
            let mut e = entry(t.id, lp);
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect()
}

/// `POST /v1/chat/completions` once the body is read.
pub async fn handle(state: &FrontendState, bytes: &[u8]) -> HttpResponse {
    let plan = match parse(bytes, &state.limits, &*state.codec, &state.model) {
        Ok(p) => p,
        Err(e) => return e.response(),
    };
    let g = &plan.generation;
    let jobs: Vec<_> = (0..g.n)
        .map(|j| (plan.prompt.clone(), g.sampling(j)))
        .collect();
    let count = jobs.len();
    let receivers = match state.submit_all(jobs, g.max_tokens) {
        Ok(r) => r,
        Err(e) => return e.response(),
    };
    let pieces = run::pieces(receivers, state.codec.clone(), state.stops(g));
    let accounting = Accounting {
        prompt_tokens: vec![plan.prompt.len() as u32],
        n: g.n,
    };
    let id = run::request_id("chatcmpl");
    let created = run::now_secs();
    if g.stream {
        let shape = Deltas {
            codec: state.codec.clone(),
            logprobs: g.logprobs.is_some(),
        };
        let envelope = Envelope {
            id,
            object: "chat.completion.chunk",
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
        .enumerate()
        .map(|(i, o)| {
            let logprobs = g
                .logprobs
                .map(|_| json!({"content": content_logprobs(&*state.codec, &o.tokens)}));
            json!({
                "index": i,
                "message": {"role": "assistant", "content": o.text},
                "logprobs": logprobs,
                "finish_reason": o.finish_reason,
            })
        })
        .collect();
    let first = outcomes
        .first()
        .map(|o| run::tsl3(o.usage, &o.output))
        .unwrap_or_default();
    HttpResponse::Ok().json(json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": state.model,
        "choices": choices,
        "usage": accounting.usage(&finished),
        "tsl3": first,
    }))
}

/// The streamed choice objects of a chat.
struct Deltas {
    codec: Arc<dyn TextCodec>,
    logprobs: bool,
}

impl Shape for Deltas {
    fn opening(&mut self, index: u32) -> Option<Value> {
        Some(json!({
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": null,
            "finish_reason": null,
        }))
    }
    fn text(&mut self, index: u32, text: &str, tokens: &[Tok]) -> Value {
        let logprobs = if self.logprobs {
            json!({"content": content_logprobs(&*self.codec, tokens)})
        } else {
            Value::Null
        };
        json!({"index": index, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": null})
    }
    fn finish(&mut self, index: u32, reason: &str) -> Value {
        json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason})
    }
}
