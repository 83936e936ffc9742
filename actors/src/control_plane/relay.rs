//! The relay exchange: one CPU all-gather of [`RoundReport`]s per round over the rank mesh.
//! Each rank sends its report once to every peer and waits, under the round deadline, for
//! every peer's report of the same round. A dead, stalled or misbehaving peer fails the
//! round with an error naming it; this rank then tells every peer why (an Abort frame) and
//! refuses every later round, so no rank hangs and none keeps doing L3 work alone.
//!
//! It owns round sequencing on the wire; it must never reduce or reinterpret reports.

use super::mesh::{Mesh, MeshFrame, PeerEvent};
use messages::{ControlError, RoundReport};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

pub struct Relay {
    mesh: Mesh,
    round_deadline: Duration,
    /// Reports that arrived for the next round while this rank still gathered the current
    /// one (a peer can be at most one round ahead).
    early: Vec<VecDeque<RoundReport>>,
    failed: Option<ControlError>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("mesh", &self.mesh)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Relay {
    pub fn new(mesh: Mesh, round_deadline: Duration) -> Self {
        let world = mesh.world() as usize;
        Self {
            mesh,
            round_deadline,
            early: (0..world).map(|_| VecDeque::new()).collect(),
            failed: None,
        }
    }

    pub fn rank(&self) -> u32 {
        self.mesh.rank()
    }

    pub fn world(&self) -> u32 {
        self.mesh.world()
    }

    /// The failure that stopped this relay, if any.
    pub fn failure(&self) -> Option<&ControlError> {
        self.failed.as_ref()
    }

    /// Marks the relay failed (e.g. agreement raised a protocol error): no further rounds.
    pub fn stop(&mut self, why: ControlError) {
        if self.failed.is_none() {
            self.failed = Some(why);
        }
    }

    /// All-gathers one round: returns every rank's report in rank order.
    pub async fn all_gather(
        &mut self,
        report: RoundReport,
    ) -> Result<Vec<RoundReport>, ControlError> {
        if let Some(e) = &self.failed {
            return Err(ControlError::Stopped(e.to_string()));
        }
        match self.gather(report).await {
            Ok(all) => Ok(all),
            Err(e) => {
                // Tell every peer why, so they fail this round with the same cause.
                let _ = self.mesh.broadcast(&MeshFrame::Abort(e.clone()));
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    async fn gather(&mut self, report: RoundReport) -> Result<Vec<RoundReport>, ControlError> {
        let round = report.round;
        let me = self.mesh.rank();
        let world = self.mesh.world() as usize;
        let deadline = Instant::now() + self.round_deadline;
        self.mesh
            .broadcast(&MeshFrame::Report(report.clone()))
            .map_err(|e| ControlError::Protocol {
                round,
                message: format!("rank {me} cannot send its report: {e}"),
            })?;
        let mut got: Vec<Option<RoundReport>> = (0..world).map(|_| None).collect();
        got[me as usize] = Some(report);
        for (peer, q) in self.early.iter_mut().enumerate() {
            if let Some(r) = q.pop_front() {
                if r.round != round {
                    return Err(ControlError::Protocol {
                        round,
                        message: format!("rank {peer} sent round {} in round {round}", r.round),
                    });
                }
                got[peer] = Some(r);
            }
        }
        while let Some(missing) = got.iter().position(|r| r.is_none()) {
            let ev = match tokio::time::timeout_at(deadline, self.mesh.next_event()).await {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    return Err(ControlError::Disconnected {
                        rank: missing as u32,
                        round,
                        detail: "every connection task ended".into(),
                    })
                }
                Err(_) => {
                    return Err(ControlError::Timeout {
                        rank: missing as u32,
                        round,
                        deadline_ms: self.round_deadline.as_millis() as u64,
                    })
                }
            };
            let (peer, ev) = ev;
            match ev {
                PeerEvent::Frame(MeshFrame::Report(r)) => {
                    if r.rank != peer {
                        return Err(ControlError::Frame {
                            rank: peer,
                            round,
                            detail: format!("report claims rank {}", r.rank),
                        });
                    }
                    if r.round == round && got[peer as usize].is_none() {
                        got[peer as usize] = Some(r);
                    } else if r.round == round + 1 && self.early[peer as usize].is_empty() {
                        self.early[peer as usize].push_back(r);
                    } else {
                        return Err(ControlError::Frame {
                            rank: peer,
                            round,
                            detail: format!("unexpected report for round {}", r.round),
                        });
                    }
                }
                PeerEvent::Frame(MeshFrame::Abort(e)) => return Err(e),
                PeerEvent::Closed(detail) => {
                    return Err(ControlError::Disconnected {
                        rank: peer,
                        round,
                        detail,
                    })
                }
                PeerEvent::Bad(e) => {
                    return Err(ControlError::Frame {
                        rank: peer,
                        round,
                        detail: e.to_string(),
                    })
                }
            }
        }
        Ok(got.into_iter().flatten().collect())
    }
}
