//! Small statistics and deterministic inputs shared by the benchmarks: percentiles, and
//! prompts made of seeded pseudo-random tokens (equal seeds, equal prompts; different
//! seeds share no block). Pure functions.

/// The nearest-rank percentile (`p` in 0..=100) of `values`; None when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// splitmix64: a fast, well-mixed step for deterministic token streams.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `len` tokens below `vocab` drawn from `seed`.
pub fn tokens(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    let vocab = u64::from(vocab.max(1));
    (0..len as u64)
        .map(|i| (mix(seed ^ mix(i)) % vocab) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 90.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[f64::NAN, 2.0], 50.0), Some(2.0));
    }

    #[test]
    fn prompts_are_deterministic_and_distinct() {
        assert_eq!(tokens(7, 64, 1000), tokens(7, 64, 1000));
        assert_ne!(tokens(7, 64, 1000)[..4], tokens(8, 64, 1000)[..4]);
        assert!(tokens(9, 1000, 10).iter().all(|t| *t < 10));
    }
}
