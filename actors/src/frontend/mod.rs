//! Frontend (leader rank): the HTTP API. It owns request parsing, validation and response
//! rendering (the OpenAI API in `openai`, text <-> tokens through `text`), and hands each
//! accepted request to the round loop through a bounded inbox; its messages then ride the
//! leader's report so every rank sees them in the same round. It never touches the cache,
//! storage or the device, and never blocks the round loop.

pub mod api;
pub mod clients;
pub mod health;
pub mod model_text;
pub mod openai;
pub mod server;
pub mod text;

pub use api::{FallbackReason, PrefixUsage, RequestLimits};
pub use server::{
    configure, configure_observability, inbox, AdminCommand, AdminSubmission, FrontendInbox,
    FrontendState, HealthSource, Submission, TokenEvent,
};
pub use text::{ByteCodec, ChatMessage, TextCodec};
