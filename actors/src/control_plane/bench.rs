//! `engine-host bench agreement`: round latency of the control plane on loopback, idle and
//! carrying 1k completion records, for 1, 2, 4 and 8 ranks (all ranks in this process, real
//! TCP sockets on 127.0.0.1). Prints p50 and p99 in microseconds of one round as seen by
//! the slowest rank. All ranks share this process's CPUs, so the multi-rank figures include
//! every rank's encode/decode/agreement work (per-rank cost on separate hosts is lower).
//!
//! It owns only measurement; it must never be used as a test of timing.

use super::mesh::{MeshSettings, Topology};
use super::plane::ControlPlaneCore;
use crate::clock::{Clock, SystemClock};
use messages::{ControlError, Namespace, OperationId, RoundReport, StorageDone};
use std::time::{Duration, Instant};

/// One measured configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AgreementFigure {
    pub world: u32,
    /// Completion records each owner reports per round (0 = idle).
    pub records: usize,
    pub rounds: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    /// Frames all ranks together wrote per round (the topology's cost on a shared host).
    pub frames_per_round: f64,
    pub topology: Topology,
}

/// Settings for `world` ranks on loopback with a fresh shared secret; the listeners are
/// bound on port 0 and returned in rank order.
pub async fn loopback_settings(
    world: u32,
) -> Result<(Vec<MeshSettings>, Vec<tokio::net::TcpListener>), ControlError> {
    loopback_settings_over(world, None).await
}

/// `loopback_settings` over a chosen topology (`None`: the world's default).
pub async fn loopback_settings_over(
    world: u32,
    topology: Option<Topology>,
) -> Result<(Vec<MeshSettings>, Vec<tokio::net::TcpListener>), ControlError> {
    let mut listeners = Vec::new();
    let mut peers = Vec::new();
    for _ in 0..world {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| ControlError::Setup(e.to_string()))?;
        let a = l
            .local_addr()
            .map_err(|e| ControlError::Setup(e.to_string()))?;
        peers.push(a.to_string());
        listeners.push(l);
    }
    let secret: [u8; 32] = rand::random();
    let ns = Namespace("tsl3-00000000bench000".into());
    let settings = (0..world)
        .map(|r| {
            let mut s = MeshSettings::new(r, peers.clone(), ns.clone(), secret.to_vec());
            s.connect_deadline = Duration::from_secs(20);
            s.round_deadline = Duration::from_secs(20);
            s.topology = topology;
            s
        })
        .collect();
    Ok((settings, listeners))
}

/// Establishes `world` cores on loopback (every rank concurrently, in this runtime).
pub async fn loopback(world: u32) -> Result<Vec<ControlPlaneCore>, ControlError> {
    loopback_over(world, None).await
}

/// `loopback` over a chosen topology (`None`: the world's default).
pub async fn loopback_over(
    world: u32,
    topology: Option<Topology>,
) -> Result<Vec<ControlPlaneCore>, ControlError> {
    let (settings, listeners) = loopback_settings_over(world, topology).await?;
    let mut handles = Vec::new();
    for (s, l) in settings.into_iter().zip(listeners) {
        handles.push(tokio::spawn(async move {
            ControlPlaneCore::establish_with_listener(&s, l).await
        }));
    }
    let mut cores = Vec::new();
    for h in handles {
        cores.push(h.await.map_err(|e| ControlError::Setup(e.to_string()))??);
    }
    Ok(cores)
}

fn records(first_op: u64, n: usize) -> Vec<StorageDone> {
    (0..n as u64)
        .map(|i| {
            StorageDone::get(
                OperationId(first_op + i),
                vec![true; 4],
                vec![4096; 4],
                vec![None; 4],
                true,
            )
        })
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub async fn measure(
    world: u32,
    per_round: usize,
    rounds: usize,
) -> Result<AgreementFigure, ControlError> {
    measure_over(world, per_round, rounds, None).await
}

/// `measure` over a chosen topology (`None`: the world's default).
pub async fn measure_over(
    world: u32,
    per_round: usize,
    rounds: usize,
    topology: Option<Topology>,
) -> Result<AgreementFigure, ControlError> {
    let mut cores = loopback_over(world, topology).await?;
    let topology = cores
        .first()
        .map(|c| c.topology())
        .unwrap_or(Topology::FullMesh);
    let frames_before: u64 = cores.iter().map(|c| c.frames_sent()).sum();
    let clock = SystemClock::new();
    let mut lat = Vec::with_capacity(rounds);
    let mut next_op = 1u64;
    for round in 0..rounds as u64 {
        let recs = records(next_op, per_round);
        next_op += per_round as u64;
        let reports: Vec<RoundReport> = (0..world)
            .map(|rank| {
                let mut r = RoundReport::idle(rank, round, clock.now_us());
                r.completions = recs.clone();
                r
            })
            .collect();
        let start = Instant::now();
        let futs = cores
            .iter_mut()
            .zip(reports)
            .map(|(c, r)| c.exchange_round(r));
        let out = futures::future::join_all(futs).await;
        lat.push(start.elapsed().as_micros() as u64);
        for o in out {
            let agreed = o?;
            if agreed.completions.len() != per_round {
                return Err(ControlError::Protocol {
                    round,
                    message: format!(
                        "bench agreed {} of {per_round} records",
                        agreed.completions.len()
                    ),
                });
            }
        }
    }
    lat.sort_unstable();
    let frames: u64 = cores.iter().map(|c| c.frames_sent()).sum::<u64>() - frames_before;
    Ok(AgreementFigure {
        world,
        records: per_round,
        rounds,
        p50_us: percentile(&lat, 0.50),
        p99_us: percentile(&lat, 0.99),
        frames_per_round: frames as f64 / rounds.max(1) as f64,
        topology,
    })
}

/// Runs the agreement benchmark and prints one line per configuration.
pub fn bench_agreement(rounds: usize) -> anyhow::Result<Vec<AgreementFigure>> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut figures = Vec::new();
    for world in [1u32, 2, 4, 8] {
        for per_round in [0usize, 1000] {
            let f = rt.block_on(measure(world, per_round, rounds.max(1)))?;
            println!(
                "agreement world={} records/round={} rounds={} p50={}us p99={}us",
                f.world, f.records, f.rounds, f.p50_us, f.p99_us
            );
            figures.push(f);
        }
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_picks_from_the_sorted_samples() {
        let s = [1, 2, 3, 4, 100];
        assert_eq!(percentile(&s, 0.5), 3);
        assert_eq!(percentile(&s, 0.99), 100);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
