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

use actors::names::env;
use common::{tokens, Host};
use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const TEST: &str = "serving_mooncake";

fn required() -> bool {
    std::env::var(env::MOONCAKE_REQUIRE_MASTER).is_ok_and(|v| v == "1")
}

/// Skips loudly (straight to stderr, past the harness's capture), or fails under
/// MOONCAKE_REQUIRE_MASTER=1.
fn skip(why: &str) {
    assert!(
        !required(),
        "{} is 1 but {TEST}: {why}",
        env::MOONCAKE_REQUIRE_MASTER
    );
    let _ = writeln!(std::io::stderr(), "SKIPPED: {TEST}: {why}");
}

/// The engine host's `[storage.mooncake]` settings as TSL3_* overrides, from the variables
/// deploy/mooncake/env.sh exports; None (skipped loudly) without a library or a master.
fn mooncake_env() -> Option<Vec<(String, String)>> {
    let lib = std::env::var(env::MOONCAKE_STORE_LIBRARY).unwrap_or_default();
    let master = std::env::var(env::MOONCAKE_MASTER).unwrap_or_default();
    if lib.is_empty() || master.is_empty() {
        skip(&format!(
            "${} or ${} unset (run deploy/mooncake/install.sh and start.sh, then source deploy/mooncake/env.sh)",
            env::MOONCAKE_STORE_LIBRARY,
            env::MOONCAKE_MASTER
        ));
        return None;
    }
    if !std::path::Path::new(&lib).exists() {
        skip(&format!("the library {lib} does not exist"));
        return None;
    }
    // A quick probe: a client setup against a dead master retries for ~90 s.
    let listening = master
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    if !listening {
        skip(&format!("no Mooncake master listening on {master}"));
        return None;
    }
    let metadata = std::env::var(env::MOONCAKE_METADATA_SERVER)
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "P2PHANDSHAKE".into());
    let p = "TSL3_STORAGE__MOONCAKE__";
    Some(
        [
            ("LIBRARY_PATH", lib),
            ("MASTER_SERVER_ADDR", master),
            ("METADATA_SERVER", metadata),
            ("LOCAL_HOSTNAME", "127.0.0.1".into()),
            ("PROTOCOL", "tcp".into()),
            ("GLOBAL_SEGMENT_SIZE", "0".into()),
            ("LOCAL_BUFFER_SIZE", "0".into()),
            ("TENANT_ID", "default".into()),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{p}{k}"), v))
        .chain([("MC_TCP_BIND_ADDRESS".to_string(), "127.0.0.1".to_string())])
        .collect(),
    )
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
