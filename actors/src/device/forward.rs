//! The forward step hook: runs the synthetic model over a request's device blocks. It
//! gathers the context blocks' bytes from their slots in context order (whatever tier they
//! were restored from), computes this rank's digest, writes the new tokens' KV rows into
//! the written slots, and returns the emulated device time from the cost model as a
//! number. It never sleeps; the engine host decides what to do with the time.

use super::engine::DeviceCopyEngineCore;
use super::memory::{DeviceMemory, HostView};
use super::ops::{DeviceError, DeviceSlot};
use super::unit_hashes::UnitHashes;
use crate::model::{GroupContext, GroupWritten, RankDigest, Shard, SyntheticModel};
use messages::{SamplingParams, TokenLogprobs};

/// One group's block table for a step: the slots of `required_blocks(group, context_len)`
/// in order, and the slots of `written_blocks(group, context_len, tokens.len())` in order
/// (a partially filled last context block appears in both).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GroupBlockTable {
    pub context: Vec<DeviceSlot>,
    pub written: Vec<DeviceSlot>,
}

/// A prefill step of one request on one rank.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForwardStep {
    pub shard: Shard,
    /// The whole prompt.
    pub tokens: Vec<u32>,
    /// Tokens whose KV is already in the context slots.
    pub context_len: u64,
    /// One table per group, in group order.
    pub groups: Vec<GroupBlockTable>,
    /// How a backend that draws on the device picks the first output token.
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Copy-on-write of partial history blocks, done before the forward: a restored tail
    /// block's bytes are copied into the block the forward writes (which appends the new
    /// rows after them), so the restored block itself is never written.
    #[serde(default)]
    pub copy_on_write: Vec<SlotCopy>,
}

/// A whole-slot copy on the Device (`from` stays untouched).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct SlotCopy {
    pub from: DeviceSlot,
    pub to: DeviceSlot,
}

/// One decode step of a backend that draws tokens on the device: `token` (the last output
/// token) is fed at `position` and the next token is drawn as output `output_index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecodeStep {
    pub token: u32,
    pub position: u64,
    pub sampling: SamplingParams,
    pub output_index: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForwardOutcome {
    /// This rank's partial digest, for the all-reduce (a backend that draws on the device:
    /// `value` is the drawn token).
    pub digest: RankDigest,
    pub new_tokens: u64,
    /// Emulated device time of the step (cost model), microseconds.
    pub device_time_us: u64,
    /// The drawn token's log-probabilities, when the request asked for them.
    pub logprobs: Option<TokenLogprobs>,
}

impl<M: DeviceMemory> DeviceCopyEngineCore<M> {
    /// The forward over a host-addressable arena (the emulated device): the context is
    /// read in place, once, and the new rows are written in place, with no gather copy.
    /// None when the backend has no such arena. `writes` are validated (group, block,
    /// slot, length).
    fn forward_in_place(
        &mut self,
        model: &SyntheticModel,
        step: &ForwardStep,
        writes: &[(usize, u64, DeviceSlot, u64)],
    ) -> Result<Option<ForwardOutcome>, DeviceError> {
        let c = step.context_len;
        let end = step.tokens.len() as u64;
        let mut context_at: Vec<Vec<(u64, u64)>> = Vec::with_capacity(step.groups.len());
        for (g, table) in step.groups.iter().enumerate() {
            let req = model.required_blocks(g, c)?;
            let mut blocks = Vec::with_capacity(table.context.len());
            for (k, slot) in table.context.iter().enumerate() {
                let len = model.block_len(g, req.start + k as u64, c, step.shard)?;
                blocks.push((self.slot_range(*slot, len)?, len));
            }
            context_at.push(blocks);
        }
        let mut write_at = Vec::with_capacity(writes.len());
        for (g, b, slot, len) in writes {
            write_at.push((*g, *b, self.slot_range(*slot, *len)?, *len));
        }
        let mut chains = Vec::with_capacity(step.groups.len());
        for g in 0..step.groups.len() {
            chains.push(model.chain(g, &step.tokens)?);
        }
        let slot_bytes = self.geometry().slot_bytes as usize;
        let Some(HostView { arena, units }) = self.host_view()? else {
            return Ok(None);
        };
        // a core driven without a backend (tests, benches) binds the unit here
        units.set_unit(model.digest_unit());
        let range = |addr: u64, len: u64| -> Result<std::ops::Range<usize>, DeviceError> {
            let start = usize::try_from(addr).ok();
            start
                .and_then(|s| s.checked_add(len as usize).map(|e| s..e))
                .filter(|r| r.end <= arena.len())
                .ok_or_else(|| {
                    DeviceError::Forward(format!("device range {addr}+{len} outside arena"))
                })
        };
        let mut ranges = Vec::with_capacity(context_at.len());
        for g in &context_at {
            ranges.push(
                g.iter()
                    .map(|(a, l)| range(*a, *l))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        let mut write_ranges = Vec::with_capacity(write_at.len());
        for (g, b, a, l) in &write_at {
            write_ranges.push((*g, *b, range(*a, *l)?));
        }
        // With records (the digest unit is large enough): every context block's record is
        // taken before this step writes anything (a block without one is hashed now, once;
        // later steps read it), so a written slot that is also context cannot change what
        // the context digest reads. Without records the digest reads the bytes, before the
        // writes.
        let recording = units.unit() > 0;
        let mut context_units: Vec<Vec<Vec<u64>>> = Vec::new();
        let mut digest = None;
        if recording {
            for r in ranges.iter().flatten() {
                if units.get(r.start, r.len()).is_none() {
                    units.record(r.start, &arena[r.clone()]);
                }
            }
            context_units = ranges
                .iter()
                .map(|g| {
                    g.iter()
                        .map(|r| {
                            units
                                .get(r.start, r.len())
                                .map(<[u64]>::to_vec)
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .collect();
        } else {
            let view: &[u8] = arena;
            let context: Vec<GroupContext<'_>> = ranges
                .iter()
                .map(|g| GroupContext {
                    blocks: g.iter().map(|r| &view[r.clone()]).collect(),
                    units: Vec::new(),
                })
                .collect();
            digest = Some(model.prefill_rank(step.shard, &step.tokens, c, &context)?);
        }
        for (g, b, r) in &write_ranges {
            let tail_end = (r.start + slot_bytes).min(arena.len());
            model.fill_block_from(*g, &chains[*g], *b, step.shard, c, &mut arena[r.clone()])?;
            // A partial block's unused rows are zeroed: its D2H copy (and an L3 object made
            // from it) never carries a freed block's stale bytes.
            arena[r.end..tail_end].fill(0);
            // the produced block's record: a later step that reads it as context (a
            // Device hit) digests it from there
            units.record(r.start, &arena[r.clone()]);
        }
        let digest = match digest {
            Some(d) => d,
            None => {
                // the new rows are digested from the records of the blocks just written
                // (each row generated once), the context from its records taken above
                let view: &[u8] = arena;
                let units: &UnitHashes = units;
                let context: Vec<GroupContext<'_>> = ranges
                    .iter()
                    .zip(&context_units)
                    .map(|(g, u)| GroupContext {
                        blocks: g.iter().map(|r| &view[r.clone()]).collect(),
                        units: u.iter().map(Vec::as_slice).collect(),
                    })
                    .collect();
                let mut written: Vec<GroupWritten<'_>> = (0..step.groups.len())
                    .map(|g| {
                        Ok(GroupWritten {
                            first_block: model.written_blocks(g, c, end)?.start,
                            units: Vec::new(),
                        })
                    })
                    .collect::<Result<_, DeviceError>>()?;
                for (g, _, r) in &write_ranges {
                    if let Some(u) = units.get(r.start, r.len()) {
                        written[*g].units.push(u);
                    }
                }
                // a group whose written blocks are not all recorded generates its new rows
                for (g, w) in written.iter_mut().enumerate() {
                    if w.units.len() != step.groups[g].written.len() {
                        w.units.clear();
                    }
                }
                model.prefill_rank_written(step.shard, &step.tokens, c, &context, &written)?
            }
        };
        Ok(Some(ForwardOutcome {
            digest,
            new_tokens: end - c,
            device_time_us: model.profile().device_time_us(end - c, c),
            logprobs: None,
        }))
    }

    /// Runs the forward of `step` over device blocks. Ordered after every submitted copy.
    pub fn forward(
        &mut self,
        model: &SyntheticModel,
        step: &ForwardStep,
    ) -> Result<ForwardOutcome, DeviceError> {
        let groups = model.profile().groups.len();
        if step.groups.len() != groups {
            return Err(DeviceError::Forward(format!(
                "{} block tables for {} groups",
                step.groups.len(),
                groups
            )));
        }
        let c = step.context_len;
        let end = step.tokens.len() as u64;
        // validate every table before touching anything
        let mut writes = Vec::new();
        for (g, table) in step.groups.iter().enumerate() {
            let req = model.required_blocks(g, c)?;
            let wr = model.written_blocks(g, c, end)?;
            if table.context.len() as u64 != req.end - req.start
                || table.written.len() as u64 != wr.end - wr.start
            {
                return Err(DeviceError::Forward(format!(
                    "group {g}: {} context / {} written slots, need {} / {}",
                    table.context.len(),
                    table.written.len(),
                    req.end - req.start,
                    wr.end - wr.start
                )));
            }
            for slot in &table.context {
                self.check_slot(*slot)?;
                self.check_context(*slot)?;
            }
            for (k, slot) in table.written.iter().enumerate() {
                let b = wr.start + k as u64;
                let len = model.block_len(g, b, end, step.shard)?;
                self.check_slot(*slot)?;
                if len > self.geometry().slot_bytes {
                    return Err(DeviceError::Forward(format!(
                        "group {g} block {b}: {len} bytes exceed the slot"
                    )));
                }
                writes.push((g, b, *slot, len));
            }
        }
        if let Some(out) = self.forward_in_place(model, step, &writes)? {
            return Ok(out);
        }
        let mut gathered: Vec<Vec<Vec<u8>>> = Vec::with_capacity(groups);
        for (g, table) in step.groups.iter().enumerate() {
            let req = model.required_blocks(g, c)?;
            let mut blocks = Vec::with_capacity(table.context.len());
            for (k, slot) in table.context.iter().enumerate() {
                let len = model.block_len(g, req.start + k as u64, c, step.shard)?;
                blocks.push(self.read_slot(*slot, 0, len)?);
            }
            gathered.push(blocks);
        }
        let context: Vec<GroupContext<'_>> = gathered
            .iter()
            .map(|g| GroupContext {
                blocks: g.iter().map(|b| b.as_slice()).collect(),
                units: Vec::new(),
            })
            .collect();
        let digest = model.prefill_rank(step.shard, &step.tokens, c, &context)?;
        let mut chains = Vec::with_capacity(groups);
        for g in 0..groups {
            chains.push(model.chain(g, &step.tokens)?);
        }
        let slot_bytes = self.geometry().slot_bytes;
        for (g, b, slot, len) in writes {
            let mut buf = self.read_slot(slot, 0, len)?;
            model.fill_block_from(g, &chains[g], b, step.shard, c, &mut buf)?;
            buf.resize(slot_bytes as usize, 0);
            self.write_slot(slot, 0, &buf)?;
        }
        Ok(ForwardOutcome {
            digest,
            new_tokens: end - c,
            device_time_us: model.profile().device_time_us(end - c, c),
            logprobs: None,
        })
    }
}
