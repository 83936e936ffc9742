//! `engine-host model ...`: tools for model directories. `init-random DIR` writes a small
//! random-initialised Llama-format checkpoint (config.json, generation_config.json,
//! model.safetensors, tokenizer.json, tokenizer_config.json with a chat template),
//! deterministic from its seed: what the tests, the CI and the TTFT benchmark serve with
//! `serve --model-dir DIR`. It writes only into DIR and refuses one that holds a model.

use std::path::PathBuf;

/// `engine-host model <command>`.
#[derive(clap::Subcommand, Debug)]
pub enum ModelCommand {
    /// Write a random-initialised Llama-format model directory (deterministic from --seed).
    InitRandom(InitRandom),
}

#[derive(clap::Args, Debug)]
pub struct InitRandom {
    /// The directory to write (created; refused when it already holds a config.json).
    pub dir: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// KV heads (grouped-query attention when fewer than --heads).
    #[arg(long, default_value_t = 2)]
    pub kv_heads: usize,
    /// MLP width.
    #[arg(long, default_value_t = 128)]
    pub intermediate: usize,
    #[arg(long, default_value_t = 32768)]
    pub max_position: usize,
    /// Weight dtype on disk: bf16 | f32 (CPU computes in f32 either way).
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
}

impl ModelCommand {
    pub fn run(&self) -> Result<String, String> {
        match self {
            ModelCommand::InitRandom(a) => {
                let dtype = match a.dtype.as_str() {
                    "bf16" => transformer::WeightDtype::BF16,
                    "f32" => transformer::WeightDtype::F32,
                    other => return Err(format!("--dtype must be bf16 or f32, not {other:?}")),
                };
                let spec = transformer::RandomModelSpec {
                    seed: a.seed,
                    layers: a.layers,
                    hidden: a.hidden,
                    heads: a.heads,
                    kv_heads: a.kv_heads,
                    intermediate: a.intermediate,
                    max_position: a.max_position,
                    dtype,
                };
                transformer::init_random(&a.dir, &spec).map_err(|e| e.to_string())?;
                Ok(format!(
                    "wrote a random {}-layer model (hidden {}, {} heads, {} KV heads, seed {}) to {}",
                    a.layers,
                    a.hidden,
                    a.heads,
                    a.kv_heads,
                    a.seed,
                    a.dir.display()
                ))
            }
        }
    }
}
