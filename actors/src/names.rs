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
    /// Set only by the control plane's multi-process test on the child ranks it re-executes
    /// (value: the child's rank).
    pub const CONTROL_PLANE_TEST_CHILD: &str = "TSL3_CONTROL_PLANE_TEST_CHILD";
    /// Standard OTLP endpoint variable.
    pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
}

/// Metric names (Prometheus conventions: `_total` on counters, unit suffixes).
pub mod metric {
    pub const PREFIX: &str = "tsl3";
}
