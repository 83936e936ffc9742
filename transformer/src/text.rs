//! Text to token ids and back: tokenizer.json through the Hugging Face tokenizers crate.

use std::path::{Path, PathBuf};

use tokenizers::Tokenizer;

use crate::chat::special_token;
use crate::error::{read_json, TransformerError};

/// A checkpoint's tokenizer.
#[derive(Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    bos: Option<String>,
    eos: Option<String>,
}

impl TextTokenizer {
    /// Load `dir/tokenizer.json`; BOS/EOS strings come from `dir/tokenizer_config.json`
    /// when it exists.
    pub fn from_dir(dir: &Path) -> Result<Self, TransformerError> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(TransformerError::Io {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no tokenizer.json"),
            });
        }
        let inner = Tokenizer::from_file(&path).map_err(|e| TransformerError::Tokenizer {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let (bos, eos) = if config_path.exists() {
            let value = read_json(&config_path)?;
            (
                special_token(&config_path, &value, "bos_token")?,
                special_token(&config_path, &value, "eos_token")?,
            )
        } else {
            (None, None)
        };
        Ok(Self {
            inner,
            path,
            bos,
            eos,
        })
    }

    fn err(&self, message: impl ToString) -> TransformerError {
        TransformerError::Tokenizer {
            path: self.path.clone(),
            message: message.to_string(),
        }
    }

    /// Token ids of `text`; `add_special` applies the post-processor (e.g. a leading BOS).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TransformerError> {
        self.inner
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| self.err(format!("encoding failed: {e}")))
    }

    /// Text of `ids`; an id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TransformerError> {
        let vocab_size = self.vocab_size();
        if let Some((position, &token)) = ids
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab_size)
        {
            return Err(TransformerError::TokenOutOfVocab {
                token,
                position,
                vocab_size,
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| self.err(format!("decoding failed: {e}")))
    }

    /// The vocabulary entry of `id` as tokenizer.json spells it (byte-level vocabularies show
    /// bytes as their mapped characters, e.g. "Ġ" for a space); `None` outside the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token's vocabulary string, e.g. a special token.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The BOS token string from tokenizer_config.json.
    pub fn bos(&self) -> Option<String> {
        self.bos.clone()
    }

    /// The EOS token string from tokenizer_config.json.
    pub fn eos(&self) -> Option<String> {
        self.eos.clone()
    }
}
