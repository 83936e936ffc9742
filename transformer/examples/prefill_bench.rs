//! Wall time of whole-prompt prefills (and a context prefill and a decode step) on random
//! models: `cargo run --release -p transformer --example prefill_bench`. Also prints the
//! process CPU time of each whole prefill (Linux /proc), which a shared machine inflates less.

use std::time::Instant;

use transformer::{init_random, ComputeDevice, RandomModelSpec, Transformer, TransformerError};

/// Process CPU seconds (user + system) from /proc/self/stat; 0 where unavailable.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let Some(rest) = stat.rsplit(')').next() else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() -> Result<(), TransformerError> {
    let specs = [
        ("default (2L/64h/4q/2kv/128i)", RandomModelSpec::default()),
        (
            "4L/256h/8q/4kv/1024i",
            RandomModelSpec {
                layers: 4,
                hidden: 256,
                heads: 8,
                kv_heads: 4,
                intermediate: 1024,
                ..RandomModelSpec::default()
            },
        ),
    ];
    for (name, spec) in specs {
        let dir =
            std::env::temp_dir().join(format!("tf-bench-{}-{}", std::process::id(), spec.layers));
        let _ = std::fs::remove_dir_all(&dir);
        init_random(&dir, &spec)?;
        let model = Transformer::load(&dir, ComputeDevice::Cpu)?;
        let row_bytes = model.kv_layout().row_bytes();
        println!("{name}: row_bytes {row_bytes}");
        for len in [1024usize, 4096] {
            let tokens: Vec<u32> = (0..len as u32).map(|i| (i * 7919 + 13) % 256).collect();
            // One warm-up, then the measured run.
            model.prefill(&tokens[..16], 0, &[])?;
            let cpu = cpu_seconds();
            let t = Instant::now();
            let whole = model.prefill(&tokens, 0, &[])?;
            let full = t.elapsed();
            let cpu = cpu_seconds() - cpu;
            let half = len / 2;
            let t = Instant::now();
            let ctx = model.prefill(&tokens, half, &[&whole.new_rows[..half * row_bytes]])?;
            let context = t.elapsed();
            let mut kv = ctx.kv;
            let t = Instant::now();
            model.decode(&mut kv, 1)?;
            let decode = t.elapsed();
            println!(
                "  prefill {len:>5} tokens: {:>8.1} ms wall, {:>6.2} CPU-s   (second half over a {half}-row context: {:>8.1} ms; one decode step after: {:>6.2} ms)",
                full.as_secs_f64() * 1e3,
                cpu,
                context.as_secs_f64() * 1e3,
                decode.as_secs_f64() * 1e3
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
