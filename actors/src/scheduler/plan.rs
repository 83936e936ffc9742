//! The round's plan: the `Plan` type (what the engine executes, in order) with its
//! device-time and step helpers, and `Scheduler::plan`, which sequences one round's
//! planning — storage preparation (prepare.rs), admission (admit.rs), backup dispatch
//! (backups.rs) — then ends the manager's plan (its hand-backs apply after the plan's new
//! operations) and collects the storage operations and the Device slots to poison.
//!
//! It owns the order of the planning steps only: it never decides admission or storage
//! itself (the StorageTransferManager decides every storage operation), never performs I/O
//! and never reads a clock.

use super::Scheduler;
use crate::device::{DecodeStep, DeviceCopy, DeviceSlot, ForwardStep};
use crate::storage_transfer::StorageTransferManager;
use messages::{RequestId, StorageOp};

/// What the engine executes this round, in order: storage (the operations the
/// StorageTransferManager decided for the executor), H2D copies, forwards (each ordered
/// after the copies), D2H copies (then `d2h_done`).
#[derive(Debug)]
pub struct Plan<S = StorageOp> {
    pub storage: Vec<S>,
    pub h2d: Vec<DeviceCopy>,
    pub forwards: Vec<(RequestId, ForwardStep)>,
    pub d2h: Vec<DeviceCopy>,
    /// The context length of every decode token this round produced (the device time of
    /// the round's decode steps is charged from them).
    pub decode_contexts: Vec<u64>,
    /// Device decode steps (a backend that draws tokens on the device), after the forwards.
    pub decodes: Vec<(RequestId, DecodeStep)>,
    /// Requests whose device-side decode state ends (finished or aborted), after the
    /// decodes.
    pub released: Vec<RequestId>,
    /// Debug builds: Device slots freed since the last plan, poisoned before this round's
    /// device work (crate::host::poison).
    pub poison: Vec<DeviceSlot>,
}

impl<S> Default for Plan<S> {
    fn default() -> Self {
        Self {
            storage: Vec::new(),
            h2d: Vec::new(),
            forwards: Vec::new(),
            d2h: Vec::new(),
            decode_contexts: Vec::new(),
            decodes: Vec::new(),
            released: Vec::new(),
            poison: Vec::new(),
        }
    }
}

impl<S> Plan<S> {
    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
            && self.h2d.is_empty()
            && self.forwards.is_empty()
            && self.decodes.is_empty()
            && self.released.is_empty()
            && self.d2h.is_empty()
    }

    /// The same device work with its storage part replaced (the committed operations).
    pub fn with_storage<T>(self, storage: Vec<T>) -> Plan<T> {
        Plan {
            storage,
            h2d: self.h2d,
            forwards: self.forwards,
            d2h: self.d2h,
            decode_contexts: self.decode_contexts,
            decodes: self.decodes,
            released: self.released,
            poison: self.poison,
        }
    }

    /// The round's modeled device time: one batched step (prefill chunks and decode
    /// tokens) with its copies at the profile's PCIe bandwidth.
    pub fn device_time_us(&self, cost: &crate::model::CostModel) -> u64 {
        let (h2d, d2h) = self.copy_bytes();
        cost.round_us(&self.step_items(), h2d, d2h)
    }

    /// The batched step items of the round's device work: every prefill chunk and every
    /// decode token (for `CostModel::round_us`).
    fn step_items(&self) -> Vec<crate::model::StepItem> {
        self.forwards
            .iter()
            .map(|(_, f)| crate::model::StepItem {
                new: (f.tokens.len() as u64).saturating_sub(f.context_len),
                context: f.context_len,
            })
            .chain(self.decode_contexts.iter().map(|c| crate::model::StepItem {
                new: 1,
                context: *c,
            }))
            .collect()
    }

    /// Bytes of the round's H2D and D2H copies.
    fn copy_bytes(&self) -> (u64, u64) {
        let sum = |v: &[DeviceCopy]| v.iter().map(|c| c.host.len).sum::<u64>();
        (sum(&self.h2d), sum(&self.d2h))
    }
}

impl Scheduler {
    /// Plans the round: storage preparation, admission (H2D copies and forwards, D2H of the
    /// new blocks) and backups, asking `storage` (None: storage disabled) for every storage
    /// decision; then ends its plan with this round's hand-backs.
    pub fn plan(&mut self, mut storage: Option<&mut StorageTransferManager>) -> Plan {
        let mut plan = Plan {
            decode_contexts: std::mem::take(&mut self.decode_contexts),
            decodes: std::mem::take(&mut self.device_decodes),
            released: std::mem::take(&mut self.device_released),
            ..Plan::default()
        };
        if self.pending_admin.is_empty() {
            match storage.as_deref_mut() {
                Some(stm) => self.prepare_storage(stm),
                // No manager to ask: every arrival waits for admission as it is.
                None => {
                    for id in self.unprepared.drain(..) {
                        if self.requests.contains_key(&id) {
                            self.queue.insert(id);
                        }
                    }
                }
            }
            self.admit(&mut plan);
        }
        let handbacks = std::mem::take(&mut self.handbacks);
        if let Some(stm) = storage {
            self.dispatch_backups(stm);
            plan.storage = stm.end_plan(handbacks);
        }
        plan.poison = std::mem::take(&mut *self.freed_device.lock());
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::AdminCommand;
    use super::Plan;
    use crate::device::{DeviceCopy, DeviceSlot, ForwardStep};
    use crate::model::Shard;
    use messages::{HostRange, RequestId};

    fn step(tokens: usize, context_len: u64) -> ForwardStep {
        ForwardStep {
            shard: Shard { index: 0, count: 1 },
            tokens: vec![1; tokens],
            context_len,
            groups: vec![],
            sampling: messages::SamplingParams::GREEDY,
            copy_on_write: vec![],
        }
    }

    fn range(len: u64) -> HostRange {
        HostRange { offset: 0, len }
    }

    #[test]
    fn step_items_are_prefill_chunks_then_decode_tokens() {
        let plan: Plan<()> = Plan {
            forwards: vec![(RequestId(1), step(10, 4)), (RequestId(2), step(3, 3))],
            decode_contexts: vec![7],
            ..Plan::default()
        };
        let items: Vec<(u64, u64)> = plan
            .step_items()
            .iter()
            .map(|i| (i.new, i.context))
            .collect();
        assert_eq!(items, vec![(6, 4), (0, 3), (1, 7)]);
    }

    #[test]
    fn copy_bytes_sum_each_direction() {
        let plan: Plan<()> = Plan {
            h2d: vec![DeviceCopy::h2d(range(64), DeviceSlot(0), 0); 2],
            d2h: vec![DeviceCopy::d2h(DeviceSlot(1), 0, range(32))],
            ..Plan::default()
        };
        assert_eq!(plan.copy_bytes(), (128, 32));
        assert!(!plan.is_empty());
    }

    #[test]
    fn with_storage_keeps_the_device_work() {
        let plan: Plan<u8> = Plan {
            storage: vec![1, 2],
            forwards: vec![(RequestId(3), step(5, 0))],
            decode_contexts: vec![9],
            poison: vec![DeviceSlot(4)],
            ..Plan::default()
        };
        let moved = plan.with_storage(vec!["op"]);
        assert_eq!(moved.storage, vec!["op"]);
        assert_eq!(moved.forwards.len(), 1);
        assert_eq!(moved.decode_contexts, vec![9]);
        assert_eq!(moved.poison, vec![DeviceSlot(4)]);
        let empty: Plan<u8> = Plan {
            decode_contexts: vec![1],
            ..Plan::default()
        };
        assert!(
            empty.is_empty(),
            "decode tokens alone are no device work to order"
        );
    }

    #[test]
    fn plan_hands_the_decode_contexts_over_once() {
        let mut rig = rig(false);
        rig.s.decode_contexts = vec![5, 6];
        assert_eq!(rig.plan().decode_contexts, vec![5, 6]);
        assert!(rig.plan().decode_contexts.is_empty());
    }

    #[test]
    fn a_pending_admin_command_skips_preparation_and_admission() {
        let mut rig = rig(true);
        rig.s.admin(AdminCommand::ClearCache);
        let p = prompt(32, 1);
        let plan = rig.arrive(&[(1, &p, 2)]);
        assert!(plan.storage.is_empty(), "no QUERY");
        assert!(plan.forwards.is_empty());
        assert_eq!(rig.s.unprepared.len(), 1, "still to be considered");
    }
}
