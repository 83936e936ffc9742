//! The leader's client registry: request IDs (unique across processes), each request's
//! event sender, the admin replies waiting in arrival order, and each request's start time
//! (for TTFT). `collect` turns the frontend inbox into the frontend messages of the
//! leader's next report, `deliver` answers the round's request events. It never decides
//! admission or touches the cache; it only translates between the HTTP side and the round.

use super::{AdminSubmission, FrontendInbox, PrefixUsage, Submission, TokenEvent};
use crate::metrics::Metrics;
use crate::scheduler::RequestEvent;
use messages::{FrontendMessage, RequestId};
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// Requests one inbox poll takes into a round at most (the rest wait for the next round).
const SUBMISSIONS_PER_ROUND: usize = 256;

/// Bits of a request ID that count requests within one process.
const SEQUENCE_BITS: u32 = 40;

/// Request IDs unique across processes: a random instance tag above a per-process sequence
/// (2^40 requests per process), so IDs in traces and logs of two engine hosts never
/// collide, and IDs still grow in arrival order within one process.
#[derive(Debug)]
pub struct RequestIds {
    tag: u64,
    next: u64,
}

impl RequestIds {
    pub fn new() -> Self {
        // Never zero: an ID is never 0 or a small integer a test or a tool might reuse.
        let tag = (rand::random::<u64>() >> (SEQUENCE_BITS + 1)).max(1);
        Self::with_tag(tag)
    }
    pub fn with_tag(tag: u64) -> Self {
        Self { tag, next: 1 }
    }
    pub fn next_id(&mut self) -> RequestId {
        let id = (self.tag << SEQUENCE_BITS) | (self.next & ((1 << SEQUENCE_BITS) - 1));
        self.next += 1;
        RequestId(id)
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        Self::new()
    }
}

type AdminReply = flume::Sender<Result<String, String>>;

#[derive(Debug, Default)]
pub struct Clients {
    ids: RequestIds,
    pending: BTreeMap<RequestId, flume::Sender<TokenEvent>>,
    admin: VecDeque<AdminReply>,
    started: BTreeMap<RequestId, Instant>,
    /// Submissions that arrived while stopping, answered after the round's exchange: with
    /// "shutting down" when it succeeds, or with the replica's failure when it fails (a
    /// rank lost just before the stop is the cause a client must see).
    refused: Vec<flume::Sender<TokenEvent>>,
}

impl Clients {
    pub fn new(ids: RequestIds) -> Self {
        Self {
            ids,
            ..Self::default()
        }
    }

    /// Requests the engine holds for a client.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The leader's frontend messages of the next round: cancellations of clients that went
    /// away, new requests and admin commands, in arrival order. While `stopping`, a new
    /// request is held for `refuse_stopping` (or `fail_all`) instead of entering the round.
    pub fn collect(&mut self, inbox: &FrontendInbox, stopping: bool) -> Vec<FrontendMessage> {
        let mut out: Vec<FrontendMessage> = self
            .pending
            .iter()
            .filter(|(_, tx)| tx.is_disconnected())
            .map(|(id, _)| FrontendMessage::Cancel { id: *id })
            .collect();
        for _ in 0..SUBMISSIONS_PER_ROUND {
            let Ok(Submission {
                prompt,
                max_tokens,
                sampling,
                events,
            }) = inbox.submissions.try_recv()
            else {
                break;
            };
            if stopping {
                self.refused.push(events);
                continue;
            }
            let id = self.ids.next_id();
            self.pending.insert(id, events);
            self.started.insert(id, Instant::now());
            out.push(FrontendMessage::NewRequest {
                id,
                prompt,
                max_tokens,
                sampling,
            });
        }
        while let Ok(AdminSubmission { command, reply }) = inbox.admin.try_recv() {
            self.admin.push_back(reply);
            out.push(FrontendMessage::Admin(command));
        }
        out
    }

    /// Answers the round's request events (and observes each request's TTFT).
    pub fn deliver(&mut self, events: Vec<RequestEvent>, metrics: &Metrics) {
        for ev in events {
            match ev {
                RequestEvent::Token(id, t, logprobs) => {
                    if let Some(start) = self.started.remove(&id) {
                        metrics.ttft_seconds.observe(start.elapsed().as_secs_f64());
                    }
                    if let Some(tx) = self.pending.get(&id) {
                        let _ = tx.send(TokenEvent::Token(t, logprobs));
                    }
                }
                RequestEvent::Finished {
                    id,
                    split,
                    fallback,
                } => {
                    self.started.remove(&id);
                    if let Some(tx) = self.pending.remove(&id) {
                        let _ = tx.send(TokenEvent::Done {
                            usage: PrefixUsage {
                                device: split.device,
                                host: split.host,
                                l3: split.l3,
                                computed: split.computed,
                                fallback_reason: fallback,
                            },
                            finish_reason: "length",
                        });
                    }
                }
                RequestEvent::Aborted(id, why) => {
                    self.started.remove(&id);
                    if let Some(tx) = self.pending.remove(&id) {
                        let _ = tx.send(TokenEvent::Failed(why));
                    }
                }
            }
        }
    }

    /// Answers the oldest waiting admin command (commands apply one at a time in arrival
    /// order).
    pub fn answer_admin(&mut self, result: Result<String, String>) {
        if let Some(tx) = self.admin.pop_front() {
            let _ = tx.send(result);
        }
    }

    /// Fails every request and admin command the registry holds, and (with `inbox`) those
    /// still queued in the inbox.
    /// Answers the requests that arrived while stopping: the round agreed without them, so
    /// the replica is whole and only shutting down.
    pub fn refuse_stopping(&mut self) {
        for tx in self.refused.drain(..) {
            let _ = tx.send(TokenEvent::Failed(
                "the engine host is shutting down".into(),
            ));
        }
    }

    pub fn fail_all(&mut self, why: &str, inbox: Option<&FrontendInbox>) {
        let pending = std::mem::take(&mut self.pending).into_values();
        for tx in pending.chain(self.refused.drain(..)) {
            let _ = tx.send(TokenEvent::Failed(why.to_string()));
        }
        self.started.clear();
        for tx in self.admin.drain(..) {
            let _ = tx.send(Err(why.to_string()));
        }
        if let Some(inbox) = inbox {
            while let Ok(sub) = inbox.submissions.try_recv() {
                let _ = sub.events.send(TokenEvent::Failed(why.to_string()));
            }
            while let Ok(a) = inbox.admin.try_recv() {
                let _ = a.reply.send(Err(why.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::AdminCommand;
    use crate::metrics::MetricLabels;
    use crate::scheduler::request::PrefixSplit;

    /// The HTTP side's ends of an inbox: (submissions, admin commands).
    type Senders = (flume::Sender<Submission>, flume::Sender<AdminSubmission>);

    fn rig() -> (Senders, FrontendInbox) {
        let (stx, submissions) = flume::bounded(8);
        let (atx, admin) = flume::bounded(8);
        (
            (stx, atx),
            FrontendInbox {
                submissions,
                admin,
                wake: Default::default(),
            },
        )
    }

    fn submit(s: &Senders, prompt: Vec<u32>) -> flume::Receiver<TokenEvent> {
        let (events, rx) = flume::unbounded();
        s.0.send(Submission {
            prompt,
            max_tokens: 2,
            sampling: messages::SamplingParams::GREEDY,
            events,
        })
        .unwrap();
        rx
    }

    #[test]
    fn request_ids_grow_in_arrival_order_and_differ_between_instances() {
        let mut a = RequestIds::with_tag(1);
        let mut b = RequestIds::with_tag(2);
        let (a1, a2, b1) = (a.next_id(), a.next_id(), b.next_id());
        assert!(a1 < a2);
        assert_ne!(a1, b1);
        assert_ne!(a2, b1);
        let (r1, r2) = (RequestIds::new(), RequestIds::new());
        assert!(r1.tag > 0 && r2.tag > 0);
        assert!(r1.tag < (1 << (64 - SEQUENCE_BITS)));
    }

    #[test]
    fn collect_delivers_and_fails_through_the_registry() {
        let (senders, inbox) = rig();
        let rx1 = submit(&senders, vec![1, 2, 3]);
        let rx2 = submit(&senders, vec![4, 5]);
        let (atx, arx) = flume::bounded(1);
        senders
            .1
            .send(AdminSubmission {
                command: AdminCommand::ClearCache,
                reply: atx,
            })
            .unwrap();
        let mut c = Clients::new(RequestIds::with_tag(7));
        let msgs = c.collect(&inbox, false);
        let ids: Vec<RequestId> = msgs
            .iter()
            .filter_map(|m| match m {
                FrontendMessage::NewRequest { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(ids.len(), 2);
        assert_eq!(
            msgs.last(),
            Some(&FrontendMessage::Admin(AdminCommand::ClearCache))
        );
        let metrics = Metrics::new(&MetricLabels {
            model: "m".into(),
            role: "r".into(),
            dp_rank: 0,
            tp_rank: 0,
            replica: "x".into(),
        })
        .unwrap();
        c.deliver(
            vec![
                RequestEvent::Token(ids[0], 42, None),
                RequestEvent::Finished {
                    id: ids[0],
                    split: PrefixSplit::default(),
                    fallback: crate::frontend::FallbackReason::None,
                },
            ],
            &metrics,
        );
        assert!(matches!(rx1.try_recv(), Ok(TokenEvent::Token(42, None))));
        assert!(matches!(rx1.try_recv(), Ok(TokenEvent::Done { .. })));
        assert_eq!(metrics.ttft_seconds.get_sample_count(), 1);
        assert_eq!(c.pending(), 1);
        // The second client goes away: the next collect cancels its request.
        drop(rx2);
        let msgs = c.collect(&inbox, false);
        assert_eq!(msgs, vec![FrontendMessage::Cancel { id: ids[1] }]);
        c.answer_admin(Ok("cleared".into()));
        assert_eq!(arx.try_recv().unwrap(), Ok("cleared".into()));
        // Failing: what the registry holds and what the inbox still queues.
        let rx3 = submit(&senders, vec![9]);
        c.fail_all("stopping", Some(&inbox));
        assert_eq!(c.pending(), 0);
        assert!(matches!(rx3.try_recv(), Ok(TokenEvent::Failed(_))));
        // While stopping, a new submission never enters the round; it is refused once the
        // round's exchange succeeded.
        let rx4 = submit(&senders, vec![9]);
        assert!(c.collect(&inbox, true).is_empty());
        assert!(rx4.try_recv().is_err(), "held until the round's exchange");
        c.refuse_stopping();
        match rx4.try_recv() {
            Ok(TokenEvent::Failed(why)) => assert!(why.contains("shutting down"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_refused_while_stopping_gets_the_failure_when_the_round_fails() {
        // A rank dies and launch stops the leader before the leader's round noticed: the
        // client is told the replica failed, not only that the host is shutting down.
        let (senders, inbox) = rig();
        let rx = submit(&senders, vec![1]);
        let mut c = Clients::new(RequestIds::with_tag(3));
        assert!(c.collect(&inbox, true).is_empty());
        c.fail_all(
            "the replica failed in round 9: peer rank 1 closed",
            Some(&inbox),
        );
        match rx.try_recv() {
            Ok(TokenEvent::Failed(why)) => assert!(why.contains("failed in round 9"), "{why}"),
            other => panic!("{other:?}"),
        }
        // Nothing is answered twice.
        c.refuse_stopping();
        assert!(rx.try_recv().is_err());
    }
}
