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
