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
    /// Multi-process DFS tests: set on a re-entered test binary to run the child role.
    pub const DFS_TEST_CHILD: &str = "TSL3_DFS_TEST_CHILD";
    /// Multi-process DFS tests: the shared DFS directory of the child.
    pub const DFS_TEST_DIR: &str = "TSL3_DFS_TEST_DIR";
}

/// Metric names (Prometheus conventions: `_total` on counters, unit suffixes).
pub mod metric {
    pub const PREFIX: &str = "tsl3";
    /// DFS → MEMORY promotion (seed 003): admitted attempts and their outcomes.
    pub const PROMOTION_ATTEMPTED_TOTAL: &str = "tsl3_promotion_attempted_total";
    pub const PROMOTION_COMMITTED_TOTAL: &str = "tsl3_promotion_committed_total";
    /// Label `reason`: busy, fenced, source_changed, io, checksum, capacity_*.
    pub const PROMOTION_FAILED_TOTAL: &str = "tsl3_promotion_failed_total";
    pub const PROMOTION_EXPIRED_TOTAL: &str = "tsl3_promotion_expired_total";
    pub const PROMOTION_CANCELLED_TOTAL: &str = "tsl3_promotion_cancelled_total";
    /// Label `reason`: quota, allocation, watermark, in_flight_cap (before admission).
    pub const PROMOTION_REJECTED_TOTAL: &str = "tsl3_promotion_rejected_total";
    pub const PROMOTION_IN_FLIGHT: &str = "tsl3_promotion_in_flight";
    pub const PROMOTION_STAGING_BYTES: &str = "tsl3_promotion_staging_bytes";
    /// Local store GETs served by tier: label `tier` = memory | dfs.
    pub const LOCAL_GET_TOTAL: &str = "tsl3_local_get_total";
}
