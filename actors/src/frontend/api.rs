//! The OpenAI-compatible request and response shapes of `POST /v1/completions`, and their
//! validation. Pure: no I/O. A bad request becomes a `BadRequest` with a message, never a
//! panic.

use serde::{Deserialize, Serialize};

/// `prompt` as text (one token per UTF-8 byte) or as an array of token ids.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default)]
    pub stream: bool,
}

fn default_max_tokens() -> u32 {
    16
}

/// Limits the frontend enforces before a request enters the round.
#[derive(Clone, Debug)]
pub struct RequestLimits {
    /// The longest prompt every cache group can hold.
    pub max_prompt_tokens: usize,
    pub max_output_tokens: u32,
    pub vocab_size: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl CompletionRequest {
    /// The prompt's token ids, checked against the limits.
    pub fn tokens(&self, limits: &RequestLimits) -> Result<Vec<u32>, BadRequest> {
        let tokens: Vec<u32> = match &self.prompt {
            Prompt::Text(t) => t.bytes().map(u32::from).collect(),
            Prompt::Tokens(t) => t.clone(),
        };
        if tokens.is_empty() {
            return Err(BadRequest("prompt must not be empty".into()));
        }
        if tokens.len() > limits.max_prompt_tokens {
            return Err(BadRequest(format!(
                "prompt has {} tokens; the cache groups hold at most {}",
                tokens.len(),
                limits.max_prompt_tokens
            )));
        }
        if let Some(t) = tokens.iter().find(|t| **t >= limits.vocab_size) {
            return Err(BadRequest(format!(
                "token id {t} is outside the vocabulary (size {})",
                limits.vocab_size
            )));
        }
        if self.max_tokens == 0 {
            return Err(BadRequest("max_tokens must be at least 1".into()));
        }
        if self.max_tokens > limits.max_output_tokens {
            return Err(BadRequest(format!(
                "max_tokens must be at most {}",
                limits.max_output_tokens
            )));
        }
        Ok(tokens)
    }
}

/// Why a request did not reuse a full prefix from L3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FallbackReason {
    None,
    Miss,
    Partial,
    Deadline,
    Pressure,
    Unhealthy,
    Quarantine,
    Disabled,
}

impl FallbackReason {
    pub const ALL: [FallbackReason; 8] = [
        FallbackReason::None,
        FallbackReason::Miss,
        FallbackReason::Partial,
        FallbackReason::Deadline,
        FallbackReason::Pressure,
        FallbackReason::Unhealthy,
        FallbackReason::Quarantine,
        FallbackReason::Disabled,
    ];
    pub fn as_str(&self) -> &'static str {
        match self {
            FallbackReason::None => "none",
            FallbackReason::Miss => "miss",
            FallbackReason::Partial => "partial",
            FallbackReason::Deadline => "deadline",
            FallbackReason::Pressure => "pressure",
            FallbackReason::Unhealthy => "unhealthy",
            FallbackReason::Quarantine => "quarantine",
            FallbackReason::Disabled => "disabled",
        }
    }
}

/// Where the reused prefix came from, and what was computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefixUsage {
    pub device: u32,
    pub host: u32,
    pub l3: u32,
    pub computed: u32,
    pub fallback_reason: FallbackReason,
}

impl PrefixUsage {
    pub fn cached(&self) -> u32 {
        self.device + self.host + self.l3
    }
}

/// Renders an output token as text (printable ASCII, deterministic).
pub fn token_text(t: u32) -> char {
    char::from(b'!' + (t % 94) as u8)
}

#[derive(Serialize)]
pub struct Choice {
    pub index: u32,
    pub text: String,
    pub finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Serialize)]
pub struct Tsl3Info {
    pub device: u32,
    pub host: u32,
    pub l3: u32,
    pub computed: u32,
    pub fallback_reason: FallbackReason,
    pub output_tokens: Vec<u32>,
}

#[derive(Serialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
    pub tsl3: Tsl3Info,
}

#[derive(Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Serialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits {
            max_prompt_tokens: 8,
            max_output_tokens: 4,
            vocab_size: 256,
        }
    }

    fn req(json: &str) -> CompletionRequest {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn text_is_one_token_per_utf8_byte() {
        let r = req(r#"{"prompt":"hé","max_tokens":1}"#);
        assert_eq!(r.tokens(&limits()).unwrap(), vec![104, 0xc3, 0xa9]);
        let r = req(r#"{"prompt":[1,2,3],"max_tokens":2}"#);
        assert_eq!(r.tokens(&limits()).unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn bad_prompts_are_refused_with_a_message() {
        assert!(req(r#"{"prompt":""}"#)
            .tokens(&limits())
            .unwrap_err()
            .0
            .contains("empty"));
        assert!(req(r#"{"prompt":"123456789","max_tokens":1}"#)
            .tokens(&limits())
            .unwrap_err()
            .0
            .contains("at most 8"));
        assert!(req(r#"{"prompt":[999],"max_tokens":1}"#)
            .tokens(&limits())
            .unwrap_err()
            .0
            .contains("vocabulary"));
        assert!(req(r#"{"prompt":"a","max_tokens":0}"#)
            .tokens(&limits())
            .is_err());
        assert!(req(r#"{"prompt":"a","max_tokens":5}"#)
            .tokens(&limits())
            .is_err());
        assert!(serde_json::from_str::<CompletionRequest>(r#"{"prompt":7}"#).is_err());
    }
}
