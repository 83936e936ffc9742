//! `bench memory`: what one cold table touch costs on this machine. For each working-set
//! size it walks a random cycle through the set's 64-byte lines, each step's address read
//! from the previous step's line (dependent loads: no overlap, no prefetch can guess the
//! next line), and prints nanoseconds per step. The control path's cache-miss counts
//! (`valgrind --cache-sim`) are priced in this unit. It only measures; it never asserts a
//! figure.

use std::time::Instant;

/// 64-byte lines hold eight words; the chain's link sits in a line's first word.
const WORDS_PER_LINE: usize = 8;

/// A single random cycle through `lines` lines (Sattolo's shuffle: every line is visited
/// once before the walk returns to its start), stored as each line's successor in its first
/// word.
pub fn chain(lines: usize, seed: u64) -> Vec<u64> {
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = seed | 1;
    for i in (1..lines).rev() {
        // xorshift64: fast, and enough spread that no stride predictor follows it.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % i as u64) as usize;
        order.swap(i, j);
    }
    let mut words = vec![0u64; lines * WORDS_PER_LINE];
    for (k, &line) in order.iter().enumerate() {
        let next = order[(k + 1) % lines];
        words[line * WORDS_PER_LINE] = (next * WORDS_PER_LINE) as u64;
    }
    words
}

/// Follows the chain `steps` times from word 0; returns where it ended (so the walk cannot
/// be optimised away).
pub fn walk(words: &[u64], steps: u64) -> u64 {
    let mut at = 0u64;
    for _ in 0..steps {
        at = words.get(at as usize).copied().unwrap_or(0);
    }
    at
}

pub struct MemoryConfig {
    /// Working-set sizes in KiB.
    pub sizes_kib: Vec<u64>,
    /// Dependent loads timed per size (after one untimed pass over the set).
    pub steps: u64,
}

pub fn run(cfg: &MemoryConfig) -> Result<(), String> {
    if cfg.steps == 0 {
        return Err("--steps must be at least 1".into());
    }
    let mut rows = Vec::new();
    for &kib in &cfg.sizes_kib {
        let lines = (kib as usize * 1024) / (WORDS_PER_LINE * 8);
        if lines < 2 {
            return Err(format!("--sizes-kib {kib}: below two 64-byte lines"));
        }
        let words = chain(lines, 0x9e37_79b9_7f4a_7c15 ^ kib);
        // One pass brings the set into whatever level holds it (and faults its pages in).
        let warm = walk(&words, lines as u64);
        let t = Instant::now();
        let end = walk(&words, cfg.steps);
        let ns = t.elapsed().as_nanos() as f64 / cfg.steps as f64;
        println!(
            "memory {kib:>8} KiB: {ns:7.1} ns per dependent load ({} lines, {} steps, end {})",
            lines,
            cfg.steps,
            (warm ^ end) & 1
        );
        rows.push((kib, ns));
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "ratio largest / smallest working set: {:.1}x ns per load ({} KiB / {} KiB)",
            last.1 / first.1.max(f64::MIN_POSITIVE),
            last.0,
            first.0
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_visits_every_line_once_before_it_returns() {
        for lines in [2usize, 3, 17, 1000] {
            let words = chain(lines, 42);
            let mut seen = vec![false; lines];
            let mut at = 0usize;
            for _ in 0..lines {
                assert_eq!(at % WORDS_PER_LINE, 0, "links point at line starts");
                let line = at / WORDS_PER_LINE;
                assert!(!seen[line], "line {line} visited twice in {lines}");
                seen[line] = true;
                at = words[at] as usize;
            }
            assert_eq!(at, 0, "the walk returns to its start after {lines} steps");
            assert!(seen.iter().all(|s| *s));
            // Only each line's first word carries a link.
            assert!(words
                .iter()
                .enumerate()
                .all(|(i, w)| i % WORDS_PER_LINE == 0 || *w == 0));
        }
    }

    #[test]
    fn the_walk_ends_where_the_chain_says() {
        let words = chain(64, 7);
        let mut at = 0u64;
        for _ in 0..5 {
            at = words[at as usize];
        }
        assert_eq!(walk(&words, 5), at);
        assert_eq!(walk(&words, 64), 0);
    }

    #[test]
    fn bad_sizes_and_steps_are_refused() {
        let cfg = |sizes_kib: Vec<u64>, steps| MemoryConfig { sizes_kib, steps };
        assert!(run(&cfg(vec![4], 0)).unwrap_err().contains("--steps"));
        assert!(run(&cfg(vec![0], 10))
            .unwrap_err()
            .contains("--sizes-kib 0"));
        assert!(run(&cfg(vec![4, 8], 100)).is_ok());
    }
}
