//! What applying a round (or a planning call) tells the scheduler: which rows to publish,
//! which Host references to release, which waits ended and why, which references are
//! quarantined, which candidates to re-offer and which cancellations to emit. Effects are
//! plain data in a deterministic order; the manager never acts on Host memory itself.

use super::backup::BackupCandidate;
use super::lease::WaitEnd;
use super::HostRef;
use messages::{HostRange, OperationId, RequestId, StorageCancelOp, StorageKey};

/// A GET row that fully succeeded and retired on every owner, for an attached request: the
/// cache owner publishes a Host entry for `key` in `host`. The ticket keeps the reference
/// as the request's Ready hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishRow {
    pub op: OperationId,
    pub request: RequestId,
    pub key_index: usize,
    pub key: StorageKey,
    pub host: HostRef,
    pub range: HostRange,
}

/// An attached QUERY's agreed existence mask (one entry per key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryResult {
    pub request: RequestId,
    pub op: OperationId,
    pub keys: Vec<StorageKey>,
    pub exists: Vec<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoundEffects {
    pub publish: Vec<PublishRow>,
    /// References the manager no longer holds (each entry is one reference to unpin).
    pub release: Vec<HostRef>,
    /// PUT rows rejected for capacity: re-queued as candidates (listed for visibility).
    pub reoffer: Vec<BackupCandidate>,
    pub query_results: Vec<QueryResult>,
    pub waits_ended: Vec<(RequestId, WaitEnd)>,
    /// Ready holds that expired this round.
    pub ready_expired: Vec<RequestId>,
    /// References newly kept forever by an unretired result.
    pub quarantined: Vec<HostRef>,
    /// Cancellations to put in plan.cache for detached, still-outstanding reads.
    pub cancels: Vec<StorageCancelOp>,
    /// Tickets settled (credits returned) by this step.
    pub settled: Vec<OperationId>,
    /// Keys whose create-only PUT succeeded on every owner.
    pub backed_up: Vec<StorageKey>,
    /// Keys newly entered into negative metadata.
    pub negative: Vec<StorageKey>,
    /// Backup candidates that left the queue without a PUT (dropped or coalesced): their
    /// nonowning references may be forgotten (nothing to unpin).
    pub forgotten: Vec<HostRef>,
}

impl RoundEffects {
    /// No effect at all (every list empty): a quiet round's effects. The destructuring
    /// names every field, so a new list cannot be forgotten here.
    pub fn is_empty(&self) -> bool {
        let Self {
            publish,
            release,
            reoffer,
            query_results,
            waits_ended,
            ready_expired,
            quarantined,
            cancels,
            settled,
            backed_up,
            negative,
            forgotten,
        } = self;
        publish.is_empty()
            && release.is_empty()
            && reoffer.is_empty()
            && query_results.is_empty()
            && waits_ended.is_empty()
            && ready_expired.is_empty()
            && quarantined.is_empty()
            && cancels.is_empty()
            && settled.is_empty()
            && backed_up.is_empty()
            && negative.is_empty()
            && forgotten.is_empty()
    }
    /// Empties every list, keeping its capacity, so the next round's effects reuse the
    /// buffers (a list grown past `RECYCLED_CAPACITY` by a burst is shrunk back to it).
    pub fn clear(&mut self) {
        let Self {
            publish,
            release,
            reoffer,
            query_results,
            waits_ended,
            ready_expired,
            quarantined,
            cancels,
            settled,
            backed_up,
            negative,
            forgotten,
        } = self;
        recycle(publish);
        recycle(release);
        recycle(reoffer);
        recycle(query_results);
        recycle(waits_ended);
        recycle(ready_expired);
        recycle(quarantined);
        recycle(cancels);
        recycle(settled);
        recycle(backed_up);
        recycle(negative);
        recycle(forgotten);
    }
    /// Moves `other`'s entries to the end of these lists; both keep their buffers (the
    /// deferred effects move into the recycled report this way, allocating nothing).
    pub fn move_from(&mut self, other: &mut RoundEffects) {
        let Self {
            publish,
            release,
            reoffer,
            query_results,
            waits_ended,
            ready_expired,
            quarantined,
            cancels,
            settled,
            backed_up,
            negative,
            forgotten,
        } = other;
        self.publish.append(publish);
        self.release.append(release);
        self.reoffer.append(reoffer);
        self.query_results.append(query_results);
        self.waits_ended.append(waits_ended);
        self.ready_expired.append(ready_expired);
        self.quarantined.append(quarantined);
        self.cancels.append(cancels);
        self.settled.append(settled);
        self.backed_up.append(backed_up);
        self.negative.append(negative);
        self.forgotten.append(forgotten);
    }
}

/// The most entries a recycled list keeps room for (a burst's buffers are given back).
pub const RECYCLED_CAPACITY: usize = 4096;

fn recycle<T>(list: &mut Vec<T>) {
    list.clear();
    list.shrink_to(RECYCLED_CAPACITY);
}
