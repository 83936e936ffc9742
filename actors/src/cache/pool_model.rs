//! The Host `BlockPool` against a model of what it promises, step by step: which entries
//! exist and are published, their references, the LRU order eviction follows, the slots and
//! Host ranges handed out, the slots the free hook sees, the withdrawn count and every error.
//! Random sequences over two groups (and a group that does not exist) with few hashes, so
//! that full groups, evictions, reused slots and stale held references all occur.
//!
//! The model keeps per entry its slot (as the pool answered it at allocation), references,
//! pins and published flag, and per group the LRU list of unreferenced, unpinned published
//! entries, least recent first. It predicts no slot number except the evicted victim's.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const CAPS: [u32; 2] = [3, 4];
const BYTES: [u64; 2] = [64, 48];
const HASHES: u128 = 7;

#[derive(Clone, Copy, Debug)]
struct Entry {
    slot: u32,
    refs: u32,
    pins: u32,
    published: bool,
}

#[derive(Default)]
struct GroupModel {
    entries: HashMap<u128, Entry>,
    /// Evictable entries, least recently used first.
    lru: Vec<u128>,
    withdrawn: u64,
}

struct Model {
    groups: Vec<GroupModel>,
    /// (group, slot) the free hook must see for the step, in any order.
    freed: Vec<(u32, u32)>,
}

fn base(g: usize) -> u64 {
    (0..g).map(|i| BYTES[i] * CAPS[i] as u64).sum()
}

fn range(g: usize, slot: u32) -> HostRange {
    HostRange::new(base(g) + slot as u64 * BYTES[g], BYTES[g])
}

fn unknown(g: u32) -> PoolError {
    PoolError::Unknown {
        tier: Host::NAME,
        group: g,
    }
}

impl Model {
    fn group(&mut self, g: u32) -> Result<&mut GroupModel, PoolError> {
        self.groups.get_mut(g as usize).ok_or(PoolError::NoGroup {
            tier: Host::NAME,
            group: g,
        })
    }

    fn entry(&mut self, g: u32, h: u128) -> Result<&mut Entry, PoolError> {
        self.group(g)?.entries.get_mut(&h).ok_or(unknown(g))
    }

    /// The entry's references or pins changed: an unreferenced, unpinned entry goes to the
    /// LRU's most recent end (published) or is freed (unpublished).
    fn settle(&mut self, g: u32, h: u128) {
        let gm = &mut self.groups[g as usize];
        let e = gm.entries[&h];
        if e.refs != 0 || e.pins != 0 {
            return;
        }
        if e.published {
            gm.lru.push(h);
        } else {
            gm.entries.remove(&h);
            self.freed.push((g, e.slot));
        }
    }

    /// `release` (references) or `unpin` (pins): one fewer, then settled; an entry with
    /// none is not referenced.
    fn drop_one(
        &mut self,
        g: u32,
        h: u128,
        count: impl Fn(&mut Entry) -> &mut u32,
    ) -> Result<(), PoolError> {
        let n = count(self.entry(g, h)?);
        if *n == 0 {
            return Err(PoolError::NotReferenced {
                tier: Host::NAME,
                group: g,
            });
        }
        *n -= 1;
        self.settle(g, h);
        Ok(())
    }

    /// An evictable entry becomes the most recently used.
    fn touch(&mut self, g: u32, h: u128) {
        if let Some(gm) = self.groups.get_mut(g as usize) {
            if let Some(p) = gm.lru.iter().position(|x| *x == h) {
                gm.lru.remove(p);
                gm.lru.push(h);
            }
        }
    }

    fn unlink(&mut self, g: u32, h: u128) {
        self.groups[g as usize].lru.retain(|x| *x != h);
    }

    /// Removes an evictable entry (it leaves the LRU and the pool): a withdrawal.
    fn evict(&mut self, g: u32, h: u128) -> Entry {
        self.unlink(g, h);
        let gm = &mut self.groups[g as usize];
        let e = gm.entries.remove(&h).expect("an LRU entry exists");
        gm.withdrawn += 1;
        self.freed.push((g, e.slot));
        e
    }

    /// `allocate`: the slot is the pool's answer, checked here: free (no live entry holds
    /// it), inside the group, and the victim's when one was evicted.
    fn allocate(
        &mut self,
        g: u32,
        h: u128,
        got: &Result<(u32, Option<ContentHash>), PoolError>,
    ) -> Result<Option<u128>, PoolError> {
        let gm = self.group(g)?;
        if gm.entries.contains_key(&h) {
            return Err(PoolError::AlreadyPresent {
                tier: Host::NAME,
                group: g,
            });
        }
        let full = gm.entries.len() as u32 >= CAPS[g as usize];
        let victim = if full {
            let Some(&v) = gm.lru.first() else {
                return Err(PoolError::Full {
                    tier: Host::NAME,
                    group: g,
                });
            };
            Some((v, self.evict(g, v)))
        } else {
            None
        };
        let Ok((slot, _)) = got else {
            panic!("the model allocates, the pool refused: {got:?}");
        };
        let gm = &mut self.groups[g as usize];
        assert!(*slot < CAPS[g as usize], "slot {slot} inside the group");
        assert!(
            gm.entries.values().all(|e| e.slot != *slot),
            "slot {slot} is free"
        );
        if let Some((_, v)) = victim {
            assert_eq!(*slot, v.slot, "the evicted block's slot is reused");
        }
        gm.entries.insert(
            h,
            Entry {
                slot: *slot,
                refs: 1,
                pins: 0,
                published: false,
            },
        );
        Ok(victim.map(|(v, _)| v))
    }
}

#[derive(Clone, Debug)]
enum Step {
    Allocate(u32, u128),
    AllocateHeld(u32, u128),
    Publish(u32, u128),
    PublishHeld(usize),
    Release(u32, u128),
    ReleaseHeld(usize),
    Acquire(u32, u128),
    AcquirePublished(u32, u128),
    /// A PUT source by the slot last seen: the model's slot of the entry, or a raw one.
    AcquirePageAt(u32, u128, Option<u32>, u32),
    Pin(u32, u128),
    Unpin(u32, u128),
    Touch(u32, u128),
    Evict(u32, u128),
    EvictLru(u32, usize),
    InsertPublished(u32, u128),
    Clear,
}

fn addr_strategy() -> impl Strategy<Value = (u32, u128)> {
    (prop_oneof![8 => 0u32..2, 1 => Just(2u32)], 0..HASHES)
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => addr_strategy().prop_map(|(g, h)| Step::Allocate(g, h)),
        4 => addr_strategy().prop_map(|(g, h)| Step::AllocateHeld(g, h)),
        4 => addr_strategy().prop_map(|(g, h)| Step::Publish(g, h)),
        3 => (0usize..8).prop_map(Step::PublishHeld),
        5 => addr_strategy().prop_map(|(g, h)| Step::Release(g, h)),
        4 => (0usize..8).prop_map(Step::ReleaseHeld),
        2 => addr_strategy().prop_map(|(g, h)| Step::Acquire(g, h)),
        3 => addr_strategy().prop_map(|(g, h)| Step::AcquirePublished(g, h)),
        2 => (addr_strategy(), proptest::option::of(0u32..6), 0u32..2)
            .prop_map(|((g, h), s, p)| Step::AcquirePageAt(g, h, s, p)),
        2 => addr_strategy().prop_map(|(g, h)| Step::Pin(g, h)),
        2 => addr_strategy().prop_map(|(g, h)| Step::Unpin(g, h)),
        2 => addr_strategy().prop_map(|(g, h)| Step::Touch(g, h)),
        2 => addr_strategy().prop_map(|(g, h)| Step::Evict(g, h)),
        1 => (0u32..3, 0usize..4).prop_map(|(g, n)| Step::EvictLru(g, n)),
        3 => addr_strategy().prop_map(|(g, h)| Step::InsertPublished(g, h)),
        1 => Just(Step::Clear),
    ]
}

fn a(g: u32, h: u128) -> BlockAddr {
    BlockAddr::new(g as usize, ContentHash::from_u128(h))
}

/// Everything the pool shows about every address, against the model.
fn observe(pool: &BlockPool<Host>, m: &Model) {
    let mut withdrawn = 0;
    for (g, gm) in m.groups.iter().enumerate() {
        withdrawn += gm.withdrawn;
        let published = pool.published_in(g);
        for h in 0..HASHES {
            let addr = a(g as u32, h);
            let e = gm.entries.get(&h);
            let state = e.map(|e| {
                if e.published {
                    EntryState::Published
                } else {
                    EntryState::Unpublished
                }
            });
            assert_eq!(pool.state(addr), state, "state of {g}/{h}");
            assert_eq!(pool.contains(addr), state == Some(EntryState::Published));
            assert_eq!(published(ContentHash::from_u128(h)), pool.contains(addr));
            assert_eq!(pool.refs(addr), e.map_or(0, |e| e.refs), "refs of {g}/{h}");
            match e {
                Some(e) => {
                    assert_eq!(pool.slot_index(addr), Ok(e.slot));
                    assert_eq!(pool.host_range(addr), Ok(range(g, e.slot)));
                    let page = BYTES[g] / 2;
                    assert_eq!(
                        pool.page_range(addr, 1, page),
                        Ok(HostRange::new(range(g, e.slot).offset + page, page))
                    );
                }
                None => assert_eq!(pool.slot_index(addr), Err(unknown(g as u32))),
            }
        }
        assert_eq!(pool.len(g as u32), gm.entries.len(), "entries of group {g}");
        let available = CAPS[g] as u64 - gm.entries.len() as u64 + gm.lru.len() as u64;
        assert_eq!(
            pool.available(g as u32),
            available,
            "available in group {g}"
        );
    }
    assert_eq!(pool.len(2), 0);
    assert_eq!(pool.available(2), 0);
    assert_eq!(pool.withdrawn(), withdrawn);
    assert_eq!(
        pool.is_empty(),
        m.groups.iter().all(|g| g.entries.is_empty())
    );
}

/// Runs `steps` on a pool and the model side by side.
fn run(steps: &[Step]) {
    let mut pool = BlockPool::<Host>::new(&CAPS, &BYTES);
    let seen: Arc<Mutex<Vec<(u32, u32, HostRange)>>> = Arc::default();
    let hook = seen.clone();
    pool.set_free_hook(Arc::new(move |g, s, r| {
        hook.lock().expect("hook lock").push((g, s, r))
    }));
    assert_eq!(pool.region_bytes(), base(2));
    let mut m = Model {
        groups: vec![GroupModel::default(), GroupModel::default()],
        freed: vec![],
    };
    let mut held: Vec<HeldBlock<Host>> = vec![];
    for (i, st) in steps.iter().enumerate() {
        let ctx = format!("step {i}: {st:?}");
        match *st {
            Step::Allocate(g, h) | Step::AllocateHeld(g, h) => {
                let (got, handle) = if matches!(st, Step::Allocate(..)) {
                    let got = pool.allocate(a(g, h));
                    let slot = got.as_ref().ok().map(|_| {
                        pool.slot_index(a(g, h))
                            .expect("an allocated entry has a slot")
                    });
                    (got.map(|ev| (slot.unwrap_or(u32::MAX), ev)), None)
                } else {
                    match pool.allocate_held(a(g, h)) {
                        Ok((ev, hb, r)) => {
                            let s = pool.slot_index(a(g, h)).expect("a slot");
                            assert_eq!(r, range(g as usize, s), "{ctx}");
                            assert_eq!(hb.addr(), a(g, h));
                            (Ok((s, ev)), Some(hb))
                        }
                        Err(e) => (Err(e), None),
                    }
                };
                let want = m.allocate(g, h, &got);
                match (&got, want) {
                    (Ok((_, ev)), Ok(victim)) => {
                        let want_ev = victim.map(ContentHash::from_u128);
                        assert_eq!(*ev, want_ev, "{ctx}: the least recent block is evicted");
                    }
                    (Err(e), Err(w)) => assert_eq!(*e, w, "{ctx}"),
                    (got, want) => panic!("{ctx}: pool {got:?}, model {want:?}"),
                }
                held.extend(handle);
            }
            Step::Publish(g, h) => {
                let want = m.entry(g, h).and_then(|e| {
                    if e.published {
                        Err(PoolError::AlreadyPublished {
                            tier: Host::NAME,
                            group: g,
                        })
                    } else {
                        e.published = true;
                        Ok(e.slot)
                    }
                });
                if want.is_ok() {
                    m.settle(g, h);
                }
                assert_eq!(pool.publish(a(g, h)), want, "{ctx}");
            }
            Step::PublishHeld(i) | Step::ReleaseHeld(i) => {
                if held.is_empty() {
                    continue;
                }
                let i = i % held.len();
                let (g, h) = (held[i].addr().group, held[i].addr().hash.as_u128());
                let slot = pool_slot_of(&held[i]);
                // The handle still names its entry while the slot holds it with a reference.
                let valid = m
                    .groups
                    .get(g as usize)
                    .and_then(|gm| gm.entries.get(&h))
                    .is_some_and(|e| e.slot == slot && e.refs > 0);
                if matches!(st, Step::PublishHeld(_)) {
                    let want = if !valid {
                        Err(unknown(g))
                    } else if m.groups[g as usize].entries[&h].published {
                        Err(PoolError::AlreadyPublished {
                            tier: Host::NAME,
                            group: g,
                        })
                    } else {
                        m.entry(g, h).expect("valid").published = true;
                        m.settle(g, h);
                        Ok(())
                    };
                    assert_eq!(pool.publish_held(&held[i]), want, "{ctx}");
                } else {
                    let hb = held.swap_remove(i);
                    let want = if valid {
                        m.entry(g, h).expect("valid").refs -= 1;
                        m.settle(g, h);
                        Ok(())
                    } else {
                        Err(unknown(g))
                    };
                    assert_eq!(pool.release_held(hb), want, "{ctx}");
                }
            }
            Step::Release(g, h) => {
                let want = m.drop_one(g, h, |e| &mut e.refs);
                assert_eq!(pool.release(a(g, h)), want, "{ctx}");
            }
            Step::Acquire(g, h) => {
                let want = m.entry(g, h).map(|e| e.refs += 1);
                if want.is_ok() {
                    m.unlink(g, h);
                }
                assert_eq!(pool.acquire(a(g, h)), want, "{ctx}");
            }
            Step::AcquirePublished(g, h) | Step::AcquirePageAt(g, h, ..) => {
                let entry = m
                    .groups
                    .get(g as usize)
                    .and_then(|gm| gm.entries.get(&h))
                    .copied();
                let (got, want_slot) = match *st {
                    Step::AcquirePageAt(_, _, raw, page) => {
                        let slot = raw.or(entry.map(|e| e.slot)).unwrap_or(0);
                        let page_bytes = BYTES.get(g as usize).map_or(8, |b| b / 2);
                        let got = pool.acquire_published_page_at(a(g, h), slot, page, page_bytes);
                        if let Ok((_, r)) = &got {
                            let block = range(g as usize, slot);
                            assert_eq!(
                                *r,
                                HostRange::new(block.offset + page as u64 * page_bytes, page_bytes),
                                "{ctx}: the page's range"
                            );
                        }
                        let ok = entry.is_some_and(|e| e.published && e.slot == slot);
                        (got.map(|(hb, _)| hb), ok.then_some(slot))
                    }
                    _ => {
                        let got = pool.acquire_published(a(g, h));
                        if let (Ok((_, r)), Some(e)) = (&got, entry) {
                            assert_eq!(*r, range(g as usize, e.slot), "{ctx}");
                        }
                        let ok = entry.filter(|e| e.published).map(|e| e.slot);
                        (got.map(|(hb, _)| hb), ok)
                    }
                };
                match (got, want_slot) {
                    (Ok(hb), Some(slot)) => {
                        assert_eq!(pool_slot_of(&hb), slot, "{ctx}");
                        m.unlink(g, h);
                        m.entry(g, h).expect("published").refs += 1;
                        held.push(hb);
                    }
                    (Err(e), None) => assert_eq!(e, unknown(g), "{ctx}"),
                    (got, want) => panic!("{ctx}: pool {got:?}, model slot {want:?}"),
                }
            }
            Step::Pin(g, h) => {
                let want = m.entry(g, h).map(|e| e.pins += 1);
                if want.is_ok() {
                    m.unlink(g, h);
                }
                assert_eq!(pool.pin(a(g, h)), want, "{ctx}");
            }
            Step::Unpin(g, h) => {
                let want = m.drop_one(g, h, |e| &mut e.pins);
                assert_eq!(pool.unpin(a(g, h)), want, "{ctx}");
            }
            Step::Touch(g, h) => {
                m.touch(g, h);
                pool.touch(a(g, h));
            }
            Step::Evict(g, h) => {
                let evictable = m
                    .groups
                    .get(g as usize)
                    .is_some_and(|gm| gm.lru.contains(&h));
                if evictable {
                    m.evict(g, h);
                }
                assert_eq!(pool.evict(a(g, h)), evictable, "{ctx}");
            }
            Step::EvictLru(g, n) => {
                let mut want = vec![];
                while want.len() < n {
                    let Some(&v) = m.groups.get(g as usize).and_then(|gm| gm.lru.first()) else {
                        break;
                    };
                    m.evict(g, v);
                    want.push(ContentHash::from_u128(v));
                }
                assert_eq!(pool.evict_lru(g, n), want, "{ctx}");
            }
            Step::InsertPublished(g, h) => {
                let state = m
                    .groups
                    .get(g as usize)
                    .and_then(|gm| gm.entries.get(&h))
                    .map(|e| e.published);
                let mut evicted = vec![];
                let got = pool.insert_published(a(g, h), &mut evicted);
                match state {
                    Some(true) => {
                        assert_eq!(got, Ok(false), "{ctx}");
                        m.touch(g, h);
                    }
                    Some(false) => assert_eq!(
                        got,
                        Err(PoolError::AlreadyPresent {
                            tier: Host::NAME,
                            group: g
                        }),
                        "{ctx}"
                    ),
                    None => {
                        let slot = pool.slot_index(a(g, h));
                        let alloc = match (&got, slot) {
                            (Ok(_), Ok(s)) => Ok((s, None)),
                            (Err(e), _) => Err(e.clone()),
                            (Ok(_), Err(e)) => panic!("{ctx}: inserted, no slot: {e:?}"),
                        };
                        match m.allocate(g, h, &alloc) {
                            Ok(victim) => {
                                assert_eq!(got, Ok(true), "{ctx}");
                                let want_ev = victim.map(ContentHash::from_u128);
                                assert_eq!(evicted, want_ev.into_iter().collect::<Vec<_>>());
                                let e = m.entry(g, h).expect("allocated");
                                e.published = true;
                                e.refs = 0;
                                m.settle(g, h);
                            }
                            Err(w) => {
                                assert_eq!(got, Err(w), "{ctx}");
                                assert!(evicted.is_empty());
                            }
                        }
                    }
                }
            }
            Step::Clear => {
                let mut kept = 0;
                for g in 0..m.groups.len() as u32 {
                    while let Some(&v) = m.groups[g as usize].lru.first() {
                        m.evict(g, v);
                    }
                    let gm = &mut m.groups[g as usize];
                    for e in gm.entries.values_mut() {
                        kept += 1;
                        if e.published {
                            e.published = false;
                            gm.withdrawn += 1;
                        }
                    }
                }
                assert_eq!(pool.clear(), kept, "{ctx}");
            }
        }
        let mut freed = std::mem::take(&mut *seen.lock().expect("hook lock"));
        for (g, s, r) in &freed {
            assert_eq!(*r, range(*g as usize, *s), "{ctx}: the freed slot's range");
        }
        let mut freed: Vec<(u32, u32)> = freed.drain(..).map(|(g, s, _)| (g, s)).collect();
        freed.sort();
        m.freed.sort();
        assert_eq!(freed, std::mem::take(&mut m.freed), "{ctx}: freed slots");
        observe(&pool, &m);
    }
}

/// The slot a held reference names (a private field, read here as the pool's child module).
fn pool_slot_of(h: &HeldBlock<Host>) -> u32 {
    h.slot
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_host_pool_keeps_every_promise_of_its_model(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        run(&steps);
    }
}

#[test]
fn a_full_group_evicts_its_least_recent_block_and_reuses_its_slot() {
    use Step::*;
    // Three published blocks in a group of three, the first touched: the second is the
    // least recent, so a fourth allocation evicts it and takes its slot.
    run(&[
        InsertPublished(0, 1),
        InsertPublished(0, 2),
        InsertPublished(0, 3),
        Touch(0, 1),
        Allocate(0, 4),
        Publish(0, 4),
        Pin(0, 3),
        EvictLru(0, 4),
        Unpin(0, 3),
        Clear,
    ]);
}

#[test]
fn held_references_are_equal_only_for_the_same_block_in_the_same_slot() {
    let (x, y) = (a(0, 1), a(0, 2));
    assert_eq!(HeldBlock::<Host>::new(x, 0), HeldBlock::new(x, 0));
    assert_ne!(
        HeldBlock::<Host>::new(x, 0),
        HeldBlock::new(x, 1),
        "another slot"
    );
    assert_ne!(
        HeldBlock::<Host>::new(x, 0),
        HeldBlock::new(y, 0),
        "another block"
    );
    assert_ne!(
        HeldBlock::<Host>::new(x, 0),
        HeldBlock::new(y, 1),
        "neither"
    );
}
