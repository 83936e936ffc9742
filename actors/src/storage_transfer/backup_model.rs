//! The `BackupQueue` against a model of what it promises, step by step: the queued
//! candidates in order, which keys are queued, which PUTs of which clear epoch cover a key,
//! every offer's outcome, the drop and coalesce counts, the references it hands back to be
//! forgotten, and that a key's record lasts exactly while the key is queued or carried.
//! Random sequences over a few keys, a small capacity and a few clear epochs, used as the
//! manager uses them: offers and dispatches in the current epoch, which only a clear (all
//! queued candidates dropped) moves on; a PUT's completion in the epoch it was made in.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const CAPACITY: u32 = 3;
const KEYS: u128 = 5;
/// Epochs a completion may look back (a PUT outlives at most this many clears here).
const BACK: u64 = 2;

#[derive(Default)]
struct Model {
    queue: VecDeque<BackupCandidate>,
    /// Per key: the clear epoch of the PUTs that carry it and how many do.
    pending: HashMap<BackupKey, (u64, u32)>,
    dropped: [u64; 5],
    coalesced: u64,
    forgotten: Vec<HostRef>,
}

impl Model {
    fn queued(&self, k: &BackupKey) -> bool {
        self.queue.iter().any(|c| c.key == *k)
    }

    fn pending_in(&self, k: &BackupKey, epoch: u64) -> bool {
        self.pending
            .get(k)
            .is_some_and(|&(e, n)| n > 0 && e == epoch)
    }

    fn offer(&mut self, c: BackupCandidate, epoch: u64) -> OfferOutcome {
        if self.queued(&c.key) || self.pending_in(&c.key, epoch) {
            self.coalesced += 1;
            self.forgotten.push(c.host);
            return OfferOutcome::Coalesced;
        }
        let mut outcome = OfferOutcome::Queued;
        if self.queue.len() >= CAPACITY as usize {
            let oldest = self.queue.pop_front().expect("a full queue");
            self.dropped[DropReason::Overflow.index()] += 1;
            self.forgotten.push(oldest.host);
            outcome = OfferOutcome::QueuedDroppedOldest;
        }
        self.queue.push_back(c);
        outcome
    }
}

#[derive(Clone, Debug)]
enum Step {
    Offer(u128, u32),
    PopFront,
    /// Dispatch of the oldest candidate; whether the recheck takes it.
    Dispatch(bool),
    /// A PUT made this many clears ago completed for the key.
    Unpend(u128, u32, u64),
    /// Every queued candidate dropped for a reason (the epoch stays).
    DropAll(usize),
    /// A clear: the queue dropped for cleanup, the next epoch begins.
    Clear,
    Forget,
    Reserve(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0..KEYS, 0u32..2).prop_map(|(k, p)| Step::Offer(k, p)),
        1 => Just(Step::PopFront),
        4 => any::<bool>().prop_map(Step::Dispatch),
        3 => (0..KEYS, 0u32..2, 0..=BACK).prop_map(|(k, p, b)| Step::Unpend(k, p, b)),
        1 => (0usize..5).prop_map(Step::DropAll),
        1 => Just(Step::Clear),
        1 => Just(Step::Forget),
        1 => (0usize..8).prop_map(Step::Reserve),
    ]
}

fn key(k: u128, page: u32) -> BackupKey {
    BlockPage {
        hash: k,
        group: 0,
        page,
    }
}

fn every_key() -> impl Iterator<Item = BackupKey> {
    (0..KEYS).flat_map(|k| (0..2).map(move |p| key(k, p)))
}

fn observe(q: &mut BackupQueue, m: &mut Model, epoch: u64, ctx: &str) {
    assert_eq!(
        q.candidates(),
        Vec::from(m.queue.clone()),
        "{ctx}: the queue"
    );
    assert_eq!(q.len(), m.queue.len());
    assert_eq!(q.is_empty(), m.queue.is_empty());
    let mut records = 0;
    for k in every_key() {
        assert_eq!(q.contains_key(&k), m.queued(&k), "{ctx}: {k:?} queued");
        for e in epoch.saturating_sub(BACK)..=epoch + 1 {
            assert_eq!(
                q.put_pending(&k, e),
                m.pending_in(&k, e),
                "{ctx}: {k:?} pending in epoch {e}"
            );
        }
        if m.queued(&k) || m.pending.get(&k).is_some_and(|&(_, n)| n > 0) {
            records += 1;
        }
    }
    assert_eq!(
        q.keys.len(),
        records,
        "{ctx}: one record per live key, no more"
    );
    assert_eq!(q.dropped_all(), m.dropped, "{ctx}: drops");
    for r in DropReason::ALL {
        assert_eq!(q.dropped(r), m.dropped[r.index()]);
    }
    assert_eq!(q.coalesced(), m.coalesced, "{ctx}: coalesced");
    let mut forgotten = vec![HostRef(u64::MAX)];
    q.drain_forgotten_into(&mut forgotten);
    assert_eq!(forgotten[0], HostRef(u64::MAX), "appended, not replaced");
    assert_eq!(
        forgotten[1..],
        m.forgotten[..],
        "{ctx}: forgotten references"
    );
    m.forgotten.clear();
}

fn run(steps: &[Step]) {
    let mut q = BackupQueue::new(CAPACITY);
    let mut m = Model::default();
    let mut host = 0u64;
    let mut epoch = 0u64;
    for (i, st) in steps.iter().enumerate() {
        let ctx = format!("step {i}: {st:?}");
        match *st {
            Step::Offer(k, p) => {
                host += 1;
                let c = BackupCandidate {
                    key: key(k, p),
                    host: HostRef(host),
                };
                assert_eq!(q.offer(c.clone(), epoch), m.offer(c, epoch), "{ctx}");
            }
            Step::PopFront => {
                assert_eq!(q.pop_front(), m.queue.pop_front(), "{ctx}");
            }
            Step::Dispatch(take) => {
                let e = epoch;
                let mut asked = None;
                let got = q.dispatch_front(e, |c| {
                    asked = Some(c.clone());
                    take.then_some(c.host)
                });
                let want = m.queue.pop_front().map(|c| {
                    if take {
                        let p = m.pending.entry(c.key).or_insert((e, 0));
                        *p = if p.0 == e { (e, p.1 + 1) } else { (e, 1) };
                    }
                    let host = c.host;
                    (c, take.then_some(host))
                });
                assert_eq!(asked, want.as_ref().map(|(c, _)| c.clone()), "{ctx}");
                assert_eq!(got, want, "{ctx}");
            }
            Step::Unpend(k, p, back) => {
                let k = key(k, p);
                let e = epoch.saturating_sub(back);
                if m.pending_in(&k, e) {
                    if let Some(p) = m.pending.get_mut(&k) {
                        p.1 -= 1;
                    }
                }
                q.unpend(&k, e);
            }
            Step::DropAll(_) | Step::Clear => {
                let reason = match *st {
                    Step::DropAll(r) => DropReason::ALL[r],
                    _ => DropReason::Cleanup,
                };
                let n = m.queue.len() as u64;
                m.forgotten.extend(m.queue.drain(..).map(|c| c.host));
                m.dropped[reason.index()] += n;
                assert_eq!(q.drop_all(reason), n, "{ctx}");
                if matches!(st, Step::Clear) {
                    epoch += 1;
                }
            }
            Step::Forget => {
                host += 1;
                q.forget(HostRef(host));
                m.forgotten.push(HostRef(host));
            }
            Step::Reserve(n) => q.reserve(n),
        }
        observe(&mut q, &mut m, epoch, &ctx);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_backup_queue_keeps_every_promise_of_its_model(
        steps in proptest::collection::vec(step(), 1..80)
    ) {
        run(&steps);
    }
}

#[test]
fn a_key_carried_by_an_older_epoch_is_queued_again_and_counted_in_the_new_one() {
    use Step::*;
    // Key 1 is carried by a PUT of epoch 0 (an offer coalesces); after a clear it is
    // queued and carried again; the old PUT's completion leaves the new one counted.
    run(&[
        Offer(1, 0),
        Dispatch(true),
        Offer(1, 0),
        Clear,
        Offer(1, 0),
        Dispatch(true),
        Unpend(1, 0, 1),
        Offer(1, 0),
        Unpend(1, 0, 0),
        Offer(2, 0),
        Offer(3, 0),
        Offer(4, 0),
        Offer(0, 1),
        DropAll(1),
    ]);
}
