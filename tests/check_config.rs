//! `engine-host check-config` as a user runs it: the default and example files resolve; each
//! bad example fails with exit code 2 and one line naming its field (named in the file's
//! first line, `# expect: <field>`).

use std::process::Command;

fn check(file: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["check-config", file])
        .env_remove("TSL3_STORAGE__BACKEND")
        .env_remove("MOONCAKE_MASTER")
        .env_remove("MOONCAKE_METADATA_SERVER")
        .output()
        .unwrap()
}

#[test]
fn default_and_examples_resolve() {
    for f in [
        "config/default.toml",
        "config/examples/single-rank.toml",
        "config/examples/tp2.toml",
        "config/examples/mooncake.toml",
    ] {
        let out = check(f);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{f}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("[storage.contract]"),
            "{f} printed: {stdout}"
        );
    }
    let out = check("config/examples/tp2.toml");
    assert!(String::from_utf8_lossy(&out.stdout).contains("world = 2"));
}

#[test]
fn every_bad_example_fails_naming_its_field() {
    let mut n = 0;
    for entry in std::fs::read_dir("config/examples/bad").unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let field = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{path:?} lacks '# expect: <field>'"));
        let out = check(path.to_str().unwrap());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path:?} should fail: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains(field.trim()),
            "{path:?}: {stderr} should name {field}"
        );
        n += 1;
    }
    assert!(n >= 8, "expected the bad examples, found {n}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let out = check("config/examples/no-such-file.toml");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

/// Pools that cannot be resident on this machine fail at startup with one line naming the
/// settings to lower, before anything is allocated (the default llama-8b-like pools need
/// 41 GiB; a Device of a million 2 MiB blocks certainly exceeds any test machine).
#[test]
fn serve_refuses_pools_that_cannot_be_resident() {
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args([
            "serve",
            "--model-profile",
            "llama-8b-like",
            "--store",
            "none",
        ])
        .args(["--listen", "127.0.0.1:0"])
        .env("TSL3_MODEL__DEVICE_BLOCKS", "1000000")
        .env("TSL3_MODEL__DEVICE", "emulated")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    for needle in ["host_cache", "model.device_blocks", "available"] {
        assert!(line.contains(needle), "{line}");
    }
}

#[test]
fn a_directory_is_not_a_settings_file() {
    let out = check("config/examples");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
}

#[test]
fn check_config_never_prints_a_secret_and_rejects_unknown_variables() {
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["check-config", "config/default.toml"])
        .env("TSL3_SERVER__ADMIN_TOKEN", "tok-hunter2")
        .env("TSL3_TP__SECRET", "mesh-hunter2")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(text.matches("<redacted>").count(), 2, "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["check-config", "config/default.toml"])
        .env("TSL3_MODEL", "5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("TSL3_MODEL"));
}

/// The Mooncake example names the master and metadata server that deploy/mooncake/start.sh
/// starts by default (common.sh's ports), so it works as written with the deploy scripts.
#[test]
fn the_mooncake_example_agrees_with_the_deploy_scripts() {
    let common = std::fs::read_to_string("deploy/mooncake/common.sh").unwrap();
    let port = |var: &str| -> String {
        let line = common
            .lines()
            .find(|l| l.starts_with(&format!("{var}=")))
            .unwrap_or_else(|| panic!("{var} in common.sh"));
        line.rsplit(":-")
            .next()
            .unwrap()
            .trim_end_matches(['}', '"'])
            .to_string()
    };
    let out = check("config/examples/mooncake.toml");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let rpc = port("MOONCAKE_RPC_PORT");
    let http = port("MOONCAKE_HTTP_PORT");
    assert!(
        text.contains(&format!("master_server_addr = \"127.0.0.1:{rpc}\"")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "metadata_server = \"http://127.0.0.1:{http}/metadata\""
        )),
        "{text}"
    );
}

/// The engine host's systemd unit, run as systemd would (its `Environment=` lines with the
/// instance `%i` = 0, its `ExecStart=` argument list) with `--check-config` appended and
/// the example Mooncake settings in place of /etc/tsl3/engine-host.toml: the argument list
/// parses and the settings resolve.
#[test]
fn systemd_unit_exec_start_parses() {
    let unit = std::fs::read_to_string("deploy/mooncake/systemd/tsl3-engine-host@.service")
        .expect("the engine-host unit");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("an ExecStart line");
    let mut argv = exec.split_whitespace();
    let binary = argv.next().expect("a binary");
    assert!(binary.ends_with("/engine-host"), "{binary}");
    let args: Vec<String> = argv
        .map(|a| {
            a.replace(
                "/etc/tsl3/engine-host.toml",
                "config/examples/mooncake.toml",
            )
            .replace("%i", "0")
        })
        .collect();
    assert!(
        args.iter().any(|a| a == "config/examples/mooncake.toml"),
        "the unit should name its settings file: {exec}"
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_engine-host"));
    cmd.args(&args).arg("--check-config");
    cmd.env_remove("TSL3_STORAGE__BACKEND");
    for l in unit.lines() {
        if let Some((k, v)) = l
            .strip_prefix("Environment=")
            .and_then(|kv| kv.split_once('='))
        {
            cmd.env(k, v.replace("%i", "0"));
        }
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{exec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("backend = \"mooncake\""), "{stdout}");
    assert!(stdout.contains("rank = 0"), "{stdout}");
}

/// `serve --check-config` resolves the flags too and fails like startup does.
#[test]
fn serve_check_config_validates_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["serve", "--store", "memory", "--check-config"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("backend = \"memory\""));
    let out = Command::new(env!("CARGO_BIN_EXE_engine-host"))
        .args(["serve", "--rank", "3", "--check-config"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tp.rank"));
}
