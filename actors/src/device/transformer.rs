//! The transformer forward backend: a Llama-family decoder (the `transformer` crate, candle)
//! reading its context KV from the Device blocks a step's table names — whichever tier
//! restored them — and writing the new positions' KV rows into the written blocks, in the
//! row layout the cache geometry was derived from (`model::checkpoint`). It draws each token
//! on the device (`model::sampling`) and keeps each running request's KV for its decode
//! steps until the request is released.
//!
//! It owns the loaded weights and the decode KV of running requests. It never decides which
//! request runs, never allocates blocks and never sleeps: its device time is the time it
//! really computes (the engine measures it), not a cost model.

use super::engine::DeviceCopyEngineCore;
use super::forward::{DecodeStep, ForwardOutcome, ForwardStep};
use super::memory::DeviceMemory;
use super::ops::DeviceError;
use crate::model::sampling::sample;
use crate::model::{RankDigest, SyntheticModel};
use messages::{RequestId, SamplingParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use transformer::{RequestKv, Transformer};

/// The transformer and the decode KV of the requests it runs.
pub struct TransformerBackend {
    model: Arc<Transformer>,
    /// The cache geometry (one Full group of `block_tokens`-token blocks of KV rows).
    geometry: Arc<SyntheticModel>,
    row_bytes: u64,
    block_tokens: u64,
    running: BTreeMap<RequestId, RequestKv>,
}

fn err(e: impl std::fmt::Display) -> DeviceError {
    DeviceError::Forward(e.to_string())
}

impl TransformerBackend {
    /// `geometry` must be the profile `model::checkpoint::profile_of` derived for `model`.
    pub fn new(
        model: Arc<Transformer>,
        geometry: Arc<SyntheticModel>,
    ) -> Result<Self, DeviceError> {
        let groups = &geometry.profile().groups;
        let [g] = groups.as_slice() else {
            return Err(err(format!(
                "the transformer backend needs one Full cache group, the geometry has {}",
                groups.len()
            )));
        };
        let row_bytes = model.kv_layout().row_bytes() as u64;
        if g.bytes_per_token_or_checkpoint() != row_bytes {
            return Err(err(format!(
                "the cache geometry holds {} bytes per token, the model's KV row is {row_bytes}",
                g.bytes_per_token_or_checkpoint()
            )));
        }
        Ok(Self {
            model,
            block_tokens: g.block_tokens,
            geometry,
            row_bytes,
            running: BTreeMap::new(),
        })
    }

    pub fn model(&self) -> &Arc<Transformer> {
        &self.model
    }

    /// Requests whose decode KV this backend holds.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    fn outcome(
        &self,
        logits: &[f32],
        sampling: &SamplingParams,
        output_index: u64,
        shard: messages::Shard,
        tokens: u64,
        new_tokens: u64,
    ) -> ForwardOutcome {
        let s = sample(logits, sampling, output_index);
        ForwardOutcome {
            digest: RankDigest {
                shard,
                tokens,
                value: u64::from(s.token),
            },
            new_tokens,
            device_time_us: 0,
            logprobs: s.logprobs,
        }
    }

    /// A prefill: the context rows read from the context blocks, the new rows written into
    /// the written blocks (a partial last context block is both: its new rows go after the
    /// context rows), the first token drawn from the last position's logits.
    pub fn forward<M: DeviceMemory>(
        &mut self,
        core: &mut DeviceCopyEngineCore<M>,
        id: RequestId,
        step: &ForwardStep,
    ) -> Result<ForwardOutcome, DeviceError> {
        if step.shard.count != 1 {
            return Err(err(format!(
                "the transformer backend runs on one rank, the step is shard {} of {}",
                step.shard.index, step.shard.count
            )));
        }
        let [table] = step.groups.as_slice() else {
            return Err(err(format!(
                "{} block tables for the transformer's one cache group",
                step.groups.len()
            )));
        };
        let c = step.context_len;
        let end = step.tokens.len() as u64;
        let req = self.geometry.required_blocks(0, c)?;
        let wr = self.geometry.written_blocks(0, c, end)?;
        if table.context.len() as u64 != req.end - req.start
            || table.written.len() as u64 != wr.end - wr.start
        {
            return Err(err(format!(
                "{} context / {} written slots, need {} / {}",
                table.context.len(),
                table.written.len(),
                req.end - req.start,
                wr.end - wr.start
            )));
        }
        let bt = self.block_tokens;
        let mut context = Vec::with_capacity(table.context.len());
        for (k, slot) in table.context.iter().enumerate() {
            let b = req.start + k as u64;
            let rows = (c - b * bt).min(bt);
            core.check_slot(*slot)?;
            core.check_context(*slot)?;
            context.push(core.read_slot(*slot, 0, rows * self.row_bytes)?);
        }
        let chunks: Vec<&[u8]> = context.iter().map(|v| v.as_slice()).collect();
        let out = self
            .model
            .prefill(&step.tokens, c as usize, &chunks)
            .map_err(err)?;
        for (k, slot) in table.written.iter().enumerate() {
            let b = wr.start + k as u64;
            let from = c.max(b * bt);
            let to = end.min((b + 1) * bt);
            let src = (from - c) * self.row_bytes..(to - c) * self.row_bytes;
            let bytes = out
                .new_rows
                .get(src.start as usize..src.end as usize)
                .ok_or_else(|| err("the model returned fewer rows than it computed"))?;
            core.write_slot(*slot, (from - b * bt) * self.row_bytes, bytes)?;
            // A partial block's unused rows are zeroed: its D2H copy (and an L3 object made
            // from it) never carries a freed block's stale bytes.
            let used = (to - b * bt) * self.row_bytes;
            let slot_bytes = core.geometry().slot_bytes;
            if used < slot_bytes {
                core.write_slot(*slot, used, &vec![0u8; (slot_bytes - used) as usize])?;
            }
        }
        let outcome = self.outcome(&out.logits, &step.sampling, 0, step.shard, end, end - c);
        self.running.insert(id, out.kv);
        Ok(outcome)
    }

    /// A decode step on the request's KV (the prefill's context and new rows, then every
    /// decoded token).
    pub fn decode(
        &mut self,
        id: RequestId,
        step: &DecodeStep,
    ) -> Result<ForwardOutcome, DeviceError> {
        let kv = self
            .running
            .get_mut(&id)
            .ok_or_else(|| err(format!("request {id:?} has no KV on the device to decode")))?;
        if kv.len() as u64 != step.position {
            return Err(err(format!(
                "request {id:?}: a decode step at position {} but its KV holds {} positions",
                step.position,
                kv.len()
            )));
        }
        let logits = self.model.decode(kv, step.token).map_err(err)?;
        let tokens = step.position + 1;
        Ok(self.outcome(
            &logits,
            &step.sampling,
            step.output_index,
            messages::Shard::SINGLE,
            tokens,
            1,
        ))
    }

    pub fn release(&mut self, ids: &[RequestId]) {
        for id in ids {
            self.running.remove(id);
        }
    }
}
