//! The end-to-end benchmarks that drive real engine-host processes over loopback HTTP:
//! `bench ttft` (TTFT cohorts against recomputation) and `bench replay` (public KV-cache
//! traces through several engine hosts sharing one L3). Each writes a JSON file and an SVG
//! plot. They measure; they never assert a timing (CI runs them for correctness only).

pub mod http;
pub mod plot;
pub mod process;
pub mod replay;
pub mod stats;
pub mod trace;
pub mod ttft;
