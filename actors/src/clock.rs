//! Injectable time. Every deadline, Ready expiry, cooldown and lease reads a `Clock`, so
//! tests drive time with `ManualClock` instead of sleeping. Only the binary constructs the
//! `SystemClock`; the leader's clock becomes the agreed tick, and no other wall-clock
//! timestamp crosses the agreement boundary.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Monotonic time in microseconds since an arbitrary origin.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_us(&self) -> u64;
}

pub type SharedClock = Arc<dyn Clock>;

/// The process's monotonic clock.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
    pub fn shared() -> SharedClock {
        Arc::new(Self::new())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }
}

/// A clock that moves only when a test advances it.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new(start_us: u64) -> Arc<Self> {
        Arc::new(Self {
            now: AtomicU64::new(start_us),
        })
    }
    pub fn advance_us(&self, d: u64) {
        self.now.fetch_add(d, Ordering::SeqCst);
    }
    pub fn advance_ms(&self, d: u64) {
        self.advance_us(d * 1000);
    }
    pub fn set_us(&self, t: u64) {
        self.now.store(t, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_us(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let c = ManualClock::new(5);
        assert_eq!(c.now_us(), 5);
        c.advance_ms(2);
        assert_eq!(c.now_us(), 2005);
        let s = SystemClock::new();
        let a = s.now_us();
        assert!(s.now_us() >= a);
    }
}
