//! Causal grouped-query attention of a run of new queries over all of a request's keys.

use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

use crate::error::{CandleContext, TransformerError};

/// Queries per block: bounds the score matrix to (heads, BLOCK, keys) at a time.
const QUERY_BLOCK: usize = 256;

/// Attention of `q` (heads, n, head_dim), the queries of positions [start, start + n), over
/// `k`/`v` (kv_heads, start + n, head_dim). Query head h reads KV head h / (heads / kv_heads).
/// A key is visible to a query at or after it, and (with a window) fewer than `window`
/// positions before it. Returns (n, heads * head_dim).
pub(crate) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    window: Option<usize>,
) -> Result<Tensor, TransformerError> {
    let path = if q.device().is_cpu() {
        SoftmaxPath::Host
    } else {
        SoftmaxPath::Tensor
    };
    attend_with(q, k, v, start, window, path)
}

/// How the masked softmax over a block's scores is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SoftmaxPath {
    /// Tensor ops (an additive mask and candle's softmax): any device.
    Tensor,
    /// One fused pass per score row over host memory (mask, max, exp, normalise), rows in
    /// parallel on the rayon pool: CPU only, several times fewer passes over the scores.
    Host,
}

pub(crate) fn attend_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    start: usize,
    window: Option<usize>,
    path: SoftmaxPath,
) -> Result<Tensor, TransformerError> {
    let (heads, n, head_dim) = q.dims3().op("attention q dims")?;
    let (kv_heads, keys, _) = k.dims3().op("attention k dims")?;
    if keys != start + n || heads % kv_heads != 0 {
        return Err(TransformerError::Input(format!(
            "attention over {keys} keys for {n} queries from position {start} ({heads} heads, {kv_heads} KV heads)"
        )));
    }
    let group = heads / kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let device = q.device();
    let mut outputs = Vec::with_capacity(n.div_ceil(QUERY_BLOCK));
    let mut a = 0;
    while a < n {
        let b = (a + QUERY_BLOCK).min(n);
        let m = b - a;
        let first_query = start + a;
        let last_query = start + b - 1;
        // Keys some query of this block can see: [lo, last_query].
        let lo = match window {
            Some(w) => (first_query + 1).saturating_sub(w),
            None => 0,
        };
        let len = last_query + 1 - lo;
        let qb = (q.narrow(1, a, m).and_then(|t| t * scale))
            .and_then(|t| t.contiguous())
            .and_then(|t| t.reshape((kv_heads, group * m, head_dim)))
            .op("attention query block")?;
        let kb = k
            .narrow(1, lo, len)
            .and_then(|t| t.contiguous())
            .op("attention key block")?;
        let vb = v
            .narrow(1, lo, len)
            .and_then(|t| t.contiguous())
            .op("attention value block")?;
        let scores = kb
            .t()
            .and_then(|kt| qb.matmul(&kt))
            .op("attention scores")?;
        let probs = match path {
            SoftmaxPath::Tensor => {
                let scores = scores
                    .to_dtype(DType::F32)
                    .and_then(|s| s.reshape((kv_heads, group, m, len)))
                    .op("attention scores f32")?;
                let scores = match mask(first_query, m, lo, len, window, device)? {
                    Some(mask) => scores.broadcast_add(&mask).op("attention mask")?,
                    None => scores,
                };
                candle_nn::ops::softmax_last_dim(&scores)
                    .and_then(|p| p.to_dtype(vb.dtype()))
                    .and_then(|p| p.reshape((kv_heads, group * m, len)))
                    .op("attention softmax")?
            }
            SoftmaxPath::Host => {
                let mut values = scores
                    .to_dtype(DType::F32)
                    .and_then(|s| s.flatten_all())
                    .and_then(|s| s.to_vec1::<f32>())
                    .op("attention scores to host")?;
                values.par_chunks_mut(len).enumerate().for_each(|(r, row)| {
                    let qp = first_query + r % m;
                    let from = match window {
                        Some(w) => (qp + 1).saturating_sub(w).max(lo),
                        None => lo,
                    };
                    softmax_row(row, from - lo, qp - lo);
                });
                Tensor::from_vec(values, (kv_heads, group * m, len), device)
                    .and_then(|p| p.to_dtype(vb.dtype()))
                    .op("attention softmax from host")?
            }
        };
        let out = probs
            .matmul(&vb)
            .and_then(|o| o.reshape((heads, m, head_dim)))
            .op("attention values")?;
        outputs.push(out);
        a = b;
    }
    Tensor::cat(&outputs, 1)
        .and_then(|o| o.transpose(0, 1))
        .and_then(|o| o.contiguous())
        .and_then(|o| o.reshape((n, heads * head_dim)))
        .op("attention output")
}

/// Softmax of `row[first..=last]` in place; every other entry (masked keys) becomes 0.
fn softmax_row(row: &mut [f32], first: usize, last: usize) {
    let max = row[first..=last]
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0f32;
    for x in &mut row[first..=last] {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in &mut row[first..=last] {
        *x *= inv;
    }
    row[..first].fill(0.0);
    row[last + 1..].fill(0.0);
}

/// The additive mask (m, len) for queries [first, first + m) over keys [lo, lo + len), or
/// `None` when every key is visible to every query.
fn mask(
    first: usize,
    m: usize,
    lo: usize,
    len: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>, TransformerError> {
    let visible = |qp: usize, kp: usize| kp <= qp && window.is_none_or(|w| qp - kp < w);
    let all_visible = (0..m).all(|i| visible(first + i, lo) && visible(first + i, lo + len - 1));
    if all_visible {
        return Ok(None);
    }
    let mut values = Vec::with_capacity(m * len);
    for i in 0..m {
        for j in 0..len {
            values.push(if visible(first + i, lo + j) {
                0f32
            } else {
                f32::NEG_INFINITY
            });
        }
    }
    Tensor::from_vec(values, (m, len), device)
        .map(Some)
        .op("attention mask build")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference attention, one query at a time, in plain loops.
    fn reference(
        q: &[Vec<Vec<f32>>],
        k: &[Vec<Vec<f32>>],
        v: &[Vec<Vec<f32>>],
        start: usize,
        window: Option<usize>,
    ) -> Vec<Vec<f32>> {
        let heads = q.len();
        let group = heads / k.len();
        let n = q[0].len();
        let d = q[0][0].len();
        let mut out = vec![vec![0f32; heads * d]; n];
        for h in 0..heads {
            let kh = h / group;
            for i in 0..n {
                let qp = start + i;
                let keys: Vec<usize> = (0..=qp)
                    .filter(|&j| window.is_none_or(|w| qp - j < w))
                    .collect();
                let s: Vec<f32> = keys
                    .iter()
                    .map(|&j| {
                        (0..d).map(|x| q[h][i][x] * k[kh][j][x]).sum::<f32>() / (d as f32).sqrt()
                    })
                    .collect();
                let max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - max).exp()).collect();
                let z: f32 = e.iter().sum();
                for (p, &j) in keys.iter().enumerate() {
                    for x in 0..d {
                        out[i][h * d + x] += e[p] / z * v[kh][j][x];
                    }
                }
            }
        }
        out
    }

    fn tensor(heads: usize, n: usize, d: usize, seed: u32) -> (Tensor, Vec<Vec<Vec<f32>>>) {
        let vals: Vec<f32> = (0..heads * n * d)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32
                    / 500.0
                    - 1.0
            })
            .collect();
        let t = Tensor::from_vec(vals, (heads, n, d), &Device::Cpu).unwrap();
        let nested = t.to_vec3::<f32>().unwrap();
        (t, nested)
    }

    #[test]
    fn matches_reference_with_and_without_window() {
        // The second shape spans two query blocks.
        for (window, start, n) in [
            (None, 5, 7),
            (Some(3), 5, 7),
            (None, 3, 300),
            (Some(100), 3, 300),
        ] {
            let d = 4;
            let (q, qn) = tensor(4, n, d, 1);
            let (k, kn) = tensor(2, start + n, d, 2);
            let (v, vn) = tensor(2, start + n, d, 3);
            let got = attend(&q, &k, &v, start, window)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let want = reference(&qn, &kn, &vn, start, window);
            for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
                assert!((g - w).abs() < 1e-5, "window {window:?}: {g} vs {w}");
            }
        }
    }
}
