//! Every metric name and every environment variable of tsl3, in one place.

/// Environment variables.
pub mod env {
    /// Prefix of layered settings overrides (`TSL3_STORAGE__BACKEND=memory`).
    pub const SETTINGS_PREFIX: &str = "TSL3";
    /// Path of libmooncake_store.so when the settings leave it empty.
    pub const MOONCAKE_STORE_LIBRARY: &str = "MOONCAKE_STORE_LIBRARY";
    /// Set to 1 by CI: the Mooncake live tests fail (instead of skipping) without a master.
    pub const MOONCAKE_REQUIRE_MASTER: &str = "MOONCAKE_REQUIRE_MASTER";
    /// Master address for the live tests (default 127.0.0.1:50051).
    pub const MOONCAKE_MASTER: &str = "MOONCAKE_MASTER";
    /// Metadata server for the live tests (default P2PHANDSHAKE).
    pub const MOONCAKE_METADATA_SERVER: &str = "MOONCAKE_METADATA_SERVER";
    /// Shared secret of the rank mesh (overrides settings).
    pub const MESH_SECRET: &str = "TSL3_MESH_SECRET";
    /// Standard OTLP endpoint variable.
    pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
}

/// Metric names (Prometheus conventions: `_total` on counters, unit suffixes).
pub mod metric {
    pub const PREFIX: &str = "tsl3";
}

/// StorageTransferManager scheduler metrics (mirrored across TP owners: never sum them).
pub mod stm {
    /// Gauge: operation credits in use (label `class`: read|backup).
    pub const OPERATION_CREDITS_IN_USE: &str = "tsl3_stm_operation_credits_in_use";
    /// Gauge: Host credits in use (label `class`: read|backup).
    pub const HOST_CREDITS_IN_USE: &str = "tsl3_stm_host_credits_in_use";
    /// Gauge: Ready holds still charged to their storage tickets.
    pub const READY_HOLDS: &str = "tsl3_stm_ready_holds";
    /// Gauge: Host references kept by quarantined tickets.
    pub const QUARANTINED_REFERENCES: &str = "tsl3_stm_quarantined_references";
    /// Counter: waits ended by the soft deadline.
    pub const SOFT_TIMEOUTS_TOTAL: &str = "tsl3_stm_soft_timeouts_total";
    /// Counter: Ready holds that expired before admission.
    pub const READY_EXPIRATIONS_TOTAL: &str = "tsl3_stm_ready_expirations_total";
    /// Counter: requests that bypassed or left L3 because the pressure gate was closed.
    pub const PRESSURE_BYPASSES_TOTAL: &str = "tsl3_stm_pressure_bypasses_total";
    /// Counter: dropped backup candidate keys (label `reason`: pressure|overflow|
    /// unavailable|disabled|cleanup).
    pub const DROPPED_BACKUP_KEYS_TOTAL: &str = "tsl3_l3_dropped_backup_keys_total";
    /// The fixed label name of DROPPED_BACKUP_KEYS_TOTAL.
    pub const DROPPED_REASON_LABEL: &str = "reason";
    /// Gauge: the pressure admission gate (1 closed, 0 open).
    pub const ADMISSION_GATE_CLOSED: &str = "tsl3_stm_admission_gate_closed";
    /// Gauge: 1 while L3 work is enabled for the replica (0 after quarantine).
    pub const L3_ENABLED: &str = "tsl3_stm_l3_enabled";
}
