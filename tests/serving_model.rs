//! A real model served for real: `engine-host model init-random` writes a Llama-format
//! checkpoint, `engine-host serve --model-dir` serves it over real HTTP, and a prefix
//! restored from the Device (L1), the Host (L2) and, in a fresh process, from L3 (real files
//! of the local store) gives the greedy tokens a storage-disabled process recomputes.

mod common;

use common::{tokens, Host};
use std::process::Command;

fn init_random(dir: &std::path::Path, seed: &str) {
    common::init_random_model(dir, seed.parse().unwrap());
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 11 + 5) % 250).collect()
}

#[test]
fn a_restored_prefix_from_every_tier_gives_the_recomputed_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("random-llama");
    init_random(&model, "5");
    let m = model.to_str().unwrap();
    let l3 = dir.path().join("l3");
    let l3 = l3.to_str().unwrap();
    let p = prompt(70);

    let plain = Host::start(&["serve", "--model-dir", m, "--store", "none"], &[]);
    let want = plain.complete(&p, 8);
    assert_eq!(want["tsl3"]["fallback_reason"], "disabled");
    assert_eq!(
        want["model"], "random-llama",
        "the directory names the model"
    );
    let want = tokens(&want);
    assert_eq!(want.len(), 8);
    assert!(plain.stop().success());

    let admin = [("TSL3_SERVER__ADMIN_TOKEN", "t0k")];
    let args = [
        "serve",
        "--model-dir",
        m,
        "--store",
        "local",
        "--store-dir",
        l3,
    ];
    let a = Host::start(&args, &admin);
    let first = a.complete(&p, 8);
    assert_eq!(tokens(&first), want, "computed with storage on");
    let device = a.complete(&p, 8);
    assert_eq!(device["tsl3"]["device"], 64, "{device}");
    assert_eq!(tokens(&device), want, "Device (L1) restore");
    let (code, body) = a.post("/admin/reset_local", r#"{"host":false}"#, Some("t0k"));
    assert_eq!(code, 200, "{body}");
    let host = a.complete(&p, 8);
    assert_eq!(host["tsl3"]["device"], 0, "{host}");
    assert_eq!(host["tsl3"]["host"], 64, "{host}");
    assert_eq!(tokens(&host), want, "Host (L2) restore");
    a.wait_backups_settled();
    assert!(a.stop().success());

    let b = Host::start(&args, &[]);
    let restored = b.complete(&p, 8);
    assert_eq!(restored["tsl3"]["l3"], 64, "{restored}");
    assert_eq!(restored["tsl3"]["computed"], 6);
    assert_eq!(tokens(&restored), want, "L3 restore in a fresh process");
    assert!(b.stop().success());

    // Another checkpoint (another seed) never reuses this one's KV: its namespace differs.
    let other = dir.path().join("other");
    init_random(&other, "6");
    let c = Host::start(
        &[
            "serve",
            "--model-dir",
            other.to_str().unwrap(),
            "--store",
            "local",
            "--store-dir",
            l3,
        ],
        &[],
    );
    let miss = c.complete(&p, 8);
    assert_eq!(miss["tsl3"]["l3"], 0, "{miss}");
    assert_eq!(miss["tsl3"]["fallback_reason"], "miss");
    assert_ne!(tokens(&miss), want, "another model answers otherwise");
    assert!(c.stop().success());
}

#[test]
fn a_model_directory_setting_is_checked_at_startup() {
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args([
            "serve",
            "--model-dir",
            "/nonexistent/tsl3-model",
            "--check-config",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("model.dir") && e.contains("config.json"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    init_random(dir.path(), "1");
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args([
            "launch",
            "--tp",
            "2",
            "--model-dir",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("model.dir") && e.contains("one rank"), "{e}");
}
