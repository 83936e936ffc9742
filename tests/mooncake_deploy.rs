//! deploy/mooncake/start.sh as an operator runs it: the master listens on MOONCAKE_BIND
//! (loopback by default). With MOONCAKE_METADATA=p2p every master socket is on loopback;
//! with the HTTP metadata server (Mooncake 0.3.13 binds it to every interface whatever
//! --http_metadata_server_host says) start.sh names each socket beyond MOONCAKE_BIND.
//! Needs install.sh's binaries (deploy/.mooncake/paths.env, or MOONCAKE_STATE_DIR); without
//! them it skips loudly, or fails with MOONCAKE_REQUIRE_MASTER=1.

mod common;

use std::path::PathBuf;
use std::process::Command;

fn state_dir() -> PathBuf {
    std::env::var_os("MOONCAKE_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("deploy/.mooncake"))
}

/// One master instance of the deploy scripts on free ports, stopped on drop.
struct Master {
    env: Vec<(String, String)>,
    pid: u32,
    stderr: String,
}

impl Master {
    fn start(mode: &str) -> Master {
        let ports: Vec<String> = (0..4).map(|_| common::free_port().to_string()).collect();
        let env: Vec<(String, String)> = [
            (
                "MOONCAKE_INSTANCE",
                format!("bindcheck-{mode}-{}", std::process::id()),
            ),
            ("MOONCAKE_METADATA", mode.to_string()),
            ("MOONCAKE_RPC_PORT", ports[0].clone()),
            ("MOONCAKE_HTTP_PORT", ports[1].clone()),
            ("MOONCAKE_METRICS_PORT", ports[2].clone()),
            ("MOONCAKE_OWNER_PORT", ports[3].clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let out = Command::new("bash")
            .args(["deploy/mooncake/start.sh", "master"])
            .envs(env.iter().cloned())
            .env_remove("MOONCAKE_BIND")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let mut m = Master {
            env,
            pid: 0,
            stderr,
        };
        assert!(
            out.status.success(),
            "start.sh master ({mode}): {}",
            m.stderr
        );
        let pid_file = state_dir().join(format!("{}-master.pid", m.env[0].1));
        m.pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()))
            .trim()
            .parse()
            .unwrap();
        m
    }

    fn port(&self, key: &str) -> u16 {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .unwrap()
            .1
            .parse()
            .unwrap()
    }
}

impl Drop for Master {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args(["deploy/mooncake/stop.sh", "master"])
            .envs(self.env.iter().cloned())
            .status();
    }
}

/// The listening TCP sockets of a process from /proc: (port, on loopback).
fn listeners(pid: u32) -> Vec<(u16, bool)> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let s = l.to_string_lossy().into_owned();
            Some(s.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut out = vec![];
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for row in text.lines().skip(1) {
            let f: Vec<&str> = row.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" || !inodes.iter().any(|i| i == f[9]) {
                continue;
            }
            let Some((addr, port)) = f[1].split_once(':') else {
                continue;
            };
            let port = u16::from_str_radix(port, 16).unwrap();
            // IPv4 127.x (little-endian hex ends in 7F), IPv6 ::1 or ::ffff:127.x.
            let loopback = match addr.len() {
                8 => addr.ends_with("7F"),
                32 => {
                    addr == "00000000000000000000000001000000"
                        || (addr.starts_with("0000000000000000FFFF0000") && addr.ends_with("7F"))
                }
                _ => false,
            };
            out.push((port, loopback));
        }
    }
    out
}

#[test]
fn start_sh_master_listens_on_loopback_and_names_any_other_socket() {
    if !state_dir().join("paths.env").is_file() {
        assert!(
            std::env::var("MOONCAKE_REQUIRE_MASTER").as_deref() != Ok("1"),
            "MOONCAKE_REQUIRE_MASTER=1 but {} has no paths.env (run deploy/mooncake/install.sh)",
            state_dir().display()
        );
        eprintln!("SKIPPED start_sh_master_listens_on_loopback: no deploy/mooncake install");
        return;
    }
    let m = Master::start("p2p");
    let l = listeners(m.pid);
    let rpc = m.port("MOONCAKE_RPC_PORT");
    assert!(l.contains(&(rpc, true)), "rpc on loopback: {l:?}");
    assert!(
        l.iter().all(|(_, lo)| *lo),
        "p2p: every master socket on loopback: {l:?}; {}",
        m.stderr
    );
    assert!(!m.stderr.contains("also listens"), "{}", m.stderr);
    drop(m);

    let m = Master::start("http");
    let l = listeners(m.pid);
    let rpc = m.port("MOONCAKE_RPC_PORT");
    assert!(l.contains(&(rpc, true)), "rpc on loopback: {l:?}");
    for (port, lo) in &l {
        if !lo {
            let named = m
                .stderr
                .lines()
                .any(|line| line.contains("also listens on") && line.contains(&format!(":{port}")));
            assert!(
                named,
                "start.sh names the socket on port {port}: {}",
                m.stderr
            );
        }
    }
}
