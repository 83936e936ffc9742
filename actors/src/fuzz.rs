//! Fuzz targets over hostile bytes, and a stable smoke harness that drives them. Each
//! target takes arbitrary bytes and must return without panicking, whatever they hold;
//! where it can, it also checks that nothing invalid is accepted. The same functions back
//! the cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) and the bounded smoke run of the
//! README test command (`actors/tests/fuzz_smoke.rs`: seeded mutations of valid inputs).
//! This module never touches a real store, network or Host memory.

use crate::control_plane::frame::{decode_frame, encode_frame, HEADER_BYTES};
use crate::control_plane::handshake::{HandshakeFrame, HANDSHAKE_FRAME_LIMIT};
use crate::control_plane::mesh::{MeshFrame, MeshSettings};
use crate::frontend::{ByteCodec, RequestLimits};
use crate::l3::store::dfs::DfsStore;
use crate::l3::store::KeyResult;
use messages::StorageKey;

/// The mesh frame decoder: one buffer as a stream of frames, as a reader task sees it (a
/// report's records as columns). A decoded report's records go through the same validation
/// the round applies, and decode alike as owned records: the same frames are accepted, the
/// same records come out, and each view validates exactly as its owned record.
pub fn mesh_frames(data: &[u8]) {
    let limit = MeshSettings::DEFAULT_MAX_FRAME_BYTES;
    let mut rest = data;
    while !rest.is_empty() {
        let owned = decode_frame::<MeshFrame>(rest, limit);
        match decode_frame::<MeshFrame<messages::GatheredReport>>(rest, limit) {
            Ok(Some((frame, used))) => {
                assert!(used > HEADER_BYTES && used <= rest.len(), "consumed {used}");
                let Ok(Some((owned, owned_used))) = owned else {
                    panic!("columns decoded a frame that records did not: {owned:?}");
                };
                assert_eq!(used, owned_used);
                let mut pairs: Vec<(messages::GatheredReport, messages::RoundReport)> = vec![];
                match (frame, &owned) {
                    (MeshFrame::Report(r), MeshFrame::Report(o)) => pairs.push((r, o.clone())),
                    // The star's gathered set: each report decodes as columns exactly when
                    // it decodes as records.
                    (MeshFrame::All(rs), MeshFrame::All(os)) => {
                        assert_eq!(rs, *os);
                        for b in rs {
                            let view = messages::decode::<messages::GatheredReport>(&b);
                            let done = messages::decode::<messages::RoundReport>(&b);
                            assert_eq!(view.is_ok(), done.is_ok(), "columns and records differ");
                            if let (Ok(v), Ok(d)) = (view, done) {
                                pairs.push((v, d));
                            }
                        }
                    }
                    _ => {}
                }
                for (r, o) in &pairs {
                    assert_eq!(r.completions.len(), o.completions.len());
                    for (view, done) in r.completions.iter().zip(&o.completions) {
                        assert_eq!(&view.to_done(), done);
                        assert_eq!(view.validate(), done.validate());
                    }
                }
                rest = &rest[used..];
            }
            Ok(None) | Err(_) => {
                assert!(
                    !matches!(owned, Ok(Some(_))),
                    "records decoded a frame that columns did not"
                );
                break;
            }
        }
    }
    let _ = decode_frame::<HandshakeFrame>(data, HANDSHAKE_FRAME_LIMIT);
}

/// Valid mesh frames to mutate.
pub fn mesh_seeds() -> Vec<Vec<u8>> {
    let limit = MeshSettings::DEFAULT_MAX_FRAME_BYTES;
    let report = messages::RoundReport {
        rank: 1,
        round: 7,
        clock_us: 123,
        pressure: Default::default(),
        completions: vec![
            messages::StorageDone::put(
                messages::OperationId(3),
                vec![true, false],
                vec![64, 0],
                vec![false, true],
                true,
            ),
            messages::StorageDone::get(
                messages::OperationId(5),
                vec![true, false, false],
                vec![4096, 0, 0],
                vec![
                    None,
                    Some(messages::ObjectFailure::Missing),
                    Some(messages::ObjectFailure::Invalid),
                ],
                false,
            ),
            messages::StorageDone::failed(
                messages::OperationId(4),
                messages::StorageOpKind::Query,
                1,
                true,
                "boom",
            ),
        ],
        error: None,
        frontend: vec![],
        digests: vec![],
        admin_preflight: None,
    };
    let mut out = vec![];
    let mut second = report.clone();
    second.rank = 2;
    let encoded: Vec<bytes::Bytes> = [&report, &second]
        .iter()
        .filter_map(|r| messages::encode(r).ok().map(bytes::Bytes::from))
        .collect();
    for f in [
        MeshFrame::All(encoded),
        MeshFrame::Report(report),
        MeshFrame::Gathered(9),
        MeshFrame::Agreed(9),
        MeshFrame::Abort(messages::ControlError::Setup("x".into())),
    ] {
        if let Ok(b) = encode_frame(&f, limit) {
            out.push(b);
        }
    }
    out
}

/// The DFS object reader: the bytes as the file of one key, read every way the store reads
/// it. Only a valid object of this very key may come back as data, with its own checksum.
pub fn dfs_object(store: &DfsStore, data: &[u8]) {
    let key = fuzz_key();
    let Some(path) = store.object_path(&key) else {
        return;
    };
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let _ = store.stat(&key);
    if std::fs::write(&path, data).is_ok() {
        if let Ok((id, bytes)) = store.read_object(&key) {
            assert_eq!(id.len, bytes.len() as u64);
            assert_eq!(xxhash_rust::xxh3::xxh3_64(&bytes), id.checksum);
        }
    }
    if std::fs::write(&path, data).is_ok() {
        for len in [0usize, 1, 64, 4096] {
            let mut dest = vec![0u8; len];
            if let KeyResult::Ok { bytes } = store.get_one(&key, &mut dest) {
                assert_eq!(bytes, len as u64);
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// The key every fuzzed DFS object is stored under.
pub fn fuzz_key() -> StorageKey {
    StorageKey::new("tsl3-00000000000000f0-fuzz-g0-p0-s0".to_string())
}

/// A valid object file of `fuzz_key` to mutate (written through the store itself).
pub fn dfs_seeds(store: &DfsStore) -> Vec<Vec<u8>> {
    let mut out = vec![];
    for payload in [
        vec![],
        vec![7u8; 64],
        (0..4096u32).map(|i| i as u8).collect(),
    ] {
        let key = fuzz_key();
        let _ = store.remove(&key);
        if store.put_one(&key, &payload)
            == (KeyResult::Ok {
                bytes: payload.len() as u64,
            })
        {
            if let Some(bytes) = store.object_path(&key).and_then(|p| std::fs::read(p).ok()) {
                out.push(bytes);
            }
        }
        let _ = store.remove(&key);
    }
    out
}

/// The completion request body: JSON parse, then the frontend's validation.
pub fn completion_body(data: &[u8]) {
    let limits = RequestLimits {
        max_prompt_tokens: 4096,
        max_output_tokens: 1024,
        vocab_size: 256,
    };
    let parsed = crate::frontend::openai::completions::parse(data, &limits, &ByteCodec, "m");
    if let Ok(plan) = parsed {
        for p in &plan.prompts {
            assert!(!p.tokens.is_empty() && p.tokens.len() <= limits.max_prompt_tokens);
            assert!(p.tokens.iter().all(|t| *t < limits.vocab_size));
        }
        assert!(plan.generation.max_tokens <= limits.max_output_tokens);
    }
    let _ = crate::frontend::openai::chat::parse(data, &limits, &ByteCodec, "m");
    crate::frontend::server::fuzz_admin_bodies(data);
}

pub fn completion_seeds() -> Vec<Vec<u8>> {
    [
        r#"{"prompt":"The quick brown fox","max_tokens":8}"#,
        r#"{"prompt":[1,2,3,255],"max_tokens":1,"stream":true,"model":"m"}"#,
        r#"{"prompt":["ab",[1]],"n":2,"stop":["x"],"logprobs":2,"seed":-1}"#,
        r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"logprobs":true,"top_logprobs":2}"#,
        r#"{"target":3,"draft":2}"#,
        r#"{"host":false}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

/// A deterministic xorshift stream (no dependence on the platform's RNG).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// One mutation of a seed: bit flips, byte overwrites with interesting values, truncation,
/// extension, a splice of another seed, a duplicated run, or fresh random bytes.
pub fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    const INTERESTING: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, b'"', b'{', b'9'];
    let mut v = if seeds.is_empty() {
        vec![]
    } else {
        seeds[rng.below(seeds.len())].clone()
    };
    for _ in 0..1 + rng.below(4) {
        match rng.below(8) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let n = rng.below(v.len() + 1);
                v.truncate(n);
            }
            3 => {
                let n = rng.below(64);
                for _ in 0..n {
                    v.push(rng.next_u64() as u8);
                }
            }
            4 if !seeds.is_empty() => {
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(v.len() + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            5 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = rng.below(v.len() - i + 1).min(256);
                let run: Vec<u8> = v[i..i + n].to_vec();
                v.splice(i..i, run);
            }
            6 if v.len() >= 4 => {
                // A hostile length prefix.
                let len = [0u32, 1, u32::MAX, 0x7fff_ffff, v.len() as u32][rng.below(5)];
                v[..4].copy_from_slice(&len.to_be_bytes());
            }
            _ => {
                let n = rng.below(512);
                v = (0..n).map(|_| rng.next_u64() as u8).collect();
            }
        }
    }
    v
}

/// Runs `target` on every seed and on `iterations` mutations; a panic is re-raised with the
/// hex of the input that caused it. Returns how many inputs ran.
pub fn smoke(seed: u64, iterations: usize, seeds: &[Vec<u8>], target: &dyn Fn(&[u8])) -> usize {
    let mut rng = Rng::new(seed);
    let mut ran = 0;
    let mut run = |input: &[u8]| {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(input)));
        if let Err(p) = r {
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            panic!("fuzz target panicked on input {hex}: {p:?}");
        }
        ran += 1;
    };
    for s in seeds {
        run(s);
    }
    for _ in 0..iterations {
        let input = mutate(&mut rng, seeds);
        run(&input);
    }
    ran
}
