use super::{floats, load, max_abs_diff, model_dir};
use crate::{ComputeDevice, RandomModelSpec, Transformer, TransformerError, WeightDtype};

/// Logit agreement between differently split but equivalent computations.
const LOGIT_TOL: f32 = 1e-4;
/// Row value agreement.
const ROW_TOL: f32 = 1e-5;

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 256).collect()
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Split rows into blocks of `block` rows (the last one partial).
fn blocks(rows: &[u8], row_bytes: usize, block: usize) -> Vec<&[u8]> {
    rows.chunks(row_bytes * block).collect()
}

#[test]
fn both_weight_dtypes_load_and_compute() {
    for dtype in [WeightDtype::F32, WeightDtype::BF16] {
        let dir = model_dir(&RandomModelSpec {
            dtype,
            ..RandomModelSpec::default()
        });
        let m = load(dir.path());
        assert_eq!(m.vocab_size(), crate::RANDOM_VOCAB_SIZE);
        let layout = m.kv_layout();
        assert_eq!(
            (
                layout.layers,
                layout.kv_heads,
                layout.head_dim,
                layout.dtype_bytes
            ),
            (2, 2, 16, 4)
        );
        assert_eq!(layout.row_bytes(), 2 * 2 * 2 * 16 * 4);
        assert_eq!(m.generation().eos_token_ids, vec![257, 259]);
        let p = m.prefill(&prompt(5), 0, &[]).unwrap();
        assert_eq!(p.logits.len(), m.vocab_size());
        assert!(p.logits.iter().all(|x| x.is_finite()));
        let spread = p.logits.iter().cloned().fold(f32::MIN, f32::max)
            - p.logits.iter().cloned().fold(f32::MAX, f32::min);
        assert!(spread > 0.1, "logits are degenerate: spread {spread}");
        assert_eq!(p.new_rows.len(), 5 * layout.row_bytes());
        assert_eq!((p.kv.len(), p.kv.bytes()), (5, 5 * layout.row_bytes()));
        assert!(!p.kv.is_empty());
    }
}

#[test]
fn context_prefill_equals_whole_prefill() {
    let dir = model_dir(&RandomModelSpec::default());
    let m = load(dir.path());
    let rb = m.kv_layout().row_bytes();
    let tokens = prompt(37);
    let whole = m.prefill(&tokens, 0, &[]).unwrap();
    // 16 is block-aligned (blocks of 8 rows); 13 is not.
    for split in [16, 13] {
        let first = m.prefill(&tokens[..split], 0, &[]).unwrap();
        let context = blocks(&first.new_rows, rb, 8);
        assert!(context.len() >= 2, "context given as several chunks");
        let second = m.prefill(&tokens, split, &context).unwrap();
        let d = max_abs_diff(&whole.logits, &second.logits);
        assert!(d <= LOGIT_TOL, "split {split}: logits differ by {d}");
        assert_eq!(second.new_rows.len(), (37 - split) * rb);
        let mut rows = first.new_rows.clone();
        rows.extend_from_slice(&second.new_rows);
        let d = max_abs_diff(&floats(&whole.new_rows), &floats(&rows));
        assert!(d <= ROW_TOL, "split {split}: rows differ by {d}");
        // The request KV holds all positions and gives the same rows back.
        assert_eq!(second.kv.len(), 37);
        let back = second.kv.rows(0, 37).unwrap();
        assert!(max_abs_diff(&floats(&back), &floats(&rows)) <= ROW_TOL);
    }
}

#[test]
fn decode_equals_prefill_of_the_longer_sequence() {
    let dir = model_dir(&RandomModelSpec::default());
    let m = load(dir.path());
    let tokens = prompt(21);
    let whole = m.prefill(&tokens, 0, &[]).unwrap();
    let mut p = m.prefill(&tokens[..20], 0, &[]).unwrap();
    let logits = m.decode(&mut p.kv, tokens[20]).unwrap();
    let d = max_abs_diff(&whole.logits, &logits);
    assert!(d <= LOGIT_TOL, "decode logits differ by {d}");
    assert_eq!(p.kv.len(), 21);
    let row = p.kv.rows(20, 21).unwrap();
    let rb = m.kv_layout().row_bytes();
    let d = max_abs_diff(&floats(&row), &floats(&whole.new_rows[20 * rb..]));
    assert!(d <= ROW_TOL, "decoded row differs by {d}");
    assert!(p.kv.rows(20, 22).is_err());
}

#[test]
fn greedy_decode_equals_greedy_full_prefills() {
    let dir = model_dir(&RandomModelSpec {
        seed: 3,
        ..RandomModelSpec::default()
    });
    let m = load(dir.path());
    let mut by_prefill = prompt(9);
    let mut prefill_logits = Vec::new();
    for _ in 0..6 {
        let p = m.prefill(&by_prefill, 0, &[]).unwrap();
        by_prefill.push(argmax(&p.logits));
        prefill_logits.push(p.logits);
    }
    let mut by_decode = prompt(9);
    let mut p = m.prefill(&by_decode, 0, &[]).unwrap();
    let mut logits = p.logits.clone();
    for (step, want) in prefill_logits.iter().enumerate() {
        let d = max_abs_diff(&logits, want);
        assert!(d <= LOGIT_TOL, "step {step}: decode logits differ by {d}");
        let next = argmax(&logits);
        by_decode.push(next);
        if step < 5 {
            logits = m.decode(&mut p.kv, next).unwrap();
        }
    }
    assert_eq!(by_decode, by_prefill);
    // Not a constant sequence: the random model actually varies its choice.
    let generated = &by_prefill[9..];
    assert!(
        generated.iter().any(|&t| t != generated[0]),
        "{generated:?}"
    );
}

#[test]
fn a_flipped_context_byte_changes_the_logits() {
    let dir = model_dir(&RandomModelSpec::default());
    let m = load(dir.path());
    let rb = m.kv_layout().row_bytes();
    let tokens = prompt(12);
    let first = m.prefill(&tokens[..8], 0, &[]).unwrap();
    let clean = m.prefill(&tokens, 8, &[&first.new_rows]).unwrap();
    let mut rows = first.new_rows.clone();
    // Row 3, second layer's first V value: byte 2 holds the exponent's lowest bit.
    let at = 3 * rb + rb / 2 + 16 * 4 + 2;
    rows[at] ^= 0x80;
    let dirty = m.prefill(&tokens, 8, &[&rows]).unwrap();
    let d = max_abs_diff(&clean.logits, &dirty.logits);
    assert!(
        d > 1e-6,
        "a changed context row left the logits unchanged ({d})"
    );
}

#[test]
fn bad_inputs_are_errors() {
    let dir = model_dir(&RandomModelSpec::default());
    let m = load(dir.path());
    let rb = m.kv_layout().row_bytes();
    let tokens = prompt(10);
    let first = m.prefill(&tokens[..6], 0, &[]).unwrap();
    let rows = &first.new_rows;
    let context = |e: Result<crate::Prefill, TransformerError>| match e {
        Err(e @ TransformerError::Context(_)) => e.to_string(),
        other => panic!("expected a context error, got {other:?}"),
    };
    // Too few / too many rows for context_len.
    let e = context(m.prefill(&tokens, 6, &[&rows[..5 * rb]]));
    assert!(
        e.contains("context_len is 6") && e.contains("hold 5 rows"),
        "{e}"
    );
    let e = context(m.prefill(&tokens, 4, &[&rows[..3 * rb], &rows[3 * rb..]]));
    assert!(
        e.contains("context_len is 4") && e.contains("2 chunks hold 6 rows"),
        "{e}"
    );
    // A chunk that is not a whole number of rows.
    let e = context(m.prefill(&tokens, 6, &[&rows[..rb + 1], &rows[rb + 1..]]));
    assert!(e.contains("chunk 0 holds"), "{e}");
    // Context given but context_len 0.
    let e = context(m.prefill(&tokens, 0, &[rows]));
    assert!(e.contains("context_len is 0"), "{e}");
    // Nothing to compute.
    assert!(matches!(
        m.prefill(&tokens[..6], 6, &[rows]),
        Err(TransformerError::Input(_))
    ));
    assert!(matches!(
        m.prefill(&[], 0, &[]),
        Err(TransformerError::Input(_))
    ));
    // Out-of-vocabulary ids, in prefill and decode.
    let vocab = m.vocab_size() as u32;
    match m.prefill(&[1, 2, vocab], 0, &[]) {
        Err(TransformerError::TokenOutOfVocab {
            token, position, ..
        }) => {
            assert_eq!((token, position), (vocab, 2))
        }
        other => panic!("expected out of vocabulary, got {other:?}"),
    }
    let mut kv = first.kv.clone();
    assert!(matches!(
        m.decode(&mut kv, u32::MAX),
        Err(TransformerError::TokenOutOfVocab { .. })
    ));
    assert_eq!(kv.len(), 6, "a failed decode leaves the KV as it was");
    // A request KV from a model of another shape.
    let other_dir = model_dir(&RandomModelSpec {
        layers: 1,
        ..RandomModelSpec::default()
    });
    let other = load(other_dir.path());
    let mut foreign = other.prefill(&tokens[..3], 0, &[]).unwrap().kv;
    assert!(matches!(
        m.decode(&mut foreign, 1),
        Err(TransformerError::Input(_))
    ));
}

/// Rewrite the random model's config.json with `edit`.
fn edit_config(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn sliding_window_hides_old_tokens() {
    let dir = model_dir(&RandomModelSpec::default());
    edit_config(dir.path(), |v| {
        v["architectures"] = serde_json::json!(["MistralForCausalLM"]);
        v["model_type"] = serde_json::json!("mistral");
        v["sliding_window"] = serde_json::json!(4);
    });
    let windowed = load(dir.path());
    assert_eq!(windowed.config().sliding_window, Some(4));
    let plain_dir = model_dir(&RandomModelSpec::default());
    let plain = load(plain_dir.path());
    // With 2 layers and a window of 4, the last position sees tokens at most 2 * 3 back.
    let a = prompt(20);
    let mut b = a.clone();
    b[0] = (b[0] + 1) % 256;
    let wa = windowed.prefill(&a, 0, &[]).unwrap();
    let wb = windowed.prefill(&b, 0, &[]).unwrap();
    assert!(
        max_abs_diff(&wa.logits, &wb.logits) <= 1e-6,
        "the window leaked position 0"
    );
    let pa = plain.prefill(&a, 0, &[]).unwrap();
    let pb = plain.prefill(&b, 0, &[]).unwrap();
    assert!(
        max_abs_diff(&pa.logits, &pb.logits) > 1e-6,
        "without a window position 0 counts"
    );
    // Context prefill and decode honour the window too.
    let rb = windowed.kv_layout().row_bytes();
    let first = windowed.prefill(&a[..11], 0, &[]).unwrap();
    let second = windowed
        .prefill(&a[..19], 11, &blocks(&first.new_rows, rb, 4))
        .unwrap();
    let mut kv = second.kv;
    let logits = windowed.decode(&mut kv, a[19]).unwrap();
    assert!(max_abs_diff(&wa.logits, &logits) <= LOGIT_TOL);
}

#[test]
fn missing_qwen2_biases_are_named() {
    let dir = model_dir(&RandomModelSpec::default());
    edit_config(dir.path(), |v| {
        v["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
    });
    match Transformer::load(dir.path(), ComputeDevice::Cpu) {
        Err(e @ TransformerError::MissingWeight { .. }) => {
            let e = e.to_string();
            assert!(
                e.contains("model.safetensors") && e.contains("self_attn.q_proj.bias"),
                "{e}"
            );
        }
        other => panic!("expected a missing weight, got {other:?}"),
    }
}

#[test]
fn cuda_without_the_feature_is_a_clear_error() {
    let dir = model_dir(&RandomModelSpec::default());
    match Transformer::load(dir.path(), ComputeDevice::Cuda(0)) {
        Err(TransformerError::Device(message)) => {
            if cfg!(feature = "cuda") {
                // Either a device was found (no error) or this names the missing device.
                assert!(message.contains("no CUDA device"), "{message}");
            } else {
                assert!(message.contains("built without CUDA"), "{message}");
            }
        }
        Ok(_) if cfg!(feature = "cuda") => {}
        Ok(_) => panic!("a CUDA device opened in a build without CUDA"),
        Err(other) => panic!("expected a device error, got {other:?}"),
    }
}

#[test]
fn init_random_is_deterministic_and_refuses_a_model_dir() {
    let spec = RandomModelSpec {
        seed: 7,
        ..RandomModelSpec::default()
    };
    let a = model_dir(&spec);
    let b = model_dir(&spec);
    let c = model_dir(&RandomModelSpec {
        seed: 8,
        ..spec.clone()
    });
    for name in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        let x = std::fs::read(a.path().join(name)).unwrap();
        assert_eq!(
            x,
            std::fs::read(b.path().join(name)).unwrap(),
            "{name} differs"
        );
    }
    let weights =
        |d: &tempfile::TempDir| std::fs::read(d.path().join("model.safetensors")).unwrap();
    assert_ne!(
        weights(&a),
        weights(&c),
        "different seeds give the same weights"
    );
    assert_eq!(load(a.path()).identity(), load(b.path()).identity());
    assert_ne!(load(a.path()).identity(), load(c.path()).identity());
    match crate::init_random(a.path(), &spec) {
        Err(e @ TransformerError::DirNotEmpty { .. }) => {
            assert!(e.to_string().contains("config.json"), "{e}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A new nested directory is created.
    let nested = a.path().join("sub/model");
    crate::init_random(&nested, &spec).unwrap();
    assert_eq!(
        weights(&a),
        std::fs::read(nested.join("model.safetensors")).unwrap()
    );
}

#[test]
fn identity_changes_when_a_weight_byte_changes() {
    let dir = model_dir(&RandomModelSpec {
        dtype: WeightDtype::F32,
        ..RandomModelSpec::default()
    });
    let before = load(dir.path());
    let id = before.identity().to_string();
    assert_eq!(id.len(), 32);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 2; // a low mantissa byte of the last tensor's last value
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let after = load(dir.path());
    assert_ne!(after.identity(), id);
    // And a config change changes it too.
    edit_config(dir.path(), |v| v["rms_norm_eps"] = serde_json::json!(1e-6));
    assert_ne!(load(dir.path()).identity(), after.identity());
}

#[test]
fn sharded_checkpoints_load_through_their_index() {
    let dir = model_dir(&RandomModelSpec::default());
    let single = load(dir.path());
    let tokens = prompt(6);
    let want = single.prefill(&tokens, 0, &[]).unwrap().logits;
    // Split the one file into two shards by tensor name.
    let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut first = Vec::new();
    let mut second = Vec::new();
    let mut map = serde_json::Map::new();
    for (name, view) in st.tensors() {
        let shard = if name.contains("layers.1.") || name.starts_with("lm_head") {
            2
        } else {
            1
        };
        map.insert(
            name.clone(),
            serde_json::json!(format!("model-0000{shard}-of-00002.safetensors")),
        );
        if shard == 1 {
            first.push((name, view))
        } else {
            second.push((name, view))
        }
    }
    std::fs::write(
        dir.path().join("model-00001-of-00002.safetensors"),
        safetensors::serialize(first, None).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("model-00002-of-00002.safetensors"),
        safetensors::serialize(second, None).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        serde_json::to_vec(&serde_json::json!({"metadata": {}, "weight_map": map})).unwrap(),
    )
    .unwrap();
    let sharded = load(dir.path());
    assert_eq!(sharded.prefill(&tokens, 0, &[]).unwrap().logits, want);
    assert_ne!(sharded.identity(), single.identity());
    // A shard that goes missing is named.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = Transformer::load(dir.path(), ComputeDevice::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn model_and_request_kv_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Transformer>();
    send_sync::<crate::RequestKv>();
    send_sync::<crate::TextTokenizer>();
    send_sync::<crate::ChatTemplate>();
    // And one model serves prefills from several threads at once, identically.
    let dir = model_dir(&RandomModelSpec::default());
    let m = load(dir.path());
    let want = m.prefill(&prompt(8), 0, &[]).unwrap().logits;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| s.spawn(|| m.prefill(&prompt(8), 0, &[]).unwrap().logits))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), want);
        }
    });
}

#[test]
fn prompts_longer_than_a_query_block_split_the_same() {
    let dir = model_dir(&RandomModelSpec::default());
    let m = load(dir.path());
    let rb = m.kv_layout().row_bytes();
    let tokens = prompt(300);
    let whole = m.prefill(&tokens, 0, &[]).unwrap();
    let first = m.prefill(&tokens[..40], 0, &[]).unwrap();
    let second = m
        .prefill(&tokens, 40, &blocks(&first.new_rows, rb, 16))
        .unwrap();
    let d = max_abs_diff(&whole.logits, &second.logits);
    assert!(d <= LOGIT_TOL, "logits differ by {d}");
    let mut rows = first.new_rows;
    rows.extend_from_slice(&second.new_rows);
    assert!(max_abs_diff(&floats(&whole.new_rows), &floats(&rows)) <= ROW_TOL);
}
