//! What applying a round (or a planning call) tells the scheduler: which rows to publish,
//! which Host references to release, which waits ended and why, which references are
//! quarantined, which candidates to re-offer and which cancellations to emit. Effects are
//! plain data in a deterministic order; the manager never acts on Host memory itself.

use super::backup::{BackupCandidate, BackupKey};
use super::lease::WaitEnd;
use super::HostRef;
use messages::{OperationId, RequestId, StorageCancelOp, StorageKey};

/// A GET row that fully succeeded and retired on every owner, for an attached request: the
/// cache owner publishes the Host entry its reference `host` names (row `key_index` of
/// GET `op`; the owner's reservation knows the row's key and range). The ticket keeps the
/// reference as the request's Ready hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishRow {
    pub op: OperationId,
    pub request: RequestId,
    pub key_index: usize,
    pub host: HostRef,
}

/// An attached QUERY's agreed existence mask (one entry per key, in the order the QUERY
/// carried its keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryResult {
    pub request: RequestId,
    pub op: OperationId,
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
    /// Host pages whose create-only PUT succeeded on every owner.
    pub backed_up: Vec<BackupKey>,
    /// Keys newly entered into negative metadata.
    pub negative: Vec<StorageKey>,
    /// Backup candidates that left the queue without a PUT (dropped or coalesced): their
    /// nonowning references may be forgotten (nothing to unpin).
    pub forgotten: Vec<HostRef>,
}

/// Calls `$apply!` with the name of every list of `RoundEffects`: the walks over all of
/// them name the lists here once. `_every_list_is_named` destructures with this list, so a
/// list added to the struct and not here does not compile.
macro_rules! each_list {
    ($apply:ident) => {
        $apply!(
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
            forgotten
        )
    };
}

fn _every_list_is_named(fx: RoundEffects) {
    macro_rules! destructure {
        ($($list:ident),*) => {
            let RoundEffects { $($list: _),* } = fx;
        };
    }
    each_list!(destructure);
}

impl RoundEffects {
    /// No effect at all (every list empty): a quiet round's effects.
    pub fn is_empty(&self) -> bool {
        macro_rules! all_empty {
            ($($list:ident),*) => { $(self.$list.is_empty())&&* };
        }
        each_list!(all_empty)
    }
    /// Empties every list, keeping its capacity, so the next round's effects reuse the
    /// buffers (a list grown past `RECYCLED_CAPACITY` by a burst is shrunk back to it).
    pub fn clear(&mut self) {
        macro_rules! recycle_all {
            ($($list:ident),*) => { $(recycle(&mut self.$list);)* };
        }
        each_list!(recycle_all);
    }
    /// Moves `other`'s entries to the end of these lists; both keep their buffers (the
    /// deferred effects move into the recycled report this way, allocating nothing).
    pub fn move_from(&mut self, other: &mut RoundEffects) {
        macro_rules! append_all {
            ($($list:ident),*) => { $(self.$list.append(&mut other.$list);)* };
        }
        each_list!(append_all);
    }
}

/// The most entries a recycled list keeps room for (a burst's buffers are given back).
pub const RECYCLED_CAPACITY: usize = 4096;

fn recycle<T>(list: &mut Vec<T>) {
    list.clear();
    list.shrink_to(RECYCLED_CAPACITY);
}
