//! The command line as a newcomer meets it: help text, and the one-line errors of a wrong
//! value, each naming the option and what would work.

use std::process::{Command, Output};

fn engine_host(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(args)
        .env_remove("TSL3_STORAGE__BACKEND")
        .env_remove("TSL3_MODEL__PROFILE")
        .env("TSL3_MODEL__DEVICE", "emulated")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The one `error:` line of a failed command.
fn error_line(o: &Output) -> String {
    let e = stderr(o);
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "one error line: {e}");
    lines[0].to_string()
}

/// `launch --tp 4` on the default profile (`tiny`, 2 KV heads) fails once, before any rank
/// starts, naming the profile and the TP sizes that work for it.
#[test]
fn launch_with_a_tp_size_the_profile_cannot_split_names_the_sizes_that_work() {
    let out = engine_host(&["launch", "--tp", "4", "--store", "none"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("rank 0 started"),
        "no rank starts: {}",
        stderr(&out)
    );
    let line = error_line(&out);
    for needle in ["tp.world", "tiny", "1, 2", "2 KV heads"] {
        assert!(line.contains(needle), "{line} should name {needle}");
    }
    // A profile with 8 KV heads: 3 does not divide them; 1, 2, 4, 8 do.
    let out = engine_host(&[
        "launch",
        "--tp",
        "3",
        "--store",
        "none",
        "--model-profile",
        "llama-8b-like",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let line = error_line(&out);
    for needle in ["llama-8b-like", "1, 2, 4, 8"] {
        assert!(line.contains(needle), "{line} should name {needle}");
    }
    // A rank started by hand gets the same line.
    let out = engine_host(&[
        "serve",
        "--world",
        "4",
        "--rank",
        "0",
        "--peers",
        "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3,127.0.0.1:4",
        "--check-config",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(error_line(&out).contains("1, 2"), "{}", stderr(&out));
}

/// `serve --help` and `launch --help` list every model profile the binary ships and every
/// store backend; `--tp` says which sizes work for each profile.
#[test]
fn help_lists_every_profile_and_store() {
    for cmd in ["serve", "launch"] {
        let out = engine_host(&[cmd, "--help"]);
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout);
        // An option's help: its line, or the line after it (clap's long layout).
        let line = |flag: &str| {
            let lines: Vec<&str> = help.lines().collect();
            let i = lines
                .iter()
                .position(|l| l.trim_start().starts_with(flag))
                .unwrap_or_else(|| panic!("{cmd} --help lacks {flag}: {help}"));
            let mut text = lines[i].to_string();
            if let Some(next) = lines
                .get(i + 1)
                .filter(|l| !l.trim_start().starts_with('-'))
            {
                text.push(' ');
                text.push_str(next.trim());
            }
            text
        };
        let profile = line("--model-profile");
        for p in engine_host::settings::MODEL_PROFILES {
            assert!(
                profile.contains(&format!(" {p} ")) || profile.ends_with(&format!(" {p}")),
                "{cmd} --help: {profile} lacks {p}"
            );
        }
        let store = line("--store ");
        for s in messages::settings::StoreKind::NAMES {
            assert!(store.contains(s), "{cmd} --help: {store} lacks {s}");
        }
        if cmd == "launch" {
            let tp = line("--tp");
            assert!(tp.contains("tiny 1|2"), "{tp}");
            assert!(tp.contains("llama-8b-like 1|2|4|8"), "{tp}");
            assert!(tp.contains("hybrid-state"), "{tp}");
        }
    }
}

/// `bench flat-kv` on a profile it cannot run names the profiles that work.
#[test]
fn flat_kv_on_a_hybrid_profile_names_the_profiles_that_work() {
    let out = engine_host(&["bench", "flat-kv", "--profile", "hybrid-swa"]);
    assert!(!out.status.success());
    let line = error_line(&out);
    for p in ["hybrid-swa", "tiny", "llama-8b-like", "replay-small"] {
        assert!(line.contains(p), "{line} should name {p}");
    }
    let (_, works) = line.split_once("work are").expect("the working profiles");
    assert!(!works.contains("hybrid"), "{line}");
}

/// A wrong store backend, from the flag, the environment or a file, is one line naming the
/// setting and every valid value.
#[test]
fn a_wrong_store_lists_the_valid_values() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bogus.toml");
    std::fs::write(&file, "[storage]\nbackend = \"bogus\"\n").unwrap();
    let from_file = file.to_str().unwrap();
    for out in [
        engine_host(&["serve", "--store", "bogus"]),
        engine_host(&["launch", "--tp", "2", "--store", "bogus"]),
        engine_host(&["serve", "--config", from_file, "--check-config"]),
        engine_host(&["check-config", from_file]),
        Command::new(env!("CARGO_BIN_EXE_engine-host"))
            .args(["serve", "--check-config"])
            .env("TSL3_STORAGE__BACKEND", "bogus")
            .output()
            .unwrap(),
    ] {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let line = error_line(&out);
        assert!(line.contains("storage.backend"), "{line}");
        for s in messages::settings::StoreKind::NAMES {
            assert!(line.contains(s), "{line} should list {s}");
        }
        assert!(line.contains("bogus"), "{line}");
    }
}

/// `launch` refuses, before starting any rank, a rank /metrics address already in use,
/// naming the setting.
#[test]
fn launch_with_a_metrics_port_in_use_names_the_setting() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // (held until the end of the test)
    let port = busy.local_addr().unwrap().port();
    // The ranks' /metrics base is the busy port (rank 0 there, rank 1 on the next one).
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["launch", "--tp", "2", "--store", "none"])
        .env("TSL3_SERVER__METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!stderr(&out).contains("started"), "{}", stderr(&out));
    let line = error_line(&out);
    for needle in [
        "server.metrics_listen",
        "rank 0",
        &format!("127.0.0.1:{port}"),
    ] {
        assert!(line.contains(needle), "{line} should name {needle}");
    }
}
