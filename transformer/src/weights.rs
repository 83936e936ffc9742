//! Loading a checkpoint's safetensors into compute tensors, and its identity hash.
//!
//! Files are read whole (no memory map, so no `unsafe`); the bytes feed the identity hash
//! and are dropped once converted.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::{Dtype, SafeTensors};
use xxhash_rust::xxh3::Xxh3;

use crate::config::TransformerConfig;
use crate::error::{read_file, read_json, CandleContext, TransformerError};

/// A projection `y = x W^T (+ b)`, W (out, in).
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
}

impl Linear {
    /// x (positions, in) to (positions, out).
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, TransformerError> {
        let wt = self.weight.t().op("linear transpose")?;
        let y = x.matmul(&wt).op("linear matmul")?;
        match &self.bias {
            Some(b) => y.broadcast_add(b).op("linear bias"),
            None => Ok(y),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub(crate) input_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) post_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

#[derive(Debug, Clone)]
pub(crate) struct Weights {
    pub(crate) embed: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    /// (vocab, hidden); the embedding itself when tied.
    pub(crate) lm_head: Tensor,
}

/// The weight files of a checkpoint, sorted by name, and the path errors should name.
pub(crate) fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf), TransformerError> {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        let single = dir.join("model.safetensors");
        return Ok((vec![single.clone()], single));
    }
    let value = read_json(&index)?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| TransformerError::Field {
            path: index.clone(),
            field: "weight_map".into(),
            problem: "missing or not an object".into(),
        })?;
    let mut names = BTreeSet::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| TransformerError::Field {
            path: index.clone(),
            field: format!("weight_map.{tensor}"),
            problem: format!("expected a file name, found {file}"),
        })?;
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(TransformerError::Field {
                path: index.clone(),
                field: format!("weight_map.{tensor}"),
                problem: format!("{file:?} is not a plain file name in the model directory"),
            });
        }
        names.insert(file.to_string());
    }
    Ok((names.into_iter().map(|n| dir.join(n)).collect(), index))
}

fn candle_dtype(path: &Path, name: &str, dtype: Dtype) -> Result<DType, TransformerError> {
    match dtype {
        Dtype::F32 => Ok(DType::F32),
        Dtype::F16 => Ok(DType::F16),
        Dtype::BF16 => Ok(DType::BF16),
        Dtype::F64 => Ok(DType::F64),
        other => Err(TransformerError::Safetensors {
            path: path.to_path_buf(),
            message: format!("weight `{name}` has dtype {other:?}; only f32, f16, bf16, f64 load"),
        }),
    }
}

/// The weights the config needs, by name, with their expected shapes.
fn expected(config: &TransformerConfig) -> Vec<(String, Vec<usize>)> {
    let h = config.hidden_size;
    let q_out = config.num_attention_heads * config.head_dim;
    let kv_out = config.num_key_value_heads * config.head_dim;
    let i = config.intermediate_size;
    let mut names = vec![
        (
            "model.embed_tokens.weight".to_string(),
            vec![config.vocab_size, h],
        ),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !config.tie_word_embeddings {
        names.push(("lm_head.weight".to_string(), vec![config.vocab_size, h]));
    }
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        let mut add = |suffix: &str, shape: Vec<usize>| names.push((format!("{p}{suffix}"), shape));
        add("input_layernorm.weight", vec![h]);
        add("post_attention_layernorm.weight", vec![h]);
        add("self_attn.q_proj.weight", vec![q_out, h]);
        add("self_attn.k_proj.weight", vec![kv_out, h]);
        add("self_attn.v_proj.weight", vec![kv_out, h]);
        add("self_attn.o_proj.weight", vec![h, q_out]);
        if config.attention_bias {
            add("self_attn.q_proj.bias", vec![q_out]);
            add("self_attn.k_proj.bias", vec![kv_out]);
            add("self_attn.v_proj.bias", vec![kv_out]);
        }
        add("mlp.gate_proj.weight", vec![i, h]);
        add("mlp.up_proj.weight", vec![i, h]);
        add("mlp.down_proj.weight", vec![h, i]);
    }
    names
}

/// Load every weight the config needs and hash config.json plus the weight files.
/// Returns the weights and the hex xxh3-128 identity.
pub(crate) fn load(
    dir: &Path,
    config: &TransformerConfig,
    device: &Device,
    dtype: DType,
) -> Result<(Weights, String), TransformerError> {
    let mut hasher = Xxh3::new();
    hasher.update(&read_file(&dir.join("config.json"))?);
    let (files, errors_name) = weight_files(dir)?;
    let wanted: HashMap<String, Vec<usize>> = expected(config).into_iter().collect();
    // Optional extras: an o_proj bias (Llama with attention_bias).
    let optional = |name: &str| name.ends_with("self_attn.o_proj.bias") && config.attention_bias;
    let mut found: HashMap<String, Tensor> = HashMap::new();
    for file in &files {
        let bytes = read_file(file)?;
        hasher.update(&bytes);
        let st = SafeTensors::deserialize(&bytes).map_err(|e| TransformerError::Safetensors {
            path: file.clone(),
            message: e.to_string(),
        })?;
        for (name, view) in st.tensors() {
            let expected_shape = match wanted.get(&name) {
                Some(shape) => Some(shape),
                None if optional(&name) => None,
                None => continue,
            };
            if let Some(shape) = expected_shape {
                if view.shape() != shape.as_slice() {
                    return Err(TransformerError::WeightShape {
                        path: file.clone(),
                        name,
                        expected: shape.clone(),
                        got: view.shape().to_vec(),
                    });
                }
            }
            let src = candle_dtype(file, &name, view.dtype())?;
            let t = Tensor::from_raw_buffer(view.data(), src, view.shape(), &Device::Cpu)
                .and_then(|t| t.to_device(device))
                .and_then(|t| t.to_dtype(dtype))
                .op("load weight")?;
            found.insert(name, t);
        }
    }
    let mut w = Found {
        found,
        path: errors_name,
    };
    let embed = w.take("model.embed_tokens.weight".into())?;
    let norm = w.take("model.norm.weight".into())?;
    let lm_head = if config.tie_word_embeddings {
        embed.clone()
    } else {
        w.take("lm_head.weight".into())?
    };
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for l in 0..config.num_hidden_layers {
        let p = format!("model.layers.{l}.");
        let bias = config.attention_bias;
        layers.push(Layer {
            input_norm: w.take(format!("{p}input_layernorm.weight"))?,
            q: w.linear(&p, "self_attn.q_proj", bias)?,
            k: w.linear(&p, "self_attn.k_proj", bias)?,
            v: w.linear(&p, "self_attn.v_proj", bias)?,
            o: Linear {
                weight: w.take(format!("{p}self_attn.o_proj.weight"))?,
                bias: w.found.remove(&format!("{p}self_attn.o_proj.bias")),
            },
            post_norm: w.take(format!("{p}post_attention_layernorm.weight"))?,
            gate: w.linear(&p, "mlp.gate_proj", false)?,
            up: w.linear(&p, "mlp.up_proj", false)?,
            down: w.linear(&p, "mlp.down_proj", false)?,
        });
    }
    let identity = format!("{:032x}", hasher.digest128());
    Ok((
        Weights {
            embed,
            layers,
            norm,
            lm_head,
        },
        identity,
    ))
}

/// The loaded tensors, taken out by name.
struct Found {
    found: HashMap<String, Tensor>,
    path: PathBuf,
}

impl Found {
    fn take(&mut self, name: String) -> Result<Tensor, TransformerError> {
        self.found
            .remove(&name)
            .ok_or_else(|| TransformerError::MissingWeight {
                path: self.path.clone(),
                name,
            })
    }

    fn linear(&mut self, prefix: &str, name: &str, bias: bool) -> Result<Linear, TransformerError> {
        Ok(Linear {
            weight: self.take(format!("{prefix}{name}.weight"))?,
            bias: if bias {
                Some(self.take(format!("{prefix}{name}.bias"))?)
            } else {
                None
            },
        })
    }
}
