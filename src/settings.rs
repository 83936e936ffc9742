//! Settings loading: config/default.toml (compiled in), then an optional file, then
//! `TSL3_*` environment variables (`TSL3_STORAGE__BACKEND=memory`: "__" separates levels),
//! then command-line flags. Every failure is one line naming the field and the rule. This
//! module never starts anything; the startup factory consumes the validated `Settings`.

use anyhow::Result;
use config::{Config, Environment, File, FileFormat};
use messages::settings::{
    LocalStoreSettings, MooncakeStoreSettings, SettingsError, StorageConfig, StorageRuntimeConfig,
    StoreKind,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;

/// The compiled-in defaults (the same file a newcomer reads).
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// The model profiles the synthetic backend ships.
pub const MODEL_PROFILES: &[&str] = &actors::model::ModelProfile::NAMES;

/// The help of every flag naming a model profile (`--model-profile`, a bench's
/// `--profile`): every profile the synthetic backend ships.
pub fn profile_help() -> String {
    format!("Synthetic model profile: {}", MODEL_PROFILES.join(" | "))
}

/// A secret setting: deserialized as a plain string, but never shown — `Debug` and
/// `Serialize` (what `check-config` prints) render `<redacted>` unless it is empty.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub const REDACTED: &'static str = "<redacted>";
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The secret itself, for the one place that uses it.
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn shown(&self) -> &str {
        if self.0.is_empty() {
            ""
        } else {
            Self::REDACTED
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.shown())
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.shown())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    pub profile: String,
    /// A Hugging Face model directory served by the transformer backend; empty: `profile`.
    pub dir: String,
    /// Tokens per KV block of a model directory's cache geometry.
    pub block_tokens: u32,
    pub checkpoint: String,
    pub weight_version: u64,
    /// -1: no draft model.
    pub draft_weight_version: i64,
    /// Device (L1) blocks per cache group on each rank.
    pub device_blocks: u32,
    /// Requests admitted to the forward at once.
    pub max_running: u32,
    /// Capacity of the local TailTable of tail hints; 0 turns tails off.
    pub tail_hints: u32,
    /// Sleep the profile's cost-model device time per forward (emulated device).
    pub emulate_device_time: bool,
    /// auto | emulated | cuda.
    pub device: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// The leader's HTTP API (with /metrics and /health).
    pub listen: String,
    /// Where rank r serves /metrics and /health: this address's port + r (empty: listen's
    /// port + r, so the leader's are on its API address). Followers serve no API.
    pub metrics_listen: String,
    /// Bearer token of the admin endpoints (empty: admin disabled). Never printed.
    pub admin_token: Secret,
    /// On SIGTERM/SIGINT, how long queued backups may take to land once the last request
    /// finished; what is still queued then is dropped and reported.
    pub shutdown_drain_ms: u64,
    /// How long `POST /admin/reset_local` waits for storage to become idle (its backups
    /// landed) before it is refused with an error naming what is still pending.
    pub reset_idle_wait_ms: u64,
    /// `/health/ready` answers 503 while L3 storage cools down after an outage (default:
    /// ready but `degraded`, since requests still complete by recomputation).
    pub not_ready_on_storage_outage: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostCacheSettings {
    pub size_bytes: u64,
    pub ratio: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    pub backend: StoreKind,
    pub contract: StorageConfig,
    pub runtime: StorageRuntimeConfig,
    pub local: LocalStoreSettings,
    pub mooncake: MooncakeStoreSettings,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpSettings {
    pub rank: u32,
    pub world: u32,
    pub peers: Vec<String>,
    /// Shared secret of the rank mesh. Never printed.
    pub secret: Secret,
    /// A file holding the mesh secret (its first line), instead of `secret`.
    pub secret_file: String,
    pub connect_deadline_ms: u64,
    pub round_deadline_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    pub otlp_endpoint: String,
    pub otlp_protocol: String,
    pub metrics_labels_model: String,
    pub role: String,
    pub dp_rank: u32,
    /// The `replica` label of every series (empty: derived at startup, see
    /// `Settings::replica_label`).
    pub replica: String,
}

/// The shortest round deadline: a quiet leader rounds every `QUIET_TICK` and the other ranks
/// wait for its report within the round, so a deadline needs room for two and a half ticks.
pub const MIN_ROUND_DEADLINE_MS: u64 =
    actors::engine::event_loop::QUIET_TICK.as_millis() as u64 * 5 / 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub model: ModelSettings,
    pub server: ServerSettings,
    pub host_cache: HostCacheSettings,
    pub storage: StorageSettings,
    pub tp: TpSettings,
    pub telemetry: TelemetrySettings,
}

fn bad(field: &str, rule: impl Into<String>) -> SettingsError {
    SettingsError {
        field: field.into(),
        rule: rule.into(),
    }
}

impl Settings {
    /// Every rule of every section; the first violation, as one line.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if !MODEL_PROFILES.contains(&self.model.profile.as_str()) {
            return Err(bad(
                "model.profile",
                format!("must be one of {}", MODEL_PROFILES.join(", ")),
            ));
        }
        if !self.model.dir.is_empty() {
            if !std::path::Path::new(&self.model.dir)
                .join("config.json")
                .is_file()
            {
                return Err(bad(
                    "model.dir",
                    format!(
                        "must be a model directory holding config.json (none in {})",
                        self.model.dir
                    ),
                ));
            }
            if self.tp.world != 1 {
                return Err(bad(
                    "model.dir",
                    format!(
                        "the transformer backend serves a model directory on one rank; tp.world is {}",
                        self.tp.world
                    ),
                ));
            }
        }
        if self.model.block_tokens == 0 {
            return Err(bad("model.block_tokens", "must be greater than 0"));
        }
        if self.model.draft_weight_version < -1 {
            return Err(bad(
                "model.draft_weight_version",
                "must be -1 (no draft) or a version >= 0",
            ));
        }
        if self.model.device_blocks == 0 {
            return Err(bad("model.device_blocks", "must be greater than 0"));
        }
        if self.model.max_running == 0 {
            return Err(bad("model.max_running", "must be greater than 0"));
        }
        if self.model.tail_hints > 1_000_000 {
            return Err(bad("model.tail_hints", "must be at most 1000000"));
        }
        if !matches!(self.model.device.as_str(), "auto" | "emulated" | "cuda") {
            return Err(bad("model.device", "must be auto, emulated or cuda"));
        }
        if self.server.reset_idle_wait_ms == 0 {
            return Err(bad("server.reset_idle_wait_ms", "must be greater than 0"));
        }
        if self.server.listen.parse::<SocketAddr>().is_err() {
            return Err(bad(
                "server.listen",
                "must be an address such as 127.0.0.1:8000",
            ));
        }
        if !self.server.metrics_listen.is_empty()
            && self.server.metrics_listen.parse::<SocketAddr>().is_err()
        {
            return Err(bad(
                "server.metrics_listen",
                "must be empty or an address such as 127.0.0.1:9100",
            ));
        }
        self.metrics_address_of(self.tp.rank)?;
        if self.host_cache.size_bytes == 0
            && (!self.host_cache.ratio.is_finite() || self.host_cache.ratio <= 0.0)
        {
            return Err(bad(
                "host_cache.ratio",
                "must be a positive number when host_cache.size_bytes is 0",
            ));
        }
        self.storage.contract.validate("storage.contract")?;
        self.storage
            .runtime
            .validate("storage.runtime", &self.storage.contract)?;
        if self.storage.backend == StoreKind::Local {
            self.storage.local.validate("storage.local")?;
        }
        if self.storage.backend == StoreKind::Mooncake {
            self.storage.mooncake.validate("storage.mooncake")?;
        }
        let tp = &self.tp;
        if tp.world == 0 {
            return Err(bad("tp.world", "must be greater than 0"));
        }
        if tp.world > 64 {
            return Err(bad("tp.world", "must be at most 64"));
        }
        if let Ok(profile) = actors::model::ModelProfile::by_name(&self.model.profile) {
            let sizes = profile.tp_sizes(64);
            if !sizes.contains(&tp.world) {
                let mut heads: Vec<u32> = profile.groups.iter().map(|g| g.kv_heads).collect();
                heads.dedup();
                let heads: Vec<String> = heads.iter().map(|h| h.to_string()).collect();
                let sizes: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
                return Err(bad(
                    "tp.world",
                    format!(
                        "model profile {} has {} KV heads, which {} ranks cannot split evenly; the TP sizes (--tp) that work for it are {}",
                        self.model.profile,
                        heads.join("/"),
                        tp.world,
                        sizes.join(", ")
                    ),
                ));
            }
        }
        if tp.rank >= tp.world {
            return Err(bad(
                "tp.rank",
                format!("must be below tp.world ({})", tp.world),
            ));
        }
        if tp.world > 1 {
            if tp.peers.len() != tp.world as usize {
                return Err(bad(
                    "tp.peers",
                    format!(
                        "must list one host:port per rank ({} given, world {})",
                        tp.peers.len(),
                        tp.world
                    ),
                ));
            }
            if let Some(p) = tp.peers.iter().find(|p| p.rsplit_once(':').is_none()) {
                return Err(bad("tp.peers", format!("{p:?} is not host:port")));
            }
            if tp.secret.is_empty() {
                return Err(bad(
                    "tp.secret",
                    "must be set when tp.world > 1 (mesh authentication)",
                ));
            }
        }
        if tp.connect_deadline_ms == 0 {
            return Err(bad("tp.connect_deadline_ms", "must be greater than 0"));
        }
        if tp.round_deadline_ms < MIN_ROUND_DEADLINE_MS {
            return Err(bad(
                "tp.round_deadline_ms",
                format!(
                    "must be at least {MIN_ROUND_DEADLINE_MS} (a quiet leader rounds every {} ms, and the other ranks wait for it within the round)",
                    actors::engine::event_loop::QUIET_TICK.as_millis()
                ),
            ));
        }
        if !matches!(self.telemetry.otlp_protocol.as_str(), "grpc" | "http") {
            return Err(bad("telemetry.otlp_protocol", "must be grpc or http"));
        }
        if self.telemetry.role.is_empty() {
            return Err(bad("telemetry.role", "must not be empty"));
        }
        Ok(())
    }
}

impl Settings {
    /// Where rank `rank` of this replica serves /metrics and /health: the port of
    /// `server.metrics_listen` (or `server.listen`) + `rank`.
    pub fn metrics_address_of(&self, rank: u32) -> Result<SocketAddr, SettingsError> {
        let field = if self.server.metrics_listen.is_empty() {
            "server.listen"
        } else {
            "server.metrics_listen"
        };
        let text = if self.server.metrics_listen.is_empty() {
            &self.server.listen
        } else {
            &self.server.metrics_listen
        };
        let mut a: SocketAddr = text
            .parse()
            .map_err(|_| bad(field, "must be an address such as 127.0.0.1:8000"))?;
        let port = u16::try_from(a.port() as u32 + rank).map_err(|_| {
            bad(
                field,
                format!("port {} + rank {rank} is beyond 65535", a.port()),
            )
        })?;
        a.set_port(port);
        Ok(a)
    }

    /// This rank's /metrics and /health address when it is not the API address (None:
    /// the leader serves them beside its API).
    pub fn metrics_listener(&self) -> Result<Option<SocketAddr>, SettingsError> {
        let a = self.metrics_address_of(self.tp.rank)?;
        let api = self.server.listen.parse::<SocketAddr>().ok();
        Ok((self.tp.rank != 0 || api != Some(a)).then_some(a))
    }
}

/// This machine's host name ("localhost" where it cannot be read).
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname(2) writes at most buf.len() bytes into a buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(h) if rc == 0 && !h.is_empty() => h.to_string(),
        _ => "localhost".to_string(),
    }
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost"
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Settings {
    /// The `replica` label: `telemetry.replica`, or derived alike on every rank of a
    /// replica and apart between replicas: `HOST:PORT`, PORT the replica's /metrics base
    /// port (rank 0's: its API port unless `server.metrics_listen` is set) and HOST the
    /// leader's mesh host (`tp.peers[0]`), or this machine's host name for a single rank
    /// or a mesh on loopback (`launch`).
    pub fn replica_label(&self) -> String {
        if !self.telemetry.replica.is_empty() {
            return self.telemetry.replica.clone();
        }
        let port = self.metrics_address_of(0).map(|a| a.port()).unwrap_or(0);
        let host = self
            .tp
            .peers
            .first()
            .filter(|_| self.tp.world > 1)
            .and_then(|p| p.rsplit_once(':').map(|(h, _)| h.to_string()))
            .filter(|h| !is_loopback(h))
            .unwrap_or_else(hostname);
        format!("{host}:{port}")
    }
}

/// Flags that override settings (the last layer).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub store: Option<String>,
    pub store_dir: Option<String>,
    pub model_profile: Option<String>,
    pub model_dir: Option<String>,
    pub rank: Option<u32>,
    pub world: Option<u32>,
    pub peers: Option<Vec<String>>,
}

/// `TSL3_A__B=v` -> `a.b = v`. Only variables with a "__" level separator are settings,
/// so unrelated `TSL3_*` variables never fail startup.
fn env_source(vars: &HashMap<String, String>) -> HashMap<String, String> {
    vars.iter()
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix("TSL3_")?;
            rest.contains("__")
                .then(|| (format!("tsl3_{rest}"), v.clone()))
        })
        .collect()
}

/// Loads and validates settings from the layers. `env` is the process environment (a
/// parameter so tests need not mutate the real one).
pub fn load(
    file: Option<&str>,
    env: &HashMap<String, String>,
    overrides: &Overrides,
) -> Result<Settings, String> {
    let one_line = |e: String| e.replace('\n', " ");
    let mut b = Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
    if let Some(f) = file {
        let text = read_settings_file(f)?;
        b = b.add_source(File::from_str(&text, FileFormat::Toml));
    }
    check_env_names(env)?;
    if let Some(layer) = mooncake_env_layer(env) {
        b = b.add_source(File::from_str(&layer, FileFormat::Toml));
    }
    b = b.add_source(
        Environment::with_prefix("tsl3")
            .separator("__")
            .prefix_separator("_")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("tp.peers")
            .source(Some(env_source(env))),
    );
    let set =
        |b: config::ConfigBuilder<config::builder::DefaultState>, k: &str, v: config::Value| {
            b.set_override(k, v).map_err(|e| one_line(e.to_string()))
        };
    if let Some(v) = &overrides.listen {
        b = set(b, "server.listen", v.clone().into())?;
    }
    if let Some(v) = &overrides.metrics_listen {
        b = set(b, "server.metrics_listen", v.clone().into())?;
    }
    if let Some(v) = &overrides.store {
        b = set(b, "storage.backend", v.clone().into())?;
    }
    if let Some(v) = &overrides.store_dir {
        b = set(b, "storage.local.dir", v.clone().into())?;
    }
    if let Some(v) = &overrides.model_profile {
        b = set(b, "model.profile", v.clone().into())?;
    }
    if let Some(v) = &overrides.model_dir {
        b = set(b, "model.dir", v.clone().into())?;
    }
    if let Some(v) = overrides.rank {
        b = set(b, "tp.rank", (v as u64).into())?;
    }
    if let Some(v) = overrides.world {
        b = set(b, "tp.world", (v as u64).into())?;
    }
    if let Some(v) = &overrides.peers {
        b = set(b, "tp.peers", v.clone().into())?;
    }
    let cfg = b.build().map_err(|e| one_line(config_error(&e)))?;
    let mut s: Settings = cfg
        .try_deserialize()
        .map_err(|e| one_line(config_error(&e)))?;
    resolve_secret_file(&mut s.tp)?;
    s.validate().map_err(|e| e.to_string())?;
    Ok(s)
}

/// `tp.secret_file`: the mesh secret is the file's first line (trailing whitespace cut).
fn resolve_secret_file(tp: &mut TpSettings) -> Result<(), String> {
    if tp.secret_file.is_empty() {
        return Ok(());
    }
    if !tp.secret.is_empty() {
        return Err(
            "invalid setting tp.secret_file: set tp.secret or tp.secret_file, not both".into(),
        );
    }
    let text = std::fs::read_to_string(&tp.secret_file).map_err(|e| {
        format!(
            "invalid setting tp.secret_file: {} cannot be read: {e}",
            tp.secret_file
        )
    })?;
    let secret = text.lines().next().unwrap_or("").trim_end();
    if secret.is_empty() {
        return Err(format!(
            "invalid setting tp.secret_file: {} holds no secret (its first line is empty)",
            tp.secret_file
        ));
    }
    tp.secret = Secret::new(secret);
    Ok(())
}

/// A settings file's text, or one line saying why it cannot be used: absent, a directory,
/// unreadable, or TOML that does not parse (naming the field of the offending line).
fn read_settings_file(f: &str) -> Result<String, String> {
    let path = std::path::Path::new(f);
    if path.is_dir() {
        return Err(format!("settings file {f} is a directory, not a file"));
    }
    if !path.exists() {
        return Err(format!("settings file {f} does not exist"));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("settings file {f} cannot be read: {e}"))?;
    if let Err(e) = toml::from_str::<toml::Table>(&text) {
        let at = e.span().map(|r| r.start).unwrap_or(0).min(text.len());
        let line_no = text[..at].matches('\n').count() + 1;
        let field = field_at(&text, line_no);
        let msg = e.message().replace('\n', " ");
        return Err(match field {
            Some(field) => {
                format!("invalid setting {field}: {msg} (settings file {f}, line {line_no})")
            }
            None => format!("invalid settings file {f}, line {line_no}: {msg}"),
        });
    }
    Ok(text)
}

/// The dotted name of the key set on 1-based line `line_no` of a TOML text (its table
/// header is the last `[...]` line above it).
fn field_at(text: &str, line_no: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let line = lines.get(line_no.checked_sub(1)?)?;
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let table = lines[..line_no - 1]
        .iter()
        .rev()
        .map(|l| l.trim())
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(['[', ']']).trim().to_string());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

/// The variables deploy/mooncake/env.sh exports, as a settings layer above the file and
/// below `TSL3_*`: `MOONCAKE_MASTER` → `storage.mooncake.master_server_addr`,
/// `MOONCAKE_METADATA_SERVER` → `storage.mooncake.metadata_server`.
fn mooncake_env_layer(env: &HashMap<String, String>) -> Option<String> {
    use actors::names::env::{MOONCAKE_MASTER, MOONCAKE_METADATA_SERVER};
    let mut mooncake = toml::Table::new();
    for (var, key) in [
        (MOONCAKE_MASTER, "master_server_addr"),
        (MOONCAKE_METADATA_SERVER, "metadata_server"),
    ] {
        if let Some(v) = env.get(var).filter(|v| !v.is_empty()) {
            mooncake.insert(key.into(), toml::Value::String(v.clone()));
        }
    }
    if mooncake.is_empty() {
        return None;
    }
    let mut storage = toml::Table::new();
    storage.insert("mooncake".into(), toml::Value::Table(mooncake));
    let mut root = toml::Table::new();
    root.insert("storage".into(), toml::Value::Table(storage));
    toml::to_string(&root).ok()
}

/// `TSL3_*` variables this process reads that are not settings (test harness roles and
/// the mesh secret of the control-plane test); every other `TSL3_*` variable must be a
/// setting (`TSL3_<SECTION>__<KEY>`).
const PROCESS_VARIABLES: &[&str] = &[
    actors::names::env::MESH_SECRET,
    actors::names::env::CONTROL_PLANE_TEST_CHILD,
    actors::names::env::DFS_TEST_CHILD,
    actors::names::env::DFS_TEST_DIR,
    actors::names::env::FLAT_KV_TEST_CHILD,
    actors::names::env::FLAT_KV_TEST_STORE,
    actors::names::env::FLAT_KV_TEST_NAMESPACE,
    actors::names::env::REQUIRE_MOUNT,
    actors::names::env::MOONCAKE_LIVE_WRITER,
    actors::names::env::FUZZ_ITERATIONS,
];

/// Rejects a `TSL3_*` variable that is neither a setting nor a known process variable: a
/// misspelt override (`TSL3_MODEL=5`, `TSL3_MODEL_PROFILE=x`) never passes silently.
fn check_env_names(env: &HashMap<String, String>) -> Result<(), String> {
    let mut unknown: Vec<&String> = env
        .keys()
        .filter(|k| k.starts_with("TSL3_"))
        .filter(|k| !k.contains("__") && !PROCESS_VARIABLES.contains(&k.as_str()))
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(k) => Err(format!(
            "invalid setting {k}: unknown environment variable (settings are TSL3_<SECTION>__<KEY>, e.g. TSL3_MODEL__PROFILE=tiny)"
        )),
    }
}

/// A layer's error as `invalid setting <key>: <what>` (the form of every other settings
/// error) where the config crate names the key (`... for key `a.b` [in FILE]`).
fn config_error(e: &config::ConfigError) -> String {
    let text = e.to_string();
    if let Some((what, rest)) = text.split_once(" for key `") {
        if let Some((key, origin)) = rest.split_once('`') {
            return format!("invalid setting {key}: {what}{origin}");
        }
    }
    format!("invalid settings: {text}")
}

/// The resolved settings as TOML (what `check-config` prints).
pub fn to_toml(s: &Settings) -> String {
    toml::to_string_pretty(s).unwrap_or_else(|e| format!("# could not render settings: {e}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_load_and_validate() {
        let s = load(None, &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(s.storage.backend, StoreKind::Local);
        assert_eq!(s.tp.world, 1);
        assert_eq!(s.model.profile, "tiny");
    }

    #[test]
    fn layers_apply_in_order_env_then_flags() {
        let e = env(&[
            ("TSL3_STORAGE__BACKEND", "memory"),
            ("TSL3_STORAGE__CONTRACT__OPERATION_CREDITS", "32"),
        ]);
        let s = load(None, &e, &Overrides::default()).unwrap();
        assert_eq!(s.storage.backend, StoreKind::Memory);
        assert_eq!(s.storage.contract.operation_credits, 32);
        let o = Overrides {
            store: Some("none".into()),
            listen: Some("127.0.0.1:9999".into()),
            ..Default::default()
        };
        let s = load(None, &e, &o).unwrap();
        assert_eq!(s.storage.backend, StoreKind::None);
        assert_eq!(s.server.listen, "127.0.0.1:9999");
    }

    #[test]
    fn bad_values_fail_with_one_line_naming_the_field() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("TSL3_STORAGE__RUNTIME__GET_WORKERS", "0")],
                "storage.runtime.get_workers",
            ),
            (
                &[(
                    "TSL3_STORAGE__CONTRACT__PRESSURE_LOW__OLDEST_AGE_MS",
                    "999999",
                )],
                "storage.contract.pressure_low.oldest_age_ms",
            ),
            (&[("TSL3_TP__RANK", "3")], "tp.rank"),
            (&[("TSL3_MODEL__PROFILE", "gpt-5")], "model.profile"),
            (&[("TSL3_SERVER__LISTEN", "nowhere")], "server.listen"),
            (
                &[("TSL3_STORAGE__BACKEND", "floppy")],
                "storage.backend: must be one of none, memory, local, mooncake",
            ),
            (&[("TSL3_TP__WORLD", "two")], "invalid setting tp.world"),
        ];
        for (vars, field) in cases {
            let e = load(None, &env(vars), &Overrides::default()).unwrap_err();
            assert!(!e.contains('\n'), "one line: {e}");
            assert!(e.contains(field), "{vars:?}: {e} should name {field}");
        }
    }

    #[test]
    fn unknown_field_in_a_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.toml");
        std::fs::write(&p, "[storage.contract]\noperation_credit = 3\n").unwrap();
        let e = load(p.to_str(), &env(&[]), &Overrides::default()).unwrap_err();
        assert!(e.contains("operation_credit"), "{e}");
    }

    #[test]
    fn the_replica_label_is_shared_by_a_replicas_ranks_and_apart_between_replicas() {
        let launch = |rank: u32, base: &str| {
            let o = Overrides {
                world: Some(2),
                rank: Some(rank),
                peers: Some(vec!["127.0.0.1:40001".into(), "127.0.0.1:40002".into()]),
                metrics_listen: Some(base.into()),
                ..Default::default()
            };
            load(None, &env(&[("TSL3_TP__SECRET", "s")]), &o)
                .unwrap()
                .replica_label()
        };
        assert_eq!(launch(0, "127.0.0.1:8000"), launch(1, "127.0.0.1:8000"));
        assert_ne!(launch(0, "127.0.0.1:8000"), launch(0, "127.0.0.1:8100"));
        assert!(launch(0, "127.0.0.1:8000").ends_with(":8000"));
        assert!(!launch(0, "127.0.0.1:8000").starts_with("127.0.0.1"));
        // A mesh across machines: the leader's mesh host, on every rank.
        let o = Overrides {
            world: Some(2),
            rank: Some(1),
            peers: Some(vec!["10.0.0.5:7000".into(), "10.0.0.6:7000".into()]),
            ..Default::default()
        };
        let s = load(None, &env(&[("TSL3_TP__SECRET", "s")]), &o).unwrap();
        assert_eq!(s.replica_label(), "10.0.0.5:8000");
        // Overridden.
        let s = load(
            None,
            &env(&[("TSL3_TELEMETRY__REPLICA", "r7")]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.replica_label(), "r7");
    }

    #[test]
    fn world_above_one_needs_peers_and_secret() {
        let o = Overrides {
            world: Some(2),
            ..Default::default()
        };
        let e = load(None, &env(&[]), &o).unwrap_err();
        assert!(e.contains("tp.peers"), "{e}");
        let o = Overrides {
            world: Some(2),
            peers: Some(vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()]),
            ..Default::default()
        };
        let e = load(None, &env(&[]), &o).unwrap_err();
        assert!(e.contains("tp.secret"), "{e}");
        let s = load(None, &env(&[("TSL3_TP__SECRET", "s3cret")]), &o).unwrap();
        assert_eq!(s.tp.peers.len(), 2);
    }

    #[test]
    fn unknown_tsl3_variables_are_rejected_by_name() {
        for var in ["TSL3_MODEL", "TSL3_MODEL_PROFILE", "TSL3_STORE"] {
            let e = load(None, &env(&[(var, "5")]), &Overrides::default()).unwrap_err();
            assert!(e.contains(var) && !e.contains('\n'), "{var}: {e}");
        }
        // Process variables of the test harness are not settings and pass.
        let ok = env(&[("TSL3_REQUIRE_MOUNT", "1"), ("TSL3_MESH_SECRET", "x")]);
        assert!(load(None, &ok, &Overrides::default()).is_ok());
        let e = load(
            None,
            &env(&[("TSL3_MODEL__PROFLE", "tiny")]),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(e.contains("profle"), "{e}");
    }

    #[test]
    fn file_errors_name_the_path_or_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let e = load(Some(d), &env(&[]), &Overrides::default()).unwrap_err();
        assert!(e.contains("is a directory"), "{e}");
        let p = dir.path().join("big.toml");
        std::fs::write(
            &p,
            "[model]\nweight_version = 1\ndevice_blocks = 99999999999999999999\n",
        )
        .unwrap();
        let e = load(p.to_str(), &env(&[]), &Overrides::default()).unwrap_err();
        assert!(
            e.contains("model.device_blocks") && e.contains("line 3"),
            "{e}"
        );
        std::fs::write(&p, "[model]\ndevice_blocks = 99999999999\n").unwrap();
        let e = load(p.to_str(), &env(&[]), &Overrides::default()).unwrap_err();
        assert!(e.contains("model.device_blocks"), "{e}");
    }

    #[test]
    fn secrets_are_never_printed_and_may_come_from_a_file() {
        let e = env(&[
            ("TSL3_SERVER__ADMIN_TOKEN", "hunter2-token"),
            ("TSL3_TP__SECRET", "mesh-s3cret"),
        ]);
        let s = load(None, &e, &Overrides::default()).unwrap();
        assert_eq!(s.server.admin_token.expose(), "hunter2-token");
        assert_eq!(s.tp.secret.expose(), "mesh-s3cret");
        for shown in [to_toml(&s), format!("{s:?}")] {
            assert!(
                !shown.contains("hunter2") && !shown.contains("s3cret"),
                "{shown}"
            );
            assert!(shown.contains(Secret::REDACTED), "{shown}");
        }
        // An unset secret shows as empty, so a reader can tell it is unset.
        let s = load(None, &env(&[]), &Overrides::default()).unwrap();
        assert!(to_toml(&s).contains("admin_token = \"\""));

        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("secret");
        std::fs::write(&f, "from-a-file\n").unwrap();
        let fp = f.to_str().unwrap();
        let s = load(
            None,
            &env(&[("TSL3_TP__SECRET_FILE", fp)]),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(s.tp.secret.expose(), "from-a-file");
        let both = env(&[("TSL3_TP__SECRET_FILE", fp), ("TSL3_TP__SECRET", "x")]);
        let e = load(None, &both, &Overrides::default()).unwrap_err();
        assert!(
            e.contains("tp.secret_file") && e.contains("not both"),
            "{e}"
        );
        let missing = dir.path().join("none");
        let e = load(
            None,
            &env(&[("TSL3_TP__SECRET_FILE", missing.to_str().unwrap())]),
            &Overrides::default(),
        )
        .unwrap_err();
        assert!(e.contains("tp.secret_file"), "{e}");
    }

    #[test]
    fn the_mooncake_variables_of_env_sh_sit_between_the_file_and_tsl3_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.toml");
        std::fs::write(
            &p,
            "[storage.mooncake]\nmaster_server_addr = \"10.0.0.1:1\"\nmetadata_server = \"P2PHANDSHAKE\"\n",
        )
        .unwrap();
        let f = p.to_str();
        let vars = [
            ("MOONCAKE_MASTER", "127.0.0.1:50051"),
            ("MOONCAKE_METADATA_SERVER", "http://127.0.0.1:8080/metadata"),
        ];
        let s = load(f, &env(&vars), &Overrides::default()).unwrap();
        assert_eq!(s.storage.mooncake.master_server_addr, "127.0.0.1:50051");
        assert_eq!(
            s.storage.mooncake.metadata_server,
            "http://127.0.0.1:8080/metadata"
        );
        let mut with_tsl3 = vars.to_vec();
        with_tsl3.push(("TSL3_STORAGE__MOONCAKE__MASTER_SERVER_ADDR", "127.0.0.2:9"));
        let s = load(f, &env(&with_tsl3), &Overrides::default()).unwrap();
        assert_eq!(s.storage.mooncake.master_server_addr, "127.0.0.2:9");
        let s = load(f, &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(s.storage.mooncake.master_server_addr, "10.0.0.1:1");
    }
}
