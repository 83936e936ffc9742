//! `bench idle`: how much CPU an idle `engine-host serve` burns. It starts a real serve
//! process (local store in a scratch directory, the embedded default otherwise), lets it
//! settle, and reads every thread's CPU time from /proc/PID/task/*/schedstat (nanoseconds)
//! at the start and the end of a fixed window: CPU seconds per wall second, and the threads
//! that spent it. It only measures; it never asserts a figure.

use super::process::EngineProcess;
use super::ScratchDir;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub struct IdleConfig {
    /// The measured window.
    pub window: Duration,
    /// Settling time after the process became healthy.
    pub warmup: Duration,
    /// Where the scratch store directory and the log go.
    pub dir: String,
}

/// CPU nanoseconds per thread name (threads of one name summed).
fn cpu_by_thread(pid: u32) -> Result<BTreeMap<String, u64>, String> {
    let tasks = format!("/proc/{pid}/task");
    let mut out = BTreeMap::new();
    let entries = std::fs::read_dir(&tasks).map_err(|e| format!("{tasks}: {e}"))?;
    for e in entries.flatten() {
        let path = e.path();
        // A thread may end between the listing and the read: skip it.
        let Ok(stat) = std::fs::read_to_string(path.join("schedstat")) else {
            continue;
        };
        let ns: u64 = stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{}: unexpected schedstat {stat:?}", path.display()))?;
        let name = std::fs::read_to_string(path.join("comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        *out.entry(name).or_insert(0) += ns;
    }
    Ok(out)
}

/// CPU seconds per wall second of an idle serve, and the busiest threads.
pub struct IdleFigures {
    pub wall: Duration,
    pub cpu_ns: u64,
    pub threads: Vec<(String, u64)>,
}

impl IdleFigures {
    pub fn core_fraction(&self) -> f64 {
        self.cpu_ns as f64 / 1e9 / self.wall.as_secs_f64().max(1e-9)
    }
}

pub fn measure(cfg: &IdleConfig) -> Result<IdleFigures, String> {
    let scratch = ScratchDir::create(&cfg.dir, "idle")?;
    let store_dir = scratch.path().join("store");
    let log = scratch.path().join("serve.log");
    let args: Vec<String> = [
        "--store",
        "local",
        "--store-dir",
        &store_dir.to_string_lossy(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let envs = vec![("TSL3_MODEL__DEVICE".to_string(), "emulated".to_string())];
    let p = EngineProcess::start(&args, &envs, &log, Duration::from_secs(60))?;
    std::thread::sleep(cfg.warmup);
    let before = cpu_by_thread(p.pid())?;
    let start = Instant::now();
    std::thread::sleep(cfg.window);
    let after = cpu_by_thread(p.pid())?;
    let wall = start.elapsed();
    p.stop(Duration::from_secs(20))?;
    let mut threads: Vec<(String, u64)> = after
        .iter()
        .map(|(name, ns)| {
            let was = before.get(name).copied().unwrap_or(0);
            (name.clone(), ns.saturating_sub(was))
        })
        .filter(|(_, ns)| *ns > 0)
        .collect();
    threads.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
    let cpu_ns = threads.iter().map(|(_, ns)| ns).sum();
    Ok(IdleFigures {
        wall,
        cpu_ns,
        threads,
    })
}

pub fn run(cfg: &IdleConfig) -> Result<(), String> {
    let f = measure(cfg)?;
    for (name, ns) in f.threads.iter().take(8) {
        println!(
            "thread {name:<20} {:>8.3} ms CPU ({:.3}% of a core)",
            *ns as f64 / 1e6,
            *ns as f64 / 1e9 / f.wall.as_secs_f64() * 100.0
        );
    }
    println!(
        "idle serve: {:.3} ms CPU over {:.1} s wall = {:.3}% of a core (target <= 0.2%)",
        f.cpu_ns as f64 / 1e6,
        f.wall.as_secs_f64(),
        f.core_fraction() * 100.0
    );
    Ok(())
}
