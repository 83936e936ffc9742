//! Serving over a real Mooncake Store (live): two engine-host processes in turn, each a pure
//! Mooncake client (`global_segment_size = 0`) of the master and independent storage owner
//! that deploy/test-all.sh starts (deploy/mooncake/start.sh, env.sh). The first computes a
//! prompt (a fallback miss), lets its backups retire and exits on SIGTERM; the second, a
//! fresh process with empty Device and Host caches, restores the prefix from L3 and must
//! answer exactly like a recomputation run (`--store none`).
//!
//! Gated like actors/tests/mooncake_live.rs: without MOONCAKE_REQUIRE_MASTER=1 a missing
//! library or master skips loudly ("SKIPPED: ..." on stderr); with it, it fails. The shared
//! master keeps objects across runs, so every run uses a prompt salted by its PID and time.

use actors::names::env;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const TEST: &str = "serving_mooncake";

fn required() -> bool {
    std::env::var(env::MOONCAKE_REQUIRE_MASTER).is_ok_and(|v| v == "1")
}

/// Skips loudly (straight to stderr, past the harness's capture), or fails under
/// MOONCAKE_REQUIRE_MASTER=1.
fn skip(why: &str) {
    assert!(
        !required(),
        "{} is 1 but {TEST}: {why}",
        env::MOONCAKE_REQUIRE_MASTER
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED: {TEST}: {why}");
}

/// The engine host's `[storage.mooncake]` settings as TSL3_* overrides, from the variables
/// deploy/mooncake/env.sh exports; None (skipped loudly) without a library or a master.
fn mooncake_env() -> Option<Vec<(String, String)>> {
    let lib = std::env::var(env::MOONCAKE_STORE_LIBRARY).unwrap_or_default();
    let master = std::env::var(env::MOONCAKE_MASTER).unwrap_or_default();
    if lib.is_empty() || master.is_empty() {
        skip(&format!(
            "${} or ${} unset (run deploy/mooncake/install.sh and start.sh, then source deploy/mooncake/env.sh)",
            env::MOONCAKE_STORE_LIBRARY,
            env::MOONCAKE_MASTER
        ));
        return None;
    }
    if !std::path::Path::new(&lib).exists() {
        skip(&format!("the library {lib} does not exist"));
        return None;
    }
    // A quick probe: a client setup against a dead master retries for ~90 s.
    let listening = master
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    if !listening {
        skip(&format!("no Mooncake master listening on {master}"));
        return None;
    }
    let metadata = std::env::var(env::MOONCAKE_METADATA_SERVER)
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "P2PHANDSHAKE".into());
    let p = "TSL3_STORAGE__MOONCAKE__";
    Some(
        [
            ("LIBRARY_PATH", lib),
            ("MASTER_SERVER_ADDR", master),
            ("METADATA_SERVER", metadata),
            ("LOCAL_HOSTNAME", "127.0.0.1".into()),
            ("PROTOCOL", "tcp".into()),
            ("GLOBAL_SEGMENT_SIZE", "0".into()),
            ("LOCAL_BUFFER_SIZE", "0".into()),
            ("TENANT_ID", "default".into()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{p}{k}"), v))
        .chain([("MC_TCP_BIND_ADDRESS".to_string(), "127.0.0.1".to_string())])
        .collect(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A minimal HTTP/1.1 client (one request per connection).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
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

struct Host {
    child: Child,
    addr: String,
}

impl Host {
    fn start(args: &[&str], envs: &[(String, String)]) -> Host {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_engine-host"));
        cmd.args(args)
            .args(["--listen", &addr])
            .env("TSL3_MODEL__EMULATE_DEVICE_TIME", "false")
            .env("TSL3_MODEL__DEVICE", "emulated")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut h = Host {
            child: cmd.spawn().unwrap(),
            addr,
        };
        h.wait_healthy();
        h
    }

    /// A bounded poll of the process's observable state (no timing is asserted).
    fn wait_healthy(&mut self) {
        for _ in 0..1200 {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("engine-host exited during startup: {st}");
            }
            if TcpStream::connect(&self.addr).is_ok()
                && http(&self.addr, "GET", "/health", "").0 == 200
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("engine-host never became healthy at {}", self.addr);
    }

    fn complete(&self, prompt: &[u32], max_tokens: u32) -> serde_json::Value {
        let body = serde_json::json!({"prompt": prompt, "max_tokens": max_tokens}).to_string();
        let (code, text) = http(&self.addr, "POST", "/v1/completions", &body);
        assert_eq!(code, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }

    /// The value of one exported sample (name plus the labels it must carry), summed over
    /// every line that matches.
    fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let (code, text) = http(&self.addr, "GET", "/metrics", "");
        assert_eq!(code, 200);
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .filter(|l| labels.iter().all(|x| l.contains(x)))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }

    /// Waits (bounded poll) until the backups have retired: PUT operations completed with
    /// new writes, and no PUT job queued or running and no L3 credit held.
    fn wait_backups_retired(&self) {
        for _ in 0..600 {
            let completed = self.metric(
                "tsl3_l3_operations_total",
                &["kind=\"put\"", "outcome=\"completed\""],
            );
            let writes = self.metric("tsl3_l3_put_new_writes_total", &[]);
            let jobs = self.metric("tsl3_l3_jobs", &["kind=\"put\""]);
            let credits = self.metric("tsl3_l3_credits_in_use", &[]);
            if completed >= 1.0 && writes >= 1.0 && jobs == 0.0 && credits == 0.0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the backups never retired on {}", self.addr);
    }

    /// SIGTERM, then the exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tokens(v: &serde_json::Value) -> Vec<u64> {
    v["tsl3"]["output_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// A prompt no earlier run used: tokens of a xorshift stream seeded by the PID and time.
fn salted_prompt(n: usize) -> Vec<u32> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut x = (nanos ^ ((std::process::id() as u64) << 32)) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 997) as u32
        })
        .collect()
}

#[test]
fn a_fresh_engine_host_restores_a_prefix_from_mooncake_and_matches_recomputation() {
    let Some(mc) = mooncake_env() else { return };
    let p = salted_prompt(64);
    let want = {
        let h = Host::start(&["serve", "--store", "none"], &[]);
        let v = h.complete(&p, 6);
        assert_eq!(v["tsl3"]["fallback_reason"], "disabled");
        assert_eq!(v["tsl3"]["l3"], 0);
        tokens(&v)
    };

    let first = Host::start(&["serve", "--store", "mooncake"], &mc);
    let a = first.complete(&p, 6);
    assert_eq!(tokens(&a), want, "a computed answer equals recomputation");
    assert_eq!(a["tsl3"]["l3"], 0, "a new prompt is not in the store yet");
    assert_eq!(a["tsl3"]["fallback_reason"], "miss");
    first.wait_backups_retired();
    assert!(
        first.stop().success(),
        "SIGTERM ends the engine host cleanly"
    );

    // A fresh process: empty Device and Host caches; its only source is Mooncake, which
    // holds the first process's pages in the independent owner's segment.
    let second = Host::start(&["serve", "--store", "mooncake"], &mc);
    let b = second.complete(&p, 6);
    let l3 = b["tsl3"]["l3"].as_u64().unwrap();
    assert!(l3 > 0, "a prefix came from L3: {b}");
    assert_eq!(b["tsl3"]["fallback_reason"], "none", "{b}");
    assert_eq!(b["tsl3"]["device"], 0, "{b}");
    assert_eq!(b["tsl3"]["host"], 0, "{b}");
    assert_eq!(
        l3 + b["tsl3"]["computed"].as_u64().unwrap(),
        p.len() as u64,
        "{b}"
    );
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], l3);
    assert_eq!(
        tokens(&b),
        want,
        "the prefix restored from Mooncake gives the recomputed answer"
    );
    assert!(second.stop().success());
}
