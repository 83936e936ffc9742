//! Reading a request body: a JSON object whose every key is either taken by the endpoint
//! or refused by name ([`Body`]), and the parameters the completion and chat endpoints
//! share ([`Generation`]: `model`, `n`, `stream`, `stream_options`, `stop`,
//! `stop_token_ids`, `temperature`, `top_p`, `top_k`, `seed`, and the no-effect or
//! neutral-only keys). It never guesses: a value of the wrong type, out of range or not
//! honoured is a 400 naming the parameter, and an unknown key is a 400 naming the key.

use super::errors::ApiError;
use crate::frontend::api::RequestLimits;
use messages::SamplingParams;
use serde_json::{Map, Value};

/// The most choices (prompts x n) one request may ask for.
pub const MAX_CHOICES: usize = 64;

/// The most stop strings (and stop token ids) one request may give.
pub const MAX_STOPS: usize = 16;

/// A request body as a JSON object; keys are taken as they are read, and whatever is left
/// at the end is refused.
#[derive(Debug)]
pub struct Body {
    map: Map<String, Value>,
}

impl Body {
    pub fn parse(bytes: &[u8]) -> Result<Body, ApiError> {
        let v: Value = serde_json::from_slice(bytes)
            .map_err(|e| ApiError::bad_request(format!("bad JSON: {e}")))?;
        match v {
            Value::Object(map) => Ok(Body { map }),
            _ => Err(ApiError::bad_request(
                "the request body must be a JSON object",
            )),
        }
    }

    /// The value of `key`, removed; an explicit `null` reads as absent.
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is given (not null); nothing is taken.
    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ApiError> {
        self.take(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| ApiError::invalid(key, format!("{key} must be a boolean")))
            })
            .transpose()
    }

    pub fn u32(&mut self, key: &str) -> Result<Option<u32>, ApiError> {
        self.take(key).map(|v| as_u32(key, &v)).transpose()
    }

    pub fn f32(&mut self, key: &str) -> Result<Option<f32>, ApiError> {
        self.take(key)
            .map(|v| {
                v.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| ApiError::invalid(key, format!("{key} must be a number")))
            })
            .transpose()
    }

    /// A key accepted only at the value that changes nothing (a penalty of 0, ...).
    pub fn neutral_number(&mut self, key: &str, neutral: f64) -> Result<(), ApiError> {
        match self.take(key) {
            None => Ok(()),
            Some(v) if v.as_f64() == Some(neutral) => Ok(()),
            Some(v) => Err(ApiError::unsupported(
                key,
                &format!("only {neutral} is accepted, got {v}"),
            )),
        }
    }

    /// A key refused whenever it is given (not null).
    pub fn refuse(&mut self, key: &str, why: &str) -> Result<(), ApiError> {
        match self.take(key) {
            None => Ok(()),
            Some(_) => Err(ApiError::unsupported(key, why)),
        }
    }

    /// Every key left is unknown: the first (in name order) is refused.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.map.keys().min() {
            Some(k) => Err(ApiError::unknown(k)),
            None => Ok(()),
        }
    }
}

pub fn as_u32(key: &str, v: &Value) -> Result<u32, ApiError> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| ApiError::invalid(key, format!("{key} must be a non-negative integer")))
}

/// The parameters both endpoints share, and how each choice is sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub n: u32,
    pub max_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: Option<u64>,
    /// Some(k): the chosen token's log-probability and the k most likely.
    pub logprobs: Option<u8>,
}

impl Generation {
    /// Sample `j` of a prompt: seed `seed + j` when the request has a seed, a random one
    /// otherwise.
    pub fn sampling(&self, j: u32) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: match self.seed {
                Some(s) => s.wrapping_add(u64::from(j)),
                None => rand::random(),
            },
            logprobs: self.logprobs,
        }
    }

    /// The checks that need the endpoint's own fields (`max_tokens`, `logprobs`).
    pub fn validate(&self, limits: &RequestLimits, max_tokens_key: &str) -> Result<(), ApiError> {
        if self.max_tokens == 0 {
            return Err(ApiError::invalid(
                max_tokens_key,
                format!("{max_tokens_key} must be at least 1"),
            ));
        }
        if self.max_tokens > limits.max_output_tokens {
            return Err(ApiError::invalid(
                max_tokens_key,
                format!(
                    "{max_tokens_key} must be at most {}",
                    limits.max_output_tokens
                ),
            ));
        }
        let probe = SamplingParams {
            seed: 0,
            ..self.sampling(0)
        };
        probe.validate().map_err(|m| {
            let param = m.split_whitespace().next().unwrap_or("").to_string();
            ApiError::invalid(param, m)
        })
    }
}

/// Reads the shared parameters (and checks `model` against the served id). `max_tokens`
/// and `logprobs` are left to the endpoint.
pub fn shared(body: &mut Body, served_model: &str) -> Result<Generation, ApiError> {
    if let Some(m) = body.take("model") {
        let m = m
            .as_str()
            .ok_or_else(|| ApiError::invalid("model", "model must be a string"))?;
        if m != served_model {
            return Err(ApiError::model_not_found(m));
        }
    }
    let n = body.u32("n")?.unwrap_or(1);
    if n == 0 || n as usize > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!("n must be between 1 and {MAX_CHOICES}"),
        ));
    }
    let stream = body.bool("stream")?.unwrap_or(false);
    let include_usage = match body.take("stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options is only allowed when stream is true",
            ))
        }
        Some(Value::Object(mut o)) => {
            let usage = match o.remove("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "stream_options.include_usage",
                        "stream_options.include_usage must be a boolean",
                    ))
                }
            };
            if let Some(k) = o.keys().next() {
                return Err(ApiError::unknown(&format!("stream_options.{k}")));
            }
            usage
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options must be an object",
            ))
        }
    };
    let stop = match body.take("stop") {
        None => vec![],
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(a)) => a
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid(
                    "stop",
                    "stop must be a string or a list of strings",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or a list of strings",
            ))
        }
    };
    if stop.len() > MAX_STOPS || stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid(
            "stop",
            format!("stop takes at most {MAX_STOPS} non-empty strings"),
        ));
    }
    let stop_token_ids = match body.take("stop_token_ids") {
        None => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| as_u32("stop_token_ids", v))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop_token_ids",
                "stop_token_ids must be a list of token ids",
            ))
        }
    };
    if stop_token_ids.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop_token_ids",
            format!("stop_token_ids takes at most {MAX_STOPS} ids"),
        ));
    }
    let temperature = body.f32("temperature")?.unwrap_or(1.0);
    let top_p = body.f32("top_p")?.unwrap_or(1.0);
    let top_k = match body.take("top_k") {
        None => 0,
        Some(v) => match v.as_i64() {
            Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => {
                u32::try_from(k).map_err(|_| ApiError::invalid("top_k", "top_k is too large"))?
            }
            _ => {
                return Err(ApiError::invalid(
                    "top_k",
                    "top_k must be -1 or 0 (all tokens) or a positive integer",
                ))
            }
        },
    };
    let seed = body
        .take("seed")
        .map(|v| {
            v.as_u64()
                .or_else(|| v.as_i64().map(|i| i as u64))
                .ok_or_else(|| ApiError::invalid("seed", "seed must be an integer"))
        })
        .transpose()?;
    // Keys with no effect here, or accepted only at their neutral value.
    let _ = body.take("user");
    body.neutral_number("presence_penalty", 0.0)?;
    body.neutral_number("frequency_penalty", 0.0)?;
    body.neutral_number("repetition_penalty", 1.0)?;
    match body.take("logit_bias") {
        Some(Value::Object(o)) if o.is_empty() => {}
        None => {}
        Some(_) => return Err(ApiError::unsupported("logit_bias", "no bias is applied")),
    }
    Ok(Generation {
        n,
        max_tokens: 0,
        stream,
        include_usage,
        stop,
        stop_token_ids,
        temperature,
        top_p,
        top_k,
        seed,
        logprobs: None,
    })
}

/// A prompt's tokens checked against the limits (`param` names the field).
pub fn check_prompt(tokens: &[u32], limits: &RequestLimits, param: &str) -> Result<(), ApiError> {
    if tokens.is_empty() {
        return Err(ApiError::invalid(
            param,
            format!("{param} must not be empty"),
        ));
    }
    if tokens.len() > limits.max_prompt_tokens {
        return Err(ApiError::invalid(
            param,
            format!(
                "{param} has {} tokens; the cache groups hold at most {}",
                tokens.len(),
                limits.max_prompt_tokens
            ),
        ));
    }
    if let Some(t) = tokens.iter().find(|t| **t >= limits.vocab_size) {
        return Err(ApiError::invalid(
            param,
            format!(
                "token id {t} is outside the vocabulary (size {})",
                limits.vocab_size
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Body {
        Body::parse(json.as_bytes()).unwrap()
    }

    #[test]
    fn bodies_must_be_objects_and_unknown_keys_are_named() {
        assert!(Body::parse(b"{nope")
            .unwrap_err()
            .message
            .contains("bad JSON"));
        assert!(Body::parse(b"[1]").unwrap_err().message.contains("object"));
        let mut b = body(r#"{"zeta":1,"alpha":2,"n":1}"#);
        assert_eq!(b.u32("n").unwrap(), Some(1));
        let e = b.finish().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("alpha"));
        assert!(e.message.contains("alpha"));
    }

    #[test]
    fn shared_parameters_read_and_refuse_by_name() {
        let g = shared(
            &mut body(r#"{"model":"m","n":2,"stop":"x","seed":7,"top_k":-1,"temperature":0}"#),
            "m",
        )
        .unwrap();
        assert_eq!(
            (g.n, g.stop.clone(), g.seed, g.top_k),
            (2, vec!["x".into()], Some(7), 0)
        );
        assert_eq!(g.sampling(1).seed, 8);
        assert_eq!(g.sampling(1).temperature, 0.0);
        let err = |j: &str| shared(&mut body(j), "m").unwrap_err();
        assert_eq!(err(r#"{"model":"other"}"#).code, Some("model_not_found"));
        assert_eq!(err(r#"{"n":0}"#).param.as_deref(), Some("n"));
        assert_eq!(
            err(r#"{"presence_penalty":0.5}"#).param.as_deref(),
            Some("presence_penalty")
        );
        assert_eq!(
            err(r#"{"logit_bias":{"1":2}}"#).param.as_deref(),
            Some("logit_bias")
        );
        assert_eq!(
            err(r#"{"stream_options":{"include_usage":true}}"#)
                .param
                .as_deref(),
            Some("stream_options")
        );
        assert_eq!(err(r#"{"stop":[""]}"#).param.as_deref(), Some("stop"));
        assert!(shared(&mut body(r#"{"presence_penalty":0,"user":"u"}"#), "m").is_ok());
    }

    #[test]
    fn sampling_ranges_name_the_parameter() {
        let limits = RequestLimits {
            max_prompt_tokens: 8,
            max_output_tokens: 4,
            vocab_size: 256,
        };
        let mut g = shared(&mut body(r#"{"temperature":3}"#), "m").unwrap();
        g.max_tokens = 1;
        assert_eq!(
            g.validate(&limits, "max_tokens")
                .unwrap_err()
                .param
                .as_deref(),
            Some("temperature")
        );
        g.temperature = 1.0;
        g.max_tokens = 5;
        assert!(g
            .validate(&limits, "max_tokens")
            .unwrap_err()
            .message
            .contains("at most 4"));
        // Without a seed every sample draws its own.
        g.seed = None;
        assert_ne!(g.sampling(0).seed, g.sampling(0).seed);
    }
}
