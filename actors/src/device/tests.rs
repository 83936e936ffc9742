//! DeviceCopyEngine tests on the host-emulated backend.

use super::*;
use crate::host::HostCacheStorage;
use crate::model::{Shard, SyntheticModel};
use messages::HostRange;
use std::sync::Arc;

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn engine(
    host_len: u64,
    slots: u32,
    slot_bytes: u64,
) -> (
    Arc<HostCacheStorage>,
    DeviceCopyEngineCore<EmulatedDeviceMemory>,
) {
    let host = HostCacheStorage::new(host_len).unwrap();
    let mem = EmulatedDeviceMemory::new(
        host.clone(),
        DeviceGeometry::new(slots, slot_bytes).unwrap(),
    )
    .unwrap();
    (host, DeviceCopyEngineCore::new(mem))
}

#[test]
fn d2h_then_h2d_into_another_slot_is_exact_and_touches_nothing_else() {
    let (host, mut e) = engine(16384, 4, 512);
    // fill the Host allocation and every device slot with sentinels
    let host_before = pattern(16384, 0xA5);
    host.write(0, &host_before).unwrap();
    for s in 0..4 {
        e.write_slot(DeviceSlot(s), 0, &vec![0x10 + s as u8; 512])
            .unwrap();
    }
    let block = pattern(300, 7);
    e.write_slot(DeviceSlot(1), 100, &block).unwrap();
    // D2H slot 1 [100, 400) -> Host [5000, 5300)
    let f1 = e
        .submit(&DeviceCopyBatch::new(vec![DeviceCopy::d2h(
            DeviceSlot(1),
            100,
            HostRange::new(5000, 300),
        )]))
        .unwrap();
    // H2D Host [5000, 5300) -> slot 3 [12, 312)
    let f2 = e
        .submit(&DeviceCopyBatch::new(vec![DeviceCopy::h2d(
            HostRange::new(5000, 300),
            DeviceSlot(3),
            12,
        )]))
        .unwrap();
    assert_eq!(e.poll_fences().unwrap(), vec![f1, f2]);
    assert_eq!(e.outstanding(), 0);
    assert_eq!(e.read_slot(DeviceSlot(3), 12, 300).unwrap(), block);
    // Host: only [5000, 5300) changed
    let host_after = host.read(HostRange::new(0, 16384)).unwrap();
    assert_eq!(&host_after[5000..5300], &block[..]);
    assert_eq!(&host_after[..5000], &host_before[..5000]);
    assert_eq!(&host_after[5300..], &host_before[5300..]);
    // device: slot 3 outside [12, 312) untouched, other slots untouched
    let s3 = e.read_slot(DeviceSlot(3), 0, 512).unwrap();
    assert!(s3[..12].iter().chain(&s3[312..]).all(|b| *b == 0x13));
    assert!(e
        .read_slot(DeviceSlot(0), 0, 512)
        .unwrap()
        .iter()
        .all(|b| *b == 0x10));
    assert!(e
        .read_slot(DeviceSlot(2), 0, 512)
        .unwrap()
        .iter()
        .all(|b| *b == 0x12));
    let arena = e.memory().arena();
    assert_eq!(&arena[512 + 100..512 + 400], &block[..]);
}

#[test]
fn fences_complete_in_order_and_copies_wait_for_them() {
    let (host, mut e) = engine(8192, 4, 256);
    e.memory_mut().set_step_limit(Some(1));
    host.write(0, &pattern(256, 1)).unwrap();
    host.write(256, &pattern(256, 2)).unwrap();
    let f1 = e
        .submit(&DeviceCopyBatch::new(vec![
            DeviceCopy::h2d(HostRange::new(0, 256), DeviceSlot(0), 0),
            DeviceCopy::h2d(HostRange::new(256, 256), DeviceSlot(1), 0),
        ]))
        .unwrap();
    let f2 = e
        .submit(&DeviceCopyBatch::new(vec![DeviceCopy::d2h(
            DeviceSlot(1),
            0,
            HostRange::new(4096, 256),
        )]))
        .unwrap();
    let f3 = e.submit(&DeviceCopyBatch::default()).unwrap();
    assert_eq!((f1.0, f2.0, f3.0), (1, 2, 3));
    assert_eq!(e.outstanding(), 3);
    // one copy per poll: the first batch's fence waits for both of its copies
    assert_eq!(e.poll_fences().unwrap(), vec![]);
    assert_eq!(
        host.read(HostRange::new(4096, 4)).unwrap(),
        vec![0; 4],
        "D2H not run yet"
    );
    assert_eq!(e.poll_fences().unwrap(), vec![f1]);
    assert_eq!(e.poll_fences().unwrap(), vec![f2, f3]);
    assert_eq!(e.poll_fences().unwrap(), vec![]);
    // the D2H ran after the H2D into the same slot (stream order)
    assert_eq!(
        host.read(HostRange::new(4096, 256)).unwrap(),
        pattern(256, 2)
    );
    let f4 = e.submit(&DeviceCopyBatch::default()).unwrap();
    assert_eq!(f4, FenceId(4), "fences increase monotonically");
}

#[test]
fn invalid_copies_are_errors_and_reject_the_whole_batch() {
    let (host, mut e) = engine(4096, 2, 128);
    host.write(0, &pattern(4096, 9)).unwrap();
    let good = DeviceCopy::h2d(HostRange::new(0, 64), DeviceSlot(0), 0);
    let cases = [
        (
            DeviceCopy::h2d(HostRange::new(0, 64), DeviceSlot(2), 0),
            "slot",
        ),
        (
            DeviceCopy::h2d(HostRange::new(0, 64), DeviceSlot(1), 100),
            "slot range",
        ),
        (
            DeviceCopy::d2h(DeviceSlot(1), u64::MAX, HostRange::new(0, 8)),
            "offset overflow",
        ),
        (
            DeviceCopy::h2d(HostRange::new(4090, 64), DeviceSlot(1), 0),
            "host range",
        ),
        (
            DeviceCopy::h2d(HostRange::new(u64::MAX, 2), DeviceSlot(1), 0),
            "host overflow",
        ),
        (
            DeviceCopy::h2d(HostRange::new(0, 0), DeviceSlot(1), 0),
            "empty",
        ),
    ];
    for (bad, what) in cases {
        let err = e
            .submit(&DeviceCopyBatch::new(vec![good, bad]))
            .unwrap_err();
        match (what, &err) {
            (
                "slot",
                DeviceError::SlotOutOfRange {
                    index: 1,
                    slot: 2,
                    slots: 2,
                },
            ) => {}
            (
                "slot range" | "offset overflow",
                DeviceError::SlotRangeOutOfBounds { index: 1, .. },
            ) => {}
            (
                "host range" | "host overflow",
                DeviceError::HostRangeOutOfBounds { index: 1, .. },
            ) => {}
            ("empty", DeviceError::EmptyCopy { index: 1 }) => {}
            _ => panic!("{what}: unexpected {err:?}"),
        }
    }
    // nothing of the rejected batches ran and no fence was taken
    assert_eq!(e.outstanding(), 0);
    assert_eq!(e.poll_fences().unwrap(), vec![]);
    assert!(e
        .read_slot(DeviceSlot(0), 0, 128)
        .unwrap()
        .iter()
        .all(|b| *b == 0));
    assert!(e.read_slot(DeviceSlot(5), 0, 1).is_err());
    assert!(e.write_slot(DeviceSlot(0), 100, &[0; 29]).is_err());
    assert_eq!(
        e.submit(&DeviceCopyBatch::new(vec![good])).unwrap(),
        FenceId(1)
    );
    assert!(DeviceGeometry::new(0, 1).is_err());
    assert!(DeviceGeometry::new(u32::MAX, u64::MAX).is_err());
}

#[test]
fn address_table_is_bound_for_every_slot_at_construction() {
    let (_, e) = engine(4096, 7, 96);
    assert_eq!(
        e.geometry(),
        DeviceGeometry {
            slots: 7,
            slot_bytes: 96
        }
    );
    let t = AddressTable::build(e.geometry(), |s| e.memory().slot_address(s));
    assert_eq!(t.len(), 7);
    assert_eq!(t.get(6), Some(6 * 96));
    assert_eq!(t.get(7), None);
    assert_eq!(e.backend(), "emulated");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_is_never_present_without_the_feature() {
    match detect_cuda() {
        CudaAvailability::NoDevice(reason) => assert!(reason.contains("`cuda` feature")),
        other => panic!("unexpected {other:?}"),
    }
}

/// Places a request's context blocks in device slots, runs the forward hook, and checks it
/// against recomputation; then flips one device byte of the context.
#[test]
fn forward_over_device_blocks_matches_recomputation() {
    for name in ["tiny", "hybrid-swa", "hybrid-state"] {
        let model = SyntheticModel::by_name(name).unwrap();
        let slot_bytes = model.profile().max_shard_block_bytes(1).unwrap();
        let (_, mut e) = engine(4096, 64, slot_bytes);
        let tokens: Vec<u32> = (0..27).map(|i| (i * 13 + 5) % 1000).collect();
        let c = 16u64;
        let mut next_slot = 0u32;
        let mut groups = Vec::new();
        for g in 0..model.profile().groups.len() {
            let mut table = GroupBlockTable::default();
            for b in model.required_blocks(g, c).unwrap() {
                let bytes = model
                    .kv_block_bytes(g, &tokens[..c as usize], b, Shard::SINGLE)
                    .unwrap();
                let slot = DeviceSlot(next_slot + 3); // deliberately not block order
                next_slot += 1;
                e.write_slot(slot, 0, &bytes).unwrap();
                table.context.push(slot);
            }
            for _ in model.written_blocks(g, c, tokens.len() as u64).unwrap() {
                table.written.push(DeviceSlot(next_slot + 3));
                next_slot += 1;
            }
            groups.push(table);
        }
        let step = ForwardStep {
            shard: Shard::SINGLE,
            tokens: tokens.clone(),
            context_len: c,
            groups,
            sampling: messages::SamplingParams::GREEDY,
            copy_on_write: vec![],
        };
        let out = e.forward(&model, &step).unwrap();
        let reduced = model.reduce_ranks(&[out.digest]).unwrap();
        let want = model.recompute_output(&tokens, 1).unwrap()[0];
        assert_eq!(model.first_token(reduced).0, want, "{name}");
        assert_eq!(out.new_tokens, 11);
        assert_eq!(out.device_time_us, model.profile().device_time_us(11, 16));
        // the written blocks now hold exactly the KV of the whole prompt
        for (g, table) in step.groups.iter().enumerate() {
            let wr = model.written_blocks(g, c, 27).unwrap();
            for (k, slot) in table.written.iter().enumerate() {
                let want = model
                    .kv_block_bytes(g, &tokens, wr.start + k as u64, Shard::SINGLE)
                    .unwrap();
                assert_eq!(
                    e.read_slot(*slot, 0, want.len() as u64).unwrap(),
                    want,
                    "{name} g{g}"
                );
            }
        }
        // one wrong restored byte in a context slot changes the output
        let first = step.groups[0].context[0];
        let mut b = e.read_slot(first, 0, 1).unwrap();
        b[0] ^= 0x80;
        e.write_slot(first, 0, &b).unwrap();
        let bad = e.forward(&model, &step).unwrap();
        assert_ne!(
            model
                .first_token(model.reduce_ranks(&[bad.digest]).unwrap())
                .0,
            want,
            "{name}"
        );
        // malformed tables are errors
        let mut short = step.clone();
        short.groups[0].context.pop();
        assert!(matches!(
            e.forward(&model, &short),
            Err(DeviceError::Forward(_))
        ));
        let mut oob = step.clone();
        oob.groups[0].written[0] = DeviceSlot(10_000);
        assert!(matches!(
            e.forward(&model, &oob),
            Err(DeviceError::SlotOutOfRange { .. })
        ));
    }
}

#[test]
fn a_partial_context_block_is_extended_in_place() {
    let model = SyntheticModel::by_name("tiny").unwrap();
    let (_, mut e) = engine(4096, 8, 64);
    let tokens: Vec<u32> = (0..14).map(|i| i * 3 + 1).collect();
    // context of 10 tokens: blocks 0, 1 and the first 2 tokens of block 2
    for b in 0..3u64 {
        let bytes = model
            .kv_block_bytes(0, &tokens[..10], b, Shard::SINGLE)
            .unwrap();
        e.write_slot(DeviceSlot(b as u32 + 4), 0, &bytes).unwrap();
    }
    let step = ForwardStep {
        shard: Shard::SINGLE,
        tokens: tokens.clone(),
        context_len: 10,
        groups: vec![GroupBlockTable {
            context: vec![DeviceSlot(4), DeviceSlot(5), DeviceSlot(6)],
            written: vec![DeviceSlot(6), DeviceSlot(1)],
        }],
        sampling: messages::SamplingParams::GREEDY,
        copy_on_write: vec![],
    };
    let out = e.forward(&model, &step).unwrap();
    let first = model
        .first_token(model.reduce_ranks(&[out.digest]).unwrap())
        .0;
    assert_eq!(first, model.recompute_output(&tokens, 1).unwrap()[0]);
    assert_eq!(
        e.read_slot(DeviceSlot(6), 0, 64).unwrap(),
        model.kv_block_bytes(0, &tokens, 2, Shard::SINGLE).unwrap()
    );
    assert_eq!(
        e.read_slot(DeviceSlot(1), 0, 32).unwrap(),
        model.kv_block_bytes(0, &tokens, 3, Shard::SINGLE).unwrap()
    );
}

#[test]
fn actor_submits_polls_and_runs_forward_in_order() {
    let sys = actix::System::new();
    sys.block_on(async {
        use actix::Actor;
        let host = HostCacheStorage::new(4096).unwrap();
        let model = Arc::new(SyntheticModel::by_name("tiny").unwrap());
        let mem =
            EmulatedDeviceMemory::new(host.clone(), DeviceGeometry::new(8, 64).unwrap()).unwrap();
        let addr = DeviceCopyEngine::new(Box::new(mem), model.clone()).start();
        let tokens: Vec<u32> = (0..8).collect();
        let kv = model.kv_block_bytes(0, &tokens, 0, Shard::SINGLE).unwrap();
        host.write(0, &kv).unwrap();
        let f1 = addr
            .send(SubmitDeviceCopies(DeviceCopyBatch::new(vec![
                DeviceCopy::h2d(HostRange::new(0, kv.len() as u64), DeviceSlot(5), 0),
            ])))
            .await
            .unwrap()
            .unwrap();
        let bad = addr
            .send(SubmitDeviceCopies(DeviceCopyBatch::new(vec![
                DeviceCopy::h2d(HostRange::new(0, 8), DeviceSlot(8), 0),
            ])))
            .await
            .unwrap();
        assert!(matches!(bad, Err(DeviceError::SlotOutOfRange { .. })));
        assert_eq!(addr.send(PollFences).await.unwrap().unwrap(), vec![f1]);
        let step = ForwardStep {
            shard: Shard::SINGLE,
            tokens: tokens.clone(),
            context_len: 4,
            groups: vec![GroupBlockTable {
                context: vec![DeviceSlot(5)],
                written: vec![DeviceSlot(6)],
            }],
            sampling: messages::SamplingParams::GREEDY,
            copy_on_write: vec![],
        };
        let out = addr
            .send(RunForward(messages::RequestId(1), step))
            .await
            .unwrap()
            .unwrap();
        let first = model
            .first_token(model.reduce_ranks(&[out.digest]).unwrap())
            .0;
        assert_eq!(first, model.recompute_output(&tokens, 1).unwrap()[0]);
    });
}

#[test]
fn an_h2d_from_a_poisoned_host_block_is_refused_in_debug_builds() {
    let (host, mut e) = engine(8192, 2, 512);
    let mut poisoned = vec![0u8; 512];
    crate::host::poison::fill(&mut poisoned);
    host.write(1024, &poisoned).unwrap();
    host.write(2048, &pattern(512, 3)).unwrap();
    let copy = |offset| {
        DeviceCopyBatch::new(vec![DeviceCopy::h2d(
            HostRange::new(offset, 512),
            DeviceSlot(0),
            0,
        )])
    };
    let r = e.submit(&copy(1024));
    if crate::host::poison::enabled() {
        assert!(
            matches!(r, Err(DeviceError::PoisonRead { index: 0, .. })),
            "{r:?}"
        );
        assert_eq!(e.outstanding(), 0, "nothing was enqueued");
    } else {
        assert!(r.is_ok());
    }
    // Real data passes.
    e.submit(&copy(2048)).unwrap();
}

#[test]
fn a_forward_over_a_poisoned_context_slot_is_refused_in_debug_builds() {
    let (_host, mut e) = engine(8192, 4, 512);
    e.poison_slots(&[DeviceSlot(2)]).unwrap();
    let got = e.read_slot(DeviceSlot(2), 0, 512).unwrap();
    assert_eq!(
        crate::host::poison::is_poison(&got),
        crate::host::poison::enabled()
    );
    let r = e.check_context(DeviceSlot(2));
    assert_eq!(r.is_err(), crate::host::poison::enabled(), "{r:?}");
    e.write_slot(DeviceSlot(2), 0, &pattern(512, 9)).unwrap();
    e.check_context(DeviceSlot(2)).unwrap();
}

/// A profile whose rows are long enough for the emulated device to record unit hashes
/// (`unit_hashes::MIN_RECORDED_UNIT`): tiny's geometry with 128-byte rows.
fn recorded_profile_model() -> SyntheticModel {
    let mut p = crate::model::profile::ModelProfile::by_name("tiny").unwrap();
    for g in &mut p.groups {
        g.bytes_per_head = 128;
    }
    SyntheticModel::new(p)
}

/// Restored blocks are digested from the unit hashes their H2D copies recorded, produced
/// blocks from those their forward recorded; every other write drops the record; and the
/// output stays equal to recomputation, with one wrong byte (before or after the copy)
/// still changing it.
#[test]
fn the_forward_digests_recorded_blocks_and_every_write_keeps_the_records_true() {
    let model = recorded_profile_model();
    assert!(model.digest_unit() >= super::unit_hashes::MIN_RECORDED_UNIT);
    let slot_bytes = model.profile().max_shard_block_bytes(1).unwrap();
    let (host, mut e) = engine(64 * slot_bytes, 16, slot_bytes);
    e.set_digest_unit(model.digest_unit());
    let tokens: Vec<u32> = (0..27).map(|i| (i * 7 + 3) % 500).collect();
    let c = 16u64;
    let want = model.recompute_output(&tokens, 1).unwrap()[0];
    let required = model.required_blocks(0, c).unwrap();
    // the context blocks land through H2D from Host
    let mut copies = Vec::new();
    let mut context = Vec::new();
    for (k, b) in required.clone().enumerate() {
        let bytes = model
            .kv_block_bytes(0, &tokens[..c as usize], b, Shard::SINGLE)
            .unwrap();
        let off = k as u64 * slot_bytes;
        host.write(off, &bytes).unwrap();
        let slot = DeviceSlot(k as u32 + 8);
        copies.push(DeviceCopy::h2d(
            HostRange::new(off, bytes.len() as u64),
            slot,
            0,
        ));
        context.push(slot);
    }
    let fence = e.submit(&DeviceCopyBatch::new(copies.clone())).unwrap();
    assert_eq!(e.poll_fences().unwrap(), vec![fence]);
    assert_eq!(e.memory().unit_hashes().recorded(), context.len());
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );
    let written: Vec<DeviceSlot> = model
        .written_blocks(0, c, tokens.len() as u64)
        .unwrap()
        .enumerate()
        .map(|(k, _)| DeviceSlot(k as u32))
        .collect();
    let step = ForwardStep {
        shard: Shard::SINGLE,
        tokens: tokens.clone(),
        context_len: c,
        groups: vec![GroupBlockTable {
            context: context.clone(),
            written: written.clone(),
        }],
        sampling: messages::SamplingParams::GREEDY,
        copy_on_write: vec![],
    };
    let first = |e: &mut DeviceCopyEngineCore<EmulatedDeviceMemory>, step: &ForwardStep| {
        let out = e.forward(&model, step).unwrap();
        model
            .first_token(model.reduce_ranks(&[out.digest]).unwrap())
            .0
    };
    assert_eq!(first(&mut e, &step), want);
    // the produced blocks are recorded too, and every record is true
    assert_eq!(
        e.memory().unit_hashes().recorded(),
        context.len() + written.len()
    );
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );

    // a Device hit: the whole prompt's blocks (produced above) serve a longer prompt
    let mut longer = tokens.clone();
    longer.extend([901, 902, 903]);
    let boundary = 24u64;
    let mut hit_ctx: Vec<DeviceSlot> = context.clone();
    hit_ctx.extend(&written[..(boundary / 4) as usize - context.len()]);
    let hit = ForwardStep {
        shard: Shard::SINGLE,
        tokens: longer.clone(),
        context_len: boundary,
        groups: vec![GroupBlockTable {
            context: hit_ctx,
            written: (0..model.written_blocks(0, boundary, 30).unwrap().count())
                .map(|k| DeviceSlot(k as u32 + 12))
                .collect(),
        }],
        sampling: messages::SamplingParams::GREEDY,
        copy_on_write: vec![],
    };
    let want_longer = model.recompute_output(&longer, 1).unwrap()[0];
    assert_eq!(first(&mut e, &hit), want_longer);

    // a wrong byte written onto the Device drops that slot's record: it is hashed again
    let victim = context[1];
    let mut b = e.read_slot(victim, 5, 1).unwrap();
    b[0] ^= 0x40;
    e.write_slot(victim, 5, &b).unwrap();
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );
    assert_ne!(first(&mut e, &step), want);
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );

    // a wrong byte in Host before the H2D copy is in the record the copy takes
    let mut hb = host.read(HostRange::new(slot_bytes, 1)).unwrap();
    hb[0] ^= 0x01;
    host.write(slot_bytes, &hb).unwrap();
    let fence = e.submit(&DeviceCopyBatch::new(copies)).unwrap();
    assert_eq!(e.poll_fences().unwrap(), vec![fence]);
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );
    assert_ne!(first(&mut e, &step), want);
    hb[0] ^= 0x01;
    host.write(slot_bytes, &hb).unwrap();

    // copy-on-write carries the record with the bytes
    e.copy_slots(&[SlotCopy {
        from: written[0],
        to: DeviceSlot(15),
    }])
    .unwrap();
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );
    assert_eq!(
        e.read_slot(DeviceSlot(15), 0, slot_bytes).unwrap(),
        e.read_slot(written[0], 0, slot_bytes).unwrap()
    );
}

/// The same forward with and without recorded unit hashes gives the same digest.
#[test]
fn a_recorded_digest_equals_the_digest_of_the_bytes() {
    let model = recorded_profile_model();
    let tokens: Vec<u32> = (0..21).map(|i| i * 5 + 2).collect();
    let c = 12u64;
    let blocks: Vec<Vec<u8>> = model
        .required_blocks(0, c)
        .unwrap()
        .map(|b| {
            model
                .kv_block_bytes(0, &tokens[..c as usize], b, Shard::SINGLE)
                .unwrap()
        })
        .collect();
    let unit = model.digest_unit();
    let units: Vec<Vec<u64>> = blocks
        .iter()
        .map(|b| {
            b.chunks_exact(unit)
                .map(crate::model::kv::unit_hash)
                .collect()
        })
        .collect();
    let plain = [crate::model::GroupContext {
        blocks: blocks.iter().map(|b| b.as_slice()).collect(),
        units: vec![],
    }];
    let recorded = [crate::model::GroupContext {
        blocks: blocks.iter().map(|b| b.as_slice()).collect(),
        units: units.iter().map(|u| u.as_slice()).collect(),
    }];
    let a = model
        .prefill_rank(Shard::SINGLE, &tokens, c, &plain)
        .unwrap();
    let b = model
        .prefill_rank(Shard::SINGLE, &tokens, c, &recorded)
        .unwrap();
    assert_eq!(a, b);
    // the new rows digested from the written blocks' unit hashes: the same digest
    let wr = model.written_blocks(0, c, tokens.len() as u64).unwrap();
    let written_units: Vec<Vec<u64>> = wr
        .clone()
        .map(|b| {
            model
                .kv_block_bytes(0, &tokens, b, Shard::SINGLE)
                .unwrap()
                .chunks_exact(unit)
                .map(crate::model::kv::unit_hash)
                .collect()
        })
        .collect();
    let written = [crate::model::GroupWritten {
        first_block: wr.start,
        units: written_units.iter().map(|u| u.as_slice()).collect(),
    }];
    let w = model
        .prefill_rank_written(Shard::SINGLE, &tokens, c, &recorded, &written)
        .unwrap();
    assert_eq!(a, w);
    // and a wrong written row changes it (the digest reads the records)
    let mut bad_units = written_units.clone();
    bad_units[0][5] ^= 1;
    let bad = [crate::model::GroupWritten {
        first_block: wr.start,
        units: bad_units.iter().map(|u| u.as_slice()).collect(),
    }];
    assert_ne!(
        a,
        model
            .prefill_rank_written(Shard::SINGLE, &tokens, c, &recorded, &bad)
            .unwrap()
    );
    // hashes that do not cover the bytes are an error, never a silent digest
    let short = [crate::model::GroupContext {
        blocks: blocks.iter().map(|b| b.as_slice()).collect(),
        units: units.iter().map(|u| &u[1..]).collect(),
    }];
    assert!(matches!(
        model.prefill_rank(Shard::SINGLE, &tokens, c, &short),
        Err(crate::model::ModelError::ContextUnits { group: 0 })
    ));
}

/// Polls until some fence completed (an engine with a step limit needs several polls).
fn poll_until_done(e: &mut DeviceCopyEngineCore<EmulatedDeviceMemory>) -> Vec<FenceId> {
    loop {
        let done = e.poll_fences().unwrap();
        if !done.is_empty() {
            return done;
        }
    }
}

/// Runs `batch` on an engine that executes it in one poll and on one that executes one
/// copy per poll; both complete its fence.
fn run_split_and_serial(
    split: &mut DeviceCopyEngineCore<EmulatedDeviceMemory>,
    serial: &mut DeviceCopyEngineCore<EmulatedDeviceMemory>,
    batch: &DeviceCopyBatch,
) {
    let f = split.submit(batch).unwrap();
    assert_eq!(split.poll_fences().unwrap(), vec![f]);
    let g = serial.submit(batch).unwrap();
    assert_eq!(poll_until_done(serial), vec![g]);
}

/// A large run of H2D copies is split over two threads: it lands the same bytes and the
/// same unit-hash records as the same copies done one by one, and a run whose
/// destinations overlap keeps stream order (the later copy wins).
#[test]
fn a_split_h2d_run_lands_what_one_by_one_copies_land() {
    const SLOT: u64 = 2 << 20;
    let host = HostCacheStorage::new(16 * SLOT).unwrap();
    let mut bytes = vec![0u8; (16 * SLOT) as usize];
    crate::model::kv::fill_prng(9, &mut bytes);
    host.write(0, &bytes).unwrap();
    let make = |limit: Option<usize>| {
        let mut mem =
            EmulatedDeviceMemory::new(host.clone(), DeviceGeometry::new(16, SLOT).unwrap())
                .unwrap();
        mem.set_digest_unit(16384);
        mem.set_step_limit(limit);
        DeviceCopyEngineCore::new(mem)
    };
    // ten whole slots in shuffled order, one partial copy at an offset (not recordable)
    let mut copies: Vec<DeviceCopy> = (0..10u64)
        .map(|k| {
            DeviceCopy::h2d(
                HostRange::new(k * SLOT, SLOT),
                DeviceSlot(((k * 7) % 16) as u32),
                0,
            )
        })
        .collect();
    copies.push(DeviceCopy::h2d(
        HostRange::new(12 * SLOT, 4096),
        DeviceSlot(2),
        8192,
    ));
    assert!(copies.iter().map(|c| c.host.len).sum::<u64>() >= super::emulated::PARALLEL_RUN_BYTES);
    let batch = DeviceCopyBatch::new(copies);
    let mut split = make(None);
    let mut serial = make(Some(1));
    run_split_and_serial(&mut split, &mut serial, &batch);
    assert_eq!(split.memory().split_h2d_runs(), 1);
    assert_eq!(serial.memory().split_h2d_runs(), 0);
    assert!(split.memory().arena() == serial.memory().arena());
    assert_eq!(split.memory().unit_hashes().recorded(), 10);
    assert_eq!(serial.memory().unit_hashes().recorded(), 10);
    for e in [&split, &serial] {
        assert_eq!(
            e.memory().unit_hashes().stale_slot(e.memory().arena()),
            None
        );
    }
    for k in 0..10u64 {
        let slot = (k * 7) % 16;
        let at = (slot * SLOT) as usize;
        assert!(
            split.memory().arena()[at..at + SLOT as usize]
                == bytes[(k * SLOT) as usize..((k + 1) * SLOT) as usize]
        );
    }
    // overlapping destinations: stream order, the later copy's bytes stay
    let overlap = DeviceCopyBatch::new(
        (0..10u64)
            .map(|k| DeviceCopy::h2d(HostRange::new(k * SLOT, SLOT), DeviceSlot(3), 0))
            .collect(),
    );
    let f = split.submit(&overlap).unwrap();
    assert_eq!(split.poll_fences().unwrap(), vec![f]);
    assert_eq!(split.memory().split_h2d_runs(), 1, "overlap: one by one");
    let at = (3 * SLOT) as usize;
    assert!(
        split.memory().arena()[at..at + SLOT as usize]
            == bytes[(9 * SLOT) as usize..(10 * SLOT) as usize]
    );
    assert_eq!(
        split
            .memory()
            .unit_hashes()
            .stale_slot(split.memory().arena()),
        None
    );
}

/// With records, the context digest reads what the context held before the step wrote:
/// a written slot that is also a context slot (a State checkpoint written where the
/// restored one was read, here forced on a full-attention block) does not change it.
#[test]
fn the_context_digest_reads_the_records_taken_before_the_steps_writes() {
    let model = recorded_profile_model();
    let slot_bytes = model.profile().max_shard_block_bytes(1).unwrap();
    let (_, mut e) = engine(4096, 16, slot_bytes);
    e.set_digest_unit(model.digest_unit());
    let tokens: Vec<u32> = (0..20).map(|i| (i * 11 + 1) % 300).collect();
    let c = 16u64;
    let mut context = Vec::new();
    for b in model.required_blocks(0, c).unwrap() {
        let bytes = model
            .kv_block_bytes(0, &tokens[..c as usize], b, Shard::SINGLE)
            .unwrap();
        let slot = DeviceSlot(b as u32);
        e.write_slot(slot, 0, &bytes).unwrap();
        context.push(slot);
    }
    let want = model.recompute_output(&tokens, 1).unwrap()[0];
    // block 4 (tokens 16..20) is written over context block 0's slot
    let step = ForwardStep {
        shard: Shard::SINGLE,
        tokens: tokens.clone(),
        context_len: c,
        groups: vec![GroupBlockTable {
            context: context.clone(),
            written: vec![context[0]],
        }],
        sampling: messages::SamplingParams::GREEDY,
        copy_on_write: vec![],
    };
    let out = e.forward(&model, &step).unwrap();
    assert_eq!(
        model
            .first_token(model.reduce_ranks(&[out.digest]).unwrap())
            .0,
        want
    );
    assert_eq!(
        e.memory().unit_hashes().stale_slot(e.memory().arena()),
        None
    );
}

/// A large run of D2H copies is split over two threads: it lands the same Host bytes as
/// the same copies done one by one, leaves every byte outside the copied ranges alone, and
/// a run whose Host destinations overlap keeps stream order (the later copy wins).
#[test]
fn a_split_d2h_run_lands_what_one_by_one_copies_land() {
    const SLOT: u64 = 2 << 20;
    let mut bytes = vec![0u8; (16 * SLOT) as usize];
    crate::model::kv::fill_prng(11, &mut bytes);
    let make = |limit: Option<usize>| {
        let host = HostCacheStorage::new(40 * SLOT).unwrap();
        host.write(0, &bytes).unwrap();
        let mut mem =
            EmulatedDeviceMemory::new(host, DeviceGeometry::new(16, SLOT).unwrap()).unwrap();
        mem.set_step_limit(limit);
        let mut e = DeviceCopyEngineCore::new(mem);
        // fill the device: Host slot k -> device slot k
        let fill = DeviceCopyBatch::new(
            (0..16u64)
                .map(|k| DeviceCopy::h2d(HostRange::new(k * SLOT, SLOT), DeviceSlot(k as u32), 0))
                .collect(),
        );
        let f = e.submit(&fill).unwrap();
        assert_eq!(poll_until_done(&mut e), vec![f]);
        e
    };
    // twelve whole slots to shuffled, disjoint Host ranges above the source, and a
    // partial copy from an offset
    let mut copies: Vec<DeviceCopy> = (0..12u64)
        .map(|k| {
            DeviceCopy::d2h(
                DeviceSlot(((k * 5) % 16) as u32),
                0,
                HostRange::new((16 + (k * 7) % 12) * SLOT, SLOT),
            )
        })
        .collect();
    copies.push(DeviceCopy::d2h(
        DeviceSlot(4),
        8192,
        HostRange::new(30 * SLOT + 100, 4096),
    ));
    let batch = DeviceCopyBatch::new(copies);
    let mut split = make(None);
    let mut serial = make(Some(1));
    run_split_and_serial(&mut split, &mut serial, &batch);
    assert_eq!(split.memory().split_d2h_runs(), 1);
    assert_eq!(serial.memory().split_d2h_runs(), 0);
    let all = HostRange::new(0, 40 * SLOT);
    let landed = split.memory().host().read(all).unwrap();
    assert!(landed == serial.memory().host().read(all).unwrap());
    for k in 0..12u64 {
        let from = ((k * 5) % 16 * SLOT) as usize;
        let to = ((16 + (k * 7) % 12) * SLOT) as usize;
        assert!(landed[to..to + SLOT as usize] == bytes[from..from + SLOT as usize]);
    }
    let at = (30 * SLOT + 100) as usize;
    let from = (4 * SLOT + 8192) as usize;
    assert!(landed[at..at + 4096] == bytes[from..from + 4096]);
    assert!(
        landed[(30 * SLOT) as usize..at].iter().all(|b| *b == 0),
        "untouched"
    );
    assert!(
        landed[(31 * SLOT) as usize..].iter().all(|b| *b == 0),
        "untouched"
    );
    // overlapping destinations: stream order, the later copy's bytes stay
    let overlap = DeviceCopyBatch::new(
        (0..10u64)
            .map(|k| DeviceCopy::d2h(DeviceSlot(k as u32), 0, HostRange::new(32 * SLOT, SLOT)))
            .collect(),
    );
    let f = split.submit(&overlap).unwrap();
    assert_eq!(split.poll_fences().unwrap(), vec![f]);
    assert_eq!(split.memory().split_d2h_runs(), 1, "overlap: one by one");
    let got = split
        .memory()
        .host()
        .read(HostRange::new(32 * SLOT, SLOT))
        .unwrap();
    assert!(got == bytes[(9 * SLOT) as usize..(10 * SLOT) as usize]);
}
