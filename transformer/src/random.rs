//! A random-initialised checkpoint written from a seed: config, weights, byte-level
//! tokenizer and a ChatML chat template, so tests and benchmarks need no downloads.

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};

use crate::error::TransformerError;

/// The special tokens of the random model's tokenizer, after the 256 byte tokens.
pub const SPECIAL_TOKENS: [&str; 4] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|im_start|>",
    "<|im_end|>",
];
/// Byte tokens plus specials.
pub const RANDOM_VOCAB_SIZE: usize = 256 + SPECIAL_TOKENS.len();
const BOS_ID: u32 = 256;
const EOS_ID: u32 = 257;
const IM_END_ID: u32 = 259;

/// The ChatML template the random model ships.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The dtype weights are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    F32,
    BF16,
}

/// Sizes and seed of a random model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomModelSpec {
    pub seed: u64,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub max_position: usize,
    pub dtype: WeightDtype,
}

impl Default for RandomModelSpec {
    fn default() -> Self {
        Self {
            seed: 0,
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            intermediate: 128,
            max_position: 4096,
            dtype: WeightDtype::BF16,
        }
    }
}

/// splitmix64: a small deterministic generator (integer arithmetic only, so the same seed
/// gives the same bytes on every machine).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly N(0, std): the centred sum of three uniforms (variance 1/4), rescaled.
    fn normalish(&mut self, std: f64) -> f32 {
        let s = self.unit() + self.unit() + self.unit() - 1.5;
        (s * 2.0 * std) as f32
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TransformerError + '_ {
    move |source| TransformerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), TransformerError> {
    std::fs::write(path, bytes).map_err(io_err(path))
}

fn write_json(path: &Path, value: &Value) -> Result<(), TransformerError> {
    let text = serde_json::to_string_pretty(value).map_err(|source| TransformerError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    write(path, text.as_bytes())
}

fn check_spec(spec: &RandomModelSpec) -> Result<(), TransformerError> {
    let bad = |what: String| {
        Err(TransformerError::Input(format!(
            "random model spec: {what}"
        )))
    };
    if spec.layers == 0 || spec.hidden == 0 || spec.heads == 0 || spec.kv_heads == 0 {
        return bad("layers, hidden, heads and kv_heads must be positive".into());
    }
    if spec.intermediate == 0 || spec.max_position == 0 {
        return bad("intermediate and max_position must be positive".into());
    }
    if !spec.hidden.is_multiple_of(spec.heads) || !(spec.hidden / spec.heads).is_multiple_of(2) {
        return bad(format!(
            "hidden {} must be heads {} times an even head_dim",
            spec.hidden, spec.heads
        ));
    }
    if !spec.heads.is_multiple_of(spec.kv_heads) {
        return bad(format!(
            "kv_heads {} must divide heads {}",
            spec.kv_heads, spec.heads
        ));
    }
    Ok(())
}

/// Write a random checkpoint into `dir` (created if missing; refused if it holds a config.json).
pub fn init_random(dir: &Path, spec: &RandomModelSpec) -> Result<(), TransformerError> {
    check_spec(spec)?;
    let config_path = dir.join("config.json");
    if config_path.exists() {
        return Err(TransformerError::DirNotEmpty { path: config_path });
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let head_dim = spec.hidden / spec.heads;
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": spec.max_position,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": null,
        "vocab_size": RANDOM_VOCAB_SIZE,
        "tie_word_embeddings": false,
        "attention_bias": false,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": match spec.dtype { WeightDtype::F32 => "float32", WeightDtype::BF16 => "bfloat16" },
    });
    write_json(&config_path, &config)?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({ "bos_token_id": BOS_ID, "eos_token_id": [EOS_ID, IM_END_ID] }),
    )?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json())?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({
            "bos_token": SPECIAL_TOKENS[0],
            "eos_token": SPECIAL_TOKENS[1],
            "chat_template": CHATML_TEMPLATE,
            "model_max_length": spec.max_position,
        }),
    )?;
    let weights_path = dir.join("model.safetensors");
    write(&weights_path, &weights(spec, &weights_path)?)
}

/// Names and shapes of a Llama checkpoint of this spec.
fn shapes(spec: &RandomModelSpec) -> Vec<(String, Vec<usize>)> {
    let (h, i, v) = (spec.hidden, spec.intermediate, RANDOM_VOCAB_SIZE);
    let kv = spec.kv_heads * (spec.hidden / spec.heads);
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![v, h]),
        ("model.norm.weight".to_string(), vec![h]),
        ("lm_head.weight".to_string(), vec![v, h]),
    ];
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}.");
        for (name, shape) in [
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ] {
            out.push((format!("{p}{name}"), shape));
        }
    }
    out
}

fn weights(spec: &RandomModelSpec, path: &Path) -> Result<Vec<u8>, TransformerError> {
    let mut rng = SplitMix(spec.seed);
    let (dtype, width) = match spec.dtype {
        WeightDtype::F32 => (Dtype::F32, 4),
        WeightDtype::BF16 => (Dtype::BF16, 2),
    };
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in shapes(spec) {
        let count: usize = shape.iter().product();
        let is_norm = name.ends_with("norm.weight");
        let mut bytes = Vec::with_capacity(count * width);
        for _ in 0..count {
            // Norm scales near 1; everything else ~N(0, 0.02), wider for the embeddings and
            // head so logits spread.
            let x = if is_norm {
                1.0 + rng.normalish(0.05)
            } else if name.contains("embed") || name.starts_with("lm_head") {
                rng.normalish(0.5)
            } else {
                rng.normalish(0.02 * 4.0)
            };
            match spec.dtype {
                WeightDtype::F32 => bytes.extend_from_slice(&x.to_le_bytes()),
                WeightDtype::BF16 => {
                    bytes.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes())
                }
            }
        }
        data.push((name, shape, bytes));
    }
    let err = |message: String| TransformerError::Safetensors {
        path: path.to_path_buf(),
        message,
    };
    let views = data
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| err(format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| err(e.to_string()))
}

/// GPT-2's byte-to-character map: printable bytes map to themselves, the rest to 256+.
pub(crate) fn byte_char(b: u8) -> char {
    let printable = |b: u8| {
        (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// A byte-level BPE tokenizer.json: 256 byte tokens (ids = byte values), no merges, the
/// special tokens after them, and a post-processor that prepends BOS.
fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), json!(b));
    }
    let added: Vec<Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": 256 + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bos = SPECIAL_TOKENS[0];
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [BOS_ID], "tokens": [bos]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []
        }
    })
}
