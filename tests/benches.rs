//! The end-to-end benchmarks as correctness smoke runs (never a timing): `bench ttft` and
//! `bench replay` on tiny sizes drive real engine-host processes, must exit 0, write their
//! JSON and SVG, find every restored output equal to recomputation and replay with zero
//! errors. Also the admin path these benches rely on, on a real process: `POST
//! /admin/reset_local` (L1 only, then L1 and L2, with L3 untouched) and two admin commands
//! at once, each answered with its own result.

mod common;

use common::Host;
use std::path::Path;
use std::process::Command;

fn engine_host() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engine-host"));
    c.env("RUST_LOG", "warn");
    c
}

/// Runs `engine-host ARGS --out OUT`, which must exit 0; its stdout.
fn run_ok(args: &[&str], out: &Path) -> String {
    let o = engine_host()
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn read_json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

fn assert_svg(p: &Path) {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(text.starts_with("<svg"), "{}", p.display());
}

#[test]
fn bench_ttft_smoke_restores_equal_recomputation_in_every_cohort() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ttft");
    let stdout = run_ok(
        &[
            "bench",
            "ttft",
            "--profile",
            "tiny",
            "--lengths",
            "48,96",
            "--runs",
            "2",
        ]
        .into_iter()
        .chain(["--no-device-time", "--tpot-tokens", "8"])
        .collect::<Vec<_>>(),
        &out,
    );
    assert!(
        stdout.contains("ttft l3-dfs-warm / recompute at 96 tokens"),
        "{stdout}"
    );
    let doc = read_json(&out.join("ttft.json"));
    assert_svg(&out.join("ttft.svg"));
    assert_eq!(doc["mismatches"].as_array().unwrap().len(), 0);
    let samples = doc["samples"].as_array().unwrap();
    // 8 cohorts x 2 lengths x 2 runs, every output equal to recomputation.
    assert_eq!(samples.len(), 32);
    assert!(samples
        .iter()
        .all(|s| s["output_matches_recompute"] == true));
    // Each cohort found its prefix where it says: the tier split is part of the result.
    let mean = |cohort: &str, tier: &str| -> f64 {
        let v: Vec<f64> = samples
            .iter()
            .filter(|s| s["cohort"] == cohort)
            .map(|s| s[tier].as_f64().unwrap())
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    assert_eq!(mean("recompute", "computed"), (48.0 + 96.0) / 2.0);
    assert!(mean("device", "device") > 0.0);
    assert!(mean("host", "host") > 0.0 && mean("host", "device") == 0.0);
    for c in ["l3-dfs-warm", "l3-dfs-cold", "l3-memory"] {
        assert!(mean(c, "l3") > 0.0, "{c} restored nothing from L3");
        assert_eq!(mean(c, "device") + mean(c, "host"), 0.0, "{c}");
    }
    assert!(mean("partial", "l3") > 0.0 && mean("partial", "computed") > 4.0);
    assert_eq!(mean("miss", "l3"), 0.0);
    assert_eq!(doc["tpot"].as_array().unwrap().len(), 2);
}

/// A tiny Bailian-format conversation (3 turns, each extending the last).
const BAILIAN: &str = r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0, "input_length": 40, "output_length": 3, "type": "text", "turn": 1, "hash_ids": [1, 2, 3]}
{"chat_id": 2, "parent_chat_id": -1, "timestamp": 1, "input_length": 20, "output_length": 3, "type": "text", "turn": 1, "hash_ids": [9, 10]}
{"chat_id": 3, "parent_chat_id": 1, "timestamp": 5, "input_length": 70, "output_length": 3, "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]}
{"chat_id": 4, "parent_chat_id": 3, "timestamp": 9, "input_length": 90, "output_length": 3, "type": "text", "turn": 3, "hash_ids": [1, 2, 3, 4, 5, 6]}
"#;

fn replay(trace: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let trace = trace.to_string_lossy().to_string();
    let mut args = vec!["bench", "replay", "--no-device-time", "--instances", "2"];
    args.extend(["--trace", trace.as_str()]);
    args.extend(extra);
    let stdout = run_ok(&args, out);
    assert!(stdout.contains("achieved/ideal"), "{stdout}");
    assert_svg(&out.join("replay.svg"));
    read_json(&out.join("replay.json"))
}

#[test]
fn bench_replay_smoke_both_trace_formats_with_zero_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bailian = dir.path().join("bailian.jsonl");
    std::fs::write(&bailian, BAILIAN).unwrap();
    let doc = replay(
        &bailian,
        &dir.path().join("b"),
        &[
            "--profile",
            "tiny",
            "--concurrency",
            "1",
            "--routing",
            "affinity",
        ],
    );
    assert_eq!(doc["format"], "Bailian");
    let cohorts = doc["cohorts"].as_array().unwrap();
    assert_eq!(cohorts.len(), 3);
    for c in cohorts {
        assert_eq!(c["errors"], 0, "{c}");
        assert_eq!(c["requests"], 4);
    }
    // Turns 2 and 3 extend the turn before at its end: turn 2 finds turn 1's 40 tokens
    // (block 3 cut at 8), turn 3 finds turn 2's 70 (block 5 cut at 6).
    assert_eq!(cohorts[1]["ideal_cached_tokens"], 110);
    // Affinity keeps the conversation on one instance: its local caches find the prefix.
    assert!(cohorts[0]["achieved_rate"].as_f64().unwrap() > 0.0);
    // A restarted fleet starts with empty local caches: turn 1 comes from L3 (the shared
    // cohort wrote it), later turns from the instance's own Device.
    let restart = &cohorts[2];
    assert!(
        restart["rate_by_tier"]["l3"].as_f64().unwrap() > 0.0,
        "{restart}"
    );

    // The shipped Mooncake FAST'25 trace (shared/data), first requests, open loop.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/mooncake_conversation_trace.jsonl");
    let doc = replay(
        &shipped,
        &dir.path().join("m"),
        &["--limit", "6", "--speedup", "1000", "--max-output", "2"],
    );
    assert_eq!(doc["format"], "Mooncake");
    for c in doc["cohorts"].as_array().unwrap() {
        assert_eq!(c["errors"], 0, "{c}");
    }
    assert!(doc["unique_kv_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn reset_local_drops_device_then_host_and_keeps_l3() {
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
        &[("TSL3_SERVER__ADMIN_TOKEN", "t0k")],
    );
    let prompt: Vec<u32> = (0..64).map(|i| (i * 7 + 3) % 1000).collect();
    let first = h.complete(&prompt, 4);
    assert_eq!(first["tsl3"]["computed"], 64);
    let again = h.complete(&prompt, 4);
    assert!(again["tsl3"]["device"].as_u64().unwrap() > 0, "{again}");
    let (code, body) = h.post("/admin/reset_local", r#"{"host":false}"#, Some("t0k"));
    assert_eq!(code, 200, "{body}");
    let host = h.complete(&prompt, 4);
    assert_eq!(host["tsl3"]["device"], 0, "{host}");
    assert!(host["tsl3"]["host"].as_u64().unwrap() > 0, "{host}");
    // Both local tiers: the reset waited for the backups, so L3 has the prefix.
    let (code, body) = h.post("/admin/reset_local", "", Some("t0k"));
    assert_eq!(code, 200, "{body}");
    let l3 = h.complete(&prompt, 4);
    assert_eq!(l3["tsl3"]["device"], 0, "{l3}");
    assert_eq!(l3["tsl3"]["host"], 0, "{l3}");
    assert!(l3["tsl3"]["l3"].as_u64().unwrap() > 0, "{l3}");
    for r in [&again, &host, &l3] {
        assert_eq!(r["tsl3"]["output_tokens"], first["tsl3"]["output_tokens"]);
    }
    // Without the token it is refused, with a JSON body.
    let (code, body) = h.post("/admin/reset_local", "", None);
    assert_eq!(code, 401);
    assert!(body.contains("bearer token"));
    assert!(h.stop().success());
}

/// With `--mooncake`, the MEMORY-tier cohort over the real Mooncake master and storage
/// owner deploy/test-all.sh starts: the restore matches recomputation. Gated like the other
/// live tests (MOONCAKE_REQUIRE_MASTER=1 turns a missing master into a failure).
#[test]
fn bench_ttft_smoke_over_a_live_mooncake_store() {
    use actors::l3::store::mooncake::live;
    if live::settings_or_skip("bench_ttft_smoke_over_a_live_mooncake_store").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ttft");
    run_ok(
        &[
            "bench",
            "ttft",
            "--profile",
            "tiny",
            "--lengths",
            "64",
            "--runs",
            "1",
        ]
        .into_iter()
        .chain(["--no-device-time", "--tpot-tokens", "0", "--mooncake"])
        .collect::<Vec<_>>(),
        &out,
    );
    let doc = read_json(&out.join("ttft.json"));
    let mc: Vec<&serde_json::Value> = doc["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["cohort"] == "l3-mooncake")
        .collect();
    assert_eq!(mc.len(), 1);
    assert_eq!(mc[0]["output_matches_recompute"], true);
    assert!(mc[0]["l3"].as_u64().unwrap() > 0, "{}", mc[0]);
}

/// `bench replay --mooncake`: the instances share the real Mooncake Store that
/// deploy/test-all.sh starts; a restarted fleet reuses from it what the shared cohort
/// wrote, with zero errors. Gated like the other live tests.
#[test]
fn bench_replay_smoke_over_a_live_mooncake_store() {
    use actors::l3::store::mooncake::live;
    if live::settings_or_skip("bench_replay_smoke_over_a_live_mooncake_store").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bailian = dir.path().join("bailian.jsonl");
    std::fs::write(&bailian, BAILIAN).unwrap();
    let doc = replay(
        &bailian,
        &dir.path().join("mc"),
        &["--profile", "tiny", "--concurrency", "1", "--mooncake"],
    );
    let cohorts = doc["cohorts"].as_array().unwrap();
    for c in cohorts {
        assert_eq!(c["errors"], 0, "{c}");
    }
    let restart = &cohorts[2];
    assert!(
        restart["rate_by_tier"]["l3"].as_f64().unwrap() > 0.0,
        "{restart}"
    );
}

/// Two admin commands sent at once are applied one at a time in arrival order, and each
/// client gets its own command's result (before, every waiting client got the first one's).
#[test]
fn concurrent_admin_commands_each_get_their_own_answer() {
    let h = Host::start(
        &["serve", "--store", "none"],
        &[("TSL3_SERVER__ADMIN_TOKEN", "t0k")],
    );
    let addr = h.addr.clone();
    let a = std::thread::spawn({
        let addr = addr.clone();
        move || {
            common::http(
                &addr,
                "POST",
                "/admin/reset_local",
                r#"{"host":false}"#,
                Some("t0k"),
            )
        }
    });
    let b = std::thread::spawn(move || {
        common::http(
            &addr,
            "POST",
            "/admin/weight_version",
            r#"{"target":7}"#,
            Some("t0k"),
        )
    });
    let (ca, ba) = a.join().unwrap();
    let (cb, bb) = b.join().unwrap();
    assert_eq!((ca, cb), (200, 200), "{ba} {bb}");
    assert!(ba.contains("reset the local caches (device)"), "{ba}");
    assert!(bb.contains("weights 7"), "{bb}");
    assert!(h.stop().success());
}

/// `bench promotion`, `bench dfs-put` and `bench dfs-get` on their default directory (`.tsl3/bench` under
/// the working directory) leave nothing behind: not their run directory, nor the
/// `.tsl3/bench` they created.
#[test]
fn scratch_benches_leave_no_state_directory_behind() {
    for args in [
        &[
            "bench",
            "promotion",
            "--objects",
            "2",
            "--object-bytes",
            "4096",
        ][..],
        &[
            "bench",
            "dfs-put",
            "--objects",
            "4",
            "--object-bytes",
            "4096",
            "--batch",
            "2",
        ][..],
        &[
            "bench",
            "dfs-get",
            "--objects",
            "4",
            "--object-bytes",
            "300000",
            "--batch",
            "3",
            "--rounds",
            "1",
        ][..],
    ] {
        let cwd = tempfile::tempdir().unwrap();
        let o = engine_host()
            .args(args)
            .args(if args[1] == "promotion" {
                &["--rounds", "1", "--workers", "1"][..]
            } else {
                &[][..]
            })
            .current_dir(cwd.path())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(!out.is_empty(), "{args:?} printed its figures");
        if args[1] == "dfs-get" {
            // The GET and its memcpy baseline ran side by side.
            assert!(out.contains("memcpy of the same bytes"), "{out}");
            assert!(out.contains("DFS GET beyond memcpy"), "{out}");
        }
        let left: Vec<_> = std::fs::read_dir(cwd.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}
