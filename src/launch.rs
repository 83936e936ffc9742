//! `engine-host launch --tp N`: starts the N rank processes of one replica on this machine
//! with generated mesh settings (free loopback ports and a fresh shared secret), passes the
//! `serve` flags on (`--listen` to the leader), forwards SIGINT/SIGTERM, reports each rank's
//! exit, stops the other ranks when one ends on its own (SIGTERM, then SIGKILL after
//! `STOP_GRACE`), and exits non-zero when any rank fails. It owns process supervision only.

use std::collections::HashMap;
use std::process::{Child, Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_ports(n: u32) -> std::io::Result<Vec<u16>> {
    // Bind them all at once so they are distinct, then release them for the ranks.
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

fn secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 24];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Refuses, with one line, a rank /metrics address already in use (before any rank starts).
fn check_metrics_ports(metrics: &[std::net::SocketAddr]) -> Result<(), String> {
    for (rank, a) in metrics.iter().enumerate() {
        if let Err(e) = std::net::TcpListener::bind(a) {
            return Err(format!(
                "invalid setting server.metrics_listen: rank {rank} serves /metrics and /health on {a} (the port of server.metrics_listen, or else server.listen, + {rank}), which is unavailable: {e}; choose a base address with {} free ports from it",
                metrics.len()
            ));
        }
    }
    Ok(())
}

/// `metrics`: each rank's /metrics and /health address (rank 0's is its API address unless
/// `server.metrics_listen` is set), as the settings resolved them.
pub fn run(
    tp: u32,
    serve_args: Vec<String>,
    listen: Option<String>,
    metrics: Vec<std::net::SocketAddr>,
    env: &HashMap<String, String>,
) -> ExitCode {
    if tp == 0 || tp > 64 {
        eprintln!("error: invalid setting tp.world: --tp must be between 1 and 64");
        return ExitCode::from(2);
    }
    if let Err(e) = check_metrics_ports(&metrics) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot find the engine-host executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ports = match free_ports(tp) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: no free loopback ports for the mesh: {e}");
            return ExitCode::FAILURE;
        }
    };
    let peers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let secret = env.get("TSL3_TP__SECRET").cloned().unwrap_or_else(secret);
    // SIGINT/SIGTERM are taken over before the first rank starts (a stop from then on is
    // forwarded to every rank, never the default action that would leave them orphaned).
    // A rank's own dispositions reset at exec.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook_consts::SIGINT, signal_hook_consts::SIGTERM] {
        let s = stop.clone();
        install(sig, s);
    }
    let mut children: Vec<(u32, Child)> = vec![];
    for rank in 0..tp {
        if stop.load(Ordering::SeqCst) {
            // Stopped while starting: the ranks started so far get the SIGTERM below.
            break;
        }
        let mut cmd = Command::new(&exe);
        cmd.arg("serve")
            .args(&serve_args)
            .args(["--rank", &rank.to_string(), "--world", &tp.to_string()])
            .args(["--peers", &peers.join(",")])
            .env("TSL3_TP__SECRET", &secret);
        if rank == 0 {
            if let Some(l) = &listen {
                cmd.args(["--listen", l]);
            }
        }
        // Every rank gets the base; rank r serves on its port + r (= metrics[r]).
        if let Some(base) = metrics.first() {
            cmd.args(["--metrics-listen", &base.to_string()]);
        }
        let m = metrics.get(rank as usize);
        match cmd.spawn() {
            Ok(c) => {
                eprintln!(
                    "engine-host launch: rank {rank} started (pid {}){}",
                    c.id(),
                    m.map(|m| format!(", /metrics on http://{m}/metrics"))
                        .unwrap_or_default()
                );
                children.push((rank, c));
            }
            Err(e) => {
                eprintln!("error: starting rank {rank}: {e}");
                terminate(&mut children);
                return ExitCode::FAILURE;
            }
        }
    }
    let mut failed = false;
    let mut forwarded = false;
    // Set when a rank ended on its own: the replica cannot serve without it, so the others
    // are stopped, and any still running after the grace (a SIGSTOPped rank ignores
    // SIGTERM) is killed.
    let mut kill_at: Option<Instant> = None;
    while !children.is_empty() {
        if stop.load(Ordering::SeqCst) && !forwarded {
            forwarded = true;
            signal_all(&children, libc::SIGTERM);
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            kill_at = None;
            for (rank, c) in &children {
                eprintln!(
                    "engine-host launch: rank {rank} did not stop within {} ms of SIGTERM; killing it",
                    STOP_GRACE.as_millis()
                );
                // SAFETY: kill(2) on a child PID this process spawned and has not reaped.
                unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            }
        }
        let mut i = 0;
        let mut ended = false;
        while i < children.len() {
            match children[i].1.try_wait() {
                Ok(Some(status)) => {
                    let (rank, _) = children.remove(i);
                    eprintln!("engine-host launch: rank {rank} exited: {status}");
                    if !status.success() && !stopped_while_starting(status, forwarded) {
                        failed = true;
                    }
                    ended = true;
                }
                Ok(None) => i += 1,
                Err(e) => {
                    let (rank, _) = children.remove(i);
                    eprintln!("engine-host launch: rank {rank}: {e}");
                    failed = true;
                    ended = true;
                }
            }
        }
        if ended && !forwarded && kill_at.is_none() && !children.is_empty() {
            // A rank ended without being asked to: the replica has failed.
            failed = true;
            forwarded = true;
            eprintln!(
                "engine-host launch: the replica lost a rank; stopping the other {} (SIGTERM, SIGKILL after {} ms)",
                children.len(),
                STOP_GRACE.as_millis()
            );
            signal_all(&children, libc::SIGTERM);
            // A stopped rank gets the SIGTERM once it runs again.
            signal_all(&children, libc::SIGCONT);
            kill_at = Some(Instant::now() + STOP_GRACE);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Whether a rank ended by the SIGTERM this launcher forwarded on a stop: it was still
/// starting (a rank takes SIGTERM over before it joins the mesh), so it held nothing and
/// the stop is clean.
fn stopped_while_starting(status: std::process::ExitStatus, forwarded: bool) -> bool {
    use std::os::unix::process::ExitStatusExt;
    forwarded && status.signal() == Some(libc::SIGTERM)
}

/// How long the remaining ranks of a failed replica get between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

fn signal_all(children: &[(u32, Child)], sig: i32) {
    for (_, c) in children {
        // SAFETY: kill(2) on a child PID this process spawned and has not reaped (reaping
        // happens only in this thread, after which the child leaves `children`).
        unsafe { libc::kill(c.id() as i32, sig) };
    }
}

fn terminate(children: &mut [(u32, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

mod signal_hook_consts {
    pub const SIGINT: i32 = libc::SIGINT;
    pub const SIGTERM: i32 = libc::SIGTERM;
}

static STOP_FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();

extern "C" fn on_signal(_: i32) {
    if let Some(f) = STOP_FLAG.get() {
        f.store(true, Ordering::SeqCst);
    }
}

fn install(sig: i32, flag: Arc<AtomicBool>) {
    let _ = STOP_FLAG.set(flag);
    // SAFETY: the handler only performs an atomic store (async-signal-safe) on a flag set
    // before installation; signal(2) with a valid handler pointer.
    unsafe {
        libc::signal(sig, on_signal as *const () as libc::sighandler_t);
    }
}
