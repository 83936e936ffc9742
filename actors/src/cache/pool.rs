//! Device and Host block pools: one slot array per cache group, blocks addressed by
//! (group, content hash), reference counts, temporary pins, LRU eviction of unreferenced
//! published blocks, and published versus unpublished entries. A reference taken as a
//! `HeldBlock` keeps its slot, so the holder publishes or releases it without probing the
//! index for the slot again (a held slot can be neither freed nor reused).
//!
//! Only published entries are visible to probes. Eviction must never free a block that any
//! reference holds (storage I/O, Ready hold, H2D ticket) or that a temporary warm pin holds
//! during a reservation. The Host pool hands out Host offsets (region base + slot index *
//! block bytes) for the L3 executor to GET into or PUT from; it never touches the bytes.

use super::keys::{BlockAddr, BuildContentHasher, ContentHash};
use messages::HostRange;
use std::collections::HashMap;
use std::marker::PhantomData;
use thiserror::Error;

/// A pool tier marker.
pub trait Tier {
    const NAME: &'static str;
}

/// Device L1 blocks.
#[derive(Clone, Copy, Debug)]
pub struct Device;
/// Pinned Host L2 blocks.
#[derive(Clone, Copy, Debug)]
pub struct Host;

impl Tier for Device {
    const NAME: &'static str = "device";
}
impl Tier for Host {
    const NAME: &'static str = "host";
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PoolError {
    #[error("{tier} group {group}: block already present")]
    AlreadyPresent { tier: &'static str, group: u32 },
    #[error("{tier} group {group}: no free or evictable slot")]
    Full { tier: &'static str, group: u32 },
    #[error("{tier} group {group}: unknown block")]
    Unknown { tier: &'static str, group: u32 },
    #[error("{tier} group {group}: block is not referenced")]
    NotReferenced { tier: &'static str, group: u32 },
    #[error("{tier} group {group}: block is already published")]
    AlreadyPublished { tier: &'static str, group: u32 },
    #[error("{tier}: no group {group}")]
    NoGroup { tier: &'static str, group: u32 },
}

/// Whether an entry is visible to probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryState {
    /// Allocated as a destination (GET or D2H) whose data is not yet valid.
    Unpublished,
    /// Valid data, visible to probes.
    Published,
}

const NIL: u32 = u32::MAX;
/// Index values carry the published bit beside the slot number, so a probe costs one
/// lookup and no slot read.
const PUBLISHED: u32 = 1 << 31;
const SLOT_MASK: u32 = PUBLISHED - 1;
/// The most slots a group may have (slot numbers must fit under the published bit).
pub const MAX_GROUP_SLOTS: u32 = SLOT_MASK;
/// Slots (and index entries) a group reserves when it is made, so that filling a pool
/// never rehashes its index or moves its slots inside a round (`bench scheduler`'s loaded
/// pair, callgrind: 26 rehashes, 4.9M instructions over 200 rounds); a larger group grows
/// past this on demand.
const RESERVED_SLOTS: u32 = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Slot {
    hash: ContentHash,
    refs: u32,
    pins: u32,
    prev: u32,
    next: u32,
    state: Option<EntryState>,
}

impl Slot {
    const EMPTY: Slot = Slot {
        hash: ContentHash::ROOT,
        refs: 0,
        pins: 0,
        prev: NIL,
        next: NIL,
        state: None,
    };
}

/// One reference on a block of a `BlockPool<T>`, with the slot it holds: made only by the
/// pool as it takes the reference, and given back to it (`publish_held`, `release_held`)
/// instead of the block's address, so no index probe finds the slot again. Neither Copy
/// nor Clone: each handle is one reference. While it is held the slot keeps its block
/// (a referenced slot is never freed or reused), which `release_held` checks.
pub struct HeldBlock<T: Tier> {
    addr: BlockAddr,
    slot: u32,
    _tier: PhantomData<T>,
}

impl<T: Tier> HeldBlock<T> {
    fn new(addr: BlockAddr, slot: u32) -> Self {
        Self {
            addr,
            slot,
            _tier: PhantomData,
        }
    }

    /// The block this reference holds.
    pub fn addr(&self) -> BlockAddr {
        self.addr
    }
}

impl<T: Tier> std::fmt::Debug for HeldBlock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HeldBlock<{}>({:?}, slot {})",
            T::NAME,
            self.addr,
            self.slot
        )
    }
}

impl<T: Tier> PartialEq for HeldBlock<T> {
    fn eq(&self, other: &Self) -> bool {
        self.addr == other.addr && self.slot == other.slot
    }
}

impl<T: Tier> Eq for HeldBlock<T> {}

/// Called with (group, slot index, the slot's region range) whenever the pool frees a block
/// (its last reference and pin are gone): the debug builds' poisoned-memory checker fills
/// it (crate::host::poison).
pub type FreeFn = dyn Fn(u32, u32, HostRange) + Send + Sync;

#[derive(Clone, Default)]
pub struct FreeHook(Option<std::sync::Arc<FreeFn>>);

impl std::fmt::Debug for FreeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "FreeHook(set)"
        } else {
            "FreeHook(none)"
        })
    }
}

#[derive(Clone, Debug)]
struct GroupPool {
    index: HashMap<ContentHash, u32, BuildContentHasher>,
    slots: Vec<Slot>,
    capacity: u32,
    free: Vec<u32>,
    /// LRU list of unreferenced, unpinned, published slots (head = least recent).
    head: u32,
    tail: u32,
    lru_len: u32,
    block_bytes: u64,
    region_base: u64,
    group: u32,
    on_free: FreeHook,
    /// Published entries that stopped being published (evicted, freed or hidden by a
    /// clear): a probe answer "published" may have changed only when this moved.
    withdrawn: u64,
}

impl GroupPool {
    /// The ledger of a freed slot: nothing may hold it, then the free hook sees its range.
    fn freed(&self, s: u32) {
        let slot = &self.slots[s as usize];
        assert!(
            slot.refs == 0 && slot.pins == 0,
            "pool ledger: slot {s} freed while held ({} refs, {} pins)",
            slot.refs,
            slot.pins
        );
        if let Some(hook) = &self.on_free.0 {
            hook(
                self.group,
                s,
                HostRange::new(
                    self.region_base + s as u64 * self.block_bytes,
                    self.block_bytes,
                ),
            );
        }
    }

    fn unlink(&mut self, s: u32) {
        let (p, n) = (self.slots[s as usize].prev, self.slots[s as usize].next);
        if p == NIL {
            self.head = n;
        } else {
            self.slots[p as usize].next = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.slots[n as usize].prev = p;
        }
        self.slots[s as usize].prev = NIL;
        self.slots[s as usize].next = NIL;
        self.lru_len -= 1;
    }

    fn push_mru(&mut self, s: u32) {
        self.slots[s as usize].prev = self.tail;
        self.slots[s as usize].next = NIL;
        if self.tail == NIL {
            self.head = s;
        } else {
            self.slots[self.tail as usize].next = s;
        }
        self.tail = s;
        self.lru_len += 1;
    }

    /// One more reference on slot `s` (a referenced entry is never evictable).
    fn take_ref(&mut self, s: u32) {
        if self.in_lru(s) {
            self.unlink(s);
        }
        self.slots[s as usize].refs += 1;
    }

    fn in_lru(&self, s: u32) -> bool {
        let slot = &self.slots[s as usize];
        slot.state == Some(EntryState::Published) && slot.refs == 0 && slot.pins == 0
    }

    fn available(&self) -> u64 {
        (self.capacity as u64 - self.slots.len() as u64)
            + self.free.len() as u64
            + self.lru_len as u64
    }

    /// Empties slot `s` (nothing may hold it): the free hook sees it, its entry leaves the
    /// index (a published one counts as withdrawn). Returns the hash it carried.
    fn vacate(&mut self, s: u32) -> ContentHash {
        self.freed(s);
        let slot = std::mem::replace(&mut self.slots[s as usize], Slot::EMPTY);
        if slot.state == Some(EntryState::Published) {
            self.withdrawn += 1;
        }
        self.index.remove(&slot.hash);
        slot.hash
    }

    fn free_slot(&mut self, s: u32) {
        self.vacate(s);
        self.free.push(s);
    }

    /// Drops the slot's entry when nothing holds it any more (unpublished) or moves it into
    /// the LRU list (published).
    fn settle(&mut self, s: u32) {
        let slot = self.slots[s as usize];
        if slot.refs != 0 || slot.pins != 0 {
            return;
        }
        match slot.state {
            Some(EntryState::Published) => self.push_mru(s),
            Some(EntryState::Unpublished) => self.free_slot(s),
            None => {}
        }
    }

    /// A free slot, or the least recently used unreferenced block's (evicted: its hash).
    fn take_slot(&mut self) -> Option<(u32, Option<ContentHash>)> {
        if let Some(s) = self.free.pop() {
            return Some((s, None));
        }
        if (self.slots.len() as u64) < self.capacity as u64 {
            self.slots.push(Slot::EMPTY);
            return Some((self.slots.len() as u32 - 1, None));
        }
        let victim = self.head;
        if victim == NIL {
            return None;
        }
        self.unlink(victim);
        Some((victim, Some(self.vacate(victim))))
    }
}

/// A pool of blocks of one tier.
#[derive(Clone, Debug)]
pub struct BlockPool<T: Tier> {
    groups: Vec<GroupPool>,
    _tier: PhantomData<T>,
}

impl<T: Tier> BlockPool<T> {
    /// A pool with `capacities[g]` slots of `block_bytes[g]` bytes for each group (at most
    /// `MAX_GROUP_SLOTS`); group regions are laid out one after the other.
    pub fn new(capacities: &[u32], block_bytes: &[u64]) -> Self {
        let mut base = 0u64;
        let groups = capacities
            .iter()
            .zip(block_bytes)
            .enumerate()
            .map(|(group, (&capacity, &bytes))| {
                let capacity = capacity.min(MAX_GROUP_SLOTS);
                let reserved = capacity.min(RESERVED_SLOTS) as usize;
                let g = GroupPool {
                    index: HashMap::with_capacity_and_hasher(reserved, BuildContentHasher),
                    slots: Vec::with_capacity(reserved),
                    capacity,
                    free: Vec::new(),
                    head: NIL,
                    tail: NIL,
                    lru_len: 0,
                    block_bytes: bytes,
                    region_base: base,
                    group: group as u32,
                    on_free: FreeHook::default(),
                    withdrawn: 0,
                };
                base = base.saturating_add(bytes.saturating_mul(capacity as u64));
                g
            })
            .collect();
        Self {
            groups,
            _tier: PhantomData,
        }
    }

    /// Calls `hook` for every block this pool frees from now on.
    pub fn set_free_hook(&mut self, hook: std::sync::Arc<FreeFn>) {
        for g in &mut self.groups {
            g.on_free = FreeHook(Some(hook.clone()));
        }
    }

    fn group(&self, group: u32) -> Result<&GroupPool, PoolError> {
        self.groups.get(group as usize).ok_or(PoolError::NoGroup {
            tier: T::NAME,
            group,
        })
    }

    fn group_mut(&mut self, group: u32) -> Result<&mut GroupPool, PoolError> {
        self.groups
            .get_mut(group as usize)
            .ok_or(PoolError::NoGroup {
                tier: T::NAME,
                group,
            })
    }

    fn slot_of(&self, addr: BlockAddr) -> Result<u32, PoolError> {
        let g = self.group(addr.group)?;
        g.index
            .get(&addr.hash)
            .map(|v| v & SLOT_MASK)
            .ok_or(PoolError::Unknown {
                tier: T::NAME,
                group: addr.group,
            })
    }

    /// Total bytes of every group region.
    pub fn region_bytes(&self) -> u64 {
        self.groups
            .iter()
            .map(|g| g.block_bytes.saturating_mul(g.capacity as u64))
            .fold(0u64, |a, b| a.saturating_add(b))
    }

    /// The slot index of an entry within its group's region (device slot tables use it).
    pub fn slot_index(&self, addr: BlockAddr) -> Result<u32, PoolError> {
        self.slot_of(addr)
    }

    /// Whether a published entry exists (what probes see).
    pub fn contains(&self, addr: BlockAddr) -> bool {
        self.state(addr) == Some(EntryState::Published)
    }

    /// `contains` for many blocks of group `g`: the group is resolved once, and each call
    /// of the returned test is one index probe (false for every hash of an unknown group).
    pub fn published_in(&self, g: usize) -> impl Fn(ContentHash) -> bool + '_ {
        let index = self.groups.get(g).map(|p| &p.index);
        move |h| {
            index
                .and_then(|i| i.get(&h))
                .is_some_and(|v| v & PUBLISHED != 0)
        }
    }

    /// How many entries have stopped being published since the pool was made (evicted,
    /// freed, or hidden by `clear`): while it stays the same, every hash a probe found
    /// published is still published.
    pub fn withdrawn(&self) -> u64 {
        self.groups.iter().map(|g| g.withdrawn).sum()
    }

    /// The entry's state, published or not.
    pub fn state(&self, addr: BlockAddr) -> Option<EntryState> {
        let g = self.groups.get(addr.group as usize)?;
        let v = *g.index.get(&addr.hash)?;
        Some(if v & PUBLISHED != 0 {
            EntryState::Published
        } else {
            EntryState::Unpublished
        })
    }

    /// References held on the entry (0 when absent).
    pub fn refs(&self, addr: BlockAddr) -> u32 {
        self.slot_of(addr)
            .map(|s| self.groups[addr.group as usize].slots[s as usize].refs)
            .unwrap_or(0)
    }

    /// Entries (published and unpublished) of a group.
    pub fn len(&self, group: u32) -> usize {
        self.groups.get(group as usize).map_or(0, |g| g.index.len())
    }

    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(|g| g.index.is_empty())
    }

    /// Slots of a group that an allocation could use now: free, never used, or evictable.
    pub fn available(&self, group: u32) -> u64 {
        self.groups.get(group as usize).map_or(0, |g| g.available())
    }

    /// Allocates an unpublished entry holding one reference (the caller's). May evict the
    /// least recently used unreferenced block (at most one): its hash is returned.
    pub fn allocate(&mut self, addr: BlockAddr) -> Result<Option<ContentHash>, PoolError> {
        self.allocate_slot(addr).map(|(_, evicted)| evicted)
    }

    /// `allocate`, also giving the new entry's slot.
    fn allocate_slot(&mut self, addr: BlockAddr) -> Result<(u32, Option<ContentHash>), PoolError> {
        let g = self.group_mut(addr.group)?;
        if g.index.contains_key(&addr.hash) {
            return Err(PoolError::AlreadyPresent {
                tier: T::NAME,
                group: addr.group,
            });
        }
        let (s, evicted) = g.take_slot().ok_or(PoolError::Full {
            tier: T::NAME,
            group: addr.group,
        })?;
        g.slots[s as usize] = Slot {
            hash: addr.hash,
            refs: 1,
            pins: 0,
            prev: NIL,
            next: NIL,
            state: Some(EntryState::Unpublished),
        };
        g.index.insert(addr.hash, s);
        Ok((s, evicted))
    }

    /// Publishes an unpublished entry: it becomes visible to probes. References stay.
    pub fn publish(&mut self, addr: BlockAddr) -> Result<u32, PoolError> {
        let s = self.slot_of(addr)?;
        let g = &mut self.groups[addr.group as usize];
        let slot = &mut g.slots[s as usize];
        if slot.state == Some(EntryState::Published) {
            return Err(PoolError::AlreadyPublished {
                tier: T::NAME,
                group: addr.group,
            });
        }
        slot.state = Some(EntryState::Published);
        if let Some(v) = g.index.get_mut(&addr.hash) {
            *v |= PUBLISHED;
        }
        g.settle(s);
        Ok(s)
    }

    /// Inserts a published, unreferenced block (computed on Device, or a D2H copy), or
    /// refreshes its recency when already published. Returns whether it was new.
    pub fn insert_published(
        &mut self,
        addr: BlockAddr,
        evicted: &mut Vec<ContentHash>,
    ) -> Result<bool, PoolError> {
        match self.state(addr) {
            Some(EntryState::Published) => {
                self.touch(addr);
                Ok(false)
            }
            Some(EntryState::Unpublished) => Err(PoolError::AlreadyPresent {
                tier: T::NAME,
                group: addr.group,
            }),
            None => {
                evicted.extend(self.allocate(addr)?);
                self.publish(addr)?;
                self.release(addr)?;
                Ok(true)
            }
        }
    }

    /// Takes one reference (I/O source or destination, Ready hold, H2D ticket).
    pub fn acquire(&mut self, addr: BlockAddr) -> Result<(), PoolError> {
        let s = self.slot_of(addr)?;
        self.groups[addr.group as usize].take_ref(s);
        Ok(())
    }

    /// Drops one reference; an unreferenced unpublished entry is freed, an unreferenced
    /// published one becomes evictable (most recently used).
    pub fn release(&mut self, addr: BlockAddr) -> Result<(), PoolError> {
        let s = self.slot_of(addr)?;
        let g = &mut self.groups[addr.group as usize];
        if g.slots[s as usize].refs == 0 {
            return Err(PoolError::NotReferenced {
                tier: T::NAME,
                group: addr.group,
            });
        }
        g.slots[s as usize].refs -= 1;
        g.settle(s);
        Ok(())
    }

    /// The slot a held reference names, checked: the slot still carries the block and a
    /// reference (always, while the handle was made by this pool and not yet released).
    fn held_slot(&self, h: &HeldBlock<T>) -> Result<u32, PoolError> {
        let g = self.group(h.addr.group)?;
        match g.slots.get(h.slot as usize) {
            Some(slot) if slot.hash == h.addr.hash && slot.state.is_some() && slot.refs > 0 => {
                Ok(h.slot)
            }
            _ => Err(PoolError::Unknown {
                tier: T::NAME,
                group: h.addr.group,
            }),
        }
    }

    /// `release` of a held reference, without an index probe (an unpublished entry's free
    /// still removes its index entry).
    pub fn release_held(&mut self, h: HeldBlock<T>) -> Result<(), PoolError> {
        let s = self.held_slot(&h)?;
        let g = &mut self.groups[h.addr.group as usize];
        g.slots[s as usize].refs -= 1;
        g.settle(s);
        Ok(())
    }

    /// `publish` of a held entry: one index write for the published bit, no probe for the
    /// slot.
    pub fn publish_held(&mut self, h: &HeldBlock<T>) -> Result<(), PoolError> {
        let s = self.held_slot(h)?;
        let g = &mut self.groups[h.addr.group as usize];
        let slot = &mut g.slots[s as usize];
        if slot.state == Some(EntryState::Published) {
            return Err(PoolError::AlreadyPublished {
                tier: T::NAME,
                group: h.addr.group,
            });
        }
        slot.state = Some(EntryState::Published);
        if let Some(v) = g.index.get_mut(&h.addr.hash) {
            *v |= PUBLISHED;
        }
        g.settle(s);
        Ok(())
    }

    /// Takes a temporary warm pin (reservation only).
    pub fn pin(&mut self, addr: BlockAddr) -> Result<(), PoolError> {
        let s = self.slot_of(addr)?;
        let g = &mut self.groups[addr.group as usize];
        if g.in_lru(s) {
            g.unlink(s);
        }
        g.slots[s as usize].pins += 1;
        Ok(())
    }

    pub fn unpin(&mut self, addr: BlockAddr) -> Result<(), PoolError> {
        let s = self.slot_of(addr)?;
        let g = &mut self.groups[addr.group as usize];
        if g.slots[s as usize].pins == 0 {
            return Err(PoolError::NotReferenced {
                tier: T::NAME,
                group: addr.group,
            });
        }
        g.slots[s as usize].pins -= 1;
        g.settle(s);
        Ok(())
    }

    /// Marks a published, evictable block most recently used.
    pub fn touch(&mut self, addr: BlockAddr) {
        if let Ok(s) = self.slot_of(addr) {
            let g = &mut self.groups[addr.group as usize];
            if g.in_lru(s) {
                g.unlink(s);
                g.push_mru(s);
            }
        }
    }

    /// Evicts one specific block when nothing holds it. Returns whether it was evicted.
    pub fn evict(&mut self, addr: BlockAddr) -> bool {
        let Ok(s) = self.slot_of(addr) else {
            return false;
        };
        let g = &mut self.groups[addr.group as usize];
        if !g.in_lru(s) {
            return false;
        }
        g.unlink(s);
        g.free_slot(s);
        true
    }

    /// A full clear without draining: frees every unreferenced entry and unpublishes
    /// every referenced or pinned one, which stays (invisible to probes and matching, so
    /// never reused) until its last reference drops and then frees. Returns how many
    /// entries stay behind for their references.
    pub fn clear(&mut self) -> usize {
        let mut kept = 0;
        for g in &mut self.groups {
            while g.head != NIL {
                let s = g.head;
                g.unlink(s);
                g.free_slot(s);
            }
            for s in 0..g.slots.len() {
                let slot = &mut g.slots[s];
                if slot.state.is_none() {
                    continue;
                }
                kept += 1;
                if slot.state == Some(EntryState::Published) {
                    g.withdrawn += 1;
                    slot.state = Some(EntryState::Unpublished);
                    if let Some(v) = g.index.get_mut(&slot.hash) {
                        *v &= SLOT_MASK;
                    }
                }
            }
        }
        kept
    }

    /// Evicts up to `n` least recently used unreferenced blocks of a group.
    pub fn evict_lru(&mut self, group: u32, n: usize) -> Vec<ContentHash> {
        let mut out = Vec::new();
        let Some(g) = self.groups.get_mut(group as usize) else {
            return out;
        };
        while out.len() < n && g.head != NIL {
            let s = g.head;
            g.unlink(s);
            out.push(g.slots[s as usize].hash);
            g.free_slot(s);
        }
        out
    }

    /// Approximate resident bytes of the pool's bookkeeping (for the benchmark).
    pub fn bookkeeping_bytes(&self) -> u64 {
        let entry = std::mem::size_of::<(ContentHash, u32)>() as u64 + 1;
        self.groups
            .iter()
            .map(|g| {
                g.index.capacity() as u64 * entry
                    + g.slots.capacity() as u64 * std::mem::size_of::<Slot>() as u64
                    + g.free.capacity() as u64 * 4
            })
            .sum()
    }
}

impl BlockPool<Host> {
    /// The Host range of a block's slot (all its pages).
    pub fn host_range(&self, addr: BlockAddr) -> Result<HostRange, PoolError> {
        let s = self.slot_of(addr)?;
        Ok(slot_range(&self.groups[addr.group as usize], s))
    }

    /// `allocate` (a GET destination) as a held reference, also giving the new entry's
    /// Host range.
    pub fn allocate_held(
        &mut self,
        addr: BlockAddr,
    ) -> Result<(Option<ContentHash>, HeldBlock<Host>, HostRange), PoolError> {
        let (s, evicted) = self.allocate_slot(addr)?;
        let g = &self.groups[addr.group as usize];
        Ok((evicted, HeldBlock::new(addr, s), slot_range(g, s)))
    }

    /// One reference on a published entry as a held reference, with its Host range, from
    /// one index probe (an H2D source). An absent or unpublished entry is an error and
    /// takes nothing.
    pub fn acquire_published(
        &mut self,
        addr: BlockAddr,
    ) -> Result<(HeldBlock<Host>, HostRange), PoolError> {
        self.acquire_found(addr, |g| {
            let v = *g.index.get(&addr.hash)?;
            (v & PUBLISHED != 0).then_some(v & SLOT_MASK)
        })
    }

    /// One reference on the published entry of `addr` in the slot `find` gives (None: the
    /// entry is absent or unpublished, an error that takes nothing), with its Host range.
    fn acquire_found(
        &mut self,
        addr: BlockAddr,
        find: impl FnOnce(&GroupPool) -> Option<u32>,
    ) -> Result<(HeldBlock<Host>, HostRange), PoolError> {
        let unknown = || PoolError::Unknown {
            tier: Host::NAME,
            group: addr.group,
        };
        let g = self
            .groups
            .get_mut(addr.group as usize)
            .ok_or_else(unknown)?;
        let s = find(g).ok_or_else(unknown)?;
        g.take_ref(s);
        Ok((HeldBlock::new(addr, s), slot_range(g, s)))
    }

    /// `acquire_published_page` of a block last seen in slot `slot` (where `publish` put
    /// it): the slot is checked to still carry the block, published, instead of probing the
    /// index. Unknown when the block left the slot (evicted, its slot perhaps reused).
    pub fn acquire_published_page_at(
        &mut self,
        addr: BlockAddr,
        slot: u32,
        page: u32,
        page_bytes: u64,
    ) -> Result<(HeldBlock<Host>, HostRange), PoolError> {
        let (held, block) = self.acquire_found(addr, |g| {
            let e = g.slots.get(slot as usize)?;
            (e.hash == addr.hash && e.state == Some(EntryState::Published)).then_some(slot)
        })?;
        Ok((held, page_of(block, page, page_bytes)))
    }

    /// A PUT source: `acquire_published` and the Host range of one of the block's pages.
    pub fn acquire_published_page(
        &mut self,
        addr: BlockAddr,
        page: u32,
        page_bytes: u64,
    ) -> Result<(HeldBlock<Host>, HostRange), PoolError> {
        let (held, block) = self.acquire_published(addr)?;
        Ok((held, page_of(block, page, page_bytes)))
    }

    /// The Host range of one page of a block's slot.
    pub fn page_range(
        &self,
        addr: BlockAddr,
        page: u32,
        page_bytes: u64,
    ) -> Result<HostRange, PoolError> {
        Ok(page_of(self.host_range(addr)?, page, page_bytes))
    }
}

/// The Host range of slot `s` of a group's region.
fn slot_range(g: &GroupPool, s: u32) -> HostRange {
    HostRange::new(g.region_base + s as u64 * g.block_bytes, g.block_bytes)
}

/// The range of page `page` (of `page_bytes`) within a block's Host range.
pub fn page_of(block: HostRange, page: u32, page_bytes: u64) -> HostRange {
    HostRange::new(block.offset + page as u64 * page_bytes, page_bytes)
}

#[cfg(test)]
#[path = "pool_model.rs"]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    fn a(g: u32, h: u128) -> BlockAddr {
        BlockAddr {
            group: g,
            hash: ContentHash::from_u128(h),
        }
    }

    #[test]
    fn a_clear_frees_the_unreferenced_and_hides_the_referenced_until_released() {
        let mut p = BlockPool::<Host>::new(&[4], &[64]);
        for h in 1..=3 {
            p.allocate(a(0, h)).unwrap();
            p.publish(a(0, h)).unwrap();
        }
        p.release(a(0, 1)).unwrap(); // evictable
        p.release(a(0, 2)).unwrap();
        p.acquire(a(0, 2)).unwrap(); // a PUT source in flight
        p.release(a(0, 3)).unwrap();
        p.pin(a(0, 3)).unwrap(); // a reservation's pin
        assert_eq!(p.clear(), 2, "two entries stay for their references");
        assert_eq!(p.state(a(0, 1)), None, "the unreferenced entry is freed");
        assert!(
            !p.contains(a(0, 2)) && !p.contains(a(0, 3)),
            "hidden from probes"
        );
        assert_eq!(p.state(a(0, 2)), Some(EntryState::Unpublished));
        assert_eq!(p.available(0), 2, "referenced slots are not reusable yet");
        // The in-flight I/O retires: its entry frees and its slot is reusable.
        p.release(a(0, 2)).unwrap();
        p.unpin(a(0, 3)).unwrap();
        assert_eq!(p.state(a(0, 2)), None);
        assert_eq!(p.state(a(0, 3)), None);
        assert_eq!(p.available(0), 4);
        p.allocate(a(0, 2)).unwrap();
        p.publish(a(0, 2)).unwrap();
        assert!(p.contains(a(0, 2)), "the same block can be cached again");
    }

    /// A PUT source's reference and page range come from one probe: only a published entry
    /// gives them (an unpublished or absent one takes nothing), the range is the page's
    /// within the slot, and the reference keeps the entry from eviction until released.
    #[test]
    fn acquiring_a_published_page_references_it_and_gives_its_range() {
        let mut p = BlockPool::<Host>::new(&[2], &[64]);
        assert!(p.acquire_published_page(a(0, 1), 0, 32).is_err(), "absent");
        p.allocate(a(0, 1)).unwrap();
        assert!(
            p.acquire_published_page(a(0, 1), 0, 32).is_err(),
            "unpublished"
        );
        assert_eq!(p.refs(a(0, 1)), 1, "nothing taken");
        p.publish(a(0, 1)).unwrap();
        p.release(a(0, 1)).unwrap();
        let (held, r) = p.acquire_published_page(a(0, 1), 1, 32).unwrap();
        assert_eq!(r, p.page_range(a(0, 1), 1, 32).unwrap());
        assert_eq!(held.addr(), a(0, 1));
        assert_eq!(p.refs(a(0, 1)), 1);
        assert!(!p.evict(a(0, 1)), "a referenced entry is not evictable");
        p.release_held(held).unwrap();
        assert!(p.evict(a(0, 1)), "evictable once released");
        assert!(
            p.acquire_published_page(a(1, 1), 0, 32).is_err(),
            "unknown group"
        );
    }

    /// A page acquired by the slot `publish` reported is the one `acquire_published_page`
    /// gives (same reference, same range), and only while that slot still carries the
    /// block, published: an unpublished entry, an evicted block, a slot reused by another
    /// block, another slot or an unknown group take nothing.
    #[test]
    fn acquiring_a_published_page_by_its_slot_checks_the_slot_carries_it() {
        let mut p = BlockPool::<Host>::new(&[2], &[64]);
        p.allocate(a(0, 1)).unwrap();
        assert!(
            p.acquire_published_page_at(a(0, 1), 0, 1, 32).is_err(),
            "unpublished"
        );
        let slot = p.publish(a(0, 1)).unwrap();
        p.release(a(0, 1)).unwrap();
        let other = 1 - slot;
        assert!(
            p.acquire_published_page_at(a(0, 1), other, 1, 32).is_err(),
            "another slot"
        );
        assert!(
            p.acquire_published_page_at(a(1, 1), slot, 1, 32).is_err(),
            "unknown group"
        );
        assert_eq!(p.refs(a(0, 1)), 0, "nothing taken");
        let (held, r) = p.acquire_published_page_at(a(0, 1), slot, 1, 32).unwrap();
        assert_eq!(r, p.page_range(a(0, 1), 1, 32).unwrap());
        assert_eq!((held.addr(), p.refs(a(0, 1))), (a(0, 1), 1));
        p.release_held(held).unwrap();
        // Evicted, then its slot reused by another block: the old slot names nothing.
        assert!(p.evict(a(0, 1)));
        assert!(
            p.acquire_published_page_at(a(0, 1), slot, 1, 32).is_err(),
            "evicted"
        );
        p.allocate(a(0, 2)).unwrap();
        p.allocate(a(0, 3)).unwrap();
        p.publish(a(0, 2)).unwrap();
        p.publish(a(0, 3)).unwrap();
        assert!(
            p.acquire_published_page_at(a(0, 1), slot, 1, 32).is_err(),
            "reused"
        );
        assert_eq!(
            p.refs(a(0, 2)) + p.refs(a(0, 3)),
            2,
            "only their own references"
        );
    }

    /// A held reference is given back by its slot: publishing and releasing it act on that
    /// slot's entry exactly as `publish` and `release` by address do (the published bit
    /// reaches probes, the last release frees an unpublished entry and makes a published
    /// one evictable), and a handle whose slot no longer carries its block (released
    /// already, or freed and reused by another block) is refused, changing nothing.
    #[test]
    fn a_held_block_is_published_and_released_by_its_slot() {
        let mut p = BlockPool::<Host>::new(&[2], &[64]);
        let (none, d, range) = p.allocate_held(a(0, 1)).unwrap();
        assert_eq!(none, None);
        assert_eq!(range, p.host_range(a(0, 1)).unwrap());
        assert!(!p.contains(a(0, 1)));
        p.publish_held(&d).unwrap();
        assert!(p.contains(a(0, 1)), "the published bit reaches probes");
        assert!(matches!(
            p.publish_held(&d),
            Err(PoolError::AlreadyPublished { .. })
        ));
        let (h2d, r2) = p.acquire_published(a(0, 1)).unwrap();
        assert_eq!(r2, range);
        assert_eq!(p.refs(a(0, 1)), 2);
        p.release_held(d).unwrap();
        assert!(!p.evict(a(0, 1)), "still held by the H2D source");
        p.release_held(h2d).unwrap();
        assert_eq!(p.refs(a(0, 1)), 0);
        assert!(p.contains(a(0, 1)), "published: kept, evictable");
        // A failed destination: its last release frees the unpublished entry.
        let (_, failed, _) = p.allocate_held(a(0, 2)).unwrap();
        p.release_held(failed).unwrap();
        assert_eq!(p.state(a(0, 2)), None);
        // A stale handle (its reference already given back, its slot reused by block 3)
        // is refused and leaves the new entry alone.
        let (_, gone, _) = p.allocate_held(a(0, 4)).unwrap();
        let stale = HeldBlock::<Host>::new(gone.addr(), gone.slot);
        p.release_held(gone).unwrap();
        let (_, three, _) = p.allocate_held(a(0, 3)).unwrap();
        assert_eq!(three.slot, stale.slot, "the freed slot is reused");
        assert!(p.release_held(stale).is_err());
        assert!(p
            .publish_held(&HeldBlock::new(a(0, 4), three.slot))
            .is_err());
        assert_eq!(p.refs(a(0, 3)), 1);
        assert!(p.acquire_published(a(0, 3)).is_err(), "unpublished");
        assert!(p.acquire_published(a(5, 3)).is_err(), "unknown group");
        p.release_held(three).unwrap();
    }

    #[test]
    fn unpublished_entries_are_invisible_and_freed_on_release() {
        let mut p = BlockPool::<Host>::new(&[2], &[64]);
        p.allocate(a(0, 1)).unwrap();
        assert!(!p.contains(a(0, 1)), "unpublished is invisible to probes");
        assert_eq!(p.state(a(0, 1)), Some(EntryState::Unpublished));
        p.release(a(0, 1)).unwrap();
        assert_eq!(p.state(a(0, 1)), None, "failed destination freed");
        p.allocate(a(0, 1)).unwrap();
        p.publish(a(0, 1)).unwrap();
        assert!(p.contains(a(0, 1)));
        assert_eq!(p.refs(a(0, 1)), 1);
        assert!(matches!(
            p.allocate(a(0, 1)),
            Err(PoolError::AlreadyPresent { .. })
        ));
    }

    #[test]
    fn every_way_a_published_entry_goes_counts_as_withdrawn_and_nothing_else_does() {
        let mut p = BlockPool::<Host>::new(&[2, 2], &[64, 64]);
        let mut ev = vec![];
        // An unpublished entry freed on its last release was never visible.
        p.allocate(a(0, 9)).unwrap();
        p.release(a(0, 9)).unwrap();
        p.insert_published(a(0, 1), &mut ev).unwrap();
        p.insert_published(a(1, 1), &mut ev).unwrap();
        p.acquire(a(1, 1)).unwrap();
        p.release(a(1, 1)).unwrap();
        p.touch(a(0, 1));
        assert_eq!(
            p.withdrawn(),
            0,
            "allocation, publication, references, touches"
        );
        assert!(p.evict(a(0, 1)));
        assert_eq!(p.withdrawn(), 1, "a targeted eviction");
        p.insert_published(a(0, 2), &mut ev).unwrap();
        p.insert_published(a(0, 3), &mut ev).unwrap();
        p.insert_published(a(0, 4), &mut ev).unwrap();
        assert_eq!(ev, vec![ContentHash::from_u128(2)]);
        assert_eq!(p.withdrawn(), 2, "an eviction for room");
        assert_eq!(p.evict_lru(0, 1), vec![ContentHash::from_u128(3)]);
        assert_eq!(p.withdrawn(), 3, "an LRU eviction");
        // Clear: the unreferenced entry is freed, the referenced one hidden; both count,
        // and the hidden one's later release frees an unpublished entry (no count).
        p.acquire(a(1, 1)).unwrap();
        assert_eq!(p.clear(), 1);
        assert_eq!(p.withdrawn(), 5, "a clear, freed and hidden");
        p.release(a(1, 1)).unwrap();
        assert_eq!(p.state(a(1, 1)), None);
        assert_eq!(p.withdrawn(), 5);
    }

    #[test]
    fn lru_eviction_skips_referenced_and_pinned_blocks() {
        let mut p = BlockPool::<Host>::new(&[3], &[64]);
        let mut ev = vec![];
        for h in 1..=3 {
            p.insert_published(a(0, h), &mut ev).unwrap();
        }
        p.acquire(a(0, 1)).unwrap(); // storage I/O / Ready hold
        p.pin(a(0, 2)).unwrap(); // warm pin during reservation
        assert_eq!(p.available(0), 1);
        assert_eq!(
            p.allocate(a(0, 4)).unwrap(),
            Some(ContentHash::from_u128(3)),
            "the least recently used unreferenced block"
        );
        assert!(matches!(p.allocate(a(0, 5)), Err(PoolError::Full { .. })));
        assert!(p.contains(a(0, 1)) && p.contains(a(0, 2)));
        assert!(!p.evict(a(0, 1)), "held blocks are never evicted");
        p.unpin(a(0, 2)).unwrap();
        p.release(a(0, 1)).unwrap();
        // Now 2 is older than 1 in the LRU.
        assert_eq!(p.evict_lru(0, 1), vec![ContentHash::from_u128(2)]);
        p.touch(a(0, 1));
        assert!(p.evict(a(0, 1)));
        assert!(p.release(a(0, 1)).is_err());
    }

    #[test]
    fn lru_order_follows_touch() {
        let mut p = BlockPool::<Device>::new(&[3], &[1]);
        let mut ev = vec![];
        for h in 1..=3 {
            p.insert_published(a(0, h), &mut ev).unwrap();
        }
        p.touch(a(0, 1));
        p.insert_published(a(0, 2), &mut ev).unwrap(); // refresh
        let order = p.evict_lru(0, 3);
        let order: Vec<u128> = order.iter().map(|h| h.as_u128()).collect();
        assert_eq!(order, vec![3, 1, 2]);
        assert!(p.is_empty());
    }

    #[test]
    fn host_offsets_are_region_base_plus_slot_times_block_bytes() {
        let mut p = BlockPool::<Host>::new(&[2, 3], &[100, 40]);
        assert_eq!(p.region_bytes(), 200 + 120);
        p.allocate(a(0, 1)).unwrap();
        p.allocate(a(0, 2)).unwrap();
        p.allocate(a(1, 1)).unwrap();
        p.allocate(a(1, 2)).unwrap();
        assert_eq!(p.host_range(a(0, 1)).unwrap(), HostRange::new(0, 100));
        assert_eq!(p.host_range(a(0, 2)).unwrap(), HostRange::new(100, 100));
        assert_eq!(p.host_range(a(1, 1)).unwrap(), HostRange::new(200, 40));
        assert_eq!(p.host_range(a(1, 2)).unwrap(), HostRange::new(240, 40));
        assert_eq!(
            p.page_range(a(1, 2), 1, 20).unwrap(),
            HostRange::new(260, 20)
        );
        // A freed slot is reused: ranges never overlap among live entries.
        p.release(a(0, 1)).unwrap();
        p.allocate(a(0, 9)).unwrap();
        assert_eq!(p.host_range(a(0, 9)).unwrap(), HostRange::new(0, 100));
        assert!(p.host_range(a(7, 1)).is_err());
    }

    #[test]
    fn the_free_hook_sees_every_freed_slot_and_never_a_held_one() {
        use std::sync::{Arc, Mutex};
        let mut p = BlockPool::<Host>::new(&[2, 1], &[100, 64]);
        let freed: Arc<Mutex<Vec<HostRange>>> = Arc::default();
        let f = freed.clone();
        p.set_free_hook(Arc::new(move |_, _, r| f.lock().unwrap().push(r)));
        let mut ev = vec![];
        p.insert_published(a(0, 1), &mut ev).unwrap();
        p.insert_published(a(0, 2), &mut ev).unwrap();
        p.acquire(a(0, 1)).unwrap();
        // Group 0 is full: a third block evicts the unreferenced one (slot 1), never the
        // referenced one.
        p.insert_published(a(0, 3), &mut ev).unwrap();
        assert_eq!(*freed.lock().unwrap(), vec![HostRange::new(100, 100)]);
        // A clear frees what nothing holds; the held block is freed at its release.
        p.clear();
        assert_eq!(freed.lock().unwrap().len(), 2);
        p.release(a(0, 1)).unwrap();
        let got = freed.lock().unwrap().clone();
        assert_eq!(got.len(), 3);
        assert_eq!(got[2], HostRange::new(0, 100));
        // Group 1's region follows group 0's.
        p.insert_published(a(1, 9), &mut ev).unwrap();
        assert!(p.evict(a(1, 9)));
        assert_eq!(freed.lock().unwrap()[3], HostRange::new(200, 64));
    }
}
