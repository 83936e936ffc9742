//! docs/settings.md is what `engine-host settings-doc` prints (src/settings_doc.rs): every
//! settings key with its type, default, meaning and rule, and every bench option. A change to
//! a setting, a rule's message or a bench's --help without regenerating fails here.

use std::process::Command;

#[test]
fn docs_settings_md_is_current() {
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .arg("settings-doc")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "settings-doc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md");
    let checked_in = std::fs::read_to_string(path).unwrap_or_default();
    if generated != checked_in {
        let line = generated
            .lines()
            .zip(checked_in.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or(generated.lines().count().min(checked_in.lines().count()) + 1);
        panic!(
            "docs/settings.md is not current (first difference at line {line}): regenerate it with \
             `cargo run -q -- settings-doc > docs/settings.md` and commit it"
        );
    }
}

/// The reference has every settings key (as its environment variable) and every bench.
#[test]
fn the_reference_names_every_key_and_every_bench() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/settings.md"))
        .expect("docs/settings.md exists");
    for (key, _) in engine_host::settings_doc::default_keys() {
        let env = engine_host::settings_doc::env_name(&key);
        assert!(
            text.contains(&format!("`{env}`")),
            "docs/settings.md lacks {key} ({env})"
        );
    }
    for bench in [
        "mooncake",
        "promotion",
        "scheduler",
        "stm",
        "agreement",
        "matcher",
        "executor",
        "ttft",
        "replay",
        "dfs-put",
        "flat-kv",
    ] {
        assert!(
            text.contains(&format!("### bench {bench}\n")),
            "lacks bench {bench}"
        );
        assert!(
            text.contains(&format!("Usage: engine-host bench {bench} ")),
            "{bench} usage"
        );
    }
}
