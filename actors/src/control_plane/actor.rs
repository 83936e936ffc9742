//! The ControlPlane actor: the engine host's round loop sends it [`ExchangeRound`] and gets
//! the [`AgreedRound`] (or the round's [`ControlError`]). A world of one uses the same code
//! path: the exchange with itself.
//!
//! It owns the core behind an async mutex so one round runs at a time; it must never run two
//! exchanges concurrently or answer a round after a failure with anything but an error.

use super::plane::ControlPlaneCore;
use actix::{Actor, Context, Handler, ResponseFuture};
use messages::{AgreedRound, ControlError, ExchangeRound};
use std::sync::Arc;
use tokio::sync::Mutex;

pub struct ControlPlane {
    core: Arc<Mutex<ControlPlaneCore>>,
}

impl ControlPlane {
    /// Wraps an established core. Establish it inside the actix system that runs this
    /// actor: its connection tasks live on that runtime.
    pub fn new(core: ControlPlaneCore) -> Self {
        Self {
            core: Arc::new(Mutex::new(core)),
        }
    }
}

impl Actor for ControlPlane {
    type Context = Context<Self>;
}

impl Handler<ExchangeRound> for ControlPlane {
    type Result = ResponseFuture<Result<AgreedRound, ControlError>>;

    fn handle(&mut self, msg: ExchangeRound, _ctx: &mut Self::Context) -> Self::Result {
        let core = self.core.clone();
        Box::pin(async move { core.lock().await.exchange_round(msg.0).await })
    }
}
