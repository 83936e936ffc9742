//! Rotary position embedding: inverse frequencies for each `rope_scaling` kind, and the
//! cos/sin tables for a run of positions.

use std::f64::consts::PI;

use candle_core::{DType, Device, Tensor};

use crate::config::{RopeScaling, TransformerConfig};
use crate::error::{CandleContext, TransformerError};

/// The RoPE frequencies of one model.
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    /// head_dim / 2 inverse frequencies (before dynamic scaling).
    inv_freq: Vec<f64>,
    /// Multiplies cos and sin (YaRN's attention factor; 1 otherwise).
    attention_factor: f64,
    head_dim: usize,
    base: f64,
    dynamic: Option<(f64, usize)>,
}

fn base_inv_freq(base: f64, head_dim: usize) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f64 / head_dim as f64))
        .collect()
}

impl Rope {
    pub(crate) fn new(config: &TransformerConfig) -> Self {
        let dim = config.head_dim;
        let base = config.rope_theta;
        let plain = base_inv_freq(base, dim);
        let mut attention_factor = 1.0;
        let mut dynamic = None;
        let inv_freq = match &config.rope_scaling {
            RopeScaling::None => plain,
            RopeScaling::Linear { factor } => plain.iter().map(|f| f / factor).collect(),
            RopeScaling::Dynamic { factor } => {
                dynamic = Some((*factor, config.max_position_embeddings));
                plain
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let old = *original_max_position_embeddings as f64;
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                plain
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor: af,
            } => {
                let max_pos = *original_max_position_embeddings as f64;
                // The dimension index at which a frequency completes `rotations` turns over max_pos.
                let correction_dim = |rotations: f64| {
                    (dim as f64 * (max_pos / (rotations * 2.0 * PI)).ln()) / (2.0 * base.ln())
                };
                let low = correction_dim(*beta_fast).floor().max(0.0);
                let high = correction_dim(*beta_slow).ceil().min(dim as f64 - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                attention_factor = af.unwrap_or(if *factor > 1.0 {
                    0.1 * factor.ln() + 1.0
                } else {
                    1.0
                });
                plain
                    .iter()
                    .enumerate()
                    .map(|(i, &extrapolated)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        let interpolated = extrapolated / factor;
                        interpolated * (1.0 - keep) + extrapolated * keep
                    })
                    .collect()
            }
        };
        Self {
            inv_freq,
            attention_factor,
            head_dim: dim,
            base,
            dynamic,
        }
    }

    /// The inverse frequencies in force when the sequence is `seq_len` long.
    pub(crate) fn inv_freq(&self, seq_len: usize) -> Vec<f64> {
        match self.dynamic {
            Some((factor, max_pos)) if seq_len > max_pos => {
                let dim = self.head_dim as f64;
                let scaled = factor * seq_len as f64 / max_pos as f64 - (factor - 1.0);
                let base = self.base * scaled.powf(dim / (dim - 2.0));
                base_inv_freq(base, self.head_dim)
            }
            _ => self.inv_freq.clone(),
        }
    }

    /// cos and sin tables, each (positions, head_dim / 2), for positions
    /// [start, start + count) of a sequence that will be `seq_len` long.
    pub(crate) fn tables(
        &self,
        start: usize,
        count: usize,
        seq_len: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor), TransformerError> {
        let inv = self.inv_freq(seq_len);
        let half = inv.len();
        let mut cos = Vec::with_capacity(count * half);
        let mut sin = Vec::with_capacity(count * half);
        for p in start..start + count {
            for f in &inv {
                let angle = p as f64 * f;
                cos.push((angle.cos() * self.attention_factor) as f32);
                sin.push((angle.sin() * self.attention_factor) as f32);
            }
        }
        let cos = Tensor::from_vec(cos, (count, half), device)
            .and_then(|t| t.to_dtype(dtype))
            .op("rope cos table")?;
        let sin = Tensor::from_vec(sin, (count, half), device)
            .and_then(|t| t.to_dtype(dtype))
            .op("rope sin table")?;
        Ok((cos, sin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Architecture;

    fn config(scaling: RopeScaling) -> TransformerConfig {
        TransformerConfig {
            architecture: Architecture::Llama,
            hidden_size: 512,
            intermediate_size: 1024,
            num_hidden_layers: 1,
            num_attention_heads: 4,
            num_key_value_heads: 4,
            head_dim: 128,
            rms_norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: scaling,
            max_position_embeddings: 8192,
            vocab_size: 10,
            tie_word_embeddings: false,
            attention_bias: false,
            sliding_window: None,
            torch_dtype: None,
            bos_token_id: None,
            eos_token_ids: vec![],
        }
    }

    #[test]
    fn linear_divides_every_frequency() {
        let plain = Rope::new(&config(RopeScaling::None)).inv_freq(10);
        let lin = Rope::new(&config(RopeScaling::Linear { factor: 4.0 })).inv_freq(10);
        for (a, b) in plain.iter().zip(&lin) {
            assert!((a / 4.0 - b).abs() < 1e-15);
        }
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let plain = Rope::new(&config(RopeScaling::None)).inv_freq(10);
        let l3 = Rope::new(&config(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }))
        .inv_freq(10);
        assert_eq!(plain[0], l3[0], "the highest frequency is kept");
        let last = plain.len() - 1;
        assert!(
            (plain[last] / 8.0 - l3[last]).abs() < 1e-18,
            "the lowest is divided"
        );
        // In between, the scaled value lies within [f / factor, f].
        for (a, b) in plain.iter().zip(&l3) {
            assert!(*b <= *a && *b >= a / 8.0 - 1e-18);
        }
    }

    #[test]
    fn dynamic_changes_only_beyond_max_positions() {
        let rope = Rope::new(&config(RopeScaling::Dynamic { factor: 2.0 }));
        let plain = Rope::new(&config(RopeScaling::None)).inv_freq(10);
        assert_eq!(rope.inv_freq(8192), plain);
        let long = rope.inv_freq(16384);
        assert_eq!(long[0], plain[0]);
        assert!(long[10] < plain[10]);
    }

    #[test]
    fn yarn_ramps_between_extrapolation_and_interpolation() {
        let plain = Rope::new(&config(RopeScaling::None)).inv_freq(10);
        let rope = Rope::new(&config(RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 8192,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None,
        }));
        let yarn = rope.inv_freq(10);
        assert_eq!(yarn[0], plain[0]);
        let last = plain.len() - 1;
        assert!((yarn[last] - plain[last] / 4.0).abs() < 1e-18);
        assert!((rope.attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
    }
}
