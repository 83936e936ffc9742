//! Admission: queued requests move onto the Device in arrival order, up to `max_running`.
//! `try_admit` matches the real cache, plans every block it needs (`block_needs`), checks
//! that they fit, takes references and allocates (rolling back when something is short),
//! emits the H2D copies of Host hits, the forward (with the copy-on-write of a restored
//! partial block) and the D2H of new blocks (the prompt end's tail blocks included, when
//! tails are on), and accounts the prefix split, the fallback reason and tail reuse.
//!
//! The only place that decides Device admission. It never plans storage operations (a
//! Ready hold's lease is only queued as a hand-back for the manager) and never performs
//! I/O.

use super::plan::Plan;
use super::request::{AdmissionResources, PrefixSplit, RequestState};
use super::{tail_kind, Scheduler};
use crate::cache::keys::{BlockAddr, PromptIndex};
use crate::cache::pool::{HeldBlock, Host};
use crate::cache::GroupKind;
use crate::device::{DeviceCopy, DeviceSlot, ForwardStep, GroupBlockTable, SlotCopy};
use crate::frontend::FallbackReason;
use crate::storage_transfer::HandBack;
use messages::RequestId;

impl Scheduler {
    fn running(&self) -> usize {
        self.running.len()
    }

    pub(super) fn admit(&mut self, plan: &mut Plan) {
        let mut running = self.running();
        while running < self.cfg.max_running {
            let Some(&id) = self.queue.first() else {
                return;
            };
            let ready = self.requests.get(&id).is_some_and(|r| {
                matches!(r.state, RequestState::Admissible)
                    || (matches!(r.state, RequestState::Submitted) && !self.storage_eligible(r))
            });
            if !ready {
                // A Submitted request still eligible for storage was just prepared above
                // unless the credits refused it; never block the head of the line on it.
                return;
            }
            match self.try_admit(id, plan) {
                Ok(true) => {
                    self.queue.pop_first();
                    running += 1;
                }
                Ok(false) => return, // no Device capacity: wait for running requests
                Err(e) => {
                    self.queue.pop_first();
                    self.abort(id, &format!("admission failed: {e}"));
                }
            }
        }
    }

    /// Admits one request: matches the real cache again, copies Host blocks to the Device,
    /// allocates the written blocks and emits the forward and the D2H of new blocks.
    /// `Ok(false)`: something did not fit (nothing is kept; the request stays queued).
    fn try_admit(&mut self, id: RequestId, plan: &mut Plan) -> Result<bool, String> {
        let Some(r) = self.requests.get_mut(&id) else {
            return Ok(true);
        };
        let whole = r.take_whole_index(&self.cache);
        // The two cold reads of a request queued long ago go out together: the index's
        // first lines (read, not used yet) and the prompt's tokens (copied next).
        std::hint::black_box(whole.first_lines());
        let prompt = r.prompt.clone();
        let reusable = r.reusable();
        let admitted = self.admit_matched(id, plan, prompt, reusable, &whole);
        if let Ok(false) = admitted {
            // Still queued: its next try matches with the same index.
            if let Some(r) = self.requests.get_mut(&id) {
                r.index = Some(whole);
            }
        }
        admitted
    }

    /// `try_admit` once the request's prompt and index are in hand.
    fn admit_matched(
        &mut self,
        id: RequestId,
        plan: &mut Plan,
        prompt: Vec<u32>,
        reusable: u32,
        whole: &PromptIndex,
    ) -> Result<bool, String> {
        // With tails on, a tail boundary (its partial history blocks, the SWA lookback and
        // the State checkpoint taken exactly there) is reused like an aligned one; off,
        // the coordinator proposes only aligned boundaries.
        let (boundary, device_tokens) = self.cache.admission_boundary_in(whole, &prompt, reusable);
        let matched = Matched {
            boundary,
            device_tokens,
            reusable,
            prompt_len: prompt.len() as u32,
        };
        // Plan every block first; take nothing until everything fits.
        let needs = self.block_needs(whole, &prompt, matched.boundary)?;
        if !self.fits(&needs) {
            return Ok(false);
        }
        let Some(mut taken) = self.take_blocks(&needs, plan)? else {
            return Ok(false);
        };
        let scratch = self.take_scratch(&needs.written_partial, &mut taken.tables)?;
        // Copy-on-write: a restored partial history block is copied into the block the
        // forward writes; the restored (cached, maybe stored) tail is never written.
        let copy_on_write = needs
            .copy_on_write
            .iter()
            .enumerate()
            .filter(|(_, cow)| **cow)
            .filter_map(|(g, _)| {
                let t = &taken.tables[g];
                Some(SlotCopy {
                    from: *t.context.last()?,
                    to: *t.written.first()?,
                })
            })
            .collect();
        self.publish_new_blocks(&taken.new_written, plan)?;
        self.h2d_host_refs.extend(taken.h2d_refs);
        // The prompt's end is a tail (when nonaligned and tails are on): its blocks are
        // published on the Device now.
        self.cache
            .record_prompt_tail(whole, &prompt, prompt.len() as u32);
        let step = ForwardStep {
            shard: self.cfg.layout.shard,
            tokens: prompt,
            context_len: matched.boundary as u64,
            groups: taken.tables,
            sampling: self
                .requests
                .get(&id)
                .map(|r| r.sampling)
                .unwrap_or_default(),
            copy_on_write,
        };
        plan.forwards.push((id, step));
        self.account_admission(id, matched, taken.held, scratch)?;
        Ok(true)
    }

    /// Every block the forward of `prompt` from `boundary` reads (context) and writes, per
    /// cache group. A context block that ends at a nonaligned boundary is that tail's block
    /// (a partial history block, or the State checkpoint taken exactly there); a written
    /// block past the last full one is the prompt end's tail block when tails are on, else
    /// a partial (scratch) block.
    fn block_needs(
        &self,
        index: &PromptIndex,
        prompt: &[u32],
        boundary: u32,
    ) -> Result<BlockNeeds, String> {
        let len = prompt.len() as u64;
        let tails = self.cache.tails_enabled();
        let geometry = &self.cfg.layout.geometry;
        let groups = geometry.group_count();
        let mut needs = BlockNeeds {
            context: vec![vec![]; groups],
            written_full: vec![vec![]; groups],
            written_partial: vec![false; groups],
            copy_on_write: vec![false; groups],
        };
        let mut scratch = Vec::new();
        for g in 0..groups {
            let spec = geometry.group(g);
            let bt = spec.block_tokens.max(1);
            let tail_at = !boundary.is_multiple_of(bt);
            let req = self
                .model
                .required_blocks(g, boundary as u64)
                .map_err(|e| e.to_string())?;
            for k in req {
                let hash = if tail_at && k == (boundary / bt) as u64 {
                    index.tail_block_hash(&mut scratch, prompt, g, boundary)
                } else {
                    index.block_hash(g, k as u32)
                };
                needs.context[g].push(BlockAddr::new(g, hash));
            }
            // A partial history block is both context and written.
            needs.copy_on_write[g] = tail_at && spec.kind != GroupKind::State;
            let wr = self
                .model
                .written_blocks(g, boundary as u64, len)
                .map_err(|e| e.to_string())?;
            let full = index.full_blocks(g) as u64;
            for k in wr {
                if k < full {
                    needs.written_full[g].push(BlockAddr::new(g, index.block_hash(g, k as u32)));
                } else if tails {
                    let hash = index.tail_block_hash(&mut scratch, prompt, g, len as u32);
                    needs.written_full[g].push(BlockAddr::new(g, hash));
                } else {
                    needs.written_partial[g] = true;
                }
            }
        }
        Ok(needs)
    }

    /// Whether the scratch slots and, group by group, the Device blocks not yet resident
    /// are available (a group's room never covers another's shortfall: a request that would
    /// run short halfway through taking its blocks takes none).
    fn fits(&self, needs: &BlockNeeds) -> bool {
        let scratch_needed = needs.written_partial.iter().filter(|p| **p).count();
        if scratch_needed > self.free_scratch.len() {
            return false;
        }
        let device = self.cache.device();
        needs
            .context
            .iter()
            .zip(&needs.written_full)
            .enumerate()
            .all(|(g, (context, written))| {
                let new = context
                    .iter()
                    .chain(written)
                    .filter(|a| !device.contains(**a))
                    .count();
                new as u64 <= device.available(g as u32)
            })
    }

    /// Takes a reference on (or allocates) every block of `needs`, group by group, context
    /// first. None: a block could not be taken; the Device references taken are released.
    fn take_blocks(
        &mut self,
        needs: &BlockNeeds,
        plan: &mut Plan,
    ) -> Result<Option<Taken>, String> {
        let groups = needs.context.len();
        let mut t = Taken {
            held: vec![],
            tables: vec![GroupBlockTable::default(); groups],
            new_written: vec![],
            h2d_refs: vec![],
        };
        for g in 0..groups {
            for &a in &needs.context[g] {
                let Some(slot) = self.take_context_block(a, &mut t, plan)? else {
                    self.give_back(t);
                    return Ok(None);
                };
                t.tables[g].context.push(slot);
            }
            for &a in &needs.written_full[g] {
                let Some(slot) = self.take_written_block(a, &mut t)? else {
                    self.give_back(t);
                    return Ok(None);
                };
                t.tables[g].written.push(slot);
            }
        }
        Ok(Some(t))
    }

    /// Gives back what an admission that did not fit took: its Device references now, and
    /// its H2D sources' Host references at `d2h_done` like an admitted one's (the copies it
    /// already planned run this round).
    fn give_back(&mut self, t: Taken) {
        self.release_device(&t.held);
        self.h2d_host_refs.extend(t.h2d_refs);
    }

    /// A context block: a Device hit takes a reference; a Host hit allocates a Device slot
    /// and copies the block in (H2D; the Host source is pinned until `d2h_done`).
    fn take_context_block(
        &mut self,
        a: BlockAddr,
        t: &mut Taken,
        plan: &mut Plan,
    ) -> Result<Option<DeviceSlot>, String> {
        if self.cache.device().contains(a) {
            if self.cache.device_mut().acquire(a).is_err() {
                return Ok(None);
            }
            t.held.push(a);
            return self.device_slot(a).map(Some);
        }
        // The H2D source's reference and range in one probe; it is held until `d2h_done`.
        let (source, range) = self
            .cache
            .host_mut()
            .acquire_published(a)
            .map_err(|e| format!("host block vanished: {e}"))?;
        if self.cache.device_mut().allocate(a).is_err() {
            let _ = self.cache.host_mut().release_held(source);
            return Ok(None);
        }
        t.held.push(a);
        t.h2d_refs.push(source);
        let slot = self.device_slot(a)?;
        plan.h2d.push(DeviceCopy::h2d(range, slot, 0));
        let _ = self.cache.device_mut().publish(a);
        Ok(Some(slot))
    }

    /// A full block the forward writes: a resident one takes a reference, a new one is
    /// allocated (and published once the forward is planned).
    fn take_written_block(
        &mut self,
        a: BlockAddr,
        t: &mut Taken,
    ) -> Result<Option<DeviceSlot>, String> {
        if self.cache.device().contains(a) {
            let _ = self.cache.device_mut().acquire(a);
        } else {
            if self.cache.device_mut().allocate(a).is_err() {
                return Ok(None);
            }
            t.new_written.push(a);
        }
        t.held.push(a);
        self.device_slot(a).map(Some)
    }

    /// Releases Device references taken by an admission that did not fit.
    fn release_device(&mut self, held: &[BlockAddr]) {
        for a in held {
            let _ = self.cache.device_mut().release(*a);
        }
    }

    /// One scratch slot per group whose last written block is partial.
    fn take_scratch(
        &mut self,
        partial: &[bool],
        tables: &mut [GroupBlockTable],
    ) -> Result<Vec<u32>, String> {
        let mut scratch = vec![];
        for (g, partial) in partial.iter().enumerate() {
            if *partial {
                let s = self.free_scratch.pop().ok_or("scratch slots exhausted")?;
                scratch.push(s);
                tables[g].written.push(self.cfg.layout.scratch_slot(s));
            }
        }
        Ok(scratch)
    }

    /// The forward writes the new blocks: they are published on the Device now (the forward
    /// is ordered before any later reader of this round), and each not yet in Host L2 gets
    /// a Host block and a D2H copy (published by `d2h_done`).
    fn publish_new_blocks(
        &mut self,
        new_written: &[BlockAddr],
        plan: &mut Plan,
    ) -> Result<(), String> {
        for a in new_written {
            let _ = self.cache.device_mut().publish(*a);
        }
        for a in new_written {
            if self.cache.host().state(*a).is_some() {
                continue;
            }
            if self.cache.host_mut().allocate(*a).is_err() {
                continue;
            }
            let Ok(range) = self.cache.host().host_range(*a) else {
                continue;
            };
            let slot = self.device_slot(*a)?;
            plan.d2h.push(DeviceCopy::d2h(slot, 0, range));
            self.d2h_blocks.push(*a);
        }
        Ok(())
    }

    /// The admitted request runs: its prefix split and fallback reason are recorded, it holds
    /// `held` and `scratch`, the counters advance and its Ready hold's lease is handed back
    /// (admission now holds its own references).
    fn account_admission(
        &mut self,
        id: RequestId,
        m: Matched,
        held: Vec<BlockAddr>,
        scratch: Vec<u32>,
    ) -> Result<(), String> {
        let storage = StorageState {
            stm_enabled: self.cfg.storage.is_some(),
            l3_enabled: self.l3_enabled(),
        };
        let parent = self.cfg.layout.geometry.parent_tokens().max(1);
        let r = self.requests.get_mut(&id).ok_or("request vanished")?;
        r.split = prefix_split(&r.resources, m);
        r.fallback = admission_fallback(storage, &r.resources, m, r.split.l3, parent);
        r.device_refs = held;
        r.scratch = scratch;
        r.state = RequestState::Prefill;
        self.running.insert(id);
        let ready = r.resources.ready.take();
        self.stats.admitted += 1;
        self.stats.prefix_device += r.split.device as u64;
        self.stats.prefix_host += r.split.host as u64;
        self.stats.prefix_l3 += r.split.l3 as u64;
        self.stats.computed += m.prompt_len as u64 - m.boundary as u64;
        let above = m.boundary - m.boundary / parent * parent;
        if above > 0 {
            // A tail boundary: its blocks per group kind, its tokens by the tier they came
            // from (a tail sits at the top of the prefix).
            for g in self.cfg.layout.geometry.groups() {
                if !m.boundary.is_multiple_of(g.block_tokens.max(1)) {
                    self.stats.tail_blocks_reused[tail_kind(g.kind)] += 1;
                }
            }
            let tier = if m.device_tokens >= m.boundary {
                0
            } else if r.split.l3 > 0 {
                2
            } else {
                1
            };
            self.stats.tail_tokens_reused[tier] += above as u64;
        }
        if let Some(lease) = ready {
            self.handbacks.push(HandBack::Detach(lease));
        }
        Ok(())
    }

    fn device_slot(&self, a: BlockAddr) -> Result<DeviceSlot, String> {
        let idx = self
            .cache
            .device()
            .slot_index(a)
            .map_err(|e| e.to_string())?;
        Ok(self.cfg.layout.cached_slot(a.group as usize, idx))
    }
}

/// The admission match of one request.
#[derive(Clone, Copy, Debug)]
struct Matched {
    /// The aligned boundary restored (Device and Host).
    boundary: u32,
    /// The part of the boundary already on the Device.
    device_tokens: u32,
    /// The request's reusable bound (every token but the last).
    reusable: u32,
    prompt_len: u32,
}

/// The blocks one admission needs, per cache group.
#[derive(Debug)]
struct BlockNeeds {
    /// Blocks the forward reads (below the boundary).
    context: Vec<Vec<BlockAddr>>,
    /// Cached blocks the forward writes: full blocks, then (tails on) the prompt end's
    /// tail block.
    written_full: Vec<Vec<BlockAddr>>,
    /// Whether the forward writes a partial block in a scratch slot (tails off).
    written_partial: Vec<bool>,
    /// Whether the group's last context block is a partial history block the first written
    /// block continues (copy-on-write).
    copy_on_write: Vec<bool>,
}

/// What an admission took while its blocks were being taken.
#[derive(Debug)]
struct Taken {
    /// Device blocks referenced (the request holds them while running).
    held: Vec<BlockAddr>,
    tables: Vec<GroupBlockTable>,
    /// Blocks allocated for the forward to write (new on the Device).
    new_written: Vec<BlockAddr>,
    /// Host blocks pinned as H2D sources (released by `d2h_done`).
    h2d_refs: Vec<HeldBlock<Host>>,
}

/// Whether storage is configured and whether L3 work is enabled, at admission.
#[derive(Clone, Copy, Debug)]
struct StorageState {
    stm_enabled: bool,
    l3_enabled: bool,
}

/// Where the restored prefix came from: the Device part, the L3 part (only with a Ready
/// hold: the planned boundary above the local hit when the read was planned), the rest
/// from Host; the tokens past the boundary are computed.
fn prefix_split(res: &AdmissionResources, m: Matched) -> PrefixSplit {
    let l3 = if res.ready.is_some() {
        m.boundary
            .min(res.planned_boundary)
            .saturating_sub(res.local_at_plan.max(m.device_tokens))
    } else {
        0
    };
    let host = m
        .boundary
        .saturating_sub(m.device_tokens)
        .saturating_sub(l3);
    PrefixSplit {
        device: m.device_tokens,
        host,
        l3,
        computed: m.prompt_len - m.boundary,
    }
}

/// Why the request did not reuse its whole reusable prefix (None when it did), given
/// `l3` tokens from L3 and `parent`-token alignment.
fn admission_fallback(
    storage: StorageState,
    res: &AdmissionResources,
    m: Matched,
    l3: u32,
    parent: u32,
) -> FallbackReason {
    let aligned = |b: u32| b / parent * parent;
    if !storage.stm_enabled {
        FallbackReason::Disabled
    } else if !storage.l3_enabled {
        FallbackReason::Quarantine
    } else if let Some(f) = res.fallback {
        f
    } else if m.boundary >= aligned(m.reusable) {
        FallbackReason::None
    } else if let Some(f) = res.storage_refused {
        f
    } else if l3 > 0 && m.boundary < aligned(res.planned_boundary) {
        FallbackReason::Partial
    } else if l3 == 0 {
        FallbackReason::Miss
    } else {
        FallbackReason::None
    }
}

#[cfg(test)]
mod tests {
    use super::super::request::AdmissionResources;
    use super::super::tests::*;
    use super::super::AdminCommand;
    use super::{admission_fallback, prefix_split, Matched, StorageState};
    use crate::frontend::FallbackReason;
    use messages::RequestId;

    #[test]
    fn a_device_hit_prefix_is_admitted_with_the_device_split() {
        let mut rig = rig(false);
        let p = prompt(30, 1);
        rig.arrive(&[(1, &p, 4)]);
        rig.d2h_done();
        // The same prompt while the first still runs: its blocks are on the Device.
        let plan = rig.arrive(&[(2, &p, 4)]);
        let [(id, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(*id, RequestId(2));
        assert_eq!(step.context_len, 28);
        assert_eq!(step.groups[0].context.len(), 7);
        assert!(plan.h2d.is_empty(), "nothing comes from Host");
        assert!(plan.d2h.is_empty(), "no new full block");
        let r = &rig.s.requests[&RequestId(2)];
        assert_eq!((r.split.device, r.split.host, r.split.l3), (28, 0, 0));
        assert_eq!(r.split.computed, 2);
        assert_eq!(r.fallback, FallbackReason::Disabled);
        assert_eq!(rig.s.stats().prefix_device, 28);
        assert_eq!(
            rig.s.stats().computed,
            30 + 2,
            "the first's whole prompt, two tokens"
        );
    }

    #[test]
    fn a_host_hit_prefix_is_copied_in_and_admitted_with_the_host_split() {
        let mut rig = rig(false);
        let p = prompt(30, 2);
        serve_then_admin(&mut rig, 1, &p, AdminCommand::ResetLocal { host: false });
        let plan = rig.arrive(&[(2, &p, 4)]);
        assert_eq!(plan.forwards.len(), 1);
        assert_eq!(plan.h2d.len(), 7, "every context block from Host");
        let r = &rig.s.requests[&RequestId(2)];
        assert_eq!((r.split.device, r.split.host, r.split.l3), (0, 28, 0));
        assert_eq!(rig.s.stats().prefix_host, 28);
        assert_eq!(
            rig.s.h2d_host_refs.len(),
            7,
            "sources pinned until d2h_done"
        );
        rig.d2h_done();
        assert!(rig.s.h2d_host_refs.is_empty());
    }

    /// A prompt's end is a tail on Host once served: a longer prompt over it reuses that
    /// tail from Host, and the reuse is counted in the Host tier (none came from L3).
    #[test]
    fn a_tail_reused_from_host_is_counted_in_the_host_tier() {
        let mut rig = rig(false);
        let p = prompt(30, 3);
        serve_then_admin(&mut rig, 1, &p, AdminCommand::ResetLocal { host: false });
        let mut q = p.clone();
        q.extend(prompt(4, 4));
        rig.arrive(&[(2, &q, 4)]);
        let r = &rig.s.requests[&RequestId(2)];
        assert_eq!((r.split.device, r.split.host, r.split.l3), (0, 30, 0));
        let stats = rig.s.stats();
        assert_eq!(
            stats.tail_tokens_reused,
            [0, 2, 0],
            "tokens 28..30, from Host"
        );
        assert_eq!(stats.tail_blocks_reused, [1, 0, 0]);
    }

    #[test]
    fn admission_waits_when_device_blocks_are_short_and_keeps_the_line() {
        let mut rig = rig_with(false, 4, 4);
        let long = prompt(32, 3); // eight full blocks: more than the pool
        let short = prompt(8, 4);
        let plan = rig.arrive(&[(1, &long, 2), (2, &short, 2)]);
        assert!(plan.forwards.is_empty());
        assert!(plan.h2d.is_empty() && plan.d2h.is_empty());
        assert_eq!(rig.s.state_of(RequestId(1)), Some("submitted"));
        assert_eq!(rig.s.state_of(RequestId(2)), Some("submitted"));
        assert_eq!(rig.s.queue.len(), 2, "both stay queued, in order");
        assert_eq!(rig.s.stats().admitted, 0);
        // Nothing was taken.
        assert_eq!(rig.s.cache().device().available(0), 4);
        assert!(rig.s.requests[&RequestId(1)].device_refs.is_empty());
        // A later round still refuses it (it waits; it is not aborted).
        let plan = rig.round(Default::default());
        assert!(plan.forwards.is_empty());
        assert_eq!(rig.s.live_requests(), 2);
        // The refused request keeps the index its admission made (admission moves it out
        // and gives it back): the next try matches without hashing the prompt again.
        let kept = rig.s.requests[&RequestId(1)]
            .index
            .as_ref()
            .map(|i| i.block_hash(0, 7));
        let made = crate::cache::keys::PromptIndex::new(rig.s.cache().geometry(), &long, 32);
        assert_eq!(kept, Some(made.block_hash(0, 7)));
    }

    /// Leaves prompt `a` on Host only: `a` is served (its blocks go to Host), `b` is left
    /// running on the Device, and `c`, served in the room beside it, evicts `a`'s blocks.
    fn host_only_prefix(rig: &mut Rig, a: &[u32], b: &[u32], c: &[u32]) {
        serve_one(rig, 1, a);
        rig.arrive(&[(2, b, 50)]);
        rig.d2h_done();
        serve_one(rig, 3, c);
    }

    /// Request `id` waited with nothing touched: no forward, no H2D copy, still submitted,
    /// no Host source pinned.
    fn waited_untouched(rig: &Rig, plan: &super::super::Plan<messages::StorageOp>, id: u64) {
        assert!(plan.forwards.is_empty(), "{:?}", plan.forwards);
        assert!(plan.h2d.is_empty(), "{:?}", plan.h2d);
        assert_eq!(rig.s.state_of(RequestId(id)), Some("submitted"));
        assert!(rig.s.h2d_host_refs.is_empty(), "no Host source pinned");
    }

    /// A request whose Host prefix would fit on the Device but whose new blocks would not
    /// waits without touching anything: no H2D copy is planned for it (the fit is checked
    /// before a block is taken, not found short halfway through its copies).
    #[test]
    fn a_request_short_of_device_blocks_plans_no_h2d_copy_of_its_host_prefix() {
        let mut rig = rig_with(false, 12, 4);
        // B runs on eight blocks; C's four evict A's (four left beside B's).
        let a = prompt(16, 31);
        host_only_prefix(&mut rig, &a, &prompt(32, 32), &prompt(16, 33));
        let blocks = rig.s.cache().blocks_at(&a, 16);
        assert_eq!(blocks.len(), 4);
        for x in &blocks {
            assert!(rig.s.cache().host().contains(*x), "A on Host");
            assert!(
                !rig.s.cache().device().contains(*x),
                "A evicted from the Device"
            );
        }
        // A's prefix and four new blocks: eight Device blocks, four available.
        let mut d = a.clone();
        d.extend(prompt(16, 34));
        let plan = rig.arrive(&[(4, &d, 1)]);
        waited_untouched(&rig, &plan, 4);
    }

    /// With two cache groups, a request short of Device blocks in one group waits with
    /// nothing taken, though the other group's room would cover the shortfall in a sum: its
    /// Host prefix (four Full blocks, the sliding window's two) is not copied in.
    #[test]
    fn a_request_short_in_one_cache_group_plans_no_h2d_copy() {
        let mut rig = rig_of("hybrid-swa", false, 12, 4, 1024);
        // B runs on five blocks a group; C's seven evict A's.
        let a = prompt(16, 41);
        host_only_prefix(&mut rig, &a, &prompt(20, 42), &prompt(28, 43));
        let avail = |rig: &Rig| {
            let d = rig.s.cache().device();
            (d.available(0), d.available(1))
        };
        assert_eq!(avail(&rig), (7, 7));
        // A's prefix and four new blocks: eight Full blocks (one short), six in the window
        // group (room for seven).
        let mut d = a.clone();
        d.extend(prompt(16, 44));
        let plan = rig.arrive(&[(4, &d, 1)]);
        waited_untouched(&rig, &plan, 4);
        assert_eq!(avail(&rig), (7, 7), "nothing taken");
        // B finishes: the Full group has room, and D is admitted from its Host prefix.
        rig.apply(super::super::AgreedInputs {
            cancellations: vec![RequestId(2)],
            ..Default::default()
        });
        let plan = rig.plan();
        let [(id, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(*id, RequestId(4));
        assert_eq!(step.context_len, 16);
        assert_eq!(plan.h2d.len(), 6, "four Full blocks and the window's two");
    }

    #[test]
    fn an_admitted_request_no_longer_holds_its_prompt_index() {
        // Admission is the index's last reader (an admitted request never matches again).
        let mut rig = rig_with(false, 64, 1);
        let (a, b) = (prompt(16, 21), prompt(16, 22));
        let plan = rig.arrive(&[(1, &a, 1), (2, &b, 1)]);
        let ids: Vec<u64> = plan.forwards.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, vec![1]);
        assert!(rig.s.requests[&RequestId(1)].index.is_none());
        // The one left queued by max_running was not tried: no index yet.
        assert!(rig.s.requests[&RequestId(2)].index.is_none());
        // The first finishes; the second is admitted and drops the index made for it.
        rig.d2h_done();
        rig.apply(super::super::AgreedInputs {
            digests: digests_of(&plan),
            ..Default::default()
        });
        let plan = rig.plan();
        let ids: Vec<u64> = plan.forwards.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, vec![2]);
        assert!(rig.s.requests[&RequestId(2)].index.is_none());
    }

    #[test]
    fn admission_stops_at_max_running() {
        let mut rig = rig_with(false, 64, 2);
        let ps: Vec<Vec<u32>> = (0..3).map(|i| prompt(8, 10 + i)).collect();
        let plan = rig.arrive(&[(1, &ps[0], 4), (2, &ps[1], 4), (3, &ps[2], 4)]);
        let ids: Vec<u64> = plan.forwards.iter().map(|(id, _)| id.0).collect();
        assert_eq!(ids, vec![1, 2]);
        assert_eq!(rig.s.state_of(RequestId(3)), Some("submitted"));
        assert_eq!(rig.s.running.len(), 2);
        assert_eq!(rig.s.stats().admitted, 2, "each admission counted once");
    }

    #[test]
    fn a_new_prompt_writes_its_full_blocks_and_its_tail_block() {
        let mut rig = rig(false);
        let p = prompt(30, 5);
        let plan = rig.arrive(&[(1, &p, 4)]);
        let [(_, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(
            step.groups[0].written.len(),
            8,
            "seven full blocks and the tail"
        );
        assert!(rig.s.requests[&RequestId(1)].scratch.is_empty());
        // The tail block (tokens 28..30) is a cached Device block, published, and goes to
        // Host like a full block; the request holds it.
        let c = rig.s.cache();
        let tail = *c.blocks_at(&p, 30).last().unwrap();
        assert!(c.device().contains(tail));
        assert_eq!(
            step.groups[0].written.last(),
            Some(&rig.s.device_slot(tail).unwrap())
        );
        assert!(rig.s.requests[&RequestId(1)].device_refs.contains(&tail));
        assert_eq!(
            plan.d2h.len(),
            8,
            "the new full blocks and the tail go to Host"
        );
        assert_eq!(rig.s.d2h_blocks.last(), Some(&tail));
        assert_eq!(c.tail_table().len(), 1, "the prompt end's tail hint");
        assert!(step.copy_on_write.is_empty(), "nothing restored");
    }

    /// A prefix reused up to an aligned boundary restores no partial block: the forward
    /// writes its first block from that block's start, so nothing is copied on write.
    #[test]
    fn an_admission_at_an_aligned_boundary_copies_no_block_on_write() {
        let mut rig = rig(false);
        let p = prompt(32, 5);
        rig.arrive(&[(1, &p, 4)]);
        let mut q = p[..16].to_vec();
        q.extend(prompt(16, 6));
        let plan = rig.arrive(&[(2, &q, 4)]);
        let [(id, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(*id, RequestId(2));
        assert_eq!(
            step.context_len, 16,
            "the four shared blocks, on the Device"
        );
        assert_eq!(step.groups[0].context.len(), 4);
        assert!(step.copy_on_write.is_empty(), "{:?}", step.copy_on_write);
    }

    #[test]
    fn without_tails_a_new_prompt_writes_its_full_blocks_and_one_scratch_slot() {
        let mut rig = rig_without_tails(false);
        let p = prompt(30, 5);
        let plan = rig.arrive(&[(1, &p, 4)]);
        let [(_, step)] = &plan.forwards[..] else {
            panic!("{:?}", plan.forwards);
        };
        assert_eq!(step.context_len, 0);
        assert_eq!(
            step.groups[0].written.len(),
            8,
            "seven full blocks and the tail"
        );
        let scratch = rig.s.requests[&RequestId(1)].scratch.clone();
        assert_eq!(scratch.len(), 1);
        let tail = rig.s.cfg.layout.scratch_slot(scratch[0]);
        assert_eq!(step.groups[0].written.last(), Some(&tail));
        assert_eq!(plan.d2h.len(), 7, "the new full blocks go to Host");
        assert_eq!(rig.s.stats().computed, 30);
    }

    fn matched(boundary: u32, device_tokens: u32) -> Matched {
        Matched {
            boundary,
            device_tokens,
            reusable: 31,
            prompt_len: 32,
        }
    }

    const ON: StorageState = StorageState {
        stm_enabled: true,
        l3_enabled: true,
    };

    #[test]
    fn the_l3_part_of_a_split_needs_a_ready_hold() {
        let mut res = AdmissionResources {
            planned_boundary: 28,
            local_at_plan: 8,
            ..AdmissionResources::default()
        };
        let s = prefix_split(&res, matched(28, 4));
        assert_eq!((s.device, s.host, s.l3, s.computed), (4, 24, 0, 4));
        res.ready = Some(crate::storage_transfer::StorageLease {
            request: RequestId(1),
            serial: 1,
        });
        let s = prefix_split(&res, matched(28, 4));
        assert_eq!((s.device, s.host, s.l3, s.computed), (4, 4, 20, 4));
    }

    #[test]
    fn admission_fallback_reasons() {
        let res = AdmissionResources {
            planned_boundary: 28,
            ..AdmissionResources::default()
        };
        let off = StorageState {
            stm_enabled: false,
            l3_enabled: false,
        };
        let quarantined = StorageState {
            stm_enabled: true,
            l3_enabled: false,
        };
        let f =
            |st, res: &AdmissionResources, b, l3| admission_fallback(st, res, matched(b, 0), l3, 4);
        assert_eq!(f(off, &res, 28, 0), FallbackReason::Disabled);
        assert_eq!(f(quarantined, &res, 28, 0), FallbackReason::Quarantine);
        assert_eq!(
            f(ON, &res, 28, 28),
            FallbackReason::None,
            "whole reusable prefix"
        );
        assert_eq!(f(ON, &res, 16, 8), FallbackReason::Partial);
        // The QUERY planned up to 16 (a lookahead bound) and the hit reached it: no
        // shortfall of the plan, though the reusable bound lies above.
        let planned_16 = AdmissionResources {
            planned_boundary: 16,
            ..AdmissionResources::default()
        };
        assert_eq!(f(ON, &planned_16, 16, 8), FallbackReason::None);
        assert_eq!(f(ON, &res, 0, 0), FallbackReason::Miss);
        let recorded = AdmissionResources {
            fallback: Some(FallbackReason::Deadline),
            ..AdmissionResources::default()
        };
        assert_eq!(f(ON, &recorded, 0, 0), FallbackReason::Deadline);
    }
}
