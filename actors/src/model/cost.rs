//! The device-time cost model of the synthetic forward: a number of microseconds the engine
//! host uses to emulate device time. It never sleeps and never reads a clock.
//!
//! `device_time_us(new, context) = fixed_us + per_token_us * new
//!                                 + per_token_context_ns / 1000 * new * (context + new / 2)`
//!
//! `context` is the number of tokens already in the KV cache before this step (the reused
//! prefix); the `new / 2` term is the average causal attention span inside the new chunk, so
//! one prefill of `n` tokens and recomputation of the same `n` tokens cost the same.

/// Device time of one forward step, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    pub fixed_us: f64,
    pub per_token_us: f64,
    pub per_token_context_ns: f64,
}

/// One published time-to-first-token point: a prefill of `tokens` took `micros`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PublishedPoint {
    pub tokens: u64,
    pub micros: f64,
}

impl CostModel {
    /// Emulated device time of a step computing `new_tokens` on top of `context_tokens`
    /// already cached. Rounded to whole microseconds.
    pub fn device_time_us(&self, new_tokens: u64, context_tokens: u64) -> u64 {
        if new_tokens == 0 {
            return 0;
        }
        let n = new_tokens as f64;
        let ctx = context_tokens as f64 + n / 2.0;
        let us =
            self.fixed_us + self.per_token_us * n + self.per_token_context_ns / 1000.0 * n * ctx;
        us.max(0.0).round() as u64
    }

    /// Fits `fixed_us` and `per_token_us` through two published prefill points (context 0),
    /// with the attention term tied to the linear term by `attention_ratio`: attention FLOPs
    /// per (query, key) pair divided by the linear-layer FLOPs per token. For a dense
    /// transformer that is `4 * n_heads * head_dim * n_layers / (2 * parameters)`.
    pub fn fit(p1: PublishedPoint, p2: PublishedPoint, attention_ratio: f64) -> Self {
        let (n1, n2) = (p1.tokens as f64, p2.tokens as f64);
        // T(n) = f + a n + a r n^2 / 2  (context 0, so the attended span is n / 2)
        let denom = (n2 - n1) + attention_ratio / 2.0 * (n2 * n2 - n1 * n1);
        let a = if denom > 0.0 {
            (p2.micros - p1.micros) / denom
        } else {
            0.0
        };
        let f = p1.micros - a * n1 - a * attention_ratio * n1 * n1 / 2.0;
        Self {
            fixed_us: f,
            per_token_us: a,
            per_token_context_ns: a * attention_ratio * 1000.0,
        }
    }

    /// Marginal prefill rate for long chunks without context (tokens per second).
    pub fn marginal_tokens_per_s(&self) -> f64 {
        if self.per_token_us <= 0.0 {
            return f64::INFINITY;
        }
        1e6 / self.per_token_us
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_reproduces_both_points_and_grows_with_context() {
        let p1 = PublishedPoint {
            tokens: 128,
            micros: 16_000.0,
        };
        let p2 = PublishedPoint {
            tokens: 2048,
            micros: 133_000.0,
        };
        let c = CostModel::fit(p1, p2, 3.745e-5);
        assert!((c.device_time_us(128, 0) as f64 - 16_000.0).abs() <= 1.0);
        assert!((c.device_time_us(2048, 0) as f64 - 133_000.0).abs() <= 1.0);
        assert!(c.device_time_us(128, 8192) > c.device_time_us(128, 0));
        assert_eq!(c.device_time_us(0, 100), 0);
        // one chunk of 256 costs less than recomputing it as two chunks of 128 only by one
        // fixed cost: the attention terms agree.
        let whole = c.device_time_us(256, 0) as f64;
        let split = (c.device_time_us(128, 0) + c.device_time_us(128, 128)) as f64;
        assert!((split - whole - c.fixed_us).abs() <= 2.0);
    }
}
