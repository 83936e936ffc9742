//! The startup factory (seed 000: cache/l3/factory.py): derives the deployment identity
//! and namespace from the model (a synthetic profile, or a model directory whose
//! checkpoint hash enters the namespace) and the rank geometry, sizes the shared Host
//! allocation, and builds one RankEngine with its forward backend. Storage disabled: no
//! executor, no store client.

use super::RankEngine;
use crate::clock::SharedClock;
use crate::device::transformer::TransformerBackend;
use crate::device::{
    device_memory, DeviceBackendChoice, DeviceCopyEngineCore, DeviceGeometry, ForwardBackend,
};
use crate::host::HostCacheStorage;
use crate::l3::store::Store;
use crate::l3::L3Executor;
use crate::model::SyntheticModel;
use crate::scheduler::geometry::RankLayout;
use crate::scheduler::{Scheduler, SchedulerConfig};
use messages::settings::{StorageConfig, StorageRuntimeConfig};
use messages::DeploymentIdentity;
use std::sync::Arc;
use transformer::{ComputeDevice, Transformer};

/// Why a rank could not be built; each names the part that failed.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("model profile: {0}")]
    Model(#[from] crate::model::ModelError),
    #[error("cache layout: {0}")]
    Layout(String),
    #[error("host allocation: {0}")]
    Host(#[from] crate::host::HostError),
    #[error("device: {0}")]
    Device(#[from] crate::device::DeviceError),
    #[error("store: {0}")]
    Store(String),
    #[error("L3 executor: {0}")]
    Executor(#[from] crate::l3::StartError),
    #[error("scheduler: {0}")]
    Scheduler(#[from] crate::cache::coordinator::CacheError),
}

/// Everything one rank is built from.
#[derive(Clone, Debug)]
pub struct RankSpec {
    /// The synthetic model profile (ignored when `model_dir` is set).
    pub profile: String,
    /// A Hugging Face model directory served by the transformer backend (None: the
    /// synthetic `profile`).
    pub model_dir: Option<std::path::PathBuf>,
    /// Tokens per cache block of a model directory's geometry.
    pub block_tokens: u32,
    pub rank: u32,
    pub world: u32,
    /// Device blocks per cache group.
    pub device_blocks: u32,
    /// Host blocks per cache group.
    pub host_blocks: u32,
    pub max_running: usize,
    /// Capacity of the local TailTable of tail hints; 0 turns tails off (only aligned
    /// boundaries are reused; a prompt's partial last block is recomputed).
    pub tail_hints: usize,
    pub checkpoint: String,
    pub target_weight_version: u64,
    pub draft_weight_version: Option<u64>,
    /// None: storage disabled.
    pub storage: Option<(StorageConfig, StorageRuntimeConfig)>,
    pub device: DeviceBackendChoice,
}

impl RankSpec {
    /// The model and this rank's layout (geometry, pool sizes, scratch blocks): what the
    /// rank allocates, computed without allocating it.
    pub fn layout(&self) -> Result<(SyntheticModel, RankLayout), StartupError> {
        let model = match &self.model_dir {
            None => SyntheticModel::by_name(&self.profile)?,
            Some(dir) => {
                let (_, profile) =
                    crate::model::checkpoint::read(dir, self.block_tokens as u64, self.world)?;
                SyntheticModel::new(profile)
            }
        };
        let scratch = (self.max_running as u32).saturating_mul(model.profile().groups.len() as u32);
        let layout = RankLayout::new(
            model.profile(),
            self.rank,
            self.world,
            self.device_blocks,
            self.host_blocks,
            scratch.max(1),
        )
        .map_err(StartupError::Layout)?;
        Ok((model, layout))
    }

    /// A small single rank on the `tiny` profile with the emulated device: what tests,
    /// examples and benchmarks start from. With `storage`, generous storage limits (no
    /// pressure, long deadlines) so that only the behaviour under test shapes the run.
    pub fn small(storage: bool) -> Self {
        Self {
            profile: "tiny".into(),
            model_dir: None,
            block_tokens: 16,
            rank: 0,
            world: 1,
            device_blocks: 64,
            host_blocks: 256,
            max_running: 4,
            tail_hints: 1024,
            checkpoint: String::new(),
            target_weight_version: 1,
            draft_weight_version: None,
            storage: storage.then(small_storage),
            device: DeviceBackendChoice::Emulated,
        }
    }
}

/// Storage limits of [`RankSpec::small`].
pub fn small_storage() -> (StorageConfig, StorageRuntimeConfig) {
    use messages::settings::PressureWatermark;
    (
        StorageConfig {
            operation_credits: 16,
            max_host_blocks: 512,
            max_keys_per_operation: 256,
            lookahead_tokens: 0,
            negative_metadata_capacity: 64,
            backup_candidate_capacity: 256,
            backup_bytes_in_flight: 1 << 40,
            soft_deadline_ms: 60_000,
            ready_hold_ms: 60_000,
            min_extension_tokens: 1,
            pressure_high: PressureWatermark {
                queued_jobs: 10_000,
                queued_bytes: 1 << 40,
                oldest_age_ms: 600_000,
            },
            pressure_low: PressureWatermark {
                queued_jobs: 5_000,
                queued_bytes: 1 << 39,
                oldest_age_ms: 300_000,
            },
        },
        StorageRuntimeConfig {
            query_workers: 1,
            get_workers: 1,
            put_workers: 1,
            query_queue_capacity: 32,
            get_queue_capacity: 32,
            put_queue_capacity: 32,
            outstanding_limit: 64,
            health_cooldown_ms: 1000,
            close_deadline_ms: 2000,
        },
    )
}

/// The static deployment identity of a rank (no DP replica ID, Host allocation ID or
/// cyclic owner rank enters it).
pub fn identity(spec: &RankSpec, layout: &RankLayout) -> DeploymentIdentity {
    let checkpoint = if spec.checkpoint.is_empty() {
        format!("synthetic/{}", spec.profile)
    } else {
        spec.checkpoint.clone()
    };
    DeploymentIdentity {
        checkpoint,
        target_weight_version: spec.target_weight_version,
        draft_weight_version: spec.draft_weight_version,
        layout_signature: layout.geometry.layout_signature(),
        kvp: spec.world,
        qcp: 1,
        linear_attn_tp: 1,
        page_shard_counts: layout.geometry.page_shard_counts(),
    }
}

/// Builds one rank. `make_store` receives the shared Host allocation (a store that
/// registers it, such as Mooncake, does so there) and is called only when storage is on.
pub fn build_rank(
    spec: &RankSpec,
    clock: SharedClock,
    make_store: impl FnOnce(&Arc<HostCacheStorage>) -> Result<Arc<dyn Store>, String>,
) -> Result<RankEngine, StartupError> {
    let (model, layout) = spec.layout()?;
    let transformer = match &spec.model_dir {
        None => None,
        Some(dir) => {
            let device = match spec.device {
                DeviceBackendChoice::Cuda { ordinal } => ComputeDevice::Cuda(ordinal),
                _ => ComputeDevice::Cpu,
            };
            let t = Transformer::load(dir, device)
                .map_err(|e| crate::model::ModelError::Checkpoint(e.to_string()))?;
            Some(Arc::new(t))
        }
    };
    let namespace = match &transformer {
        None => identity(spec, &layout).namespace(),
        Some(t) => {
            // The checkpoint hash enters the namespace: another checkpoint never reuses
            // this KV, whatever the directory or a setting calls it.
            let mut s = spec.clone();
            s.checkpoint = if spec.checkpoint.is_empty() {
                format!("hf/{}", t.identity())
            } else {
                format!("{}/hf/{}", spec.checkpoint, t.identity())
            };
            identity(&s, &layout).namespace()
        }
    };
    let host = HostCacheStorage::new(layout.host_bytes().max(1))?;
    let dev_geometry = DeviceGeometry::new(layout.device_slots(), layout.slot_bytes())?;
    let (memory, _) = device_memory(host.clone(), dev_geometry, spec.device)?;
    let device = DeviceCopyEngineCore::new(memory);
    let executor = match &spec.storage {
        None => None,
        Some((_, runtime)) => {
            let store = make_store(&host).map_err(StartupError::Store)?;
            Some(L3Executor::start(
                store,
                host.clone(),
                runtime.clone(),
                clock.clone(),
            )?)
        }
    };
    let scheduler = Scheduler::new(
        SchedulerConfig {
            layout,
            namespace,
            storage: spec.storage.as_ref().map(|(c, _)| c.clone()),
            max_running: spec.max_running.max(1),
            tail_capacity: spec.tail_hints,
        },
        model,
    )?;
    let mut scheduler = scheduler;
    if crate::host::poison::enabled() {
        let h = host.clone();
        scheduler.set_host_free_hook(Arc::new(move |r| {
            // SAFETY: the pool calls this only for a block it frees, after its last
            // reference and pin are gone (the pool's ledger asserts it): no GET, PUT or
            // copy holds the range, so nothing else reads or writes these bytes now.
            if let Ok(bytes) = unsafe { h.range_mut(r) } {
                crate::host::poison::fill(bytes);
            }
        }));
    }
    let backend = match transformer {
        None => ForwardBackend::Synthetic(Arc::new(scheduler.model().clone())),
        Some(t) => ForwardBackend::Transformer(Box::new(TransformerBackend::new(
            t,
            Arc::new(scheduler.model().clone()),
        )?)),
    };
    Ok(RankEngine::with_backend(
        scheduler, executor, device, backend, host, clock,
    ))
}
