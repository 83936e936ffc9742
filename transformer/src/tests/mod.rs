//! The crate's behaviour tests (one test binary, tiny models so debug builds stay quick).

mod config_tests;
mod forward_tests;
mod reference_tests;
mod text_tests;

use std::path::Path;

use crate::{init_random, ComputeDevice, RandomModelSpec, Transformer};

/// A fresh random model of `spec` in its own temporary directory.
pub(crate) fn model_dir(spec: &RandomModelSpec) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    init_random(dir.path(), spec).unwrap();
    dir
}

pub(crate) fn load(dir: &Path) -> Transformer {
    Transformer::load(dir, ComputeDevice::Cpu).unwrap()
}

pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Row bytes as f32 values.
pub(crate) fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
