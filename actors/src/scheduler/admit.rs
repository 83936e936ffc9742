//! Admission: queued requests move onto the Device in arrival order, up to `max_running`.
//! `try_admit` matches the real cache, plans every block it needs (`block_needs`), checks
//! that they fit, takes references and allocates (rolling back when something is short),
//! emits the H2D copies of Host hits, the forward and the D2H of new full blocks, and
//! accounts the prefix split and the fallback reason.
//!
//! The only place that decides Device admission. It never plans storage operations (a
//! Ready hold's lease is only handed back) and never performs I/O.

use super::plan::Plan;
use super::request::{PrefixSplit, RequestState};
use super::Scheduler;
use crate::cache::keys::{BlockAddr, PromptIndex};
use crate::device::{DeviceCopy, DeviceSlot, ForwardStep, GroupBlockTable};
use crate::frontend::FallbackReason;
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
    fn try_admit(&mut self, id: RequestId, plan: &mut Plan) -> Result<bool, String> {
        let (prompt, reusable) = match self.requests.get(&id) {
            Some(r) => (r.prompt.clone(), r.reusable()),
            None => return Ok(true),
        };
        // Only aligned boundaries are restored (a tail block is recomputed): match over
        // aligned candidates, so a tail hit never hides the aligned prefix below it.
        let m = self.cache.admission_match_aligned(&prompt, reusable);
        let (boundary, device_tokens) = (m.boundary, m.device_tokens);
        let len = prompt.len() as u64;
        let geometry = self.cfg.layout.geometry.clone();
        let index = PromptIndex::new(&geometry, &prompt, prompt.len() as u32);
        let groups = geometry.group_count();
        // Plan every block first; take nothing until everything fits.
        let mut context: Vec<Vec<BlockAddr>> = vec![vec![]; groups];
        let mut written_full: Vec<Vec<BlockAddr>> = vec![vec![]; groups];
        let mut written_partial = vec![false; groups];
        for g in 0..groups {
            let req = self
                .model
                .required_blocks(g, boundary as u64)
                .map_err(|e| e.to_string())?;
            for k in req {
                context[g].push(BlockAddr::new(g, index.block_hash(g, k as u32)));
            }
            let wr = self
                .model
                .written_blocks(g, boundary as u64, len)
                .map_err(|e| e.to_string())?;
            let full = index.full_blocks(g) as u64;
            for k in wr {
                if k < full {
                    written_full[g].push(BlockAddr::new(g, index.block_hash(g, k as u32)));
                } else {
                    written_partial[g] = true;
                }
            }
        }
        let scratch_needed = written_partial.iter().filter(|p| **p).count();
        if scratch_needed > self.free_scratch.len() {
            return Ok(false);
        }
        let new_device: usize = context
            .iter()
            .flatten()
            .chain(written_full.iter().flatten())
            .filter(|a| !self.cache.device().contains(**a))
            .count();
        let available: u64 = (0..groups as u32)
            .map(|g| self.cache.device().available(g))
            .sum();
        if new_device as u64 > available {
            return Ok(false);
        }
        // Take references and allocate.
        let mut held: Vec<BlockAddr> = vec![];
        let mut tables: Vec<GroupBlockTable> = vec![GroupBlockTable::default(); groups];
        let mut new_written: Vec<BlockAddr> = vec![];
        let rollback = |s: &mut Self, held: &[BlockAddr]| {
            for a in held {
                let _ = s.cache.device_mut().release(*a);
            }
        };
        let mut h2d_refs = vec![];
        for g in 0..groups {
            for a in context[g].clone() {
                let slot = if self.cache.device().contains(a) {
                    if self.cache.device_mut().acquire(a).is_err() {
                        rollback(self, &held);
                        return Ok(false);
                    }
                    held.push(a);
                    self.device_slot(a)?
                } else {
                    // A Host hit: allocate a Device slot and copy the block in.
                    let range = self
                        .cache
                        .host()
                        .host_range(a)
                        .map_err(|e| format!("host block vanished: {e}"))?;
                    let mut evicted = vec![];
                    if self.cache.device_mut().allocate(a, &mut evicted).is_err() {
                        rollback(self, &held);
                        return Ok(false);
                    }
                    held.push(a);
                    let _ = self.cache.host_mut().acquire(a);
                    h2d_refs.push(a);
                    let slot = self.device_slot(a)?;
                    plan.h2d.push(DeviceCopy::h2d(range, slot, 0));
                    let _ = self.cache.device_mut().publish(a);
                    slot
                };
                tables[g].context.push(slot);
            }
            for a in written_full[g].clone() {
                let slot = if self.cache.device().contains(a) {
                    let _ = self.cache.device_mut().acquire(a);
                    held.push(a);
                    self.device_slot(a)?
                } else {
                    let mut evicted = vec![];
                    if self.cache.device_mut().allocate(a, &mut evicted).is_err() {
                        rollback(self, &held);
                        return Ok(false);
                    }
                    held.push(a);
                    new_written.push(a);
                    self.device_slot(a)?
                };
                tables[g].written.push(slot);
            }
        }
        let mut scratch = vec![];
        for (g, partial) in written_partial.iter().enumerate() {
            if *partial {
                let s = self.free_scratch.pop().ok_or("scratch slots exhausted")?;
                scratch.push(s);
                tables[g].written.push(self.cfg.layout.scratch_slot(s));
            }
        }
        // The forward writes the new blocks; they are published on the Device now (the
        // forward is ordered before any later reader of this round).
        for a in &new_written {
            let _ = self.cache.device_mut().publish(*a);
        }
        // D2H of new full blocks into Host L2 (published by `d2h_done`).
        for a in &new_written {
            if self.cache.host().state(*a).is_some() {
                continue;
            }
            let mut evicted = vec![];
            if self.cache.host_mut().allocate(*a, &mut evicted).is_err() {
                continue;
            }
            let Ok(range) = self.cache.host().host_range(*a) else {
                continue;
            };
            let slot = self.device_slot(*a)?;
            plan.d2h.push(DeviceCopy::d2h(slot, 0, range));
            self.d2h_blocks.push(*a);
        }
        self.h2d_host_refs.extend(h2d_refs);
        let step = ForwardStep {
            shard: self.cfg.layout.shard,
            tokens: prompt.clone(),
            context_len: boundary as u64,
            groups: tables,
        };
        plan.forwards.push((id, step));
        // Account the prefix split and hand the Ready hold back (admission now holds its
        // own references).
        let stm_enabled = self.storage.is_some();
        let l3_enabled = self.l3_enabled();
        let r = self.requests.get_mut(&id).ok_or("request vanished")?;
        let had_ready = r.resources.ready.is_some();
        let l3 = if had_ready {
            boundary
                .min(r.resources.planned_boundary)
                .saturating_sub(r.resources.local_at_plan.max(device_tokens))
        } else {
            0
        };
        let host = boundary.saturating_sub(device_tokens).saturating_sub(l3);
        r.split = PrefixSplit {
            device: device_tokens,
            host,
            l3,
            computed: prompt.len() as u32 - boundary,
        };
        let parent = self.cfg.layout.geometry.parent_tokens().max(1);
        let aligned = |b: u32| b / parent * parent;
        r.fallback = if !stm_enabled {
            FallbackReason::Disabled
        } else if !l3_enabled {
            FallbackReason::Quarantine
        } else if let Some(f) = r.resources.fallback {
            f
        } else if boundary >= aligned(reusable) {
            FallbackReason::None
        } else if l3 > 0 && boundary < aligned(r.resources.planned_boundary) {
            FallbackReason::Partial
        } else if l3 == 0 {
            FallbackReason::Miss
        } else {
            FallbackReason::None
        };
        r.device_refs = held;
        r.scratch = scratch;
        r.state = RequestState::Prefill;
        self.running.insert(id);
        let ready = r.resources.ready.take();
        self.stats.admitted += 1;
        self.stats.prefix_device += device_tokens as u64;
        self.stats.prefix_host += host as u64;
        self.stats.prefix_l3 += l3 as u64;
        self.stats.computed += prompt.len() as u64 - boundary as u64;
        if let (Some(lease), Some(planner)) = (ready, self.storage.as_mut()) {
            planner.detach(lease);
        }
        Ok(true)
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
