//! The executor's pressure snapshot and health state: facts returned by the completion
//! poll under the same lock as completions, MAX-reduced across owners by agreement.

use serde::{Deserialize, Serialize};

/// Queued jobs of one kind: count and payload bytes (QUERY payload is always 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindPressure {
    pub jobs: u64,
    pub payload_bytes: u64,
}

/// The executor's pressure snapshot. Retired work is excluded; detached native work stays
/// included until it retires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PressureSnapshot {
    /// Indexed by `StorageOpKind::index()`: query, get, put.
    pub queued: [KindPressure; 3],
    /// Age of the oldest queued or running job, in microseconds of the executor's clock.
    pub oldest_age_us: u64,
}

impl PressureSnapshot {
    /// The three observations the pressure gate watches.
    pub fn observation(&self) -> PressureObservation {
        PressureObservation {
            queued_jobs: self.queued.iter().map(|k| k.jobs).sum(),
            queued_bytes: self.queued.iter().map(|k| k.payload_bytes).sum(),
            oldest_age_us: self.oldest_age_us,
        }
    }
}

/// The three pressure observations of one owner: queued jobs, queued payload bytes and the
/// oldest job's age. Agreement MAX-reduces each field across owners.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PressureObservation {
    pub queued_jobs: u64,
    pub queued_bytes: u64,
    pub oldest_age_us: u64,
}

impl PressureObservation {
    /// Field-wise MAX (the agreement reduction).
    pub fn max(self, other: Self) -> Self {
        Self {
            queued_jobs: self.queued_jobs.max(other.queued_jobs),
            queued_bytes: self.queued_bytes.max(other.queued_bytes),
            oldest_age_us: self.oldest_age_us.max(other.oldest_age_us),
        }
    }
    /// Any field at or above its bound.
    pub fn any_reaches(&self, bound: &PressureObservation) -> bool {
        self.queued_jobs >= bound.queued_jobs
            || self.queued_bytes >= bound.queued_bytes
            || self.oldest_age_us >= bound.oldest_age_us
    }
    /// Every field strictly under its bound.
    pub fn all_below(&self, bound: &PressureObservation) -> bool {
        self.queued_jobs < bound.queued_jobs
            && self.queued_bytes < bound.queued_bytes
            && self.oldest_age_us < bound.oldest_age_us
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthStatus {
    Healthy,
    /// After an outage: work is rejected until the cooldown ends.
    Cooldown,
    /// Cooldown ended: exactly one recovery probe may run.
    Probing,
    /// An unretired result was seen: no further work, process restart required.
    Quarantined,
}

impl HealthStatus {
    pub fn as_gauge(&self) -> i64 {
        match self {
            HealthStatus::Healthy => 0,
            HealthStatus::Cooldown => 1,
            HealthStatus::Probing => 2,
            HealthStatus::Quarantined => 3,
        }
    }
}

/// Health with its epoch: every outage starts a new epoch, so a stale success from an older
/// epoch never restores health.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthState {
    pub state: HealthStatus,
    pub epoch: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observation_sums_kinds_and_max_reduces() {
        let s = PressureSnapshot {
            queued: [
                KindPressure {
                    jobs: 2,
                    payload_bytes: 0,
                },
                KindPressure {
                    jobs: 1,
                    payload_bytes: 100,
                },
                KindPressure {
                    jobs: 3,
                    payload_bytes: 50,
                },
            ],
            oldest_age_us: 7,
        };
        let o = s.observation();
        assert_eq!(
            o,
            PressureObservation {
                queued_jobs: 6,
                queued_bytes: 150,
                oldest_age_us: 7
            }
        );
        let m = o.max(PressureObservation {
            queued_jobs: 1,
            queued_bytes: 999,
            oldest_age_us: 1,
        });
        assert_eq!(
            m,
            PressureObservation {
                queued_jobs: 6,
                queued_bytes: 999,
                oldest_age_us: 7
            }
        );
        let hi = PressureObservation {
            queued_jobs: 6,
            queued_bytes: u64::MAX,
            oldest_age_us: u64::MAX,
        };
        assert!(o.any_reaches(&hi));
        assert!(!o.all_below(&hi));
    }
}
