//! The settings reference (docs/settings.md), generated: `engine-host settings-doc >
//! docs/settings.md`. Keys and defaults come from the `Settings` types serialized from
//! config/default.toml; each integer's type is found by loading values through the real
//! loader (a u32 refuses 2^32, an unsigned one refuses -1); each rule is written here once
//! and shown with the one-line error the loader really gives for an example value that
//! breaks it. A unit test requires an entry for every key (and a key for every entry) and
//! that every example fails naming its field; tests/settings_doc.rs requires
//! docs/settings.md to equal this output.

use crate::settings::{self, Overrides};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One setting: what it means, its rule, and a value (with the other settings it needs,
/// as dotted key = value pairs) that the rule rejects.
pub struct Entry {
    pub key: &'static str,
    /// The type shown when the serialized default cannot tell it (enumerations, secrets).
    pub ty: Option<&'static str>,
    pub doc: &'static str,
    /// Empty: any value of the type.
    pub rule: &'static str,
    pub bad: Option<&'static str>,
    pub with: &'static [(&'static str, &'static str)],
}

const fn e(key: &'static str, doc: &'static str) -> Entry {
    Entry {
        key,
        ty: None,
        doc,
        rule: "",
        bad: None,
        with: &[],
    }
}

const fn r(key: &'static str, doc: &'static str, rule: &'static str, bad: &'static str) -> Entry {
    Entry {
        key,
        ty: None,
        doc,
        rule,
        bad: Some(bad),
        with: &[],
    }
}

const MOONCAKE: &[(&str, &str)] = &[("storage.backend", "mooncake")];
const MESH: &[(&str, &str)] = &[("tp.world", "2"), ("tp.secret", "s3cret")];

/// The section introductions, in file order.
pub const SECTIONS: &[(&str, &str)] = &[
    ("model", "The synthetic model, the Device (L1) cache and the device backend."),
    ("server", "HTTP: the leader's API, every rank's /metrics and /health, admin, shutdown."),
    ("host_cache", "The pinned Host (L2) cache."),
    ("storage", "The L3 backend."),
    ("storage.contract", "The read-only scheduling contract (seed 000's StorageConfig) the StorageTransferManager and the L3 executor share: credits, bounds, deadlines."),
    ("storage.contract.pressure_high", "The admission gate closes when any observation of the L3 executor reaches its high watermark..."),
    ("storage.contract.pressure_low", "...and reopens only when all are below their low watermarks."),
    ("storage.runtime", "The L3 executor's workers, queues, outstanding limit and backend health."),
    ("storage.local", "The embedded local store (`storage.backend = \"local\"`): an in-process MEMORY tier over a shared-DFS directory, with DFS -> MEMORY promotion (seed 003)."),
    ("storage.mooncake", "The Mooncake Store client (`storage.backend = \"mooncake\"`; deploy/mooncake/ starts a master). `MOONCAKE_MASTER` and `MOONCAKE_METADATA_SERVER` set `master_server_addr` and `metadata_server` above the file and below `TSL3_STORAGE__MOONCAKE__*`."),
    ("tp", "The tensor-parallel replica: this rank, the mesh and its deadlines. `engine-host launch` sets rank, world, peers and the secret for each rank."),
    ("telemetry", "Tracing export and the labels of every metric series."),
];

pub const ENTRIES: &[Entry] = &[
    // [model]
    Entry {
        ty: Some("string: tiny | llama-8b-like | llama-8b-like-h100-fp8 | hybrid-swa | hybrid-state | replay-small | replay-hybrid"),
        ..r("model.profile", "Synthetic model profile (flag `--model-profile`): its layers, cache groups, KV heads and cost model.", "one of the profiles `serve --help` lists", "bogus")
    },
    r("model.dir", "A Hugging Face model directory (config.json, safetensors weights, tokenizer.json, tokenizer_config.json) served by the transformer backend on one rank (flag `--model-dir`); the hash of its config and weights enters the L3 namespace. Empty: the synthetic `model.profile`.", "empty, or a directory holding config.json (with `tp.world` = 1)", "/nonexistent/tsl3-model"),
    r("model.block_tokens", "Tokens per KV block of a model directory's cache geometry (the synthetic profiles fix their own).", "greater than 0", "0"),
    e("model.checkpoint", "Checkpoint identity in the L3 namespace; empty: derived from the profile (or the model directory's hash, which is always appended)."),
    e("model.weight_version", "Weight version in the L3 namespace (`POST /admin/weight_version` moves it)."),
    r("model.draft_weight_version", "Draft model weight version; -1: no draft model.", "-1 or a version >= 0", "-2"),
    r("model.device_blocks", "Device (L1) KV blocks per cache group on each rank.", "greater than 0", "0"),
    r("model.max_running", "Requests admitted to the forward at once.", "greater than 0", "0"),
    r("model.tail_hints", "Capacity of the local TailTable: hints of nonaligned boundaries (a prompt's end: its partial history blocks, SWA lookback and State checkpoint) whose blocks this rank published; a query proposes them beside the aligned boundaries and the exact request bound. 0 turns tails off: only aligned boundaries are reused and a prompt's partial last block is recomputed.", "0 to 1000000", "2000000"),
    e("model.emulate_device_time", "Sleep the profile's cost-model device time per forward (emulated device)."),
    Entry {
        ty: Some("string: auto | emulated | cuda"),
        ..r("model.device", "The DeviceCopyEngine backend: auto (CUDA device 0 when present: a build with `--features cuda` and a driver; else emulated), emulated, or cuda (CUDA device 0, or a startup error).", "auto, emulated or cuda", "gpu")
    },
    // [server]
    r("server.listen", "The leader's HTTP API, with its /metrics and /health (flag `--listen`).", "a socket address host:port", "nowhere"),
    r("server.metrics_listen", "Base address of every rank's /metrics and /health: rank r serves them on this port + r; empty: `server.listen`'s port + r (flag `--metrics-listen`; launch sets it). Followers serve no API.", "empty or a socket address, whose port + rank is at most 65535", "nowhere"),
    Entry {
        ty: Some("string (secret)"),
        ..e("server.admin_token", "Bearer token of the admin endpoints (`Authorization: Bearer <token>`); empty: admin endpoints disabled. Never printed: check-config and logs show `<redacted>`.")
    },
    e("server.shutdown_drain_ms", "On SIGTERM/SIGINT, how long queued backups may take to land once the last request finished; what is still queued then is dropped and logged with its count."),
    r("server.reset_idle_wait_ms", "How long `POST /admin/reset_local` waits for storage to become idle (the backups in flight landed); past it the reset is refused on every rank with an error naming the queued candidates and outstanding operations, and nothing is reset (a store that keeps rejecting PUTs for capacity never becomes idle).", "greater than 0", "0"),
    e("server.not_ready_on_storage_outage", "`/health/ready` answers 503 while L3 cools down or probes after an outage (default: ready but `degraded`, since requests still complete by recomputation)."),
    // [host_cache]
    e("host_cache.size_bytes", "Host (L2) cache size in bytes; 0: `ratio` x the Device blocks."),
    Entry {
        with: &[("host_cache.size_bytes", "0")],
        ..r("host_cache.ratio", "Host (L2) blocks = ratio x `model.device_blocks` when `size_bytes` is 0.", "a positive number when `size_bytes` is 0", "0")
    },
    // [storage]
    Entry {
        ty: Some("string: none | memory | local | mooncake"),
        ..r("storage.backend", "The L3 backend (flag `--store`): none (storage disabled), memory (in-process, this host only), local (the embedded local store), mooncake (Mooncake Store).", "one of none, memory, local, mooncake", "bogus")
    },
    // [storage.contract]
    r("storage.contract.operation_credits", "Outstanding storage operations the scheduler may hold (reads may use all; backups at most half, rounded down).", "1 to 1000000, and at most `storage.runtime.outstanding_limit`", "0"),
    r("storage.contract.max_host_blocks", "Host credits: logical block references across all groups and outstanding storage operations (not a byte budget).", "greater than 0", "0"),
    r("storage.contract.max_keys_per_operation", "Most keys one storage operation may carry.", "greater than 0 and at most `max_host_blocks`", "9000"),
    e("storage.contract.lookahead_tokens", "Most tokens a read may extend beyond the local hit."),
    r("storage.contract.negative_metadata_capacity", "Capacity of the bounded FIFO of confirmed missing or invalid objects.", "greater than 0", "0"),
    r("storage.contract.backup_bytes_in_flight", "Payload bytes of backup PUTs outstanding at once: a new backup PUT is admitted only while less is outstanding, and one PUT takes keys until it carries a quarter of it (at least one key), so a write path slower than the backups queues candidates instead of aging the executor's queue into the pressure gate.", "greater than 0", "0"),
    r("storage.contract.backup_candidate_capacity", "Capacity of the bounded, nonowning backup candidate queue (a 16k-token llama-8b-like prompt has 1024 blocks).", "greater than 0", "0"),
    r("storage.contract.soft_deadline_ms", "Soft deadline of a read, from QUERY issue, including queue wait: past it the request recomputes (`deadline`).", "greater than 0", "0"),
    r("storage.contract.ready_hold_ms", "How long a Ready hold protects newly read blocks before expiring.", "greater than 0", "0"),
    e("storage.contract.min_extension_tokens", "An extension below this many tokens bypasses L3."),
    r("storage.contract.pressure_high.queued_jobs", "Queued L3 jobs at which the gate closes.", "greater than 0", "0"),
    r("storage.contract.pressure_high.queued_bytes", "Queued payload bytes at which the gate closes.", "greater than 0", "0"),
    r("storage.contract.pressure_high.oldest_age_ms", "Age of the oldest queued job at which the gate closes.", "greater than 0", "0"),
    r("storage.contract.pressure_low.queued_jobs", "Queued jobs below which the gate may reopen.", "below `pressure_high.queued_jobs`", "600"),
    r("storage.contract.pressure_low.queued_bytes", "Queued payload bytes below which the gate may reopen.", "below `pressure_high.queued_bytes`", "8589934592"),
    r("storage.contract.pressure_low.oldest_age_ms", "Oldest-job age below which the gate may reopen.", "below `pressure_high.oldest_age_ms`", "9000"),
    // [storage.runtime]
    r("storage.runtime.query_workers", "QUERY worker threads of the L3 executor.", "1 to 256", "0"),
    r("storage.runtime.get_workers", "GET worker threads.", "1 to 256", "257"),
    r("storage.runtime.put_workers", "PUT worker threads.", "1 to 256", "0"),
    r("storage.runtime.query_queue_capacity", "Queued QUERY jobs at most.", "greater than 0 and at most `outstanding_limit`", "0"),
    r("storage.runtime.get_queue_capacity", "Queued GET jobs at most.", "greater than 0 and at most `outstanding_limit`", "1000"),
    r("storage.runtime.put_queue_capacity", "Queued PUT jobs at most.", "greater than 0 and at most `outstanding_limit`", "0"),
    Entry {
        with: &[
            ("storage.runtime.query_queue_capacity", "16"),
            ("storage.runtime.get_queue_capacity", "16"),
            ("storage.runtime.put_queue_capacity", "16"),
        ],
        ..r("storage.runtime.outstanding_limit", "Queued jobs + native work + undelivered results, all kinds together.", "at least `storage.contract.operation_credits`, so that no credited operation is rejected", "32")
    },
    r("storage.runtime.health_cooldown_ms", "After an outage, work is rejected for this long, then one probe is allowed.", "greater than 0", "0"),
    r("storage.runtime.close_deadline_ms", "`close()` joins the workers for at most this long.", "greater than 0", "0"),
    // [storage.local]
    r("storage.local.dir", "Root of the shared-DFS tier: a local directory, or an NFS/CephFS/3FS mount shared by the hosts (flag `--store-dir`; relative to the working directory: use an absolute path for a service).", "not empty", ""),
    r("storage.local.memory_bytes", "Bytes the in-process MEMORY tier may hold: its replicas plus the spare buffers of replicas that left, kept for the next target of their size (a refill then writes memory already touched; spares go first when a reservation needs the room).", "greater than 0", "0"),
    r("storage.local.promotion_workers", "DFS -> MEMORY promotion workers.", "greater than 0", "0"),
    e("storage.local.promote_after_get", "Promote what a GET read from DFS into the MEMORY tier after the GET settled (detached, on the promotion workers at background priority; the tiered store always promotes into Mooncake). Off by default: the GET already put the bytes in Host, and on a machine with few cores the promotion's second read and fresh allocations slow the restore it follows (`bench ttft --lengths 16384 --cohorts l3-dfs-warm`, 2026-12-02, three runs each way: p50 971, 1081, 1183 ms off; 1158, 1308, 1362 ms on)."),
    r("storage.local.staging_bytes", "Bytes promotions may stage at once.", "greater than 0", "0"),
    r("storage.local.max_promotions_in_flight", "Outstanding promotion tasks at most.", "greater than 0", "0"),
    r("storage.local.dfs_io_concurrency", "Concurrent DFS file operations.", "greater than 0", "0"),
    // [storage.mooncake]
    e("storage.mooncake.library_path", "Path of libmooncake_store.so; empty: the `MOONCAKE_STORE_LIBRARY` environment variable."),
    Entry {
        with: MOONCAKE,
        ..r("storage.mooncake.local_hostname", "This host's address as Mooncake peers reach it.", "not empty (checked when `storage.backend = \"mooncake\"`)", "")
    },
    Entry {
        with: MOONCAKE,
        ..r("storage.mooncake.metadata_server", "`P2PHANDSHAKE` or an HTTP metadata URL (`MOONCAKE_METADATA_SERVER`).", "not empty (with mooncake)", "")
    },
    Entry {
        with: MOONCAKE,
        ..r("storage.mooncake.master_server_addr", "The Mooncake master, host:port (`MOONCAKE_MASTER`).", "host:port (with mooncake)", "nowhere")
    },
    Entry {
        ty: Some("string: tcp | rdma"),
        with: MOONCAKE,
        ..r("storage.mooncake.protocol", "Transfer protocol.", "tcp or rdma (with mooncake)", "udp")
    },
    e("storage.mooncake.device_name", "RDMA device name(s) for `protocol = \"rdma\"`; empty: none."),
    e("storage.mooncake.global_segment_size", "Bytes of storage this rank mounts into the Mooncake cluster; 0: a pure client that mounts none."),
    e("storage.mooncake.local_buffer_size", "Bytes of this rank's local transfer buffer."),
    Entry {
        with: MOONCAKE,
        ..r("storage.mooncake.tenant_id", "Tenant of this deployment's objects.", "not empty (with mooncake)", "")
    },
    e("storage.mooncake.dfs_dir", "Non-empty: the tiered store, Mooncake as the MEMORY tier over this shared-DFS root (promotion limits from `[storage.local]`); empty: Mooncake only."),
    // [tp]
    r("tp.rank", "This process's TP rank (flag `--rank`).", "below `tp.world`", "1"),
    r("tp.world", "Ranks in the replica (flag `--world`; `launch --tp N`).", "1 to 64, dividing the model profile's KV heads (`tiny`: 1 or 2; `llama-8b-like`: 1, 2, 4 or 8)", "3"),
    Entry {
        with: MESH,
        ..r("tp.peers", "Mesh address host:port of every rank, in rank order (flag `--peers a:p,b:q`; `TSL3_TP__PEERS` is comma-separated).", "when `tp.world` > 1: one host:port per rank", "127.0.0.1:7001")
    },
    Entry {
        ty: Some("string (secret)"),
        with: &[("tp.world", "2"), ("tp.peers", "127.0.0.1:7001,127.0.0.1:7002")],
        ..r("tp.secret", "Shared secret authenticating the rank mesh (`launch` generates one). Never printed: check-config and logs show `<redacted>`.", "set when `tp.world` > 1 (here, or through `tp.secret_file`)", "")
    },
    Entry {
        ..r("tp.secret_file", "A file whose first line is the mesh secret, instead of `tp.secret` (not both).", "a readable file whose first line is not empty", "/nonexistent/tsl3-secret")
    },
    r("tp.connect_deadline_ms", "A rank whose mesh has not formed within this long exits non-zero, naming the ranks that did not join.", "greater than 0", "0"),
    r("tp.round_deadline_ms", "A round not agreed within this long, or a device fence not completed within this long, fails the replica (every request gets a JSON 503, the ranks exit).", "at least 1250 (a quiet leader rounds every 500 ms)", "0"),
    // [telemetry]
    e("telemetry.otlp_endpoint", "OTLP endpoint of the span export; empty: `OTEL_EXPORTER_OTLP_ENDPOINT`, else tracing export off."),
    Entry {
        ty: Some("string: grpc | http"),
        ..r("telemetry.otlp_protocol", "OTLP over gRPC, or HTTP/protobuf.", "grpc or http", "udp")
    },
    e("telemetry.metrics_labels_model", "The `model` label of every series."),
    r("telemetry.role", "The `role` label of every series.", "not empty", ""),
    e("telemetry.dp_rank", "The `dp_rank` label of every series (the replica's data-parallel rank)."),
    e("telemetry.replica", "The `replica` label of every series; empty: derived at startup, alike on every rank of a replica and apart between replicas (`HOST:PORT`, PORT the replica's /metrics base port, HOST the leader's mesh host or this machine's name)."),
];

/// `a.b_c` -> `TSL3_A__B_C`.
pub fn env_name(key: &str) -> String {
    format!("TSL3_{}", key.replace('.', "__").to_uppercase())
}

/// Every leaf key of the defaults with its value, in the order the types serialize them.
pub fn default_keys() -> Vec<(String, toml::Value)> {
    let s = settings::load(None, &HashMap::new(), &Overrides::default())
        .expect("config/default.toml loads");
    let v = toml::Value::try_from(&s).expect("settings serialize");
    let mut out = vec![];
    fn walk(prefix: &str, v: &toml::Value, out: &mut Vec<(String, toml::Value)>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => out.push((prefix.to_string(), other.clone())),
        }
    }
    walk("", &v, &mut out);
    out
}

/// Loads the defaults with `key = value` (and `with`) set through the environment: the
/// one-line error, or None when the loader accepts them.
pub fn try_value(key: &str, value: &str, with: &[(&str, &str)]) -> Option<String> {
    let mut env: HashMap<String, String> = with
        .iter()
        .map(|(k, v)| (env_name(k), v.to_string()))
        .collect();
    env.insert(env_name(key), value.to_string());
    settings::load(None, &env, &Overrides::default()).err()
}

fn type_of(entry: &Entry, default: &toml::Value) -> String {
    if let Some(t) = entry.ty {
        return t.to_string();
    }
    let refused =
        |v: &str| try_value(entry.key, v, entry.with).is_some_and(|e| e.contains("invalid type"));
    match default {
        toml::Value::Integer(_) if refused("4294967296") => "u32".into(),
        toml::Value::Integer(_) if refused("-1") => "u64".into(),
        toml::Value::Integer(_) => "i64".into(),
        toml::Value::Float(_) => "float".into(),
        toml::Value::Boolean(_) => "bool".into(),
        toml::Value::Array(_) => "list of strings".into(),
        _ => "string".into(),
    }
}

fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) if s.is_empty() => "`\"\"`".into(),
        other => format!("`{other}`"),
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The settings part of docs/settings.md; `bench` is (name, `--help` text) of every bench.
pub fn render(bench: &[(String, String)]) -> String {
    let defaults: HashMap<String, toml::Value> = default_keys().into_iter().collect();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# Settings reference\n\n\
         Generated by `engine-host settings-doc > docs/settings.md` (src/settings_doc.rs) from \
         the settings types and config/default.toml; the test command fails when this file is \
         not current. Every key, its type, its default, what it means and the rule a value \
         must meet; each rule with the one-line error the loader gives for a value that \
         breaks it.\n\n\
         Layers, each over the one before: config/default.toml (compiled in), `--config FILE` \
         (TOML, the same sections), the environment (`TSL3_` + the key in capitals with `__` \
         between levels: `storage.contract.operation_credits` is \
         `TSL3_STORAGE__CONTRACT__OPERATION_CREDITS`; every `TSL3_*` variable with a `__` must \
         be a setting), then the flags of `serve`/`launch`. `engine-host check-config FILE` \
         and `engine-host serve ... --check-config` print the resolved settings (secrets as \
         `<redacted>`). Logging is not a setting: `RUST_LOG` (e.g. `RUST_LOG=debug`, \
         `RUST_LOG=actors=debug,info`; default `{}`) filters what goes to stderr.\n",
        crate::telemetry::DEFAULT_LOG_FILTER
    );
    for (section, intro) in SECTIONS {
        let _ = writeln!(o, "## [{section}]\n\n{intro}\n");
        let _ = writeln!(
            o,
            "| key, environment | type | default | meaning | rule |\n|---|---|---|---|---|"
        );
        let mut examples = vec![];
        for entry in ENTRIES
            .iter()
            .filter(|e| e.key.rsplit_once('.').is_some_and(|(s, _)| s == *section))
        {
            let default = &defaults[entry.key];
            let name = entry
                .key
                .rsplit_once('.')
                .map(|(_, k)| k)
                .unwrap_or(entry.key);
            let rule = if entry.rule.is_empty() {
                "any value of the type"
            } else {
                entry.rule
            };
            let _ = writeln!(
                o,
                "| `{name}`<br>`{}` | {} | {} | {} | {} |",
                env_name(entry.key),
                cell(&type_of(entry, default)),
                cell(&shown(default)),
                cell(entry.doc),
                cell(rule)
            );
            if let Some(bad) = entry.bad {
                let err = try_value(entry.key, bad, entry.with).unwrap_or_default();
                let with: Vec<String> = entry
                    .with
                    .iter()
                    .map(|(k, v)| format!("{}={v:?}", env_name(k)))
                    .collect();
                examples.push(format!(
                    "{}{}={bad:?} -> error: {err}",
                    if with.is_empty() {
                        String::new()
                    } else {
                        format!("{} ", with.join(" "))
                    },
                    env_name(entry.key)
                ));
            }
        }
        if !examples.is_empty() {
            let _ = writeln!(o, "\nWhat the rules say to a bad value:\n\n```");
            for x in examples {
                let _ = writeln!(o, "{x}");
            }
            let _ = writeln!(o, "```");
        }
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "## Benchmarks\n\n\
         `engine-host bench NAME [OPTIONS]`: every option of every benchmark, as its `--help` \
         prints it. The benchmarks read no settings file except `bench mooncake --config` \
         (its `[storage.mooncake]` section); the end-to-end ones (`ttft`, `replay`) start \
         engine-host processes with the settings they need.\n"
    );
    for (name, help) in bench {
        let help: Vec<&str> = help.trim_end().lines().map(str::trim_end).collect();
        let _ = writeln!(o, "### bench {name}\n\n```\n{}\n```\n", help.join("\n"));
    }
    let o = o.trim_end().to_string();
    o + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_round_deadline_rule_names_the_current_minimum_and_quiet_tick() {
        let entry = ENTRIES
            .iter()
            .find(|e| e.key == "tp.round_deadline_ms")
            .unwrap();
        let min = crate::settings::MIN_ROUND_DEADLINE_MS;
        let tick = actors::engine::event_loop::QUIET_TICK.as_millis();
        assert!(
            entry.rule.contains(&format!("at least {min} ")),
            "{}",
            entry.rule
        );
        assert!(
            entry.rule.contains(&format!("every {tick} ms")),
            "{}",
            entry.rule
        );
    }

    #[test]
    fn every_setting_has_exactly_one_entry_in_a_listed_section() {
        let keys: Vec<String> = default_keys().into_iter().map(|(k, _)| k).collect();
        let entries: Vec<&str> = ENTRIES.iter().map(|e| e.key).collect();
        for k in &keys {
            assert_eq!(
                entries.iter().filter(|e| **e == k.as_str()).count(),
                1,
                "settings key {k} needs exactly one entry in src/settings_doc.rs ENTRIES"
            );
        }
        for e in &entries {
            assert!(keys.iter().any(|k| k == e), "ENTRIES names no setting: {e}");
            let (section, _) = e.rsplit_once('.').unwrap();
            assert!(
                SECTIONS.iter().any(|(s, _)| *s == section),
                "{e}: section [{section}] missing from SECTIONS"
            );
        }
        // default.toml, the file a newcomer reads, has every key too.
        let file: toml::Table = toml::from_str(settings::DEFAULT_TOML).unwrap();
        for k in &keys {
            let mut v = toml::Value::Table(file.clone());
            for part in k.split('.') {
                v = v
                    .get(part)
                    .unwrap_or_else(|| panic!("config/default.toml lacks {k}"))
                    .clone();
            }
        }
    }

    #[test]
    fn every_example_breaks_its_rule_and_the_error_names_the_field() {
        for e in ENTRIES {
            assert_eq!(
                e.rule.is_empty(),
                e.bad.is_none(),
                "{}: a rule needs an example value that breaks it (and only a rule)",
                e.key
            );
            if let Some(bad) = e.bad {
                let err = try_value(e.key, bad, e.with)
                    .unwrap_or_else(|| panic!("{} = {bad:?} was accepted", e.key));
                assert!(
                    err.starts_with(&format!("invalid setting {}:", e.key)),
                    "{} = {bad:?}: {err}",
                    e.key
                );
                assert!(!err.contains('\n'), "{err}");
            }
        }
    }

    #[test]
    fn integer_types_come_from_the_loader() {
        let d = default_keys().into_iter().collect::<HashMap<_, _>>();
        let t = |k: &str| type_of(ENTRIES.iter().find(|e| e.key == k).unwrap(), &d[k]);
        assert_eq!(t("model.device_blocks"), "u32");
        assert_eq!(t("server.shutdown_drain_ms"), "u64");
        assert_eq!(t("model.draft_weight_version"), "i64");
        assert_eq!(t("host_cache.ratio"), "float");
        assert_eq!(t("tp.peers"), "list of strings");
    }
}
