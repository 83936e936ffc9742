//! The relay's two phases over the star (see `mesh::Topology`): every rank sends its report,
//! then its "gathered" confirmation, to the leader only; the leader answers the reports with
//! the gathered set (one frame per rank, encoded once; each rank decodes every report in
//! it but its own) and the confirmations with `Agreed`. A round costs 4·(w−1) frames instead of the full mesh's 2·w·(w−1).
//!
//! The leader decides every round: it names a dead, stalled or misbehaving rank, and every
//! other rank learns that cause from its Abort. A rank other than the leader therefore
//! waits for the leader a grace period longer than the round deadline (the leader's own
//! wait for a stalled rank), and names the leader only when the leader itself went silent.
//! A rank other than the leader never fails a round on another such rank's close (that rank
//! may have been told `Agreed` and left); it notes it, and the next round fails on it.
//!
//! It owns the star's sequencing on the wire; it must never reduce or reinterpret reports.

use super::agreement::LEADER_RANK;
use super::mesh::{gathered_frame_limit, MeshFrame, PeerEvent};
use super::relay::{Relay, ABORT_GRACE};
use messages::{ControlError, GatheredReport};
use tokio::time::Instant;

/// What the leader sent a waiting rank.
enum FromLeader {
    All(Vec<bytes::Bytes>),
    Agreed,
}

impl Relay {
    /// One round over the star, as the leader or as any other rank.
    pub(super) async fn gather_over_star(
        &mut self,
        report: GatheredReport,
    ) -> Result<Vec<GatheredReport>, ControlError> {
        if self.mesh.rank() == LEADER_RANK {
            self.gather_as_leader(report).await
        } else {
            self.gather_via_leader(report).await
        }
    }

    /// The leader: gather every report, send the gathered set, gather every confirmation,
    /// send `Agreed`.
    async fn gather_as_leader(
        &mut self,
        report: GatheredReport,
    ) -> Result<Vec<GatheredReport>, ControlError> {
        let round = report.round;
        let me = self.mesh.rank() as usize;
        let world = self.mesh.world();
        let deadline = Instant::now() + self.round_deadline;
        self.fail_on_gone(round)?;
        let mut slots = self.open_slots(round, report)?;
        self.await_reports(deadline, round, &mut slots, false)
            .await?;
        let mut encoded = Vec::with_capacity(world as usize);
        for r in slots.reports() {
            match messages::encode(r) {
                Ok(b) => encoded.push(bytes::Bytes::from(b)),
                Err(e) => {
                    return Err(ControlError::Protocol {
                        round,
                        message: format!("rank {me} cannot send: {e}"),
                    })
                }
            }
        }
        let frame = MeshFrame::<GatheredReport>::All(encoded);
        let limit = gathered_frame_limit(self.mesh.max_frame_bytes(), world);
        if let Err(e) = self
            .mesh
            .broadcast_within(&frame, limit, deadline, |_| false)
            .await
        {
            return Err(self.cannot_send(round, e));
        }
        // `accept` takes a confirmation only from a rank whose report is in: all of them.
        self.await_confirmations(deadline, round, &mut slots)
            .await?;
        // Every rank confirmed: a rank whose `Agreed` cannot be written died after that
        // (the residual window); the next round fails on it.
        let agreed = MeshFrame::<GatheredReport>::Agreed(round);
        let _ = self
            .mesh
            .broadcast_excusing(&agreed, deadline, |_| true)
            .await;
        for peer in 0..world {
            if peer != me as u32
                && !self.mesh.is_connected(peer)
                && self.gone[peer as usize].is_none()
            {
                self.gone[peer as usize] = Some("its connection failed after it confirmed".into());
            }
        }
        Ok(slots.into_reports())
    }

    /// Any rank but the leader: send the report to the leader, take the gathered set,
    /// confirm it, take `Agreed`.
    async fn gather_via_leader(
        &mut self,
        report: GatheredReport,
    ) -> Result<Vec<GatheredReport>, ControlError> {
        let round = report.round;
        let now = Instant::now();
        let send_by = now + self.round_deadline;
        let patience = self.round_deadline + self.round_deadline.min(ABORT_GRACE);
        let wait_by = now + patience;
        self.fail_on_gone(round)?;
        let frame = MeshFrame::<GatheredReport>::Report(report);
        if let Err(e) = self.mesh.send_to(LEADER_RANK, &frame, send_by).await {
            return Err(self.cannot_send(round, e));
        }
        let MeshFrame::Report(own) = frame else {
            return Err(ControlError::Protocol {
                round,
                message: "relay frame changed kind".into(),
            });
        };
        let encoded = match self.next_from_leader(wait_by, patience, round).await? {
            FromLeader::All(encoded) => encoded,
            FromLeader::Agreed => return Err(leader_error(round, "agreed before gathering")),
        };
        let all = self.decode_gathered(round, own, &encoded)?;
        let confirm = MeshFrame::<GatheredReport>::Gathered(round);
        if let Err(e) = self.mesh.send_to(LEADER_RANK, &confirm, send_by).await {
            return Err(self.cannot_send(round, e));
        }
        match self.next_from_leader(wait_by, patience, round).await? {
            FromLeader::Agreed => Ok(all),
            FromLeader::All(_) => Err(leader_error(round, "sent a second gathered set")),
        }
    }

    /// The next frame from the leader, taking every other event on the way: an Abort from
    /// any rank fails the round with its cause; a close of a rank other than the leader is
    /// noted (see the module doc).
    async fn next_from_leader(
        &mut self,
        wait_by: Instant,
        patience: std::time::Duration,
        round: u64,
    ) -> Result<FromLeader, ControlError> {
        let deadline_ms = patience.as_millis() as u64;
        loop {
            let (peer, ev) = self
                .next_within(wait_by, deadline_ms, round, LEADER_RANK as usize)
                .await?;
            let bad = |detail: String| ControlError::Frame {
                rank: peer,
                round,
                detail,
            };
            match ev {
                PeerEvent::Frame(MeshFrame::Abort(e)) => return Err(e),
                PeerEvent::Frame(MeshFrame::All(all)) if peer == LEADER_RANK => {
                    return Ok(FromLeader::All(all))
                }
                PeerEvent::Frame(MeshFrame::Agreed(r)) if peer == LEADER_RANK => {
                    if r != round {
                        return Err(bad(format!("agreement of round {r}")));
                    }
                    return Ok(FromLeader::Agreed);
                }
                PeerEvent::Frame(MeshFrame::Report(r)) => {
                    return Err(bad(format!(
                        "report for round {} sent to a rank that does not lead the star",
                        r.round
                    )))
                }
                PeerEvent::Frame(MeshFrame::Gathered(r)) => {
                    return Err(bad(format!(
                        "confirmation of round {r} sent to a rank that does not lead the star"
                    )))
                }
                PeerEvent::Frame(MeshFrame::All(_) | MeshFrame::Agreed(_)) => {
                    return Err(bad("a leader's frame from a rank that does not lead".into()))
                }
                PeerEvent::Closed(detail) if peer != LEADER_RANK => {
                    if self.gone[peer as usize].is_none() {
                        self.gone[peer as usize] = Some(detail);
                    }
                }
                PeerEvent::Closed(detail) => {
                    return Err(ControlError::Disconnected {
                        rank: peer,
                        round,
                        detail,
                    })
                }
                PeerEvent::Bad(e) => return Err(bad(e.to_string())),
            }
        }
    }

    /// The gathered set: one report of `round` per rank, in rank order; this rank's own
    /// slot is not decoded (it kept its report).
    fn decode_gathered(
        &self,
        round: u64,
        own: GatheredReport,
        encoded: &[bytes::Bytes],
    ) -> Result<Vec<GatheredReport>, ControlError> {
        let world = self.mesh.world() as usize;
        let me = self.mesh.rank() as usize;
        if encoded.len() != world {
            return Err(leader_error(
                round,
                &format!("gathered {} reports in a world of {world}", encoded.len()),
            ));
        }
        let mut own = Some(own);
        let mut all = Vec::with_capacity(world);
        for (i, bytes) in encoded.iter().enumerate() {
            if i == me {
                if let Some(r) = own.take() {
                    all.push(r);
                }
                continue;
            }
            let r: GatheredReport = messages::decode(bytes).map_err(|e| {
                leader_error(
                    round,
                    &format!("gathered set holds a malformed report at position {i}: {e}"),
                )
            })?;
            if r.rank != i as u32 || r.round != round {
                return Err(leader_error(
                    round,
                    &format!(
                        "gathered set holds rank {} round {} at position {i}",
                        r.rank, r.round
                    ),
                ));
            }
            all.push(r);
        }
        Ok(all)
    }
}

fn leader_error(round: u64, detail: &str) -> ControlError {
    ControlError::Frame {
        rank: LEADER_RANK,
        round,
        detail: detail.to_string(),
    }
}
