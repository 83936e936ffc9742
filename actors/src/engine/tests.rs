//! Serving through RankEngine in one process: the read and write transactions end to end on
//! a real executor and MemoryStore, compared with recomputation.

use super::factory::{build_rank, RankSpec};
use super::{agree_single, RankEngine};
use crate::clock::SystemClock;
use crate::frontend::FallbackReason;
use crate::l3::store::memory::MemoryStore;
use crate::l3::store::Store;
use crate::model::SyntheticModel;
use crate::scheduler::request::PrefixSplit;
use crate::scheduler::RequestEvent;
use messages::RequestId;
use std::sync::Arc;

fn spec(storage_on: bool) -> RankSpec {
    RankSpec::small(storage_on)
}

fn engine(store: Option<Arc<MemoryStore>>) -> RankEngine {
    engine_with(store.map(|s| s as Arc<dyn Store>), |_| {})
}

pub(super) fn engine_with(
    store: Option<Arc<dyn Store>>,
    tune: impl FnOnce(&mut RankSpec),
) -> RankEngine {
    engine_clocked(store, tune, SystemClock::shared())
}

fn engine_clocked(
    store: Option<Arc<dyn Store>>,
    tune: impl FnOnce(&mut RankSpec),
    clock: crate::clock::SharedClock,
) -> RankEngine {
    let mut sp = spec(store.is_some());
    tune(&mut sp);
    build_rank(&sp, clock, move |_| {
        store.ok_or_else(|| "storage on".to_string())
    })
    .unwrap()
}

pub(super) struct Outcome {
    pub tokens: Vec<u32>,
    pub split: PrefixSplit,
    pub fallback: FallbackReason,
}

/// Serves one request to completion (a world of one; rounds until it finishes), then
/// keeps rounding until the executor is idle so backups have retired. The wait is bounded
/// by wall time, not by a count of rounds: a backup waiting out a capacity backoff (100 ms
/// on the system clock) is still queued when a fast build has run thousands of rounds.
pub(super) fn serve(e: &mut RankEngine, id: u64, prompt: &[u32], max_tokens: u32) -> Outcome {
    let out = serve_until(e, id, prompt, max_tokens, |_, _| {});
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < give_up {
        let idle = e.executor().is_none_or(|x| {
            x.stats()
                .jobs
                .iter()
                .all(|j| j.queued + j.running + j.undelivered == 0)
        }) && e.stm().is_none_or(|s| {
            s.stats().outstanding_tickets == 0 && s.stats().queued_backup_candidates == 0
        });
        if idle {
            break;
        }
        let agreed = agree_single(e.head_now(), vec![], vec![]).unwrap();
        e.run_round_now(agreed).unwrap();
        e.drain_events();
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    out
}

/// Serves while `during` runs between rounds (for releasing gates), like `serve`.
fn serve_until(
    e: &mut RankEngine,
    id: u64,
    prompt: &[u32],
    max_tokens: u32,
    mut during: impl FnMut(&RankEngine, u64),
) -> Outcome {
    let mut tokens = vec![];
    let mut done = None;
    let mut first = Some((RequestId(id), prompt.to_vec(), max_tokens));
    for round in 0..200_000u64 {
        let report = e.head_now();
        let agreed = agree_single(report, first.take().into_iter().collect(), vec![]).unwrap();
        e.run_round_now(agreed).unwrap();
        for ev in e.drain_events() {
            match ev {
                RequestEvent::Token(r, t, _) if r.0 == id => tokens.push(t),
                RequestEvent::Finished {
                    id: r,
                    split,
                    fallback,
                } if r.0 == id => done = Some((split, fallback)),
                RequestEvent::Aborted(r, why) if r.0 == id => panic!("aborted: {why}"),
                _ => {}
            }
        }
        if done.is_some() {
            break;
        }
        during(e, round);
        std::thread::yield_now();
    }
    let (split, fallback) = done.expect("request finished");
    Outcome {
        tokens,
        split,
        fallback,
    }
}

pub(super) fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 31 + salt * 7) % 997).collect()
}

#[test]
fn storage_disabled_output_equals_recomputation() {
    let mut e = engine(None);
    let p = prompt(37, 1);
    let out = serve(&mut e, 1, &p, 5);
    let model = SyntheticModel::by_name("tiny").unwrap();
    assert_eq!(out.tokens, model.recompute_output(&p, 5).unwrap());
    assert_eq!(out.fallback, FallbackReason::Disabled);
    assert_eq!(out.split.computed, 37);
    // The same prompt again hits the Device cache (storage still disabled).
    let again = serve(&mut e, 2, &p, 5);
    assert_eq!(again.tokens, out.tokens);
    assert_eq!(
        again.split.device, 36,
        "every aligned block but the last token"
    );
    assert_eq!(again.split.computed, 1);
}

#[test]
fn a_fresh_engine_restores_the_prefix_from_l3_with_identical_output() {
    let store = Arc::new(MemoryStore::new());
    let p = prompt(41, 2);
    let model = SyntheticModel::by_name("tiny").unwrap();
    let want = model.recompute_output(&p, 4).unwrap();
    let mut writer = engine(Some(store.clone()));
    let w = serve(&mut writer, 1, &p, 4);
    assert_eq!(w.tokens, want);
    assert_eq!(w.fallback, FallbackReason::Miss);
    assert!(
        store.len() >= 10,
        "the writer backed its blocks up: {}",
        store.len()
    );
    drop(writer);
    // A fresh engine (empty Device and Host caches) shares only the store.
    let mut reader = engine(Some(store.clone()));
    let r = serve(&mut reader, 7, &p, 4);
    assert_eq!(r.tokens, want, "restored output equals recomputation");
    assert_eq!(
        r.split.l3, 40,
        "every aligned block below the last token came from L3"
    );
    assert_eq!(r.split.computed, 1);
    assert_eq!(r.fallback, FallbackReason::None);
}

#[test]
fn a_partial_hit_and_a_miss_report_their_fallback() {
    let store = Arc::new(MemoryStore::new());
    let base = prompt(24, 3);
    let mut writer = engine(Some(store.clone()));
    serve(&mut writer, 1, &base, 1);
    drop(writer);
    let mut reader = engine(Some(store.clone()));
    // Shares 24 tokens (6 blocks) with the written prompt, then differs.
    let mut longer = base.clone();
    longer.extend(prompt(16, 9));
    let model = SyntheticModel::by_name("tiny").unwrap();
    let r = serve(&mut reader, 2, &longer, 3);
    assert_eq!(r.tokens, model.recompute_output(&longer, 3).unwrap());
    assert_eq!(r.split.l3, 24);
    assert_eq!(r.fallback, FallbackReason::Partial);
    let fresh = prompt(30, 77);
    let m = serve(&mut reader, 3, &fresh, 2);
    assert_eq!(m.split.l3, 0);
    assert_eq!(m.fallback, FallbackReason::Miss);
    assert_eq!(m.tokens, model.recompute_output(&fresh, 2).unwrap());
}

#[test]
fn deleted_objects_are_safely_retired_misses() {
    let store = Arc::new(MemoryStore::new());
    let p = prompt(20, 4);
    let mut writer = engine(Some(store.clone()));
    let w = serve(&mut writer, 1, &p, 2);
    drop(writer);
    // Delete the namespace: a fresh reader misses safely and recomputes the same output.
    let ns = engine(Some(store.clone())).scheduler().namespace().clone();
    let removed = store.remove_namespace(&ns).unwrap();
    assert!(removed > 0);
    let mut reader = engine(Some(store.clone()));
    let r = serve(&mut reader, 2, &p, 2);
    assert_eq!(r.tokens, w.tokens);
    assert_eq!(r.split.l3, 0, "deleted objects are safely retired misses");
}

#[test]
fn two_engines_fed_the_same_trace_make_the_same_decisions() {
    let run = || {
        let store = Arc::new(MemoryStore::new());
        let mut e = engine(Some(store));
        let mut log = vec![];
        for (i, n) in [13u32, 29, 13, 40].iter().enumerate() {
            let o = serve(&mut e, i as u64 + 1, &prompt(*n, 5), 3);
            log.push((o.tokens, o.split, o.fallback));
        }
        log
    };
    assert_eq!(run(), run());
}

use crate::l3::store::faulty::{Call, Fault, FaultyStore, Gate};

fn recompute(p: &[u32], n: usize) -> Vec<u32> {
    SyntheticModel::by_name("tiny")
        .unwrap()
        .recompute_output(p, n)
        .unwrap()
}

#[test]
fn a_soft_deadline_ends_the_wait_and_local_admission_gives_the_right_answer() {
    let p = prompt(32, 11);
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), true));
    let gate = Gate::new();
    faulty.inject(Call::Query, Some(1), Fault::Gate(gate.clone()));
    let clock = crate::clock::ManualClock::new(0);
    let mut e = engine_clocked(
        Some(faulty.clone() as Arc<dyn Store>),
        |s| {
            if let Some((c, _)) = s.storage.as_mut() {
                c.soft_deadline_ms = 5;
            }
        },
        clock.clone(),
    );
    // The QUERY is held at the gate while the injected clock (the agreed tick) advances.
    let out = serve_until(&mut e, 2, &p, 2, |_, _| clock.advance_ms(1));
    gate.release();
    assert_eq!(out.fallback, FallbackReason::Deadline);
    assert_eq!(out.split.l3, 0);
    assert_eq!(out.tokens, recompute(&p, 2));
    assert_eq!(e.stm().unwrap().stats().soft_timeouts, 1);
}

#[test]
fn a_closed_pressure_gate_bypasses_l3() {
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), true));
    let gate = Gate::new();
    // The first request's QUERY is held in the executor: one job stays queued or running,
    // which reaches the high watermark, so the gate closes and the QUERY wait detaches.
    faulty.inject(Call::Query, Some(1), Fault::Gate(gate.clone()));
    let mut e = engine_with(Some(faulty.clone() as Arc<dyn Store>), |s| {
        if let Some((c, _)) = s.storage.as_mut() {
            c.pressure_high.queued_jobs = 1;
            c.pressure_low.queued_jobs = 0;
        }
    });
    let a = prompt(20, 12);
    let out = serve_until(&mut e, 1, &a, 1, |_, _| {});
    assert_eq!(
        out.fallback,
        FallbackReason::Pressure,
        "the QUERY wait detached"
    );
    assert_eq!(out.tokens, recompute(&a, 1));
    // While the gate stays closed, a new request bypasses L3.
    let b = prompt(28, 13);
    let out = serve_until(&mut e, 2, &b, 2, |_, _| {});
    assert_eq!(out.fallback, FallbackReason::Pressure);
    assert_eq!(out.tokens, recompute(&b, 2));
    let st = e.stm().unwrap().stats();
    assert!(st.gate_closed);
    assert!(st.pressure_bypasses >= 2, "{st:?}");
    gate.release();
}

#[test]
fn backend_outage_and_quarantine_are_reported_and_serving_continues() {
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), false));
    faulty.inject(Call::Query, Some(1), Fault::Error("backend down".into()));
    let mut e = engine_with(Some(faulty.clone() as Arc<dyn Store>), |_| {});
    let p = prompt(24, 14);
    let out = serve_until(&mut e, 1, &p, 2, |_, _| {});
    assert_eq!(
        out.fallback,
        FallbackReason::Unhealthy,
        "an exception is an outage"
    );
    assert_eq!(out.tokens, recompute(&p, 2));
    // During the cooldown the executor rejects work: the next read is unhealthy too.
    let q = prompt(24, 15);
    let out = serve_until(&mut e, 2, &q, 1, |_, _| {});
    assert_eq!(out.fallback, FallbackReason::Unhealthy);

    // A store whose GET fails without proving retirement quarantines the replica.
    let r = prompt(28, 16);
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), false));
    let mut e = engine_with(Some(faulty.clone() as Arc<dyn Store>), |_| {});
    // Seed the faulty store's inner store with the written objects via a second engine.
    let mut seed = engine_with(Some(faulty.clone() as Arc<dyn Store>), |_| {});
    serve(&mut seed, 1, &r, 1);
    drop(seed);
    faulty.inject(Call::Get, Some(1), Fault::Unretired);
    let out = serve_until(&mut e, 3, &r, 2, |_, _| {});
    assert_eq!(out.fallback, FallbackReason::Quarantine);
    assert_eq!(out.tokens, recompute(&r, 2));
    assert!(
        !e.scheduler().l3_enabled(),
        "new L3 work stops for the replica"
    );
    let later = serve_until(&mut e, 4, &prompt(16, 17), 1, |_, _| {});
    assert_eq!(later.fallback, FallbackReason::Quarantine);
    assert!(e.stm().unwrap().stats().quarantined_refs > 0);
}

#[test]
fn a_sliding_window_profile_restores_only_what_it_needs_and_matches_recomputation() {
    let store = Arc::new(MemoryStore::new());
    let p = prompt(45, 18);
    let model = SyntheticModel::by_name("hybrid-swa").unwrap();
    let want = model.recompute_output(&p, 3).unwrap();
    let swa = |s: &mut RankSpec| s.profile = "hybrid-swa".into();
    let mut w = engine_with(Some(store.clone() as Arc<dyn Store>), swa);
    let a = serve(&mut w, 1, &p, 3);
    assert_eq!(a.tokens, want);
    drop(w);
    let mut r = engine_with(Some(store.clone() as Arc<dyn Store>), swa);
    let b = serve(&mut r, 2, &p, 3);
    assert_eq!(
        b.tokens, want,
        "mixed Full + SWA groups restore to the recomputed answer"
    );
    assert!(b.split.l3 > 0, "{:?}", b.split);
}

#[test]
fn a_recurrent_state_profile_restores_checkpoints_and_matches_recomputation() {
    let store = Arc::new(MemoryStore::new());
    let p = prompt(43, 19);
    let model = SyntheticModel::by_name("hybrid-state").unwrap();
    let want = model.recompute_output(&p, 3).unwrap();
    let st = |s: &mut RankSpec| s.profile = "hybrid-state".into();
    let mut w = engine_with(Some(store.clone() as Arc<dyn Store>), st);
    assert_eq!(serve(&mut w, 1, &p, 3).tokens, want);
    drop(w);
    let mut r = engine_with(Some(store.clone() as Arc<dyn Store>), st);
    let b = serve(&mut r, 2, &p, 3);
    assert_eq!(
        b.tokens, want,
        "Full history + a State checkpoint restore to the recomputed answer"
    );
    assert_eq!(
        b.split.l3, 40,
        "the boundary is the last checkpoint below the bound"
    );
}

#[test]
fn a_clear_with_a_backup_in_flight_proceeds_and_frees_the_source_at_retirement() {
    use crate::scheduler::AdminCommand;
    use crate::storage_transfer::ClearKind;
    let p = prompt(40, 13);
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), true));
    let gate = Gate::new();
    faulty.inject(Call::Put, Some(1), Fault::Gate(gate.clone()));
    let mut e = engine_with(Some(faulty.clone() as Arc<dyn Store>), |_| {});
    let first = serve_until(&mut e, 1, &p, 2, |_, _| {});
    assert_eq!(first.tokens, recompute(&p, 2));
    // Round until the first backup PUT is held at the store.
    for _ in 0..100_000 {
        if gate.entered() >= 1 {
            break;
        }
        let agreed = agree_single(e.head_now(), vec![], vec![]).unwrap();
        e.run_round_now(agreed).unwrap();
        std::thread::yield_now();
    }
    assert!(gate.entered() >= 1, "a PUT is in flight");
    // The round's work tells the event loop (idle pause, the reset's idle wait) that
    // storage is not idle while the PUT is held.
    let agreed = agree_single(e.head_now(), vec![], vec![]).unwrap();
    let work = e.run_round_now(agreed).unwrap();
    assert!(work.storage_pending && !work.storage_idle(), "{work:?}");
    let capacity: u64 = e
        .scheduler()
        .layout()
        .host_blocks
        .iter()
        .map(|b| *b as u64)
        .sum();
    let groups = e.scheduler().layout().host_blocks.len() as u32;
    let available = |e: &RankEngine| -> u64 {
        (0..groups)
            .map(|g| e.scheduler().cache().host().available(g))
            .sum()
    };
    e.scheduler_mut().admin(AdminCommand::ClearCache);
    assert!(e.scheduler().quiescent());
    e.apply_admin_now(ClearKind::FullClear, Some(Ok(())), None)
        .expect("a clear does not wait for in-flight I/O");
    assert!(
        available(&e) < capacity,
        "the in-flight PUT's source block stays allocated"
    );
    gate.release();
    for _ in 0..100_000 {
        let idle = e.stm().unwrap().stats().outstanding_tickets == 0;
        if idle {
            break;
        }
        let agreed = agree_single(e.head_now(), vec![], vec![]).unwrap();
        e.run_round_now(agreed).unwrap();
        std::thread::yield_now();
    }
    assert_eq!(e.stm().unwrap().stats().outstanding_tickets, 0);
    assert_eq!(available(&e), capacity, "retirement freed the source");
    let agreed = agree_single(e.head_now(), vec![], vec![]).unwrap();
    let work = e.run_round_now(agreed).unwrap();
    assert!(!work.storage_pending, "{work:?}");
    // Local caches are empty after the clear: the prompt is served without local hits.
    let again = serve(&mut e, 2, &p, 2);
    assert_eq!(
        again.split.device + again.split.host,
        0,
        "{:?}",
        again.split
    );
    assert_eq!(again.tokens, first.tokens);
    e.close_now();
}

#[test]
fn a_failed_preflight_refuses_the_clear_keeps_the_cache_and_resumes_work() {
    use crate::scheduler::AdminCommand;
    use crate::storage_transfer::ClearKind;
    let store = Arc::new(MemoryStore::new());
    let mut e = engine(Some(store));
    let p = prompt(40, 17);
    let first = serve(&mut e, 1, &p, 2);
    e.scheduler_mut().admin(AdminCommand::ClearCache);
    assert!(e.scheduler().quiescent());
    let refused = e.apply_admin_now(
        ClearKind::FullClear,
        Some(Err("rank 1: store unreachable".into())),
        None,
    );
    assert!(
        matches!(refused, Err(super::AdminError::Refused(_))),
        "{refused:?}"
    );
    assert_eq!(
        refused.unwrap_err().to_string(),
        "remote namespace deletion failed (rank 1: store unreachable); the local cache is not cleared"
    );
    assert_eq!(
        e.scheduler().admin_pending(),
        None,
        "the command is dropped"
    );
    // Nothing was cleared: the same prompt hits the Device cache, and new work runs.
    let again = serve(&mut e, 2, &p, 2);
    assert!(again.split.device > 0, "{:?}", again.split);
    assert_eq!(again.tokens, first.tokens);
    e.close_now();
}

#[test]
fn a_capacity_rejected_backup_is_offered_again_and_lands() {
    let p = prompt(40, 19);
    let faulty = Arc::new(FaultyStore::new(MemoryStore::new(), true));
    faulty.inject(Call::Put, Some(1), Fault::Capacity);
    let mut e = engine_with(Some(faulty.clone() as Arc<dyn Store>), |_| {});
    let first = serve(&mut e, 1, &p, 2);
    let st = e.stm().unwrap().stats();
    assert_eq!(
        st.dropped(crate::storage_transfer::DropReason::Unavailable),
        0,
        "the re-offered page was still resident: it must not be dropped as unavailable"
    );
    // A fresh rank on the same store restores the whole prefix from L3: the rejected
    // page was backed up on its second offer.
    let mut reader = engine_with(Some(faulty.clone() as Arc<dyn Store>), |_| {});
    let again = serve(&mut reader, 1, &p, 2);
    assert!(again.split.l3 > 0, "{:?}", again.split);
    assert_eq!(
        again.fallback,
        FallbackReason::None,
        "every page of the prefix is in L3: {:?}",
        again.split
    );
    assert_eq!(again.tokens, first.tokens);
    e.close_now();
    reader.close_now();
}

#[test]
fn a_longer_prompt_reuses_the_aligned_prefix_of_a_shorter_one() {
    for profile in ["tiny", "hybrid-swa", "hybrid-state"] {
        let mut e = engine_with(None, |s| s.profile = profile.into());
        let model = SyntheticModel::by_name(profile).unwrap();
        let parent = model
            .profile()
            .groups
            .iter()
            .map(|g| g.block_tokens as u32)
            .max()
            .unwrap();
        // A prompt ending mid-block, then a longer prompt extending it: the aligned blocks
        // below the first prompt's partial block are reused on every profile.
        let short = prompt(3 * parent + parent / 2, 23);
        let mut long = short.clone();
        long.extend(prompt(2 * parent, 29));
        let first = serve(&mut e, 1, &short, 2);
        assert_eq!(first.tokens, model.recompute_output(&short, 2).unwrap());
        let out = serve(&mut e, 2, &long, 2);
        assert_eq!(
            out.tokens,
            model.recompute_output(&long, 2).unwrap(),
            "{profile}"
        );
        assert!(
            out.split.device + out.split.host >= 2 * parent,
            "{profile}: the aligned prefix is reused: {:?}",
            out.split
        );
        e.close_now();
    }
}

/// The poisoned-memory checker is live in test builds: Host blocks evicted by a small Host
/// pool are poisoned at once (the pool's free hook), and serving through evictions, L3
/// restores and backups never reads poison (an H2D, PUT or GET over poison fails the round
/// or aborts) and still matches recomputation.
#[test]
fn serving_through_host_evictions_never_reads_a_poisoned_block() {
    if !crate::host::poison::enabled() {
        return; // release builds carry no checker
    }
    let store = Arc::new(MemoryStore::new());
    let model = SyntheticModel::by_name("tiny").unwrap();
    let small = |s: &mut RankSpec| {
        s.host_blocks = 48;
        s.device_blocks = 24;
    };
    let prompts: Vec<Vec<u32>> = (0..10).map(|i| prompt(41, 30 + i)).collect();
    let before = crate::host::poison::filled();
    let mut writer = engine_with(Some(store.clone() as Arc<dyn Store>), small);
    for (i, p) in prompts.iter().enumerate() {
        let o = serve(&mut writer, i as u64 + 1, p, 3);
        assert_eq!(o.tokens, model.recompute_output(p, 3).unwrap());
    }
    assert!(
        crate::host::poison::filled() > before,
        "the Host pool evicted, and poisoned, blocks"
    );
    drop(writer);
    // A fresh engine restores through the same small pool: GETs land in reused (poisoned)
    // slots, H2D reads them only once published.
    let mut reader = engine_with(Some(store as Arc<dyn Store>), small);
    for (i, p) in prompts.iter().enumerate().rev() {
        let o = serve(&mut reader, 100 + i as u64, p, 3);
        assert_eq!(
            o.tokens,
            model.recompute_output(p, 3).unwrap(),
            "prompt {i}"
        );
        assert!(
            o.split.l3 + o.split.host + o.split.device > 0,
            "prompt {i} reused KV"
        );
    }
}
