//! FaultyStore: a fault-injecting wrapper for tests of every failure path. It never stands
//! in for a real store as the only test of a path; it wraps one. Faults: per-call delay,
//! a call error, an unretired failure, a malformed result, and a gate that holds a call
//! until the test releases it.

use super::{KeyResult, PromotionResult, Store, StoreCapabilities, StoreError};
use messages::{Namespace, StorageKey};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

/// Which calls a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    Query,
    Get,
    Put,
    Prefetch,
    Any,
}

#[derive(Clone, Debug)]
pub enum Fault {
    /// Sleep before the call (used by benchmarks and soak runs, never by deadline tests).
    Delay(Duration),
    /// The call fails as a whole (an exception).
    Error(String),
    /// Every key reports a failure whose retirement is not proven.
    Unretired,
    /// The result has one entry too few.
    Malformed,
    /// The call waits at the gate until the test releases it, then runs normally.
    Gate(Arc<Gate>),
    /// Every key reports a retired failure with this native code (GET/PUT).
    RetiredFailure(i64),
    /// PUT: every key reports a retired capacity rejection.
    Capacity,
}

/// A gate that holds calls: the test waits until a call has entered, then releases it.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    entered: u64,
    released: bool,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }
    /// Blocks until at least `n` calls have entered the gate.
    pub fn wait_entered(&self, n: u64) {
        let mut s = self.state.lock();
        while s.entered < n {
            self.cv.wait(&mut s);
        }
    }
    pub fn entered(&self) -> u64 {
        self.state.lock().entered
    }
    pub fn release(&self) {
        let mut s = self.state.lock();
        s.released = true;
        self.cv.notify_all();
    }
    /// Enters the gate and blocks until it is released (stores' internal test hooks).
    pub fn pass(&self) {
        let mut s = self.state.lock();
        s.entered += 1;
        self.cv.notify_all();
        while !s.released {
            self.cv.wait(&mut s);
        }
    }
}

#[derive(Debug)]
struct Rule {
    call: Call,
    /// None: every matching call; Some(n): the next n matching calls.
    remaining: Option<u32>,
    fault: Fault,
}

/// Wraps a store and injects the queued faults.
pub struct FaultyStore<S: Store> {
    inner: S,
    rules: Mutex<VecDeque<Rule>>,
    retire: bool,
}

impl<S: Store> FaultyStore<S> {
    /// `failures_retire` is what the wrapper declares (a Mooncake-like store declares false).
    pub fn new(inner: S, failures_retire: bool) -> Self {
        Self {
            inner,
            rules: Mutex::new(VecDeque::new()),
            retire: failures_retire,
        }
    }
    pub fn inner(&self) -> &S {
        &self.inner
    }
    /// Applies `fault` to the next `times` calls of `call` (None: until cleared).
    pub fn inject(&self, call: Call, times: Option<u32>, fault: Fault) {
        self.rules.lock().push_back(Rule {
            call,
            remaining: times,
            fault,
        });
    }
    pub fn clear(&self) {
        self.rules.lock().clear();
    }

    fn take(&self, call: Call) -> Vec<Fault> {
        let mut rules = self.rules.lock();
        let mut out = vec![];
        for r in rules.iter_mut() {
            if r.call == call || r.call == Call::Any {
                match r.remaining.as_mut() {
                    Some(0) => continue,
                    Some(n) => *n -= 1,
                    None => {}
                }
                out.push(r.fault.clone());
            }
        }
        rules.retain(|r| r.remaining != Some(0));
        out
    }

    /// Runs the pre-call faults; returns the post-call fault that shapes the result.
    fn before(&self, call: Call) -> Result<Option<Fault>, StoreError> {
        let mut post = None;
        for f in self.take(call) {
            match f {
                Fault::Delay(d) => std::thread::sleep(d),
                Fault::Gate(g) => g.pass(),
                Fault::Error(m) => return Err(StoreError::new("faulty", m)),
                other => post = Some(other),
            }
        }
        Ok(post)
    }
}

fn shape(post: Option<Fault>, mut r: Vec<KeyResult>) -> Vec<KeyResult> {
    match post {
        Some(Fault::Unretired) => r
            .iter()
            .map(|_| KeyResult::Failed {
                code: -800,
                retired: false,
            })
            .collect(),
        Some(Fault::Malformed) => {
            r.pop();
            r
        }
        Some(Fault::RetiredFailure(code)) => r
            .iter()
            .map(|_| KeyResult::Failed {
                code,
                retired: true,
            })
            .collect(),
        Some(Fault::Capacity) => r.iter().map(|_| KeyResult::Capacity).collect(),
        _ => r,
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn failures_retire(&self) -> bool {
        self.retire
    }
    fn capabilities(&self) -> StoreCapabilities {
        self.inner.capabilities()
    }
    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        let post = self.before(Call::Query)?;
        let mut r = self.inner.query(keys)?;
        if matches!(post, Some(Fault::Malformed)) {
            r.pop();
        }
        if matches!(post, Some(Fault::Unretired)) {
            return Err(StoreError::new("faulty", "query failed after submission"));
        }
        Ok(r)
    }
    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError> {
        let post = self.before(Call::Get)?;
        let r = self.inner.get(keys, dests)?;
        Ok(shape(post, r))
    }
    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError> {
        let post = self.before(Call::Put)?;
        if matches!(post, Some(Fault::Capacity) | Some(Fault::RetiredFailure(_))) {
            // The rejection comes before any source transfer: nothing is written.
            return Ok(shape(post, vec![KeyResult::Capacity; keys.len()]));
        }
        let r = self.inner.put(keys, srcs)?;
        Ok(shape(post, r))
    }
    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        self.before(Call::Any)?;
        self.inner.remove_namespace(ns)
    }
    fn prefetch_to_memory(&self, keys: &[StorageKey]) -> Result<Vec<PromotionResult>, StoreError> {
        let post = self.before(Call::Prefetch)?;
        let mut r = self.inner.prefetch_to_memory(keys)?;
        if matches!(post, Some(Fault::Malformed)) {
            r.pop();
        }
        Ok(r)
    }
    fn close(&self) -> Result<(), StoreError> {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::MemoryStore;
    use super::*;

    fn k(s: &str) -> StorageKey {
        StorageKey::new(s)
    }

    #[test]
    fn faults_apply_to_the_next_n_calls_then_stop() {
        let f = FaultyStore::new(MemoryStore::new(), true);
        f.inject(Call::Put, Some(1), Fault::Error("boom".into()));
        assert!(f.put(&[k("a")], &[b"x"]).is_err());
        assert_eq!(
            f.put(&[k("a")], &[b"x"]).unwrap(),
            vec![KeyResult::Ok { bytes: 1 }]
        );
        f.inject(Call::Get, Some(1), Fault::Unretired);
        let mut d = [0u8; 1];
        assert_eq!(
            f.get(&[k("a")], &mut [&mut d]).unwrap(),
            vec![KeyResult::Failed {
                code: -800,
                retired: false
            }]
        );
        f.inject(Call::Get, Some(1), Fault::Malformed);
        assert_eq!(f.get(&[k("a")], &mut [&mut d]).unwrap().len(), 0);
        f.inject(Call::Put, Some(1), Fault::Capacity);
        assert_eq!(
            f.put(&[k("b")], &[b"y"]).unwrap(),
            vec![KeyResult::Capacity]
        );
        assert!(
            !f.inner().contains(&k("b")),
            "a capacity rejection writes nothing"
        );
    }

    #[test]
    fn gate_holds_a_call_until_released() {
        let f = Arc::new(FaultyStore::new(MemoryStore::new(), true));
        let g = Gate::new();
        f.inject(Call::Query, Some(1), Fault::Gate(g.clone()));
        let f2 = f.clone();
        let t = std::thread::spawn(move || f2.query(&[k("a")]).unwrap());
        g.wait_entered(1);
        assert!(!t.is_finished());
        g.release();
        assert_eq!(t.join().unwrap(), vec![false]);
    }
}
