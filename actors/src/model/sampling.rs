//! Drawing one token from a model's scores under a request's `SamplingParams`: greedy,
//! temperature, top-k, top-p and a seeded draw, plus the log-probabilities a client asked
//! for. Used by both forward backends (the synthetic model's scores in the scheduler, the
//! transformer's logits on the device), so a request's tokens follow one rule whichever
//! backend runs it.
//!
//! Pure and deterministic: the draw's generator is a hash of (seed, output position), so a
//! seed reproduces a completion on every rank and in every process. It never allocates more
//! than the scores' size and never panics on any scores (NaN scores rank lowest).

use messages::{SamplingParams, TokenLogprobs};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// One drawn token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    pub logprobs: Option<TokenLogprobs>,
}

/// A score that orders NaN below everything.
fn key(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else {
        x
    }
}

/// The highest score's token (the lowest ID on a tie); 0 for empty scores.
pub fn argmax(scores: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, v) in scores.iter().enumerate() {
        let v = key(*v);
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// log(sum(exp(scores))), stable.
fn log_sum_exp(scores: &[f32], scale: f32) -> f32 {
    let max = scores
        .iter()
        .map(|v| key(*v) * scale)
        .fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return max;
    }
    let sum: f64 = scores
        .iter()
        .map(|v| ((key(*v) * scale - max) as f64).exp())
        .sum();
    max + sum.ln() as f32
}

/// A uniform draw in [0, 1) for output position `step` of a request seeded `seed`.
fn uniform(seed: u64, step: u64) -> f64 {
    let h = xxh3_64_with_seed(&step.to_le_bytes(), seed ^ 0x7473_6c33_7361_6d70);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// The log-probabilities of `token` and of the `n` most likely tokens, over the raw scores.
pub fn logprobs_of(scores: &[f32], token: u32, n: u8) -> TokenLogprobs {
    let lse = log_sum_exp(scores, 1.0);
    let lp = |t: u32| {
        scores
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |v| key(*v) - lse)
    };
    let top = top_n(scores, n as usize);
    TokenLogprobs::new(lp(token), top.into_iter().map(|t| (t, lp(t))))
}

/// The `n` highest-scoring tokens, highest first (lowest ID first on a tie).
fn top_n(scores: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return vec![];
    }
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| {
        key(scores[*b as usize])
            .total_cmp(&key(scores[*a as usize]))
            .then(a.cmp(b))
    };
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, cmp);
        idx.truncate(n);
    }
    idx.sort_unstable_by(cmp);
    idx
}

/// Draws output position `step`'s token from `scores` under `params`.
pub fn sample(scores: &[f32], params: &SamplingParams, step: u64) -> Sampled {
    let token = if params.is_greedy() || scores.is_empty() {
        argmax(scores)
    } else {
        draw(scores, params, step)
    };
    Sampled {
        token,
        logprobs: params.logprobs.map(|n| logprobs_of(scores, token, n)),
    }
}

fn draw(scores: &[f32], params: &SamplingParams, step: u64) -> u32 {
    let scale = 1.0 / params.temperature;
    // Candidates: the top-k (all when 0), highest first.
    let k = match params.top_k {
        0 => scores.len(),
        k => (k as usize).min(scores.len()),
    };
    let cand = top_n(scores, k);
    let Some(&first) = cand.first() else {
        return 0;
    };
    let max = key(scores[first as usize]) * scale;
    if !max.is_finite() {
        return first;
    }
    let weights: Vec<f64> = cand
        .iter()
        .map(|t| ((key(scores[*t as usize]) * scale - max) as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    // top-p: the smallest prefix (highest first) whose probability reaches top_p.
    let mut keep = weights.len();
    if params.top_p < 1.0 {
        let mut acc = 0.0;
        for (i, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= params.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    let kept: f64 = weights[..keep].iter().sum();
    let mut u = uniform(params.seed, step) * kept;
    for (t, w) in cand.iter().zip(&weights[..keep]) {
        if u < *w {
            return *t;
        }
        u -= w;
    }
    cand[keep - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: 11,
            ..SamplingParams::GREEDY
        }
    }

    #[test]
    fn greedy_takes_the_highest_score_and_the_lowest_id_on_a_tie() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        assert_eq!(sample(&[0.0, 2.0, 1.0], &params(0.0), 3).token, 1);
        // top_k 1 is greedy at any temperature
        let p = SamplingParams {
            top_k: 1,
            ..params(1.5)
        };
        assert_eq!(sample(&[0.0, 2.0, 1.0], &p, 3).token, 1);
    }

    #[test]
    fn a_seed_reproduces_and_another_seed_differs() {
        let scores: Vec<f32> = (0..64).map(|i| ((i * 37) % 11) as f32 * 0.1).collect();
        let p = params(1.0);
        let a: Vec<u32> = (0..32).map(|s| sample(&scores, &p, s).token).collect();
        let b: Vec<u32> = (0..32).map(|s| sample(&scores, &p, s).token).collect();
        assert_eq!(a, b);
        let q = SamplingParams { seed: 12, ..p };
        let c: Vec<u32> = (0..32).map(|s| sample(&scores, &q, s).token).collect();
        assert_ne!(a, c);
        // a warm draw is not always the argmax
        assert!(a.iter().any(|t| *t != argmax(&scores)));
    }

    #[test]
    fn top_k_and_top_p_cut_the_candidates() {
        let scores = [5.0, 4.0, 3.0, 0.0, -1.0];
        let k2 = SamplingParams {
            top_k: 2,
            ..params(2.0)
        };
        for s in 0..200 {
            assert!(sample(&scores, &k2, s).token <= 1);
        }
        // token 0 holds ~66% at temperature 1: top_p 0.5 keeps it alone
        let p = SamplingParams {
            top_p: 0.5,
            ..params(1.0)
        };
        for s in 0..200 {
            assert_eq!(sample(&scores, &p, s).token, 0);
        }
    }

    #[test]
    fn draws_follow_the_softmax() {
        // two tokens with probabilities 0.5 / 0.5 at temperature 1
        let scores = [1.0, 1.0];
        let n = 4000;
        let ones = (0..n)
            .filter(|s| sample(&scores, &params(1.0), *s).token == 1)
            .count();
        assert!((1700..2300).contains(&ones), "{ones} of {n}");
    }

    #[test]
    fn logprobs_are_normalised_and_ranked() {
        let scores = [0.0f32, 1.0, 2.0];
        let p = SamplingParams {
            logprobs: Some(2),
            ..params(0.0)
        };
        let s = sample(&scores, &p, 0);
        assert_eq!(s.token, 2);
        let l = s.logprobs.unwrap();
        let top: Vec<(u32, f32)> = l.top().collect();
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![2, 1]);
        let total: f32 = [0.0f32, 1.0, 2.0]
            .iter()
            .map(|v| (v - 2.0 - (1.0f32 + (-1.0f32).exp() + (-2.0f32).exp()).ln()).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert!((l.logprob() - top[0].1).abs() < 1e-7);
        assert!(l.logprob() < 0.0 && l.logprob() > -1.0);
        assert_eq!(logprobs_of(&scores, 0, 0).top_len(), 0);
    }
}
