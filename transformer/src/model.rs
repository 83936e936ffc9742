//! The decoder forward: embeddings, layers of attention and SwiGLU, final norm, logits.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::attention::attend;
use crate::config::{GenerationConfig, TransformerConfig};
use crate::error::{CandleContext, TransformerError};
use crate::kv::{layers_to_rows, rows_to_layers, KvLayout, LayerKv, RequestKv};
use crate::rope::Rope;
use crate::weights::{self, Weights};

/// Where the forward runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeDevice {
    Cpu,
    /// A CUDA device by ordinal (needs the `cuda` feature).
    Cuda(usize),
}

/// The result of a prefill.
#[derive(Debug, Clone)]
pub struct Prefill {
    /// The last position's logits, f32, vocab_size of them.
    pub logits: Vec<f32>,
    /// Rows of the newly computed positions, `(len - context_len) * row_bytes` bytes.
    pub new_rows: Vec<u8>,
    /// The request's KV (context and new positions), ready for decode.
    pub kv: RequestKv,
}

/// A loaded checkpoint.
#[derive(Debug)]
pub struct Transformer {
    config: TransformerConfig,
    generation: GenerationConfig,
    identity: String,
    weights: Weights,
    rope: Rope,
    device: Device,
    dtype: DType,
}

fn open_device(device: ComputeDevice) -> Result<Device, TransformerError> {
    match device {
        ComputeDevice::Cpu => Ok(Device::Cpu),
        #[cfg(feature = "cuda")]
        ComputeDevice::Cuda(ordinal) => Device::new_cuda(ordinal).map_err(|e| {
            TransformerError::Device(format!("no CUDA device {ordinal}: {e}"))
        }),
        #[cfg(not(feature = "cuda"))]
        ComputeDevice::Cuda(ordinal) => Err(TransformerError::Device(format!(
            "CUDA device {ordinal} requested, but the transformer crate was built without CUDA (engine-host feature `cuda-model`, the transformer crate's `cuda`)"
        ))),
    }
}

impl Transformer {
    /// Load config.json, generation_config.json (optional) and the safetensors weights of `dir`.
    /// On CPU the weights are converted to f32; on CUDA they keep the checkpoint's dtype.
    pub fn load(dir: &Path, device: ComputeDevice) -> Result<Self, TransformerError> {
        let config = TransformerConfig::from_dir(dir)?;
        let generation = GenerationConfig::from_dir(dir, &config)?;
        let device = open_device(device)?;
        let dtype = match (&device, config.torch_dtype.as_deref()) {
            (Device::Cpu, _) => DType::F32,
            (_, Some("bfloat16")) => DType::BF16,
            (_, Some("float16")) => DType::F16,
            _ => DType::F32,
        };
        let (weights, identity) = weights::load(dir, &config, &device, dtype)?;
        let rope = Rope::new(&config);
        Ok(Self {
            config,
            generation,
            identity,
            weights,
            rope,
            device,
            dtype,
        })
    }

    pub fn config(&self) -> &TransformerConfig {
        &self.config
    }

    pub fn generation(&self) -> &GenerationConfig {
        &self.generation
    }

    /// Checkpoint identity: hex xxh3-128 over config.json's bytes and every weight file's
    /// bytes (sorted by name).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn kv_layout(&self) -> KvLayout {
        KvLayout {
            layers: self.config.num_hidden_layers,
            kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim,
            dtype_bytes: self.dtype.size_in_bytes(),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// Prefill of positions [context_len, tokens.len()). The KV of positions [0, context_len)
    /// is given as row bytes in `context`: chunks (the engine's blocks), each a whole number
    /// of rows, totalling exactly context_len rows.
    pub fn prefill(
        &self,
        tokens: &[u32],
        context_len: usize,
        context: &[&[u8]],
    ) -> Result<Prefill, TransformerError> {
        if context_len >= tokens.len() {
            return Err(TransformerError::Input(format!(
                "prefill of {} tokens with context_len {context_len} leaves no position to compute",
                tokens.len()
            )));
        }
        self.check_tokens(tokens)?;
        let layout = self.kv_layout();
        let ctx = rows_to_layers(&layout, context, context_len, self.dtype, &self.device)?;
        let (logits, new, all) = self.forward(&tokens[context_len..], context_len, &ctx)?;
        let new_rows = layers_to_rows(&layout, &new)?;
        Ok(Prefill {
            logits,
            new_rows,
            kv: RequestKv {
                layout,
                layers: all,
                len: tokens.len(),
            },
        })
    }

    /// One decode step: `token` at position kv.len(); appends its K/V to `kv`; returns its logits.
    pub fn decode(&self, kv: &mut RequestKv, token: u32) -> Result<Vec<f32>, TransformerError> {
        let layout = self.kv_layout();
        if kv.layout != layout {
            return Err(TransformerError::Input(format!(
                "request KV has layout {:?}, this model's is {layout:?}",
                kv.layout
            )));
        }
        self.check_tokens(&[token])?;
        let (logits, _new, all) = self.forward(&[token], kv.len, &kv.layers)?;
        kv.layers = all;
        kv.len += 1;
        Ok(logits)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), TransformerError> {
        let vocab_size = self.config.vocab_size;
        match tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab_size)
        {
            Some((position, &token)) => Err(TransformerError::TokenOutOfVocab {
                token,
                position,
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Forward of `tokens` at positions [start, start + n) over the context KV `ctx`
    /// (empty, or one entry per layer of `start` positions). Returns the last position's
    /// logits, the new positions' K/V and the whole K/V.
    #[allow(clippy::type_complexity)]
    fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        ctx: &[LayerKv],
    ) -> Result<(Vec<f32>, Vec<LayerKv>, Vec<LayerKv>), TransformerError> {
        let c = &self.config;
        let n = tokens.len();
        let eps = c.rms_norm_eps as f32;
        let ids = Tensor::new(tokens, &self.device).op("token ids")?;
        let mut x = self.weights.embed.index_select(&ids, 0).op("embedding")?;
        let (cos, sin) = self
            .rope
            .tables(start, n, start + n, self.dtype, &self.device)?;
        let mut new = Vec::with_capacity(c.num_hidden_layers);
        let mut all = Vec::with_capacity(c.num_hidden_layers);
        for (l, layer) in self.weights.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.input_norm, eps).op("input norm")?;
            let heads = |t: Tensor, count: usize| {
                t.reshape((n, count, c.head_dim))
                    .and_then(|t| t.transpose(0, 1))
                    .and_then(|t| t.contiguous())
            };
            let rotate = |t: Tensor| {
                t.unsqueeze(0)
                    .and_then(|t| candle_nn::rotary_emb::rope(&t, &cos, &sin))
                    .and_then(|t| t.squeeze(0))
            };
            let q = heads(layer.q.forward(&h)?, c.num_attention_heads)
                .and_then(rotate)
                .op("q heads")?;
            let k = heads(layer.k.forward(&h)?, c.num_key_value_heads)
                .and_then(rotate)
                .op("k heads")?;
            let v = heads(layer.v.forward(&h)?, c.num_key_value_heads).op("v heads")?;
            let (k_all, v_all) = match ctx.get(l) {
                Some(past) => (
                    Tensor::cat(&[&past.k, &k], 1).op("kv concat k")?,
                    Tensor::cat(&[&past.v, &v], 1).op("kv concat v")?,
                ),
                None if start == 0 => (k.clone(), v.clone()),
                None => {
                    return Err(TransformerError::Input(format!(
                        "no context KV for layer {l} at position {start}"
                    )))
                }
            };
            let attn = attend(&q, &k_all, &v_all, start, c.sliding_window)?;
            x = (x + layer.o.forward(&attn)?).op("attention residual")?;
            let h = candle_nn::ops::rms_norm(&x, &layer.post_norm, eps).op("post norm")?;
            let gate = layer.gate.forward(&h)?.silu().op("silu")?;
            let up = layer.up.forward(&h)?;
            let mlp = layer.down.forward(&(gate * up).op("swiglu")?)?;
            x = (x + mlp).op("mlp residual")?;
            new.push(LayerKv { k, v });
            all.push(LayerKv { k: k_all, v: v_all });
        }
        let last = x.narrow(0, n - 1, 1).op("last position")?;
        let last = candle_nn::ops::rms_norm(&last, &self.weights.norm, eps).op("final norm")?;
        let logits = self
            .weights
            .lm_head
            .t()
            .and_then(|w| last.matmul(&w))
            .and_then(|l| l.squeeze(0))
            .and_then(|l| l.to_dtype(DType::F32))
            .and_then(|l| l.to_vec1::<f32>())
            .op("logits")?;
        Ok((logits, new, all))
    }
}
