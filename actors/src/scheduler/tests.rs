//! Helpers shared by the scheduler's unit tests (each concern's tests live in a `tests`
//! module of its own file): a small single rank on the `tiny` profile (4-token blocks, one
//! Full group), with or without storage, driven round by round the way RoundPipeline drives
//! it — `apply` and `plan`, each lent the StorageTransferManager — with no executor: each
//! test supplies the completions and digests it needs.

use super::geometry::RankLayout;
use super::{AgreedInputs, Plan, RequestEvent, Scheduler, SchedulerConfig};
use crate::model::{RankDigest, SyntheticModel};
use crate::storage_transfer::StorageTransferManager;
use messages::settings::{PressureWatermark, StorageConfig};
use messages::{Namespace, RequestId, StorageOp};

/// The agreed tick advances this much per round.
pub(super) const ROUND_US: u64 = 10_000;
/// The soft deadline of a storage wait (three rounds).
pub(super) const SOFT_DEADLINE_MS: u64 = 30;

pub(super) fn storage_config() -> StorageConfig {
    StorageConfig {
        operation_credits: 8,
        max_host_blocks: 128,
        max_keys_per_operation: 64,
        lookahead_tokens: 0,
        negative_metadata_capacity: 64,
        backup_candidate_capacity: 64,
        backup_bytes_in_flight: 1 << 40,
        soft_deadline_ms: SOFT_DEADLINE_MS,
        ready_hold_ms: SOFT_DEADLINE_MS,
        min_extension_tokens: 1,
        pressure_high: PressureWatermark {
            queued_jobs: 1_000,
            queued_bytes: 1 << 40,
            oldest_age_ms: 1 << 20,
        },
        pressure_low: PressureWatermark {
            queued_jobs: 500,
            queued_bytes: 1 << 39,
            oldest_age_ms: 1 << 19,
        },
    }
}

/// A scheduler and (with storage) its StorageTransferManager, one round at a time.
pub(super) struct Rig {
    pub s: Scheduler,
    pub stm: Option<StorageTransferManager>,
    /// Rounds applied so far (the next round's tick is `(round + 1) * ROUND_US`).
    pub round: u64,
}

/// 64 Device blocks, 256 Host blocks, four requests at once.
pub(super) fn rig(storage: bool) -> Rig {
    rig_with(storage, 64, 4)
}

pub(super) fn rig_with(storage: bool, device_blocks: u32, max_running: usize) -> Rig {
    rig_full(storage, device_blocks, max_running, 1024)
}

/// `rig` with tails off (aligned boundaries only; a partial last block in a scratch slot).
pub(super) fn rig_without_tails(storage: bool) -> Rig {
    rig_full(storage, 64, 4, 0)
}

pub(super) fn rig_full(
    storage: bool,
    device_blocks: u32,
    max_running: usize,
    tail_capacity: usize,
) -> Rig {
    rig_of("tiny", storage, device_blocks, max_running, tail_capacity)
}

/// `rig_full` of the model profile `profile`.
pub(super) fn rig_of(
    profile: &str,
    storage: bool,
    device_blocks: u32,
    max_running: usize,
    tail_capacity: usize,
) -> Rig {
    let model = SyntheticModel::by_name(profile).unwrap();
    let groups = model.profile().groups.len() as u32;
    let layout = RankLayout::new(
        model.profile(),
        0,
        1,
        device_blocks,
        256,
        max_running as u32 * groups,
    )
    .unwrap();
    let s = Scheduler::new(
        SchedulerConfig {
            layout,
            namespace: Namespace("tsl3-00000000schedtests".into()),
            storage: storage.then(storage_config),
            max_running,
            tail_capacity,
        },
        model,
    )
    .unwrap();
    let stm = s.storage_config().cloned().map(StorageTransferManager::new);
    Rig { s, stm, round: 0 }
}

impl Rig {
    /// Applies one agreed round (the tick is the round's unless `input` sets one).
    pub fn apply(&mut self, mut input: AgreedInputs) {
        self.round += 1;
        if input.tick_us == 0 {
            input.tick_us = self.round * ROUND_US;
        }
        self.s.apply(input, self.stm.as_mut()).unwrap();
    }

    /// Plans the round; the manager's operations come back when its plan ends.
    pub fn plan(&mut self) -> Plan<StorageOp> {
        self.s.plan(self.stm.as_mut())
    }

    pub fn round(&mut self, input: AgreedInputs) -> Plan<StorageOp> {
        self.apply(input);
        self.plan()
    }

    /// A round in which `requests` arrive (id, prompt, max_tokens).
    pub fn arrive(&mut self, requests: &[(u64, &[u32], u32)]) -> Plan<StorageOp> {
        self.round(arrivals(requests))
    }

    /// The D2H copies completed: Host L2 publishes and the candidates go to the manager.
    /// Returns how many candidates there were.
    pub fn d2h_done(&mut self) -> usize {
        let candidates = self.s.d2h_done();
        let n = candidates.len();
        if let Some(stm) = self.stm.as_mut() {
            stm.offer_backups(candidates);
        }
        n
    }
}

pub(super) fn arrivals(requests: &[(u64, &[u32], u32)]) -> AgreedInputs {
    AgreedInputs {
        new_requests: requests
            .iter()
            .map(|(id, p, n)| (RequestId(*id), p.to_vec(), *n).into())
            .collect(),
        ..AgreedInputs::default()
    }
}

/// The one-rank digests of a plan's forwards (the value is arbitrary).
pub(super) fn digests_of<S>(plan: &Plan<S>) -> Vec<(RequestId, Vec<RankDigest>)> {
    plan.forwards
        .iter()
        .map(|(id, step)| {
            let d = RankDigest {
                shard: step.shard,
                tokens: step.tokens.len() as u64,
                value: id.0,
            };
            (*id, vec![d])
        })
        .collect()
}

pub(super) fn prompt(n: u32, salt: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 31 + salt * 7) % 997).collect()
}

/// The Finished event of `id`, if any.
pub(super) fn finished(events: &[RequestEvent], id: u64) -> Option<&RequestEvent> {
    events
        .iter()
        .find(|e| matches!(e, RequestEvent::Finished { id: r, .. } if r.0 == id))
}

/// A request served to completion on a storage-disabled rig: admitted, its D2H done, its
/// digest applied (max_tokens 1, so it finishes there).
/// `serve_one`, then admin command `cmd` applied (the scheduler is quiescent in between).
pub(super) fn serve_then_admin(rig: &mut Rig, id: u64, prompt: &[u32], cmd: super::AdminCommand) {
    serve_one(rig, id, prompt);
    rig.s.admin(cmd);
    assert!(rig.s.quiescent());
    rig.s.apply_admin(None, None);
}

pub(super) fn serve_one(rig: &mut Rig, id: u64, prompt: &[u32]) -> Vec<RequestEvent> {
    let plan = rig.arrive(&[(id, prompt, 1)]);
    assert_eq!(plan.forwards.len(), 1, "admitted at once");
    rig.d2h_done();
    rig.apply(AgreedInputs {
        digests: digests_of(&plan),
        ..AgreedInputs::default()
    });
    let events = rig.s.drain_events();
    assert!(finished(&events, id).is_some(), "{events:?}");
    events
}
