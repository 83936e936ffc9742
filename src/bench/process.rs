//! Real `engine-host serve` processes for the benchmarks: started from this binary on a
//! free loopback port with the settings a cohort needs (as `TSL3_*` variables), waited for
//! until `/health` answers, stopped with SIGTERM. Its log goes to a file in the bench's
//! output directory. It measures nothing itself.

use super::http;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The admin token every bench process is started with (admin endpoints on loopback).
pub const ADMIN_TOKEN: &str = "tsl3-bench";

pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// One running engine host.
pub struct EngineProcess {
    child: Child,
    pub addr: String,
    pub log: PathBuf,
}

impl EngineProcess {
    /// Starts `engine-host serve ARGS` with `envs` and waits (at most `startup`) until its
    /// HTTP API answers `/health`.
    pub fn start(
        args: &[String],
        envs: &[(String, String)],
        log: &Path,
        startup: Duration,
    ) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current executable: {e}"))?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let log_file =
            std::fs::File::create(log).map_err(|e| format!("log {}: {e}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve")
            .args(args)
            .args(["--listen", &addr])
            .env("TSL3_SERVER__ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("spawning engine-host: {e}"))?;
        let mut p = EngineProcess {
            child,
            addr,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + startup;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = p.child.try_wait() {
                return Err(format!(
                    "engine-host exited during startup ({status}): {}",
                    p.log_tail()
                ));
            }
            if let Ok(r) =
                http::request(&p.addr, "GET", "/health", "", None, Duration::from_secs(2))
            {
                if r.status == 200 {
                    return Ok(p);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let tail = p.log_tail();
        p.kill();
        Err(format!("engine-host never became healthy: {tail}"))
    }

    /// The process ID (to read its CPU time from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of the process's log (for error messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// An admin command (bearer token); Err on a non-200 answer.
    pub fn admin(&self, path: &str, body: &str, timeout: Duration) -> Result<String, String> {
        let r = http::request(&self.addr, "POST", path, body, Some(ADMIN_TOKEN), timeout)?;
        if r.status != 200 {
            return Err(format!("{path}: {} {}", r.status, r.body));
        }
        Ok(r.body)
    }

    /// `POST /admin/reset_local`: waits until the engine is idle (backups landed), then
    /// drops the Device cache and, with `host`, the Host cache. L3 is untouched.
    pub fn reset_local(&self, host: bool) -> Result<(), String> {
        let body = format!("{{\"host\":{host}}}");
        self.admin("/admin/reset_local", &body, Duration::from_secs(600))
            .map(|_| ())
    }

    /// The Prometheus exposition.
    pub fn metrics(&self) -> Result<String, String> {
        let r = http::request(
            &self.addr,
            "GET",
            "/metrics",
            "",
            None,
            Duration::from_secs(10),
        )?;
        Ok(r.body)
    }

    /// SIGTERM and wait (at most `grace`, then SIGKILL); Err when it did not exit cleanly.
    pub fn stop(mut self, grace: Duration) -> Result<(), String> {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .map_err(|e| format!("kill -TERM: {e}"))?;
        if !st.success() {
            return Err(format!("kill -TERM {} failed", self.child.id()));
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => {
                    return Err(format!("engine-host exited {st}: {}", self.log_tail()))
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("waiting for engine-host: {e}")),
            }
        }
        self.kill();
        Err("engine-host did not stop within its grace period".into())
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EngineProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// The `TSL3_STORAGE__MOONCAKE__*` settings of a pure client of the Mooncake instance the
/// environment names (deploy/mooncake/env.sh), or why there is none.
pub fn mooncake_env() -> Result<Vec<(String, String)>, String> {
    let m = actors::l3::store::mooncake::live::settings_from_env()?;
    Ok(actors::l3::store::mooncake::live::engine_env(&m))
}

/// The sum of a metric's samples in an exposition that carry every one of `labels`.
pub fn metric_sum(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Drops every file under `dir` from the page cache (fsync first: dirty pages cannot be
/// dropped), so the next read of them comes from the device: the cold-cache cohort.
/// Returns the bytes advised.
pub fn drop_page_cache(dir: &Path) -> Result<u64, String> {
    let mut bytes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let Ok(f) = std::fs::File::open(&p) else {
                    continue;
                };
                let _ = f.sync_all();
                let advised = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
                if advised.is_ok() {
                    bytes += f.metadata().map(|m| m.len()).unwrap_or(0);
                }
            }
        }
    }
    Ok(bytes)
}
