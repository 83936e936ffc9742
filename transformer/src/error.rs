//! The crate's one error type: every variant names the file (or input) and what was wrong.

use std::path::PathBuf;

/// Everything this crate can fail with.
#[derive(Debug, thiserror::Error)]
pub enum TransformerError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file is not valid JSON.
    #[error("{}: not valid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A field of a JSON file is missing or holds the wrong kind of value.
    #[error("{}: field `{field}`: {problem}", path.display())]
    Field {
        path: PathBuf,
        field: String,
        problem: String,
    },
    /// A rope_scaling kind this crate does not implement.
    #[error("{}: field `rope_scaling.rope_type`: unknown rope type {rope_type:?} (known: default, linear, dynamic, llama3, yarn)", path.display())]
    UnknownRopeType { path: PathBuf, rope_type: String },
    /// A checkpoint lacks a weight the architecture needs.
    #[error("{}: missing weight `{name}`", path.display())]
    MissingWeight { path: PathBuf, name: String },
    /// A weight has a shape other than the config implies.
    #[error("{}: weight `{name}` has shape {got:?}, config.json implies {expected:?}", path.display())]
    WeightShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A safetensors file could not be parsed, or holds a dtype this crate does not load.
    #[error("{}: safetensors: {message}", path.display())]
    Safetensors { path: PathBuf, message: String },
    /// tokenizer.json could not be loaded, or encoding/decoding failed.
    #[error("{}: tokenizer: {message}", path.display())]
    Tokenizer { path: PathBuf, message: String },
    /// The chat template is missing, does not parse, or failed to render.
    #[error("{}: chat_template: {message}", path.display())]
    Template { path: PathBuf, message: String },
    /// The model directory cannot be written by init_random.
    #[error("{}: already holds a config.json; init_random writes only into an empty or new directory", path.display())]
    DirNotEmpty { path: PathBuf },
    /// A token id at or beyond the vocabulary size.
    #[error("token id {token} at input position {position} is out of the vocabulary (vocab_size {vocab_size})")]
    TokenOutOfVocab {
        token: u32,
        position: usize,
        vocab_size: usize,
    },
    /// The KV context handed to prefill does not match what it claims.
    #[error("prefill context: {0}")]
    Context(String),
    /// A request that cannot be computed (empty prompt, beyond max positions, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// The compute device cannot be opened.
    #[error("compute device: {0}")]
    Device(String),
    /// A tensor operation failed (an internal inconsistency or a device fault).
    #[error("tensor operation `{op}`: {source}")]
    Candle {
        op: &'static str,
        #[source]
        source: candle_core::Error,
    },
}

/// Attach an operation name to a candle result.
pub(crate) trait CandleContext<T> {
    fn op(self, op: &'static str) -> Result<T, TransformerError>;
}

impl<T> CandleContext<T> for Result<T, candle_core::Error> {
    fn op(self, op: &'static str) -> Result<T, TransformerError> {
        self.map_err(|source| TransformerError::Candle { op, source })
    }
}

pub(crate) fn read_file(path: &std::path::Path) -> Result<Vec<u8>, TransformerError> {
    std::fs::read(path).map_err(|source| TransformerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value, TransformerError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|source| TransformerError::Json {
        path: path.to_path_buf(),
        source,
    })
}
