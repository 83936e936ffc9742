//! The fault matrix over real engine-host processes and real files (docs/faults.md): every
//! output is compared with a recomputation run (storage disabled). DFS corruption of each
//! kind is never restored as KV, is counted by reason and removed, and the key's next
//! backup lands; a full disk is a capacity rejection (reads unaffected, no outage); a
//! read-only directory fails PUTs as `failed`, not `completed`.
//!
//! The disk-full and read-only cases mount a small tmpfs (root only). They run when the
//! mount succeeds; `TSL3_REQUIRE_MOUNT=1` (the README test command sets it) makes a failed
//! mount a test failure instead of a skip.

mod common;

use common::{tokens, Host};
use std::path::{Path, PathBuf};
use std::process::Command;

fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 13 + salt * 101) % 997).collect()
}

fn recompute(p: &[u32], max_tokens: u32) -> Vec<u64> {
    let h = Host::start(&["serve", "--store", "none"], &[]);
    let v = h.complete(p, max_tokens);
    assert_eq!(v["tsl3"]["l3"], 0);
    tokens(&v)
}

fn local(dir: &str) -> Host {
    Host::start(&["serve", "--store", "local", "--store-dir", dir], &[])
}

/// Every object file of every namespace under a local store directory (DFS tier).
fn objects(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for ns in std::fs::read_dir(dir).unwrap().flatten() {
        if !ns.file_type().unwrap().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(ns.path()).unwrap().flatten() {
            let name = f.file_name().to_string_lossy().to_string();
            if !name.starts_with('.') && f.file_type().unwrap().is_file() {
                out.push(f.path());
            }
        }
    }
    out.sort();
    out
}

#[derive(Clone, Copy, Debug)]
enum Corruption {
    FlippedByte,
    Truncated,
    RandomBytes,
    AnotherKeysObject,
    Deleted,
}

impl Corruption {
    /// Applies the corruption to every object; returns the objects changed.
    fn apply(self, files: &[PathBuf]) -> usize {
        let mut changed = 0;
        for (i, f) in files.iter().enumerate() {
            let mut bytes = std::fs::read(f).unwrap();
            match self {
                Corruption::FlippedByte => {
                    let at = bytes.len() - 1;
                    bytes[at] ^= 0x5a;
                    std::fs::write(f, &bytes).unwrap();
                }
                Corruption::Truncated => {
                    bytes.truncate(bytes.len() - 3);
                    std::fs::write(f, &bytes).unwrap();
                }
                Corruption::RandomBytes => {
                    let noise: Vec<u8> = (0..bytes.len() as u32)
                        .map(|j| (j.wrapping_mul(2654435761).wrapping_add(i as u32) >> 11) as u8)
                        .collect();
                    std::fs::write(f, &noise).unwrap();
                }
                Corruption::AnotherKeysObject => {
                    // A valid object of the next key, copied over this key's file.
                    let other = &files[(i + 1) % files.len()];
                    let b = std::fs::read(other).unwrap();
                    std::fs::write(f, &b).unwrap();
                }
                Corruption::Deleted => std::fs::remove_file(f).unwrap(),
            }
            changed += 1;
        }
        changed
    }

    fn reason(self) -> Option<&'static str> {
        match self {
            Corruption::FlippedByte => Some("checksum"),
            Corruption::Truncated => Some("length"),
            Corruption::RandomBytes => Some("header"),
            Corruption::AnotherKeysObject => Some("identity"),
            Corruption::Deleted => None,
        }
    }
}

#[test]
fn corrupt_dfs_objects_are_never_restored_and_the_next_backup_replaces_them() {
    let p = prompt(64, 4);
    let want = recompute(&p, 5);
    for c in [
        Corruption::FlippedByte,
        Corruption::Truncated,
        Corruption::RandomBytes,
        Corruption::AnotherKeysObject,
        Corruption::Deleted,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let writer = local(d);
        assert_eq!(tokens(&writer.complete(&p, 5)), want);
        writer.wait_backups_settled();
        assert!(writer.stop().success());
        let files = objects(dir.path());
        assert!(files.len() >= 2, "{c:?}: {files:?}");
        assert_eq!(c.apply(&files), files.len());

        // A fresh process: nothing corrupt becomes KV; the answer is the recomputed one.
        let reader = local(d);
        let v = reader.complete(&p, 5);
        assert_eq!(tokens(&v), want, "{c:?}: {v}");
        assert_eq!(v["tsl3"]["l3"], 0, "{c:?}: no corrupt block restored: {v}");
        if let Some(reason) = c.reason() {
            let found = reader.metric(
                "tsl3_dfs_invalid_objects_total",
                &[&format!("reason=\"{reason}\"")],
            );
            assert!(found >= 1.0, "{c:?}: counted as {reason}");
            assert!(reader.metric("tsl3_dfs_invalid_removed_total", &[]) >= 1.0);
        }
        assert_eq!(
            reader.metric("tsl3_l3_health_epoch", &[]),
            0.0,
            "{c:?}: corrupt objects are object failures, not an outage"
        );
        // The recomputed blocks are backed up again, replacing what was invalid.
        reader.wait_backups_settled();
        assert!(reader.stop().success());

        let third = local(d);
        let v = third.complete(&p, 5);
        assert_eq!(tokens(&v), want, "{c:?}");
        assert_eq!(
            v["tsl3"]["l3"], 60,
            "{c:?}: the replaced objects restore: {v}"
        );
        assert_eq!(v["tsl3"]["fallback_reason"], "none");
        assert!(third.stop().success());
    }
}

/// A small tmpfs mounted for one test, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Some(Tmpfs { dir });
        }
        assert!(
            std::env::var("TSL3_REQUIRE_MOUNT").as_deref() != Ok("1"),
            "TSL3_REQUIRE_MOUNT=1 but a tmpfs could not be mounted (run as root)"
        );
        eprintln!("skipped: a tmpfs could not be mounted here (not root)");
        None
    }
    fn path(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }
    fn remount_read_only(&self) {
        let ok = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(self.dir.path())
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount read-only");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_disk_rejects_puts_as_capacity_and_never_disables_reads() {
    let Some(fs) = Tmpfs::mount("256k") else {
        return;
    };
    let prompts: Vec<Vec<u32>> = (0..24).map(|s| prompt(64, 100 + s)).collect();
    // What cannot land is dropped at exit after a short drain (the drain has its own test).
    let short_drain = [("TSL3_SERVER__SHUTDOWN_DRAIN_MS", "300")];
    let local = |dir: &str| {
        Host::start(
            &["serve", "--store", "local", "--store-dir", dir],
            &short_drain,
        )
    };
    let writer = local(fs.path());
    for p in &prompts {
        writer.complete(p, 1);
    }
    writer.wait_backups_settled();
    let capacity = writer.metric("tsl3_dfs_puts_total", &["outcome=\"capacity\""]);
    let written = writer.metric("tsl3_dfs_puts_total", &["outcome=\"written\""]);
    assert!(capacity >= 1.0, "the disk filled: {capacity} rejections");
    assert!(written >= 16.0, "{written} objects landed");
    assert_eq!(
        writer.metric("tsl3_dfs_puts_total", &["outcome=\"failed\""]),
        0.0
    );
    assert_eq!(
        writer.metric("tsl3_l3_health_epoch", &[]),
        0.0,
        "capacity rejections are not an outage"
    );
    assert_eq!(writer.metric("tsl3_l3_health_state", &[]), 0.0);
    assert!(writer.stop().success());

    // A fresh process on the full disk reads every object that landed.
    let reader = local(fs.path());
    let first = &prompts[0];
    let v = reader.complete(first, 3);
    assert_eq!(tokens(&v), recompute(first, 3));
    assert_eq!(v["tsl3"]["l3"], 60, "the first prompt's blocks landed: {v}");
    let mut restored = 0;
    for p in &prompts[1..] {
        let v = reader.complete(p, 1);
        restored += v["tsl3"]["l3"].as_u64().unwrap();
    }
    assert!(restored > 0, "reads keep working on a full disk");
    reader.wait_backups_settled();
    assert_eq!(reader.metric("tsl3_l3_health_epoch", &[]), 0.0);
    assert!(reader.stop().success());
}

#[test]
fn a_read_only_directory_fails_puts_as_failed_and_keeps_serving_reads() {
    let Some(fs) = Tmpfs::mount("8m") else {
        return;
    };
    let p = prompt(64, 7);
    let want = recompute(&p, 4);
    let writer = local(fs.path());
    writer.complete(&p, 4);
    writer.wait_backups_settled();
    assert!(writer.stop().success());
    fs.remount_read_only();

    let reader = local(fs.path());
    let v = reader.complete(&p, 4);
    assert_eq!(tokens(&v), want);
    assert_eq!(
        v["tsl3"]["l3"], 60,
        "reads work on a read-only directory: {v}"
    );
    // A new prompt's backups cannot land: counted as failed PUTs.
    let q = prompt(64, 8);
    assert_eq!(tokens(&reader.complete(&q, 2)), recompute(&q, 2));
    let failed = wait_for_metric(
        &reader,
        "tsl3_l3_operations_total",
        &["kind=\"put\"", "outcome=\"failed\""],
        1.0,
    );
    assert!(
        failed >= 1.0,
        "a PUT on a read-only directory is a failed operation"
    );
    assert!(reader.metric("tsl3_dfs_puts_total", &["outcome=\"failed\""]) >= 1.0);
    assert_eq!(
        reader.metric("tsl3_dfs_puts_total", &["outcome=\"written\""]),
        0.0
    );
    assert!(reader.stop().success());
}

/// Completes every prompt at once, each from its own client thread, while `beside` runs
/// on one more; the answers in prompt order and what `beside` returned.
fn complete_concurrently<R: Send>(
    h: &Host,
    prompts: &[Vec<u32>],
    max_tokens: u32,
    beside: impl FnOnce() -> R + Send,
) -> (Vec<serde_json::Value>, R) {
    std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || h.complete(p, max_tokens)))
            .collect();
        let b = s.spawn(beside);
        let answers = hs.into_iter().map(|t| t.join().unwrap()).collect();
        (answers, b.join().unwrap())
    })
}

fn complete_all(h: &Host, prompts: &[Vec<u32>]) {
    complete_concurrently(h, prompts, 1, || ());
}

/// Waits (metrics are exported at most once a second) until a metric reaches `at_least`;
/// its last value.
fn wait_for_metric(h: &Host, name: &str, labels: &[&str], at_least: f64) -> f64 {
    let mut v = 0.0;
    for _ in 0..400 {
        v = h.metric(name, labels);
        if v >= at_least {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    v
}

#[test]
fn sigterm_with_a_backup_backlog_lands_every_queued_backup_first() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let log = dir.path().join("writer.log");
    let prompts: Vec<Vec<u32>> = (0..48).map(|s| prompt(64, 300 + s)).collect();
    let writer = Host::start_logged(
        &["serve", "--store", "local", "--store-dir", d],
        &[("RUST_LOG", "info")],
        &log,
    );
    complete_all(&writer, &prompts);
    // SIGTERM at once: the backups still queued or in flight land before the exit.
    assert!(writer.stop().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("every queued backup landed"),
        "the drain is reported: {text}"
    );
    let reader = local(d);
    for p in &prompts {
        let v = reader.complete(p, 1);
        assert_eq!(
            v["tsl3"]["l3"], 60,
            "every backup landed before the exit: {v}"
        );
    }
    assert!(reader.stop().success());
}

/// A store that refuses PUTs for capacity keeps its backups pending (they are re-offered
/// with a backoff), so storage never becomes idle: a local reset waits at most
/// `server.reset_idle_wait_ms`, is refused with a JSON error naming what is pending, and the
/// work it held resumes.
#[test]
fn a_local_reset_on_a_full_disk_is_refused_after_its_wait_and_serving_resumes() {
    let Some(fs) = Tmpfs::mount("256k") else {
        return;
    };
    let prompts: Vec<Vec<u32>> = (0..24).map(|s| prompt(64, 700 + s)).collect();
    let h = Host::start(
        &["serve", "--store", "local", "--store-dir", fs.path()],
        &[
            ("TSL3_SERVER__ADMIN_TOKEN", "t0k"),
            ("TSL3_SERVER__RESET_IDLE_WAIT_MS", "500"),
            ("TSL3_SERVER__SHUTDOWN_DRAIN_MS", "300"),
        ],
    );
    complete_all(&h, &prompts);
    let capacity = wait_for_metric(&h, "tsl3_dfs_puts_total", &["outcome=\"capacity\""], 1.0);
    assert!(capacity >= 1.0, "the disk filled");
    let (code, body) = h.post("/admin/reset_local", "", Some("t0k"));
    assert_ne!(code, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("a JSON error body");
    let text = doc.to_string();
    assert!(text.contains("server.reset_idle_wait_ms"), "{text}");
    assert!(text.contains("backup candidates queued"), "{text}");
    assert!(text.contains("nothing was reset"), "{text}");
    // Nothing was reset (the Device still holds the prompt) and new work is admitted.
    let again = h.complete(&prompts[23], 1);
    assert!(again["tsl3"]["device"].as_u64().unwrap() > 0, "{again}");
    assert!(h.stop().success());
}

#[test]
fn sigterm_on_a_full_disk_stops_at_the_drain_deadline_and_reports_what_it_dropped() {
    let Some(fs) = Tmpfs::mount("256k") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("writer.log");
    let prompts: Vec<Vec<u32>> = (0..24).map(|s| prompt(64, 500 + s)).collect();
    let writer = Host::start_logged(
        &["serve", "--store", "local", "--store-dir", fs.path()],
        &[("TSL3_SERVER__SHUTDOWN_DRAIN_MS", "300")],
        &log,
    );
    complete_all(&writer, &prompts);
    let capacity = wait_for_metric(
        &writer,
        "tsl3_dfs_puts_total",
        &["outcome=\"capacity\""],
        1.0,
    );
    assert!(capacity >= 1.0, "the disk filled");
    let started = std::time::Instant::now();
    assert!(writer.stop().success());
    // Generous: the 30 s grace a stopped rank used to wait is far away.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("queued backup keys are dropped"),
        "the drop is reported: {text}"
    );
}

/// The pid `launch` printed for `rank` ("engine-host launch: rank R started (pid P)").
fn rank_pid(log: &Path, rank: u32) -> i32 {
    let text = std::fs::read_to_string(log).unwrap();
    let tag = format!("rank {rank} started (pid ");
    let at = text
        .find(&tag)
        .unwrap_or_else(|| panic!("no pid of rank {rank}: {text}"));
    text[at + tag.len()..]
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn signal(pid: i32, sig: &str) {
    assert!(Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

fn alive(pid: i32) -> bool {
    // A zombie is not running: read its state, not only whether the pid exists.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// A TP=2 replica loses its follower (SIGKILL) or the follower stalls (SIGSTOP): the request
/// in flight gets a prompt JSON 503 naming the failure, and `launch` stops the leader, kills
/// what does not stop and exits non-zero within the round deadline plus its grace.
#[test]
fn a_killed_or_stalled_rank_fails_the_replica_promptly_and_launch_exits_non_zero() {
    for sig in ["KILL", "STOP"] {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("launch.log");
        let mut h = Host::start_logged(
            &["launch", "--tp", "2", "--store", "none"],
            &[("TSL3_TP__ROUND_DEADLINE_MS", "1500"), ("RUST_LOG", "warn")],
            &log,
        );
        assert_eq!(tokens(&h.complete(&prompt(16, 1), 2)).len(), 2);
        let follower = rank_pid(&log, 1);
        // A long generation is in the rounds when the follower goes.
        let body = serde_json::json!({"prompt": prompt(16, 2), "max_tokens": 4000}).to_string();
        let addr = h.addr.clone();
        let request =
            std::thread::spawn(move || common::http(&addr, "POST", "/v1/completions", &body, None));
        let mut live = 0;
        for _ in 0..400 {
            let (_, health) = h.get("/health");
            let v: serde_json::Value = serde_json::from_str(&health).unwrap_or_default();
            live = v["live_requests"].as_u64().unwrap_or(0);
            if live > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(live > 0, "{sig}: the request reached the rounds");
        let started = std::time::Instant::now();
        signal(follower, sig);
        let (code, text) = request.join().unwrap();
        assert_eq!(code, 503, "{sig}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains("failed"), "{sig}: the cause is named: {text}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "{sig}: prompt"
        );
        // launch stops the leader, kills a stalled rank after its grace, and fails.
        let mut status = None;
        for _ in 0..600 {
            if let Some(st) = h.child.try_wait().unwrap() {
                status = Some(st);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let status = status.unwrap_or_else(|| {
            panic!(
                "{sig}: launch still runs: {}",
                std::fs::read_to_string(&log).unwrap()
            )
        });
        assert!(!status.success(), "{sig}: launch exits non-zero");
        assert!(!alive(follower), "{sig}: no rank is left behind");
        if sig == "STOP" {
            // The stalled follower outlived the leader: launch stopped it.
            let text = std::fs::read_to_string(&log).unwrap();
            assert!(text.contains("the replica lost a rank"), "{text}");
        }
    }
}

/// Waits until the rank holds nothing: no live request, no storage credit, no Ready hold,
/// no queued or running L3 job.
fn assert_quiescent(h: &Host, what: &str) {
    let mut last = String::new();
    for _ in 0..800 {
        let (_, health) = h.get("/health");
        let v: serde_json::Value = serde_json::from_str(&health).unwrap_or_default();
        let live = v["live_requests"].as_u64().unwrap_or(u64::MAX);
        let credits = h.metric("tsl3_l3_credits_in_use", &[]);
        let holds = h.metric("tsl3_l3_ready_holds", &[]);
        let jobs = h.metric("tsl3_l3_jobs", &[]);
        if live == 0 && credits == 0.0 && holds == 0.0 && jobs == 0.0 {
            return;
        }
        last = format!("live {live} credits {credits} holds {holds} jobs {jobs}");
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("{what}: never quiescent: {last}");
}

/// Opens a streamed completion, reads until the first token chunk, then drops the socket.
fn stream_and_disconnect(addr: &str, prompt: &[u32]) {
    use std::io::{Read, Write};
    let body =
        serde_json::json!({"prompt": prompt, "max_tokens": 2000, "stream": true}).to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    drop(s);
}

#[test]
fn a_client_disconnect_storm_leaves_nothing_held_and_answers_stay_right() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let shared = prompt(64, 40);
    let want = recompute(&shared, 4);
    let writer = local(d);
    writer.complete(&shared, 1);
    writer.wait_backups_settled();
    assert!(writer.stop().success());
    // A fresh host: every storm request restores the shared prefix from L3 (a QUERY, a
    // GET, Ready holds) and its client vanishes mid-stream.
    let h = local(d);
    std::thread::scope(|s| {
        for i in 0..32u32 {
            let addr = h.addr.clone();
            let mut p = shared.clone();
            p.extend(prompt(8, 900 + i));
            s.spawn(move || stream_and_disconnect(&addr, &p));
        }
    });
    assert_quiescent(&h, "after the disconnect storm");
    let v = h.complete(&shared, 4);
    assert_eq!(tokens(&v), want);
    assert_quiescent(&h, "after a request");
    assert!(h.stop().success());
}

#[test]
fn a_deadline_storm_recomputes_correctly_and_releases_every_hold() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let prompts: Vec<Vec<u32>> = (0..16).map(|s| prompt(64, 60 + s)).collect();
    let writer = local(d);
    for p in &prompts {
        writer.complete(p, 1);
    }
    writer.wait_backups_settled();
    assert!(writer.stop().success());
    // A 1 ms soft deadline: preparations time out while their GETs run.
    let h = Host::start(
        &["serve", "--store", "local", "--store-dir", d],
        &[
            ("TSL3_STORAGE__CONTRACT__SOFT_DEADLINE_MS", "1"),
            ("TSL3_STORAGE__CONTRACT__READY_HOLD_MS", "1"),
        ],
    );
    let (answers, ()) = complete_concurrently(&h, &prompts, 3, || ());
    for (p, v) in prompts.iter().zip(&answers) {
        assert_eq!(tokens(v), recompute(p, 3), "{v}");
    }
    let reasons: Vec<&str> = answers
        .iter()
        .map(|v| v["tsl3"]["fallback_reason"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"deadline"), "{reasons:?}");
    assert_quiescent(&h, "after the deadline storm");
    assert!(h.stop().success());
}

#[test]
fn a_clear_under_load_answers_every_request_right_and_leaves_nothing_held() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let token = "clear-token";
    let h = Host::start(
        &["serve", "--store", "local", "--store-dir", d],
        &[("TSL3_SERVER__ADMIN_TOKEN", token)],
    );
    let prompts: Vec<Vec<u32>> = (0..12).map(|s| prompt(64, 700 + s)).collect();
    let (answers, clear) = complete_concurrently(&h, &prompts, 3, || {
        h.post("/admin/clear_cache", "", Some(token))
    });
    assert_eq!(clear.0, 200, "{}", clear.1);
    for (p, v) in prompts.iter().zip(&answers) {
        assert_eq!(tokens(v), recompute(p, 3), "{v}");
    }
    assert_quiescent(&h, "after the clear");
    assert!(h.stop().success());
}

/// A weight update under load: every request is answered (by the weights in effect when it
/// ran), the update applies once idle, and afterwards nothing computed under the old
/// weights is reused: a prompt served before the update is a miss after it, and its answer
/// equals a host started with the new weight version.
#[test]
fn a_weight_update_under_load_never_reuses_kv_of_the_old_weights() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let token = "weights-token";
    let h = Host::start(
        &["serve", "--store", "local", "--store-dir", d],
        &[("TSL3_SERVER__ADMIN_TOKEN", token)],
    );
    // Served and backed up under the old weights, before the load.
    let old = prompt(64, 799);
    h.complete(&old, 2);
    h.wait_backups_settled();
    let prompts: Vec<Vec<u32>> = (0..10).map(|s| prompt(64, 800 + s)).collect();
    let (answers, update) = complete_concurrently(&h, &prompts, 2, || {
        h.post("/admin/weight_version", r#"{"target":5}"#, Some(token))
    });
    assert_eq!(update.0, 200, "{}", update.1);
    assert_eq!(answers.len(), prompts.len());
    assert_quiescent(&h, "after the weight update");
    let after = h.complete(&old, 2);
    assert_eq!(
        after["tsl3"]["device"], 0,
        "no old-weight KV on the Device: {after}"
    );
    assert_eq!(after["tsl3"]["host"], 0, "none in Host: {after}");
    assert_eq!(after["tsl3"]["l3"], 0, "none from L3: {after}");
    let fresh = Host::start(
        &["serve", "--store", "none"],
        &[("TSL3_MODEL__WEIGHT_VERSION", "5")],
    );
    assert_eq!(tokens(&after), tokens(&fresh.complete(&old, 2)));
    // Requests that ran after the update answered with the new weights, the others with
    // the old: each answer is one of the two recomputations.
    let v1 = Host::start(&["serve", "--store", "none"], &[]);
    for (p, a) in prompts.iter().zip(&answers) {
        let t = tokens(a);
        assert!(
            t == tokens(&v1.complete(p, 2)) || t == tokens(&fresh.complete(p, 2)),
            "{a}"
        );
    }
    assert!(h.stop().success());
}
