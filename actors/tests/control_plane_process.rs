//! The control plane across separate OS processes: this test re-executes its own binary
//! as ranks 1 and 2 (selected by an environment variable), agrees rounds with them over
//! loopback TCP, then SIGKILLs rank 2 and checks that rank 0 and rank 1 both fail the next
//! round with an error naming rank 2.

use actors::control_plane::{ControlPlaneCore, MeshSettings};
use actors::names::env::{CONTROL_PLANE_TEST_CHILD, MESH_SECRET};
use messages::{ControlError, Namespace, OperationId, RoundReport, StorageDone};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

const TEST_NAME: &str = "separate_processes_agree_and_a_sigkilled_rank_fails_the_others";
const WORLD: u32 = 3;

fn namespace() -> Namespace {
    Namespace("tsl3-0000000000proc".into())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn settings(rank: u32, peers: Vec<String>, secret: Vec<u8>) -> MeshSettings {
    let mut s = MeshSettings::new(rank, peers, namespace(), secret);
    s.connect_deadline = Duration::from_secs(60);
    s.round_deadline = Duration::from_secs(60);
    s
}

fn report(rank: u32, round: u64, clock_us: u64) -> RoundReport {
    let mut r = RoundReport::idle(rank, round, clock_us);
    r.completions
        .push(StorageDone::query(OperationId(round + 1), vec![true], true));
    r
}

/// A child rank: announce its port, learn the peers, then do rounds until one fails.
fn child_main(rank: u32) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    println!("PORT {}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let peers: Vec<String> = line
        .trim()
        .strip_prefix("PEERS ")
        .unwrap()
        .split(',')
        .map(String::from)
        .collect();
    let secret = unhex(&std::env::var(MESH_SECRET).unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let s = settings(rank, peers, secret);
        let mut core = ControlPlaneCore::establish_with_listener(&s, listener)
            .await
            .unwrap();
        for round in 0..1000u64 {
            match core.exchange_round(report(rank, round, 7)).await {
                Ok(a) => println!("AGREED {} {} {}", a.round, a.tick_us, a.completions.len()),
                Err(e) => {
                    println!("ERROR {:?} {e}", e.blamed_rank());
                    std::io::stdout().flush().unwrap();
                    // A failed rank stops rounds but stays up (with its sockets) until the
                    // parent closes its stdin.
                    let mut rest = String::new();
                    let _ = std::io::stdin().read_line(&mut rest);
                    break;
                }
            }
            std::io::stdout().flush().unwrap();
        }
    });
    std::io::stdout().flush().unwrap();
}

/// Kills every child still running when the test ends (also on panic).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn line_with(out: &mut BufReader<ChildStdout>, prefix: &str) -> String {
    loop {
        let mut line = String::new();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "child ended before printing {prefix}");
        // The harness prints "test <name> ... " without a newline before the child's output.
        if let Some(at) = line.find(prefix) {
            return line.trim_end()[at + prefix.len()..].to_string();
        }
    }
}

#[test]
fn separate_processes_agree_and_a_sigkilled_rank_fails_the_others() {
    if let Ok(rank) = std::env::var(CONTROL_PLANE_TEST_CHILD) {
        child_main(rank.parse().unwrap());
        return;
    }
    let secret: [u8; 32] = rand::random();
    let exe = std::env::current_exe().unwrap();
    let mut children = Children(Vec::new());
    let mut outs = Vec::new();
    for rank in 1..WORLD {
        let mut c = Command::new(&exe)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CONTROL_PLANE_TEST_CHILD, rank.to_string())
            .env(MESH_SECRET, hex(&secret))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        outs.push(BufReader::new(c.stdout.take().unwrap()));
        children.0.push(c);
    }
    let ports: Vec<String> = outs.iter_mut().map(|o| line_with(o, "PORT ")).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let mut peers = vec![listener.local_addr().unwrap().to_string()];
    peers.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
    for c in &mut children.0 {
        let stdin = c.stdin.as_mut().unwrap();
        writeln!(stdin, "PEERS {}", peers.join(",")).unwrap();
        stdin.flush().unwrap();
    }
    let s = settings(0, peers, secret.to_vec());
    let mut core = rt
        .block_on(ControlPlaneCore::establish_with_listener(&s, listener))
        .unwrap();
    for round in 0..3u64 {
        let a = rt
            .block_on(core.exchange_round(report(0, round, 1000 + round)))
            .unwrap();
        assert_eq!(a.tick_us, 1000 + round);
        assert_eq!(
            a.completions.len(),
            1,
            "every process reported op {}",
            round + 1
        );
        for o in &mut outs {
            assert_eq!(
                line_with(o, "AGREED "),
                format!("{round} {} 1", 1000 + round),
                "the child agreed the same round"
            );
        }
    }
    // SIGKILL rank 2.
    children.0[1].kill().unwrap();
    children.0[1].wait().unwrap();
    let e = rt
        .block_on(core.exchange_round(report(0, 3, 2000)))
        .unwrap_err();
    assert_eq!(e.blamed_rank(), Some(2), "{e}");
    assert!(matches!(
        e,
        ControlError::Disconnected { rank: 2, .. } | ControlError::Timeout { rank: 2, .. }
    ));
    let child_error = line_with(&mut outs[0], "ERROR ");
    assert!(child_error.starts_with("Some(2) "), "{child_error}");
    assert!(child_error.contains("rank 2"), "{child_error}");
    drop(children.0[0].stdin.take());
    let status = children.0[0].wait().unwrap();
    assert!(status.success(), "rank 1 exits cleanly after its error");
    let again = rt.block_on(core.exchange_round(report(0, 4, 3000)));
    assert!(matches!(again, Err(ControlError::Stopped(_))), "{again:?}");
}
