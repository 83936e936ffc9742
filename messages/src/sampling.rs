//! How a request's tokens are chosen and what a client learns about each choice: the
//! OpenAI sampling parameters that ride a new request to every rank ([`SamplingParams`]),
//! and the log-probabilities of one chosen token ([`TokenLogprobs`]).
//!
//! Types and their validation only: no sampling arithmetic (that is `actors::model::sampling`),
//! no I/O. Floats travel as their IEEE-754 bits where a type must be `Eq` (a frame is compared
//! and hashed whole), so what the leader sent is what every rank reads, bit for bit.

use serde::{Deserialize, Serialize};

/// The most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u8 = 20;

/// How the next token is drawn from the model's scores. `temperature` 0 is greedy (the
/// highest score, the lowest token ID on a tie); otherwise the scores are divided by the
/// temperature, cut to the `top_k` highest (0: all) and to the smallest set whose
/// probability reaches `top_p` (1: all), and one token is drawn with a generator seeded by
/// `seed` and the token's position in the output, so a seed reproduces a completion.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: u64,
    /// Some(n): report the chosen token's log-probability and the `n` most likely tokens'.
    pub logprobs: Option<u8>,
}

// Eq is sound: `validate` refuses NaN, and a request is never admitted without it.
impl Eq for SamplingParams {}

impl Default for SamplingParams {
    fn default() -> Self {
        Self::GREEDY
    }
}

impl SamplingParams {
    /// The highest score every step, no log-probabilities.
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
        logprobs: None,
    };

    /// Always the highest-scoring token (temperature 0 or a top-k of one).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Whether the scores are needed at all (the synthetic model skips building them for
    /// a greedy request without log-probabilities).
    pub fn needs_scores(&self) -> bool {
        !self.is_greedy() || self.logprobs.is_some()
    }

    /// The ranges the OpenAI API allows; the message names the parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || !(0.0..=2.0).contains(&self.temperature) {
            return Err(format!(
                "temperature must be between 0 and 2, got {}",
                self.temperature
            ));
        }
        if !self.top_p.is_finite() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return Err(format!(
                "top_p must be greater than 0 and at most 1, got {}",
                self.top_p
            ));
        }
        if let Some(n) = self.logprobs {
            if n > MAX_TOP_LOGPROBS {
                return Err(format!(
                    "top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {n}"
                ));
            }
        }
        Ok(())
    }
}

/// The log-probability of one chosen token and of the most likely tokens at its position
/// (natural log, over the model's raw scores: temperature and cuts do not change them).
/// Stored as f32 bits so the type is `Eq` and travels exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TokenLogprobs {
    logprob_bits: u32,
    /// (token, log-probability bits), most likely first.
    top_bits: Vec<(u32, u32)>,
}

impl TokenLogprobs {
    pub fn new(logprob: f32, top: impl IntoIterator<Item = (u32, f32)>) -> Self {
        Self {
            logprob_bits: logprob.to_bits(),
            top_bits: top.into_iter().map(|(t, l)| (t, l.to_bits())).collect(),
        }
    }
    pub fn logprob(&self) -> f32 {
        f32::from_bits(self.logprob_bits)
    }
    /// (token, log-probability), most likely first.
    pub fn top(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        self.top_bits.iter().map(|(t, l)| (*t, f32::from_bits(*l)))
    }
    pub fn top_len(&self) -> usize {
        self.top_bits.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_parameter() {
        assert!(SamplingParams::GREEDY.validate().is_ok());
        let bad = |p: SamplingParams| p.validate().unwrap_err();
        let g = SamplingParams::GREEDY;
        assert!(bad(SamplingParams {
            temperature: f32::NAN,
            ..g
        })
        .starts_with("temperature"));
        assert!(bad(SamplingParams {
            temperature: 2.5,
            ..g
        })
        .starts_with("temperature"));
        assert!(bad(SamplingParams { top_p: 0.0, ..g }).starts_with("top_p"));
        assert!(bad(SamplingParams { top_p: 1.5, ..g }).starts_with("top_p"));
        assert!(bad(SamplingParams {
            logprobs: Some(21),
            ..g
        })
        .starts_with("top_logprobs"));
    }

    #[test]
    fn greedy_and_scores() {
        let g = SamplingParams::GREEDY;
        assert!(g.is_greedy() && !g.needs_scores());
        let warm = SamplingParams {
            temperature: 0.7,
            ..g
        };
        assert!(!warm.is_greedy() && warm.needs_scores());
        assert!(SamplingParams { top_k: 1, ..warm }.is_greedy());
        assert!(SamplingParams {
            logprobs: Some(0),
            ..g
        }
        .needs_scores());
    }

    #[test]
    fn logprobs_travel_bit_exact() {
        let l = TokenLogprobs::new(-0.125, [(7, -0.125), (3, -2.5)]);
        let bytes = rmp_serde::to_vec(&l).unwrap();
        let back: TokenLogprobs = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, l);
        assert_eq!(back.logprob(), -0.125);
        assert_eq!(back.top().collect::<Vec<_>>(), vec![(7, -0.125), (3, -2.5)]);
    }
}
