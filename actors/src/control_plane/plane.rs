//! The control plane core, usable from plain tokio: seal the local report (validate local
//! records inside the error boundary, put them in columns), all-gather it over the relay,
//! agree the round over the gathered columns.
//!
//! It owns the relay and the agreement state of one rank. After any failure it refuses every
//! later round (L3 work stops); it must never return a partially agreed round.

use super::agreement::{seal_gathered, Agreement};
use super::mesh::{Mesh, MeshSettings};
use super::relay::Relay;
use messages::{AgreedRound, ControlError, RoundReport};

#[derive(Debug)]
pub struct ControlPlaneCore {
    relay: Relay,
    agreement: Agreement,
}

impl ControlPlaneCore {
    /// Sets up the mesh (binding this rank's address) and the agreement state.
    pub async fn establish(settings: &MeshSettings) -> Result<Self, ControlError> {
        let mesh = Mesh::establish(settings).await?;
        Ok(Self::from_mesh(mesh, settings))
    }

    /// Sets up the mesh on an already bound listener.
    pub async fn establish_with_listener(
        settings: &MeshSettings,
        listener: tokio::net::TcpListener,
    ) -> Result<Self, ControlError> {
        let mesh = Mesh::establish_with_listener(settings, listener).await?;
        Ok(Self::from_mesh(mesh, settings))
    }

    pub fn from_mesh(mesh: Mesh, settings: &MeshSettings) -> Self {
        let world = mesh.world();
        Self {
            relay: Relay::new(mesh, settings.round_deadline),
            agreement: Agreement::new(world),
        }
    }

    pub fn rank(&self) -> u32 {
        self.relay.rank()
    }

    pub fn world(&self) -> u32 {
        self.relay.world()
    }

    /// Which connections carry a round.
    pub fn topology(&self) -> super::mesh::Topology {
        self.relay.topology()
    }

    /// Frames this rank has written to peers so far.
    pub fn frames_sent(&self) -> u64 {
        self.relay.frames_sent()
    }

    /// The failure that stopped this control plane, if any.
    pub fn failure(&self) -> Option<&ControlError> {
        self.relay.failure()
    }

    /// Exchanges this rank's report for the round and returns the agreed round.
    pub async fn exchange_round(
        &mut self,
        report: RoundReport,
    ) -> Result<AgreedRound, ControlError> {
        let me = self.rank();
        if report.rank != me {
            let e = ControlError::Protocol {
                round: report.round,
                message: format!("rank {me} was handed a report for rank {}", report.rank),
            };
            return Err(self.relay.abort(e).await);
        }
        let sealed = seal_gathered(report);
        let all = self.relay.all_gather(sealed).await?;
        match self.agreement.agree_gathered(all) {
            Ok(agreed) => Ok(agreed),
            Err(e) => {
                self.relay.stop(e.clone());
                Err(e)
            }
        }
    }
}
