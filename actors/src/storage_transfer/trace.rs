//! Storage-operation tracing: one `request` span per live request (the Scheduler's
//! RequestTrace) and one `storage_operation` span per issued QUERY/GET/PUT (the
//! StorageTransferManager's OperationTrace), from the committed plan to the agreed
//! completion and its ending (`publish`, `detach` or `quarantine`). A read's span is a child
//! of its request's span (the plan carries the parent); a backup PUT is a root span. The
//! operation's span is entered while the operation is submitted, so the executor's `l3_op`
//! span (queue, backend calls, completion) becomes its child.
//!
//! This module only observes: it never influences a scheduling decision, never reads a
//! clock, and never records an object key, prompt token or Host address (attributes are
//! op id, kind, key count, payload bytes, outcome and rank). With no subscriber interested
//! every span is `Span::none()` (tracing's disabled-callsite check) and no string is
//! formatted; with none able to enable an INFO span (`interested`) no span is built at all. The operation table holds only issued, not yet completed operations, so it
//! is bounded by the operation credits.

use super::RoundEffects;
use messages::{OperationId, RequestId, StorageDone, StorageOp, StorageOpKind};
use std::collections::BTreeMap;
use tracing::{field, info_span, Span};

/// Whether any subscriber could enable an INFO span (tracing's global maximum level over
/// every registered subscriber, scoped ones included): when none can, no span is built
/// at all, not even the disabled one whose fields the `log` fallback would record.
fn interested() -> bool {
    tracing::level_enabled!(tracing::Level::INFO)
}

/// How an operation's agreed completion ended for the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The result reached the cache: an attached QUERY's existence mask, an attached GET's
    /// published Host rows, or a PUT's backed-up objects.
    Publish,
    /// Nothing was published: the waiter was detached (or the result empty or failed).
    Detach,
    /// An unretired result: its Host references are kept forever.
    Quarantine,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Publish => "publish",
            Ending::Detach => "detach",
            Ending::Quarantine => "quarantine",
        }
    }
}

/// The outcome attribute of an agreed completion.
pub fn outcome(done: &StorageDone) -> &'static str {
    if let Some(r) = done.rejection {
        return r.as_str();
    }
    if done.error.is_some() {
        return "error";
    }
    let ok = done.success.iter().filter(|s| **s).count();
    if ok == done.success.len() {
        "ok"
    } else if ok == 0 {
        "none"
    } else {
        "partial"
    }
}

/// The ending of `done`, from the effects its agreement produced. `attached` is whether a
/// request waited on the operation before the round was applied.
pub fn ending(done: &StorageDone, attached: bool, fx: &RoundEffects) -> Ending {
    if !done.retired && done.kind != StorageOpKind::Query {
        return Ending::Quarantine;
    }
    let published = match done.kind {
        StorageOpKind::Query => attached && fx.query_results.iter().any(|q| q.op == done.op),
        StorageOpKind::Get => attached && fx.publish.iter().any(|p| p.op == done.op),
        StorageOpKind::Put => {
            done.rejection.is_none() && done.error.is_none() && done.success.iter().any(|s| *s)
        }
    };
    if published {
        Ending::Publish
    } else {
        Ending::Detach
    }
}

struct OpTrace {
    span: Span,
    attached: bool,
}

/// The Scheduler's spans: one per live request.
#[derive(Default)]
pub struct RequestTrace {
    rank: u32,
    requests: BTreeMap<RequestId, Span>,
}

/// The StorageTransferManager's spans: one per outstanding storage operation.
#[derive(Default)]
pub struct OperationTrace {
    rank: u32,
    ops: BTreeMap<OperationId, OpTrace>,
}

impl RequestTrace {
    pub fn new(rank: u32) -> Self {
        Self {
            rank,
            ..Self::default()
        }
    }

    /// A request arrived: its span lives until it finishes or aborts.
    pub fn request_arrived(&mut self, id: RequestId, prompt_tokens: usize) {
        if !interested() {
            return;
        }
        let span = info_span!(
            parent: None,
            "request",
            request_id = id.0,
            prompt_tokens = prompt_tokens as u64,
            rank = self.rank,
            outcome = field::Empty
        );
        if !span.is_disabled() {
            self.requests.insert(id, span);
        }
    }

    /// A request finished or aborted: its span closes (outstanding operation spans keep
    /// their parent reference until their own ending).
    pub fn request_ended(&mut self, id: RequestId, outcome: &'static str) {
        if let Some(span) = self.requests.remove(&id) {
            span.record("outcome", outcome);
        }
    }

    /// The span of a live request.
    pub fn request_span(&self, id: RequestId) -> Option<&Span> {
        self.requests.get(&id)
    }
}

impl std::fmt::Debug for OperationTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OperationTrace({} outstanding)", self.ops.len())
    }
}

impl OperationTrace {
    pub fn new(rank: u32) -> Self {
        Self {
            rank,
            ..Self::default()
        }
    }

    /// Records committed storage commands: a span per new QUERY/GET/PUT (under its
    /// request's span when the plan carried one, else a root span), a `cancel` event on the
    /// span of a cancelled read. `parent(op)` is the request span of a read.
    pub fn issued<'a>(
        &mut self,
        ops: &[StorageOp],
        parent: impl Fn(OperationId) -> Option<&'a Span>,
    ) {
        if !interested() && self.ops.is_empty() {
            // No new span could be enabled and no outstanding one could take a `cancel`.
            return;
        }
        for op in ops {
            let id = op.id();
            let Some(kind) = op.kind() else {
                if let Some(t) = self.ops.get(&id) {
                    tracing::info!(parent: &t.span, "cancel");
                }
                continue;
            };
            if self.ops.contains_key(&id) {
                continue;
            }
            let waiter = op.request();
            let parent = parent(id);
            let (keys, bytes) = (op.keys().len() as u64, op.payload_bytes());
            let span = match parent {
                Some(p) => info_span!(
                    parent: p,
                    "storage_operation",
                    op_id = id.0,
                    kind = kind.as_str(),
                    keys,
                    bytes,
                    rank = self.rank,
                    outcome = field::Empty,
                    ending = field::Empty
                ),
                None => info_span!(
                    parent: None,
                    "storage_operation",
                    op_id = id.0,
                    kind = kind.as_str(),
                    keys,
                    bytes,
                    rank = self.rank,
                    outcome = field::Empty,
                    ending = field::Empty
                ),
            };
            if span.is_disabled() {
                // No subscriber is interested: keep no bookkeeping at all.
                continue;
            }
            tracing::debug!(parent: &span, "issue");
            self.ops.insert(
                id,
                OpTrace {
                    span,
                    attached: waiter.is_some(),
                },
            );
        }
    }

    /// The agreed completion of `done` was applied: records the `agreement` and the ending
    /// (each a short child span), sets the outcome and drops the operation's span.
    pub fn agreed(&mut self, done: &StorageDone, attached: bool, fx: &RoundEffects) {
        let Some(t) = self.ops.remove(&done.op) else {
            return;
        };
        let success = done.success.iter().filter(|s| **s).count() as u64;
        let outcome = outcome(done);
        t.span.record("outcome", outcome);
        info_span!(
            parent: &t.span,
            "agreement",
            success,
            keys = done.success.len() as u64,
            retired = done.retired,
            new_writes = done.new_writes,
            outcome
        )
        .in_scope(|| {});
        let end = ending(done, attached && t.attached, fx);
        t.span.record("ending", end.as_str());
        let published = match (end, done.kind) {
            (Ending::Publish, StorageOpKind::Get) => {
                fx.publish.iter().filter(|p| p.op == done.op).count() as u64
            }
            (Ending::Publish, _) => success,
            _ => 0,
        };
        match end {
            Ending::Publish => info_span!(parent: &t.span, "publish", rows = published),
            Ending::Detach => info_span!(parent: &t.span, "detach"),
            Ending::Quarantine => info_span!(parent: &t.span, "quarantine"),
        }
        .in_scope(|| {});
    }

    /// Forgets operations the manager no longer tracks (a clear rejected them): the table
    /// stays bounded by the outstanding operations.
    pub fn retain_outstanding(&mut self, live: impl Fn(OperationId) -> bool) {
        self.ops.retain(|op, t| {
            let keep = live(*op);
            if !keep {
                t.span.record("ending", "cleared");
            }
            keep
        });
    }

    /// Whether `op` has a live span (a subscriber is interested and it is outstanding).
    pub fn traces(&self, op: OperationId) -> bool {
        self.ops.contains_key(&op)
    }

    /// The span of an outstanding operation (the engine enters it to submit the op).
    pub fn op_span(&self, op: OperationId) -> Option<&Span> {
        self.ops.get(&op).map(|t| &t.span)
    }

    /// Outstanding operation spans (bounded by the operation credits).
    pub fn outstanding(&self) -> usize {
        self.ops.len()
    }
}
