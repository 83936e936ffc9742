//! engine-host as a library: what the binary and the cross-crate tests share. Only this crate
//! knows every actor and wires them.

pub mod bench;
pub mod launch;
pub mod model_cmd;
pub mod serve;
pub mod settings;
pub mod settings_doc;
pub mod telemetry;
