//! The executor's private HealthMonitor (seed 000): cooldown after an outage, exactly one
//! recovery probe once the cooldown ends, and health epochs so that a stale success never
//! undoes a newer outage. It owns only that state; it has no thread and no public control
//! interface, and it never decides retirement (quarantine is recorded here only so that
//! health reads report it).

use messages::{HealthState, HealthStatus, Rejection};

/// What admission granted a job: the epoch it ran in and whether it is the recovery probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Admission {
    pub epoch: u64,
    pub probe: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Healthy,
    Cooldown { until_us: u64 },
    Probing { taken: bool },
}

#[derive(Debug)]
pub(crate) struct HealthMonitor {
    cooldown_us: u64,
    epoch: u64,
    phase: Phase,
    quarantined: bool,
}

impl HealthMonitor {
    pub fn new(cooldown_us: u64) -> Self {
        Self {
            cooldown_us,
            epoch: 0,
            phase: Phase::Healthy,
            quarantined: false,
        }
    }

    /// Admits one job at `now_us`, or rejects it. After the cooldown the first admitted job
    /// is the recovery probe; every other job is rejected until the probe reports.
    pub fn admit(&mut self, now_us: u64) -> Result<Admission, Rejection> {
        if self.quarantined {
            return Err(Rejection::Quarantined);
        }
        if let Phase::Cooldown { until_us } = self.phase {
            if now_us < until_us {
                return Err(Rejection::Unhealthy);
            }
            self.phase = Phase::Probing { taken: false };
        }
        match self.phase {
            Phase::Healthy => Ok(Admission {
                epoch: self.epoch,
                probe: false,
            }),
            Phase::Probing { taken: false } => {
                self.phase = Phase::Probing { taken: true };
                Ok(Admission {
                    epoch: self.epoch,
                    probe: true,
                })
            }
            _ => Err(Rejection::Unhealthy),
        }
    }

    /// A probe that was admitted but never ran (queue full, cancelled while queued, closed)
    /// gives its turn back.
    pub fn release_probe(&mut self, adm: Admission) {
        if adm.probe && adm.epoch == self.epoch && self.phase == (Phase::Probing { taken: true }) {
            self.phase = Phase::Probing { taken: false };
        }
    }

    /// Records a finished job. An outage in the current epoch starts a new epoch and a
    /// cooldown; results of older epochs are stale: a stale success never restores health
    /// and a stale outage belongs to the outage already recorded.
    pub fn record(&mut self, adm: Admission, outage: bool, now_us: u64) {
        if self.quarantined || adm.epoch < self.epoch {
            return;
        }
        if outage {
            self.epoch += 1;
            self.phase = Phase::Cooldown {
                until_us: now_us.saturating_add(self.cooldown_us),
            };
        } else if adm.probe && matches!(self.phase, Phase::Probing { .. }) {
            self.phase = Phase::Healthy;
        }
    }

    /// An unretired result: no further work, whatever the epoch.
    pub fn quarantine(&mut self) {
        self.quarantined = true;
    }

    pub fn is_quarantined(&self) -> bool {
        self.quarantined
    }

    /// The state as of `now_us`. Reading never consumes the probe.
    pub fn state(&self, now_us: u64) -> HealthState {
        let state = if self.quarantined {
            HealthStatus::Quarantined
        } else {
            match self.phase {
                Phase::Healthy => HealthStatus::Healthy,
                Phase::Cooldown { until_us } if now_us < until_us => HealthStatus::Cooldown,
                Phase::Cooldown { .. } | Phase::Probing { .. } => HealthStatus::Probing,
            }
        };
        HealthState {
            state,
            epoch: self.epoch,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooldown_rejects_then_exactly_one_probe() {
        let mut h = HealthMonitor::new(1000);
        let a = h.admit(0).unwrap();
        assert_eq!(
            a,
            Admission {
                epoch: 0,
                probe: false
            }
        );
        h.record(a, true, 10);
        assert_eq!(h.state(10).state, HealthStatus::Cooldown);
        assert_eq!(h.state(10).epoch, 1);
        assert_eq!(h.admit(500), Err(Rejection::Unhealthy));
        // Reading after the cooldown reports Probing and does not take the probe.
        for _ in 0..3 {
            assert_eq!(h.state(1010).state, HealthStatus::Probing);
        }
        let p = h.admit(1010).unwrap();
        assert!(p.probe);
        assert_eq!(h.admit(1011), Err(Rejection::Unhealthy));
        h.record(p, false, 1020);
        assert_eq!(h.state(1020).state, HealthStatus::Healthy);
        assert!(!h.admit(1021).unwrap().probe);
    }

    #[test]
    fn stale_success_never_restores_and_stale_failure_does_not_extend() {
        let mut h = HealthMonitor::new(100);
        let old = h.admit(0).unwrap();
        let failing = h.admit(0).unwrap();
        h.record(failing, true, 5);
        h.record(old, false, 6);
        assert_eq!(h.state(6).state, HealthStatus::Cooldown);
        h.record(old, true, 50);
        assert_eq!(h.state(106).epoch, 1, "a stale outage starts no new epoch");
        assert_eq!(h.state(106).state, HealthStatus::Probing);
    }

    #[test]
    fn released_probe_can_be_taken_again_and_quarantine_wins() {
        let mut h = HealthMonitor::new(0);
        let a = h.admit(0).unwrap();
        h.record(a, true, 0);
        let p = h.admit(0).unwrap();
        assert!(p.probe);
        h.release_probe(p);
        let p2 = h.admit(0).unwrap();
        assert!(p2.probe);
        h.quarantine();
        h.record(p2, false, 1);
        assert_eq!(h.state(1).state, HealthStatus::Quarantined);
        assert_eq!(h.admit(2), Err(Rejection::Quarantined));
    }
}
