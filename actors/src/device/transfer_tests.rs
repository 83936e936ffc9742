//! Flat-KV transfer through L3 in one process: a writer computes a prompt's KV on the
//! emulated device, D2H into Host, PUTs every block to the MemoryStore and goes away; a
//! fresh reader (new Host allocation, new device arena) GETs into different Host offsets,
//! H2Ds into different device slots, and restores exact bytes with untouched bytes left
//! untouched; deleting the objects then yields Missing.

use super::*;
use crate::host::HostCacheStorage;
use crate::l3::store::memory::MemoryStore;
use crate::l3::store::{KeyResult, Store};
use crate::model::{GroupContext, Shard, SyntheticModel};
use messages::{HostRange, Namespace, StorageKey};
use std::sync::Arc;

const SLOTS: u32 = 16;
const HOST_SENTINEL: u8 = 0xC3;
const DEVICE_SENTINEL: u8 = 0x5A;

fn keys(model: &SyntheticModel, ns: &Namespace, tokens: &[u32], blocks: u64) -> Vec<StorageKey> {
    let chain = model.chain(0, tokens).unwrap();
    let bt = model.profile().groups[0].block_tokens;
    (0..blocks)
        .map(|b| {
            let end = ((b + 1) * bt).min(tokens.len() as u64) as usize;
            let h = chain.after(end).unwrap() as u128;
            ns.key(h << 64 | end as u128, 0, b as u32, 0)
        })
        .collect()
}

#[test]
fn flat_kv_round_trip_through_the_memory_store() {
    let model = Arc::new(SyntheticModel::by_name("tiny").unwrap());
    let shard = Shard::SINGLE;
    let slot_bytes = model.profile().max_shard_block_bytes(1).unwrap();
    let tokens: Vec<u32> = (0..37).map(|i| (i * 17 + 3) % 1000).collect();
    let n_blocks = model.written_blocks(0, 0, 37).unwrap().end; // 10, the last holds 1 token
    assert_eq!(n_blocks, 10);
    let lens: Vec<u64> = (0..n_blocks)
        .map(|b| model.block_len(0, b, 37, shard).unwrap())
        .collect();
    let store = MemoryStore::new();
    let ns = Namespace("tsl3-00000000000000ab".into());
    let keys = keys(&model, &ns, &tokens, n_blocks);

    // writer: compute the KV on the device, D2H into Host, PUT from Host
    {
        let host = HostCacheStorage::new(4096).unwrap();
        let mem = EmulatedDeviceMemory::new(
            host.clone(),
            DeviceGeometry::new(SLOTS, slot_bytes).unwrap(),
        )
        .unwrap();
        let mut e = DeviceCopyEngineCore::new(mem);
        let written: Vec<DeviceSlot> = (0..n_blocks)
            .map(|b| DeviceSlot(SLOTS - 1 - b as u32))
            .collect();
        let step = ForwardStep {
            shard,
            tokens: tokens.clone(),
            context_len: 0,
            groups: vec![GroupBlockTable {
                context: vec![],
                written: written.clone(),
            }],
            sampling: messages::SamplingParams::GREEDY,
            copy_on_write: vec![],
        };
        e.forward(&model, &step).unwrap();
        let src: Vec<HostRange> = (0..n_blocks)
            .map(|b| HostRange::new(1000 + b * 80, lens[b as usize]))
            .collect();
        let batch = DeviceCopyBatch::new(
            (0..n_blocks as usize)
                .map(|b| DeviceCopy::d2h(written[b], 0, src[b]))
                .collect(),
        );
        let fence = e.submit(&batch).unwrap();
        assert_eq!(e.poll_fences().unwrap(), vec![fence]);
        let bytes: Vec<Vec<u8>> = src.iter().map(|r| host.read(*r).unwrap()).collect();
        let srcs: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
        let put = store.put(&keys, &srcs).unwrap();
        assert!(put
            .iter()
            .zip(&lens)
            .all(|(r, l)| *r == KeyResult::Ok { bytes: *l }));
    } // the writer's Host allocation and device arena are gone

    // reader: fresh Host allocation and device arena, filled with sentinels
    let host = HostCacheStorage::new(8192).unwrap();
    host.write(0, &vec![HOST_SENTINEL; 8192]).unwrap();
    let mem = EmulatedDeviceMemory::new(
        host.clone(),
        DeviceGeometry::new(SLOTS, slot_bytes).unwrap(),
    )
    .unwrap();
    let mut e = DeviceCopyEngineCore::new(mem);
    for s in 0..SLOTS {
        e.write_slot(
            DeviceSlot(s),
            0,
            &vec![DEVICE_SENTINEL; slot_bytes as usize],
        )
        .unwrap();
    }
    let dst: Vec<HostRange> = (0..n_blocks)
        .map(|b| HostRange::new(5000 + b * 100, lens[b as usize]))
        .collect();
    {
        // SAFETY (test): the ranges are disjoint and nothing else touches `host` meanwhile.
        let mut dests: Vec<&mut [u8]> = dst
            .iter()
            .map(|r| unsafe { host.range_mut(*r) }.unwrap())
            .collect();
        let got = store.get(&keys, &mut dests).unwrap();
        assert!(
            got.iter()
                .zip(&lens)
                .all(|(r, l)| *r == KeyResult::Ok { bytes: *l }),
            "{got:?}"
        );
    }
    let slots: Vec<DeviceSlot> = (0..n_blocks).map(|b| DeviceSlot(b as u32 + 2)).collect();
    let fence = e
        .submit(&DeviceCopyBatch::new(
            (0..n_blocks as usize)
                .map(|b| DeviceCopy::h2d(dst[b], slots[b], 0))
                .collect(),
        ))
        .unwrap();
    assert_eq!(e.poll_fences().unwrap(), vec![fence]);

    // exact bytes in Host and device; everything else untouched
    let all_host = host.read(HostRange::new(0, 8192)).unwrap();
    for b in 0..n_blocks as usize {
        let want = model.kv_block_bytes(0, &tokens, b as u64, shard).unwrap();
        assert_eq!(host.read(dst[b]).unwrap(), want, "host block {b}");
        let slot = e.read_slot(slots[b], 0, slot_bytes).unwrap();
        assert_eq!(&slot[..want.len()], &want[..], "device block {b}");
        assert!(
            slot[want.len()..].iter().all(|x| *x == DEVICE_SENTINEL),
            "slot tail {b}"
        );
    }
    for (i, byte) in all_host.iter().enumerate() {
        if !dst
            .iter()
            .any(|r| (r.offset..r.end()).contains(&(i as u64)))
        {
            assert_eq!(*byte, HOST_SENTINEL, "host byte {i}");
        }
    }
    for s in (0..SLOTS).filter(|s| !slots.contains(&DeviceSlot(*s))) {
        assert!(e
            .read_slot(DeviceSlot(s), 0, slot_bytes)
            .unwrap()
            .iter()
            .all(|x| *x == DEVICE_SENTINEL));
    }

    // the restored blocks serve a forward equal to recomputation (boundary 36)
    let ctx: Vec<Vec<u8>> = (0..9)
        .map(|b| e.read_slot(slots[b], 0, lens[b]).unwrap())
        .collect();
    let gc = [GroupContext {
        blocks: ctx.iter().map(|b| b.as_slice()).collect(),
        units: Vec::new(),
    }];
    assert_eq!(
        model.prefill(&tokens, 36, &gc).unwrap().0,
        model.recompute_output(&tokens, 1).unwrap()[0]
    );

    // delete: every GET is a retired miss and writes nothing
    for k in &keys {
        assert!(store.remove(k));
    }
    let before = host.read(HostRange::new(0, 8192)).unwrap();
    {
        // SAFETY (test): disjoint ranges, no other user of `host`.
        let mut dests: Vec<&mut [u8]> = dst
            .iter()
            .map(|r| unsafe { host.range_mut(*r) }.unwrap())
            .collect();
        let got = store.get(&keys, &mut dests).unwrap();
        assert!(got.iter().all(|r| *r == KeyResult::Missing), "{got:?}");
    }
    assert_eq!(host.read(HostRange::new(0, 8192)).unwrap(), before);
    assert_eq!(store.query(&keys).unwrap(), vec![false; keys.len()]);
}
