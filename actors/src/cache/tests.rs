//! Scenario and property tests of the CacheCoordinator: mixed granularities, sliding
//! windows, sparse state, the Host-suffix rule, reservation shortening, eviction between
//! QUERY and reservation, tail hints, credit packing, determinism.

use super::coordinator::*;
use super::credits::QueryCredits;
use super::geometry::{CacheGeometry, GroupKind, GroupSpec};
use super::keys::{chain_hash, BlockAddr, ContentHash};
use super::matcher::BlockSlot;
use messages::{DeploymentIdentity, Namespace};
use std::collections::BTreeSet;

fn namespace(g: &CacheGeometry) -> Namespace {
    DeploymentIdentity {
        checkpoint: "synthetic/tiny@1".into(),
        target_weight_version: 1,
        draft_weight_version: None,
        layout_signature: g.layout_signature(),
        kvp: 1,
        qcp: 1,
        linear_attn_tp: 1,
        page_shard_counts: g.page_shard_counts(),
    }
    .namespace()
}

fn coord(groups: Vec<GroupSpec>, device: u32, host: u32) -> CacheCoordinator {
    let g = CacheGeometry::new(groups, 1, 0).unwrap();
    let n = g.group_count();
    let ns = namespace(&g);
    CacheCoordinator::new(
        g,
        ns,
        &CoordinatorConfig {
            device_blocks: vec![device; n],
            host_blocks: vec![host; n],
            tail_capacity: 16,
        },
    )
    .unwrap()
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| {
            i.wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97))
                % 50_000
        })
        .collect()
}

const ALL: QueryCredits = QueryCredits {
    keys: 1 << 20,
    host_blocks: 1 << 20,
};
const NO_LIMITS: QueryLimits = QueryLimits {
    lookahead_tokens: 0,
    min_extension_tokens: 1,
};

fn full(b: u32) -> GroupSpec {
    GroupSpec::full("attn", b, 1, 64)
}

/// The complete blocks of group `g` of `c` in token range [s, e) (both multiples).
fn group_blocks(c: &CacheCoordinator, p: &[u32], g: u32, upto: u32) -> Vec<BlockAddr> {
    c.computed_blocks(p, upto)
        .into_iter()
        .filter(|a| a.group == g)
        .collect()
}

fn all_hints(plan: &QueryPlan) -> ExistenceHints {
    plan.existence_hints(&vec![true; plan.rows.len()]).unwrap()
}

#[test]
fn mixed_block_granularities_match_at_lcm_parent_boundaries() {
    let mut c = coord(
        vec![
            GroupSpec::full("attn", 16, 1, 64),
            GroupSpec::sliding_window("swa", 64, 32, 1, 32),
            GroupSpec::state("ssm", 64, 48),
        ],
        0,
        1000,
    );
    assert_eq!(c.geometry().parent_tokens(), 64);
    let p = prompt(1, 300);
    let blocks = c.computed_blocks(&p, 256);
    // 16 Full blocks, 8 SWA blocks, 4 State checkpoints.
    assert_eq!(blocks.len(), 16 + 8 + 4);
    c.publish_d2h(&blocks).unwrap();
    assert_eq!(c.admission_match(&p, 256).boundary, 256);
    // A nonaligned bound without tail blocks falls to the aligned boundary below it.
    assert_eq!(c.admission_match(&p, 255).boundary, 192);
    // At 128: Full needs 8 blocks, SWA its window [64,128) = 2 blocks, State 1 checkpoint.
    assert_eq!(c.blocks_at(&p, 128).len(), 8 + 2 + 1);
    // Losing Full block 10 (tokens 160..176) shortens to 128.
    let f10 = group_blocks(&c, &p, 0, 256)[10];
    assert!(c.host_mut().evict(f10));
    let m = c.admission_match(&p, 256);
    assert_eq!((m.boundary, m.device_tokens, m.host_tokens), (128, 0, 128));
    assert_eq!(m.host_blocks.len(), 11);
    assert!(!m.copy_on_write);
}

#[test]
fn sliding_window_hit_needs_only_its_lookback() {
    let mut c = coord(
        vec![
            GroupSpec::sliding_window("swa", 32, 16, 1, 32),
            GroupSpec::state("ssm", 16, 8),
        ],
        0,
        1000,
    );
    let p = prompt(2, 200);
    c.publish_d2h(&c.computed_blocks(&p, 128)).unwrap();
    let swa = group_blocks(&c, &p, 0, 128);
    for b in &swa[..5] {
        assert!(c.host_mut().evict(*b));
    }
    assert_eq!(
        c.admission_match(&p, 128).boundary,
        128,
        "blocks below the window are not needed"
    );
    assert!(c.host_mut().evict(swa[7]));
    // 128 lost its window; 112 needs [80,112) = blocks 5 and 6, still held.
    assert_eq!(c.admission_match(&p, 128).boundary, 112);
}

#[test]
fn sparse_state_gives_the_boundary_with_a_checkpoint() {
    let mut c = coord(vec![full(16), GroupSpec::state("ssm", 16, 8)], 0, 1000);
    let p = prompt(3, 200);
    c.publish_d2h(&group_blocks(&c, &p, 0, 128)).unwrap();
    let state = group_blocks(&c, &p, 1, 128);
    c.publish_d2h(&[state[1], state[5]]).unwrap(); // checkpoints at 32 and 96
    assert_eq!(c.admission_match(&p, 128).boundary, 96);
    // The query asks only for checkpoints: Full history is local up to 128.
    let plan = c.plan_query(&p, 128, ALL, NO_LIMITS);
    assert_eq!(plan.local_tokens, 96);
    let asked: BTreeSet<BlockAddr> = plan.rows.iter().map(|r| r.block).collect();
    assert_eq!(asked, BTreeSet::from([state[6], state[7]]));
    assert_eq!(plan.keys.len(), 4, "two slots per checkpoint");
    let bs: Vec<u32> = plan.boundaries.iter().map(|b| b.boundary).collect();
    assert_eq!(bs, vec![128, 112]);
}

#[test]
fn device_prefix_host_suffix_query_asks_only_the_suffix() {
    let mut c = coord(vec![full(16), GroupSpec::state("ssm", 32, 8)], 1000, 1000);
    let p = prompt(4, 200);
    // Device: Full 0..4 and checkpoints at 32, 64. Host: Full 4..6 (64..96).
    let dev = c.computed_blocks(&p, 64);
    c.insert_device(&dev).unwrap();
    let host_full: Vec<BlockAddr> = group_blocks(&c, &p, 0, 96)[4..6].to_vec();
    c.publish_d2h(&host_full).unwrap();
    let plan = c.plan_query(&p, 160, ALL, NO_LIMITS);
    assert_eq!((plan.device_tokens, plan.local_tokens), (64, 64));
    let asked: BTreeSet<BlockAddr> = plan.rows.iter().map(|r| r.block).collect();
    for b in dev.iter().chain(&host_full) {
        assert!(
            !asked.contains(b),
            "never asks for what the Device or Host holds"
        );
    }
    let full_all = group_blocks(&c, &p, 0, 160);
    let state_all = group_blocks(&c, &p, 1, 160);
    let expect: BTreeSet<BlockAddr> = full_all[6..10]
        .iter()
        .chain(&state_all[2..5])
        .copied()
        .collect();
    assert_eq!(asked, expect);
    assert_eq!(plan.keys.len(), 4 + 3 * 2);
    // Primary charge: 4 Full + 1 checkpoint destinations + 2 warm Host blocks.
    assert_eq!(plan.host_blocks, 7);
    assert_eq!(plan.boundaries[0].new_keys, 6);
    // Every key is in the namespace and distinct.
    let keys: BTreeSet<_> = plan.keys.iter().collect();
    assert_eq!(keys.len(), plan.keys.len());
    assert!(plan.keys.iter().all(|k| c.namespace().owns(k)));

    let r = c.reserve(&p, 160, &all_hints(&plan), 100).unwrap();
    assert_eq!((r.boundary, r.device_tokens), (160, 64));
    assert_eq!(r.destinations.len(), 5);
    assert_eq!(r.charged_host_blocks, 7);
    assert_eq!(r.rows.len(), 6);
    // Destinations do not overlap and the warm pins were released before returning.
    for (i, a) in r.host_ranges().iter().enumerate() {
        for b in &r.host_ranges()[i + 1..] {
            assert!(!a.overlaps(b));
        }
    }
    for b in &host_full {
        assert_eq!(c.host().refs(*b), 0);
        assert!(c.host_mut().evict(*b) || c.host().contains(*b));
    }
    c.publish_d2h(&host_full).unwrap();
    assert!(
        c.admission_match(&p, 160).boundary < 160,
        "unpublished destinations are invisible to probes"
    );
    let hold = c.publish_host(r, &[true; 6]).unwrap();
    assert_eq!(hold.blocks.len(), 5);
    let m = c.admission_match(&p, 160);
    assert_eq!((m.boundary, m.device_tokens, m.host_tokens), (160, 64, 96));
    c.release_hold(hold).unwrap();
}

#[test]
fn reservation_shortens_under_host_shortage() {
    let p = prompt(5, 200);
    // Pool shortage: 4 Host slots.
    let mut c = coord(vec![full(16)], 0, 4);
    let plan = c.plan_query(&p, 128, ALL, NO_LIMITS);
    assert_eq!(plan.keys.len(), 8);
    let r = c.reserve(&p, 128, &all_hints(&plan), 100).unwrap();
    assert_eq!(r.boundary, 64);
    assert!(r.shortened);
    assert_eq!(r.destinations.len(), 4);
    c.abandon(r).unwrap();
    assert!(c.host().is_empty(), "abandoned destinations are freed");
    // Credit shortage: 3 Host credits.
    let mut c = coord(vec![full(16)], 0, 100);
    let r = c.reserve(&p, 128, &all_hints(&plan), 3).unwrap();
    assert_eq!((r.boundary, r.charged_host_blocks), (48, 3));
    // Warm references count against the credits too: with 2 blocks on Host, 3 credits
    // still reach only 48 (2 warm + 1 destination).
    let mut c = coord(vec![full(16)], 0, 100);
    c.publish_d2h(&group_blocks(&c, &p, 0, 32)).unwrap();
    let r = c.reserve(&p, 128, &all_hints(&plan), 3).unwrap();
    assert_eq!((r.boundary, r.destinations.len()), (48, 1));
}

#[test]
fn shortage_retries_the_aligned_boundary_below_a_tail() {
    let p = prompt(6, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    let plan = c.plan_query(&p, 70, ALL, NO_LIMITS);
    assert_eq!(plan.boundaries[0].boundary, 70);
    assert!(plan.boundaries[0].tail.is_some());
    assert_eq!(plan.boundaries[1].boundary, 64);
    let hints = all_hints(&plan);
    let r = c.reserve(&p, 70, &hints, 5).unwrap();
    assert_eq!((r.boundary, r.destinations.len()), (70, 5));
    c.abandon(r).unwrap();
    let r = c.reserve(&p, 70, &hints, 4).unwrap();
    assert_eq!(
        (r.boundary, r.tail),
        (64, None),
        "aligned boundary below the tail"
    );
}

#[test]
fn eviction_between_query_and_reservation_shortens_never_hits() {
    let p = prompt(7, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    let local = group_blocks(&c, &p, 0, 64);
    c.publish_d2h(&local).unwrap();
    let plan = c.plan_query(&p, 128, ALL, NO_LIMITS);
    assert_eq!(plan.local_tokens, 64);
    assert_eq!(plan.keys.len(), 4);
    assert!(c.host_mut().evict(local[2]));
    let r = c.reserve(&p, 128, &all_hints(&plan), 100).unwrap();
    assert!(r.is_empty(), "no destinations above a lost dependency");
    assert_eq!(r.boundary, 32);
    assert_eq!(c.admission_match(&p, 128).boundary, 32);
    // The hints of a different, partially failed existence answer cannot extend it either.
    let mut exists = vec![true; plan.rows.len()];
    exists[0] = false;
    let h = plan.existence_hints(&exists).unwrap();
    assert_eq!(h.full.len(), 3);
    let r = c.reserve(&p, 128, &h, 100).unwrap();
    assert_eq!(r.boundary, 32);
}

#[test]
fn tail_hints_never_establish_a_hit() {
    let p = prompt(8, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    // A GET of the tail at the exact bound 70 records a hint after publication.
    let plan = c.plan_query(&p, 70, ALL, NO_LIMITS);
    let r = c.reserve(&p, 70, &all_hints(&plan), 100).unwrap();
    assert!(r.tail.is_some());
    assert!(c.tail_table().is_empty(), "no hint before publication");
    let hold = c.publish_host(r, &[true; 5]).unwrap();
    assert_eq!(c.tail_table().len(), 1);
    c.release_hold(hold).unwrap();
    // A longer prompt sharing the prefix finds the tail through the hint.
    let m = c.admission_match(&p, 100);
    assert_eq!(m.boundary, 70);
    assert!(
        m.copy_on_write,
        "a partial history block follows copy-on-write"
    );
    // Losing the tail block: the hint alone does not make 70 a hit.
    let tail_block = c.blocks_at(&p, 70)[4];
    assert!(c.host_mut().evict(tail_block));
    assert_eq!(c.admission_match(&p, 100).boundary, 64);
    // Losing an aligned block below: nothing at all.
    let b0 = group_blocks(&c, &p, 0, 16)[0];
    assert!(c.host_mut().evict(b0));
    assert_eq!(c.admission_match(&p, 100).boundary, 0);
    // The hint still proposes 70 as a query boundary.
    let plan = c.plan_query(&p, 100, ALL, NO_LIMITS);
    assert!(plan.boundaries.iter().any(|b| b.boundary == 70));
}

#[test]
fn a_tail_candidate_of_another_prompt_is_ignored() {
    let p = prompt(17, 200);
    let q = prompt(18, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    let tail_q = c.plan_query(&q, 70, ALL, NO_LIMITS).boundaries[0]
        .tail
        .unwrap();
    let plan_p = c.plan_query(&p, 70, ALL, NO_LIMITS);
    let mut hints = all_hints(&plan_p);
    assert_eq!(hints.tails.len(), 1);
    // An answer with no existing key hints no block; the tail candidates still ride along.
    let none = plan_p
        .existence_hints(&vec![false; plan_p.rows.len()])
        .unwrap();
    assert!(none.is_empty());
    assert_eq!(none.tails, hints.tails);
    let own = hints.tails.clone();
    // With bound 100, 70 is no exact bound: only a carried candidate can propose it.
    hints.tails = vec![tail_q];
    let r = c.reserve(&p, 100, &hints, 100).unwrap();
    assert_eq!(r.boundary, 64);
    c.abandon(r).unwrap();
    hints.tails = own;
    let r = c.reserve(&p, 100, &hints, 100).unwrap();
    assert_eq!(r.boundary, 70);
}

/// A carried tail at the request bound that is not the prompt's own (here the lowest hash
/// there is, so it would sort first) neither replaces the prompt's own tail there nor joins it.
#[test]
fn a_foreign_tail_at_the_bound_never_displaces_the_prompts_own() {
    use super::tail::TailCandidate;
    let p = prompt(17, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    let plan = c.plan_query(&p, 70, ALL, NO_LIMITS);
    let mut hints = all_hints(&plan);
    let own = hints.tails.clone();
    let foreign = TailCandidate {
        boundary: 70,
        hash: ContentHash::from_u128(0),
    };
    hints.tails = vec![foreign];
    let r = c.reserve(&p, 70, &hints, 100).unwrap();
    assert_eq!((r.boundary, r.tail), (70, Some(own[0])));
}

/// The match table's tails: a foreign candidate sorting before the prompt's own at one
/// boundary does not displace it (checked before duplicates go), and a group on the LCM
/// parent chain takes the tail identity as its partial block's hash, exactly the hash of
/// that block (a group on a chain of its own hashes its block).
#[test]
fn a_match_tables_tail_blocks_are_the_prompts_own() {
    use super::keys::PromptIndex;
    use super::matcher::{Candidate, Have, MatchTable};
    use super::tail::TailCandidate;
    let g = CacheGeometry::new(vec![full(16), full(8)], 1, 0).unwrap();
    let p = prompt(29, 220);
    let index = PromptIndex::new(&g, &p, p.len() as u32);
    assert!(index.on_parent_chain(0) && !index.on_parent_chain(1));
    let own = TailCandidate::at(&index, &p, 203).unwrap();
    let foreign = TailCandidate {
        boundary: 203,
        hash: ContentHash::from_u128(0),
    };
    let table = MatchTable::build(&g, &index, &p, 203, &[foreign, own], None, |_, _| {
        Have::Missing
    });
    let tails: Vec<Candidate> = table
        .candidates_iter(0)
        .filter(|c| c.tail.is_some())
        .collect();
    assert_eq!(tails.len(), 1, "{tails:?}");
    assert_eq!(table.tail(tails[0].tail.unwrap()), own);
    for group in 0..2 {
        let (addr, _) = table.tail_block(tails[0], group).unwrap();
        assert_eq!(
            addr.hash,
            index.tail_block_hash(&mut Vec::new(), &p, group, 203)
        );
    }
}

#[test]
fn failed_rows_free_their_blocks_and_shorten_reuse() {
    let p = prompt(9, 200);
    let mut c = coord(vec![GroupSpec::full("attn", 16, 2, 32)], 0, 100);
    let plan = c.plan_query(&p, 64, ALL, NO_LIMITS);
    let r = c.reserve(&p, 64, &all_hints(&plan), 100).unwrap();
    assert_eq!(r.rows.len(), 8);
    let failed_block = r.rows[5].block;
    let mut ok = vec![true; 8];
    ok[5] = false; // one page of block 2
    let hold = c.publish_host(r, &ok).unwrap();
    assert_eq!(hold.blocks.len(), 3);
    assert_eq!(
        c.host().state(failed_block),
        None,
        "failed destination freed"
    );
    assert_eq!(c.admission_match(&p, 64).boundary, 32);
    c.release_hold(hold).unwrap();
}

#[test]
fn malformed_row_results_quarantine_the_destinations() {
    let p = prompt(9, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    let plan = c.plan_query(&p, 64, ALL, NO_LIMITS);
    let r = c.reserve(&p, 64, &all_hints(&plan), 100).unwrap();
    let dests: Vec<BlockAddr> = r.destinations.iter().map(|d| d.addr()).collect();
    assert!(matches!(
        c.publish_host(r, &[true; 3]),
        Err(CacheError::Length {
            expected: 4,
            got: 3,
            ..
        })
    ));
    for d in &dests {
        assert_eq!(c.host().refs(*d), 1, "never freed nor published");
        assert!(!c.host().contains(*d));
    }
    assert_eq!(c.host().available(0), 96);
}

#[test]
fn credit_packing_longest_complete_boundary_first() {
    let p = prompt(10, 300);
    let c = coord(vec![full(16)], 0, 100);
    let credits = QueryCredits {
        keys: 10,
        host_blocks: 100,
    };
    let plan = c.plan_query(&p, 256, credits, NO_LIMITS);
    assert_eq!(plan.boundaries[0].boundary, 160);
    assert_eq!(plan.keys.len(), 10);
    assert!(plan.boundaries[1..].iter().all(|b| b.new_keys == 0));
    // Host credits bound the primary too.
    let credits = QueryCredits {
        keys: 100,
        host_blocks: 6,
    };
    let plan = c.plan_query(&p, 256, credits, NO_LIMITS);
    assert_eq!(plan.boundaries[0].boundary, 96);
    assert_eq!(plan.host_blocks, 6);
    let none = QueryCredits {
        keys: 0,
        host_blocks: 100,
    };
    assert_eq!(
        c.plan_query(&p, 256, none, NO_LIMITS).bypass,
        Some(Bypass::NoCreditFit)
    );
}

#[test]
fn fallbacks_join_only_when_their_whole_extra_set_fits() {
    let p = prompt(11, 300);
    let c = coord(vec![GroupSpec::sliding_window("swa", 32, 16, 2, 8)], 0, 100);
    let plan = |keys| {
        let credits = QueryCredits {
            keys,
            host_blocks: 100,
        };
        let plan = c.plan_query(&p, 128, credits, NO_LIMITS);
        let bs: Vec<(u32, u32)> = plan
            .boundaries
            .iter()
            .map(|b| (b.boundary, b.new_keys))
            .collect();
        (bs, plan.keys.len())
    };
    // Primary 128: window blocks 6, 7 (4 keys). 112 adds block 5 (2 keys), 96 adds 4 ...
    assert_eq!(
        plan(5),
        (vec![(128, 4)], 4),
        "a half-fitting extra set is skipped"
    );
    assert_eq!(plan(6), (vec![(128, 4), (112, 2)], 6));
    assert_eq!(plan(9), (vec![(128, 4), (112, 2), (96, 2)], 8));
}

#[test]
fn historical_checkpoints_never_crowd_out_the_prompt_end_checkpoint() {
    let p = prompt(12, 300);
    let mut c = coord(vec![full(16), GroupSpec::state("ssm", 16, 8)], 0, 100);
    c.publish_d2h(&group_blocks(&c, &p, 0, 256)).unwrap();
    let plan = |c: &CacheCoordinator, keys| {
        let credits = QueryCredits {
            keys,
            host_blocks: 100,
        };
        c.plan_query(&p, 256, credits, NO_LIMITS)
            .boundaries
            .iter()
            .map(|b| b.boundary)
            .collect::<Vec<_>>()
    };
    assert_eq!(plan(&c, 2), vec![256]);
    assert_eq!(plan(&c, 3), vec![256]);
    assert_eq!(plan(&c, 6), vec![256, 240, 224]);
}

#[test]
fn bypass_rules() {
    let p = prompt(13, 300);
    let mut c = coord(vec![full(16)], 0, 100);
    c.publish_d2h(&group_blocks(&c, &p, 0, 64)).unwrap();
    let plan = c.plan_query(&p, 64, ALL, NO_LIMITS);
    assert_eq!(plan.bypass, Some(Bypass::LocalCoversBound));
    let limits = QueryLimits {
        lookahead_tokens: 0,
        min_extension_tokens: 80,
    };
    let plan = c.plan_query(&p, 128, ALL, limits);
    assert_eq!(plan.bypass, Some(Bypass::ExtensionBelowMinimum));
    assert!(plan.keys.is_empty());
    let limits = QueryLimits {
        lookahead_tokens: 32,
        min_extension_tokens: 1,
    };
    let plan = c.plan_query(&p, 256, ALL, limits);
    assert_eq!(plan.bypass, None);
    assert_eq!(plan.boundaries[0].boundary, 96, "bounded extension");
}

#[test]
fn page_sharded_rows_follow_owner_translation_with_replica_keys() {
    let groups = vec![GroupSpec::full("mla", 16, 4, 16).sharded(2)];
    let mut coords: Vec<CacheCoordinator> = (0..4)
        .map(|rank| {
            let g = CacheGeometry::new(groups.clone(), 4, rank).unwrap();
            let ns = namespace(&g);
            let cfg = CoordinatorConfig {
                device_blocks: vec![0],
                host_blocks: vec![64],
                tail_capacity: 4,
            };
            CacheCoordinator::new(g, ns, &cfg).unwrap()
        })
        .collect();
    let p = prompt(14, 100);
    let mut keys = Vec::new();
    for (rank, c) in coords.iter_mut().enumerate() {
        let plan = c.plan_query(&p, 32, ALL, NO_LIMITS);
        let r = c.reserve(&p, 32, &all_hints(&plan), 100).unwrap();
        assert_eq!(r.rows.len(), 8);
        let owned: Vec<bool> = r.rows.iter().map(|x| x.locally_owned).collect();
        let expect: Vec<bool> = (0..8).map(|i| (i % 2) as usize == rank % 2).collect();
        assert_eq!(owned, expect);
        keys.push(r.keys.clone());
    }
    assert_eq!(keys[0], keys[1], "one payload replica, one set of keys");
    assert_eq!(keys[2], keys[3]);
    assert_ne!(keys[0], keys[2]);
}

#[test]
fn identical_inputs_give_identical_plans_and_reservations() {
    let run = || {
        let mut c = coord(
            vec![
                full(16),
                GroupSpec::sliding_window("swa", 48, 16, 1, 8),
                GroupSpec::state("ssm", 32, 8),
            ],
            8,
            200,
        );
        let p = prompt(15, 400);
        c.insert_device(&c.computed_blocks(&p, 64)).unwrap();
        c.publish_d2h(&c.computed_blocks(&p, 160)).unwrap();
        let plan = c.plan_query(&p, 300, ALL, NO_LIMITS);
        let r = c.reserve(&p, 300, &all_hints(&plan), 60).unwrap();
        (plan, r.keys.clone(), r.host_ranges(), r.boundary)
    };
    assert_eq!(run(), run());
}

#[test]
fn backup_sources_recheck_residency_and_hold_references() {
    let p = prompt(16, 100);
    let mut c = coord(vec![full(16)], 0, 2);
    let placed = c.placed_blocks(&p, 32);
    let blocks: Vec<BlockAddr> = placed.iter().map(|b| b.addr).collect();
    assert_eq!(c.publish_d2h(&blocks).unwrap(), blocks);
    assert!(
        c.publish_d2h(&blocks).unwrap().is_empty(),
        "already resident"
    );
    let (rows, keys) = c.backup_sources(&placed).unwrap().unwrap();
    assert_eq!((rows.len(), keys.len()), (2, 2));
    assert!(rows.iter().all(|r| r.locally_owned));
    assert_eq!(rows[1].range, c.host().host_range(blocks[1]).unwrap());
    // Sources are held: a new D2H cannot evict them.
    let more = group_blocks(&c, &p, 0, 48)[2];
    assert!(c.publish_d2h(&[more]).is_err());
    c.release_host_refs(&blocks).unwrap();
    assert_eq!(c.publish_d2h(&[more]).unwrap(), vec![more]);
    // One source evicted: the PUT is dropped without taking references.
    assert!(c.backup_sources(&placed).unwrap().is_none());
    assert!(blocks.iter().all(|b| c.host().refs(*b) == 0));
}

#[test]
fn page_sharded_backup_rows_follow_owner_translation() {
    let groups = vec![GroupSpec::full("mla", 16, 3, 16).sharded(2)];
    let g = CacheGeometry::new(groups, 2, 1).unwrap();
    let ns = namespace(&g);
    let cfg = CoordinatorConfig {
        device_blocks: vec![0],
        host_blocks: vec![8],
        tail_capacity: 1,
    };
    let mut c = CacheCoordinator::new(g, ns, &cfg).unwrap();
    let p = prompt(19, 64);
    let placed = c.placed_blocks(&p, 32);
    let blocks: Vec<BlockAddr> = placed.iter().map(|b| b.addr).collect();
    c.publish_d2h(&blocks).unwrap();
    let (rows, keys) = c.backup_sources(&placed).unwrap().unwrap();
    // Pages 0..6 of the group's sequence, dealt over ranks 0 and 1: rank 1 owns the odd ones.
    let owned: Vec<bool> = rows.iter().map(|r| r.locally_owned).collect();
    assert_eq!(owned, vec![false, true, false, true, false, true]);
    assert!(keys.iter().all(|k| k.text().ends_with("-s0")));
}

// ---------------------------------------------------------------- property tests

mod props {
    use super::*;
    use proptest::prelude::*;

    /// The independent oracle: the blocks boundary `b` requires, from the seed's rules.
    fn naive_required(geo: &CacheGeometry, p: &[u32], b: u32) -> Vec<BlockAddr> {
        let mut s = Vec::new();
        let mut out = Vec::new();
        for (g, spec) in geo.groups().iter().enumerate() {
            let bt = spec.block_tokens;
            let mut chain = vec![ContentHash::ROOT];
            for k in 0..(b / bt) as usize {
                let h = chain_hash(&mut s, chain[k], &p[k * bt as usize..(k + 1) * bt as usize]);
                chain.push(h);
            }
            let full_k = (b / bt) as usize;
            let tail = || {
                let start = full_k * bt as usize;
                chain_hash(&mut Vec::new(), chain[full_k], &p[start..b as usize])
            };
            let partial = !b.is_multiple_of(bt);
            let range = match spec.kind {
                GroupKind::Full => 0..full_k,
                GroupKind::SlidingWindow { window_tokens } => {
                    ((b - window_tokens.min(b)) / bt) as usize..full_k
                }
                GroupKind::State => {
                    if partial || b == 0 {
                        0..0
                    } else {
                        full_k - 1..full_k
                    }
                }
            };
            for k in range {
                out.push(BlockAddr::new(g, chain[k + 1]));
            }
            if partial {
                out.push(BlockAddr::new(g, tail()));
            }
        }
        out
    }

    fn presets() -> Vec<Vec<GroupSpec>> {
        vec![
            vec![full(4)],
            vec![full(4), GroupSpec::sliding_window("w", 6, 2, 1, 8)],
            vec![full(2), GroupSpec::state("s", 4, 8)],
            vec![
                full(2),
                GroupSpec::sliding_window("w", 4, 4, 2, 8),
                GroupSpec::state("s", 8, 8),
            ],
            vec![
                GroupSpec::sliding_window("w", 3, 3, 1, 8),
                GroupSpec::state("s", 6, 8),
            ],
        ]
    }

    /// Places every block a boundary in 1..=`upto` of `p` could require: the i-th block
    /// (in address order) on the Device and/or in Host L2 as `tier(i)` says.
    fn place_required(
        c: &mut CacheCoordinator,
        p: &[u32],
        upto: u32,
        mut tier: impl FnMut(usize) -> (bool, bool),
    ) {
        let geo = c.geometry().clone();
        let mut every = BTreeSet::new();
        for b in 1..=upto {
            every.extend(naive_required(&geo, p, b));
        }
        for (i, a) in every.iter().enumerate() {
            let (device, host) = tier(i);
            if device {
                c.insert_device(&[*a]).unwrap();
            }
            if host {
                c.publish_d2h(&[*a]).unwrap();
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn matcher_returns_a_legal_and_maximal_boundary(
            preset in 0usize..5,
            len in 1usize..80,
            bound in 0u32..90,
            vocab in 1u32..4,
            seeds in proptest::collection::vec(0u8..4, 200),
        ) {
            let mut c = coord(presets()[preset].clone(), 1000, 1000);
            let p: Vec<u32> = (0..len as u32).map(|i| (i * 7 + i / 5) % vocab).collect();
            let geo = c.geometry().clone();
            let bound = bound.min(len as u32);
            // Every block any candidate could require, placed at random.
            place_required(&mut c, &p, bound, |i| match seeds[i % seeds.len()] {
                0 => (true, false),
                1 => (false, true),
                2 => (true, true),
                _ => (false, false),
            });
            let have = |a: &BlockAddr| c.device().contains(*a) || c.host().contains(*a);
            let on_dev = |a: &BlockAddr| c.device().contains(*a);
            let l = geo.parent_tokens();
            let m = c.admission_match(&p, bound);
            // Candidates: aligned boundaries and the exact bound (no hints recorded).
            let cands: Vec<u32> = (1..=bound).filter(|b| b % l == 0 || *b == bound).collect();
            let legal = |b: u32, f: &dyn Fn(&BlockAddr) -> bool| {
                b == 0 || naive_required(&geo, &p, b).iter().all(f)
            };
            prop_assert!(legal(m.boundary, &have));
            prop_assert!(m.boundary == 0 || cands.contains(&m.boundary));
            for b in cands.iter().filter(|b| **b > m.boundary) {
                prop_assert!(!legal(*b, &have), "longer legal boundary {} missed", b);
            }
            prop_assert!(legal(m.device_tokens, &on_dev));
            for b in cands.iter().filter(|b| **b > m.device_tokens) {
                prop_assert!(!legal(*b, &on_dev));
            }
            prop_assert_eq!(m.host_tokens, m.boundary - m.device_tokens);
            // Admission's own question (no Host blocks list) has the same answer.
            let whole = crate::cache::keys::PromptIndex::new(&geo, &p, len as u32);
            prop_assert_eq!(
                c.admission_boundary_in(&whole, &p, bound),
                (m.boundary, m.device_tokens)
            );
        }

        #[test]
        fn the_bound_check_agrees_with_query_planning_on_local_coverage(
            preset in 0usize..5,
            len in 1usize..80,
            vocab in 1u32..4,
            seeds in proptest::collection::vec(0u8..5, 200),
            cover in any::<bool>(),
        ) {
            let mut c = coord(presets()[preset].clone(), 1000, 1000);
            let p: Vec<u32> = (0..len as u32).map(|i| (i * 7 + i / 5) % vocab).collect();
            let geo = c.geometry().clone();
            let reusable = (len as u32).saturating_sub(1);
            // Mostly present (so that coverage happens), sometimes missing.
            place_required(&mut c, &p, reusable, |i| match seeds[i % seeds.len()] {
                0 | 3 => (true, false),
                1 => (false, true),
                2 => (true, true),
                _ => (false, false),
            });
            if cover {
                // The bound's own requirement held on the Device (the rest stays random).
                for a in naive_required(&geo, &p, reusable) {
                    if !c.device().contains(a) {
                        c.insert_device(&[a]).unwrap();
                    }
                }
            }
            let whole = super::super::keys::PromptIndex::new(&geo, &p, len as u32);
            let plan = c.plan_query_rows_in(Some(&whole), &p, reusable, ALL, NO_LIMITS);
            let covers = c.local_covers_bound(&whole, &p, reusable);
            prop_assert_eq!(covers, plan.bypass == Some(Bypass::LocalCoversBound));
            // The oracle: every block the bound requires is local.
            let local = |a: &BlockAddr| c.device().contains(*a) || c.host().contains(*a);
            let naive = reusable == 0 || naive_required(&geo, &p, reusable).iter().all(local);
            prop_assert_eq!(covers, naive);
            prop_assert!(!cover || covers, "the held requirement covers the bound");
        }

        #[test]
        fn lcm_accounting_never_exceeds_max_host_blocks(
            preset in 0usize..5,
            len in 1usize..120,
            max_host_blocks in 1u32..40,
            host_slots in 1u32..30,
            local in proptest::collection::vec(any::<bool>(), 64),
            exists in proptest::collection::vec(any::<bool>(), 256),
            key_credits in 1u32..60,
        ) {
            let mut c = coord(presets()[preset].clone(), 1000, host_slots);
            let p: Vec<u32> = (0..len as u32).map(|i| i * 31 % 11).collect();
            let blocks = c.computed_blocks(&p, len as u32);
            for (i, b) in blocks.iter().enumerate() {
                if local[i % local.len()] {
                    let _ = c.publish_d2h(&[*b]);
                }
            }
            let credits = QueryCredits { keys: key_credits, host_blocks: max_host_blocks };
            let plan = c.plan_query(&p, len as u32, credits, NO_LIMITS);
            prop_assert!(plan.host_blocks <= max_host_blocks);
            prop_assert!(plan.keys.len() as u32 <= key_credits);
            let ex: Vec<bool> = (0..plan.rows.len()).map(|i| exists[i % exists.len()]).collect();
            let hints = plan.existence_hints(&ex).unwrap();
            let r = c.reserve(&p, len as u32, &hints, max_host_blocks).unwrap();
            prop_assert!(r.charged_host_blocks <= max_host_blocks);
            prop_assert!(r.destinations.len() as u32 <= r.charged_host_blocks);
            // Only destinations hold references after reservation: warm pins are gone.
            let held: u32 = blocks.iter().map(|b| c.host().refs(*b)).sum();
            prop_assert!(held <= r.destinations.len() as u32);
            // A reservation never claims more than the hints and local data make legal.
            prop_assert!(r.boundary <= len as u32);
            let boundary = r.boundary;
            let rows = r.rows.len();
            let hold = c.publish_host(r, &vec![true; rows]).unwrap();
            prop_assert!(c.admission_match(&p, len as u32).boundary >= boundary);
            c.release_hold(hold).unwrap();
        }

        /// The scheduler ends a QUERY whose answer names no existing block as a Miss
        /// without reserving: a reservation with no block hinted reads nothing, whatever
        /// the local tiers hold, and leaves the Host pool as it found it.
        #[test]
        fn a_reservation_with_no_existing_block_reads_nothing(
            preset in 0usize..5,
            len in 1usize..80,
            vocab in 1u32..4,
            seeds in proptest::collection::vec(0u8..4, 200),
            exists in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let mut c = coord(presets()[preset].clone(), 1000, 1000);
            let p: Vec<u32> = (0..len as u32).map(|i| (i * 7 + i / 5) % vocab).collect();
            let geo = c.geometry().clone();
            let reusable = (len as u32).saturating_sub(1);
            place_required(&mut c, &p, reusable, |i| match seeds[i % seeds.len()] {
                0 => (true, false),
                1 => (false, true),
                2 => (true, true),
                _ => (false, false),
            });
            let plan = c.plan_query(&p, reusable, ALL, NO_LIMITS);
            // Some pages of a block may exist; the block exists only when all of them do.
            let pages: Vec<bool> = (0..plan.rows.len()).map(|i| exists[i % exists.len()]).collect();
            let mut hints = plan.existence_hints(&pages).unwrap();
            hints.full.clear();
            hints.tail_blocks.clear();
            let free: Vec<u64> = (0..geo.group_count() as u32).map(|g| c.host().available(g)).collect();
            let r = c.reserve(&p, reusable, &hints, u32::MAX).unwrap();
            prop_assert!(r.is_empty(), "{:?}", r);
            prop_assert!(r.destinations.is_empty());
            let after: Vec<u64> = (0..geo.group_count() as u32).map(|g| c.host().available(g)).collect();
            prop_assert_eq!(free, after);
            c.abandon(r).unwrap();
        }

        /// Existence hints hold exactly the complete blocks all of whose rows exist (sorted,
        /// distinct) and the tail blocks all of whose rows exist, whatever the rows' order:
        /// in plan order (each block's pages adjacent, blocks increasing, tails between:
        /// the one-pass path), shuffled, or with a block's pages apart (the general pass).
        #[test]
        fn existence_hints_follow_every_row_of_a_block_in_any_order(
            blocks in proptest::collection::vec((0u32..2, 0u32..12, 0u128..3, 1u32..3, any::<bool>()), 0..10),
            shuffle in any::<bool>(),
            seed in any::<u64>(),
            exists in proptest::collection::vec(proptest::bool::weighted(0.8), 40),
        ) {
            // (group, position, hash, pages, tail?): a block of a plan.
            let mut seen = BTreeSet::new();
            let mut rows = Vec::new();
            for (g, k, h, pages, tail) in blocks {
                let slot = if tail { BlockSlot::Tail } else { BlockSlot::Full(k) };
                if !seen.insert((g, k, h, tail)) {
                    continue;
                }
                let block = BlockAddr::new(g as usize, ContentHash::from_u128(h + 7 * u128::from(k)));
                for page in 0..pages {
                    rows.push(QueryRow { block, slot, page });
                }
            }
            if !shuffle {
                // Plan order: complete blocks by group then position (pages adjacent).
                rows.sort_by_key(|r| match r.slot {
                    BlockSlot::Full(k) => (r.block.group, 0, k, r.block.hash, r.page),
                    BlockSlot::Tail => (r.block.group, 1, 0, r.block.hash, r.page),
                });
            } else {
                let mut x = seed | 1;
                for i in (1..rows.len()).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    rows.swap(i, (x % (i as u64 + 1)) as usize);
                }
            }
            let exists: Vec<bool> = (0..rows.len()).map(|i| exists[i % exists.len()]).collect();
            let h = rows_plan(rows.clone()).existence_hints(&exists).unwrap();
            // The oracle: per block, every one of its rows exists.
            let mut full = std::collections::BTreeMap::new();
            let mut tails = std::collections::BTreeMap::new();
            for (r, ok) in rows.iter().zip(&exists) {
                match r.slot {
                    BlockSlot::Full(k) => *full.entry(HintedBlock::new(r.block, k)).or_insert(true) &= *ok,
                    BlockSlot::Tail => *tails.entry(r.block).or_insert(true) &= *ok,
                }
            }
            let want: Vec<HintedBlock> = full.into_iter().filter(|(_, ok)| *ok).map(|(b, _)| b).collect();
            prop_assert_eq!(&h.full, &want);
            let got: BTreeSet<BlockAddr> = h.tail_blocks.iter().copied().collect();
            prop_assert_eq!(got.len(), h.tail_blocks.len(), "distinct tail blocks");
            let want: BTreeSet<BlockAddr> = tails.into_iter().filter(|(_, ok)| *ok).map(|(b, _)| b).collect();
            prop_assert_eq!(got, want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The bound check remembers the last prefix it found covered; that memory must
        /// never answer for a block withdrawn since. Checks of three related prompts (one differing
        /// inside the bound, one a shorter prefix) between placements on small pools (which
        /// evict under pressure) and of a fourth, distinct prompt, LRU evictions, targeted
        /// evictions, clears (of referenced Host blocks too) and local resets each agree
        /// with the oracle.
        #[test]
        fn the_bound_check_stays_true_to_the_pools_across_withdrawals(
            preset in 0usize..5,
            len in 2usize..40,
            slots in 4u32..24,
            ops in proptest::collection::vec((0u8..12, 0usize..4, 0usize..64), 1..48),
        ) {
            let mut c = coord(presets()[preset].clone(), slots, slots);
            // Host blocks referenced (as a ticket would): a clear hides them.
            let mut held: Vec<BlockAddr> = Vec::new();
            let geo = c.geometry().clone();
            let ns = c.namespace().clone();
            let p0: Vec<u32> = (0..len as u32).map(|i| (i * 7 + 3) % 5).collect();
            let mut p1 = p0.clone();
            p1[len - 2] += 5;
            let p2 = p0[..len / 2 + 1].to_vec();
            let p3: Vec<u32> = (0..len as u32).map(|i| (i * 3 + 1) % 7 + 10).collect();
            let prompts = [p0, p1, p2, p3];
            let required = |p: &[u32]| naive_required(&geo, p, p.len() as u32 - 1);
            for (op, i, k) in ops {
                let p = &prompts[i];
                let reusable = p.len() as u32 - 1;
                let req = required(p);
                let groups = geo.group_count() as u32;
                match op {
                    0..=2 => {
                        let whole = super::super::keys::PromptIndex::new(&geo, p, p.len() as u32);
                        let whole = if c.tails_enabled() {
                            whole.with_tail_at(p, reusable)
                        } else {
                            whole
                        };
                        // Asked twice: the second answer may come from the memory.
                        for _ in 0..2 {
                            let covers = c.local_covers_bound(&whole, p, reusable);
                            let local =
                                |a: &BlockAddr| c.device().contains(*a) || c.host().contains(*a);
                            let aligned = reusable.is_multiple_of(geo.parent_tokens());
                            let legal = reusable == 0 || aligned || c.tails_enabled();
                            prop_assert_eq!(covers, legal && req.iter().all(local));
                        }
                    }
                    3 | 4 => {
                        let missing: Vec<BlockAddr> =
                            req.iter().copied().filter(|a| !c.device().contains(*a)).collect();
                        c.insert_device(&missing).unwrap();
                    }
                    5 => {
                        let missing: Vec<BlockAddr> =
                            req.iter().copied().filter(|a| !c.host().contains(*a)).collect();
                        // Refused when every slot is held or a hidden entry is in the
                        // way (a clear while referenced); the oracle reads the pools.
                        let _ = c.publish_d2h(&missing);
                    }
                    6 => {
                        c.evict_device(k as u32 % groups, k % 4 + 1);
                        c.evict_host(k as u32 % groups, k % 3 + 1);
                    }
                    7 => {
                        if let Some(a) = req.get(k % req.len().max(1)) {
                            c.device_mut().evict(*a);
                            if k % 2 == 0 {
                                c.host_mut().evict(*a);
                            }
                        }
                    }
                    8 => {
                        c.reset_local(k % 2 == 0);
                    }
                    9 => {
                        c.clear(ns.clone());
                    }
                    10 => {
                        let published: Vec<BlockAddr> =
                            req.iter().copied().filter(|a| c.host().contains(*a)).collect();
                        c.acquire_host_refs(&published).unwrap();
                        held.extend(published);
                    }
                    _ => {
                        c.release_host_refs(&held).unwrap();
                        held.clear();
                    }
                }
            }
        }
    }
}

/// A GET reads exactly the objects its QUERY found: each reservation row's key is the key
/// the QUERY carried for that block and page.
#[test]
fn a_reservations_rows_carry_the_keys_its_query_asked_for() {
    let p = prompt(21, 200);
    let mut c = coord(vec![full(16), GroupSpec::state("ssm", 32, 8)], 1000, 1000);
    let dev = c.computed_blocks(&p, 64);
    c.insert_device(&dev).unwrap();
    let plan = c.plan_query(&p, 160, ALL, NO_LIMITS);
    let hints = all_hints(&plan);
    let r = c.reserve(&p, 160, &hints, 100).unwrap();
    assert!(!r.rows.is_empty());
    assert_eq!(r.keys.len(), r.rows.len(), "one key per row");
    for (row, key) in r.rows.iter().zip(&r.keys) {
        let i = plan
            .rows
            .iter()
            .position(|q| q.block == row.block && q.page == row.page)
            .expect("a queried row");
        assert_eq!(*key, plan.keys[i], "the queried key");
    }
}

#[test]
fn the_one_pass_longest_pair_agrees_with_two_scans() {
    use super::keys::PromptIndex;
    use super::matcher::{Have, MatchTable};
    let g = CacheGeometry::new(vec![full(16), GroupSpec::state("ssm", 32, 8)], 1, 0).unwrap();
    let p = prompt(23, 200);
    let index = PromptIndex::new(&g, &p, p.len() as u32);
    let levels = [Have::Missing, Have::Assumed, Have::Host, Have::Device];
    // Tail candidates between and at the aligned boundaries (32-token parent blocks).
    let tails: Vec<_> = [20, 61, 97, 150, 199]
        .iter()
        .filter_map(|b| super::tail::TailCandidate::at(&index, &p, *b))
        .collect();
    assert_eq!(tails.len(), 5);
    // Availability patterns: a block's level from its hash and a seed (mixed levels,
    // Device prefixes, nothing, everything).
    for seed in 0u64..64 {
        let table = MatchTable::build(&g, &index, &p, 199, &tails, None, |a, _| {
            let h = a.hash.as_u128() as u64;
            match seed % 4 {
                0 => levels[((h ^ seed.wrapping_mul(0x9E37)) % 4) as usize],
                1 => Have::Device,
                2 => Have::Missing,
                _ => levels[(h % 2 + 2) as usize],
            }
        });
        for lo in [0, 16, 64] {
            for (min, strict) in [
                (Have::Host, Have::Device),
                (Have::Assumed, Have::Host),
                (Have::Host, Have::Host),
            ] {
                assert_eq!(
                    table.longest_pair(lo, min, strict),
                    (table.longest(lo, min), table.longest(lo, strict)),
                    "seed {seed} lo {lo} {min:?}/{strict:?}"
                );
                // The ceiling only passes over candidates a tally would find illegal.
                for level in [min, strict] {
                    let scanned = table.candidates_iter(lo).find(|c| table.legal(*c, level));
                    assert_eq!(table.longest(lo, level), scanned, "seed {seed} lo {lo}");
                    let ceiling = table.legal_ceiling(level);
                    assert!(table
                        .candidates_iter(lo)
                        .filter(|c| c.boundary > ceiling)
                        .all(|c| !table.legal(c, level)));
                }
                // A walk that starts at `top` yields the candidates at or below it, in order.
                for top in [
                    0,
                    lo,
                    lo + 1,
                    20,
                    31,
                    32,
                    33,
                    60,
                    61,
                    62,
                    150,
                    198,
                    199,
                    u32::MAX,
                ] {
                    let below: Vec<_> = table
                        .candidates_iter(lo)
                        .filter(|c| c.boundary <= top)
                        .collect();
                    let walked: Vec<_> = table.candidates_in(lo, top).collect();
                    assert_eq!(walked, below, "seed {seed} lo {lo} top {top}");
                }
            }
        }
    }
}

/// A QUERY plan of `rows` alone (what existence hints are made from).
fn rows_plan(rows: Vec<QueryRow>) -> QueryPlan {
    QueryPlan {
        local_tokens: 0,
        device_tokens: 0,
        bypass: None,
        boundaries: Vec::new(),
        keys: Vec::new(),
        rows,
        host_blocks: 0,
    }
}

#[test]
fn a_block_exists_only_when_every_one_of_its_pages_does_in_any_row_order() {
    let block = |n: u128, g: usize| BlockAddr::new(g, ContentHash::from_u128(n));
    // Block n sits at position n of its group; tail blocks are n >= 100.
    let row = |n: u128, g: usize, page: u32| QueryRow {
        block: block(n, g),
        slot: if n >= 100 {
            BlockSlot::Tail
        } else {
            BlockSlot::Full(n as u32)
        },
        page,
    };
    let placed = |n: u128, g: usize| HintedBlock::new(block(n, g), n as u32);
    // Two pages per block; block 2's pages are apart, and block 3 misses its second page;
    // tail block 100's pages are apart too.
    let plan = rows_plan(vec![
        row(2, 0, 0),
        row(1, 0, 0),
        row(100, 0, 0),
        row(1, 0, 1),
        row(3, 0, 0),
        row(2, 0, 1),
        row(3, 0, 1),
        row(4, 1, 0),
        row(100, 0, 1),
    ]);
    let h = plan
        .existence_hints(&[true, true, true, true, true, true, false, true, true])
        .unwrap();
    assert_eq!(h.full, vec![placed(1, 0), placed(2, 0), placed(4, 1)]);
    assert_eq!(h.tail_blocks, vec![block(100, 0)]);
    assert!(h.has(block(2, 0), BlockSlot::Full(2)));
    assert!(h.has(block(100, 0), BlockSlot::Tail));
    // A block is found by its place and must carry the hinted hash there: another
    // prompt's block at the same place, or this block at another place, is not hinted.
    assert!(!h.has(block(7, 0), BlockSlot::Full(2)));
    assert!(!h.has(block(2, 0), BlockSlot::Full(3)));
    assert!(!h.has(block(2, 0), BlockSlot::Tail));
    assert!(!h.has(block(3, 0), BlockSlot::Full(3)));
    let h = plan
        .existence_hints(&[false, true, true, true, true, true, true, false, false])
        .unwrap();
    assert_eq!(h.full, vec![placed(1, 0), placed(3, 0)]);
    assert!(h.tail_blocks.is_empty(), "a tail page is missing");
    assert!(!h.is_empty());
    assert!(plan
        .existence_hints(&[false; 9])
        .is_ok_and(|h| h.is_empty()));
    assert!(plan.existence_hints(&[true]).is_err());
    // Hints made into reused lists hold only the latest answer's blocks (an error leaves
    // them empty, not holding the last answer's).
    let mut reused = plan
        .existence_hints(&[true, true, true, true, true, true, false, true, true])
        .unwrap();
    plan.existence_hints_into(
        &[false, true, true, true, true, true, true, false, false],
        &mut reused,
    )
    .unwrap();
    assert_eq!(reused, h);
    assert!(plan.existence_hints_into(&[true], &mut reused).is_err());
    assert_eq!(reused, ExistenceHints::default());
}

/// An answered plan handed back lends its lists to the next plan, which comes out exactly
/// as a plan made with fresh lists; a plan with no lists is not kept, and at most
/// `SPARE_LISTS` (64) are.
#[test]
fn a_recycled_plans_lists_serve_the_next_plan_unchanged() {
    let p = prompt(40, 200);
    let q = prompt(41, 200);
    let c = coord(vec![full(16)], 0, 100);
    let fresh_q = c.plan_query_rows(&q, 100, ALL, NO_LIMITS);
    let plan_p = c.plan_query_rows(&p, 100, ALL, NO_LIMITS);
    assert!(!plan_p.rows.is_empty() && plan_p.rows != fresh_q.rows);
    let (rows_at, boundaries_at) = (plan_p.rows.as_ptr(), plan_p.boundaries.as_ptr());
    c.recycle_plan(plan_p);
    assert_eq!(c.spare_plans(), 1);
    let again_q = c.plan_query_rows(&q, 100, ALL, NO_LIMITS);
    assert_eq!(c.spare_plans(), 0);
    assert_eq!(again_q, fresh_q, "nothing of the recycled plan shows");
    assert_eq!(
        again_q.rows.as_ptr(),
        rows_at,
        "the recycled rows list is reused"
    );
    assert_eq!(again_q.boundaries.as_ptr(), boundaries_at);
    // A plan that never allocated (a bypass) is not kept.
    c.recycle_plan(QueryPlan {
        local_tokens: 0,
        device_tokens: 0,
        bypass: Some(Bypass::LocalCoversBound),
        boundaries: Vec::new(),
        keys: Vec::new(),
        rows: Vec::new(),
        host_blocks: 0,
    });
    assert_eq!(c.spare_plans(), 0);
    let plans: Vec<QueryPlan> = (0..100)
        .map(|_| c.plan_query_rows(&p, 100, ALL, NO_LIMITS))
        .collect();
    for plan in plans {
        c.recycle_plan(plan);
    }
    assert_eq!(c.spare_plans(), 64);
}

/// A reservation that ends (published then released, or abandoned) leaves its rows and
/// destinations lists to the next reservation, which comes out as one made with fresh
/// lists; a list still holding references is never kept.
#[test]
fn an_ended_reservations_lists_serve_the_next_reservation() {
    let p = prompt(42, 200);
    let q = prompt(43, 200);
    let mut c = coord(vec![full(16)], 0, 100);
    let mut fresh = coord(vec![full(16)], 0, 100);
    assert_eq!(c.spare_reservation_lists(), (0, 0));
    let plan = c.plan_query(&p, 100, ALL, NO_LIMITS);
    let r = c.reserve(&p, 100, &all_hints(&plan), 100).unwrap();
    assert!(!r.is_empty());
    let (rows_at, held_at) = (r.rows.as_ptr(), r.destinations.as_ptr());
    let rows = r.rows.len();
    let hold = c.publish_host(r, &vec![true; rows]).unwrap();
    assert_eq!(
        c.spare_reservation_lists(),
        (1, 0),
        "the rows list, at publication"
    );
    c.release_hold(hold).unwrap();
    assert_eq!(
        c.spare_reservation_lists(),
        (1, 1),
        "the destinations, at the hold's end"
    );
    let plan_q = c.plan_query(&q, 100, ALL, NO_LIMITS);
    let r = c.reserve(&q, 100, &all_hints(&plan_q), 100).unwrap();
    assert_eq!(c.spare_reservation_lists(), (0, 0));
    assert_eq!(
        (r.rows.as_ptr(), r.destinations.as_ptr()),
        (rows_at, held_at)
    );
    let plan_f = fresh.plan_query(&q, 100, ALL, NO_LIMITS);
    let f = fresh.reserve(&q, 100, &all_hints(&plan_f), 100).unwrap();
    // (The Host ranges differ: `c` still caches `p`'s published blocks.)
    let placed = |r: &Reservation| r.rows.iter().map(|w| (w.block, w.page)).collect::<Vec<_>>();
    assert_eq!(
        (r.boundary, placed(&r), &r.keys),
        (f.boundary, placed(&f), &f.keys)
    );
    assert_eq!(r.rows.len(), r.destinations.len());
    assert_eq!(
        r.destinations.iter().map(|h| h.addr()).collect::<Vec<_>>(),
        f.destinations.iter().map(|h| h.addr()).collect::<Vec<_>>()
    );
    // Abandoned: both lists come back, every reference given back first.
    c.abandon(r).unwrap();
    assert_eq!(c.spare_reservation_lists(), (1, 1));
    assert!(group_blocks(&c, &q, 0, 96)
        .iter()
        .all(|b| c.host().refs(*b) == 0));
}
