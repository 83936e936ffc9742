//! Settings types and their validation rules, split on seed 000's ownership line:
//! StorageConfig (the read-only scheduling contract), StorageRuntimeConfig (that contract
//! plus the executor's workers, queues and health settings), MooncakeStoreSettings, and
//! L3Settings (what the engine host starts the executor from). Loading and layering
//! (config/default.toml, a file, `TSL3_*` environment, flags) lives in the binary; this
//! module only defines the shapes and the rules. Every rule failure is one line naming the
//! field and the rule.

use crate::identity::DeploymentIdentity;
use crate::pressure::PressureObservation;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One settings rule violated: `<field>: <rule>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsError {
    pub field: String,
    pub rule: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid setting {}: {}", self.field, self.rule)
    }
}

impl std::error::Error for SettingsError {}

fn bad(field: &str, rule: impl Into<String>) -> SettingsError {
    SettingsError {
        field: field.to_string(),
        rule: rule.into(),
    }
}

fn positive(field: &str, v: u64) -> Result<(), SettingsError> {
    if v == 0 {
        Err(bad(field, "must be greater than 0"))
    } else {
        Ok(())
    }
}

/// Pressure watermarks in settings units (milliseconds for age).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PressureWatermark {
    pub queued_jobs: u64,
    pub queued_bytes: u64,
    pub oldest_age_ms: u64,
}

impl PressureWatermark {
    pub fn as_observation(&self) -> PressureObservation {
        PressureObservation {
            queued_jobs: self.queued_jobs,
            queued_bytes: self.queued_bytes,
            oldest_age_us: self.oldest_age_ms.saturating_mul(1000),
        }
    }
}

/// The read-only scheduling contract (seed 000: StorageConfig): credits, bounds, deadlines
/// and pressure watermarks. Shared by the StorageTransferManager and the executor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// Outstanding storage operations the scheduler may hold (reads may use all; backups
    /// at most half, rounded down).
    pub operation_credits: u32,
    /// Host credits: logical block references across all groups and outstanding storage
    /// operations (max_host_blocks). Not a byte budget.
    pub max_host_blocks: u32,
    /// Most keys one operation may carry.
    pub max_keys_per_operation: u32,
    /// Most tokens a read may extend beyond the local hit.
    pub lookahead_tokens: u32,
    /// Capacity of the bounded FIFO of confirmed missing/invalid objects.
    pub negative_metadata_capacity: u32,
    /// Capacity of the bounded, nonowning backup candidate queue.
    pub backup_candidate_capacity: u32,
    /// Payload bytes of backup PUTs outstanding at once: a new backup PUT is admitted only
    /// while less is outstanding, and one takes keys until it carries a quarter of it (at
    /// least one key). A write path slower than the backups then queues candidates
    /// (bounded, the oldest dropped and counted) instead of aging the executor's queue into
    /// the pressure gate.
    pub backup_bytes_in_flight: u64,
    /// Soft deadline of a read, from QUERY issue, including queue wait.
    pub soft_deadline_ms: u64,
    /// How long a Ready hold protects newly read blocks before expiring.
    pub ready_hold_ms: u64,
    /// An extension below this many tokens bypasses L3.
    pub min_extension_tokens: u32,
    /// The gate closes when any observation reaches its high watermark...
    pub pressure_high: PressureWatermark,
    /// ...and reopens only when all are under their low watermarks.
    pub pressure_low: PressureWatermark,
}

impl StorageConfig {
    /// Backups may use at most half of the operation credits, rounded down.
    pub fn backup_operation_credits(&self) -> u32 {
        self.operation_credits / 2
    }
    /// Backups may use at most half of the Host credits, rounded down.
    pub fn backup_host_credits(&self) -> u32 {
        self.max_host_blocks / 2
    }

    pub fn validate(&self, prefix: &str) -> Result<(), SettingsError> {
        let f = |name: &str| format!("{prefix}.{name}");
        positive(&f("operation_credits"), self.operation_credits as u64)?;
        positive(&f("max_host_blocks"), self.max_host_blocks as u64)?;
        positive(
            &f("max_keys_per_operation"),
            self.max_keys_per_operation as u64,
        )?;
        positive(
            &f("negative_metadata_capacity"),
            self.negative_metadata_capacity as u64,
        )?;
        positive(
            &f("backup_candidate_capacity"),
            self.backup_candidate_capacity as u64,
        )?;
        positive(&f("backup_bytes_in_flight"), self.backup_bytes_in_flight)?;
        positive(&f("soft_deadline_ms"), self.soft_deadline_ms)?;
        positive(&f("ready_hold_ms"), self.ready_hold_ms)?;
        if self.operation_credits > 1_000_000 {
            return Err(bad(&f("operation_credits"), "must be at most 1000000"));
        }
        if self.max_keys_per_operation > self.max_host_blocks {
            return Err(bad(
                &f("max_keys_per_operation"),
                format!("must not exceed max_host_blocks ({})", self.max_host_blocks),
            ));
        }
        let (hi, lo) = (&self.pressure_high, &self.pressure_low);
        for (name, h, l) in [
            ("queued_jobs", hi.queued_jobs, lo.queued_jobs),
            ("queued_bytes", hi.queued_bytes, lo.queued_bytes),
            ("oldest_age_ms", hi.oldest_age_ms, lo.oldest_age_ms),
        ] {
            positive(&f(&format!("pressure_high.{name}")), h)?;
            if l >= h {
                return Err(bad(
                    &f(&format!("pressure_low.{name}")),
                    format!("low watermark must be below the high watermark ({l} >= {h})"),
                ));
            }
        }
        Ok(())
    }
}

/// StorageRuntimeConfig: the scheduling contract plus the executor's worker counts, queue
/// capacities, outstanding-operation limit and backend-health settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageRuntimeConfig {
    pub query_workers: u32,
    pub get_workers: u32,
    pub put_workers: u32,
    pub query_queue_capacity: u32,
    pub get_queue_capacity: u32,
    pub put_queue_capacity: u32,
    /// Queued jobs + native work + undelivered results, all kinds together.
    pub outstanding_limit: u32,
    /// After an outage, work is rejected for this long, then one probe is allowed.
    pub health_cooldown_ms: u64,
    /// close() joins workers for at most this long.
    pub close_deadline_ms: u64,
}

impl StorageRuntimeConfig {
    pub fn validate(&self, prefix: &str, contract: &StorageConfig) -> Result<(), SettingsError> {
        let f = |name: &str| format!("{prefix}.{name}");
        for (name, v) in [
            ("query_workers", self.query_workers),
            ("get_workers", self.get_workers),
            ("put_workers", self.put_workers),
        ] {
            if v == 0 {
                return Err(bad(&f(name), "workers must be greater than 0"));
            }
            if v > 256 {
                return Err(bad(&f(name), "workers must be at most 256"));
            }
        }
        for (name, v) in [
            ("query_queue_capacity", self.query_queue_capacity),
            ("get_queue_capacity", self.get_queue_capacity),
            ("put_queue_capacity", self.put_queue_capacity),
        ] {
            if v == 0 {
                return Err(bad(&f(name), "queue capacity must be greater than 0"));
            }
            if v > self.outstanding_limit {
                return Err(bad(
                    &f(name),
                    format!(
                        "queue capacity must not exceed outstanding_limit ({})",
                        self.outstanding_limit
                    ),
                ));
            }
        }
        positive(&f("outstanding_limit"), self.outstanding_limit as u64)?;
        if self.outstanding_limit < contract.operation_credits {
            return Err(bad(
                &f("outstanding_limit"),
                format!(
                    "must be at least the operation credits ({}) so that no credited operation is rejected",
                    contract.operation_credits
                ),
            ));
        }
        positive(&f("health_cooldown_ms"), self.health_cooldown_ms)?;
        positive(&f("close_deadline_ms"), self.close_deadline_ms)?;
        Ok(())
    }

    pub fn queue_capacity(&self, kind: crate::StorageOpKind) -> u32 {
        match kind {
            crate::StorageOpKind::Query => self.query_queue_capacity,
            crate::StorageOpKind::Get => self.get_queue_capacity,
            crate::StorageOpKind::Put => self.put_queue_capacity,
        }
    }

    pub fn workers(&self, kind: crate::StorageOpKind) -> u32 {
        match kind {
            crate::StorageOpKind::Query => self.query_workers,
            crate::StorageOpKind::Get => self.get_workers,
            crate::StorageOpKind::Put => self.put_workers,
        }
    }
}

/// Connection settings of the Mooncake store client and this rank's segment share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MooncakeStoreSettings {
    /// Path of libmooncake_store.so; empty: the `MOONCAKE_STORE_LIBRARY` environment variable.
    pub library_path: String,
    pub local_hostname: String,
    /// "P2PHANDSHAKE" or an HTTP metadata URL.
    pub metadata_server: String,
    pub master_server_addr: String,
    pub protocol: String,
    pub device_name: String,
    /// 0 (the default) makes this rank a pure client that mounts no storage of its own.
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub tenant_id: String,
    /// Root of the shared-DFS tier under Mooncake (the tiered store); empty: Mooncake only.
    #[serde(default)]
    pub dfs_dir: String,
}

impl MooncakeStoreSettings {
    pub fn validate(&self, prefix: &str) -> Result<(), SettingsError> {
        let f = |name: &str| format!("{prefix}.{name}");
        if self.local_hostname.is_empty() {
            return Err(bad(&f("local_hostname"), "must not be empty"));
        }
        if self.metadata_server.is_empty() {
            return Err(bad(&f("metadata_server"), "must not be empty"));
        }
        if !self.master_server_addr.contains(':') {
            return Err(bad(&f("master_server_addr"), "must be host:port"));
        }
        if !matches!(self.protocol.as_str(), "tcp" | "rdma") {
            return Err(bad(&f("protocol"), "must be tcp or rdma"));
        }
        if self.tenant_id.is_empty() {
            return Err(bad(&f("tenant_id"), "must not be empty"));
        }
        Ok(())
    }
}

/// Which L3 backend the engine host uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum StoreKind {
    /// Storage disabled: no executor, no store client, no storage poll.
    None,
    Memory,
    /// The embedded default: in-process MEMORY tier over a shared-DFS directory.
    Local,
    Mooncake,
}

impl TryFrom<String> for StoreKind {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s)
            .ok_or_else(|| format!("must be one of {} (got {s:?})", Self::NAMES.join(", ")))
    }
}

impl From<StoreKind> for String {
    fn from(k: StoreKind) -> String {
        k.as_str().to_string()
    }
}

impl StoreKind {
    /// Every backend's name, as settings and `--store` spell it.
    pub const NAMES: [&'static str; 4] = ["none", "memory", "local", "mooncake"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(StoreKind::None),
            "memory" => Some(StoreKind::Memory),
            "local" => Some(StoreKind::Local),
            "mooncake" => Some(StoreKind::Mooncake),
            _ => None,
        }
    }
    pub fn as_str(&self) -> &'static str {
        match self {
            StoreKind::None => "none",
            StoreKind::Memory => "memory",
            StoreKind::Local => "local",
            StoreKind::Mooncake => "mooncake",
        }
    }
}

/// Settings of the local store's MEMORY tier and DFS tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalStoreSettings {
    /// Root directory of the shared-DFS tier (a local dir, or an NFS/CephFS/3FS mount).
    pub dir: String,
    /// Bytes the in-process MEMORY tier may hold.
    pub memory_bytes: u64,
    /// Promotion workers, staging bytes and outstanding promotion tasks.
    pub promotion_workers: u32,
    pub staging_bytes: u64,
    pub max_promotions_in_flight: u32,
    /// Concurrent DFS file operations.
    pub dfs_io_concurrency: u32,
    /// Promote what a GET read from DFS into the MEMORY tier after the GET settled
    /// (detached, at background priority).
    pub promote_after_get: bool,
}

impl LocalStoreSettings {
    pub fn validate(&self, prefix: &str) -> Result<(), SettingsError> {
        let f = |name: &str| format!("{prefix}.{name}");
        if self.dir.is_empty() {
            return Err(bad(&f("dir"), "must not be empty"));
        }
        positive(&f("memory_bytes"), self.memory_bytes)?;
        positive(&f("promotion_workers"), self.promotion_workers as u64)?;
        positive(&f("staging_bytes"), self.staging_bytes)?;
        positive(
            &f("max_promotions_in_flight"),
            self.max_promotions_in_flight as u64,
        )?;
        positive(&f("dfs_io_concurrency"), self.dfs_io_concurrency as u64)?;
        Ok(())
    }
}

/// Everything the engine host starts the L3 executor from (seed 000: L3Settings): limits
/// and workers, the identity, the Host allocation's geometry and the store client's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct L3Settings {
    pub runtime: StorageRuntimeConfig,
    pub contract: StorageConfig,
    pub identity: DeploymentIdentity,
    pub store: StoreKind,
    pub local: LocalStoreSettings,
    pub mooncake: MooncakeStoreSettings,
    /// Size of the shared Host allocation the executor addresses by pointer.
    pub host_bytes: u64,
    pub tp_rank: u32,
}

#[cfg(test)]
pub mod tests {
    use super::*;

    pub fn contract() -> StorageConfig {
        StorageConfig {
            operation_credits: 8,
            max_host_blocks: 64,
            max_keys_per_operation: 64,
            lookahead_tokens: 4096,
            negative_metadata_capacity: 16,
            backup_candidate_capacity: 16,
            backup_bytes_in_flight: 1 << 30,
            soft_deadline_ms: 100,
            ready_hold_ms: 100,
            min_extension_tokens: 1,
            pressure_high: PressureWatermark {
                queued_jobs: 10,
                queued_bytes: 1000,
                oldest_age_ms: 100,
            },
            pressure_low: PressureWatermark {
                queued_jobs: 5,
                queued_bytes: 500,
                oldest_age_ms: 50,
            },
        }
    }

    pub fn runtime() -> StorageRuntimeConfig {
        StorageRuntimeConfig {
            query_workers: 1,
            get_workers: 1,
            put_workers: 1,
            query_queue_capacity: 4,
            get_queue_capacity: 4,
            put_queue_capacity: 4,
            outstanding_limit: 8,
            health_cooldown_ms: 100,
            close_deadline_ms: 100,
        }
    }

    fn err_line(r: Result<(), SettingsError>) -> String {
        let e = r.unwrap_err().to_string();
        assert!(!e.contains('\n'), "one line: {e}");
        e
    }

    #[test]
    fn defaults_validate() {
        contract().validate("storage.contract").unwrap();
        runtime().validate("storage.runtime", &contract()).unwrap();
    }

    #[test]
    fn watermark_rule_names_field() {
        let mut c = contract();
        c.pressure_low.queued_bytes = 1000;
        let e = err_line(c.validate("storage.contract"));
        assert!(
            e.contains("storage.contract.pressure_low.queued_bytes"),
            "{e}"
        );
        assert!(e.contains("below the high watermark"), "{e}");
    }

    #[test]
    fn credit_rules_name_field() {
        let mut c = contract();
        c.operation_credits = 0;
        assert!(err_line(c.validate("s")).contains("s.operation_credits: must be greater than 0"));
        let mut c = contract();
        c.max_keys_per_operation = 65;
        assert!(err_line(c.validate("s")).contains("s.max_keys_per_operation"));
        assert_eq!(contract().backup_operation_credits(), 4);
        let mut c = contract();
        c.operation_credits = 1;
        assert_eq!(
            c.backup_operation_credits(),
            0,
            "a one-credit budget admits no backups"
        );
    }

    #[test]
    fn worker_and_queue_rules_name_field() {
        let mut r = runtime();
        r.get_workers = 0;
        assert!(err_line(r.validate("rt", &contract()))
            .contains("rt.get_workers: workers must be greater than 0"));
        let mut r = runtime();
        r.put_queue_capacity = 0;
        assert!(err_line(r.validate("rt", &contract())).contains("rt.put_queue_capacity"));
        let mut r = runtime();
        r.query_queue_capacity = 9;
        assert!(
            err_line(r.validate("rt", &contract())).contains("must not exceed outstanding_limit")
        );
        let mut r = runtime();
        r.outstanding_limit = 4;
        r.query_queue_capacity = 1;
        r.get_queue_capacity = 1;
        r.put_queue_capacity = 1;
        assert!(err_line(r.validate("rt", &contract())).contains("rt.outstanding_limit"));
    }
}
