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

mod common;

use actors::l3::store::mooncake::live;
use common::{tokens, Host};

const TEST: &str = "serving_mooncake";

/// The engine host's `[storage.mooncake]` settings as TSL3_* overrides, from the variables
/// deploy/mooncake/env.sh exports; None (skipped loudly) without a library or a master.
fn mooncake_env() -> Option<Vec<(String, String)>> {
    let m = live::settings_or_skip(TEST)?;
    Some(live::engine_env(&m))
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

    let mc: Vec<(&str, &str)> = mc.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let first = Host::start(&["serve", "--store", "mooncake"], &mc);
    let a = first.complete(&p, 6);
    assert_eq!(tokens(&a), want, "a computed answer equals recomputation");
    assert_eq!(a["tsl3"]["l3"], 0, "a new prompt is not in the store yet");
    assert_eq!(a["tsl3"]["fallback_reason"], "miss");
    first.wait_backups_settled();
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

/// `config/examples/mooncake.toml` as written, with only what `. deploy/mooncake/env.sh`
/// exports (inherited from the test command's environment): no TSL3_* overrides. Its
/// backups must land (no quarantine) and a fresh process must restore them.
#[test]
fn the_example_config_serves_as_written_against_the_deploy_scripts() {
    if live::settings_or_skip(TEST).is_none() {
        return;
    }
    let args = ["serve", "--config", "config/examples/mooncake.toml"];
    let p = salted_prompt(64);
    let first = Host::start(&args, &[]);
    let a = first.complete(&p, 3);
    assert_eq!(a["tsl3"]["fallback_reason"], "miss", "{a}");
    first.wait_backups_settled();
    assert_eq!(
        first.metric("tsl3_l3_health_state", &[]),
        0.0,
        "the example's PUTs succeed: healthy, never quarantined"
    );
    assert!(first.metric("tsl3_l3_put_new_writes_total", &[]) >= 1.0);
    assert!(first.stop().success());
    let second = Host::start(&args, &[]);
    let b = second.complete(&p, 3);
    assert!(b["tsl3"]["l3"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(tokens(&b), tokens(&a));
    assert!(second.stop().success());
}

/// The transformer backend over Mooncake: a random Llama-format checkpoint
/// (`engine-host model init-random`) served by two fresh processes in turn; the second
/// restores the prefix the first backed up and draws the recomputed greedy token. One
/// token: the salted prompt may make a random model emit its end-of-sequence token early,
/// and a choice stopped before its last token is cancelled without a tier split.
#[test]
fn a_real_model_restores_its_prefix_from_mooncake_in_a_fresh_process() {
    let Some(mc) = mooncake_env() else { return };
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m");
    common::init_random_model(&model, 9);
    let m = model.to_str().unwrap();
    // The random model's vocabulary is 260 tokens.
    let p: Vec<u32> = salted_prompt(70).into_iter().map(|t| t % 256).collect();
    let want = {
        let h = Host::start(&["serve", "--model-dir", m, "--store", "none"], &[]);
        let v = h.complete(&p, 1);
        assert!(h.stop().success());
        tokens(&v)
    };
    let mc: Vec<(&str, &str)> = mc.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let args = ["serve", "--model-dir", m, "--store", "mooncake"];
    let first = Host::start(&args, &mc);
    let a = first.complete(&p, 1);
    assert_eq!(tokens(&a), want);
    first.wait_backups_settled();
    assert!(first.stop().success());
    let second = Host::start(&args, &mc);
    let b = second.complete(&p, 1);
    assert_eq!(b["tsl3"]["l3"], 64, "{b}");
    assert_eq!(
        tokens(&b),
        want,
        "restored from Mooncake, read by real attention"
    );
    assert!(second.stop().success());
}
