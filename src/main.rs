//! engine-host: the tsl3 binary. It parses the CLI, loads layered settings, and runs one
//! subcommand. Only this crate knows every actor and wires them.

use engine_host::settings;

use clap::{Parser, Subcommand};
use std::collections::HashMap;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "engine-host",
    version,
    about = "tsl3: the asynchronous global L3 KV cache engine host"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate a settings file (layered over the defaults and TSL3_* environment) and print
    /// the resolved settings.
    CheckConfig {
        /// The settings file.
        file: String,
    },
    /// Run a benchmark and print its figures (ratios measured side by side in one run).
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand, Debug)]
enum BenchCommand {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let env: HashMap<String, String> = std::env::vars().collect();
    match cli.command {
        Command::CheckConfig { file } => {
            match settings::load(Some(&file), &env, &settings::Overrides::default()) {
                Ok(s) => {
                    print!("{}", settings::to_toml(&s));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Bench { which } => match which {},
    }
}
