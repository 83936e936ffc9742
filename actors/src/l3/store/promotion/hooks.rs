//! Test hooks of the promotion pipeline: gates that pause a worker at a named stage, so
//! tests order threads with gates instead of sleeps. Disarmed hooks cost one lock
//! (two at the Read stage).
//! It never changes what the pipeline does, only when.

use crate::l3::store::faulty::Gate;
use parking_lot::Mutex;
use std::sync::Arc;

/// Where a promotion worker can be paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PromotionStage {
    /// The source was read into staging; identity not yet revalidated.
    Read,
    /// A target was reserved and issued to the writer; nothing written yet.
    Target,
    /// The first chunk was written into the target.
    Write,
    /// The target is written and verified; commit not yet attempted.
    Commit,
}

#[derive(Debug)]
struct Rule {
    stage: PromotionStage,
    once: bool,
    gate: Arc<Gate>,
}

#[derive(Debug, Default)]
pub struct PromotionHooks {
    rules: Mutex<Vec<Rule>>,
    /// While set, every worker waits here after the Read stage's rules: after staging,
    /// before revalidation and any target write (the tiered store's name for the point
    /// before its MEMORY PUT; `arm(PromotionStage::Read, gate)` is the same).
    pub before_put: Mutex<Option<Arc<Gate>>>,
}

impl PromotionHooks {
    /// Every worker reaching `stage` waits at `gate` while it is armed.
    pub fn arm(&self, stage: PromotionStage, gate: Arc<Gate>) {
        self.rules.lock().push(Rule {
            stage,
            once: false,
            gate,
        });
    }
    /// Only the next worker reaching `stage` waits at `gate`.
    pub fn arm_once(&self, stage: PromotionStage, gate: Arc<Gate>) {
        self.rules.lock().push(Rule {
            stage,
            once: true,
            gate,
        });
    }
    pub fn disarm(&self) {
        self.rules.lock().clear();
        *self.before_put.lock() = None;
    }
    pub(crate) fn pass(&self, stage: PromotionStage) {
        let gates: Vec<Arc<Gate>> = {
            let mut rules = self.rules.lock();
            let gates = rules
                .iter()
                .filter(|r| r.stage == stage)
                .map(|r| r.gate.clone())
                .collect();
            rules.retain(|r| !(r.once && r.stage == stage));
            gates
        };
        for g in gates {
            g.pass();
        }
        if stage == PromotionStage::Read {
            let gate = self.before_put.lock().clone();
            if let Some(g) = gate {
                g.pass();
            }
        }
    }
}
