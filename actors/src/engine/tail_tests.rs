//! Tails end to end through RankEngine on a real executor and MemoryStore, on every synthetic
//! profile (Full history; Full + sliding window; Full + State checkpoints): a prompt's
//! nonaligned end is written like any block (its partial history blocks, the SWA lookback
//! and the State checkpoint taken exactly there), discovered through the exact request
//! bound or a local hint, restored with copy-on-write, and the output always equals
//! recomputation.

use super::factory::RankSpec;
use super::tests::{engine_with, prompt, serve};
use super::RankEngine;
use crate::cache::keys::page_key;
use crate::cache::BlockAddr;
use crate::l3::store::memory::MemoryStore;
use crate::l3::store::Store;
use crate::model::SyntheticModel;
use crate::scheduler::AdminCommand;
use crate::storage_transfer::ClearKind;
use std::sync::Arc;

const PROFILES: [&str; 3] = ["tiny", "hybrid-swa", "hybrid-state"];

fn model(profile: &str) -> SyntheticModel {
    SyntheticModel::by_name(profile).unwrap()
}

/// The LCM parent block of a profile (every group's block size divides it).
fn parent(profile: &str) -> u32 {
    let m = model(profile);
    let sizes: Vec<u32> = m
        .profile()
        .groups
        .iter()
        .map(|g| g.block_tokens as u32)
        .collect();
    let lcm = sizes.iter().fold(1u32, |a, b| a / gcd(a, *b) * b);
    assert!(lcm > 2, "{profile}");
    lcm
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn engine(profile: &str, store: &Arc<MemoryStore>) -> RankEngine {
    let p = profile.to_string();
    engine_with(
        Some(store.clone() as Arc<dyn Store>),
        move |s: &mut RankSpec| s.profile = p,
    )
}

/// Turn 1 ends one token past the middle of a parent block: nonaligned for every group.
fn turn1(profile: &str) -> Vec<u32> {
    let l = parent(profile);
    prompt(3 * l + l / 2 + 1, 41)
}

fn extend(p: &[u32], n: u32, salt: u32) -> Vec<u32> {
    let mut v = p.to_vec();
    v.extend(prompt(n, salt));
    v
}

fn aligned(profile: &str, b: u32) -> u32 {
    b / parent(profile) * parent(profile)
}

/// The blocks only the tail at `boundary` needs (beyond the aligned boundary below it).
fn tail_blocks(e: &RankEngine, p: &[u32], boundary: u32, profile: &str) -> Vec<BlockAddr> {
    let c = e.scheduler().cache();
    let below = c.blocks_at(p, aligned(profile, boundary));
    c.blocks_at(p, boundary)
        .into_iter()
        .filter(|a| !below.contains(a))
        .collect()
}

fn tail_objects(e: &RankEngine, store: &MemoryStore, blocks: &[BlockAddr]) -> Vec<Vec<u8>> {
    let c = e.scheduler().cache();
    let mut out = vec![];
    for b in blocks {
        let pages = c.geometry().group(b.group as usize).pages_per_block;
        for page in 0..pages {
            let key = page_key(c.namespace(), c.geometry(), *b, page);
            let bytes = store.object(&key).expect("the tail object was written");
            out.push(bytes.to_vec());
        }
    }
    out
}

/// Turn 1 served (and backed up) by an engine on a fresh store, its output checked: the
/// model, the store, turn 1 and the engine.
fn after_turn1(profile: &str) -> (SyntheticModel, Arc<MemoryStore>, Vec<u32>, RankEngine) {
    let m = model(profile);
    let store = Arc::new(MemoryStore::new());
    let p1 = turn1(profile);
    let mut e = engine(profile, &store);
    let first = serve(&mut e, 1, &p1, 2);
    assert_eq!(
        first.tokens,
        m.recompute_output(&p1, 2).unwrap(),
        "{profile}"
    );
    (m, store, p1, e)
}

fn reset_local(e: &mut RankEngine) {
    e.scheduler_mut()
        .admin(AdminCommand::ResetLocal { host: true });
    e.apply_admin_now(ClearKind::LocalReset, Some(Ok(())), None)
        .unwrap();
}

#[test]
fn a_fresh_engine_restores_the_previous_prompt_end_from_l3_and_computes_only_the_new_token() {
    for profile in PROFILES {
        let (m, store, p1, writer) = after_turn1(profile);
        let n1 = p1.len() as u32;
        let groups: Vec<u32> = tail_blocks(&writer, &p1, n1, profile)
            .iter()
            .map(|a| a.group)
            .collect();
        for g in 0..m.profile().groups.len() as u32 {
            assert!(
                groups.contains(&g),
                "{profile}: group {g} has a block of the tail (partial history / checkpoint)"
            );
        }
        writer.close_now();

        // A fresh engine, no hint: the next turn's exact request bound is turn 1's end.
        let mut reader = engine(profile, &store);
        let p2 = extend(&p1, 1, 43);
        let out = serve(&mut reader, 2, &p2, 3);
        assert_eq!(out.tokens, m.recompute_output(&p2, 3).unwrap(), "{profile}");
        assert_eq!(
            (
                out.split.device,
                out.split.host,
                out.split.l3,
                out.split.computed
            ),
            (0, 0, n1, 1),
            "{profile}: the whole previous prompt from L3, only the new token computed"
        );
        let st = reader.scheduler().stats().clone();
        assert!(st.tail_candidates_queried >= 1, "{profile}");
        assert_eq!(
            st.tail_tokens_reused,
            [0, 0, (n1 - aligned(profile, n1)) as u64],
            "{profile}: the tokens above the aligned boundary came through the tail, from L3"
        );
        for g in reader.scheduler().cache().geometry().groups() {
            let kind = crate::scheduler::tail_kind(g.kind);
            assert!(st.tail_blocks_queried[kind] >= 1, "{profile} {}", g.name);
            assert!(st.tail_blocks_reused[kind] >= 1, "{profile} {}", g.name);
        }
        // The GET recorded a hint: a longer next turn finds the same tail (local now).
        let p3 = extend(&p1, 2 * parent(profile) + 3, 47);
        let out = serve(&mut reader, 3, &p3, 3);
        assert_eq!(out.tokens, m.recompute_output(&p3, 3).unwrap(), "{profile}");
        assert_eq!(
            out.split.device + out.split.host + out.split.l3,
            n1,
            "{profile}: {:?}",
            out.split
        );
        reader.close_now();
    }
}

#[test]
fn a_cold_engine_cannot_find_an_older_tail_in_a_longer_prompt_without_a_hint() {
    for profile in PROFILES {
        let (m, store, p1, writer) = after_turn1(profile);
        writer.close_now();
        let mut reader = engine(profile, &store);
        let p3 = extend(&p1, 2 * parent(profile) + 3, 53);
        let out = serve(&mut reader, 2, &p3, 2);
        assert_eq!(out.tokens, m.recompute_output(&p3, 2).unwrap(), "{profile}");
        assert_eq!(
            out.split.l3,
            aligned(profile, p1.len() as u32),
            "{profile}: only the aligned boundary below the older tail"
        );
        reader.close_now();
    }
}

#[test]
fn the_writer_restores_its_prompt_end_from_l3_through_its_own_hint_after_a_local_reset() {
    for profile in PROFILES {
        let (m, _store, p1, mut e) = after_turn1(profile);
        reset_local(&mut e);
        let p3 = extend(&p1, 2 * parent(profile) + 3, 59);
        let out = serve(&mut e, 2, &p3, 2);
        assert_eq!(out.tokens, m.recompute_output(&p3, 2).unwrap(), "{profile}");
        assert_eq!(
            (out.split.device, out.split.host, out.split.l3),
            (0, 0, p1.len() as u32),
            "{profile}: turn 1's end from L3 through the writer's hint"
        );
        e.close_now();
    }
}

#[test]
fn a_hint_alone_never_gives_a_hit() {
    for profile in PROFILES {
        let (m, store, p1, mut e) = after_turn1(profile);
        let n1 = p1.len() as u32;
        assert_eq!(e.scheduler().cache().tail_table().len(), 1, "{profile}");
        reset_local(&mut e);
        // The hint stays, its objects go.
        let c = e.scheduler().cache();
        let mut removed = 0;
        for b in tail_blocks(&e, &p1, n1, profile) {
            for page in 0..c.geometry().group(b.group as usize).pages_per_block {
                removed += store.remove(&page_key(c.namespace(), c.geometry(), b, page)) as u32;
            }
        }
        assert!(removed > 0, "{profile}");
        let p3 = extend(&p1, 2 * parent(profile) + 3, 61);
        let out = serve(&mut e, 2, &p3, 2);
        assert_eq!(out.tokens, m.recompute_output(&p3, 2).unwrap(), "{profile}");
        assert_eq!(
            out.split.l3,
            aligned(profile, n1),
            "{profile}: the hinted tail is gone, the aligned boundary below it is restored"
        );
        e.close_now();
    }
}

#[test]
fn copy_on_write_leaves_the_restored_tail_untouched_in_l3_and_on_the_device() {
    for profile in PROFILES {
        let (m, store, p1, writer) = after_turn1(profile);
        let n1 = p1.len() as u32;
        let blocks = tail_blocks(&writer, &p1, n1, profile);
        let before = tail_objects(&writer, &store, &blocks);
        writer.close_now();
        let mut reader = engine(profile, &store);
        // Turn 2 restores the tail and writes its own rows into the same block position.
        let p2 = extend(&p1, 1, 67);
        let out = serve(&mut reader, 2, &p2, 2);
        assert_eq!(out.split.l3, n1, "{profile}");
        assert_eq!(
            tail_objects(&reader, &store, &blocks),
            before,
            "{profile}: the stored tail is unchanged"
        );
        // Turn 2's own tail block starts with the copied rows: a continuation of turn 2
        // reads it (from the Device) and matches recomputation.
        let p2b = extend(&p2, 2 * parent(profile) + 1, 79);
        let out = serve(&mut reader, 4, &p2b, 2);
        assert_eq!(out.split.device, n1 + 1, "{profile}: {:?}", out.split);
        assert_eq!(
            out.tokens,
            m.recompute_output(&p2b, 2).unwrap(),
            "{profile}"
        );
        // Another continuation of turn 1 reads the restored tail from the Device: it must
        // still hold turn 1's rows only.
        let other = extend(&p1, 1, 71);
        assert_ne!(other, p2);
        let out = serve(&mut reader, 3, &other, 2);
        assert_eq!(out.split.device, n1, "{profile}: {:?}", out.split);
        assert_eq!(
            out.tokens,
            m.recompute_output(&other, 2).unwrap(),
            "{profile}"
        );
        reader.close_now();
    }
}

#[test]
fn with_tails_off_only_aligned_boundaries_are_reused() {
    for profile in PROFILES {
        let m = model(profile);
        let store = Arc::new(MemoryStore::new());
        let p1 = turn1(profile);
        let off = |s: &mut RankSpec| {
            s.profile = profile.to_string();
            s.tail_hints = 0;
        };
        let mut writer = engine_with(Some(store.clone() as Arc<dyn Store>), off);
        serve(&mut writer, 1, &p1, 2);
        writer.close_now();
        let mut reader = engine_with(Some(store.clone() as Arc<dyn Store>), off);
        let p2 = extend(&p1, 1, 73);
        let out = serve(&mut reader, 2, &p2, 2);
        assert_eq!(out.tokens, m.recompute_output(&p2, 2).unwrap(), "{profile}");
        assert_eq!(out.split.l3, aligned(profile, p1.len() as u32), "{profile}");
        reader.close_now();
    }
}
