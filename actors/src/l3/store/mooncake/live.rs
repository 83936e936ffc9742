//! The running Mooncake instance the environment names (deploy/mooncake/env.sh exports
//! MOONCAKE_STORE_LIBRARY, MOONCAKE_MASTER, MOONCAKE_METADATA_SERVER): how live tests,
//! benchmarks and tools find it. It reads the environment and probes the master's port; it
//! starts nothing and holds no client.

use crate::names::env;
use messages::settings::MooncakeStoreSettings;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Whether a live master is required (CI sets MOONCAKE_REQUIRE_MASTER=1): live tests then
/// fail instead of skipping.
pub fn required() -> bool {
    std::env::var(env::MOONCAKE_REQUIRE_MASTER).is_ok_and(|v| v == "1")
}

/// Pure-client settings (no segment of its own, tenant "default") for the instance the
/// environment names, or why there is no usable one (unset, no library, master not
/// listening). The port probe avoids a client setup that retries for ~90 s.
pub fn settings_from_env() -> Result<MooncakeStoreSettings, String> {
    let lib = std::env::var(env::MOONCAKE_STORE_LIBRARY).unwrap_or_default();
    let master = std::env::var(env::MOONCAKE_MASTER).unwrap_or_default();
    if lib.is_empty() || master.is_empty() {
        return Err(format!(
            "${} or ${} unset (run deploy/mooncake/install.sh and start.sh, then source deploy/mooncake/env.sh)",
            env::MOONCAKE_STORE_LIBRARY,
            env::MOONCAKE_MASTER
        ));
    }
    if !std::path::Path::new(&lib).exists() {
        return Err(format!("the library {lib} does not exist"));
    }
    let listening = master
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    if !listening {
        return Err(format!("no Mooncake master listening on {master}"));
    }
    let metadata = std::env::var(env::MOONCAKE_METADATA_SERVER)
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "P2PHANDSHAKE".into());
    Ok(MooncakeStoreSettings {
        library_path: lib,
        local_hostname: "127.0.0.1".into(),
        metadata_server: metadata,
        master_server_addr: master,
        protocol: "tcp".into(),
        device_name: String::new(),
        global_segment_size: 0,
        local_buffer_size: 0,
        tenant_id: "default".into(),
        dfs_dir: String::new(),
    })
}

/// For live tests: skips loudly (straight to stderr, past the harness's capture), or
/// panics — fails the test — when a master is required.
pub fn skip(test: &str, why: &str) {
    assert!(
        !required(),
        "{} is 1 but {test}: {why}",
        env::MOONCAKE_REQUIRE_MASTER
    );
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
}

/// For live tests: the settings, or None after [`skip`].
pub fn settings_or_skip(test: &str) -> Option<MooncakeStoreSettings> {
    match settings_from_env() {
        Ok(s) => Some(s),
        Err(why) => {
            skip(test, &why);
            None
        }
    }
}

/// The settings as the `TSL3_STORAGE__MOONCAKE__*` variables (and the transfer engine's
/// loopback binding) that make an `engine-host serve` child process a client of the same
/// instance: what live tests and benchmarks pass to the processes they start.
pub fn engine_env(m: &MooncakeStoreSettings) -> Vec<(String, String)> {
    let p = "TSL3_STORAGE__MOONCAKE__";
    [
        ("LIBRARY_PATH", m.library_path.clone()),
        ("MASTER_SERVER_ADDR", m.master_server_addr.clone()),
        ("METADATA_SERVER", m.metadata_server.clone()),
        ("LOCAL_HOSTNAME", m.local_hostname.clone()),
        ("PROTOCOL", m.protocol.clone()),
        ("GLOBAL_SEGMENT_SIZE", m.global_segment_size.to_string()),
        ("LOCAL_BUFFER_SIZE", m.local_buffer_size.to_string()),
        ("TENANT_ID", m.tenant_id.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (format!("{p}{k}"), v))
    .chain([("MC_TCP_BIND_ADDRESS".to_string(), "127.0.0.1".to_string())])
    .collect()
}
