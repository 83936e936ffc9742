//! Text <-> tokens for the HTTP side: the [`TextCodec`] trait every route uses to encode a
//! prompt, decode output, name one token (log-probabilities), render a chat through the
//! model's template and know its end-of-sequence tokens; [`ByteCodec`], the synthetic
//! model's codec; and [`TextStream`], the incremental decoder a streamed choice uses.
//! Pure: no I/O, no engine state. A codec never panics on client input; a prompt it cannot
//! encode is an `Err` with a message the client reads.

use super::api::token_text;

/// One chat message whose content is plain text (parts already joined).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// How the served model turns text into tokens and back.
pub trait TextCodec: Send + Sync {
    /// A prompt string's tokens.
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Output text (special tokens skipped).
    fn decode(&self, tokens: &[u32]) -> String;
    /// One token's text (the token strings of log-probabilities).
    fn token_text(&self, token: u32) -> String;
    /// The tokens of a prompt `chat_prompt` rendered (a template writes its own special
    /// tokens, so a tokenizer adds none here).
    fn encode_chat(&self, text: &str) -> Result<Vec<u32>, String> {
        self.encode(text)
    }
    /// The chat rendered through the model's template, ending with the generation prompt.
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String>;
    /// A choice finishes with `"stop"` when it produces one of these.
    fn eos_tokens(&self) -> Vec<u32>;
}

/// The synthetic model's codec: a prompt string is one token per UTF-8 byte, output token
/// `t` reads as [`token_text`]`(t)`, the chat template is `<|role|>\ncontent\n` per message
/// then `<|assistant|>\n`, and there is no end-of-sequence token.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteCodec;

impl TextCodec for ByteCodec {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn decode(&self, tokens: &[u32]) -> String {
        tokens.iter().map(|t| token_text(*t)).collect()
    }
    fn token_text(&self, token: u32) -> String {
        token_text(token).to_string()
    }
    fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, String> {
        let mut out = String::new();
        for m in messages {
            out.push_str(&format!("<|{}|>\n{}\n", m.role, m.content));
        }
        out.push_str("<|assistant|>\n");
        Ok(out)
    }
    fn eos_tokens(&self) -> Vec<u32> {
        vec![]
    }
}

/// One choice's output text as tokens arrive: the decoded text of every token so far minus
/// what was already handed out, holding back a trailing U+FFFD (an incomplete UTF-8
/// sequence that later tokens complete) and any suffix that may begin a stop string.
/// Decodes the whole output each step (quadratic in its length; outputs are bounded by
/// `max_tokens`), so a tokenizer whose pieces depend on their neighbours decodes right.
#[derive(Debug, Default)]
pub struct TextStream {
    tokens: Vec<u32>,
    /// Bytes of the decoded text already handed out.
    sent: usize,
}

/// What one step of a [`TextStream`] yields.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TextStep {
    /// New text to hand out (may be empty).
    pub delta: String,
    /// A stop string was found: the text ends before it.
    pub stopped: bool,
}

impl TextStream {
    pub fn push(&mut self, token: u32) {
        self.tokens.push(token);
    }

    /// The new text after the tokens pushed so far. `last`: no token follows, so nothing is
    /// held back for a later token.
    pub fn step(&mut self, codec: &dyn TextCodec, stops: &[String], last: bool) -> TextStep {
        let full = codec.decode(&self.tokens);
        // A stop string cannot begin before `sent`: a suffix that might begin one is
        // always held back.
        let from = if full.is_char_boundary(self.sent) {
            self.sent
        } else {
            0
        };
        let found = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| full[from..].find(s.as_str()).map(|i| from + i))
            .min();
        let (end, stopped) = match found {
            Some(at) => (at, true),
            None if last => (full.len(), false),
            None => {
                let complete = full.trim_end_matches('\u{FFFD}').len();
                let hold = stops
                    .iter()
                    .map(|s| longest_prefix_suffix(&full[..complete], s))
                    .max()
                    .unwrap_or(0);
                (complete - hold, false)
            }
        };
        let delta = match full.get(self.sent..end) {
            Some(d) if end > self.sent => d.to_string(),
            _ => String::new(),
        };
        self.sent = self.sent.max(end);
        TextStep { delta, stopped }
    }
}

/// The length of the longest proper prefix of `stop` that `text` ends with.
fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    (1..stop.len())
        .rev()
        .find(|k| stop.is_char_boundary(*k) && text.ends_with(&stop[..*k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A codec whose tokens are UTF-8 bytes, decoded lossily (multi-byte characters span
    /// tokens, as with a byte-level BPE).
    struct Utf8Bytes;

    impl TextCodec for Utf8Bytes {
        fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
            Ok(text.bytes().map(u32::from).collect())
        }
        fn decode(&self, tokens: &[u32]) -> String {
            let bytes: Vec<u8> = tokens.iter().map(|t| *t as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        fn token_text(&self, token: u32) -> String {
            self.decode(&[token])
        }
        fn chat_prompt(&self, _: &[ChatMessage]) -> Result<String, String> {
            Err("no template".into())
        }
        fn eos_tokens(&self) -> Vec<u32> {
            vec![0]
        }
    }

    fn run(text: &str, stops: &[&str]) -> (Vec<String>, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = TextStream::default();
        let mut out = vec![];
        let bytes = text.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            s.push(u32::from(*b));
            let st = s.step(&Utf8Bytes, &stops, i + 1 == bytes.len());
            out.push(st.delta);
            if st.stopped {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn byte_codec_is_one_token_per_byte_and_has_a_template() {
        assert_eq!(ByteCodec.encode("hé").unwrap(), vec![104, 0xc3, 0xa9]);
        assert_eq!(ByteCodec.decode(&[0, 1]), "!\"");
        assert_eq!(ByteCodec.token_text(94), "!");
        let p = ByteCodec
            .chat_prompt(&[ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }])
            .unwrap();
        assert_eq!(p, "<|user|>\nhi\n<|assistant|>\n");
        assert!(ByteCodec.eos_tokens().is_empty());
    }

    #[test]
    fn multi_byte_characters_are_held_until_complete() {
        let (out, stopped) = run("aé€b", &[]);
        assert!(!stopped);
        assert_eq!(out, ["a", "", "é", "", "", "€", "b"]);
    }

    #[test]
    fn a_stop_string_ends_the_text_before_it_even_across_tokens() {
        let (out, stopped) = run("hello world", &["o w"]);
        assert!(stopped);
        assert_eq!(out.concat(), "hell");
        // A prefix of a stop string that does not complete is handed out later.
        let (out, stopped) = run("hello", &["lx"]);
        assert!(!stopped);
        assert_eq!(out, ["h", "e", "", "l", "lo"]);
    }
}
