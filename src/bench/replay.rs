//! `engine-host bench replay`: a public KV-cache trace (bench::trace) replayed through
//! `--instances N` real engine-host processes that share one L3 (the local store's
//! directory), open loop (`--speedup X` on the timestamps) or closed loop
//! (`--concurrency C`), routed round robin or by session affinity. Three cohorts on the
//! same instances' settings: `no-l3` (Device/Host caches only), `shared-l3` (a fresh shared
//! L3) and `restart` (fresh processes over the L3 the previous cohort populated). Reports
//! the ideal against the achieved cached-token rate per tier, every missed token by
//! reason, TTFT percentiles per cohort and errors (which fail the bench). It owns the
//! replay's orchestration and report only; engines are reached only through HTTP.

use super::http;
use super::plot::{Panel, Series};
use super::process::{metric_sum, EngineProcess};
use super::stats::percentile;
use super::trace::{self, Trace};
use actors::model::ModelProfile;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Routing {
    RoundRobin,
    /// By conversation (Bailian) or by the first block (Mooncake), as a prefix-aware
    /// router would.
    Affinity,
}

impl std::str::FromStr for Routing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "round-robin" => Ok(Routing::RoundRobin),
            "affinity" => Ok(Routing::Affinity),
            other => Err(format!(
                "unknown routing {other:?} (valid: round-robin, affinity)"
            )),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ReplayConfig {
    pub trace: PathBuf,
    pub limit: Option<usize>,
    pub instances: usize,
    pub profile: String,
    /// Open loop at `speedup` x the trace's timestamps; None: closed loop.
    pub speedup: Option<f64>,
    pub concurrency: usize,
    pub routing: Routing,
    /// Generated tokens per request: the trace's output length capped at this.
    pub max_output: u32,
    pub soft_deadline_ms: u64,
    pub emulate_device_time: bool,
    /// Device blocks per group of each instance (0: twice the longest prompt).
    pub device_blocks: u64,
    pub out: PathBuf,
    /// Share Mooncake Store (the instance deploy/mooncake/env.sh names) instead of a
    /// local-store directory.
    pub mooncake: bool,
    /// model.tail_hints of every instance (0: tails off).
    pub tail_hints: u32,
}

/// One replayed request.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Outcome {
    pub index: usize,
    pub instance: usize,
    pub prompt_tokens: u64,
    pub ideal_cached: u64,
    pub ttft_ms: f64,
    /// When the request was sent and when its response ended, ms from the replay's start.
    pub sent_ms: f64,
    pub done_ms: f64,
    pub device: u64,
    pub host: u64,
    pub l3: u64,
    pub computed: u64,
    pub fallback_reason: String,
    pub error: Option<String>,
}

impl Outcome {
    fn cached(&self) -> u64 {
        self.device + self.host + self.l3
    }
}

/// The cause a request's fallback names for its whole miss; None when it names none (a
/// miss or a partial hit: `missed_by_reason` splits those per block).
fn named_miss_reason(fallback: &str) -> Option<&'static str> {
    match fallback {
        "deadline" => Some("prefetch late (soft deadline)"),
        "pressure" => Some("pressure bypass"),
        "unhealthy" | "quarantine" => Some("backend unhealthy"),
        "disabled" => Some("l3 disabled"),
        _ => None,
    }
}

struct Cohort {
    name: &'static str,
    outcomes: Vec<Outcome>,
    wall_s: f64,
    /// Summed over instances at the cohort's end.
    counters: BTreeMap<String, f64>,
    drain_s: f64,
}

fn start_instances(
    cfg: &ReplayConfig,
    store: Option<&Path>,
    device_blocks: u64,
    cohort: &str,
) -> Result<Vec<EngineProcess>, String> {
    let mut args = vec![
        "--model-profile".to_string(),
        cfg.profile.clone(),
        "--store".into(),
    ];
    let mut extra = vec![];
    match store {
        Some(_) if cfg.mooncake => {
            args.push("mooncake".into());
            extra = super::process::mooncake_env()?;
        }
        Some(dir) => {
            args.extend([
                "local".into(),
                "--store-dir".into(),
                dir.display().to_string(),
            ]);
        }
        None => args.push("none".into()),
    }
    let envs: Vec<(String, String)> = [
        ("TSL3_MODEL__DEVICE", "emulated".to_string()),
        ("TSL3_MODEL__DEVICE_BLOCKS", device_blocks.to_string()),
        // Storage bounds that let the longest prompt the Device holds be queried and read
        // whole (the defaults bound one extension to 32768 tokens and 4096 keys).
        (
            "TSL3_STORAGE__CONTRACT__LOOKAHEAD_TOKENS",
            (device_blocks * 8).max(32768).to_string(),
        ),
        (
            "TSL3_STORAGE__CONTRACT__MAX_KEYS_PER_OPERATION",
            device_blocks.max(4096).to_string(),
        ),
        (
            "TSL3_STORAGE__CONTRACT__MAX_HOST_BLOCKS",
            (device_blocks * 2).max(8192).to_string(),
        ),
        (
            "TSL3_STORAGE__CONTRACT__SOFT_DEADLINE_MS",
            cfg.soft_deadline_ms.to_string(),
        ),
        (
            "TSL3_MODEL__EMULATE_DEVICE_TIME",
            cfg.emulate_device_time.to_string(),
        ),
        ("TSL3_MODEL__TAIL_HINTS", cfg.tail_hints.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain(extra)
    .collect();
    (0..cfg.instances)
        .map(|i| {
            let log = cfg.out.join("logs").join(format!("{cohort}-{i}.log"));
            EngineProcess::start(&args, &envs, &log, Duration::from_secs(120))
        })
        .collect()
}

/// The prompts' salt: none over a fresh local store; over Mooncake, whose objects outlive
/// the run, one per run (drawn once per process), so an earlier run's objects never count.
fn salt(cfg: &ReplayConfig) -> u64 {
    static SALT: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if !cfg.mooncake {
        return 0;
    }
    *SALT.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        super::stats::mix(nanos ^ u64::from(std::process::id()))
    })
}

fn route(cfg: &ReplayConfig, t: &Trace, i: usize) -> usize {
    let n = cfg.instances.max(1);
    match cfg.routing {
        Routing::RoundRobin => i % n,
        Routing::Affinity => {
            let r = &t.requests[i];
            let key = r
                .session
                .map(|s| s as u64)
                .or_else(|| r.hash_ids.first().copied())
                .unwrap_or(0);
            (super::stats::mix(key) % n as u64) as usize
        }
    }
}

fn replay_one(
    cfg: &ReplayConfig,
    t: &Trace,
    vocab: u32,
    ideal: &[u64],
    hosts: &[EngineProcess],
    i: usize,
    epoch: Instant,
) -> Outcome {
    let r = &t.requests[i];
    let instance = route(cfg, t, i);
    let max_tokens = (r.output_length.max(1)).min(u64::from(cfg.max_output.max(1)));
    let body = json!({
        "prompt": t.prompt(r, vocab, salt(cfg)), "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true},
    })
    .to_string();
    let mut o = Outcome {
        index: i,
        instance,
        prompt_tokens: r.input_length,
        ideal_cached: ideal[i],
        sent_ms: epoch.elapsed().as_secs_f64() * 1e3,
        ..Outcome::default()
    };
    match http::stream_completion(&hosts[instance].addr, &body, Duration::from_secs(900)) {
        Ok(s) if s.status == 200 && s.last.get("error").is_none() => {
            let x = &s.last["tsl3"];
            let n = |k: &str| x[k].as_u64().unwrap_or(0);
            o.ttft_ms = s.ttft.as_secs_f64() * 1e3;
            o.device = n("device");
            o.host = n("host");
            o.l3 = n("l3");
            o.computed = n("computed");
            o.fallback_reason = x["fallback_reason"].as_str().unwrap_or("?").to_string();
        }
        Ok(s) => o.error = Some(format!("{}: {}", s.status, s.last)),
        Err(e) => o.error = Some(e),
    }
    o.done_ms = epoch.elapsed().as_secs_f64() * 1e3;
    o
}

fn replay(
    cfg: &ReplayConfig,
    t: &Trace,
    vocab: u32,
    ideal: &[u64],
    hosts: &[EngineProcess],
) -> Vec<Outcome> {
    let n = t.requests.len();
    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::with_capacity(n));
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| match cfg.speedup {
        Some(x) => {
            // Open loop: each request at its (sped-up) timestamp, whatever is in flight.
            let t0 = t.requests.first().map_or(0.0, |r| r.timestamp_ms);
            for i in 0..n {
                let due = Duration::from_secs_f64(
                    ((t.requests[i].timestamp_ms - t0) / x.max(1e-9) / 1e3).max(0.0),
                );
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
                let results = &results;
                scope.spawn(move || {
                    let o = replay_one(cfg, t, vocab, ideal, hosts, i, start);
                    if let Ok(mut v) = results.lock() {
                        v.push(o);
                    }
                });
            }
        }
        None => {
            for _ in 0..cfg.concurrency.max(1) {
                let (next, results) = (&next, &results);
                scope.spawn(move || loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= n {
                        break;
                    }
                    let o = replay_one(cfg, t, vocab, ideal, hosts, i, start);
                    if let Ok(mut v) = results.lock() {
                        v.push(o);
                    }
                });
            }
        }
    });
    let mut v = results.into_inner().unwrap_or_default();
    v.sort_by_key(|o| o.index);
    v
}

const COUNTERS: [(&str, &str, &[&str]); 12] = [
    ("tail_tokens_reused", "tsl3_tail_tokens_reused_total", &[]),
    (
        "tail_candidates_queried",
        "tsl3_tail_candidates_queried_total",
        &[],
    ),
    (
        "backup_dropped_overflow",
        "tsl3_l3_dropped_backup_keys_total",
        &["reason=\"overflow\""],
    ),
    (
        "backup_dropped_pressure",
        "tsl3_l3_dropped_backup_keys_total",
        &["reason=\"pressure\""],
    ),
    (
        "backup_dropped_unavailable",
        "tsl3_l3_dropped_backup_keys_total",
        &["reason=\"unavailable\""],
    ),
    (
        "backup_dropped_other",
        "tsl3_l3_dropped_backup_keys_total",
        &["reason=\"disabled\""],
    ),
    (
        "put_operations_completed",
        "tsl3_l3_operations_total",
        &["kind=\"put\"", "outcome=\"completed\""],
    ),
    ("put_new_writes", "tsl3_l3_put_new_writes_total", &[]),
    ("pressure_bypasses", "tsl3_l3_pressure_bypasses_total", &[]),
    (
        "gate_closed_seconds",
        "tsl3_l3_admission_gate_closed_seconds_total",
        &[],
    ),
    ("soft_timeouts", "tsl3_l3_soft_timeouts_total", &[]),
    (
        "get_operations_completed",
        "tsl3_l3_operations_total",
        &["kind=\"get\"", "outcome=\"completed\""],
    ),
];

fn counters(hosts: &[EngineProcess]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for h in hosts {
        let Ok(text) = h.metrics() else { continue };
        for (name, metric, labels) in COUNTERS {
            *out.entry(name.to_string()).or_insert(0.0) += metric_sum(&text, metric, labels);
        }
    }
    out
}

fn run_cohort(
    cfg: &ReplayConfig,
    name: &'static str,
    store: Option<&Path>,
    t: &Trace,
    vocab: u32,
    ideal: &[u64],
    device_blocks: u64,
) -> Result<Cohort, String> {
    let hosts = start_instances(cfg, store, device_blocks, name)?;
    let start = Instant::now();
    let outcomes = replay(cfg, t, vocab, ideal, &hosts);
    let wall_s = start.elapsed().as_secs_f64();
    // Let every instance's backups land before it stops (the next cohort reads them).
    let drain = Instant::now();
    if store.is_some() {
        for h in &hosts {
            h.reset_local(true)?;
        }
    }
    let drain_s = drain.elapsed().as_secs_f64();
    let counters = counters(&hosts);
    for h in hosts {
        h.stop(Duration::from_secs(120))?;
    }
    Ok(Cohort {
        name,
        outcomes,
        wall_s,
        counters,
        drain_s,
    })
}

/// Missed tokens of every request by reason. A fallback that names its cause (deadline,
/// pressure, backend, disabled) takes the request's whole miss; otherwise each block the
/// trace had seen before but the request did not reuse (beyond its reused prefix) is
/// `prefix still in flight` when the earlier request that first computed it had not
/// finished when this one was sent, and `not in L3 after it was computed` (its backup was
/// dropped, had not landed yet, or its local copy was evicted) when it had.
fn missed_by_reason(c: &Cohort, t: &Trace, restart: bool) -> BTreeMap<&'static str, u64> {
    let b = t.format.block_tokens();
    let mut first: std::collections::HashMap<u64, usize> = Default::default();
    let mut out: BTreeMap<&'static str, u64> = BTreeMap::new();
    let by_index: std::collections::HashMap<usize, &Outcome> =
        c.outcomes.iter().map(|o| (o.index, o)).collect();
    for (i, r) in t.requests.iter().enumerate() {
        let Some(o) = by_index.get(&i).filter(|o| o.error.is_none()) else {
            continue;
        };
        let missed = o.ideal_cached.saturating_sub(o.cached());
        if missed > 0 {
            if let Some(named) = named_miss_reason(&o.fallback_reason) {
                *out.entry(named).or_insert(0) += missed;
            } else {
                let mut left = missed;
                for (j, id) in r.hash_ids.iter().enumerate() {
                    let start = j as u64 * b;
                    let len = b.min(r.input_length - start);
                    if start + len <= o.cached() || left == 0 {
                        continue;
                    }
                    let reason = match first.get(id) {
                        // Computed by an earlier request of this replay.
                        Some(&k) => match by_index.get(&k) {
                            Some(e) if e.done_ms > o.sent_ms => "prefix still in flight",
                            _ => "not in L3 after it was computed",
                        },
                        // The restart cohort's ideal counts every block: one this cohort
                        // has not met yet was computed by the previous cohort.
                        None if restart => "not in L3 after it was computed",
                        // Elsewhere a block first seen here is not in the ideal.
                        None => continue,
                    };
                    let n = len.min(left);
                    *out.entry(reason).or_insert(0) += n;
                    left -= n;
                }
                if left > 0 {
                    *out.entry("not in L3 after it was computed").or_insert(0) += left;
                }
            }
        }
        for id in &r.hash_ids {
            first.entry(*id).or_insert(i);
        }
    }
    out
}

fn summary(c: &Cohort, t: &Trace) -> serde_json::Value {
    let ok: Vec<&Outcome> = c.outcomes.iter().filter(|o| o.error.is_none()).collect();
    let prompt: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
    let ideal: u64 = ok.iter().map(|o| o.ideal_cached).sum();
    let sum = |f: fn(&Outcome) -> u64| ok.iter().map(|o| f(o)).sum::<u64>();
    let (device, host, l3) = (sum(|o| o.device), sum(|o| o.host), sum(|o| o.l3));
    let cached = device + host + l3;
    let rate = |x: u64| {
        if prompt == 0 {
            0.0
        } else {
            x as f64 / prompt as f64
        }
    };
    let missed = missed_by_reason(c, t, c.name == "restart");
    let mut fallbacks: BTreeMap<String, usize> = BTreeMap::new();
    for o in &ok {
        *fallbacks.entry(o.fallback_reason.clone()).or_insert(0) += 1;
    }
    let ttft: Vec<f64> = ok.iter().map(|o| o.ttft_ms).collect();
    let errors: Vec<&String> = c.outcomes.iter().filter_map(|o| o.error.as_ref()).collect();
    json!({
        "cohort": c.name,
        "requests": c.outcomes.len(),
        "errors": errors.len(),
        "first_errors": errors.iter().take(5).collect::<Vec<_>>(),
        "wall_s": c.wall_s,
        "backup_drain_s": c.drain_s,
        "prompt_tokens": prompt,
        "ideal_cached_tokens": ideal,
        "ideal_rate": rate(ideal),
        "achieved_rate": rate(cached),
        "achieved_over_ideal": if ideal == 0 { serde_json::Value::Null } else { json!(cached as f64 / ideal as f64) },
        "rate_by_tier": {"device": rate(device), "host": rate(host), "l3": rate(l3)},
        "missed_tokens_by_reason": missed,
        "fallbacks": fallbacks,
        "ttft_ms": {
            "p50": percentile(&ttft, 50.0),
            "p90": percentile(&ttft, 90.0),
            "p99": percentile(&ttft, 99.0),
        },
        "counters": c.counters,
    })
}

/// Runs the replay, prints the figures, writes replay.json and replay.svg. Err on any
/// request error (after writing what was measured).
pub fn run(cfg: &ReplayConfig) -> Result<(), String> {
    let text = std::fs::read_to_string(&cfg.trace)
        .map_err(|e| format!("--trace {}: {e}", cfg.trace.display()))?;
    let mut t = trace::parse(&text, cfg.limit)?;
    let profile = ModelProfile::by_name(&cfg.profile).map_err(|e| e.to_string())?;
    let tb = t.format.block_tokens();
    // A group's blocks divide the trace's, or (coarser, e.g. sparse State checkpoints)
    // are made of them: the ideal stays counted in the trace's blocks.
    if let Some(g) = profile
        .groups
        .iter()
        .find(|g| tb % g.block_tokens != 0 && g.block_tokens % tb != 0)
    {
        return Err(format!(
            "profile {} has {}-token blocks, which neither divide the trace's {tb}-token blocks nor are made of them; use a profile whose block size divides it (e.g. replay-small, 16-token blocks)",
            cfg.profile, g.block_tokens
        ));
    }
    let block = profile
        .groups
        .iter()
        .map(|g| g.block_tokens)
        .min()
        .unwrap_or(16);
    let device_blocks = if cfg.device_blocks > 0 {
        cfg.device_blocks
    } else {
        2 * (t.max_input() + u64::from(cfg.max_output)).div_ceil(block) + 64
    };
    // The engine refuses prompts longer than its Device holds: keep what fits, say so.
    let fits = (block * device_blocks).saturating_sub(1);
    let before = t.requests.len();
    t.requests.retain(|r| r.input_length <= fits);
    if t.requests.len() < before {
        println!(
            "bench replay: {} of {before} requests exceed the {fits}-token Device capacity and are left out",
            before - t.requests.len()
        );
    }
    if t.requests.is_empty() {
        return Err("no request of the trace fits the Device capacity".into());
    }
    let bytes_per_token: u64 = profile
        .groups
        .iter()
        .map(|g| g.shard_block_bytes(1).unwrap_or(0) / g.block_tokens.max(1))
        .sum();
    let unique_kv = t.unique_blocks() as u64 * tb * bytes_per_token;
    std::fs::create_dir_all(cfg.out.join("logs"))
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    let ideal = t.ideal_cached();
    println!(
        "bench replay: {} requests ({:?} format), {} instances, profile {}, {} routing, {}; unique KV of the replayed prefix: {:.2} GiB ({} blocks of {tb} tokens at {bytes_per_token} B/token)",
        t.requests.len(),
        t.format,
        cfg.instances,
        cfg.profile,
        match cfg.routing { Routing::RoundRobin => "round-robin", Routing::Affinity => "affinity" },
        match cfg.speedup {
            Some(x) => format!("open loop at {x}x"),
            None => format!("closed loop, concurrency {}", cfg.concurrency),
        },
        unique_kv as f64 / (1u64 << 30) as f64,
        t.unique_blocks()
    );
    let store = cfg.out.join("store");
    let _ = std::fs::remove_dir_all(&store);
    let vocab = profile.vocab;
    let mut cohorts = vec![run_cohort(
        cfg,
        "no-l3",
        None,
        &t,
        vocab,
        &ideal,
        device_blocks,
    )?];
    cohorts.push(run_cohort(
        cfg,
        "shared-l3",
        Some(&store),
        &t,
        vocab,
        &ideal,
        device_blocks,
    )?);
    // After the shared cohort every block of the prefix was computed once: the ideal of a
    // restarted fleet is the whole prompt but its last token.
    let all: Vec<u64> = t.requests.iter().map(|r| r.input_length - 1).collect();
    cohorts.push(run_cohort(
        cfg,
        "restart",
        Some(&store),
        &t,
        vocab,
        &all,
        device_blocks,
    )?);
    // The shared L3 is only needed by the cohorts: remove it (it can be large).
    let _ = std::fs::remove_dir_all(&store);
    let summaries: Vec<serde_json::Value> = cohorts.iter().map(|c| summary(c, &t)).collect();
    for s in &summaries {
        println!(
            "{:<10} requests {} errors {} ideal {:.3} achieved {:.3} (device {:.3} host {:.3} l3 {:.3}) achieved/ideal {} ttft p50 {} p90 {} p99 {} ms; missed {}; counters {}",
            s["cohort"].as_str().unwrap_or(""),
            s["requests"], s["errors"],
            s["ideal_rate"].as_f64().unwrap_or(0.0),
            s["achieved_rate"].as_f64().unwrap_or(0.0),
            s["rate_by_tier"]["device"].as_f64().unwrap_or(0.0),
            s["rate_by_tier"]["host"].as_f64().unwrap_or(0.0),
            s["rate_by_tier"]["l3"].as_f64().unwrap_or(0.0),
            s["achieved_over_ideal"],
            s["ttft_ms"]["p50"], s["ttft_ms"]["p90"], s["ttft_ms"]["p99"],
            s["missed_tokens_by_reason"], s["counters"],
        );
    }
    let p50 = |i: usize| summaries[i]["ttft_ms"]["p50"].as_f64();
    let ratios = json!({
        "shared_l3_over_no_l3_p50": p50(1).zip(p50(0)).map(|(a, b)| a / b),
        "restart_over_no_l3_p50": p50(2).zip(p50(0)).map(|(a, b)| a / b),
    });
    let doc = json!({
        "bench": "replay",
        "trace": cfg.trace.display().to_string(),
        "format": t.format,
        "requests": t.requests.len(),
        "instances": cfg.instances,
        "profile": cfg.profile,
        "routing": cfg.routing,
        "speedup": cfg.speedup,
        "concurrency": cfg.concurrency,
        "max_output": cfg.max_output,
        "soft_deadline_ms": cfg.soft_deadline_ms,
        "emulate_device_time": cfg.emulate_device_time,
        "device_blocks_per_group": device_blocks,
        "unique_kv_bytes": unique_kv,
        "cohorts": summaries,
        "ratios": ratios,
        "outcomes": cohorts.iter().map(|c| json!({"cohort": c.name, "requests": c.outcomes})).collect::<Vec<_>>(),
    });
    let json_path = cfg.out.join("replay.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )
    .map_err(|e| format!("{}: {e}", json_path.display()))?;
    let svg = cfg.out.join("replay.svg");
    plot(&cohorts, &svg)?;
    println!("wrote {} and {}", json_path.display(), svg.display());
    let errors: usize = cohorts
        .iter()
        .map(|c| c.outcomes.iter().filter(|o| o.error.is_some()).count())
        .sum();
    if errors > 0 {
        return Err(format!(
            "{errors} replayed requests failed (see {})",
            json_path.display()
        ));
    }
    println!(
        "replay shared-l3 achieved/ideal cached tokens: {}; restart: {}",
        summaries[1]["achieved_over_ideal"], summaries[2]["achieved_over_ideal"]
    );
    Ok(())
}

fn plot(cohorts: &[Cohort], path: &Path) -> Result<(), String> {
    let cdf = cohorts
        .iter()
        .map(|c| {
            let mut t: Vec<f64> = c
                .outcomes
                .iter()
                .filter(|o| o.error.is_none())
                .map(|o| o.ttft_ms)
                .collect();
            t.sort_by(|a, b| a.total_cmp(b));
            let n = t.len().max(1) as f64;
            Series {
                label: c.name.to_string(),
                points: t
                    .iter()
                    .enumerate()
                    .map(|(i, x)| (*x, (i + 1) as f64 / n))
                    .collect(),
            }
        })
        .collect();
    // Cumulative ideal and achieved cached-token rates in arrival order.
    let mut rates = vec![];
    for c in cohorts {
        let (mut p, mut i, mut a) = (0u64, 0u64, 0u64);
        let mut ideal = vec![];
        let mut achieved = vec![];
        for o in c.outcomes.iter().filter(|o| o.error.is_none()) {
            p += o.prompt_tokens;
            i += o.ideal_cached;
            a += o.cached();
            let x = (o.index + 1) as f64;
            ideal.push((x, i as f64 / p.max(1) as f64));
            achieved.push((x, a as f64 / p.max(1) as f64));
        }
        rates.push(Series {
            label: format!("{} achieved", c.name),
            points: achieved,
        });
        rates.push(Series {
            label: format!("{} ideal", c.name),
            points: ideal,
        });
    }
    super::plot::render_svg(
        path,
        &[
            Panel::Lines {
                title: "TTFT CDF per cohort".into(),
                x_label: "TTFT (ms)".into(),
                y_label: "fraction of requests".into(),
                log_x: true,
                log_y: false,
                series: cdf,
            },
            Panel::Lines {
                title: "cached-token rate over the replay (cumulative)".into(),
                x_label: "requests replayed".into(),
                y_label: "cached / prompt tokens".into(),
                log_x: false,
                log_y: false,
                series: rates,
            },
        ],
    )
}
