//! A request's life after admission and its ends: the prefill digest (the first token),
//! the decode step (one token per round), finishing and aborting (Device references and
//! scratch slots released, counters, client events).
//!
//! It never allocates cache resources or plans storage: an abort only queues the cancel of
//! the request's wait as a hand-back for the StorageTransferManager. It never performs I/O.

use super::request::RequestState;
use super::{RequestEvent, Scheduler};
use crate::device::DecodeStep;
use crate::model::sampling::sample;
use crate::model::{DecodeState, RankDigest};
use crate::storage_transfer::HandBack;
use messages::{RequestId, SamplingParams, TokenLogprobs};

/// The token a device drew: every rank's part names the same token at the same position.
fn drawn_token(parts: &[RankDigest], vocab: u32) -> Result<u32, String> {
    let first = parts.first().ok_or("no rank digests")?;
    if parts.len() != first.shard.count as usize {
        return Err(format!(
            "{} rank digests for {} shards",
            parts.len(),
            first.shard.count
        ));
    }
    if parts
        .iter()
        .any(|p| p.value != first.value || p.tokens != first.tokens)
    {
        return Err("ranks drew different tokens".into());
    }
    u32::try_from(first.value)
        .ok()
        .filter(|t| *t < vocab)
        .ok_or_else(|| format!("drawn token {} outside the vocabulary", first.value))
}

impl Scheduler {
    /// A forward step's digests arrived (every rank's part): the next token is drawn —
    /// from the reduced digest by the synthetic model, or read from the digest where the
    /// device drew it — and emitted.
    pub(super) fn apply_digest(
        &mut self,
        id: RequestId,
        parts: &[RankDigest],
        logprobs: Option<TokenLogprobs>,
    ) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        match (&r.state, self.device_draws) {
            (RequestState::Prefill, _) | (RequestState::Stepping, true) => {}
            _ => return,
        }
        if self.device_draws {
            match drawn_token(parts, self.model.profile().vocab) {
                Ok(tok) => self.emit_token(id, tok, logprobs, DecodeState::default(), false),
                Err(e) => self.abort(id, &format!("rank digests disagree: {e}")),
            }
            return;
        }
        match self.model.reduce_ranks(parts) {
            Ok(reduced) => {
                let state = self.model.first_state(reduced);
                let (tok, lp) = self.draw(state, &r.sampling, 0);
                self.emit_token(id, tok, lp, state, true);
            }
            Err(e) => self.abort(id, &format!("rank digests disagree: {e}")),
        }
    }

    /// The synthetic model's token at `state` for output position `step`: the greedy token
    /// without building scores when the request neither samples nor asks for
    /// log-probabilities.
    fn draw(
        &self,
        state: DecodeState,
        sampling: &SamplingParams,
        step: u64,
    ) -> (u32, Option<TokenLogprobs>) {
        if !sampling.needs_scores() {
            return (self.model.greedy_token(state), None);
        }
        let s = sample(&self.model.scores(state), sampling, step);
        (s.token, s.logprobs)
    }

    /// A request's next token: emitted, then the request finishes at `max_tokens` or decodes
    /// on from `state` (`fresh`: the token came from this round's digest).
    fn emit_token(
        &mut self,
        id: RequestId,
        tok: u32,
        logprobs: Option<TokenLogprobs>,
        state: DecodeState,
        fresh: bool,
    ) {
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        r.output.push(tok);
        self.events.push(RequestEvent::Token(id, tok, logprobs));
        if r.output.len() as u32 >= r.max_tokens {
            self.finish(id);
        } else {
            r.state = RequestState::Decode {
                state,
                last: tok,
                fresh,
            };
        }
    }

    /// One decode step for every decoding request (one token per round): drawn here by the
    /// synthetic model, or planned as a device decode step when the device draws.
    pub(super) fn decode_step(&mut self) {
        // At most max_running IDs: the running set, not the live requests.
        let ids: Vec<RequestId> = self.running.iter().copied().collect();
        for id in ids {
            let Some(r) = self.requests.get_mut(&id) else {
                continue;
            };
            let RequestState::Decode { state, last, fresh } = r.state else {
                continue;
            };
            let context = (r.prompt.len() + r.output.len()) as u64;
            if self.device_draws {
                // The token at position `context - 1` is fed; the next one is drawn there.
                r.state = RequestState::Stepping;
                self.device_decodes.push((
                    id,
                    DecodeStep {
                        token: last,
                        position: context - 1,
                        sampling: r.sampling,
                        output_index: r.output.len() as u64,
                    },
                ));
                continue;
            }
            if fresh {
                // The first token came from this round's digest; decode starts next round.
                r.state = RequestState::Decode {
                    state,
                    last,
                    fresh: false,
                };
                continue;
            }
            let step = r.output.len() as u64;
            let sampling = r.sampling;
            let next = self.model.next_state(state, last);
            let (tok, lp) = self.draw(next, &sampling, step);
            self.decode_contexts.push(context);
            self.emit_token(id, tok, lp, next, false);
        }
    }

    fn release_running(&mut self, id: RequestId) {
        if self.running.remove(&id) && self.device_draws {
            self.device_released.push(id);
        }
        let Some(r) = self.requests.get_mut(&id) else {
            return;
        };
        let refs = std::mem::take(&mut r.device_refs);
        let scratch = std::mem::take(&mut r.scratch);
        for a in refs {
            let _ = self.cache.device_mut().release(a);
        }
        self.free_scratch.extend(scratch);
    }

    fn finish(&mut self, id: RequestId) {
        self.release_running(id);
        if let Some(mut r) = self.requests.remove(&id) {
            r.state = RequestState::Finished;
            self.trace.request_ended(id, "finished");
            self.stats.finished += 1;
            self.stats.fallback[r.fallback.index()] += 1;
            self.events.push(RequestEvent::Finished {
                id,
                split: r.split,
                fallback: r.fallback,
            });
        }
    }

    /// Aborts a request in any state; storage references stay with the manager.
    pub fn abort(&mut self, id: RequestId, why: &str) {
        let Some(r) = self.requests.get(&id) else {
            return;
        };
        let prefetching = matches!(r.state, RequestState::Prefetching { .. });
        if prefetching || r.resources.ready.is_some() {
            self.handbacks.push(HandBack::Cancel(id));
        }
        self.release_running(id);
        self.queue.remove(&id);
        if let Some(mut r) = self.requests.remove(&id) {
            r.state = RequestState::Aborted;
            self.trace.request_ended(id, "aborted");
            self.stats.aborted += 1;
            self.events.push(RequestEvent::Aborted(id, why.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::{AgreedInputs, RequestEvent};
    use crate::frontend::FallbackReason;
    use crate::model::RankDigest;
    use messages::{RequestId, StorageOp};

    #[test]
    fn aborting_a_prefetching_request_cancels_its_storage_wait() {
        let mut rig = rig(true);
        let p = prompt(32, 1);
        let plan = rig.arrive(&[(1, &p, 2)]);
        let [StorageOp::Query(q)] = &plan.storage[..] else {
            panic!("{:?}", plan.storage);
        };
        let op = q.op;
        rig.apply(Default::default());
        rig.s.abort(RequestId(1), "test");
        assert_eq!(rig.s.state_of(RequestId(1)), None);
        assert_eq!(
            rig.s.drain_events(),
            vec![RequestEvent::Aborted(RequestId(1), "test".into())]
        );
        // Within the round (as an admission failure aborts): the same plan cancels it.
        let plan = rig.plan();
        assert!(
            plan.storage
                .iter()
                .any(|o| matches!(o, StorageOp::Cancel(c) if c.op == op)),
            "{:?}",
            plan.storage
        );
    }

    #[test]
    fn aborting_an_unknown_request_does_nothing() {
        let mut rig = rig(false);
        rig.s.abort(RequestId(9), "nobody");
        assert!(rig.s.drain_events().is_empty());
        assert_eq!(rig.s.stats().aborted, 0);
    }

    #[test]
    fn finishing_counts_the_fallback_reason() {
        let mut rig = rig(false);
        let p = prompt(12, 2);
        let events = serve_one(&mut rig, 1, &p);
        let Some(RequestEvent::Finished { fallback, .. }) = finished(&events, 1) else {
            panic!("{events:?}");
        };
        assert_eq!(*fallback, FallbackReason::Disabled);
        assert_eq!(rig.s.stats().fallback[fallback.index()], 1);
        assert!(rig.s.running.is_empty());
        assert_eq!(
            rig.s.free_scratch.len(),
            rig.s.cfg.layout.scratch_slots as usize
        );
    }

    fn tokens_of(events: &[RequestEvent]) -> Vec<(u32, Option<messages::TokenLogprobs>)> {
        events
            .iter()
            .filter_map(|e| match e {
                RequestEvent::Token(_, t, lp) => Some((*t, lp.clone())),
                _ => None,
            })
            .collect()
    }

    /// Runs request 1 (`sampling`, 5 tokens) on a storage-disabled rig; its tokens.
    fn run_sampled(
        device_draws: bool,
        sampling: messages::SamplingParams,
    ) -> (Vec<(u32, Option<messages::TokenLogprobs>)>, Vec<RequestId>) {
        let mut rig = rig(false);
        if device_draws {
            rig.s = std::mem::replace(&mut rig.s, super::super::tests::rig(false).s)
                .with_device_draws();
        }
        let p = prompt(10, 3);
        let plan = rig.round(AgreedInputs {
            new_requests: vec![super::super::NewRequest {
                id: RequestId(1),
                prompt: p,
                max_tokens: 5,
                sampling,
            }],
            ..AgreedInputs::default()
        });
        assert_eq!(plan.forwards.len(), 1);
        assert_eq!(plan.forwards[0].1.sampling, sampling, "the step carries it");
        rig.d2h_done();
        let mut digests = digests_of(&plan);
        let mut events = vec![];
        let mut released = vec![];
        for round in 0..12 {
            let plan = rig.round(AgreedInputs {
                digests: std::mem::take(&mut digests),
                ..AgreedInputs::default()
            });
            events.extend(rig.s.drain_events());
            released.extend(plan.released.iter().copied());
            if device_draws {
                // each decode step's digest names the drawn token (here: 100 + round)
                for (id, step) in &plan.decodes {
                    assert_eq!(step.sampling, sampling);
                    digests.push((
                        *id,
                        vec![RankDigest {
                            shard: messages::Shard::SINGLE,
                            tokens: step.position + 1,
                            value: 100 + round,
                        }],
                    ));
                }
            } else {
                assert!(plan.decodes.is_empty() && plan.released.is_empty());
            }
            if finished(&events, 1).is_some() {
                break;
            }
        }
        released.extend(rig.plan().released);
        assert!(rig.plan().released.is_empty(), "released once");
        (tokens_of(&events), released)
    }

    #[test]
    fn greedy_logprobs_name_the_greedy_token_and_sampling_is_seeded() {
        use messages::SamplingParams;
        let (greedy, released) = run_sampled(false, SamplingParams::GREEDY);
        assert!(
            released.is_empty(),
            "the synthetic model keeps no device state"
        );
        assert_eq!(greedy.len(), 5);
        assert!(greedy.iter().all(|(_, lp)| lp.is_none()));
        let with_lp = SamplingParams {
            logprobs: Some(3),
            ..SamplingParams::GREEDY
        };
        let (lp, _) = run_sampled(false, with_lp);
        // the same tokens, each the most likely of its top list
        assert_eq!(
            lp.iter().map(|t| t.0).collect::<Vec<_>>(),
            greedy.iter().map(|t| t.0).collect::<Vec<_>>()
        );
        for (t, l) in &lp {
            let l = l.as_ref().unwrap();
            assert_eq!(l.top_len(), 3);
            assert_eq!(l.top().next().unwrap().0, *t);
        }
        let warm = SamplingParams {
            temperature: 1.5,
            seed: 9,
            ..SamplingParams::GREEDY
        };
        let (a, _) = run_sampled(false, warm);
        let (b, _) = run_sampled(false, warm);
        assert_eq!(a, b, "a seed reproduces");
        let (c, _) = run_sampled(false, SamplingParams { seed: 10, ..warm });
        assert_ne!(a, c);
        assert_ne!(
            a.iter().map(|t| t.0).collect::<Vec<_>>(),
            greedy.iter().map(|t| t.0).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_device_drawing_backend_gets_one_decode_step_per_token_and_a_release() {
        let (tokens, released) = run_sampled(true, messages::SamplingParams::GREEDY);
        // the prefill digest's value (the request ID, 1) is the first token; its decode
        // step is planned in the same round (round 0 draws 100), one token per round
        assert_eq!(
            tokens.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 100, 101, 102, 103]
        );
        // the finished request's device state is released, once
        assert_eq!(released, vec![RequestId(1)]);
    }

    /// Every rank's part must name the same token at the same position (either alone
    /// differing is refused), and the token must lie inside the vocabulary (its last
    /// entry is `vocab - 1`).
    #[test]
    fn the_drawn_token_is_checked_across_ranks_and_against_the_vocabulary() {
        let part = |index, tokens, value| RankDigest {
            shard: messages::Shard { index, count: 2 },
            tokens,
            value,
        };
        assert_eq!(
            super::drawn_token(&[part(0, 5, 9), part(1, 5, 9)], 10),
            Ok(9)
        );
        for other in [part(1, 6, 9), part(1, 5, 8)] {
            let e = super::drawn_token(&[part(0, 5, 9), other], 1000).unwrap_err();
            assert!(e.contains("different tokens"), "{e}");
        }
        let e = super::drawn_token(&[part(0, 5, 10), part(1, 5, 10)], 10).unwrap_err();
        assert!(e.contains("vocabulary"), "{e}");
        let e = super::drawn_token(&[part(0, 5, 9)], 10).unwrap_err();
        assert!(e.contains("1 rank digests for 2 shards"), "{e}");
    }

    #[test]
    fn a_drawn_token_outside_the_vocabulary_aborts_the_request() {
        let mut rig = rig(false);
        rig.s =
            std::mem::replace(&mut rig.s, super::super::tests::rig(false).s).with_device_draws();
        let p = prompt(10, 3);
        let plan = rig.arrive(&[(1, &p, 3)]);
        rig.d2h_done();
        let mut d = digests_of(&plan);
        d[0].1[0].value = u64::from(u32::MAX) + 7;
        rig.apply(AgreedInputs {
            digests: d,
            ..AgreedInputs::default()
        });
        let events = rig.s.drain_events();
        assert!(
            matches!(&events[..], [RequestEvent::Aborted(_, why)] if why.contains("vocabulary")),
            "{events:?}"
        );
        assert_eq!(rig.plan().released, vec![RequestId(1)]);
    }
}
