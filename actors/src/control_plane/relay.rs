//! The relay exchange: one CPU all-gather of [`GatheredReport`]s per round over the rank mesh,
//! in two phases under one deadline: reports, then "gathered" confirmations, so a rank
//! returns a round only after every rank confirmed it gathered every report. Over the
//! [`Topology`] its world picks: the full mesh (each rank sends both phases to every peer;
//! see `gather`) or the star (each rank sends both to the leader, which answers each phase
//! with one frame per rank; see `star`). A dead, stalled or misbehaving peer fails the round
//! with an error naming it; this rank then tells every peer why (an Abort frame) and refuses
//! every later round, so no rank hangs and none keeps doing L3 work alone.
//!
//! It owns round sequencing on the wire; it must never reduce or reinterpret reports.

use super::mesh::{BroadcastError, Mesh, MeshFrame, PeerEvent, Topology};
use messages::{ControlError, GatheredReport};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How long a failing rank spends telling its peers why.
pub(super) const ABORT_GRACE: Duration = Duration::from_secs(1);

pub struct Relay {
    pub(super) mesh: Mesh,
    pub(super) topology: Topology,
    pub(super) round_deadline: Duration,
    /// Reports that arrived for the next round while this rank still gathered the current
    /// one (a peer can be at most one round ahead).
    early: Vec<VecDeque<GatheredReport>>,
    /// Peers whose connection closed after they had confirmed the round being gathered
    /// (a rank that completed the last round and left): not an error for that round, but
    /// the next round fails on them.
    pub(super) gone: Vec<Option<String>>,
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
            topology: mesh.topology(),
            mesh,
            round_deadline,
            early: (0..world).map(|_| VecDeque::new()).collect(),
            gone: vec![None; world],
            failed: None,
        }
    }

    pub fn rank(&self) -> u32 {
        self.mesh.rank()
    }

    pub fn world(&self) -> u32 {
        self.mesh.world()
    }

    /// Which connections carry a round.
    pub fn topology(&self) -> Topology {
        self.topology
    }

    /// Frames this rank has written to peers (every round and abort so far).
    pub fn frames_sent(&self) -> u64 {
        self.mesh.frames_sent()
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
        report: GatheredReport,
    ) -> Result<Vec<GatheredReport>, ControlError> {
        if let Some(e) = &self.failed {
            return Err(ControlError::Stopped(e.to_string()));
        }
        let gathered = match self.topology {
            Topology::FullMesh => self.gather(report).await,
            Topology::Star => self.gather_over_star(report).await,
        };
        match gathered {
            Ok(all) => Ok(all),
            Err(e) => {
                let e = self.prefer_peer_abort(e);
                Err(self.abort(e).await)
            }
        }
    }

    /// Fails this relay: tells every peer why (so they fail the round with the same cause
    /// instead of waiting for the deadline) and refuses every later round.
    pub async fn abort(&mut self, e: ControlError) -> ControlError {
        if self.failed.is_none() {
            tracing::error!(rank = self.mesh.rank(), error = %e, "control plane round failed; no further rounds");
            let grace = Instant::now() + self.round_deadline.min(ABORT_GRACE);
            let _ = self
                .mesh
                .broadcast(&MeshFrame::<GatheredReport>::Abort(e.clone()), grace)
                .await;
            self.failed = Some(e.clone());
        }
        e
    }

    /// A disconnect seen here may be secondary (a peer that failed first and went away);
    /// when a peer's Abort with the cause is already queued, report that cause instead.
    fn prefer_peer_abort(&mut self, e: ControlError) -> ControlError {
        if !matches!(e, ControlError::Disconnected { .. }) {
            return e;
        }
        while let Some((_, ev)) = self.mesh.try_next_event() {
            if let PeerEvent::Frame(MeshFrame::Abort(cause)) = ev {
                return cause;
            }
        }
        e
    }

    /// Takes one peer event while gathering `round`: reports, and confirmations once
    /// `confirmable` (the star's leader takes them only after it sent the gathered set).
    pub(super) fn accept(
        &mut self,
        (peer, ev): (u32, PeerEvent),
        round: u64,
        got: &mut [Option<GatheredReport>],
        confirmed: &mut [bool],
        confirmable: bool,
    ) -> Result<(), ControlError> {
        let bad = |detail: String| ControlError::Frame {
            rank: peer,
            round,
            detail,
        };
        match ev {
            PeerEvent::Frame(MeshFrame::Report(r)) => {
                if r.rank != peer {
                    return Err(bad(format!("report claims rank {}", r.rank)));
                }
                if r.round == round && got[peer as usize].is_none() {
                    got[peer as usize] = Some(r);
                } else if r.round == round + 1 && self.early[peer as usize].is_empty() {
                    self.early[peer as usize].push_back(r);
                } else {
                    return Err(bad(format!("unexpected report for round {}", r.round)));
                }
                Ok(())
            }
            PeerEvent::Frame(MeshFrame::Gathered(r)) => {
                if !confirmable
                    || r != round
                    || got[peer as usize].is_none()
                    || confirmed[peer as usize]
                {
                    return Err(bad(format!("unexpected confirmation of round {r}")));
                }
                confirmed[peer as usize] = true;
                Ok(())
            }
            PeerEvent::Frame(MeshFrame::All(_)) => Err(bad("unexpected gathered set".into())),
            PeerEvent::Frame(MeshFrame::Agreed(r)) => {
                Err(bad(format!("unexpected agreement of round {r}")))
            }
            PeerEvent::Frame(MeshFrame::Abort(e)) => Err(e),
            // A peer that confirmed this round has everything it needs from it: its close
            // (it completed the round and left, e.g. after an agreed shutdown) ends only
            // the rounds after this one.
            PeerEvent::Closed(detail) if confirmed[peer as usize] && peer != self.mesh.rank() => {
                self.gone[peer as usize] = Some(detail);
                Ok(())
            }
            PeerEvent::Closed(detail) => Err(ControlError::Disconnected {
                rank: peer,
                round,
                detail,
            }),
            PeerEvent::Bad(e) => Err(bad(e.to_string())),
        }
    }

    /// Waits for the next peer event until the deadline; `waiting_on` is named on timeout.
    pub(super) async fn next(
        &mut self,
        deadline: Instant,
        round: u64,
        waiting_on: usize,
    ) -> Result<(u32, PeerEvent), ControlError> {
        let deadline_ms = self.round_deadline.as_millis() as u64;
        self.next_within(deadline, deadline_ms, round, waiting_on)
            .await
    }

    /// `next`, naming `deadline_ms` as the wait on timeout.
    pub(super) async fn next_within(
        &mut self,
        deadline: Instant,
        deadline_ms: u64,
        round: u64,
        waiting_on: usize,
    ) -> Result<(u32, PeerEvent), ControlError> {
        match tokio::time::timeout_at(deadline, self.mesh.next_event()).await {
            Ok(Some(ev)) => Ok(ev),
            Ok(None) => Err(ControlError::Disconnected {
                rank: waiting_on as u32,
                round,
                detail: "every connection task ended".into(),
            }),
            Err(_) => Err(ControlError::Timeout {
                rank: waiting_on as u32,
                round,
                deadline_ms,
            }),
        }
    }

    /// The error for a frame this rank could not send in `round`.
    pub(super) fn cannot_send(&self, round: u64, e: BroadcastError) -> ControlError {
        let me = self.mesh.rank();
        match e {
            BroadcastError::Encode(e) => ControlError::Protocol {
                round,
                message: format!("rank {me} cannot send: {e}"),
            },
            BroadcastError::Failed(rank, e) => ControlError::Disconnected {
                rank,
                round,
                detail: e.to_string(),
            },
            BroadcastError::Stalled(rank) => ControlError::Timeout {
                rank,
                round,
                deadline_ms: self.round_deadline.as_millis() as u64,
            },
        }
    }

    /// Fails `round` on a peer that left after confirming an earlier round.
    pub(super) fn fail_on_gone(&self, round: u64) -> Result<(), ControlError> {
        match self
            .gone
            .iter()
            .enumerate()
            .find_map(|(p, d)| d.clone().map(|d| (p, d)))
        {
            Some((peer, detail)) => Err(ControlError::Disconnected {
                rank: peer as u32,
                round,
                detail,
            }),
            None => Ok(()),
        }
    }

    /// `round`'s slots with this rank's own report (and confirmation) in, and the reports
    /// that arrived early for it.
    pub(super) fn open_slots(
        &mut self,
        round: u64,
        own: GatheredReport,
    ) -> Result<Slots, ControlError> {
        let world = self.mesh.world() as usize;
        let me = self.mesh.rank() as usize;
        let mut got: Vec<Option<GatheredReport>> = (0..world).map(|_| None).collect();
        let mut confirmed = vec![false; world];
        got[me] = Some(own);
        confirmed[me] = true;
        for (peer, q) in self.early.iter_mut().enumerate() {
            if let Some(r) = q.pop_front() {
                if r.round != round {
                    return Err(ControlError::Frame {
                        rank: peer as u32,
                        round,
                        detail: format!("sent round {} in round {round}", r.round),
                    });
                }
                got[peer] = Some(r);
            }
        }
        Ok(Slots { got, confirmed })
    }

    /// Takes peer events until every slot holds a report (confirmations on the way only
    /// when `confirmable`).
    pub(super) async fn await_reports(
        &mut self,
        deadline: Instant,
        round: u64,
        slots: &mut Slots,
        confirmable: bool,
    ) -> Result<(), ControlError> {
        while let Some(missing) = slots.got.iter().position(|r| r.is_none()) {
            let ev = self.next(deadline, round, missing).await?;
            self.accept(ev, round, &mut slots.got, &mut slots.confirmed, confirmable)?;
        }
        Ok(())
    }

    /// Takes peer events until every rank confirmed.
    pub(super) async fn await_confirmations(
        &mut self,
        deadline: Instant,
        round: u64,
        slots: &mut Slots,
    ) -> Result<(), ControlError> {
        while let Some(missing) = slots.confirmed.iter().position(|c| !c) {
            let ev = self.next(deadline, round, missing).await?;
            self.accept(ev, round, &mut slots.got, &mut slots.confirmed, true)?;
        }
        Ok(())
    }

    /// The full mesh: two phases under one deadline: (1) send this rank's report to every
    /// peer and gather every peer's; (2) confirm "gathered" to every peer and wait for every
    /// peer's confirmation. A rank agrees a round only once every rank has gathered it, so a
    /// peer that failed the round (and sent an Abort instead of its confirmation) fails it
    /// here too.
    async fn gather(
        &mut self,
        report: GatheredReport,
    ) -> Result<Vec<GatheredReport>, ControlError> {
        let round = report.round;
        let me = self.mesh.rank();
        let world = self.mesh.world() as usize;
        let deadline = Instant::now() + self.round_deadline;
        let frame = MeshFrame::<GatheredReport>::Report(report);
        if let Err(e) = self.mesh.broadcast(&frame, deadline).await {
            return Err(self.cannot_send(round, e));
        }
        let MeshFrame::Report(report) = frame else {
            return Err(ControlError::Protocol {
                round,
                message: "relay frame changed kind".into(),
            });
        };
        self.fail_on_gone(round)?;
        let mut slots = self.open_slots(round, report)?;
        self.await_reports(deadline, round, &mut slots, true)
            .await?;
        if world > 1 {
            // A peer that already confirmed may have completed the round and left.
            let done = slots.confirmed.clone();
            if let Err(e) = self
                .mesh
                .broadcast_excusing(
                    &MeshFrame::<GatheredReport>::Gathered(round),
                    deadline,
                    |p| done.get(p as usize).copied().unwrap_or(false) && p != me,
                )
                .await
            {
                return Err(self.cannot_send(round, e));
            }
        }
        self.await_confirmations(deadline, round, &mut slots)
            .await?;
        Ok(slots.into_reports())
    }
}

/// One round's gathering on this rank: every rank's report (by rank) and whether it
/// confirmed.
pub(super) struct Slots {
    got: Vec<Option<GatheredReport>>,
    confirmed: Vec<bool>,
}

impl Slots {
    /// Every rank's report, in rank order (each slot holds one once reports are awaited).
    pub(super) fn reports(&self) -> impl Iterator<Item = &GatheredReport> {
        self.got.iter().flatten()
    }

    pub(super) fn into_reports(self) -> Vec<GatheredReport> {
        self.got.into_iter().flatten().collect()
    }
}
