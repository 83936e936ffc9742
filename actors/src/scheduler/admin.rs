//! Admin work: the queue of admin commands, refusing and applying the pending one, and
//! quiescence (no request holding cache resources). While a command is pending `plan`
//! prepares and admits nothing (plan.rs).
//!
//! It never talks to storage: the StorageTransferManager rejects outstanding operations
//! (and performs any remote deletion) before `apply_admin`, whose effects only arrive here.
//! It never checks quiescence on the caller's behalf: the caller asks `quiescent` first.

use super::request::RequestState;
use super::Scheduler;
use crate::storage_transfer::RoundEffects;
use messages::Namespace;

/// Admin work applied when no request holds cache resources: the one vocabulary of the
/// HTTP side, the relay and the scheduler.
pub use messages::AdminCommand;

impl Scheduler {
    /// Queues an admin command; it applies when no request holds cache resources.
    pub fn admin(&mut self, cmd: AdminCommand) {
        self.pending_admin.push_back(cmd);
    }

    /// Drops the pending admin command unapplied (its agreed preflight failed).
    pub fn refuse_admin(&mut self) {
        self.pending_admin.pop_front();
    }

    /// Whether an admin command waits for quiescence (new work is held meanwhile).
    pub fn admin_pending(&self) -> Option<AdminCommand> {
        self.pending_admin.front().copied()
    }

    /// Whether the scheduler is quiescent for admin work: no running or preparing request.
    pub fn quiescent(&self) -> bool {
        self.requests.values().all(|r| {
            matches!(r.state, RequestState::Submitted | RequestState::Admissible)
                && r.resources.ready.is_none()
        })
    }

    /// Applies the pending admin command once quiescent, after the StorageTransferManager
    /// rejected outstanding storage operations (never draining them): `cleared` is its
    /// effects (None with storage disabled). Clears local caches and, for a weight update,
    /// moves to `new_namespace`. A failed remote deletion never reaches here: it prevents
    /// local clearing.
    pub fn apply_admin(&mut self, cleared: Option<RoundEffects>, new_namespace: Option<Namespace>) {
        let cmd = self.pending_admin.pop_front();
        if let Some(fx) = cleared {
            self.apply_effects(Box::new(fx), None);
        }
        if let Some(AdminCommand::ResetLocal { host }) = cmd {
            // Local caches only: the namespace, the tail hints of L3 objects and every
            // storage record stay; blocks storage I/O still references stay (invisible)
            // until it retires.
            for r in self.requests.values_mut() {
                r.resources.ready = None;
            }
            self.cache.reset_local(host);
            return;
        }
        // Local clearing: Ready holds are gone; every unreferenced block is freed, and the
        // blocks in-flight storage I/O still references stay (invisible) until it retires.
        for r in self.requests.values_mut() {
            r.resources.ready = None;
        }
        let ns = new_namespace.unwrap_or_else(|| self.cache.namespace().clone());
        self.cache.clear(ns.clone());
        self.cfg.namespace = ns;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::AdminCommand;
    use messages::{Namespace, RequestId};

    #[test]
    fn a_pending_command_holds_new_admissions_until_it_applies() {
        let mut rig = rig(false);
        rig.s.admin(AdminCommand::ClearCache);
        let p = prompt(16, 1);
        let plan = rig.arrive(&[(1, &p, 2)]);
        assert!(
            plan.forwards.is_empty(),
            "held while the command is pending"
        );
        assert_eq!(rig.s.state_of(RequestId(1)), Some("submitted"));
        assert_eq!(rig.s.admin_pending(), Some(AdminCommand::ClearCache));
        assert!(rig.s.quiescent(), "a submitted request holds nothing");
        rig.s.apply_admin(None, None);
        assert_eq!(rig.s.admin_pending(), None);
        let plan = rig.round(Default::default());
        assert_eq!(plan.forwards.len(), 1);
    }

    #[test]
    fn refuse_admin_drops_the_command_and_admission_resumes() {
        let mut rig = rig(false);
        rig.s.admin(AdminCommand::SetWeightVersion {
            target: 2,
            draft: None,
        });
        let p = prompt(16, 2);
        assert!(rig.arrive(&[(1, &p, 2)]).forwards.is_empty());
        rig.s.refuse_admin();
        assert_eq!(rig.s.admin_pending(), None);
        let ns = rig.s.namespace().clone();
        assert_eq!(rig.round(Default::default()).forwards.len(), 1);
        assert_eq!(rig.s.namespace(), &ns, "never applied");
    }

    #[test]
    fn an_arrival_during_an_admin_command_is_prepared_and_queued_after_it() {
        let mut rig = rig(true);
        rig.s.admin(AdminCommand::ClearCache);
        let p = prompt(32, 5);
        let plan = rig.arrive(&[(1, &p, 2)]);
        assert!(plan.storage.is_empty() && plan.forwards.is_empty());
        // Neither prepared nor in the admission line while the command waits.
        assert!(!rig.s.queue.contains(&RequestId(1)));
        rig.s.refuse_admin();
        let plan = rig.round(Default::default());
        assert!(
            matches!(plan.storage[..], [messages::StorageOp::Query(_)]),
            "{:?}",
            plan.storage
        );
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefetching"));
        assert!(!rig.s.queue.contains(&RequestId(1)), "waits on its QUERY");
    }

    #[test]
    fn commands_apply_in_order_one_at_a_time() {
        let mut rig = rig(false);
        rig.s.admin(AdminCommand::ClearCache);
        rig.s.admin(AdminCommand::ResetLocal { host: true });
        rig.s.apply_admin(None, None);
        assert_eq!(
            rig.s.admin_pending(),
            Some(AdminCommand::ResetLocal { host: true })
        );
    }

    #[test]
    fn running_or_prefetching_requests_are_not_quiescent() {
        let mut rig = rig(false);
        let p = prompt(16, 3);
        rig.arrive(&[(1, &p, 4)]);
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefill"));
        assert!(!rig.s.quiescent());
        let mut rig = rig_with(true, 64, 4);
        rig.arrive(&[(1, &p, 4)]);
        assert_eq!(rig.s.state_of(RequestId(1)), Some("prefetching"));
        assert!(!rig.s.quiescent());
    }

    #[test]
    fn a_weight_update_moves_the_namespace_and_drops_local_hits() {
        let mut rig = rig(false);
        let p = prompt(30, 4);
        serve_one(&mut rig, 1, &p);
        rig.s.admin(AdminCommand::SetWeightVersion {
            target: 2,
            draft: None,
        });
        let ns = Namespace("tsl3-00000000schedtest2".into());
        rig.s.apply_admin(None, Some(ns.clone()));
        assert_eq!(rig.s.namespace(), &ns);
        assert_eq!(rig.s.cfg.namespace, ns);
        rig.arrive(&[(2, &p, 2)]);
        let r = &rig.s.requests[&RequestId(2)];
        assert_eq!((r.split.device, r.split.host), (0, 0));
        assert_eq!(r.split.computed, 30);
    }

    #[test]
    fn reset_local_keeps_host_unless_asked() {
        let mut rig = rig(false);
        let p = prompt(30, 5);
        serve_then_admin(&mut rig, 1, &p, AdminCommand::ResetLocal { host: true });
        rig.arrive(&[(2, &p, 2)]);
        let r = &rig.s.requests[&RequestId(2)];
        assert_eq!((r.split.device, r.split.host, r.split.computed), (0, 0, 30));
    }

    #[test]
    fn only_reset_local_waits_for_idle_storage() {
        assert!(AdminCommand::ResetLocal { host: false }.waits_for_idle_storage());
        assert!(!AdminCommand::ClearCache.waits_for_idle_storage());
        assert!(!AdminCommand::SetWeightVersion {
            target: 1,
            draft: None
        }
        .waits_for_idle_storage());
    }
}
