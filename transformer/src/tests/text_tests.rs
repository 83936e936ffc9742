use super::model_dir;
use crate::{ChatMessage, ChatTemplate, RandomModelSpec, TextTokenizer, TransformerError};

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: content.into(),
    }
}

#[test]
fn tokenizer_round_trips_and_knows_its_specials() {
    let dir = model_dir(&RandomModelSpec::default());
    let tok = TextTokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), crate::RANDOM_VOCAB_SIZE);
    for text in [
        "Hello, world!  two spaces\tand\nnewline",
        "héllo — 世界 🙂 ñ",
        "",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(ids.len(), text.len(), "one id per byte for {text:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
    }
    let ids = tok.encode("hi", true).unwrap();
    assert_eq!(ids, vec![256, b'h' as u32, b'i' as u32], "BOS is prepended");
    assert_eq!(tok.decode(&ids, true).unwrap(), "hi");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<|begin_of_text|>hi");
    let ids = tok.encode("<|im_start|>user\nyo<|im_end|>", false).unwrap();
    assert_eq!(ids[0], 258);
    assert_eq!(*ids.last().unwrap(), 259);
    assert_eq!(ids.len(), 1 + 5 + 2 + 1);
    assert_eq!(tok.token_text(259).as_deref(), Some("<|im_end|>"));
    assert_eq!(tok.token_text(b'a' as u32).as_deref(), Some("a"));
    assert_eq!(tok.token_text(b' ' as u32).as_deref(), Some("Ġ"));
    assert_eq!(tok.token_text(100_000), None);
    assert_eq!(tok.token_id("<|end_of_text|>"), Some(257));
    assert_eq!(tok.bos().as_deref(), Some("<|begin_of_text|>"));
    assert_eq!(tok.eos().as_deref(), Some("<|end_of_text|>"));
    assert!(matches!(
        tok.decode(&[1, 260], false),
        Err(TransformerError::TokenOutOfVocab {
            token: 260,
            position: 1,
            ..
        })
    ));
}

#[test]
fn a_missing_tokenizer_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = TextTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let e = TextTokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json") && e.contains("tokenizer:"),
        "{e}"
    );
}

#[test]
fn chatml_template_renders() {
    let dir = model_dir(&RandomModelSpec::default());
    let t = ChatTemplate::from_dir(dir.path()).unwrap();
    let messages = [msg("system", "Be brief."), msg("user", "Hi there")];
    assert_eq!(
        t.render(&messages, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        t.render(&messages[1..], false).unwrap(),
        "<|im_start|>user\nHi there<|im_end|>\n"
    );
    // The rendered prompt tokenizes with the specials as single ids.
    let tok = TextTokenizer::from_dir(dir.path()).unwrap();
    let ids = tok
        .encode(&t.render(&messages[1..], true).unwrap(), false)
        .unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 258).count(), 2);
}

fn write_config(dir: &std::path::Path, value: serde_json::Value) {
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec(&value).unwrap(),
    )
    .unwrap();
}

#[test]
fn list_form_templates_object_tokens_and_hf_idioms() {
    let dir = tempfile::tempdir().unwrap();
    // Llama-2 style: bos_token as an object, `.strip()` and raise_exception.
    let default = "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools') }}{% endif %}\
[{{ m['role'] }}] {{ m['content'].strip() }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}";
    write_config(
        dir.path(),
        serde_json::json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [
                {"name": "tool_use", "template": "TOOLS"},
                {"name": "default", "template": default},
            ],
        }),
    );
    let t = ChatTemplate::from_dir(dir.path()).unwrap();
    assert_eq!(
        t.render(&[msg("user", "  padded  ")], true).unwrap(),
        "<s>[user] padded\n[assistant]"
    );
    let e = t
        .render(&[msg("tool", "x")], false)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("no tools"),
        "{e}"
    );

    write_config(
        dir.path(),
        serde_json::json!({"chat_template": [{"name": "tool_use", "template": "T"}]}),
    );
    let e = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("`chat_template`") && e.contains("default"),
        "{e}"
    );

    write_config(dir.path(), serde_json::json!({"bos_token": "<s>"}));
    let e = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("`chat_template`") && e.contains("missing"),
        "{e}"
    );

    write_config(
        dir.path(),
        serde_json::json!({"chat_template": "{% for %}"}),
    );
    let e = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("chat_template:"), "{e}");

    write_config(
        dir.path(),
        serde_json::json!({"chat_template": "x", "eos_token": 5}),
    );
    let e = ChatTemplate::from_dir(dir.path()).unwrap_err().to_string();
    assert!(e.contains("`eos_token`"), "{e}");
}
