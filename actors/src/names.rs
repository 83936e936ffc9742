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
    /// Interpreter of the Mooncake master's venv (its Python client), for `bench mooncake`.
    pub const MOONCAKE_PYTHON: &str = "MOONCAKE_PYTHON";
    /// Shared secret of the rank mesh (overrides settings).
    pub const MESH_SECRET: &str = "TSL3_MESH_SECRET";
    /// Set only by the control plane's multi-process test on the child ranks it re-executes
    /// (value: the child's rank).
    pub const CONTROL_PLANE_TEST_CHILD: &str = "TSL3_CONTROL_PLANE_TEST_CHILD";
    /// Standard OTLP endpoint variable.
    pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    /// Multi-process DFS tests: set on a re-entered test binary to run the child role.
    pub const DFS_TEST_CHILD: &str = "TSL3_DFS_TEST_CHILD";
    /// Multi-process DFS tests: the shared DFS directory of the child.
    pub const DFS_TEST_DIR: &str = "TSL3_DFS_TEST_DIR";
    /// Cross-process flat-KV test (actors/tests/flat_kv_process.rs): the child's role
    /// (`writer` or `reader`) on a re-entered test binary.
    pub const FLAT_KV_TEST_CHILD: &str = "TSL3_FLAT_KV_TEST_CHILD";
    /// Cross-process flat-KV test: the store of the child (`local:<dir>` or `mooncake`).
    pub const FLAT_KV_TEST_STORE: &str = "TSL3_FLAT_KV_TEST_STORE";
    /// Cross-process flat-KV test: the fresh namespace (and prompt salt) of the run.
    pub const FLAT_KV_TEST_NAMESPACE: &str = "TSL3_FLAT_KV_TEST_NAMESPACE";
    /// Set to 1 by the README test command: the fault-matrix tests fail (instead of
    /// skipping) when they cannot mount a tmpfs.
    pub const REQUIRE_MOUNT: &str = "TSL3_REQUIRE_MOUNT";
    /// Inputs per target of the fuzz smoke runs (actors/tests/fuzz_smoke.rs).
    pub const FUZZ_ITERATIONS: &str = "TSL3_FUZZ_ITERATIONS";
    /// The Mooncake live test's re-entered writer process.
    pub const MOONCAKE_LIVE_WRITER: &str = "TSL3_MOONCAKE_LIVE_WRITER";
}

/// Metric names (Prometheus conventions: `_total` on counters, unit suffixes). Labels are
/// only model, role, dp_rank, tp_rank, replica (constant) plus the fixed enumerations named beside
/// each metric; never request IDs or object keys.
pub mod metric {
    pub const PREFIX: &str = "tsl3";
    // L3 executor (rank-local I/O). Label: kind = query|get|put.
    pub const L3_OPERATIONS: &str = "tsl3_l3_operations_total"; // + outcome
    pub const L3_QUEUE_SECONDS: &str = "tsl3_l3_queue_seconds_total";
    pub const L3_BACKEND_SECONDS: &str = "tsl3_l3_backend_seconds_total";
    pub const L3_JOBS: &str = "tsl3_l3_jobs"; // + state = queued|running
    pub const L3_COMPLETED_JOBS: &str = "tsl3_l3_completed_jobs_total";
    pub const L3_PAYLOAD_BYTES: &str = "tsl3_l3_payload_bytes_total";
    pub const L3_QUEUED_PAYLOAD_BYTES: &str = "tsl3_l3_queued_payload_bytes";
    pub const L3_OLDEST_JOB_AGE_SECONDS: &str = "tsl3_l3_oldest_job_age_seconds";
    pub const L3_BACKEND_CALLS: &str = "tsl3_l3_backend_calls_total";
    pub const L3_PUT_NEW_WRITES: &str = "tsl3_l3_put_new_writes_total";
    pub const L3_HEALTH_STATE: &str = "tsl3_l3_health_state";
    pub const L3_HEALTH_EPOCH: &str = "tsl3_l3_health_epoch";
    pub const L3_UNPROVEN_RETIREMENT: &str = "tsl3_l3_unproven_retirement";
    // StorageTransferManager (scheduler mirrors: do not sum across TP owners).
    pub const L3_READY_HOLDS: &str = "tsl3_l3_ready_holds";
    pub const L3_QUARANTINED_REFERENCES: &str = "tsl3_l3_quarantined_references";
    pub const L3_SOFT_TIMEOUTS: &str = "tsl3_l3_soft_timeouts_total";
    pub const L3_READY_EXPIRATIONS: &str = "tsl3_l3_ready_expirations_total";
    pub const L3_PRESSURE_BYPASSES: &str = "tsl3_l3_pressure_bypasses_total";
    pub const L3_DROPPED_BACKUP_KEYS: &str = "tsl3_l3_dropped_backup_keys_total"; // + reason
    pub const L3_ADMISSION_GATE_OPEN: &str = "tsl3_l3_admission_gate_open";
    pub const L3_ADMISSION_GATE_CLOSED_SECONDS: &str =
        "tsl3_l3_admission_gate_closed_seconds_total";
    pub const L3_CREDITS_IN_USE: &str = "tsl3_l3_credits_in_use"; // + credit = operation|host
                                                                  // DFS -> MEMORY promotion (local store).
    pub const PROMOTION_ATTEMPTED: &str = "tsl3_promotion_attempted_total";
    pub const PROMOTION_COMMITTED: &str = "tsl3_promotion_committed_total";
    pub const PROMOTION_FAILED: &str = "tsl3_promotion_failed_total"; // + reason
    pub const PROMOTION_IN_FLIGHT: &str = "tsl3_promotion_in_flight";
    pub const PROMOTION_STAGING_BYTES: &str = "tsl3_promotion_staging_bytes";
    // Serving.
    pub const TTFT_SECONDS: &str = "tsl3_ttft_seconds";
    pub const PREFIX_TOKENS: &str = "tsl3_prefix_tokens_total"; // + tier = device|host|l3|computed
    pub const REQUESTS: &str = "tsl3_requests_total"; // + fallback_reason
    /// Tail boundaries (nonaligned) asked by issued QUERY operations.
    pub const TAIL_CANDIDATES_QUERIED: &str = "tsl3_tail_candidates_queried_total";
    /// Tail blocks of those candidates, label `kind` = full | sliding_window | state.
    pub const TAIL_BLOCKS_QUERIED: &str = "tsl3_tail_blocks_queried_total";
    /// Tail blocks admission reused (any tier), label `kind`; `tier` says where from.
    pub const TAIL_BLOCKS_REUSED: &str = "tsl3_tail_blocks_reused_total";
    /// Prompt tokens above the aligned boundary reused through a tail, label `tier` =
    /// device | host | l3 (the tier that supplied the tail's blocks).
    pub const TAIL_TOKENS_REUSED: &str = "tsl3_tail_tokens_reused_total";
    pub const ROUNDS: &str = "tsl3_rounds_total";
    pub const PROMOTION_EXPIRED_TOTAL: &str = "tsl3_promotion_expired_total";
    pub const PROMOTION_CANCELLED_TOTAL: &str = "tsl3_promotion_cancelled_total";
    /// Label `reason`: quota, allocation, watermark, in_flight_cap (before admission).
    pub const PROMOTION_REJECTED_TOTAL: &str = "tsl3_promotion_rejected_total";
    /// DFS tier reads by result: label `outcome` = ok | missing | invalid | failed.
    pub const DFS_READS_TOTAL: &str = "tsl3_dfs_reads_total";
    /// DFS tier PUT keys by result: label `outcome` = written | exists | capacity | failed.
    pub const DFS_PUTS_TOTAL: &str = "tsl3_dfs_puts_total";
    /// Invalid DFS objects found, label `reason` = bad_key | header | identity | length |
    /// checksum | unreadable | too_long.
    pub const DFS_INVALID_OBJECTS_TOTAL: &str = "tsl3_dfs_invalid_objects_total";
    /// Invalid DFS objects removed so that a later PUT of their key lands.
    pub const DFS_INVALID_REMOVED_TOTAL: &str = "tsl3_dfs_invalid_removed_total";
    /// Local store GETs served by tier: label `tier` = memory | dfs.
    pub const LOCAL_GET_TOTAL: &str = "tsl3_local_get_total";
}
