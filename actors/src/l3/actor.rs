//! L3ExecutorActor: the executor as an actix actor, so the engine host can hold it as an
//! `Addr`. It only forwards messages to the core `L3Executor`; it makes no decisions of its
//! own. `Close` blocks the actor's arbiter for at most the close deadline. After close,
//! submitted job commands settle as `Rejection::Shutdown` completions delivered by `Poll`.

use super::executor::{CloseReport, L3Executor, Submitted};
use super::stats::ExecutorStats;
use actix::{Actor, Context, Handler, Message, MessageResult};
use messages::{HealthState, HealthStatus, PressureSnapshot, Rejection, StorageDone, StorageOp};
use std::time::Duration;

/// Submits commands in order; one `Submitted` per command.
#[derive(Debug, Message)]
#[rtype(result = "Vec<Submitted>")]
pub struct Submit(pub Vec<StorageOp>);

/// Submits commands in order, each inside its storage operation's span (when traced), so
/// the executor's `l3_op` span is that span's child. Fire-and-forget: rejections surface
/// as completions.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SubmitTraced(pub Vec<(StorageOp, Option<tracing::Span>)>);

/// New completions and the pressure snapshot.
#[derive(Debug, Message)]
#[rtype(result = "(Vec<StorageDone>, PressureSnapshot)")]
pub struct Poll;

/// Closes the executor; None when it was already closed. The report's completions are
/// moved to the actor and delivered by the next Poll, so every ticket settles through Poll.
#[derive(Debug, Message)]
#[rtype(result = "Option<CloseReport>")]
pub struct Close;

/// One consistent read of the executor: its counters (None once closed) and its health,
/// without consuming the recovery probe. After close the health reads Quarantined when
/// close required a restart, Healthy otherwise.
#[derive(Debug, Message)]
#[rtype(result = "ExecutorSnapshot")]
pub struct Snapshot;

/// What `Snapshot` answers.
#[derive(Clone, Debug)]
pub struct ExecutorSnapshot {
    pub stats: Option<ExecutorStats>,
    pub health: HealthState,
}

/// Blocks the actor until at least `0` completions await Poll or `1` passes (tests and
/// tools; the engine host's round polls instead). Returns whether they do.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct WaitUndelivered(pub usize, pub Duration);

#[derive(Debug)]
pub struct L3ExecutorActor {
    exec: Option<L3Executor>,
    /// Completions produced after close (Shutdown rejections), delivered by Poll.
    late: Vec<StorageDone>,
    last_health: HealthState,
}

impl L3ExecutorActor {
    pub fn new(exec: L3Executor) -> Self {
        let last_health = exec.health();
        Self {
            exec: Some(exec),
            late: vec![],
            last_health,
        }
    }
}

impl Actor for L3ExecutorActor {
    type Context = Context<Self>;
}

impl Handler<Submit> for L3ExecutorActor {
    type Result = MessageResult<Submit>;
    fn handle(&mut self, msg: Submit, _: &mut Context<Self>) -> Self::Result {
        let out = msg
            .0
            .into_iter()
            .map(|op| match &self.exec {
                Some(e) => e.submit(op),
                None => match op.kind() {
                    Some(kind) => {
                        let n = op.keys().len();
                        self.late.push(StorageDone::rejected(
                            op.id(),
                            kind,
                            n,
                            Rejection::Shutdown,
                        ));
                        Submitted::Rejected(Rejection::Shutdown)
                    }
                    None => Submitted::CancelIgnored,
                },
            })
            .collect();
        MessageResult(out)
    }
}

impl Handler<SubmitTraced> for L3ExecutorActor {
    type Result = ();
    fn handle(&mut self, msg: SubmitTraced, ctx: &mut Context<Self>) {
        for (op, span) in msg.0 {
            let _entered = span.as_ref().map(|s| s.enter());
            let _ = self.handle(Submit(vec![op]), ctx);
        }
    }
}

impl Handler<Poll> for L3ExecutorActor {
    type Result = MessageResult<Poll>;
    fn handle(&mut self, _: Poll, _: &mut Context<Self>) -> Self::Result {
        let (mut done, pressure) = match &self.exec {
            Some(e) => e.poll(),
            None => (vec![], PressureSnapshot::default()),
        };
        done.append(&mut self.late);
        MessageResult((done, pressure))
    }
}

impl Handler<Close> for L3ExecutorActor {
    type Result = MessageResult<Close>;
    fn handle(&mut self, _: Close, _: &mut Context<Self>) -> Self::Result {
        let report = self.exec.take().map(|e| {
            let mut r = e.close();
            if r.restart_required {
                self.last_health.state = HealthStatus::Quarantined;
            }
            // Completions not yet polled are still delivered by Poll.
            self.late.append(&mut r.completions);
            r
        });
        MessageResult(report)
    }
}

impl Handler<Snapshot> for L3ExecutorActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _: Snapshot, _: &mut Context<Self>) -> Self::Result {
        if let Some(e) = &self.exec {
            self.last_health = e.health();
        }
        MessageResult(ExecutorSnapshot {
            stats: self.exec.as_ref().map(|e| e.stats()),
            health: self.last_health,
        })
    }
}

impl Handler<WaitUndelivered> for L3ExecutorActor {
    type Result = bool;
    fn handle(&mut self, m: WaitUndelivered, _: &mut Context<Self>) -> bool {
        match &self.exec {
            Some(e) => e.wait_undelivered(m.0.saturating_sub(self.late.len()), m.1),
            None => self.late.len() >= m.0,
        }
    }
}
