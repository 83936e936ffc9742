//! A DFS writer SIGKILLed in the middle of a large PUT leaves no visible object: readers
//! see Missing (never a partial object), and the key can still be published afterwards.
//! The child is this same test binary, re-entered with `TSL3_DFS_TEST_CHILD=crash-writer`.

use actors::l3::store::dfs::{DfsStore, DFS_HEADER_LEN, DFS_WRITE_CHUNK};
use actors::l3::store::faulty::Gate;
use actors::l3::store::{KeyResult, Store};
use actors::names::env::{DFS_TEST_CHILD, DFS_TEST_DIR};
use messages::StorageKey;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

const TEST_NAME: &str = "a_writer_killed_mid_write_leaves_no_visible_object";
const LEN: usize = 4 * DFS_WRITE_CHUNK + 123;

fn key() -> StorageKey {
    StorageKey::new("tsl3-00000000000c0a5e-big")
}

fn payload() -> Vec<u8> {
    (0..LEN).map(|i| (i % 251) as u8).collect()
}

/// Kills and reaps the child on every path, so a failing assertion leaves no orphan.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Child role: write the large object, park after the first chunk, announce it, and wait
/// to be killed.
fn crash_writer() {
    let dir = std::env::var(DFS_TEST_DIR).unwrap();
    let dfs = DfsStore::open(dir, 2).unwrap();
    let gate = Gate::new();
    *dfs.hooks.after_write_chunk.lock() = Some(gate.clone());
    let announcer = gate.clone();
    std::thread::spawn(move || {
        announcer.wait_entered(1);
        let mut out = std::io::stdout();
        writeln!(out, "MIDWRITE").unwrap();
        out.flush().unwrap();
    });
    let r = dfs.put(&[key()], &[&payload()]);
    panic!("the gate is never released, the parent kills this process: {r:?}");
}

#[test]
fn a_writer_killed_mid_write_leaves_no_visible_object() {
    if std::env::var(DFS_TEST_CHILD).as_deref() == Ok("crash-writer") {
        crash_writer();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(DFS_TEST_CHILD, "crash-writer")
        .env(DFS_TEST_DIR, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut child = KillOnDrop(child);
    let mut mid_write = false;
    for line in stdout.lines() {
        if line.unwrap().contains("MIDWRITE") {
            mid_write = true;
            break;
        }
    }
    assert!(mid_write, "the child reached the middle of its write");
    let dfs = DfsStore::open(dir.path(), 2).unwrap();
    assert_eq!(dfs.query(&[key()]).unwrap(), vec![false]);
    child.0.kill().unwrap(); // SIGKILL
    let status = child.0.wait().unwrap();
    assert!(!status.success());
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
    // A partial temporary file is what the crash left, under a name no key can take.
    let ns_dir = dir.path().join("tsl3-00000000000c0a5e");
    let leftovers: Vec<(String, u64)> = std::fs::read_dir(&ns_dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    assert!(leftovers[0].0.starts_with('.'), "{leftovers:?}");
    assert!(
        leftovers[0].1 < (DFS_HEADER_LEN + LEN) as u64,
        "it was partial"
    );
    // Readers see Missing, never a partial object.
    let mut dest = vec![0u8; LEN];
    assert_eq!(
        dfs.get(&[key()], &mut [&mut dest]).unwrap(),
        vec![KeyResult::Missing]
    );
    assert_eq!(dfs.query(&[key()]).unwrap(), vec![false]);
    // The leftover does not block a later publication of the key.
    let dfs = Arc::new(dfs);
    assert_eq!(
        dfs.put(&[key()], &[&payload()]).unwrap(),
        vec![KeyResult::Ok { bytes: LEN as u64 }]
    );
    assert_eq!(
        dfs.get(&[key()], &mut [&mut dest]).unwrap(),
        vec![KeyResult::Ok { bytes: LEN as u64 }]
    );
    assert_eq!(dest, payload());
}
