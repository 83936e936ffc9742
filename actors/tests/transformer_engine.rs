//! The transformer backend inside the round: a random Llama-format checkpoint
//! (`transformer::init_random`) served by a RankEngine whose prefix comes from the Device (L1,
//! the same engine) or from L3 (a fresh engine on the same store) gives the recomputed
//! greedy tokens, and first-step log-probabilities within `TOLERANCE` of recomputation; a
//! seeded sampled request draws the same tokens whichever tier supplied its prefix; and a
//! flipped byte in a restored Device block changes the logits (the model reads what was
//! restored).

use actors::clock::SystemClock;
use actors::device::transformer::TransformerBackend;
use actors::device::{
    DeviceCopyEngineCore, DeviceGeometry, DeviceSlot, EmulatedDeviceMemory, ForwardStep,
    GroupBlockTable,
};
use actors::engine::factory::{build_rank, RankSpec};
use actors::engine::sync_ports::Loopback;
use actors::engine::RankEngine;
use actors::host::HostCacheStorage;
use actors::l3::store::memory::MemoryStore;
use actors::l3::store::Store;
use actors::model::{checkpoint, SyntheticModel};
use actors::scheduler::RequestEvent;
use messages::{FrontendMessage, RequestId, SamplingParams, TokenLogprobs};
use std::sync::Arc;

/// Largest difference of a log-probability between a restored and a recomputed step.
const TOLERANCE: f32 = 1e-4;

fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let spec = transformer::RandomModelSpec {
        seed: 11,
        ..Default::default()
    };
    transformer::init_random(dir.path(), &spec).unwrap();
    dir
}

fn engine(dir: &std::path::Path, store: Option<Arc<MemoryStore>>) -> RankEngine {
    let mut spec = RankSpec::small(store.is_some());
    spec.model_dir = Some(dir.to_path_buf());
    build_rank(&spec, SystemClock::shared(), move |_| {
        store
            .map(|s| s as Arc<dyn Store>)
            .ok_or_else(|| "storage on".to_string())
    })
    .unwrap()
}

struct Served {
    tokens: Vec<u32>,
    logprobs: Vec<Option<TokenLogprobs>>,
    device: u32,
    l3: u32,
}

/// One request to completion, then rounds until storage is idle (backups retired).
fn serve(e: &mut RankEngine, id: u64, prompt: &[u32], n: u32, sampling: SamplingParams) -> Served {
    let mut mesh = Loopback::default();
    let mut first = Some(FrontendMessage::NewRequest {
        id: RequestId(id),
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling,
    });
    let mut out = Served {
        tokens: vec![],
        logprobs: vec![],
        device: 0,
        l3: 0,
    };
    let mut done = false;
    for _ in 0..100_000 {
        let work = e
            .step_now(&mut mesh, first.take().into_iter().collect())
            .unwrap();
        for ev in e.drain_events() {
            match ev {
                RequestEvent::Token(r, t, lp) if r.0 == id => {
                    out.tokens.push(t);
                    out.logprobs.push(lp);
                }
                RequestEvent::Finished { id: r, split, .. } if r.0 == id => {
                    out.device = split.device;
                    out.l3 = split.l3;
                    done = true;
                }
                RequestEvent::Aborted(r, why) if r.0 == id => panic!("aborted: {why}"),
                _ => {}
            }
        }
        if done && work.storage_idle() {
            break;
        }
        std::thread::yield_now();
    }
    assert!(done, "request {id} finished");
    out
}

fn prompt(n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 7 + 3) % 250).collect()
}

/// Every step's top log-probabilities agree within TOLERANCE (same tokens, same order
/// wherever two are not within TOLERANCE of each other).
fn assert_close(a: &[Option<TokenLogprobs>], b: &[Option<TokenLogprobs>], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
        assert!(
            (x.logprob() - y.logprob()).abs() <= TOLERANCE,
            "{what}: {} vs {}",
            x.logprob(),
            y.logprob()
        );
        for ((tx, lx), (ty, ly)) in x.top().zip(y.top()) {
            assert!((lx - ly).abs() <= TOLERANCE, "{what}: {lx} vs {ly}");
            if tx != ty {
                assert!((lx - ly).abs() <= TOLERANCE, "{what}: {tx} vs {ty}");
            }
        }
    }
}

#[test]
fn a_prefix_restored_from_the_device_or_l3_gives_the_recomputed_tokens_and_logits() {
    let dir = model_dir();
    let p = prompt(50);
    let greedy = SamplingParams {
        logprobs: Some(5),
        ..SamplingParams::GREEDY
    };
    let warm = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 40,
        seed: 1234,
        logprobs: None,
    };
    let mut plain = engine(dir.path(), None);
    let want = serve(&mut plain, 1, &p, 6, greedy);
    let want_warm = serve(&mut plain, 2, &p, 6, warm);
    plain.close_now();
    assert_eq!(want.tokens.len(), 6);
    assert!(want
        .logprobs
        .iter()
        .all(|l| l.as_ref().unwrap().top_len() == 5));

    let store = Arc::new(MemoryStore::new());
    let mut a = engine(dir.path(), Some(store.clone()));
    let first = serve(&mut a, 1, &p, 6, greedy);
    assert_eq!(first.tokens, want.tokens, "computed with storage on");
    assert_eq!(first.l3, 0);
    let again = serve(&mut a, 2, &p, 6, greedy);
    assert_eq!(
        again.device, 48,
        "every block below the last token from the Device"
    );
    assert_eq!(again.tokens, want.tokens, "Device (L1) restore");
    assert_close(&again.logprobs, &want.logprobs, "Device (L1) restore");
    a.close_now();

    let mut b = engine(dir.path(), Some(store));
    let restored = serve(&mut b, 1, &p, 6, greedy);
    assert_eq!(
        restored.l3, 48,
        "a fresh engine restores the prefix from L3"
    );
    assert_eq!(restored.tokens, want.tokens, "L3 restore");
    assert_close(&restored.logprobs, &want.logprobs, "L3 restore");
    let sampled = serve(&mut b, 2, &p, 6, warm);
    assert!(sampled.device > 0);
    assert_eq!(
        sampled.tokens, want_warm.tokens,
        "a seed draws alike over a restore"
    );
    b.close_now();
}

/// Tails with the transformer: turn 1 ends mid-block (50 tokens, 16-token blocks); a fresh
/// engine serves turn 2 (one more token: its exact request bound is turn 1's end) from
/// L3, its partial block copied on write, and a longer turn 3 finds the same tail through
/// the hint the GET recorded; every answer equals recomputation.
#[test]
fn a_nonaligned_prompt_end_is_restored_from_l3_with_the_recomputed_tokens_and_logits() {
    let dir = model_dir();
    let p1 = prompt(50);
    let mut p2 = p1.clone();
    p2.push(17);
    let mut p3 = p1.clone();
    p3.extend([
        5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
    ]);
    let greedy = SamplingParams {
        logprobs: Some(5),
        ..SamplingParams::GREEDY
    };
    let mut plain = engine(dir.path(), None);
    let want2 = serve(&mut plain, 1, &p2, 4, greedy);
    let want3 = serve(&mut plain, 2, &p3, 4, greedy);
    plain.close_now();

    let store = Arc::new(MemoryStore::new());
    let mut a = engine(dir.path(), Some(store.clone()));
    serve(&mut a, 1, &p1, 2, greedy);
    a.close_now();
    let mut b = engine(dir.path(), Some(store));
    let turn2 = serve(&mut b, 1, &p2, 4, greedy);
    assert_eq!(
        turn2.l3, 50,
        "turn 1's whole prompt from L3, its tail included"
    );
    assert_eq!(turn2.tokens, want2.tokens, "tail restore");
    assert_close(&turn2.logprobs, &want2.logprobs, "tail restore");
    let turn3 = serve(&mut b, 2, &p3, 4, greedy);
    assert_eq!(turn3.device, 50, "the tail again, through the GET's hint");
    assert_eq!(turn3.tokens, want3.tokens, "tail from the Device");
    assert_close(&turn3.logprobs, &want3.logprobs, "tail from the Device");
    b.close_now();
}

#[test]
fn a_flipped_byte_in_a_restored_block_changes_the_logits() {
    let dir = model_dir();
    let (_, profile) = checkpoint::read(dir.path(), 16, 1).unwrap();
    let geometry = Arc::new(SyntheticModel::new(profile));
    let model = Arc::new(
        transformer::Transformer::load(dir.path(), transformer::ComputeDevice::Cpu).unwrap(),
    );
    let slot_bytes = geometry.profile().groups[0].shard_block_bytes(1).unwrap();
    let host = HostCacheStorage::new(4096).unwrap();
    let mem =
        EmulatedDeviceMemory::new(host, DeviceGeometry::new(16, slot_bytes).unwrap()).unwrap();
    let mut core = DeviceCopyEngineCore::new(mem);
    let mut backend = TransformerBackend::new(model, geometry).unwrap();
    let tokens = prompt(40);
    let sampling = SamplingParams {
        logprobs: Some(3),
        ..SamplingParams::GREEDY
    };
    let step = |context_len: u64, context: Vec<u32>, written: Vec<u32>| ForwardStep {
        shard: messages::Shard::SINGLE,
        tokens: tokens.clone(),
        context_len,
        groups: vec![GroupBlockTable {
            context: context.into_iter().map(DeviceSlot).collect(),
            written: written.into_iter().map(DeviceSlot).collect(),
        }],
        sampling,
        copy_on_write: vec![],
    };
    // recompute: blocks 0..3 written into slots 0, 1, 2
    let full = backend
        .forward(&mut core, RequestId(1), &step(0, vec![], vec![0, 1, 2]))
        .unwrap();
    // the first two blocks (32 tokens) restored in place: the same logits
    let restored = backend
        .forward(&mut core, RequestId(2), &step(32, vec![0, 1], vec![5]))
        .unwrap();
    let (a, b) = (full.logprobs.unwrap(), restored.logprobs.unwrap());
    assert_eq!(full.digest.value, restored.digest.value);
    assert!((a.logprob() - b.logprob()).abs() <= TOLERANCE);
    // one byte of the restored context flipped (an exponent bit of a V value of layer 0
    // at position 16: the value scales by 4): the logits change
    let mut byte = core.read_slot(DeviceSlot(1), 103, 1).unwrap();
    byte[0] ^= 0x01;
    core.write_slot(DeviceSlot(1), 103, &byte).unwrap();
    let flipped = backend
        .forward(&mut core, RequestId(3), &step(32, vec![0, 1], vec![6]))
        .unwrap()
        .logprobs
        .unwrap();
    let moved = a
        .top()
        .zip(flipped.top())
        .any(|((_, x), (_, y))| (x - y).abs() > TOLERANCE)
        || a.top().map(|t| t.0).ne(flipped.top().map(|t| t.0));
    assert!(moved, "the model read the flipped byte");
    assert_eq!(backend.running(), 3);
    backend.release(&[RequestId(1), RequestId(2), RequestId(3), RequestId(9)]);
    assert_eq!(backend.running(), 0, "released, an unknown ID ignored");
}

#[test]
fn a_model_directory_is_refused_for_more_than_one_rank_and_for_a_missing_config() {
    let dir = model_dir();
    let mut spec = RankSpec::small(false);
    spec.model_dir = Some(dir.path().to_path_buf());
    spec.world = 2;
    let e = spec.layout().err().unwrap().to_string();
    assert!(e.contains("TP = 1"), "{e}");
    spec.world = 1;
    spec.model_dir = Some(dir.path().join("missing"));
    let e = spec.layout().err().unwrap().to_string();
    assert!(e.contains("config.json"), "{e}");
}
