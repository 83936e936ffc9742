//! Backups, the write transaction's local half: `d2h_done` publishes this round's D2H
//! blocks in Host L2, releases the H2D sources and turns the new blocks' pages into backup
//! candidates; `dispatch_backups` rechecks the candidates' Host residency and pins the
//! resident pages for their PUT.
//!
//! It never decides what to admit or read, never issues a PUT itself (the StoragePlanner
//! does) and never performs I/O.

use super::{RefUse, Scheduler};
use crate::cache::keys::page_key;
use crate::storage_transfer::{BackupCandidate, HostRef};

impl Scheduler {
    /// The engine executed this round's copies and forwards: the D2H copies completed on
    /// every rank (the engine waits for their fence), so Host L2 publishes now and the new
    /// blocks become backup candidates (returned, for the StorageTransferManager); the H2D
    /// sources are released.
    pub fn d2h_done(&mut self) -> Vec<BackupCandidate> {
        for a in std::mem::take(&mut self.h2d_host_refs) {
            let _ = self.cache.host_mut().release(a);
        }
        let mut candidates = vec![];
        let blocks = std::mem::take(&mut self.d2h_blocks);
        for a in blocks {
            if self.cache.host_mut().publish(a).is_err() {
                continue;
            }
            let _ = self.cache.host_mut().release(a);
            if self.l3_enabled() {
                let pages = self
                    .cache
                    .geometry()
                    .group(a.group as usize)
                    .pages_per_block;
                for page in 0..pages {
                    let key = page_key(self.cache.namespace(), self.cache.geometry(), a, page);
                    let host = self.new_ref(RefUse::PutSource(a, page));
                    candidates.push(BackupCandidate { key, host });
                }
            }
        }
        candidates
    }

    /// PUT dispatch of this round's candidates: rechecks Host residency and takes a source
    /// reference on each resident page; evicted candidates are forgotten (unavailable).
    pub(super) fn dispatch_backups(&mut self) {
        let Some(planner) = self.storage.as_mut() else {
            return;
        };
        let cache = &mut self.cache;
        let refs = &mut self.refs;
        let mut residency = |_key: &messages::StorageKey, h: HostRef| {
            let Some(RefUse::PutSource(addr, page)) = refs.get(&h).copied() else {
                return None;
            };
            let taken = cache.host().contains(addr).then(|| {
                let page_bytes = cache.geometry().group(addr.group as usize).page_bytes;
                let range = cache.host().page_range(addr, page, page_bytes).ok()?;
                cache.host_mut().acquire(addr).ok()?;
                Some(range)
            });
            let range = taken.flatten();
            if range.is_none() {
                refs.remove(&h);
            }
            range
        };
        planner.dispatch_backups(&mut residency);
    }
}
