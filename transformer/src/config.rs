//! config.json and generation_config.json, parsed field by field so a bad field is named.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{read_json, TransformerError};

/// The decoder families this crate runs; they share one forward and differ in defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Mistral,
}

/// How RoPE frequencies are rescaled for longer contexts (`rope_scaling` in config.json).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions (equivalently frequencies) divided by `factor`.
    Linear {
        factor: f64,
    },
    /// Dynamic NTK: the base grows once the sequence outgrows max_position_embeddings.
    Dynamic {
        factor: f64,
    },
    /// Llama 3.1 frequency-band scaling.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// YaRN: ramp between interpolated and extrapolated frequencies, plus an attention factor.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        /// Scale on cos/sin; `None` means 0.1 * ln(factor) + 1.
        attention_factor: Option<f64>,
    },
}

/// The model's shape and numerics, from config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (always for Qwen2).
    pub attention_bias: bool,
    /// Keys older than this many positions are masked; `None` when unset or not in use.
    pub sliding_window: Option<usize>,
    /// The checkpoint's declared dtype (`torch_dtype` or `dtype`), e.g. "bfloat16".
    pub torch_dtype: Option<String>,
    /// config.json's bos_token_id (generation_config.json takes precedence).
    pub bos_token_id: Option<u32>,
    /// config.json's eos_token_id, int or list (generation_config.json takes precedence).
    pub eos_token_ids: Vec<u32>,
}

/// Token ids that start and stop generation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// Typed access to one JSON object's fields, naming the file and field on error.
struct Fields<'a> {
    path: &'a Path,
    prefix: &'a str,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn new(path: &'a Path, prefix: &'a str, value: &'a Value) -> Result<Self, TransformerError> {
        match value.as_object() {
            Some(obj) => Ok(Self { path, prefix, obj }),
            None => Err(TransformerError::Field {
                path: path.to_path_buf(),
                field: if prefix.is_empty() {
                    "(top level)".into()
                } else {
                    prefix.trim_end_matches('.').into()
                },
                problem: "expected a JSON object".into(),
            }),
        }
    }

    fn err(&self, field: &str, problem: impl Into<String>) -> TransformerError {
        TransformerError::Field {
            path: self.path.to_path_buf(),
            field: format!("{}{field}", self.prefix),
            problem: problem.into(),
        }
    }

    /// The field's value, treating JSON null as absent.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.obj.get(field).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, field: &str) -> Result<Option<usize>, TransformerError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(field, format!("expected a non-negative integer, found {v}"))
                }),
        }
    }

    fn usize(&self, field: &str) -> Result<usize, TransformerError> {
        self.opt_usize(field)?
            .ok_or_else(|| self.err(field, "missing"))
    }

    fn positive(&self, field: &str) -> Result<usize, TransformerError> {
        let n = self.usize(field)?;
        if n == 0 {
            return Err(self.err(field, "must be at least 1"));
        }
        Ok(n)
    }

    fn opt_f64(&self, field: &str) -> Result<Option<f64>, TransformerError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a number, found {v}"))),
        }
    }

    fn f64(&self, field: &str) -> Result<f64, TransformerError> {
        self.opt_f64(field)?
            .ok_or_else(|| self.err(field, "missing"))
    }

    fn opt_bool(&self, field: &str) -> Result<Option<bool>, TransformerError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected true or false, found {v}"))),
        }
    }

    fn opt_str(&self, field: &str) -> Result<Option<&'a str>, TransformerError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a string, found {v}"))),
        }
    }

    fn opt_token(&self, field: &str) -> Result<Option<u32>, TransformerError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => token_id(v)
                .map(Some)
                .ok_or_else(|| self.err(field, format!("expected a token id, found {v}"))),
        }
    }

    /// A token id or a list of them (eos_token_id's two forms).
    fn token_list(&self, field: &str) -> Result<Option<Vec<u32>>, TransformerError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    token_id(v).ok_or_else(|| {
                        self.err(
                            field,
                            format!("expected a list of token ids, found {v} in it"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => token_id(v).map(|id| Some(vec![id])).ok_or_else(|| {
                self.err(
                    field,
                    format!("expected a token id or a list of them, found {v}"),
                )
            }),
        }
    }
}

fn token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

impl TransformerConfig {
    /// Read `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, TransformerError> {
        let path = dir.join("config.json");
        let value = read_json(&path)?;
        Self::from_value(&path, &value)
    }

    /// Parse a config.json value; `path` names the file in errors.
    pub fn from_value(path: &Path, value: &Value) -> Result<Self, TransformerError> {
        let f = Fields::new(path, "", value)?;
        let architecture = architecture(&f)?;
        if let Some(act) = f.opt_str("hidden_act")? {
            if act != "silu" {
                return Err(f.err(
                    "hidden_act",
                    format!("{act:?} is not supported (only silu)"),
                ));
            }
        }
        let hidden_size = f.positive("hidden_size")?;
        let num_attention_heads = f.positive("num_attention_heads")?;
        let num_key_value_heads = f
            .opt_usize("num_key_value_heads")?
            .unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(f.err(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(f.err(
                    "head_dim",
                    format!("missing, and hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}"),
                ))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(f.err(
                "head_dim",
                format!("{head_dim} must be even and positive for RoPE"),
            ));
        }
        let max_position_embeddings = f.positive("max_position_embeddings")?;
        let rope_scaling = rope_scaling(path, &f, max_position_embeddings)?;
        let attention_bias = match architecture {
            Architecture::Qwen2 => true,
            _ => f.opt_bool("attention_bias")?.unwrap_or(false),
        };
        let window = f.opt_usize("sliding_window")?;
        let use_window = match architecture {
            // Qwen2 declares a window but uses it only with use_sliding_window.
            Architecture::Qwen2 => f.opt_bool("use_sliding_window")?.unwrap_or(false),
            _ => f.opt_bool("use_sliding_window")?.unwrap_or(true),
        };
        let sliding_window = match (use_window, window) {
            (true, Some(0)) => return Err(f.err("sliding_window", "must be at least 1")),
            (true, w) => w,
            (false, _) => None,
        };
        let torch_dtype = match f.opt_str("torch_dtype")? {
            Some(s) => Some(s.to_string()),
            None => f.opt_str("dtype")?.map(str::to_string),
        };
        let rms_norm_eps = f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
        if rms_norm_eps <= 0.0 {
            return Err(f.err("rms_norm_eps", "must be positive"));
        }
        let rope_theta = f.opt_f64("rope_theta")?.unwrap_or(10_000.0);
        if rope_theta <= 1.0 {
            return Err(f.err("rope_theta", "must be greater than 1"));
        }
        Ok(Self {
            architecture,
            hidden_size,
            intermediate_size: f.positive("intermediate_size")?,
            num_hidden_layers: f.positive("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            vocab_size: f.positive("vocab_size")?,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias,
            sliding_window,
            torch_dtype,
            bos_token_id: f.opt_token("bos_token_id")?,
            eos_token_ids: f.token_list("eos_token_id")?.unwrap_or_default(),
        })
    }
}

fn architecture(f: &Fields<'_>) -> Result<Architecture, TransformerError> {
    let from_name = |name: &str| match name {
        "LlamaForCausalLM" | "llama" => Some(Architecture::Llama),
        "Qwen2ForCausalLM" | "qwen2" => Some(Architecture::Qwen2),
        "MistralForCausalLM" | "mistral" => Some(Architecture::Mistral),
        _ => None,
    };
    if let Some(v) = f.get("architectures") {
        let first = v
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .ok_or_else(|| {
                f.err(
                    "architectures",
                    format!("expected a list of class names, found {v}"),
                )
            })?;
        return from_name(first).ok_or_else(|| {
            f.err(
                "architectures",
                format!("{first:?} is not supported (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM)"),
            )
        });
    }
    let model_type = f
        .opt_str("model_type")?
        .ok_or_else(|| f.err("architectures", "missing (and no model_type either)"))?;
    from_name(model_type).ok_or_else(|| {
        f.err(
            "model_type",
            format!("{model_type:?} is not supported (llama, qwen2, mistral)"),
        )
    })
}

fn rope_scaling(
    path: &Path,
    top: &Fields<'_>,
    max_position_embeddings: usize,
) -> Result<RopeScaling, TransformerError> {
    let Some(value) = top.get("rope_scaling") else {
        return Ok(RopeScaling::None);
    };
    let f = Fields::new(path, "rope_scaling.", value)?;
    let kind = match f.opt_str("rope_type")? {
        Some(k) => k,
        None => f
            .opt_str("type")?
            .ok_or_else(|| f.err("rope_type", "missing (neither rope_type nor type is set)"))?,
    };
    let factor = |f: &Fields<'_>| -> Result<f64, TransformerError> {
        let x = f.f64("factor")?;
        if x < 1.0 {
            return Err(f.err("factor", format!("{x} must be at least 1")));
        }
        Ok(x)
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: factor(&f)?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: factor(&f)?,
        },
        "llama3" => {
            let low_freq_factor = f.f64("low_freq_factor")?;
            let high_freq_factor = f.f64("high_freq_factor")?;
            if high_freq_factor <= low_freq_factor || low_freq_factor <= 0.0 {
                return Err(f.err(
                    "high_freq_factor",
                    format!("{high_freq_factor} must exceed low_freq_factor {low_freq_factor} > 0"),
                ));
            }
            RopeScaling::Llama3 {
                factor: factor(&f)?,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: f.positive("original_max_position_embeddings")?,
            }
        }
        "yarn" => RopeScaling::Yarn {
            factor: factor(&f)?,
            original_max_position_embeddings: f
                .opt_usize("original_max_position_embeddings")?
                .unwrap_or(max_position_embeddings),
            beta_fast: f.opt_f64("beta_fast")?.unwrap_or(32.0),
            beta_slow: f.opt_f64("beta_slow")?.unwrap_or(1.0),
            attention_factor: f.opt_f64("attention_factor")?,
        },
        other => {
            return Err(TransformerError::UnknownRopeType {
                path: path.to_path_buf(),
                rope_type: other.to_string(),
            })
        }
    })
}

impl GenerationConfig {
    /// Read `dir/generation_config.json` if present; fields it lacks fall back to config.json's.
    pub fn from_dir(dir: &Path, config: &TransformerConfig) -> Result<Self, TransformerError> {
        let path: PathBuf = dir.join("generation_config.json");
        let (bos, eos) = if path.exists() {
            let value = read_json(&path)?;
            let f = Fields::new(&path, "", &value)?;
            (f.opt_token("bos_token_id")?, f.token_list("eos_token_id")?)
        } else {
            (None, None)
        };
        Ok(Self {
            bos_token_id: bos.or(config.bos_token_id),
            eos_token_ids: eos.unwrap_or_else(|| config.eos_token_ids.clone()),
        })
    }
}
