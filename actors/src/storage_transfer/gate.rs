//! The pressure gate: a shared read/write admission gate over the MAX-reduced pressure
//! observations (queued jobs, queued payload bytes, oldest job age). It closes when any
//! observation reaches its high watermark and reopens only when every observation is under
//! its low watermark (hysteresis). Backups yield first: while any observation is at or
//! above its low watermark (the gate still open) new backup PUTs wait, so a backlog that
//! is only slow sheds backup work (the bounded candidate queue drops its oldest, counted)
//! before it closes read admission. It accounts the agreed time it spends closed. It never
//! reports a backend fault, never infers native retirement and is independent of
//! pause/freeze, health and quarantine.

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
    /// Agreed tick at which the current closure began.
    closed_since_us: u64,
    /// Agreed time of the closures that ended.
    closed_us: u64,
}

impl PressureGate {
    pub fn new(cfg: &StorageConfig) -> Self {
        Self {
            high: cfg.pressure_high.as_observation(),
            low: cfg.pressure_low.as_observation(),
            closed: false,
            closures: 0,
            last: PressureObservation::default(),
            closed_since_us: 0,
            closed_us: 0,
        }
    }

    /// Apply one agreed (already MAX-reduced) observation (no time accounting).
    pub fn observe(&mut self, obs: PressureObservation) -> GateTransition {
        self.observe_at(obs, 0)
    }

    /// Apply one agreed observation at the agreed tick `now_us`.
    pub fn observe_at(&mut self, obs: PressureObservation, now_us: u64) -> GateTransition {
        self.last = obs;
        if !self.closed && obs.any_reaches(&self.high) {
            self.closed = true;
            self.closures += 1;
            self.closed_since_us = now_us;
            GateTransition::Closed
        } else if self.closed && obs.all_below(&self.low) {
            self.closed = false;
            self.closed_us += now_us.saturating_sub(self.closed_since_us);
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
    /// Agreed time spent closed up to `now_us` (the current closure included).
    pub fn closed_us(&self, now_us: u64) -> u64 {
        self.closed_us
            + if self.closed {
                now_us.saturating_sub(self.closed_since_us)
            } else {
                0
            }
    }
    /// Whether new backup PUTs wait: the gate is open but some observation is at or above
    /// its low watermark (backups yield before reads are shut out).
    pub fn sheds_backups(&self) -> bool {
        !self.closed && !self.last.all_below(&self.low)
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

    #[test]
    fn closed_time_is_accounted_and_backups_yield_between_the_watermarks() {
        // high: 10 jobs / 1000 bytes / 100 ms; low: 5 / 500 / 50 ms.
        let mut g = PressureGate::new(&config());
        g.observe_at(obs(1, 0, 0), 1_000);
        assert!(!g.sheds_backups() && !g.is_closed());
        // Between the watermarks: reads still admitted, backups wait.
        g.observe_at(obs(6, 0, 0), 2_000);
        assert!(g.sheds_backups() && !g.is_closed());
        assert_eq!(g.observe_at(obs(10, 0, 0), 3_000), GateTransition::Closed);
        assert!(!g.sheds_backups(), "a closed gate stops backups itself");
        assert_eq!(g.closed_us(4_500), 1_500, "the current closure counts");
        assert_eq!(g.observe_at(obs(4, 0, 0), 7_000), GateTransition::Reopened);
        assert_eq!(g.closed_us(9_000), 4_000);
        assert!(!g.sheds_backups());
    }
}
