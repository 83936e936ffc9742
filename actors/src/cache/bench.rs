//! `engine-host bench matcher`: matching, query planning and reservation against large
//! Device and Host pools (default 100k Device blocks, 1M Host blocks, 32k-token prompts).
//!
//! Reports µs per request and per required block, and bookkeeping bytes per pooled block.
//! A benchmark, not a test: nothing here asserts a timing. It owns no pool beyond the run.

use super::coordinator::{CacheCoordinator, CoordinatorConfig, ExistenceHints, QueryLimits};
use super::credits::QueryCredits;
use super::geometry::{CacheGeometry, GroupSpec};
use super::keys::PromptIndex;
use messages::DeploymentIdentity;
use std::fmt;
use std::time::Instant;

/// Sizes of one run.
#[derive(Clone, Debug)]
pub struct MatcherBenchConfig {
    pub host_blocks: u32,
    pub device_blocks: u32,
    pub prompt_tokens: u32,
    /// Timed requests per phase.
    pub requests: u32,
}

impl Default for MatcherBenchConfig {
    fn default() -> Self {
        Self {
            host_blocks: 1_000_000,
            device_blocks: 100_000,
            prompt_tokens: 32 * 1024,
            requests: 64,
        }
    }
}

/// One timed phase.
#[derive(Clone, Debug, Default)]
pub struct PhaseFigures {
    pub name: &'static str,
    pub requests: u32,
    pub us_per_request: f64,
    pub us_per_block: f64,
    /// Average boundary found (tokens), to show the work was real.
    pub mean_boundary: f64,
}

/// The benchmark's figures.
#[derive(Clone, Debug, Default)]
pub struct MatcherBenchReport {
    pub geometry: String,
    pub host_blocks_pooled: u64,
    pub device_blocks_pooled: u64,
    pub blocks_per_request: u64,
    pub populate_seconds: f64,
    pub bookkeeping_bytes: u64,
    pub bytes_per_pooled_block: f64,
    pub phases: Vec<PhaseFigures>,
}

impl fmt::Display for MatcherBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "bench matcher: geometry {}", self.geometry)?;
        writeln!(
            f,
            "  pools: {} Host blocks, {} Device blocks (populated in {:.2} s)",
            self.host_blocks_pooled, self.device_blocks_pooled, self.populate_seconds
        )?;
        writeln!(
            f,
            "  memory: {} bookkeeping bytes, {:.1} bytes per pooled block",
            self.bookkeeping_bytes, self.bytes_per_pooled_block
        )?;
        writeln!(
            f,
            "  required blocks per request: {}",
            self.blocks_per_request
        )?;
        for p in &self.phases {
            writeln!(
                f,
                "  {:<28} {:>5} requests  {:>10.1} us/request  {:>8.3} us/block  mean boundary {:.0}",
                p.name, p.requests, p.us_per_request, p.us_per_block, p.mean_boundary
            )?;
        }
        Ok(())
    }
}

fn prompt(seed: u64, len: u32) -> Vec<u32> {
    // splitmix64: deterministic, distinct per seed.
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
    (0..len)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % 128_000) as u32
        })
        .collect()
}

fn geometry() -> CacheGeometry {
    let groups = vec![
        GroupSpec::full("attn", 16, 1, 64 * 1024),
        GroupSpec::sliding_window("swa", 4096, 16, 1, 32 * 1024),
        GroupSpec::state("ssm", 256, 256 * 1024),
    ];
    // Validated constants: this layout is always accepted.
    match CacheGeometry::new(groups, 1, 0) {
        Ok(g) => g,
        Err(e) => panic!("bench geometry rejected: {e}"),
    }
}

/// Splits a pool size over the three groups in proportion to their blocks per prompt.
fn split(total: u32) -> Vec<u32> {
    // Per 256 tokens: 16 Full, 16 SWA, 1 State block.
    let unit = total / 33;
    vec![unit * 16, unit * 16, total - unit * 32]
}

/// Runs the benchmark and returns its figures.
pub fn bench_matcher(cfg: &MatcherBenchConfig) -> MatcherBenchReport {
    let geo = geometry();
    let ns = DeploymentIdentity {
        checkpoint: "bench/matcher".into(),
        target_weight_version: 1,
        draft_weight_version: None,
        layout_signature: geo.layout_signature(),
        kvp: 1,
        qcp: 1,
        linear_attn_tp: 1,
        page_shard_counts: geo.page_shard_counts(),
    }
    .namespace();
    let config = CoordinatorConfig {
        device_blocks: split(cfg.device_blocks),
        host_blocks: split(cfg.host_blocks),
        tail_capacity: 4096,
    };
    let mut c = match CacheCoordinator::new(geo.clone(), ns, &config) {
        Ok(c) => c,
        Err(e) => panic!("bench coordinator: {e}"),
    };
    let len = cfg.prompt_tokens;
    let per_prompt = c.computed_blocks(&prompt(0, len), len).len().max(1) as u64;
    let host_prompts = (cfg.host_blocks as u64).div_ceil(per_prompt) as u32;
    // Device prompts hold their first quarter only.
    let device_prompts = (cfg.device_blocks as u64 * 4).div_ceil(per_prompt) as u32;

    let start = Instant::now();
    for s in 0..host_prompts {
        let blocks = c.computed_blocks(&prompt(s as u64, len), len);
        let _ = c.publish_d2h(&blocks);
    }
    // The Device holds the first quarter of the most recent Host prompts plus its own.
    for s in 0..device_prompts {
        let seed = (host_prompts - 1 - s % host_prompts.max(1)) as u64;
        let blocks = c.computed_blocks(&prompt(seed, len), len / 4);
        let _ = c.insert_device(&blocks);
    }
    let populate_seconds = start.elapsed().as_secs_f64();
    let host_pooled: u64 = (0..3).map(|g| c.host().len(g) as u64).sum();
    let device_pooled: u64 = (0..3).map(|g| c.device().len(g) as u64).sum();
    let bookkeeping = c.host().bookkeeping_bytes() + c.device().bookkeeping_bytes();

    // Request prompts: a resident prompt whose last quarter diverges (Device prefix + Host
    // middle + missing suffix), and fully cold prompts.
    let warm: Vec<Vec<u32>> = (0..cfg.requests)
        .map(|i| {
            let seed = (host_prompts - 1 - i % host_prompts.max(1)) as u64;
            let mut p = prompt(seed, len);
            let cut = (len / 4 * 3) as usize;
            p[cut..].copy_from_slice(&prompt(1_000_000 + i as u64, len - cut as u32));
            p
        })
        .collect();
    let cold: Vec<Vec<u32>> = (0..cfg.requests)
        .map(|i| prompt(2_000_000 + i as u64, len))
        .collect();
    let credits = QueryCredits {
        keys: 8192,
        host_blocks: 16384,
    };
    let limits = QueryLimits {
        lookahead_tokens: 0,
        min_extension_tokens: 256,
    };
    let mut phases = Vec::new();
    let mut timed = |name: &'static str, f: &mut dyn FnMut(&[u32]) -> u32, set: &[Vec<u32>]| {
        let t = Instant::now();
        let mut sum = 0u64;
        for p in set {
            sum += f(p) as u64;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / set.len().max(1) as f64;
        phases.push(PhaseFigures {
            name,
            requests: set.len() as u32,
            us_per_request: us,
            us_per_block: us / per_prompt as f64,
            mean_boundary: sum as f64 / set.len().max(1) as f64,
        });
    };
    timed(
        "prompt hashing (all groups)",
        &mut |p| PromptIndex::new(&geo, p, len).len(),
        &warm,
    );
    timed(
        "admission match (warm)",
        &mut |p| c.admission_match(p, len).boundary,
        &warm,
    );
    timed(
        "admission match (cold)",
        &mut |p| c.admission_match(p, len).boundary,
        &cold,
    );
    timed(
        "query planning (warm)",
        &mut |p| {
            let plan = c.plan_query(p, len, credits, limits);
            plan.boundaries.first().map_or(0, |b| b.boundary)
        },
        &warm,
    );
    timed(
        "query planning (cold)",
        &mut |p| {
            let plan = c.plan_query(p, len, credits, limits);
            plan.boundaries.first().map_or(0, |b| b.boundary)
        },
        &cold,
    );
    // Reservation with every queried key existing, then abandonment (state unchanged).
    let hints: Vec<ExistenceHints> = warm
        .iter()
        .map(|p| {
            let plan = c.plan_query(p, len, credits, limits);
            plan.existence_hints(&vec![true; plan.rows.len()])
                .unwrap_or_default()
        })
        .collect();
    let mut i = 0;
    let mut reserve = |p: &[u32]| {
        let h = &hints[i % hints.len()];
        i += 1;
        match c.reserve(p, len, h, credits.host_blocks) {
            Ok(r) => {
                let b = r.boundary;
                let _ = c.abandon(r);
                b
            }
            Err(_) => 0,
        }
    };
    timed("reserve + abandon (warm)", &mut reserve, &warm);

    MatcherBenchReport {
        geometry: geo.layout_signature(),
        host_blocks_pooled: host_pooled,
        device_blocks_pooled: device_pooled,
        blocks_per_request: per_prompt,
        populate_seconds,
        bookkeeping_bytes: bookkeeping,
        bytes_per_pooled_block: bookkeeping as f64 / (host_pooled + device_pooled).max(1) as f64,
        phases,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bench_runs_and_finds_the_warm_prefix() {
        let cfg = MatcherBenchConfig {
            host_blocks: 6_000,
            device_blocks: 1_500,
            prompt_tokens: 2048,
            requests: 3,
        };
        let r = bench_matcher(&cfg);
        assert!(r.host_blocks_pooled > 5_000 && r.host_blocks_pooled <= 6_000);
        assert!(r.device_blocks_pooled > 0 && r.device_blocks_pooled <= 1_500);
        assert_eq!(r.phases.len(), 6);
        assert_eq!(r.phases[0].mean_boundary, 2048.0, "hashed every token");
        // Warm prompts reuse up to their divergence point (3/4 of the prompt); cold ones
        // reuse nothing.
        assert_eq!(r.phases[1].mean_boundary, 1536.0);
        assert_eq!(r.phases[2].mean_boundary, 0.0);
        // Planning and reservation (every key existing) reach the request bound.
        assert_eq!(r.phases[3].mean_boundary, 2048.0);
        assert_eq!(r.phases[4].mean_boundary, 2048.0);
        assert_eq!(r.phases[5].mean_boundary, 2048.0);
        assert!(r.bytes_per_pooled_block > 0.0);
        assert!(r.to_string().contains("us/request"));
    }
}
