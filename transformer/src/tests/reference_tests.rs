//! The candle forward against a plain-loop reference of the Hugging Face Llama/Qwen2
//! arithmetic (rotate-half RoPE, GQA head h reading KV head h / group, SwiGLU), written
//! independently of the crate's tensor code.

use std::collections::HashMap;
use std::path::Path;

use super::{floats, load, max_abs_diff, model_dir};
use crate::{RandomModelSpec, TransformerConfig, WeightDtype};

struct W(HashMap<String, Vec<f32>>);

impl W {
    fn read(dir: &Path) -> Self {
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut map = HashMap::new();
        for (name, view) in st.tensors() {
            let values: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => floats(view.data()),
                safetensors::Dtype::BF16 => view
                    .data()
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => panic!("{other:?}"),
            };
            map.insert(name, values);
        }
        Self(map)
    }

    fn get(&self, name: &str) -> &[f32] {
        &self.0[name]
    }
}

/// y[out] = sum_i x[i] * w[out][i] (+ b[out]).
fn linear(x: &[f32], w: &[f32], b: Option<&[f32]>) -> Vec<f32> {
    let n = x.len();
    let outs = w.len() / n;
    (0..outs)
        .map(|o| {
            let dot: f32 = (0..n).map(|i| x[i] * w[o * n + i]).sum();
            dot + b.map_or(0.0, |b| b[o])
        })
        .collect()
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, g)| v * r * g).collect()
}

/// Rotate-half RoPE of one head's vector at `pos`.
fn rope(x: &mut [f32], pos: usize, theta: f64, divide: f64) {
    let d = x.len();
    for i in 0..d / 2 {
        let inv = 1.0 / theta.powf(2.0 * i as f64 / d as f64) / divide;
        let (s, c) = ((pos as f64) * inv).sin_cos();
        let (a, b) = (x[i], x[i + d / 2]);
        x[i] = a * c as f32 - b * s as f32;
        x[i + d / 2] = b * c as f32 + a * s as f32;
    }
}

/// Last position's logits and all positions' rows (as f32 values).
fn reference(
    w: &W,
    c: &TransformerConfig,
    tokens: &[u32],
    rope_divide: f64,
) -> (Vec<f32>, Vec<f32>) {
    let (h, hd, nh, nkv) = (
        c.hidden_size,
        c.head_dim,
        c.num_attention_heads,
        c.num_key_value_heads,
    );
    let eps = c.rms_norm_eps as f32;
    let embed = w.get("model.embed_tokens.weight");
    let mut x: Vec<Vec<f32>> = tokens
        .iter()
        .map(|&t| embed[t as usize * h..(t as usize + 1) * h].to_vec())
        .collect();
    let n = tokens.len();
    let mut rows = vec![vec![0f32; c.num_hidden_layers * nkv * 2 * hd]; n];
    for l in 0..c.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        let bias = |s: &str| c.attention_bias.then(|| w.get(&p(s)));
        let mut q = Vec::new();
        let mut k = Vec::new();
        let mut v = Vec::new();
        for (pos, xi) in x.iter().enumerate() {
            let hn = rms_norm(xi, w.get(&p("input_layernorm.weight")), eps);
            let mut qi = linear(
                &hn,
                w.get(&p("self_attn.q_proj.weight")),
                bias("self_attn.q_proj.bias"),
            );
            let mut ki = linear(
                &hn,
                w.get(&p("self_attn.k_proj.weight")),
                bias("self_attn.k_proj.bias"),
            );
            let vi = linear(
                &hn,
                w.get(&p("self_attn.v_proj.weight")),
                bias("self_attn.v_proj.bias"),
            );
            for head in qi.chunks_exact_mut(hd) {
                rope(head, pos, c.rope_theta, rope_divide);
            }
            for head in ki.chunks_exact_mut(hd) {
                rope(head, pos, c.rope_theta, rope_divide);
            }
            for g in 0..nkv {
                let base = (l * nkv + g) * 2 * hd;
                rows[pos][base..base + hd].copy_from_slice(&ki[g * hd..(g + 1) * hd]);
                rows[pos][base + hd..base + 2 * hd].copy_from_slice(&vi[g * hd..(g + 1) * hd]);
            }
            q.push(qi);
            k.push(ki);
            v.push(vi);
        }
        for i in 0..n {
            let mut attn = vec![0f32; nh * hd];
            for head in 0..nh {
                let g = head / (nh / nkv);
                let qh = &q[i][head * hd..(head + 1) * hd];
                let visible: Vec<usize> = (0..=i)
                    .filter(|&j| c.sliding_window.is_none_or(|win| i - j < win))
                    .collect();
                let scores: Vec<f32> = visible
                    .iter()
                    .map(|&j| {
                        let kh = &k[j][g * hd..(g + 1) * hd];
                        qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f32 = e.iter().sum();
                for (pi, &j) in visible.iter().enumerate() {
                    for d in 0..hd {
                        attn[head * hd + d] += e[pi] / z * v[j][g * hd + d];
                    }
                }
            }
            let o = linear(&attn, w.get(&p("self_attn.o_proj.weight")), None);
            for (a, b) in x[i].iter_mut().zip(&o) {
                *a += b;
            }
            let hn = rms_norm(&x[i], w.get(&p("post_attention_layernorm.weight")), eps);
            let gate = linear(&hn, w.get(&p("mlp.gate_proj.weight")), None);
            let up = linear(&hn, w.get(&p("mlp.up_proj.weight")), None);
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = linear(&act, w.get(&p("mlp.down_proj.weight")), None);
            for (a, b) in x[i].iter_mut().zip(&down) {
                *a += b;
            }
        }
    }
    let last = rms_norm(&x[n - 1], w.get("model.norm.weight"), eps);
    let head = if c.tie_word_embeddings {
        embed
    } else {
        w.get("lm_head.weight")
    };
    (linear(&last, head, None), rows.concat())
}

fn compare(dir: &Path, tokens: &[u32], rope_divide: f64) {
    let m = load(dir);
    let (want_logits, want_rows) = reference(&W::read(dir), m.config(), tokens, rope_divide);
    let got = m.prefill(tokens, 0, &[]).unwrap();
    let d = max_abs_diff(&got.logits, &want_logits);
    assert!(d <= 1e-4, "logits differ from the reference by {d}");
    let d = max_abs_diff(&floats(&got.new_rows), &want_rows);
    assert!(d <= 1e-4, "rows differ from the reference by {d}");
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

const TOKENS: [u32; 11] = [256, 72, 101, 108, 108, 111, 32, 119, 111, 114, 259];

#[test]
fn llama_forward_matches_the_reference() {
    for dtype in [WeightDtype::F32, WeightDtype::BF16] {
        let dir = model_dir(&RandomModelSpec {
            dtype,
            seed: 11,
            ..RandomModelSpec::default()
        });
        compare(dir.path(), &TOKENS, 1.0);
    }
}

#[test]
fn linear_rope_and_sliding_window_match_the_reference() {
    let dir = model_dir(&RandomModelSpec::default());
    edit_config(dir.path(), |v| {
        v["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0});
        v["model_type"] = serde_json::json!("mistral");
        v["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        v["sliding_window"] = serde_json::json!(3);
    });
    compare(dir.path(), &TOKENS, 2.0);
}

#[test]
fn qwen2_biases_and_tied_embeddings_match_the_reference() {
    let spec = RandomModelSpec {
        dtype: WeightDtype::F32,
        ..RandomModelSpec::default()
    };
    let dir = model_dir(&spec);
    // Rewrite the checkpoint as Qwen2: q/k/v biases, no lm_head (tied to the embedding).
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != "lm_head.weight")
        .map(|(name, view)| (name, view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let kv = spec.kv_heads * spec.hidden / spec.heads;
    for l in 0..spec.layers {
        for (proj, len) in [("q", spec.hidden), ("k", kv), ("v", kv)] {
            let values: Vec<u8> = (0..len)
                .flat_map(|i| ((((i * 31 + l * 7) % 17) as f32 - 8.0) / 20.0).to_le_bytes())
                .collect();
            tensors.push((
                format!("model.layers.{l}.self_attn.{proj}_proj.bias"),
                vec![len],
                values,
            ));
        }
    }
    let views: Vec<_> = tensors
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    edit_config(dir.path(), |v| {
        v["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        v["model_type"] = serde_json::json!("qwen2");
        v["tie_word_embeddings"] = serde_json::json!(true);
        v["sliding_window"] = serde_json::json!(2);
        v["use_sliding_window"] = serde_json::json!(false);
    });
    let m = load(dir.path());
    assert!(m.config().attention_bias && m.config().tie_word_embeddings);
    assert_eq!(m.config().sliding_window, None);
    compare(dir.path(), &TOKENS, 1.0);
}
