//! The control plane over real TCP on 127.0.0.1 (all ranks as tokio tasks in this process):
//! agreement with 1, 2, 4 and 8 ranks (the full mesh at 2, the star from 3), idle ticks,
//! protocol errors raised by every rank, handshake refusals, bad frames from a rank or from
//! the star's leader, and dead or stalled ranks failing every other rank.

use actors::control_plane::bench::{
    loopback, loopback_over, loopback_settings, loopback_settings_over,
};
use actors::control_plane::frame::encode_frame;
use actors::control_plane::handshake::{handshake, Expect, HandshakeParams};
use actors::control_plane::{ControlPlane, ControlPlaneCore, MeshSettings, Topology};
use messages::{
    AgreedRound, ControlError, ExchangeRound, FrontendMessage, Namespace, OperationId,
    PressureObservation, RequestId, RoundReport, StorageDone,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

async fn round_all(
    cores: &mut [ControlPlaneCore],
    reports: Vec<RoundReport>,
) -> Vec<Result<AgreedRound, ControlError>> {
    let futs = cores
        .iter_mut()
        .zip(reports)
        .map(|(c, r)| c.exchange_round(r));
    futures::future::join_all(futs).await
}

/// One round on every rank, which must fail alike: the one error they all return.
async fn failed_alike(cores: &mut [ControlPlaneCore], reports: Vec<RoundReport>) -> ControlError {
    let errs: Vec<ControlError> = round_all(cores, reports)
        .await
        .into_iter()
        .map(|r| r.unwrap_err())
        .collect();
    for e in &errs {
        assert_eq!(e, &errs[0], "every rank fails with the same cause");
    }
    errs.into_iter().next().unwrap()
}

/// Both topologies: a fault test at a world where either could run checks each.
const TOPOLOGIES: [Topology; 2] = [Topology::FullMesh, Topology::Star];

/// A loopback world of `world` ranks over `topology` (`None`: the world's default), each
/// rank's settings adjusted by `tweak` before the mesh forms.
async fn establish_all(
    world: u32,
    topology: Option<Topology>,
    tweak: impl Fn(&mut MeshSettings),
) -> Vec<ControlPlaneCore> {
    let (mut settings, listeners) = loopback_settings_over(world, topology).await.unwrap();
    for s in &mut settings {
        tweak(s);
    }
    let mut handles = vec![];
    for (s, l) in settings.into_iter().zip(listeners) {
        handles.push(tokio::spawn(async move {
            ControlPlaneCore::establish_with_listener(&s, l).await
        }));
    }
    let mut cores = vec![];
    for h in handles {
        cores.push(h.await.unwrap().unwrap());
    }
    cores
}

/// `e` is a frame error naming `rank` (and `round`, when given) whose text contains `says`.
#[track_caller]
fn assert_frame_error(e: &ControlError, rank: u32, round: Option<u64>, says: &str) {
    let named = matches!(e, ControlError::Frame { rank: r, round: n, .. }
        if *r == rank && round.is_none_or(|want| *n == want));
    assert!(named && e.to_string().contains(says), "{e}");
}

fn idle_all(world: u32, round: u64) -> Vec<RoundReport> {
    (0..world)
        .map(|r| RoundReport::idle(r, round, 10_000 + round * 100 + r as u64))
        .collect()
}

fn q(n: u64) -> StorageDone {
    StorageDone::query(OperationId(n), vec![true, false], true)
}

async fn run_world(world: u32, topology: Option<Topology>) {
    let mut cores = loopback_over(world, topology).await.unwrap();
    for (rank, c) in cores.iter().enumerate() {
        assert_eq!(c.rank(), rank as u32);
        assert_eq!(c.world(), world);
        assert_eq!(c.topology(), topology.unwrap_or(Topology::for_world(world)));
    }
    // Round 0: each rank completes ops 1..=world in a rank-rotated order, half of them now.
    // Round 1: the other half. Round 2: idle.
    let order = |rank: u32| -> Vec<u64> {
        (0..world as u64)
            .map(|i| (i + rank as u64) % world as u64 + 1)
            .collect()
    };
    let mut expected_ops = 0usize;
    for round in 0..3u64 {
        let mut reports = idle_all(world, round);
        for (rank, r) in reports.iter_mut().enumerate() {
            let o = order(rank as u32);
            let half = o.len().div_ceil(2);
            let part: &[u64] = match round {
                0 => &o[..half],
                1 => &o[half..],
                _ => &[],
            };
            r.completions = part.iter().map(|n| q(*n)).collect();
            r.pressure = PressureObservation {
                queued_jobs: rank as u64,
                queued_bytes: 0,
                oldest_age_us: 0,
            };
        }
        reports[0].frontend.push(FrontendMessage::NewRequest {
            id: RequestId(round),
            prompt: vec![1, 2],
            max_tokens: 4,
            sampling: messages::SamplingParams::GREEDY,
        });
        let out: Vec<AgreedRound> = round_all(&mut cores, reports)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        for a in &out {
            assert_eq!(a, &out[0], "every rank agrees the same round");
        }
        let a = &out[0];
        assert_eq!(a.round, round);
        assert_eq!(a.tick_us, 10_000 + round * 100, "the leader's clock");
        assert_eq!(a.pressure.queued_jobs, world as u64 - 1);
        assert_eq!(a.frontend.len(), 1);
        let ids: Vec<u64> = a.completions.iter().map(|d| d.op.0).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted);
        for d in &a.completions {
            assert_eq!(d.success, vec![true, false]);
        }
        expected_ops += ids.len();
    }
    assert_eq!(
        expected_ops, world as usize,
        "every operation agreed exactly once"
    );
}

#[tokio::test]
async fn two_ranks_agree() {
    run_world(2, None).await;
}

#[tokio::test]
async fn four_ranks_agree_over_either_topology() {
    for t in TOPOLOGIES {
        run_world(4, Some(t)).await;
    }
}

#[tokio::test]
async fn five_ranks_agree_over_the_default_star() {
    assert_eq!(Topology::for_world(4), Topology::FullMesh);
    assert_eq!(Topology::for_world(5), Topology::Star);
    run_world(5, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_ranks_agree_over_either_topology() {
    for t in TOPOLOGIES {
        run_world(8, Some(t)).await;
    }
}

#[tokio::test]
async fn a_world_of_one_exchanges_with_itself_and_ticks_when_idle() {
    let s = MeshSettings::new(
        0,
        vec!["127.0.0.1:0".into()],
        Namespace("tsl3-x".into()),
        vec![],
    );
    let mut core = ControlPlaneCore::establish(&s).await.unwrap();
    for round in 0..3 {
        let a = core
            .exchange_round(RoundReport::idle(0, round, 500 + round))
            .await
            .unwrap();
        assert_eq!(a.tick_us, 500 + round);
        assert!(a.completions.is_empty());
    }
    let mut r = RoundReport::idle(0, 3, 600);
    r.completions.push(q(1));
    let a = core.exchange_round(r).await.unwrap();
    assert_eq!(a.completions, vec![q(1)]);
}

#[tokio::test]
async fn out_of_order_owner_completion_over_the_mesh() {
    let mut cores = loopback(2).await.unwrap();
    let mut r = idle_all(2, 0);
    r[0].completions = vec![q(3)];
    r[1].completions = vec![q(7)];
    for a in round_all(&mut cores, r).await {
        assert!(a.unwrap().completions.is_empty());
    }
    let mut r = idle_all(2, 1);
    r[0].completions = vec![q(7)];
    r[1].completions = vec![q(3)];
    for a in round_all(&mut cores, r).await {
        let ids: Vec<u64> = a.unwrap().completions.iter().map(|d| d.op.0).collect();
        assert_eq!(ids, vec![3, 7]);
    }
}

#[tokio::test]
async fn an_invalid_local_record_makes_every_rank_raise_the_same_protocol_error() {
    for t in TOPOLOGIES {
        let mut cores = loopback_over(4, Some(t)).await.unwrap();
        let mut r = idle_all(4, 0);
        let mut bad = StorageDone::put(OperationId(1), vec![true], vec![1], vec![true], true);
        bad.new_writes = 0;
        r[2].completions = vec![bad];
        for c in [0usize, 1, 3] {
            r[c].completions = vec![StorageDone::put(
                OperationId(1),
                vec![true],
                vec![1],
                vec![false],
                true,
            )];
        }
        let err = failed_alike(&mut cores, r).await;
        let msg = err.to_string();
        assert!(
            matches!(err, ControlError::Protocol { round: 0, .. }),
            "{msg}"
        );
        assert!(msg.contains("rank 2 reported an invalid poll"), "{msg}");
        assert!(msg.contains("success and a capacity rejection"), "{msg}");
        // The control plane then refuses further rounds.
        for e in round_all(&mut cores, idle_all(4, 1)).await {
            assert!(matches!(e, Err(ControlError::Stopped(_))), "{e:?}");
        }
    }
}

#[tokio::test]
async fn a_rank_that_fails_locally_tells_its_peers_why() {
    for t in TOPOLOGIES {
        let mut cores = loopback_over(3, Some(t)).await.unwrap();
        let mut r = idle_all(3, 0);
        r[1].rank = 2; // rank 1's round loop hands it someone else's report
        let err = failed_alike(&mut cores, r).await;
        assert!(
            err.to_string()
                .contains("rank 1 was handed a report for rank 2"),
            "{}",
            err
        );
    }
}

#[tokio::test]
async fn an_oversized_outgoing_report_fails_every_rank_alike() {
    let mut cores = establish_all(2, None, |s| s.max_frame_bytes = 4096).await;
    let mut r = idle_all(2, 0);
    // Compact records: 2000 of them still exceed 4 KiB.
    r[0].completions = (1..=2000).map(q).collect();
    let msg = failed_alike(&mut cores, r).await.to_string();
    assert!(
        msg.contains("rank 0 cannot send") && msg.contains("exceeds the 4096-byte limit"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_dropped_rank_fails_every_other_rank_naming_it() {
    for t in TOPOLOGIES {
        let mut cores = loopback_over(4, Some(t)).await.unwrap();
        for round in 0..2 {
            for a in round_all(&mut cores, idle_all(4, round)).await {
                a.unwrap();
            }
        }
        drop(cores.pop()); // rank 3's mesh goes away
        let out = round_all(&mut cores, idle_all(3, 2)).await;
        for e in out {
            let e = e.unwrap_err();
            assert_eq!(e.blamed_rank(), Some(3), "{e}");
            assert!(e.to_string().contains("rank 3"), "{e}");
        }
        for e in round_all(&mut cores, idle_all(3, 3)).await {
            assert!(matches!(e, Err(ControlError::Stopped(_))), "{e:?}");
        }
    }
}

#[tokio::test]
async fn an_aborted_rank_task_fails_every_other_rank() {
    for t in TOPOLOGIES {
        let mut cores = loopback_over(3, Some(t)).await.unwrap();
        let mut last = cores.pop().unwrap();
        let (gate_tx, mut gate_rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
        let task = tokio::spawn(async move {
            while let Some(round) = gate_rx.recv().await {
                last.exchange_round(RoundReport::idle(2, round, 0))
                    .await
                    .unwrap();
            }
        });
        for round in 0..2 {
            gate_tx.send(round).unwrap();
            for a in round_all(&mut cores, idle_all(2, round)).await {
                a.unwrap();
            }
        }
        task.abort();
        let _ = task.await;
        for e in round_all(&mut cores, idle_all(2, 2)).await {
            let e = e.unwrap_err();
            assert_eq!(e.blamed_rank(), Some(2), "{e}");
        }
    }
}

#[tokio::test]
async fn a_stalled_rank_is_named_by_every_other_rank() {
    for t in TOPOLOGIES {
        let mut cores = establish_all(3, Some(t), |s| {
            s.round_deadline = Duration::from_millis(300)
        })
        .await;
        for a in round_all(&mut cores, idle_all(3, 0)).await {
            a.unwrap();
        }
        // Rank 2 stalls: it does not report round 1.
        let mut stalled = cores.pop().unwrap();
        for e in round_all(&mut cores, idle_all(2, 1)).await {
            let e = e.unwrap_err();
            assert_eq!(
                e,
                ControlError::Timeout {
                    rank: 2,
                    round: 1,
                    deadline_ms: 300
                }
            );
            assert_eq!(e.to_string(), "rank 2 did not report round 1 within 300 ms");
        }
        // When it wakes, it learns the round failed and why.
        let e = stalled
            .exchange_round(RoundReport::idle(2, 1, 0))
            .await
            .unwrap_err();
        assert_eq!(e.blamed_rank(), Some(2), "{e}");
        assert!(stalled.failure().is_some());
    }
}

async fn two_rank_setup(
    tweak_rank1: impl FnOnce(&mut MeshSettings),
) -> (
    Result<ControlPlaneCore, ControlError>,
    Result<ControlPlaneCore, ControlError>,
) {
    let (mut settings, mut listeners) = loopback_settings(2).await.unwrap();
    settings[0].connect_deadline = Duration::from_millis(1500);
    tweak_rank1(&mut settings[1]);
    let l1 = listeners.pop().unwrap();
    let l0 = listeners.pop().unwrap();
    let s0 = settings[0].clone();
    let s1 = settings[1].clone();
    let a = tokio::spawn(async move { ControlPlaneCore::establish_with_listener(&s0, l0).await });
    let b = tokio::spawn(async move { ControlPlaneCore::establish_with_listener(&s1, l1).await });
    (a.await.unwrap(), b.await.unwrap())
}

fn setup_error(r: Result<ControlPlaneCore, ControlError>) -> String {
    match r {
        Err(e @ ControlError::Setup(_)) => e.to_string(),
        Err(e) => panic!("expected a setup error, got {e}"),
        Ok(_) => panic!("expected a setup error, got a mesh"),
    }
}

#[tokio::test]
async fn a_wrong_secret_is_refused_at_the_handshake() {
    let (a, b) = two_rank_setup(|s| s.secret = b"not the secret".to_vec()).await;
    let eb = setup_error(b);
    assert!(eb.contains("authentication failed"), "{eb}");
    let ea = setup_error(a);
    assert!(
        ea.contains("rank(s) 1 did not join") && ea.contains("authentication failed"),
        "{ea}"
    );
}

#[tokio::test]
async fn a_wrong_namespace_or_world_is_refused_at_the_handshake() {
    let (a, b) = two_rank_setup(|s| s.namespace = Namespace("tsl3-other".into())).await;
    assert!(setup_error(b).contains("namespace mismatch"));
    assert!(setup_error(a).contains("namespace mismatch"));
    let (a, b) = two_rank_setup(|s| {
        s.world = 3;
        s.peers.push("127.0.0.1:9".into());
        s.connect_deadline = Duration::from_millis(1500);
    })
    .await;
    assert!(setup_error(b).contains("world size mismatch"));
    assert!(setup_error(a).contains("did not join"));
}

#[tokio::test]
async fn strays_cannot_join_and_do_not_block_the_real_peer() {
    let (settings, mut listeners) = loopback_settings(2).await.unwrap();
    let l1 = listeners.pop().unwrap();
    let l0 = listeners.pop().unwrap();
    let s0 = settings[0].clone();
    let a = tokio::spawn(async move { ControlPlaneCore::establish_with_listener(&s0, l0).await });
    // A stray speaking garbage, and a stray that knows the protocol but not the secret.
    let mut garbage = tokio::net::TcpStream::connect(&settings[0].peers[0])
        .await
        .unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut stray = tokio::net::TcpStream::connect(&settings[0].peers[0])
        .await
        .unwrap();
    let p = HandshakeParams::new(
        1,
        2,
        settings[0].namespace.clone(),
        Arc::new(b"guess".to_vec()),
    );
    let r = handshake(&mut stray, &p, &Expect::Rank(0)).await;
    assert!(r.is_err(), "{r:?}");
    // The real rank 1 still joins.
    let s1 = settings[1].clone();
    let mut b = ControlPlaneCore::establish_with_listener(&s1, l1)
        .await
        .unwrap();
    let mut a = a.await.unwrap().unwrap();
    let (x, y) = tokio::join!(
        a.exchange_round(RoundReport::idle(0, 0, 1)),
        b.exchange_round(RoundReport::idle(1, 0, 2))
    );
    assert_eq!(x.unwrap().tick_us, 1);
    assert_eq!(y.unwrap().tick_us, 1);
}

/// Rank 0 is real; rank 1 is a hand-driven socket that passes the handshake and then sends
/// `bytes`. Returns rank 0's round error.
async fn rank0_error_after(bytes: Vec<u8>, close: bool) -> ControlError {
    let (mut settings, mut listeners) = loopback_settings(2).await.unwrap();
    settings[0].max_frame_bytes = 4096;
    drop(listeners.pop());
    let l0 = listeners.pop().unwrap();
    let s0 = settings[0].clone();
    let a = tokio::spawn(async move { ControlPlaneCore::establish_with_listener(&s0, l0).await });
    let mut fake = tokio::net::TcpStream::connect(&settings[0].peers[0])
        .await
        .unwrap();
    let p = HandshakeParams::new(
        1,
        2,
        settings[1].namespace.clone(),
        Arc::new(settings[1].secret.clone()),
    );
    assert_eq!(handshake(&mut fake, &p, &Expect::Rank(0)).await, Ok(0));
    let mut core = a.await.unwrap().unwrap();
    fake.write_all(&bytes).await.unwrap();
    if close {
        fake.shutdown().await.unwrap();
    }
    let e = core
        .exchange_round(RoundReport::idle(0, 0, 1))
        .await
        .unwrap_err();
    // And it refuses further rounds.
    let again = core.exchange_round(RoundReport::idle(0, 1, 2)).await;
    assert!(matches!(again, Err(ControlError::Stopped(_))), "{again:?}");
    drop(fake);
    e
}

#[tokio::test]
async fn malformed_truncated_and_oversized_frames_are_protocol_errors() {
    let e = rank0_error_after(vec![0, 0, 0, 3, 0xc1, 0xc1, 0xc1], false).await;
    assert_frame_error(&e, 1, None, "malformed");
    let mut truncated = 100u32.to_be_bytes().to_vec();
    truncated.extend_from_slice(&[0x81; 10]);
    let e = rank0_error_after(truncated, true).await;
    assert_frame_error(&e, 1, None, "truncated");
    let e = rank0_error_after(4097u32.to_be_bytes().to_vec(), false).await;
    assert_frame_error(&e, 1, None, "exceeds the 4096-byte limit");
    // A well-formed frame of the wrong type, and a report claiming another rank.
    let e = rank0_error_after(encode_frame(&"hello", 4096).unwrap(), false).await;
    assert_frame_error(&e, 1, None, "");
    let forged = actors::control_plane::MeshFrame::Report(RoundReport::idle(0, 0, 5));
    let e = rank0_error_after(encode_frame(&forged, 4096).unwrap(), false).await;
    assert!(e.to_string().contains("report claims rank 0"), "{e}");
}

/// A report whose completion columns are malformed (here: a record's flag byte with an
/// undefined bit) is a bad frame from its sender, like any other malformed frame.
#[tokio::test]
async fn malformed_completion_columns_are_a_protocol_error() {
    let mut r = RoundReport::idle(1, 0, 5);
    r.completions.push(StorageDone::get(
        messages::OperationId(7),
        vec![true, false],
        vec![4096, 0],
        vec![None, None],
        true,
    ));
    let columns = messages::CompletionColumns::from_records(&r.completions).unwrap();
    let wire = columns.to_wire();
    let mut bytes = encode_frame(&actors::control_plane::MeshFrame::Report(r), 4096).unwrap();
    let at = bytes
        .windows(wire.len())
        .position(|w| w == wire.as_slice())
        .expect("the columns ride the frame verbatim");
    // Layout: record count, key count, error bytes, op delta, key count, then the head.
    bytes[at + 5] |= 0x80;
    let e = rank0_error_after(bytes, false).await;
    assert_frame_error(&e, 1, None, "undefined kind or flags");
}

#[actix::test]
async fn the_actor_exchanges_rounds_for_two_ranks_and_for_one() {
    let mut cores = loopback(2).await.unwrap();
    let b = ControlPlane::new(cores.pop().unwrap());
    let a = ControlPlane::new(cores.pop().unwrap());
    use actix::Actor;
    let (a, b) = (a.start(), b.start());
    for round in 0..3u64 {
        let mut r0 = RoundReport::idle(0, round, 70 + round);
        let mut r1 = RoundReport::idle(1, round, 1);
        if round == 1 {
            r0.completions.push(q(1));
            r1.completions.push(q(1));
        }
        let (x, y) = tokio::join!(a.send(ExchangeRound(r0)), b.send(ExchangeRound(r1)));
        let (x, y) = (x.unwrap().unwrap(), y.unwrap().unwrap());
        assert_eq!(x, y);
        assert_eq!(x.tick_us, 70 + round);
        assert_eq!(x.completions.len(), usize::from(round == 1));
    }
    let s = MeshSettings::new(
        0,
        vec!["127.0.0.1:0".into()],
        Namespace("tsl3-x".into()),
        vec![],
    );
    let one = ControlPlane::new(ControlPlaneCore::establish(&s).await.unwrap()).start();
    let agreed = one
        .send(ExchangeRound(RoundReport::idle(0, 0, 42)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(agreed.tick_us, 42);
    // A report for the wrong rank is refused, and so is every later round.
    let wrong = one
        .send(ExchangeRound(RoundReport::idle(1, 1, 43)))
        .await
        .unwrap();
    assert!(
        matches!(wrong, Err(ControlError::Protocol { .. })),
        "{wrong:?}"
    );
    let after = one
        .send(ExchangeRound(RoundReport::idle(0, 1, 44)))
        .await
        .unwrap();
    assert!(matches!(after, Err(ControlError::Stopped(_))), "{after:?}");
}

/// Rank 0 is real; ranks 1..world are hand-driven sockets that passed the handshake.
async fn real_rank0_with_fakes(
    world: u32,
    topology: Topology,
) -> (ControlPlaneCore, Vec<tokio::net::TcpStream>) {
    let (settings, mut listeners) = loopback_settings_over(world, Some(topology)).await.unwrap();
    while listeners.len() > 1 {
        drop(listeners.pop());
    }
    let l0 = listeners.pop().unwrap();
    let s0 = settings[0].clone();
    let a = tokio::spawn(async move { ControlPlaneCore::establish_with_listener(&s0, l0).await });
    let mut fakes = vec![];
    for rank in 1..world {
        let mut s = tokio::net::TcpStream::connect(&settings[0].peers[0])
            .await
            .unwrap();
        let p = HandshakeParams::new(
            rank,
            world,
            settings[rank as usize].namespace.clone(),
            Arc::new(settings[rank as usize].secret.clone()),
        );
        assert_eq!(handshake(&mut s, &p, &Expect::Rank(0)).await, Ok(0));
        fakes.push(s);
    }
    (a.await.unwrap().unwrap(), fakes)
}

fn wire(f: &actors::control_plane::MeshFrame) -> Vec<u8> {
    encode_frame(f, 1 << 20).unwrap()
}

fn sealed_report(rank: u32, round: u64) -> actors::control_plane::MeshFrame {
    use actors::control_plane::{seal_local_report, MeshFrame};
    MeshFrame::Report(seal_local_report(RoundReport::idle(rank, round, 5)))
}

/// The next frame a hand-driven rank receives.
async fn read_mesh_frame(s: &mut tokio::net::TcpStream) -> actors::control_plane::MeshFrame {
    actors::control_plane::frame::read_frame(s, 1 << 20)
        .await
        .unwrap()
}

/// Rank 0's round 0 (spawned as `round0`) was agreed, and its round 1 fails naming `left`,
/// the rank that confirmed round 0 and left.
async fn agreed_then_failed_naming(
    round0: tokio::task::JoinHandle<(ControlPlaneCore, Result<AgreedRound, ControlError>)>,
    left: u32,
) {
    let (mut core, r) = round0.await.unwrap();
    let agreed = r.expect("round 0 is agreed: every rank confirmed it");
    assert_eq!(agreed.round, 0);
    let e = core
        .exchange_round(RoundReport::idle(0, 1, 2))
        .await
        .unwrap_err();
    assert_eq!(e.blamed_rank(), Some(left), "{e}");
}

/// Two ranks (the full mesh): rank 1 reports and confirms round 0 and leaves at once; rank
/// 0 still agrees round 0 (the rank that left had confirmed it) and fails round 1, naming
/// rank 1.
#[tokio::test]
async fn a_rank_that_confirmed_the_round_and_left_does_not_fail_that_round() {
    use actors::control_plane::MeshFrame;
    assert_eq!(Topology::for_world(2), Topology::FullMesh);
    let (mut core, mut fakes) = real_rank0_with_fakes(2, Topology::FullMesh).await;
    let round0 = tokio::spawn(async move {
        let r = core.exchange_round(RoundReport::idle(0, 0, 1)).await;
        (core, r)
    });
    let mut f1 = fakes.pop().unwrap();
    f1.write_all(&wire(&sealed_report(1, 0))).await.unwrap();
    // A rank confirms once it gathered every report: rank 0's too.
    match read_mesh_frame(&mut f1).await {
        MeshFrame::Report(r) => assert_eq!((r.rank, r.round), (0, 0)),
        other => panic!("expected rank 0's report, got {other:?}"),
    }
    f1.write_all(&wire(&MeshFrame::Gathered(0))).await.unwrap();
    f1.shutdown().await.unwrap();
    drop(f1);
    agreed_then_failed_naming(round0, 1).await;
}

/// Three ranks (the star, rank 0 leading; ranks 1 and 2 hand-driven): each sends its report
/// to the leader only and gets the gathered set back. Rank 2 confirms and leaves before
/// rank 1 confirms: the leader still agrees round 0, tells rank 1 so, and fails round 1,
/// naming rank 2.
#[tokio::test]
async fn over_the_star_a_rank_that_confirmed_and_left_does_not_fail_that_round() {
    use actors::control_plane::MeshFrame;
    let (mut core, mut fakes) = real_rank0_with_fakes(3, Topology::Star).await;
    let round0 = tokio::spawn(async move {
        let r = core.exchange_round(RoundReport::idle(0, 0, 1)).await;
        (core, r)
    });
    let mut f2 = fakes.pop().unwrap();
    let mut f1 = fakes.pop().unwrap();
    f1.write_all(&wire(&sealed_report(1, 0))).await.unwrap();
    f2.write_all(&wire(&sealed_report(2, 0))).await.unwrap();
    for f in [&mut f1, &mut f2] {
        match read_mesh_frame(f).await {
            MeshFrame::All(all) => {
                let ranks: Vec<(u32, u64)> = all
                    .iter()
                    .map(|b| messages::decode::<messages::GatheredReport>(b).unwrap())
                    .map(|r| (r.rank, r.round))
                    .collect();
                assert_eq!(ranks, vec![(0, 0), (1, 0), (2, 0)]);
            }
            other => panic!("expected the gathered set, got {other:?}"),
        }
    }
    f2.write_all(&wire(&MeshFrame::Gathered(0))).await.unwrap();
    f2.shutdown().await.unwrap();
    drop(f2);
    // Give the leader the chance to see rank 2's close before rank 1's confirmation.
    tokio::time::sleep(Duration::from_millis(50)).await;
    f1.write_all(&wire(&MeshFrame::Gathered(0))).await.unwrap();
    assert_eq!(read_mesh_frame(&mut f1).await, MeshFrame::Agreed(0));
    agreed_then_failed_naming(round0, 2).await;
    drop(f1);
}

/// Over the star the leader takes a confirmation only after it sent the gathered set: a
/// rank that confirms early is a protocol error naming it.
#[tokio::test]
async fn over_the_star_a_confirmation_before_the_gathered_set_is_a_frame_error() {
    use actors::control_plane::MeshFrame;
    let (mut core, mut fakes) = real_rank0_with_fakes(3, Topology::Star).await;
    let round0 = tokio::spawn(async move { core.exchange_round(RoundReport::idle(0, 0, 1)).await });
    let mut f2 = fakes.pop().unwrap();
    let mut f1 = fakes.pop().unwrap();
    f1.write_all(&wire(&sealed_report(1, 0))).await.unwrap();
    f1.write_all(&wire(&MeshFrame::Gathered(0))).await.unwrap();
    let e = round0.await.unwrap().unwrap_err();
    assert_frame_error(&e, 1, Some(0), "unexpected confirmation");
    // Every other rank hears why.
    match read_mesh_frame(&mut f2).await {
        MeshFrame::Abort(cause) => assert_eq!(cause, e),
        other => panic!("expected the leader's abort, got {other:?}"),
    }
}

/// Ranks 1 and 2 of a star are real; the leader (rank 0) is a hand-driven socket that
/// answers the reports with `answer`. Returns both real ranks' round errors.
async fn star_members_error_after(answer: actors::control_plane::MeshFrame) -> Vec<ControlError> {
    let (settings, mut listeners) = loopback_settings_over(3, Some(Topology::Star))
        .await
        .unwrap();
    let l0 = listeners.remove(0);
    let mut members = vec![];
    for (s, l) in settings.iter().skip(1).cloned().zip(listeners) {
        members.push(tokio::spawn(async move {
            let mut core = ControlPlaneCore::establish_with_listener(&s, l)
                .await
                .unwrap();
            core.exchange_round(RoundReport::idle(s.rank, 0, 3)).await
        }));
    }
    let p = HandshakeParams::new(
        0,
        3,
        settings[0].namespace.clone(),
        Arc::new(settings[0].secret.clone()),
    );
    let joined = Arc::new(parking_lot::Mutex::new(std::collections::HashSet::new()));
    let mut conns = vec![];
    for _ in 0..2 {
        let (mut s, _) = l0.accept().await.unwrap();
        let rank = handshake(&mut s, &p, &Expect::HigherThanMe(joined.clone()))
            .await
            .unwrap();
        conns.push((rank, s));
    }
    conns.sort_by_key(|(r, _)| *r);
    for (rank, s) in &mut conns {
        match read_mesh_frame(s).await {
            actors::control_plane::MeshFrame::Report(r) => assert_eq!(r.rank, *rank),
            other => panic!("expected rank {rank}'s report, got {other:?}"),
        }
    }
    for (_, s) in &mut conns {
        s.write_all(&wire(&answer)).await.unwrap();
    }
    let mut errs = vec![];
    for m in members {
        errs.push(m.await.unwrap().unwrap_err());
    }
    drop(conns);
    errs
}

#[tokio::test]
async fn a_leader_whose_gathered_set_is_wrong_is_named_by_every_other_rank() {
    use actors::control_plane::{seal_local_report, MeshFrame};
    let report = |rank: u32, round: u64| {
        bytes::Bytes::from(
            messages::encode(&seal_local_report(RoundReport::idle(rank, round, 5))).unwrap(),
        )
    };
    let garbage = bytes::Bytes::from_static(&[0xc1, 0xc1, 0xc1]);
    // A report missing; the leader's slot holding another rank, another round, or bytes
    // that are no report (every other rank decodes the leader's slot).
    for (all, says) in [
        (
            vec![report(0, 0), report(1, 0)],
            "gathered 2 reports in a world of 3",
        ),
        (
            vec![report(1, 0), report(1, 0), report(2, 0)],
            "holds rank 1 round 0 at position 0",
        ),
        (
            vec![report(0, 7), report(1, 0), report(2, 0)],
            "holds rank 0 round 7 at position 0",
        ),
        (
            vec![garbage, report(1, 0), report(2, 0)],
            "malformed report at position 0",
        ),
    ] {
        for e in star_members_error_after(MeshFrame::All(all)).await {
            assert_frame_error(&e, 0, Some(0), says);
        }
    }
    // And an agreement before any gathered set.
    for e in star_members_error_after(MeshFrame::Agreed(0)).await {
        assert_frame_error(&e, 0, None, "agreed before gathering");
    }
}

/// Over the star the leader's gathered set may exceed the per-report frame limit (it holds
/// every rank's report); each report alone stays within it.
#[tokio::test]
async fn over_the_star_the_gathered_set_may_be_larger_than_one_report_limit() {
    let mut cores = establish_all(3, Some(Topology::Star), |s| s.max_frame_bytes = 4096).await;
    let ops: Vec<StorageDone> = (1..=300).map(q).collect();
    let one = encode_frame(
        &actors::control_plane::MeshFrame::Report(actors::control_plane::seal_local_report({
            let mut r = RoundReport::idle(0, 0, 1);
            r.completions = ops.clone();
            r
        })),
        1 << 20,
    )
    .unwrap()
    .len();
    assert!(
        one < 4096 && 3 * one > 4096,
        "one report frame is {one} bytes"
    );
    let mut r = idle_all(3, 0);
    for x in &mut r {
        x.completions = ops.clone();
    }
    for a in round_all(&mut cores, r).await {
        assert_eq!(a.unwrap().completions.len(), 300);
    }
}

/// Over the star every other rank waits on the leader: when the leader's mesh goes away,
/// each of them fails the round naming rank 0 (no hang, no blame on a bystander).
#[tokio::test]
async fn over_the_star_a_dropped_leader_is_named_by_every_other_rank() {
    let mut cores = loopback_over(4, Some(Topology::Star)).await.unwrap();
    for round in 0..2 {
        for a in round_all(&mut cores, idle_all(4, round)).await {
            a.unwrap();
        }
    }
    drop(cores.remove(0)); // the leader's mesh goes away
    let mut handles = vec![];
    for (i, mut core) in cores.into_iter().enumerate() {
        let rank = i as u32 + 1;
        handles.push(tokio::spawn(async move {
            core.exchange_round(RoundReport::idle(rank, 2, 0)).await
        }));
    }
    for h in handles {
        let e = h.await.unwrap().unwrap_err();
        assert_eq!(e.blamed_rank(), Some(0), "{e}");
        assert!(e.to_string().contains("rank 0"), "{e}");
    }
}
