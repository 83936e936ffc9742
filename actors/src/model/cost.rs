//! The device-time cost model of the synthetic forward: a number of microseconds the engine
//! host uses to emulate device time. It never sleeps and never reads a clock.
//!
//! `device_time_us(new, context) = fixed_us + per_token_us * new
//!                                 + per_token_context_ns / 1000 * new * (context + new / 2)`
//!
//! `context` is the number of tokens already in the KV cache before this step (the reused
//! prefix); the `new / 2` term is the average causal attention span inside the new chunk, so
//! one prefill of `n` tokens and recomputation of the same `n` tokens cost the same.
//!
//! A round is one batched device step ([`CostModel::round_us`]): every prefill chunk and
//! every decode token of the round share one fixed cost, H2D copies (which the forward
//! reads) come first at the profile's stated PCIe bandwidth, and the D2H of new KV runs on
//! its own copy engine beside the forward.

/// Device time of one forward step, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    pub fixed_us: f64,
    pub per_token_us: f64,
    pub per_token_context_ns: f64,
    /// Host <-> device copy bandwidth (bytes per second, each direction) the profile
    /// states for its PCIe link; its source is documented with the profile.
    pub pcie_bytes_per_s: f64,
}

/// One step item of a batched round: `new` tokens computed on top of `context` cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepItem {
    pub new: u64,
    pub context: u64,
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
        (self.fixed_us + self.variable_us(new_tokens, context_tokens))
            .max(0.0)
            .round() as u64
    }

    /// The per-token part of a step (everything but the fixed cost).
    fn variable_us(&self, new_tokens: u64, context_tokens: u64) -> f64 {
        let n = new_tokens as f64;
        let ctx = context_tokens as f64 + n / 2.0;
        self.per_token_us * n + self.per_token_context_ns / 1000.0 * n * ctx
    }

    /// Copy time of `bytes` over the profile's PCIe link, microseconds.
    pub fn copy_us(&self, bytes: u64) -> f64 {
        if bytes == 0 || self.pcie_bytes_per_s <= 0.0 {
            return 0.0;
        }
        bytes as f64 / self.pcie_bytes_per_s * 1e6
    }

    /// Device time of one round: the H2D copies first (the forward reads them), then one
    /// batched forward over every item (one fixed cost for the batch, prefill chunks and
    /// decode tokens alike), with the D2H of new KV on its own copy engine beside it.
    pub fn round_us(&self, items: &[StepItem], h2d_bytes: u64, d2h_bytes: u64) -> u64 {
        let compute: f64 = if items.iter().any(|i| i.new > 0) {
            self.fixed_us
                + items
                    .iter()
                    .filter(|i| i.new > 0)
                    .map(|i| self.variable_us(i.new, i.context))
                    .sum::<f64>()
        } else {
            0.0
        };
        let us = self.copy_us(h2d_bytes) + compute.max(self.copy_us(d2h_bytes));
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
            pcie_bytes_per_s: 0.0,
        }
    }

    /// The same model with copies at `bytes_per_s` over PCIe.
    pub fn with_pcie(mut self, bytes_per_s: f64) -> Self {
        self.pcie_bytes_per_s = bytes_per_s;
        self
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

    #[test]
    fn a_round_batches_one_fixed_cost_and_charges_copies() {
        let c = CostModel {
            fixed_us: 1000.0,
            per_token_us: 10.0,
            per_token_context_ns: 0.0,
            pcie_bytes_per_s: 1e9,
        };
        let item = |new, context| StepItem { new, context };
        // Two prefills and two decode tokens: one fixed cost, every token charged.
        assert_eq!(
            c.round_us(&[item(100, 0), item(50, 10), item(1, 99), item(1, 7)], 0, 0),
            1000 + 10 * 152
        );
        // Nothing to compute and nothing to copy: no device time.
        assert_eq!(c.round_us(&[], 0, 0), 0);
        assert_eq!(c.round_us(&[item(0, 5)], 0, 0), 0);
        // H2D is serial before the forward; D2H overlaps it.
        assert_eq!(c.round_us(&[item(1, 0)], 1_000_000, 0), 1000 + 1010);
        assert_eq!(c.round_us(&[item(1, 0)], 0, 500_000), 1010);
        assert_eq!(c.round_us(&[item(1, 0)], 0, 5_000_000), 5000);
        assert_eq!(c.round_us(&[], 2_000_000, 0), 2000);
        // A decode step is charged (it was free before).
        assert!(c.round_us(&[item(1, 4096)], 0, 0) > 0);
    }
}
