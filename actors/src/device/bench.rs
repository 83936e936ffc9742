//! `engine-host bench flat-kv` body: one prompt's flat KV computed on the emulated device,
//! D2H into Host, H2D into other slots, and the restored forward, with wall-clock figures
//! of each step side by side with the cost model's recomputation time. Benchmark only:
//! its timings are printed, never asserted.

use super::*;
use crate::host::HostCacheStorage;
use crate::model::{GroupKind, ModelProfile, Shard, SyntheticModel};
use messages::HostRange;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug, PartialEq)]
pub struct FlatKvBenchReport {
    pub profile: &'static str,
    pub prompt_tokens: u64,
    pub blocks: u64,
    pub kv_bytes: u64,
    /// Wall time of the device forward computing every block (CPU: KV generation + digest).
    pub compute_kv_s: f64,
    pub d2h_s: f64,
    pub h2d_s: f64,
    /// Wall time of the forward over the restored prefix (one new token).
    pub restored_forward_s: f64,
    /// Wall time of the same forward over the blocks the first forward produced (a Device
    /// hit).
    pub device_hit_forward_s: f64,
    /// A plain memcpy of the same bytes between two resident buffers (the baseline of the
    /// emulated copies).
    pub memcpy_s: f64,
    /// Cost-model device time of recomputing the whole prompt.
    pub model_recompute_us: u64,
    /// Cost-model device time of the last token on top of the restored prefix.
    pub model_restored_us: u64,
    /// Host->device bandwidth at which restoring breaks even with recomputation.
    pub break_even_bytes_per_s: f64,
    /// The restored forward's first token equalled recomputation.
    pub output_matches: bool,
}

impl fmt::Display for FlatKvBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gbps = |s: f64| self.kv_bytes as f64 / s.max(1e-12) / 1e9;
        writeln!(
            f,
            "flat-kv {}: {} tokens, {} blocks, {} KV bytes",
            self.profile, self.prompt_tokens, self.blocks, self.kv_bytes
        )?;
        writeln!(
            f,
            "  compute KV (emulated forward): {:.3} ms",
            self.compute_kv_s * 1e3
        )?;
        writeln!(
            f,
            "  D2H (emulated): {:.3} ms, {:.2} GB/s",
            self.d2h_s * 1e3,
            gbps(self.d2h_s)
        )?;
        writeln!(
            f,
            "  H2D (emulated): {:.3} ms, {:.2} GB/s",
            self.h2d_s * 1e3,
            gbps(self.h2d_s)
        )?;
        writeln!(
            f,
            "  restored forward (digest from the unit hashes H2D recorded): {:.3} ms, {:.2} GB/s of context",
            self.restored_forward_s * 1e3,
            gbps(self.restored_forward_s)
        )?;
        writeln!(
            f,
            "  device-hit forward (digest from the unit hashes the forward recorded): {:.3} ms",
            self.device_hit_forward_s * 1e3,
        )?;
        writeln!(
            f,
            "  memcpy of the same bytes: {:.3} ms, {:.2} GB/s; H2D / memcpy {:.2}, D2H / memcpy {:.2}",
            self.memcpy_s * 1e3,
            gbps(self.memcpy_s),
            self.memcpy_s / self.h2d_s.max(1e-12),
            self.memcpy_s / self.d2h_s.max(1e-12)
        )?;
        writeln!(
            f,
            "  cost model: recompute {} us, restored {} us, ratio {:.2}",
            self.model_recompute_us,
            self.model_restored_us,
            self.model_recompute_us as f64 / self.model_restored_us.max(1) as f64
        )?;
        writeln!(
            f,
            "  restore beats recompute above {:.2} GB/s H2D; emulated H2D time / recompute time = {:.3}",
            self.break_even_bytes_per_s / 1e9,
            self.h2d_s * 1e6 / self.model_recompute_us.max(1) as f64
        )?;
        write!(f, "  output matches recomputation: {}", self.output_matches)
    }
}

/// The profiles `flat_kv` runs on: one cache group, full attention.
pub fn flat_kv_profiles() -> Vec<&'static str> {
    ModelProfile::NAMES
        .into_iter()
        .filter(|n| {
            ModelProfile::by_name(n)
                .is_ok_and(|p| p.groups.len() == 1 && p.groups[0].kind == GroupKind::Full)
        })
        .collect()
}

/// Runs the benchmark for a profile of one full-attention group (`flat_kv_profiles`).
pub fn flat_kv(profile: &str, prompt_tokens: u64) -> Result<FlatKvBenchReport, DeviceError> {
    let model = Arc::new(SyntheticModel::by_name(profile)?);
    let groups = model.profile().groups.len();
    if groups != 1 || model.profile().groups[0].kind != GroupKind::Full {
        return Err(DeviceError::Forward(format!(
            "bench flat-kv --profile {profile}: the profile has {groups} cache groups; flat-kv needs one full-attention group, the profiles that work are {}",
            flat_kv_profiles().join(", ")
        )));
    }
    if prompt_tokens < 2 {
        return Err(DeviceError::Forward(format!(
            "bench flat-kv --tokens {prompt_tokens}: must be at least 2"
        )));
    }
    let shard = Shard::SINGLE;
    let tokens: Vec<u32> = (0..prompt_tokens)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) % model.profile().vocab)
        .collect();
    let blocks = model.written_blocks(0, 0, prompt_tokens)?.end;
    let slot_bytes = model.profile().max_shard_block_bytes(1)?;
    let lens: Vec<u64> = (0..blocks)
        .map(|b| model.block_len(0, b, prompt_tokens, shard))
        .collect::<Result<_, _>>()?;
    let kv_bytes: u64 = lens.iter().sum();
    let host =
        HostCacheStorage::new(kv_bytes.max(1)).map_err(|e| DeviceError::Geometry(e.to_string()))?;
    let slots =
        u32::try_from(blocks * 2).map_err(|_| DeviceError::Geometry("too many blocks".into()))?;
    let mem = EmulatedDeviceMemory::new(host.clone(), DeviceGeometry::new(slots, slot_bytes)?)?;
    let mut e = DeviceCopyEngineCore::new(mem);
    e.set_digest_unit(model.digest_unit());
    let first: Vec<DeviceSlot> = (0..blocks as u32).map(DeviceSlot).collect();
    let second: Vec<DeviceSlot> = (0..blocks as u32)
        .map(|b| DeviceSlot(b + blocks as u32))
        .collect();

    let t = Instant::now();
    e.forward(
        &model,
        &ForwardStep {
            shard,
            tokens: tokens.clone(),
            context_len: 0,
            groups: vec![GroupBlockTable {
                context: vec![],
                written: first.clone(),
            }],
            sampling: messages::SamplingParams::GREEDY,
            copy_on_write: vec![],
        },
    )?;
    let compute_kv_s = t.elapsed().as_secs_f64();

    let mut offset = 0;
    let ranges: Vec<HostRange> = lens
        .iter()
        .map(|l| {
            let r = HostRange::new(offset, *l);
            offset += l;
            r
        })
        .collect();
    let d2h = DeviceCopyBatch::new(
        (0..blocks as usize)
            .map(|b| DeviceCopy::d2h(first[b], 0, ranges[b]))
            .collect(),
    );
    let t = Instant::now();
    let f = e.submit(&d2h)?;
    while !e.poll_fences()?.contains(&f) {}
    let d2h_s = t.elapsed().as_secs_f64();
    let h2d = DeviceCopyBatch::new(
        (0..blocks as usize)
            .map(|b| DeviceCopy::h2d(ranges[b], second[b], 0))
            .collect(),
    );
    let t = Instant::now();
    let f = e.submit(&h2d)?;
    while !e.poll_fences()?.contains(&f) {}
    let h2d_s = t.elapsed().as_secs_f64();

    // restored prefix: every token but the last, from the second set of slots
    let c = prompt_tokens - 1;
    let req = model.required_blocks(0, c)?;
    let wr = model.written_blocks(0, c, prompt_tokens)?;
    let step = ForwardStep {
        shard,
        tokens: tokens.clone(),
        context_len: c,
        groups: vec![GroupBlockTable {
            context: second[req.start as usize..req.end as usize].to_vec(),
            written: second[wr.start as usize..wr.end as usize].to_vec(),
        }],
        sampling: messages::SamplingParams::GREEDY,
        copy_on_write: vec![],
    };
    let t = Instant::now();
    let out = e.forward(&model, &step)?;
    let restored_forward_s = t.elapsed().as_secs_f64();
    let hit = ForwardStep {
        groups: vec![GroupBlockTable {
            context: first[req.start as usize..req.end as usize].to_vec(),
            written: first[wr.start as usize..wr.end as usize].to_vec(),
        }],
        ..step.clone()
    };
    let t = Instant::now();
    let hit_out = e.forward(&model, &hit)?;
    let device_hit_forward_s = t.elapsed().as_secs_f64();
    // The baseline: one memcpy of the same bytes between two resident buffers.
    let src = vec![1u8; kv_bytes as usize];
    let mut dst = vec![0u8; kv_bytes as usize];
    dst.copy_from_slice(&src); // first touch, outside the timed copy
    let t = Instant::now();
    dst.copy_from_slice(std::hint::black_box(&src));
    std::hint::black_box(&dst);
    let memcpy_s = t.elapsed().as_secs_f64();
    drop((src, dst));
    let got = model.first_token(model.reduce_ranks(&[out.digest])?).0;
    let got_hit = model.first_token(model.reduce_ranks(&[hit_out.digest])?).0;
    let want = model.recompute_output(&tokens, 1)?.first().copied();
    let model_recompute_us = model.profile().device_time_us(prompt_tokens, 0);
    let model_restored_us = out.device_time_us;
    let saved_s = model_recompute_us.saturating_sub(model_restored_us) as f64 / 1e6;
    Ok(FlatKvBenchReport {
        profile: model.profile().name,
        prompt_tokens,
        blocks,
        kv_bytes,
        compute_kv_s,
        d2h_s,
        h2d_s,
        restored_forward_s,
        device_hit_forward_s,
        memcpy_s,
        model_recompute_us,
        model_restored_us,
        break_even_bytes_per_s: if saved_s > 0.0 {
            kv_bytes as f64 / saved_s
        } else {
            f64::INFINITY
        },
        output_matches: Some(got) == want && Some(got_hit) == want,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_kv_bench_restores_exactly_and_reports_sizes() {
        let r = flat_kv("tiny", 37).unwrap();
        assert!(r.output_matches);
        assert_eq!(r.blocks, 10);
        assert_eq!(r.kv_bytes, 37 * 16);
        assert!(r.model_recompute_us > r.model_restored_us);
        assert!(r.to_string().contains("output matches recomputation: true"));
        assert!(flat_kv("hybrid-swa", 37).is_err());
        assert!(flat_kv("tiny", 1).is_err());
        assert!(flat_kv("nope", 8).is_err());
    }
}
