//! A model directory's Hugging Face tokenizer (tokenizer.json) and chat template
//! (tokenizer_config.json) as the HTTP side's [`TextCodec`]: prompts encode with the
//! tokenizer's special tokens (BOS), a chat renders through the template with the
//! generation prompt and encodes without adding them again (the template writes its own),
//! output decodes with special tokens skipped, and the model's EOS tokens
//! (generation_config.json) finish a choice with "stop".
//!
//! It owns the text side of a model directory only; it never sees weights or the engine.

use super::text::{ChatMessage, TextCodec};
use std::path::Path;
use transformer::{ChatTemplate, TextTokenizer};

pub struct ModelText {
    tokenizer: TextTokenizer,
    /// None: the directory has no chat template (a chat request is a 400 saying so).
    chat: Option<ChatTemplate>,
    eos: Vec<u32>,
}

impl ModelText {
    /// The text side of `dir`; `eos` are the model's end-of-sequence tokens.
    pub fn from_dir(dir: &Path, eos: Vec<u32>) -> Result<Self, String> {
        let tokenizer = TextTokenizer::from_dir(dir).map_err(|e| e.to_string())?;
        // No chat_template key: chat requests are refused; one that does not parse is the
        // operator's error, refused at startup.
        let has_template = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v.get("chat_template").is_some());
        let chat = if has_template {
            Some(ChatTemplate::from_dir(dir).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(Self {
            tokenizer,
            chat,
            eos,
        })
    }
}

impl TextCodec for ModelText {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer.encode(text, true).map_err(|e| e.to_string())
    }
    fn encode_chat(&self, text: &str) -> Result<Vec<u32>, String> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| e.to_string())
    }
    fn decode(&self, tokens: &[u32]) -> String {
        self.tokenizer
            .decode(tokens, true)
            .unwrap_or_else(|_| String::from('\u{FFFD}'))
    }
    fn token_text(&self, token: u32) -> String {
        self.tokenizer
            .decode(&[token], false)
            .ok()
            .or_else(|| self.tokenizer.token_text(token))
            .unwrap_or_default()
    }
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String> {
        let Some(chat) = &self.chat else {
            return Err("this model directory has no chat template (tokenizer_config.json chat_template); use /v1/completions".into());
        };
        let m: Vec<transformer::ChatMessage> = messages
            .iter()
            .map(|m| transformer::ChatMessage {
                role: m.role.clone(),
                content: m.content.clone(),
            })
            .collect();
        chat.render(&m, true).map_err(|e| e.to_string())
    }
    fn eos_tokens(&self) -> Vec<u32> {
        self.eos.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_directory_encodes_renders_and_stops_like_its_tokenizer_says() {
        let dir = tempfile::tempdir().unwrap();
        transformer::init_random(dir.path(), &transformer::RandomModelSpec::default()).unwrap();
        let tok = TextTokenizer::from_dir(dir.path()).unwrap();
        let t = ModelText::from_dir(dir.path(), vec![7]).unwrap();
        let ids = t.encode("héllo").unwrap();
        assert_eq!(t.decode(&ids), "héllo", "round trip, BOS skipped");
        let bos = tok.bos().and_then(|b| tok.token_id(&b));
        assert_eq!(ids.first().copied(), bos, "a prompt starts with BOS");
        let chat = t
            .chat_prompt(&[ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }])
            .unwrap();
        assert!(
            chat.contains("hi") && chat.ends_with("assistant\n"),
            "{chat}"
        );
        let chat_ids = t.encode_chat(&chat).unwrap();
        assert_eq!(
            chat_ids.len() + 1,
            t.encode(&chat).unwrap().len(),
            "the template's text gets no second BOS"
        );
        assert_eq!(t.eos_tokens(), vec![7]);
        assert!(!t.token_text(ids[1]).is_empty());
        // no chat template: chat is refused with a message, completions still work
        let cfg = dir.path().join("tokenizer_config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
        v.as_object_mut().unwrap().remove("chat_template");
        std::fs::write(&cfg, v.to_string()).unwrap();
        let plain = ModelText::from_dir(dir.path(), vec![]).unwrap();
        assert!(plain
            .chat_prompt(&[])
            .unwrap_err()
            .contains("chat template"));
        // a template that does not parse is refused at startup
        v["chat_template"] = "{% for %}".into();
        std::fs::write(&cfg, v.to_string()).unwrap();
        assert!(ModelText::from_dir(dir.path(), vec![]).is_err());
    }
}
