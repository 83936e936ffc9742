//! The settings loader under the fuzz smoke harness (actors::fuzz): mutated settings files
//! (from config/default.toml and the examples) and mutated TSL3_* values never panic, and
//! every rejection is one line.

use actors::fuzz;
use engine_host::settings::{load, Overrides};
use std::collections::HashMap;

fn iterations() -> usize {
    std::env::var(actors::names::env::FUZZ_ITERATIONS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

#[test]
fn the_settings_loader_survives_mutated_files_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fuzz.toml");
    let p = path.to_str().unwrap().to_string();
    let seeds: Vec<Vec<u8>> = [
        "config/default.toml",
        "config/examples/tp2.toml",
        "config/examples/mooncake.toml",
        "config/examples/single-rank.toml",
    ]
    .iter()
    .map(|f| std::fs::read(f).unwrap())
    .collect();
    let none = HashMap::new();
    let rejected = std::cell::Cell::new(0usize);
    let n = fuzz::smoke(0x5eed_0004, iterations(), &seeds, &|d: &[u8]| {
        std::fs::write(&path, d).unwrap();
        if let Err(e) = load(Some(&p), &none, &Overrides::default()) {
            assert!(!e.contains('\n'), "one line: {e}");
            rejected.set(rejected.get() + 1);
        }
    });
    assert!(n > seeds.len());
    assert!(
        rejected.get() > 0,
        "mutations are rejected, not silently accepted"
    );
    // Environment values: the same mutations as the value of a numeric and a string key.
    let values: Vec<Vec<u8>> = vec![b"64".to_vec(), b"local".to_vec()];
    fuzz::smoke(0x5eed_0005, iterations(), &values, &|d: &[u8]| {
        let v = String::from_utf8_lossy(d).into_owned();
        for k in [
            "TSL3_STORAGE__CONTRACT__OPERATION_CREDITS",
            "TSL3_STORAGE__BACKEND",
        ] {
            let env: HashMap<String, String> = [(k.to_string(), v.clone())].into();
            if let Err(e) = load(None, &env, &Overrides::default()) {
                assert!(!e.contains('\n'), "one line: {e}");
            }
        }
    });
}
