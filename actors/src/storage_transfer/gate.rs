//! The pressure gate: a shared read/write admission gate over the MAX-reduced pressure
//! observations (queued jobs, queued payload bytes, oldest job age). It closes when any
//! observation reaches its high watermark and reopens only when every observation is under
//! its low watermark (hysteresis). It never reports a backend fault, never infers native
//! retirement and is independent of pause/freeze, health and quarantine.

use messages::settings::StorageConfig;
use messages::PressureObservation;

/// What one observation did to the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateTransition {
    Unchanged,
    Closed,
    Reopened,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PressureGate {
    high: PressureObservation,
    low: PressureObservation,
    closed: bool,
    closures: u64,
    last: PressureObservation,
}

impl PressureGate {
    pub fn new(cfg: &StorageConfig) -> Self {
        Self {
            high: cfg.pressure_high.as_observation(),
            low: cfg.pressure_low.as_observation(),
            closed: false,
            closures: 0,
            last: PressureObservation::default(),
        }
    }

    /// Apply one agreed (already MAX-reduced) observation.
    pub fn observe(&mut self, obs: PressureObservation) -> GateTransition {
        self.last = obs;
        if !self.closed && obs.any_reaches(&self.high) {
            self.closed = true;
            self.closures += 1;
            GateTransition::Closed
        } else if self.closed && obs.all_below(&self.low) {
            self.closed = false;
            GateTransition::Reopened
        } else {
            GateTransition::Unchanged
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed
    }
    pub fn closures(&self) -> u64 {
        self.closures
    }
    pub fn last_observation(&self) -> PressureObservation {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage_transfer::tests_support::config;

    fn obs(jobs: u64, bytes: u64, age_us: u64) -> PressureObservation {
        PressureObservation {
            queued_jobs: jobs,
            queued_bytes: bytes,
            oldest_age_us: age_us,
        }
    }

    #[test]
    fn hysteresis_between_high_and_low_watermarks() {
        // high: 10 jobs / 1000 bytes / 100 ms; low: 5 / 500 / 50 ms.
        let mut g = PressureGate::new(&config());
        assert_eq!(g.observe(obs(9, 999, 99_999)), GateTransition::Unchanged);
        assert!(!g.is_closed());
        assert_eq!(g.observe(obs(0, 0, 100_000)), GateTransition::Closed);
        assert!(g.is_closed());
        // Between the watermarks: stays closed.
        assert_eq!(g.observe(obs(6, 0, 0)), GateTransition::Unchanged);
        assert!(g.is_closed());
        // One field at its low watermark is not under it.
        assert_eq!(g.observe(obs(4, 500, 0)), GateTransition::Unchanged);
        assert!(g.is_closed());
        assert_eq!(g.observe(obs(4, 499, 49_999)), GateTransition::Reopened);
        assert!(!g.is_closed());
        // Between the watermarks while open: stays open.
        assert_eq!(g.observe(obs(9, 0, 0)), GateTransition::Unchanged);
        assert!(!g.is_closed());
        assert_eq!(g.observe(obs(10, 0, 0)), GateTransition::Closed);
        assert_eq!(g.closures(), 2);
    }
}
