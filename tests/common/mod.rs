//! Shared helpers of the multi-process tests: start a real `engine-host` process on a free
//! loopback port, talk HTTP/1.1 to it, read its metrics, stop it with SIGTERM. Waits are
//! bounded polls of observable state; no test asserts a timing.
#![allow(dead_code)]

pub mod otlp;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The first of `n` consecutive free loopback ports, below Linux's ephemeral range
/// (32768-60999): a port in that range may be taken at any moment as an outgoing
/// connection's local port (a `launch --tp 8` rank once lost its /metrics port that way
/// after the launcher had found it free). Below it only listeners compete; the mooncake
/// instance of test-all sits at 27051-27052, above the range used here.
pub fn free_ports_in_a_row(n: u16) -> u16 {
    use std::hash::BuildHasher;
    const LOW: u16 = 20_000;
    const HIGH: u16 = 26_000;
    let seed = std::collections::hash_map::RandomState::new();
    for attempt in 0..200u32 {
        let span = u64::from(HIGH - LOW - n);
        let p = LOW + (seed.hash_one((std::process::id(), attempt)) % span) as u16;
        if (0..n).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
    panic!("no {n} consecutive free loopback ports in {LOW}-{HIGH}");
}

/// A minimal HTTP/1.1 client (one request per connection): (status, body).
pub fn http(addr: &str, method: &str, path: &str, body: &str, auth: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let auth = auth
        .map(|t| format!("authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (status, body)
}

/// An engine-host process (`serve` or `launch`) answering on `addr`.
pub struct Host {
    pub child: Child,
    pub addr: String,
}

impl Host {
    /// Starts `engine-host ARGS --listen <free port>` with the emulated device, no device-time
    /// emulation and quiet logs (each `envs` pair overrides), and waits until it is healthy.
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> Host {
        Self::spawn(args, envs, None)
    }

    /// Like `start`, with the process's stderr written to `log`.
    pub fn start_logged(args: &[&str], envs: &[(&str, &str)], log: &Path) -> Host {
        Self::spawn(args, envs, Some(log))
    }

    fn spawn(args: &[&str], envs: &[(&str, &str)], log: Option<&Path>) -> Host {
        // A port found free may be taken before the process binds it (by another test's
        // process, or as an outgoing connection's local port): the process then exits
        // with the address in use, and the start is tried again on other ports.
        for _ in 0..5 {
            match Self::try_spawn(args, envs, log) {
                Ok(h) => return h,
                Err(why) if why.contains("in use") => continue,
                Err(why) => panic!("{why}"),
            }
        }
        panic!("engine-host lost the race for a free port five times");
    }

    /// One start. Healthy means the process has printed that it listens on its address
    /// (so the answer is its own, not another test's process that took the port) and
    /// `/health` answers 200.
    fn try_spawn(args: &[&str], envs: &[(&str, &str)], log: Option<&Path>) -> Result<Host, String> {
        // `launch --tp N` puts rank r's /metrics on the port + r: N free ports in a row.
        let ranks = args
            .iter()
            .position(|a| *a == "--tp")
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(1);
        let addr = format!("127.0.0.1:{}", free_ports_in_a_row(ranks));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_engine-host"));
        cmd.args(args)
            .args(["--listen", &addr])
            .env("TSL3_MODEL__EMULATE_DEVICE_TIME", "false")
            .env("TSL3_MODEL__DEVICE", "emulated")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null());
        match log {
            Some(p) => cmd.stderr(std::fs::File::create(p).unwrap()),
            None => cmd.stderr(Stdio::piped()),
        };
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut h = Host {
            child: cmd.spawn().unwrap(),
            addr,
        };
        // The process's stderr so far: the log file, or the pipe, forwarded line by line to
        // the test's own stderr by a thread.
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        if let Some(pipe) = h.child.stderr.take() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    let mut s = seen.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            });
        }
        let stderr = || match log {
            Some(p) => std::fs::read_to_string(p).unwrap_or_default(),
            None => seen.lock().unwrap().clone(),
        };
        let listening = format!("engine-host: listening on http://{}", h.addr);
        for _ in 0..1200 {
            if let Ok(Some(st)) = h.child.try_wait() {
                // Let the forwarding thread take the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return Err(format!(
                    "engine-host exited during startup: {st} {}",
                    stderr()
                ));
            }
            if stderr().contains(&listening)
                && TcpStream::connect(&h.addr).is_ok()
                && h.get("/health").0 == 200
            {
                return Ok(h);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("engine-host never became healthy at {}", h.addr))
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        http(&self.addr, "GET", path, "", None)
    }

    pub fn post(&self, path: &str, body: &str, auth: Option<&str>) -> (u16, String) {
        http(&self.addr, "POST", path, body, auth)
    }

    /// A completion that must succeed; the response document.
    pub fn complete(&self, prompt: &[u32], max_tokens: u32) -> serde_json::Value {
        let body =
            serde_json::json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
                .to_string();
        let (code, text) = self.post("/v1/completions", &body, None);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    pub fn metrics(&self) -> String {
        let (code, text) = self.get("/metrics");
        assert_eq!(code, 200, "{text}");
        text
    }

    /// The sum of a metric's samples that carry every one of `labels`.
    pub fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter(|l| labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }

    /// Waits until the backups retired: a PUT completed, no PUT job is queued or running
    /// and no storage credit is held (agreed and settled).
    pub fn wait_backups_settled(&self) {
        for _ in 0..1200 {
            let puts = self.metric(
                "tsl3_l3_operations_total",
                &["kind=\"put\"", "outcome=\"completed\""],
            );
            let jobs = self.metric("tsl3_l3_jobs", &["kind=\"put\""]);
            let credits = self.metric("tsl3_l3_credits_in_use", &[]);
            if puts >= 1.0 && jobs == 0.0 && credits == 0.0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("the backups never settled on {}", self.addr);
    }

    /// SIGTERM, then the exit status (in-flight work ends cleanly).
    pub fn stop(mut self) -> ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The output tokens of a completion response.
pub fn tokens(v: &serde_json::Value) -> Vec<u64> {
    v["tsl3"]["output_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// `engine-host model init-random DIR --seed SEED`: a random Llama-format model directory.
#[allow(dead_code)] // not every test binary serves a model directory
pub fn init_random_model(dir: &Path, seed: u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["model", "init-random", dir.to_str().unwrap(), "--seed"])
        .arg(seed.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
