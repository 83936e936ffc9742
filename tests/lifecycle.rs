//! A rank's life as an orchestrator sees it, through real processes: a mesh that never
//! forms ends the process, and so on. Waits are bounded polls; no timing is asserted beyond
//! "does not hang".

mod common;

use common::{free_port, free_ports_in_a_row, http, Host};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Waits (bounded) for a child to exit: its status and stderr.
fn wait_exit(
    mut child: std::process::Child,
    within: Duration,
) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return (st, err);
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Rank `rank` of a 2-rank mesh whose peer never starts (stderr piped).
fn lone_rank(
    rank: &str,
    peers: &str,
    listen: &str,
    connect_deadline_ms: &str,
    log: &str,
) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["serve", "--store", "none", "--world", "2", "--rank", rank])
        .args(["--peers", peers, "--listen", listen])
        .env("TSL3_TP__SECRET", "s3cret")
        .env("TSL3_TP__CONNECT_DEADLINE_MS", connect_deadline_ms)
        .env("TSL3_MODEL__DEVICE", "emulated")
        .env("RUST_LOG", log)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the child's stderr up to the first line `at` accepts, sends it SIGTERM at once,
/// then reads the rest of its stderr and waits (bounded) for its exit: (the lines up to
/// and with that one, the rest, exit status).
fn sigterm_after_line(
    mut child: std::process::Child,
    at: impl Fn(&str) -> bool,
) -> (String, String, std::process::ExitStatus) {
    use std::io::{BufRead, Read};
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    loop {
        let before = first.len();
        if err.read_line(&mut first).unwrap() == 0 {
            let _ = child.kill();
            panic!("stderr ended before the awaited line: {first}");
        }
        if at(&first[before..]) {
            break;
        }
    }
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let (status, _) = wait_exit(child, Duration::from_secs(60));
    (first, rest, status)
}

/// A rank started alone (its peers never start) exits non-zero after the mesh connect
/// deadline, with one error line naming the ranks that did not join and the setting,
/// instead of serving `starting` forever. Leader and follower alike.
#[test]
fn a_rank_whose_mesh_never_forms_exits_non_zero() {
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    for rank in ["0", "1"] {
        // Rank r serves /metrics on the listen port + r: two free ports in a row.
        let listen = format!("127.0.0.1:{}", free_ports_in_a_row(2));
        let child = lone_rank(rank, &peers, &listen, "1500", "warn");
        let (status, stderr) = wait_exit(child, Duration::from_secs(60));
        assert!(!status.success(), "rank {rank}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "rank {rank}: one error line: {stderr}");
        let other = if rank == "0" { "1" } else { "0" };
        for needle in [
            format!("rank(s) {other} did not join"),
            "tp.connect_deadline_ms = 1500".to_string(),
        ] {
            assert!(
                errors[0].contains(&needle),
                "rank {rank}: {} lacks {needle}",
                errors[0]
            );
        }
    }
}

/// SIGTERM reaches a rank as a stop from its first log line on, however early: a rank that
/// is still waiting for its mesh (its peer never starts) ends at once and cleanly instead
/// of dying of the signal (the handler used to be installed by the HTTP thread, after the
/// round loop had started: a `launch` replica's late rank was killed mid-round and failed
/// its peers) or waiting out the connect deadline. Leader and follower alike.
#[test]
fn sigterm_stops_a_rank_still_waiting_for_its_mesh_cleanly() {
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    for rank in ["0", "1"] {
        let listen = format!("127.0.0.1:{}", free_ports_in_a_row(2));
        let child = lone_rank(rank, &peers, &listen, "600000", "info");
        // The first line the rank logs; the signal follows it at once.
        let (first, rest, status) = sigterm_after_line(child, |_| true);
        assert!(
            status.success(),
            "rank {rank}: {status} after SIGTERM; log: {first}{rest}"
        );
        assert!(
            rest.contains("stopped before the mesh formed"),
            "rank {rank}: {first}{rest}"
        );
    }
}

/// SIGTERM to a leader as soon as it starts, while a follower already waits for it: the
/// leader's mesh forms within its stop grace (the follower may count it formed first), and
/// the replica stops by agreement in its first round: neither rank sees the other vanish,
/// both exit 0. (Before, the leader dropped a mesh still forming at once: the follower
/// then failed in round 1 with "rank 0 disconnected", or waited out its connect deadline.)
#[test]
fn sigterm_while_the_mesh_forms_with_a_waiting_peer_stops_both_ranks_by_agreement() {
    use std::io::{BufRead, Read};
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let listen = |n| format!("127.0.0.1:{}", free_ports_in_a_row(n));
    let mut follower = lone_rank("1", &peers, &listen(2), "10000", "info");
    let mut follower_err = std::io::BufReader::new(follower.stderr.take().unwrap());
    let mut follower_log = String::new();
    // The follower is up (it retries its connection to the leader meanwhile).
    follower_err.read_line(&mut follower_log).unwrap();
    let leader = lone_rank("0", &peers, &listen(2), "10000", "info");
    let (first, rest, status) = sigterm_after_line(leader, |_| true);
    assert!(status.success(), "leader: {status}; log: {first}{rest}");
    follower_err.read_to_string(&mut follower_log).unwrap();
    let (status, _) = wait_exit(follower, Duration::from_secs(60));
    assert!(status.success(), "follower: {status}; log: {follower_log}");
    assert!(
        !follower_log.contains("disconnected"),
        "follower: {follower_log}"
    );
}

/// SIGTERM to `launch` as soon as it has started its first rank: the launcher forwards it
/// to the ranks still starting, each stops cleanly (or, signalled before it took SIGTERM
/// over, ends by it holding nothing), the launcher exits cleanly, and no rank outlives it.
/// (The launcher now takes signals over before its first rank starts; before, a stop in
/// that window killed it and orphaned the ranks: a window too short for this test to hit
/// reliably.)
#[test]
fn sigterm_to_a_starting_launch_stops_every_rank_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["launch", "--tp", "2", "--store", "local", "--store-dir"])
        .arg(dir.path())
        .args(["--listen", &format!("127.0.0.1:{}", free_ports_in_a_row(2))])
        .env("TSL3_MODEL__DEVICE", "emulated")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (first, rest, status) = sigterm_after_line(child, |l| l.contains("rank 0 started"));
    let log = format!("{first}{rest}");
    assert!(status.success(), "{status}; log: {log}");
    // Every rank started is reported ended, and none is still running.
    let pids: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("(pid ").nth(1)?.split(')').next())
        .collect();
    assert!(!pids.is_empty(), "{log}");
    for pid in pids {
        let alive = Command::new("kill")
            .args(["-0", pid])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(!alive, "rank pid {pid} outlived the launcher; log: {log}");
    }
    let started = log.matches(" started (pid ").count();
    let exited = log.matches(" exited: ").count();
    assert_eq!(started, exited, "{log}");
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Polls `path` until `pred` holds on (status, document); the last answer otherwise.
fn poll(
    h: &Host,
    path: &str,
    pred: impl Fn(u16, &serde_json::Value) -> bool,
) -> (u16, serde_json::Value) {
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..400 {
        let (code, body) = h.get(path);
        let v = json(&body);
        if pred(code, &v) {
            return (code, v);
        }
        last = (code, v);
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{path} never reached the expected state; last: {last:?}");
}

/// Before the first agreed round (a rank waiting for its mesh) the process is live but not
/// ready, with the reason; `/health` stays 200 for old probes but says `starting`.
#[test]
fn live_but_not_ready_until_the_mesh_forms() {
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["serve", "--store", "none", "--world", "2", "--rank", "0"])
        .args(["--peers", &peers, "--listen", &listen])
        .env("TSL3_TP__SECRET", "s3cret")
        .env("TSL3_TP__CONNECT_DEADLINE_MS", "60000")
        .env("TSL3_MODEL__DEVICE", "emulated")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut live = None;
    for _ in 0..400 {
        if std::net::TcpStream::connect(&listen).is_ok() {
            live = Some(http(&listen, "GET", "/health/live", "", None));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, body) = live.expect("the rank never answered HTTP");
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["status"], "live");
    let (code, body) = http(&listen, "GET", "/health/ready", "", None);
    assert_eq!(code, 503, "{body}");
    let v = json(&body);
    assert_eq!(v["status"], "starting");
    assert_eq!(v["ready"], false);
    assert!(v["reason"].as_str().unwrap().contains("mesh"), "{v}");
    let (code, body) = http(&listen, "GET", "/health", "", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["status"], "starting");
    let _ = child.kill();
    let _ = child.wait();
}

/// A single rank becomes ready (200, `ok`) once its rounds run; replacing its store
/// directory by a file makes the next backup an outage: `degraded` with the reason and
/// still ready by default, 503 with `server.not_ready_on_storage_outage`.
#[test]
fn ready_after_the_first_round_and_a_storage_outage_is_reported() {
    for not_ready in ["false", "true"] {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("l3");
        let h = Host::start(
            &[
                "serve",
                "--store",
                "local",
                "--store-dir",
                store.to_str().unwrap(),
            ],
            &[
                ("TSL3_STORAGE__RUNTIME__HEALTH_COOLDOWN_MS", "600000"),
                ("TSL3_SERVER__NOT_READY_ON_STORAGE_OUTAGE", not_ready),
            ],
        );
        let (_, v) = poll(&h, "/health/ready", |c, _| c == 200);
        assert_eq!(v["status"], "ok", "{v}");
        assert_eq!(v["ready"], true);
        assert_eq!(v["storage"]["state"], "Healthy", "{v}");
        assert_eq!(json(&h.get("/health").1)["status"], "ok");

        let _ = std::fs::remove_dir_all(&store);
        std::fs::write(&store, b"not a directory").unwrap();
        let prompt: Vec<u32> = (0..48).collect();
        h.complete(&prompt, 2);
        let (code, v) = poll(&h, "/health/ready", |_, v| v["status"] == "degraded");
        assert_eq!(v["storage"]["state"], "Cooldown", "{v}");
        assert!(v["reason"].as_str().unwrap().contains("unhealthy"), "{v}");
        if not_ready == "true" {
            assert_eq!(code, 503, "{v}");
            assert_eq!(v["ready"], false);
        } else {
            assert_eq!(code, 200, "{v}");
            assert_eq!(v["ready"], true);
        }
        let (code, body) = h.get("/health");
        assert_eq!(code, 200);
        assert_eq!(json(&body)["status"], "degraded");
        assert_eq!(h.get("/health/live").0, 200);
    }
}

/// SIGTERM with a client that sent half a request (its head and part of its body) ends the
/// process promptly and cleanly: the half request holds nothing in the engine (it used to
/// hold the exit for the 30 s HTTP shutdown timeout).
#[test]
fn sigterm_does_not_wait_for_a_half_sent_request() {
    use std::io::Write;
    let h = Host::start(&["serve", "--store", "none"], &[]);
    let mut half = std::net::TcpStream::connect(&h.addr).unwrap();
    write!(
        half,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n{{\"prompt\": [1, 2"
    )
    .unwrap();
    half.flush().unwrap();
    // The server has the partial request before the signal.
    std::thread::sleep(Duration::from_millis(300));
    let pid = h.child.id().to_string();
    let mut h = h;
    let child = std::mem::replace(&mut h.child, Command::new("true").spawn().unwrap());
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let (status, _) = wait_exit(child, Duration::from_secs(15));
    assert!(status.success(), "SIGTERM exits cleanly: {status}");
    drop(half);
}

/// A request the engine holds when SIGTERM arrives still completes (every token, then
/// `[DONE]`) before the process exits with 0.
#[test]
fn sigterm_lets_an_in_flight_request_finish() {
    use std::io::{BufRead, BufReader, Write};
    let h = Host::start(
        &["serve", "--store", "none"],
        &[("TSL3_MODEL__EMULATE_DEVICE_TIME", "true")],
    );
    let mut s = std::net::TcpStream::connect(&h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = r#"{"prompt":[1,2,3,4,5,6,7,8],"max_tokens":48,"stream":true,"stream_options":{"include_usage":true}}"#;
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // Up to the first token: the engine holds the request.
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        if line.starts_with("data: {") {
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &h.child.id().to_string()])
        .status();
    let mut tokens = 1;
    let mut done = false;
    let mut usage = false;
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if line.starts_with("data: [DONE]") {
            done = true;
        } else if line.starts_with("data: {") {
            assert!(!line.contains("\"error\""), "{line}");
            if line.contains("cached_tokens") {
                usage = true;
            } else if line.contains("\"finish_reason\":null") {
                tokens += 1;
            }
        }
    }
    assert!(usage, "the final chunk with the usage arrived");
    assert!(done, "the stream ends with [DONE]");
    assert_eq!(tokens, 48, "every token arrived");
    assert!(h.stop().success());
}

/// With stderr not a terminal, the log has no ANSI colour codes.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let h = Host::start_logged(&["serve", "--store", "none"], &[("RUST_LOG", "info")], &log);
    assert!(h.stop().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("engine host starting"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a file log: {text:?}"
    );
}

/// Every rank of `launch --tp 2` serves `/metrics` and `/health` on its own address (the
/// leader's API port + rank), labelled with its TP rank and counting its own shard's L3
/// I/O; only the leader serves the API; `gen-prometheus.sh 2 PORT` scrapes exactly the
/// addresses launch printed.
#[test]
fn every_rank_of_a_launch_serves_its_own_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("l3");
    let log = dir.path().join("launch.log");
    let h = Host::start_logged(
        &[
            "launch",
            "--tp",
            "2",
            "--store",
            "local",
            "--store-dir",
            store.to_str().unwrap(),
        ],
        &[],
        &log,
    );
    let (host, port) = h.addr.rsplit_once(':').unwrap();
    let port: u16 = port.parse().unwrap();
    let follower = format!("{host}:{}", port + 1);
    h.complete(&(0..64).collect::<Vec<u32>>(), 2);
    // Rank 1's own scrape: its TP rank, and the PUTs of its own shard once they retire.
    let mut rank1 = String::new();
    for _ in 0..400 {
        let (code, text) = http(&follower, "GET", "/metrics", "", None);
        assert_eq!(code, 200, "{text}");
        let puts: f64 = text
            .lines()
            .filter(|l| {
                l.starts_with("tsl3_l3_operations_total{")
                    && l.contains("kind=\"put\"")
                    && l.contains("outcome=\"completed\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        rank1 = text;
        if puts >= 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(rank1.contains("tp_rank=\"1\""), "{rank1}");
    assert!(
        !rank1.contains("tp_rank=\"0\""),
        "rank 1 exports only itself"
    );
    assert!(h.metrics().contains("tp_rank=\"0\""));
    // One replica label on both ranks: the replica's /metrics base port, on this host.
    let replica = |text: &str| -> String {
        let (_, rest) = text.split_once("replica=\"").expect("a replica label");
        rest.split('"').next().unwrap_or_default().to_string()
    };
    assert_eq!(replica(&rank1), replica(&h.metrics()));
    assert!(
        replica(&rank1).ends_with(&format!(":{port}")),
        "{}",
        replica(&rank1)
    );
    let (code, body) = http(&follower, "GET", "/health/ready", "", None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(json(&body)["status"], "ok");
    let (code, body) = http(&follower, "POST", "/v1/completions", "{}", None);
    assert_eq!(code, 404, "followers serve no API: {body}");
    assert!(json(&body)["error"].is_object());

    // The addresses launch printed are exactly the targets gen-prometheus.sh generates.
    let launched: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("/metrics on http://")?;
            Some(rest.strip_suffix("/metrics")?.to_string())
        })
        .collect();
    assert_eq!(launched, vec![h.addr.clone(), follower.clone()]);
    let out = Command::new("bash")
        .args([
            "deploy/observability/gen-prometheus.sh",
            "2",
            &port.to_string(),
            host,
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let targets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            Some(
                l.trim()
                    .strip_prefix("- \"")?
                    .strip_suffix('"')?
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(targets, launched);
    assert!(h.stop().success());
}
