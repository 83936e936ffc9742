use std::path::Path;

use serde_json::{json, Value};

use crate::{Architecture, RopeScaling, TransformerConfig, TransformerError};

fn parse(value: Value) -> Result<TransformerConfig, TransformerError> {
    TransformerConfig::from_value(Path::new("/m/config.json"), &value)
}

fn llama3() -> Value {
    json!({"architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "vocab_size": 128256})
}

#[test]
fn llama3_config() {
    let c = parse(llama3()).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.num_key_value_heads, c.head_dim),
        (4096, 8, 128)
    );
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(c.bos_token_id, Some(128000));
    assert!(!c.attention_bias && !c.tie_word_embeddings);
    assert_eq!(c.sliding_window, None);
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(c.rope_theta, 500000.0);
}

#[test]
fn qwen2_config() {
    let c = parse(
        json!({"architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936}),
    )
    .unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert!(c.attention_bias, "Qwen2 implies q/k/v biases");
    assert!(c.tie_word_embeddings);
    assert_eq!(c.sliding_window, None, "use_sliding_window is false");
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.eos_token_ids, vec![151645]);
    assert_eq!(c.rope_scaling, RopeScaling::None);
}

#[test]
fn mistral_config() {
    let c = parse(
        json!({"architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "vocab_size": 32000}),
    )
    .unwrap();
    assert_eq!(c.architecture, Architecture::Mistral);
    assert_eq!(c.sliding_window, Some(4096));
    assert!(!c.attention_bias);
    // model_type alone identifies it too, and a null window means none.
    let mut v = llama3();
    v.as_object_mut().unwrap().remove("architectures");
    v["model_type"] = json!("mistral");
    v["sliding_window"] = Value::Null;
    let c = parse(v).unwrap();
    assert_eq!(
        (c.architecture, c.sliding_window),
        (Architecture::Mistral, None)
    );
}

fn field_error(value: Value) -> String {
    match parse(value) {
        Err(e @ TransformerError::Field { .. }) => e.to_string(),
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn missing_and_malformed_fields_are_named() {
    let mut v = llama3();
    v.as_object_mut().unwrap().remove("hidden_size");
    let e = field_error(v);
    assert!(
        e.contains("/m/config.json") && e.contains("`hidden_size`") && e.contains("missing"),
        "{e}"
    );

    let mut v = llama3();
    v["rope_theta"] = json!("big");
    let e = field_error(v);
    assert!(
        e.contains("`rope_theta`") && e.contains("expected a number"),
        "{e}"
    );

    let mut v = llama3();
    v["num_key_value_heads"] = json!(5);
    assert!(field_error(v).contains("`num_key_value_heads`"));

    let mut v = llama3();
    v["rope_scaling"]
        .as_object_mut()
        .unwrap()
        .remove("low_freq_factor");
    assert!(field_error(v).contains("`rope_scaling.low_freq_factor`"));

    let mut v = llama3();
    v["eos_token_id"] = json!([1, "x"]);
    assert!(field_error(v).contains("`eos_token_id`"));

    let mut v = llama3();
    v["architectures"] = json!(["GPT2LMHeadModel"]);
    assert!(field_error(v).contains("GPT2LMHeadModel"));

    let mut v = llama3();
    v["hidden_act"] = json!("gelu");
    assert!(field_error(v).contains("`hidden_act`"));

    assert!(field_error(json!([1, 2])).contains("(top level)"));
}

#[test]
fn rope_kinds_and_unknown_rope_type() {
    let with = |scaling: Value| {
        let mut v = llama3();
        v["rope_scaling"] = scaling;
        parse(v)
    };
    assert_eq!(
        with(json!({"type": "linear", "factor": 2.0}))
            .unwrap()
            .rope_scaling,
        RopeScaling::Linear { factor: 2.0 }
    );
    assert_eq!(
        with(json!({"rope_type": "dynamic", "factor": 4.0}))
            .unwrap()
            .rope_scaling,
        RopeScaling::Dynamic { factor: 4.0 }
    );
    assert_eq!(
        with(
            json!({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
        )
        .unwrap()
        .rope_scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 32768,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: None
        }
    );
    assert_eq!(
        with(json!({"rope_type": "default"})).unwrap().rope_scaling,
        RopeScaling::None
    );
    match with(json!({"rope_type": "longrope", "factor": 4.0})) {
        Err(e @ TransformerError::UnknownRopeType { .. }) => {
            assert!(e.to_string().contains("\"longrope\""), "{e}")
        }
        other => panic!("expected an unknown rope type, got {other:?}"),
    }
    let e = with(json!({"factor": 4.0})).unwrap_err().to_string();
    assert!(e.contains("rope_scaling.rope_type"), "{e}");
}

#[test]
fn generation_config_falls_back_to_config() {
    let dir = tempfile::tempdir().unwrap();
    let c = parse(llama3()).unwrap();
    let g = crate::GenerationConfig::from_dir(dir.path(), &c).unwrap();
    assert_eq!(g.bos_token_id, Some(128000));
    assert_eq!(g.eos_token_ids, vec![128001, 128008, 128009]);
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": 7}"#,
    )
    .unwrap();
    let g = crate::GenerationConfig::from_dir(dir.path(), &c).unwrap();
    assert_eq!((g.bos_token_id, g.eos_token_ids), (Some(128000), vec![7]));
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": -1}"#,
    )
    .unwrap();
    let e = crate::GenerationConfig::from_dir(dir.path(), &c)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("`eos_token_id`"),
        "{e}"
    );
}
