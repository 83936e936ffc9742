//! `engine-host bench ttft`: end-to-end time to first token of real engine-host processes
//! on loopback, per cohort, over a sweep of prompt lengths (seed 000, "Initial scope and
//! validation"). Every cohort runs with the same Device capacity, the same wait budget (the
//! soft deadline) and a warm-up request outside the timed cohort; local caches are reset
//! only while idle (`POST /admin/reset_local`, which never touches L3). Every restored
//! output is compared with recomputation of the same prompt in a process with no L3; a
//! difference fails the bench. Partial hits, misses and fallbacks stay in the results.
//!
//! Cohorts (the prefix each timed request finds):
//! - `recompute`: no tier (`--store none`, caches reset before the request);
//! - `device`: Device (L1); `host`: Host (L2) after the Device was reset (`--store none`);
//! - `l3-dfs-warm` / `l3-dfs-cold`: the shared-DFS tier in a fresh process with empty
//!   local caches, with the files in the page cache or dropped from it;
//! - `l3-memory`: the local store's MEMORY tier in a long-running process whose L1/L2 were
//!   reset while idle;
//! - `partial`: the first half of the prompt in L3 (MEMORY), the rest new;
//! - `miss`: a fresh prompt with L3 enabled (the QUERY finds nothing);
//! - `l3-mooncake` (with `--mooncake`): Mooncake Store as the MEMORY tier, in a
//!   long-running process whose L1/L2 were reset while idle (the instance
//!   deploy/mooncake/env.sh names).
//!
//! It owns process orchestration and the report; it never reaches into an engine's state
//! other than through its HTTP API, and never asserts a timing.

use super::http::{self, Streamed};
use super::plot::{Panel, Series, StackedBar};
use super::process::{drop_page_cache, metric_sum, EngineProcess};
use super::raw_transfer::{beyond_raw, memcpy_bandwidth, page_cache_read_bandwidth, BeyondRaw};
use super::stats::{percentile, tokens};
use actors::model::{GroupKind, ModelProfile};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const COHORTS: [&str; 9] = [
    "recompute",
    "device",
    "host",
    "l3-dfs-warm",
    "l3-dfs-cold",
    "l3-memory",
    "partial",
    "miss",
    "l3-mooncake",
];

/// Tokens per block of a model directory's geometry (`model.block_tokens`'s default).
const MODEL_DIR_BLOCK_TOKENS: u64 = 16;

/// What to measure.
#[derive(Clone, Debug)]
pub struct TtftConfig {
    pub profile: String,
    /// A model directory served by the transformer backend instead of `profile` (real
    /// compute: no modeled device time).
    pub model_dir: Option<PathBuf>,
    pub lengths: Vec<u64>,
    pub runs: usize,
    /// The one wait budget of every cohort: `storage.contract.soft_deadline_ms`.
    pub soft_deadline_ms: u64,
    /// Sleep the cost model's device time (the default), or run as fast as the CPU can.
    pub emulate_device_time: bool,
    /// Tokens generated per timed request (TTFT is the first one).
    pub max_tokens: u32,
    /// Decode length of the TPOT interference check (0: skip it).
    pub tpot_tokens: u32,
    /// Output directory: ttft.json, ttft.svg, the processes' logs (the store directories
    /// live there while a length runs and are removed after it).
    pub out: PathBuf,
    /// Also measure Mooncake Store as the MEMORY tier (settings from the environment
    /// deploy/mooncake/env.sh exports).
    pub mooncake: bool,
    /// Only these cohorts (empty: all); `recompute` always runs.
    pub cohorts: Vec<String>,
}

impl TtftConfig {
    /// Whether any of `cohorts` is measured.
    fn wants(&self, cohorts: &[&str]) -> bool {
        self.cohorts.is_empty() || cohorts.iter().any(|c| self.cohorts.iter().any(|w| w == c))
    }

    /// An unknown cohort name: the one error line naming it.
    pub fn check_cohorts(&self) -> Result<(), String> {
        match self.cohorts.iter().find(|c| !COHORTS.contains(&c.as_str())) {
            Some(c) => Err(format!(
                "--cohorts: unknown cohort {c:?} (one of {})",
                COHORTS.join(", ")
            )),
            None => Ok(()),
        }
    }
    /// The model measured: the synthetic profile, or `dir:<path>` for a model directory.
    pub fn model_name(&self) -> String {
        match &self.model_dir {
            None => self.profile.clone(),
            Some(d) => format!("dir:{}", d.display()),
        }
    }
}

/// One timed request.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    pub cohort: &'static str,
    pub tokens: u64,
    pub run: usize,
    pub ttft_ms: f64,
    pub device: u64,
    pub host: u64,
    pub l3: u64,
    pub computed: u64,
    pub fallback_reason: String,
    pub output_matches_recompute: bool,
    /// The L3 GET the request's restore made, read from the process's /metrics around the
    /// request (None for a cohort that restores nothing from L3, or when none was exported).
    pub l3_get: Option<L3Get>,
}

/// One request's L3 GET: the executor's backend time and payload bytes of GET operations,
/// and the backend time of the QUERY before it, the differences of the cumulative counters
/// around the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct L3Get {
    pub backend_ms: f64,
    pub bytes: u64,
    pub query_ms: f64,
}

/// The cumulative L3 counters of a Prometheus exposition, each summed over its label sets.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct L3Counters {
    get_seconds: f64,
    get_bytes: f64,
    get_calls: f64,
    query_seconds: f64,
}

fn get_counters(exposition: &str) -> L3Counters {
    let sum = |name, kind| metric_sum(exposition, name, &[kind]);
    const GET: &str = "kind=\"get\"";
    L3Counters {
        get_seconds: sum("tsl3_l3_backend_seconds_total", GET),
        get_bytes: sum("tsl3_l3_payload_bytes_total", GET),
        get_calls: sum("tsl3_l3_backend_calls_total", GET),
        query_seconds: sum("tsl3_l3_backend_seconds_total", "kind=\"query\""),
    }
}

struct Bench<'a> {
    cfg: &'a TtftConfig,
    profile: ModelProfile,
    device_blocks: u64,
    host_bytes: u64,
    memory_tier_bytes: u64,
    samples: Vec<Sample>,
    mismatches: Vec<String>,
    logs: usize,
}

/// The prompts of one length and their recomputed outputs.
struct Prompts {
    len: u64,
    /// The timed prompts (one per run), their halves-then-new variants and fresh ones.
    p: Vec<Vec<u32>>,
    h: Vec<Vec<u32>>,
    q: Vec<Vec<u32>>,
    /// Recomputed output by (1: p, 2: q, 3: h; run).
    refs: BTreeMap<(u64, usize), Vec<u64>>,
}

/// Where a process keeps L3.
enum Store<'p> {
    None,
    Local(&'p Path),
    Mooncake,
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The figures of one cohort at one length.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub cohort: &'static str,
    pub tokens: u64,
    pub runs: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub mean_device: f64,
    pub mean_host: f64,
    pub mean_l3: f64,
    pub mean_computed: f64,
    pub fallbacks: BTreeMap<String, usize>,
    pub outputs_equal: usize,
    /// Mean L3 GET of the runs that made one (None when none did).
    pub mean_l3_get: Option<L3Get>,
    /// The median over those runs of each run's TTFT beyond its own GET (an outlier run
    /// moves a mean GET, not this).
    pub p50_beyond_get_ms: Option<f64>,
}

/// The seeds of a length's prompts: P (the cohort prompt), Q (a fresh one for `miss`),
/// H (P's first half followed by new tokens, for `partial`), W (warm-up).
fn prompt(kind: u64, len: u64, run: usize, vocab: u32) -> Vec<u32> {
    let seed = (kind << 56) ^ (len << 20) ^ run as u64;
    tokens(seed, len as usize, vocab)
}

impl<'a> Bench<'a> {
    fn new(cfg: &'a TtftConfig) -> Result<Self, String> {
        let profile = match &cfg.model_dir {
            None => ModelProfile::by_name(&cfg.profile).map_err(|e| e.to_string())?,
            Some(dir) => {
                actors::model::checkpoint::read(dir, MODEL_DIR_BLOCK_TOKENS, 1)
                    .map_err(|e| e.to_string())?
                    .1
            }
        };
        let max_len = *cfg.lengths.iter().max().ok_or("no prompt length given")?;
        let block = profile
            .groups
            .iter()
            .map(|g| g.block_tokens)
            .min()
            .ok_or("the profile has no cache group")?;
        // Equal Device capacity for every cohort: the longest prompt, its output and a
        // warm-up, with room to spare.
        let device_blocks =
            (max_len + u64::from(cfg.max_tokens.max(cfg.tpot_tokens)) + 64).div_ceil(block) + 64;
        let per_block: u64 = profile
            .groups
            .iter()
            .map(|g| g.shard_block_bytes(1).unwrap_or(0))
            .sum();
        let kv_bytes = device_blocks * per_block;
        Ok(Self {
            cfg,
            profile,
            device_blocks,
            host_bytes: kv_bytes * 3 / 2,
            memory_tier_bytes: kv_bytes * 3 / 2 + (64 << 20),
            samples: vec![],
            mismatches: vec![],
            logs: 0,
        })
    }

    fn vocab(&self) -> u32 {
        self.profile.vocab
    }

    fn start(&mut self, store: Option<&Path>, what: &str) -> Result<EngineProcess, String> {
        self.start_with(store.map(Store::Local).unwrap_or(Store::None), what)
    }

    fn start_with(&mut self, store: Store, what: &str) -> Result<EngineProcess, String> {
        let mut args = match &self.cfg.model_dir {
            None => vec!["--model-profile".to_string(), self.cfg.profile.clone()],
            Some(d) => vec!["--model-dir".to_string(), d.display().to_string()],
        };
        args.push("--store".into());
        let mut extra: Vec<(String, String)> = vec![];
        match store {
            Store::Local(dir) => {
                args.push("local".into());
                args.push("--store-dir".into());
                args.push(dir.display().to_string());
            }
            Store::None => args.push("none".into()),
            Store::Mooncake => {
                args.push("mooncake".into());
                extra.extend(super::process::mooncake_env()?);
            }
        }
        let envs: Vec<(String, String)> = [
            ("TSL3_MODEL__DEVICE", "emulated".to_string()),
            ("TSL3_MODEL__DEVICE_BLOCKS", self.device_blocks.to_string()),
            ("TSL3_HOST_CACHE__SIZE_BYTES", self.host_bytes.to_string()),
            (
                "TSL3_STORAGE__LOCAL__MEMORY_BYTES",
                self.memory_tier_bytes.to_string(),
            ),
            (
                "TSL3_STORAGE__CONTRACT__SOFT_DEADLINE_MS",
                self.cfg.soft_deadline_ms.to_string(),
            ),
            (
                "TSL3_MODEL__EMULATE_DEVICE_TIME",
                self.cfg.emulate_device_time.to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(extra)
        .collect();
        self.logs += 1;
        let log = self
            .cfg
            .out
            .join("logs")
            .join(format!("{:02}-{what}.log", self.logs));
        EngineProcess::start(&args, &envs, &log, Duration::from_secs(120))
    }

    fn body(prompt: &[u32], max_tokens: u32) -> String {
        json!({
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string()
    }

    /// A completion that must succeed: its stream and output tokens.
    fn complete(
        &self,
        p: &EngineProcess,
        prompt: &[u32],
        max_tokens: u32,
    ) -> Result<(Streamed, Vec<u64>), String> {
        let s = http::stream_completion(
            &p.addr,
            &Self::body(prompt, max_tokens),
            Duration::from_secs(900),
        )?;
        if s.status != 200 || s.last.get("error").is_some() {
            return Err(format!(
                "completion failed ({}): {} [{}]",
                s.status,
                s.last,
                p.log_tail()
            ));
        }
        let out = s.last["tsl3"]["output_tokens"]
            .as_array()
            .ok_or_else(|| format!("no tsl3.output_tokens in {}", s.last))?
            .iter()
            .filter_map(|v| v.as_u64())
            .collect();
        Ok((s, out))
    }

    fn warm_up(&self, p: &EngineProcess, len: u64) -> Result<(), String> {
        let w = prompt(0xfe, len.min(2048), 0, self.vocab());
        self.complete(p, &w, self.cfg.max_tokens).map(|_| ())
    }

    /// One timed request's sample, with the L3 GET it made (`complete_l3`) or None.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &mut self,
        cohort: &'static str,
        len: u64,
        run: usize,
        s: &Streamed,
        out: &[u64],
        reference: &[u64],
        l3_get: Option<L3Get>,
    ) {
        let t = &s.last["tsl3"];
        let n = |k: &str| t[k].as_u64().unwrap_or(0);
        let ok = out == reference;
        if !ok {
            self.mismatches.push(format!(
                "{cohort} at {len} tokens, run {run}: output {out:?} differs from recomputation {reference:?}"
            ));
        }
        self.samples.push(Sample {
            cohort,
            tokens: len,
            run,
            ttft_ms: s.ttft.as_secs_f64() * 1e3,
            device: n("device"),
            host: n("host"),
            l3: n("l3"),
            computed: n("computed"),
            fallback_reason: t["fallback_reason"].as_str().unwrap_or("?").to_string(),
            output_matches_recompute: ok,
            l3_get,
        });
    }

    /// `complete` for a request that restores from L3, with the GET it made: the counters
    /// are read before and after (the exporter publishes once storage turns idle, so the
    /// second read waits a little for the GET's call to appear).
    fn complete_l3(
        &self,
        p: &EngineProcess,
        prompt: &[u32],
        max_tokens: u32,
    ) -> Result<(Streamed, Vec<u64>, Option<L3Get>), String> {
        let before = get_counters(&p.metrics()?);
        let (s, out) = self.complete(p, prompt, max_tokens)?;
        let mut after = get_counters(&p.metrics()?);
        for _ in 0..20 {
            if after.get_calls > before.get_calls {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            after = get_counters(&p.metrics()?);
        }
        let get = (after.get_calls > before.get_calls).then(|| L3Get {
            backend_ms: (after.get_seconds - before.get_seconds) * 1e3,
            bytes: (after.get_bytes - before.get_bytes).max(0.0) as u64,
            query_ms: (after.query_seconds - before.query_seconds).max(0.0) * 1e3,
        });
        Ok((s, out, get))
    }

    fn length(&mut self, len: u64, tpot: &mut Vec<serde_json::Value>) -> Result<(), String> {
        let runs = self.cfg.runs.max(1);
        let v = self.vocab();
        let p: Vec<Vec<u32>> = (0..runs).map(|i| prompt(1, len, i, v)).collect();
        let q: Vec<Vec<u32>> = (0..runs).map(|i| prompt(2, len, i, v)).collect();
        let h: Vec<Vec<u32>> = (0..runs)
            .map(|i| {
                let mut x = p[i][..(len / 2) as usize].to_vec();
                x.extend(prompt(3, len - len / 2, i, v));
                x
            })
            .collect();
        let mt = self.cfg.max_tokens;
        // Recompute, and the reference output of every prompt (each in no tier).
        let r = self.start(None, &format!("recompute-{len}"))?;
        self.warm_up(&r, len)?;
        let mut refs: BTreeMap<(u64, usize), Vec<u64>> = BTreeMap::new();
        for i in 0..runs {
            r.reset_local(true)?;
            let (s, out) = self.complete(&r, &p[i], mt)?;
            self.record("recompute", len, i, &s, &out, &out.clone(), None);
            refs.insert((1, i), out);
            for (kind, prompt) in [(2, &q[i]), (3, &h[i])] {
                r.reset_local(true)?;
                refs.insert((kind, i), self.complete(&r, prompt, mt)?.1);
            }
        }
        r.stop(Duration::from_secs(60))?;
        let pr = Prompts { len, p, h, q, refs };
        if self.cfg.wants(&["device", "host"]) {
            self.device_and_host(&pr)?;
        }
        if self.cfg.wants(&["l3-dfs-warm", "l3-dfs-cold"]) {
            self.dfs(&pr)?;
        }
        if self.cfg.wants(&["l3-memory", "partial", "miss"]) {
            self.memory(&pr, tpot)?;
        }
        if self.cfg.mooncake && self.cfg.wants(&["l3-mooncake"]) {
            self.mooncake(len)?;
        }
        Ok(())
    }

    /// Device and Host hits (no L3).
    fn device_and_host(&mut self, pr: &Prompts) -> Result<(), String> {
        let (len, p, refs) = (pr.len, &pr.p, &pr.refs);
        let runs = self.cfg.runs.max(1);
        let mt = self.cfg.max_tokens;
        let d = self.start(None, &format!("device-host-{len}"))?;
        self.warm_up(&d, len)?;
        for i in 0..runs {
            d.reset_local(true)?;
            let (_, out) = self.complete(&d, &p[i], mt)?;
            self.check_prime("device", len, i, &out, &refs[&(1, i)]);
            let (s, out) = self.complete(&d, &p[i], mt)?;
            self.record("device", len, i, &s, &out, &refs[&(1, i)], None);
            d.reset_local(false)?;
            let (s, out) = self.complete(&d, &p[i], mt)?;
            self.record("host", len, i, &s, &out, &refs[&(1, i)], None);
        }
        d.stop(Duration::from_secs(60))?;
        Ok(())
    }

    /// The shared-DFS tier: a writer backs the prompts up, then fresh processes read.
    fn dfs(&mut self, pr: &Prompts) -> Result<(), String> {
        let (len, p, refs) = (pr.len, &pr.p, &pr.refs);
        let runs = self.cfg.runs.max(1);
        let mt = self.cfg.max_tokens;
        let dfs = self.cfg.out.join(format!("store-dfs-{len}"));
        let _ = std::fs::remove_dir_all(&dfs);
        let w = self.start(Some(&dfs), &format!("dfs-writer-{len}"))?;
        self.warm_up(&w, len)?;
        for i in 0..runs {
            let (_, out) = self.complete(&w, &p[i], mt)?;
            self.check_prime("l3-dfs", len, i, &out, &refs[&(1, i)]);
            // Waits until this prompt's backups landed, before the next one can evict
            // their Host sources (what was written is then what the readers find).
            w.reset_local(true)?;
        }
        w.stop(Duration::from_secs(120))?;
        for (cohort, cold) in [("l3-dfs-warm", false), ("l3-dfs-cold", true)] {
            if !self.cfg.wants(&[cohort]) {
                continue;
            }
            for i in 0..runs {
                let f = self.start(Some(&dfs), &format!("{cohort}-{len}-{i}"))?;
                self.warm_up(&f, len)?;
                f.reset_local(true)?;
                if cold {
                    drop_page_cache(&dfs)?;
                }
                let (s, out, get) = self.complete_l3(&f, &p[i], mt)?;
                self.record(cohort, len, i, &s, &out, &refs[&(1, i)], get);
                f.stop(Duration::from_secs(120))?;
            }
        }
        // The stores hold GiBs of KV at long lengths: gone once their cohorts ran.
        let _ = std::fs::remove_dir_all(&dfs);
        Ok(())
    }

    /// The MEMORY tier of a long-running process, partial hits and misses.
    fn memory(&mut self, pr: &Prompts, tpot: &mut Vec<serde_json::Value>) -> Result<(), String> {
        let (len, p, q, h, refs) = (pr.len, &pr.p, &pr.q, &pr.h, &pr.refs);
        let runs = self.cfg.runs.max(1);
        let mt = self.cfg.max_tokens;
        let mem = self.cfg.out.join(format!("store-memory-{len}"));
        let _ = std::fs::remove_dir_all(&mem);
        let m = self.start(Some(&mem), &format!("memory-{len}"))?;
        self.warm_up(&m, len)?;
        for i in 0..runs {
            let (_, out) = self.complete(&m, &p[i], mt)?;
            self.check_prime("l3-memory", len, i, &out, &refs[&(1, i)]);
            m.reset_local(true)?;
            let (s, out, get) = self.complete_l3(&m, &p[i], mt)?;
            self.record("l3-memory", len, i, &s, &out, &refs[&(1, i)], get);
            m.reset_local(true)?;
            let (s, out, get) = self.complete_l3(&m, &h[i], mt)?;
            self.record("partial", len, i, &s, &out, &refs[&(3, i)], get);
            m.reset_local(true)?;
            let (s, out) = self.complete(&m, &q[i], mt)?;
            self.record("miss", len, i, &s, &out, &refs[&(2, i)], None);
        }
        if self.cfg.tpot_tokens > 0 {
            tpot.push(self.tpot(&m, len, &p[0])?);
        }
        m.stop(Duration::from_secs(120))?;
        let _ = std::fs::remove_dir_all(&mem);
        Ok(())
    }

    /// Mooncake Store as the MEMORY tier of a long-running process.
    fn mooncake(&mut self, len: u64) -> Result<(), String> {
        let runs = self.cfg.runs.max(1);
        let mt = self.cfg.max_tokens;
        let v = self.vocab();
        // The shared master keeps objects across runs: these prompts are salted by the
        // process and time so the priming request computes.
        let salt = std::process::id() as u64 ^ super::stats::mix(now_nanos());
        let k: Vec<Vec<u32>> = (0..runs)
            .map(|i| {
                tokens(
                    super::stats::mix(salt ^ i as u64 ^ (len << 32)),
                    len as usize,
                    v,
                )
            })
            .collect();
        let r = self.start(None, &format!("mooncake-reference-{len}"))?;
        let mut kref = vec![];
        for x in &k {
            r.reset_local(true)?;
            kref.push(self.complete(&r, x, mt)?.1);
        }
        r.stop(Duration::from_secs(60))?;
        let mc = self.start_with(Store::Mooncake, &format!("mooncake-{len}"))?;
        self.warm_up(&mc, len)?;
        for i in 0..runs {
            let (_, out) = self.complete(&mc, &k[i], mt)?;
            self.check_prime("l3-mooncake", len, i, &out, &kref[i]);
            mc.reset_local(true)?;
            let (s, out, get) = self.complete_l3(&mc, &k[i], mt)?;
            self.record("l3-mooncake", len, i, &s, &out, &kref[i], get);
        }
        mc.stop(Duration::from_secs(120))?;
        Ok(())
    }

    fn check_prime(&mut self, what: &str, len: u64, run: usize, out: &[u64], reference: &[u64]) {
        if out != reference {
            self.mismatches.push(format!(
                "{what} priming at {len} tokens, run {run}: output differs from recomputation"
            ));
        }
    }

    /// Concurrent decode as an interference check: the mean time per output token of a
    /// short stream alone, and while an L3 restore of `restore` (reset first) runs beside it.
    fn tpot(
        &mut self,
        m: &EngineProcess,
        len: u64,
        restore: &[u32],
    ) -> Result<serde_json::Value, String> {
        let n = self.cfg.tpot_tokens;
        let v = self.vocab();
        let mean_gap = |s: &Streamed| -> f64 {
            let t = &s.token_times;
            if t.len() < 2 {
                return f64::NAN;
            }
            (t[t.len() - 1] - t[0]).as_secs_f64() * 1e3 / (t.len() - 1) as f64
        };
        let alone = self.complete(m, &prompt(4, 64, 0, v), n)?.0;
        m.reset_local(true)?;
        let addr = m.addr.clone();
        let body = Self::body(&prompt(4, 64, 1, v), n);
        let stream = std::thread::spawn(move || {
            http::stream_completion(&addr, &body, Duration::from_secs(900))
        });
        std::thread::sleep(Duration::from_millis(20));
        let restored = self.complete(m, restore, self.cfg.max_tokens)?.0;
        let beside = stream
            .join()
            .map_err(|_| "the TPOT stream thread panicked".to_string())??;
        let (a, b) = (mean_gap(&alone), mean_gap(&beside));
        Ok(json!({
            "tokens": len,
            "decode_tokens": n,
            "tpot_alone_ms": a,
            "tpot_beside_restore_ms": b,
            "ratio": b / a,
            "restore_l3_tokens": restored.last["tsl3"]["l3"],
        }))
    }

    fn summaries(&self) -> Vec<Summary> {
        let mut out = vec![];
        for &len in &self.cfg.lengths {
            for cohort in COHORTS {
                let s: Vec<&Sample> = self
                    .samples
                    .iter()
                    .filter(|s| s.cohort == cohort && s.tokens == len)
                    .collect();
                if s.is_empty() {
                    continue;
                }
                let t: Vec<f64> = s.iter().map(|x| x.ttft_ms).collect();
                let mean = |f: fn(&Sample) -> u64| {
                    s.iter().map(|x| f(x) as f64).sum::<f64>() / s.len() as f64
                };
                let mut fallbacks = BTreeMap::new();
                for x in &s {
                    *fallbacks.entry(x.fallback_reason.clone()).or_insert(0) += 1;
                }
                out.push(Summary {
                    cohort,
                    tokens: len,
                    runs: s.len(),
                    p50_ms: percentile(&t, 50.0).unwrap_or(f64::NAN),
                    p90_ms: percentile(&t, 90.0).unwrap_or(f64::NAN),
                    p99_ms: percentile(&t, 99.0).unwrap_or(f64::NAN),
                    mean_device: mean(|x| x.device),
                    mean_host: mean(|x| x.host),
                    mean_l3: mean(|x| x.l3),
                    mean_computed: mean(|x| x.computed),
                    fallbacks,
                    outputs_equal: s.iter().filter(|x| x.output_matches_recompute).count(),
                    mean_l3_get: mean_get(s.iter().filter_map(|x| x.l3_get)),
                    p50_beyond_get_ms: beyond_get(&s),
                });
            }
        }
        out
    }
}

/// The median of each sample's TTFT beyond its own L3 GET (None when none made one).
fn beyond_get(samples: &[&Sample]) -> Option<f64> {
    let b: Vec<f64> = samples
        .iter()
        .filter_map(|x| x.l3_get.map(|g| x.ttft_ms - g.backend_ms))
        .collect();
    percentile(&b, 50.0)
}

/// The mean of some requests' L3 GETs (None for none).
fn mean_get(gets: impl Iterator<Item = L3Get>) -> Option<L3Get> {
    let (mut n, mut ms, mut bytes, mut query) = (0u64, 0.0, 0u128, 0.0);
    for g in gets {
        n += 1;
        ms += g.backend_ms;
        bytes += g.bytes as u128;
        query += g.query_ms;
    }
    (n > 0).then(|| L3Get {
        backend_ms: ms / n as f64,
        bytes: (bytes / n as u128) as u64,
        query_ms: query / n as f64,
    })
}

/// The L3 GET line of a cohort: its backend time and rate, the QUERY's backend time, and
/// (the median over runs) how much of a run's TTFT lies beyond its GET.
fn get_line(s: &Summary) -> Option<String> {
    let g = s.mean_l3_get?;
    let beyond = s.p50_beyond_get_ms.unwrap_or(f64::NAN);
    let rate = g.bytes as f64 / (g.backend_ms / 1e3).max(f64::MIN_POSITIVE);
    Some(format!(
        "l3 GET: {} at {} tokens: backend {:.1} ms for {:.0} MiB ({:.2} GB/s), QUERY backend {:.1} ms (means of {} runs); p50 TTFT {:.1} ms, a run's TTFT beyond its GET p50 {:.1} ms",
        s.cohort,
        s.tokens,
        g.backend_ms,
        g.bytes as f64 / (1u64 << 20) as f64,
        rate / 1e9,
        g.query_ms,
        s.runs,
        s.p50_ms,
        beyond
    ))
}

/// KV bytes per prompt token of one rank, when every cache group keeps full history (a
/// window or state group's restored bytes do not grow with the prompt: None).
fn bytes_per_token(profile: &ModelProfile) -> Option<f64> {
    let mut sum = 0.0;
    for g in &profile.groups {
        if g.kind != GroupKind::Full {
            return None;
        }
        sum += g.shard_block_bytes(1).ok()? as f64 / g.block_tokens.max(1) as f64;
    }
    Some(sum)
}

/// Restore time beyond raw transfer of every memory-speed cohort at every length.
fn beyond_raw_figures(
    summaries: &[Summary],
    profile: &ModelProfile,
    bandwidth: f64,
) -> Vec<BeyondRaw> {
    let Some(per_token) = bytes_per_token(profile) else {
        return vec![];
    };
    summaries
        .iter()
        .filter_map(|s| {
            let device = summaries
                .iter()
                .find(|d| d.cohort == "device" && d.tokens == s.tokens)?;
            let restored = if s.cohort == "host" {
                s.mean_host
            } else {
                s.mean_l3
            };
            beyond_raw(
                s.cohort,
                s.tokens,
                s.p50_ms,
                device.p50_ms,
                restored * per_token,
                bandwidth,
            )
        })
        .collect()
}

/// The ratio of two cohorts' p50 TTFT at one length.
pub fn ratio(summaries: &[Summary], a: &str, b: &str, len: u64) -> Option<f64> {
    let p = |c: &str| {
        summaries
            .iter()
            .find(|s| s.cohort == c && s.tokens == len)
            .map(|s| s.p50_ms)
    };
    Some(p(a)? / p(b)?)
}

/// Runs the bench, prints a table, writes ttft.json and ttft.svg. Err when a run failed or
/// a restored output differed from recomputation (after writing what was measured).
pub fn run(cfg: &TtftConfig) -> Result<(), String> {
    cfg.check_cohorts()?;
    std::fs::create_dir_all(cfg.out.join("logs"))
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    let mut b = Bench::new(cfg)?;
    // This machine's memcpy over every core, before any engine runs: the raw transfer
    // speed a memory-speed restore is measured against.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let bandwidth = memcpy_bandwidth(512 << 20, threads, 4);
    println!(
        "memcpy bandwidth ({threads} threads, 512 MiB, best of 4): {:.2} GB/s",
        bandwidth / 1e9
    );
    // The kernel's page-cache copy, what a DFS-warm GET's reads can reach (before its
    // checksum), measured beside the memcpy figure.
    let page_cache =
        page_cache_read_bandwidth(&cfg.out.join("read-bandwidth"), 256, 2 << 20, threads, 4)?;
    println!(
        "page-cache read bandwidth ({threads} threads, 256 files of 2 MiB, best of 4): {:.2} GB/s",
        page_cache / 1e9
    );
    let model = cfg.model_name();
    println!(
        "bench ttft: model {} lengths {:?} runs {} soft deadline {} ms, device time {}, Device capacity {} blocks per group, output {}",
        model,
        cfg.lengths,
        cfg.runs,
        cfg.soft_deadline_ms,
        match (&cfg.model_dir, cfg.emulate_device_time) {
            (Some(_), _) => "real (transformer compute on this CPU)",
            (None, true) => "emulated (cost model)",
            (None, false) => "not emulated",
        },
        b.device_blocks,
        cfg.out.display()
    );
    let mut tpot = vec![];
    let mut failure = None;
    for &len in &cfg.lengths {
        if let Err(e) = b.length(len, &mut tpot) {
            failure = Some(format!("at {len} tokens: {e}"));
            break;
        }
    }
    let summaries = b.summaries();
    println!(
        "{:<12} {:>7} {:>4} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8}  fallbacks  outputs=",
        "cohort",
        "tokens",
        "runs",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "device",
        "host",
        "l3",
        "computed"
    );
    for s in &summaries {
        println!(
            "{:<12} {:>7} {:>4} {:>10.1} {:>10.1} {:>10.1} {:>8.0} {:>8.0} {:>8.0} {:>8.0}  {:?}  {}/{}",
            s.cohort, s.tokens, s.runs, s.p50_ms, s.p90_ms, s.p99_ms, s.mean_device, s.mean_host,
            s.mean_l3, s.mean_computed, s.fallbacks, s.outputs_equal, s.runs
        );
    }
    for t in &tpot {
        println!(
            "tpot at {} tokens: alone {:.2} ms, beside an L3 restore {:.2} ms (ratio {:.2})",
            t["tokens"],
            t["tpot_alone_ms"].as_f64().unwrap_or(f64::NAN),
            t["tpot_beside_restore_ms"].as_f64().unwrap_or(f64::NAN),
            t["ratio"].as_f64().unwrap_or(f64::NAN)
        );
    }
    for line in summaries.iter().filter_map(get_line) {
        println!("{line}");
    }
    let beyond = beyond_raw_figures(&summaries, &b.profile, bandwidth);
    for f in &beyond {
        println!(
            "restore beyond raw transfer: {} at {} tokens: restore {:.1} ms (p50 - device p50) for {:.0} MiB x {} hops, raw {:.1} ms at memcpy speed: {:+.0}% (target <= +20%)",
            f.cohort,
            f.tokens,
            f.restore_ms,
            f.restored_bytes / (1u64 << 20) as f64,
            f.hops,
            f.raw_ms,
            f.beyond * 100.0
        );
    }
    let longest = cfg.lengths.iter().copied().max().unwrap_or(0);
    let ratios: BTreeMap<&str, Option<f64>> = COHORTS[1..]
        .iter()
        .map(|c| (*c, ratio(&summaries, c, "recompute", longest)))
        .collect();
    let doc = json!({
        "bench": "ttft",
        "profile": model,
        "lengths": cfg.lengths,
        "runs": cfg.runs,
        "soft_deadline_ms": cfg.soft_deadline_ms,
        "emulate_device_time": cfg.emulate_device_time,
        "device_blocks_per_group": b.device_blocks,
        "host_cache_bytes": b.host_bytes,
        "memory_tier_bytes": b.memory_tier_bytes,
        "summaries": summaries,
        "ratios_to_recompute_at_longest": ratios,
        "memcpy_bytes_per_s": bandwidth,
        "page_cache_read_bytes_per_s": page_cache,
        "restore_beyond_raw_transfer": beyond,
        "tpot": tpot,
        "samples": b.samples,
        "mismatches": b.mismatches,
        "error": failure,
    });
    let json_path = cfg.out.join("ttft.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&doc).unwrap_or_default(),
    )
    .map_err(|e| format!("{}: {e}", json_path.display()))?;
    let svg = cfg.out.join("ttft.svg");
    plot(&summaries, &model, longest, &svg)?;
    println!("wrote {} and {}", json_path.display(), svg.display());
    if let Some(e) = failure {
        return Err(e);
    }
    if !b.mismatches.is_empty() {
        return Err(format!(
            "{} restored outputs differ from recomputation: {}",
            b.mismatches.len(),
            b.mismatches.join("; ")
        ));
    }
    match ratio(&summaries, "l3-dfs-warm", "recompute", longest) {
        Some(r) => println!("ttft l3-dfs-warm / recompute at {longest} tokens: {r:.3}"),
        None => println!("ttft l3-dfs-warm / recompute at {longest} tokens: not measured"),
    }
    Ok(())
}

fn plot(summaries: &[Summary], profile: &str, longest: u64, path: &Path) -> Result<(), String> {
    let series: Vec<Series> = COHORTS
        .iter()
        .map(|c| Series {
            label: c.to_string(),
            points: summaries
                .iter()
                .filter(|s| s.cohort == *c)
                .map(|s| (s.tokens as f64, s.p50_ms))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let bars: Vec<StackedBar> = summaries
        .iter()
        .filter(|s| s.tokens == longest)
        .map(|s| StackedBar {
            label: s.cohort.to_string(),
            segments: vec![
                ("device".into(), s.mean_device),
                ("host".into(), s.mean_host),
                ("l3".into(), s.mean_l3),
                ("computed".into(), s.mean_computed),
            ],
        })
        .collect();
    super::plot::render_svg(
        path,
        &[
            Panel::Lines {
                title: format!("TTFT p50 by cohort ({profile})"),
                x_label: "prompt tokens".into(),
                y_label: "TTFT p50 (ms)".into(),
                log_x: true,
                log_y: true,
                series,
            },
            Panel::Bars {
                title: format!("where the prompt came from at {longest} tokens (mean tokens)"),
                y_label: "tokens".into(),
                bars,
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(cohort: &'static str, tokens: u64, p50_ms: f64, host: f64, l3: f64) -> Summary {
        Summary {
            cohort,
            tokens,
            runs: 1,
            p50_ms,
            p90_ms: p50_ms,
            p99_ms: p50_ms,
            mean_device: 0.0,
            mean_host: host,
            mean_l3: l3,
            mean_computed: 0.0,
            fallbacks: BTreeMap::new(),
            outputs_equal: 1,
            mean_l3_get: None,
            p50_beyond_get_ms: None,
        }
    }

    #[test]
    fn beyond_the_get_is_each_runs_own_difference_at_the_median() {
        let sample = |ttft_ms: f64, get_ms: Option<f64>| Sample {
            cohort: "l3-dfs-warm",
            tokens: 16384,
            run: 0,
            ttft_ms,
            device: 0,
            host: 0,
            l3: 16368,
            computed: 16,
            fallback_reason: "none".into(),
            output_matches_recompute: true,
            l3_get: get_ms.map(|backend_ms| L3Get {
                backend_ms,
                bytes: 2 << 30,
                query_ms: 0.0,
            }),
        };
        // An outlier run (900 ms with a 750 ms GET) does not move the median difference;
        // a run without a GET does not count.
        let s = [
            sample(400.0, Some(250.0)),
            sample(420.0, Some(260.0)),
            sample(900.0, Some(750.0)),
            sample(300.0, None),
        ];
        let refs: Vec<&Sample> = s.iter().collect();
        assert_eq!(beyond_get(&refs), Some(150.0));
        assert_eq!(beyond_get(&refs[3..]), None);
    }

    #[test]
    fn l3_counters_sum_their_own_kind_label_sets_only() {
        let text = "# HELP tsl3_l3_backend_seconds_total x\n\
            tsl3_l3_backend_seconds_total{kind=\"get\",tp_rank=\"0\"} 0.25\n\
            tsl3_l3_backend_seconds_total{kind=\"get\",tp_rank=\"1\"} 0.5\n\
            tsl3_l3_backend_seconds_total{kind=\"put\",tp_rank=\"0\"} 9\n\
            tsl3_l3_payload_bytes_total{kind=\"get\",tp_rank=\"0\"} 1024\n\
            tsl3_l3_backend_calls_total{kind=\"get\",tp_rank=\"0\"} 3\n\
            tsl3_l3_backend_calls_total{kind=\"query\",tp_rank=\"0\"} 7\n\
            tsl3_l3_backend_seconds_total{kind=\"query\",tp_rank=\"0\"} 0.125\n";
        assert_eq!(
            get_counters(text),
            L3Counters {
                get_seconds: 0.75,
                get_bytes: 1024.0,
                get_calls: 3.0,
                query_seconds: 0.125,
            }
        );
        assert_eq!(get_counters(""), L3Counters::default());
    }

    #[test]
    fn the_get_line_shows_the_rate_and_what_lies_beyond_the_get() {
        let mut s = summary("l3-dfs-warm", 16384, 425.0, 0.0, 16368.0);
        assert_eq!(get_line(&s), None, "no GET measured");
        s.mean_l3_get = mean_get(
            [
                L3Get {
                    backend_ms: 200.0,
                    bytes: 2 << 30,
                    query_ms: 10.0,
                },
                L3Get {
                    backend_ms: 300.0,
                    bytes: 2 << 30,
                    query_ms: 20.0,
                },
            ]
            .into_iter(),
        );
        let line = get_line(&s).unwrap();
        assert!(
            line.contains("backend 250.0 ms for 2048 MiB (8.59 GB/s)"),
            "{line}"
        );
        assert!(line.contains("QUERY backend 15.0 ms"), "{line}");
        assert!(line.contains("beyond its GET p50 NaN ms"), "{line}");
        s.p50_beyond_get_ms = Some(180.0);
        let line = get_line(&s).unwrap();
        assert!(line.contains("beyond its GET p50 180.0 ms"), "{line}");
        assert_eq!(mean_get(std::iter::empty()), None);
    }

    #[test]
    fn restored_bytes_follow_the_tokens_each_cohort_restored() {
        let p = ModelProfile::by_name("llama-8b-like").unwrap();
        // 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes per token.
        assert_eq!(bytes_per_token(&p), Some(131072.0));
        let s = [
            summary("device", 16384, 20.0, 0.0, 0.0),
            summary("host", 16384, 220.0, 16368.0, 0.0),
            summary("l3-memory", 16384, 420.0, 0.0, 16368.0),
            summary("miss", 16384, 1000.0, 0.0, 0.0),
        ];
        let f = beyond_raw_figures(&s, &p, 16368.0 * 131072.0 / 0.1);
        assert_eq!(f.len(), 2, "{f:?}");
        // Raw: 100 ms per hop. Host: 200 ms restore over 1 hop; L3: 400 ms over 2 hops.
        assert_eq!((f[0].cohort, f[0].hops), ("host", 1));
        assert!((f[0].beyond - 1.0).abs() < 1e-9, "{f:?}");
        assert_eq!((f[1].cohort, f[1].hops), ("l3-memory", 2));
        assert!((f[1].beyond - 1.0).abs() < 1e-9, "{f:?}");
        let hybrid = ModelProfile::by_name("hybrid-swa").unwrap();
        assert_eq!(bytes_per_token(&hybrid), None);
        assert!(beyond_raw_figures(&s, &hybrid, 1e9).is_empty());
    }
}
