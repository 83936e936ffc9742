//! A rank's life as an orchestrator sees it, through real processes: a mesh that never
//! forms ends the process, and so on. Waits are bounded polls; no timing is asserted beyond
//! "does not hang".

mod common;

use common::free_port;
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

/// A rank started alone (its peers never start) exits non-zero after the mesh connect
/// deadline, with one error line naming the ranks that did not join and the setting,
/// instead of serving `starting` forever. Leader and follower alike.
#[test]
fn a_rank_whose_mesh_never_forms_exits_non_zero() {
    let peers = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    for rank in ["0", "1"] {
        let listen = format!("127.0.0.1:{}", free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_engine-host"))
            .args(["serve", "--store", "none", "--world", "2", "--rank", rank])
            .args(["--peers", &peers, "--listen", &listen])
            .env("TSL3_TP__SECRET", "s3cret")
            .env("TSL3_TP__CONNECT_DEADLINE_MS", "1500")
            .env("TSL3_MODEL__DEVICE", "emulated")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
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
