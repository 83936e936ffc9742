//! Serving tests with real engine-host processes, real HTTP and real files for the L3 tier:
//! fresh processes with empty local caches share L3 through the embedded local store, and
//! their outputs are compared with a recomputation run (storage disabled).

mod common;

use common::{http, tokens, Host};

fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 13 + salt * 101) % 997).collect()
}

fn recompute(p: &[u32], max_tokens: u32) -> Vec<u64> {
    let h = Host::start(&["serve", "--store", "none"], &[]);
    let v = h.complete(p, max_tokens);
    assert_eq!(v["tsl3"]["fallback_reason"], "disabled");
    assert_eq!(v["tsl3"]["l3"], 0);
    tokens(&v)
}

#[test]
fn two_fresh_engine_hosts_share_l3_through_the_local_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let p = prompt(64, 1);
    let want = recompute(&p, 6);

    let first = Host::start(&["serve", "--store", "local", "--store-dir", d], &[]);
    let a = first.complete(&p, 6);
    assert_eq!(tokens(&a), want, "a computed answer equals recomputation");
    assert_eq!(a["tsl3"]["l3"], 0);
    assert_eq!(a["tsl3"]["fallback_reason"], "miss");
    // Let the backups retire before the process exits.
    first.wait_backups_settled();
    assert!(
        first.stop().success(),
        "SIGTERM ends the engine host cleanly"
    );

    let second = Host::start(&["serve", "--store", "local", "--store-dir", d], &[]);
    let b = second.complete(&p, 6);
    assert_eq!(
        tokens(&b),
        want,
        "the restored prefix gives the recomputed answer"
    );
    assert_eq!(
        b["tsl3"]["l3"], 60,
        "every aligned block below the last token from L3"
    );
    assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 60);
    assert_eq!(b["tsl3"]["computed"], 4);
    assert_eq!(b["tsl3"]["fallback_reason"], "none");

    // A prompt sharing a prefix then diverging: a partial hit, still the right answer.
    let mut q = p[..32].to_vec();
    q.extend(prompt(20, 9));
    let c = second.complete(&q, 3);
    assert_eq!(
        c["tsl3"]["device"], 32,
        "the shared prefix is now on this host's Device"
    );
    assert_eq!(tokens(&c), recompute(&q, 3));
    // A miss: nothing shared.
    let m = second.complete(&prompt(40, 55), 2);
    assert_eq!(m["tsl3"]["fallback_reason"], "miss");
    assert_eq!(m["tsl3"]["l3"], 0);
    assert!(second.stop().success());
}

#[test]
fn a_partial_l3_hit_reports_partial() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let base = prompt(32, 2);
    let writer = Host::start(&["serve", "--store", "local", "--store-dir", d], &[]);
    writer.complete(&base, 1);
    writer.wait_backups_settled();
    assert!(writer.stop().success());
    let reader = Host::start(&["serve", "--store", "local", "--store-dir", d], &[]);
    let mut longer = base.clone();
    longer.extend(prompt(24, 3));
    let v = reader.complete(&longer, 2);
    assert_eq!(v["tsl3"]["l3"], 32);
    assert_eq!(v["tsl3"]["fallback_reason"], "partial");
    assert_eq!(tokens(&v), recompute(&longer, 2));
}

#[test]
fn bad_requests_get_4xx_and_admin_needs_its_token() {
    let h = Host::start(
        &["serve", "--store", "memory"],
        &[("TSL3_SERVER__ADMIN_TOKEN", "t0ken")],
    );
    let (code, body) = http(&h.addr, "POST", "/v1/completions", "{nope", None);
    assert_eq!(code, 400, "{body}");
    let (code, _) = http(&h.addr, "POST", "/v1/completions", r#"{"prompt":""}"#, None);
    assert_eq!(code, 400);
    let (code, _) = http(&h.addr, "POST", "/admin/clear_cache", "", None);
    assert_eq!(code, 401);
    let p = prompt(24, 4);
    h.complete(&p, 1);
    let again = h.complete(&p, 1);
    assert_eq!(again["tsl3"]["device"], 20);
    let (code, body) = http(&h.addr, "POST", "/admin/clear_cache", "", Some("t0ken"));
    assert_eq!(code, 200, "{body}");
    let cleared = h.complete(&p, 1);
    assert_eq!(
        cleared["tsl3"]["device"], 0,
        "the clear dropped the Device cache"
    );
    let (code, body) = http(
        &h.addr,
        "POST",
        "/admin/weight_version",
        r#"{"target": 2}"#,
        Some("t0ken"),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("namespace"), "{body}");
    let (code, metrics) = http(&h.addr, "GET", "/metrics", "", None);
    assert_eq!(code, 200);
    assert!(metrics.contains("tsl3_requests_total"), "{metrics}");
}

#[test]
fn launch_tp2_matches_single_rank_recomputation() {
    let p = prompt(48, 7);
    let want = recompute(&p, 4);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let h = Host::start(
        &["launch", "--tp", "2", "--store", "local", "--store-dir", d],
        &[("TSL3_SERVER__ADMIN_TOKEN", "t0ken")],
    );
    let v = h.complete(&p, 4);
    assert_eq!(
        tokens(&v),
        want,
        "TP=2 output equals the single-rank recomputation"
    );
    // A clear is agreed across both ranks: each deletes the namespace in the shared store
    // (the preflight), the agreed result clears both ranks' caches alike.
    let (code, body) = http(&h.addr, "POST", "/admin/clear_cache", "", Some("t0ken"));
    assert_eq!(code, 200, "{body}");
    let again = h.complete(&p, 4);
    assert_eq!(tokens(&again), want);
    assert_eq!(
        (
            again["tsl3"]["device"].as_u64(),
            again["tsl3"]["host"].as_u64()
        ),
        (Some(0), Some(0)),
        "both ranks cleared their caches: {again}"
    );
    assert!(
        h.stop().success(),
        "launch forwards SIGTERM and every rank exits cleanly"
    );
}

#[test]
fn launch_tp4_and_tp8_rank_processes_match_single_rank_recomputation() {
    // 8 KV heads split over 4 and 8 rank processes; small pools keep 8 processes light.
    let envs = [
        ("TSL3_MODEL__DEVICE_BLOCKS", "32"),
        ("TSL3_MODEL__MAX_RUNNING", "2"),
    ];
    let profile = ["--model-profile", "llama-8b-like"];
    let p = prompt(40, 8);
    let want = {
        let h = Host::start(
            &[&["serve", "--store", "none"][..], &profile[..]].concat(),
            &envs,
        );
        let v = h.complete(&p, 3);
        assert_eq!(v["tsl3"]["fallback_reason"], "disabled");
        tokens(&v)
    };
    for tp in ["4", "8"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let args = [
            &["launch", "--tp", tp, "--store", "local", "--store-dir", d][..],
            &profile[..],
        ]
        .concat();
        let h = Host::start(&args, &envs);
        let v = h.complete(&p, 3);
        assert_eq!(
            tokens(&v),
            want,
            "TP={tp} output equals the single-rank recomputation"
        );
        // The same prompt again is a Device hit on every rank (the decision is agreed).
        let again = h.complete(&p, 3);
        assert_eq!(tokens(&again), want);
        assert_eq!(again["tsl3"]["device"], 32, "TP={tp}: {again}");
        assert!(h.stop().success(), "TP={tp}: every rank exits cleanly");
    }
}

fn recompute_on(profile: &str, p: &[u32], max_tokens: u32) -> Vec<u64> {
    let h = Host::start(
        &["serve", "--store", "none", "--model-profile", profile],
        &[],
    );
    tokens(&h.complete(p, max_tokens))
}

/// Tails through real processes: turn 1 ends mid parent block; a fresh process serves turn
/// 2 (one more token, so its exact request bound is turn 1's end) with turn 1's whole
/// prompt from L3 — on hybrid-state that needs the State checkpoint taken exactly at turn
/// 1's end, on hybrid-swa the partial window block — and computes only the new token; a
/// longer turn 3 then finds the tail through the hint the GET recorded; a cold process
/// cannot find the older tail in a longer prompt and restores the aligned boundary below.
#[test]
fn a_fresh_process_restores_the_previous_turns_nonaligned_end_on_hybrid_profiles() {
    for (profile, aligned) in [("hybrid-state", 40), ("hybrid-swa", 44)] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let args = [
            "serve",
            "--model-profile",
            profile,
            "--store",
            "local",
            "--store-dir",
            d,
        ];
        let turn1 = prompt(45, 3);
        let mut turn2 = turn1.clone();
        turn2.push(7);
        let mut turn3 = turn1.clone();
        turn3.extend(prompt(21, 5));
        let mut other = turn1.clone();
        other.extend(prompt(19, 6));

        let first = Host::start(&args, &[]);
        let a = first.complete(&turn1, 4);
        assert_eq!(tokens(&a), recompute_on(profile, &turn1, 4), "{profile}");
        first.wait_backups_settled();
        assert!(first.stop().success());

        let second = Host::start(&args, &[]);
        let b = second.complete(&turn2, 4);
        assert_eq!(tokens(&b), recompute_on(profile, &turn2, 4), "{profile}");
        assert_eq!(
            b["tsl3"]["l3"], 45,
            "{profile}: turn 1's whole prompt from L3"
        );
        assert_eq!(b["tsl3"]["computed"], 1, "{profile}: only the new token");
        assert_eq!(
            second.metric("tsl3_tail_tokens_reused_total", &["tier=\"l3\""]),
            (45 - aligned) as f64,
            "{profile}"
        );
        let c = second.complete(&turn3, 4);
        assert_eq!(tokens(&c), recompute_on(profile, &turn3, 4), "{profile}");
        assert_eq!(
            c["tsl3"]["device"], 45,
            "{profile}: the tail through its hint"
        );
        second.wait_backups_settled();
        assert!(second.stop().success());

        let cold = Host::start(&args, &[]);
        let e = cold.complete(&other, 4);
        assert_eq!(tokens(&e), recompute_on(profile, &other, 4), "{profile}");
        assert_eq!(
            e["tsl3"]["l3"], aligned,
            "{profile}: no hint, no older tail: the aligned boundary below it"
        );
        assert!(cold.stop().success());
    }
}
