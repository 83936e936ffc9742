//! LocalStore, the embedded default store: an in-process MEMORY tier (bounded bytes, LRU,
//! leases) over the shared-DFS tier (`DfsStore`). PUT writes through (DFS first, then a
//! best-effort MEMORY copy); GET reads MEMORY first, then DFS, straight into Host (a large
//! batch over a few threads), and promotes what it read afterwards only with
//! `promote_after_get`; `prefetch_to_memory` is seed 003's DFS → MEMORY promotion, run by
//! the shared engine (`store::promotion`) with the MEMORY tier as the target
//! (`promotion`). Admission (a later GET) always reselects the currently readable source:
//! a promoted replica is not a reservation.
//! It must never serve a MEMORY replica that was not fully written and verified, and never
//! remove a DFS source a promotion of this process is reading.

pub mod bench;
pub mod memory_tier;
pub mod promotion;
#[cfg(test)]
mod tests;

use crate::clock::SharedClock;
use crate::l3::store::dfs::DfsStore;
use crate::l3::store::fan_out::read_fanned;
use crate::l3::store::promotion::hooks::PromotionHooks;
use crate::l3::store::promotion::staging::StagingBudget;
use crate::l3::store::promotion::stats::PromotionStats;
use crate::l3::store::promotion::{
    Expiry, PromotionEngine, PromotionLimits, PromotionTicket, Task,
};
use crate::l3::store::{KeyResult, PromotionResult, Store, StoreCapabilities, StoreError};
use memory_tier::{MemoryTarget, MemoryTier};
use messages::settings::LocalStoreSettings;
use messages::{Namespace, StorageKey};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Default promotion task lifetime (its expiry fences, never frees).
pub const DEFAULT_PROMOTION_TTL_US: u64 = 30_000_000;

/// What the local store is built from.
#[derive(Clone, Debug)]
pub struct LocalStoreConfig {
    pub dir: PathBuf,
    pub memory_bytes: u64,
    pub promotion_workers: u32,
    pub staging_bytes: u64,
    pub max_promotions_in_flight: u32,
    pub dfs_io_concurrency: u32,
    pub promotion_ttl_us: u64,
    /// `promote_detached` starts promotions (`storage.local.promote_after_get`).
    pub promote_after_get: bool,
}

impl LocalStoreConfig {
    pub fn from_settings(s: &LocalStoreSettings) -> Self {
        Self {
            dir: PathBuf::from(&s.dir),
            memory_bytes: s.memory_bytes,
            promotion_workers: s.promotion_workers,
            staging_bytes: s.staging_bytes,
            max_promotions_in_flight: s.max_promotions_in_flight,
            dfs_io_concurrency: s.dfs_io_concurrency,
            promotion_ttl_us: DEFAULT_PROMOTION_TTL_US,
            promote_after_get: s.promote_after_get,
        }
    }
}

/// Outcome of removing one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoveOutcome {
    Removed,
    Absent,
    /// A promotion is reading the source: not removable now.
    Pinned,
}

/// GET counters: where reads were served from.
#[derive(Debug, Default)]
pub struct LocalStats {
    pub memory_hits: AtomicU64,
    pub dfs_reads: AtomicU64,
}

pub struct LocalStore {
    engine: Arc<PromotionEngine<MemoryTier>>,
    tx: flume::Sender<Task<Arc<MemoryTarget>>>,
    promote_after_get: bool,
    pub stats: LocalStats,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalStore")
            .field("root", &self.engine.dfs.root())
            .finish()
    }
}

impl LocalStore {
    pub fn open(cfg: &LocalStoreConfig, clock: SharedClock) -> Result<Self, StoreError> {
        let dfs = Arc::new(DfsStore::open(&cfg.dir, cfg.dfs_io_concurrency)?);
        Self::with_dfs(dfs, cfg, clock)
    }

    /// A local store over an existing DFS store (its `dir` is not used).
    pub fn with_dfs(
        dfs: Arc<DfsStore>,
        cfg: &LocalStoreConfig,
        clock: SharedClock,
    ) -> Result<Self, StoreError> {
        let engine = Arc::new(PromotionEngine::new(
            dfs,
            MemoryTier::new(cfg.memory_bytes),
            StagingBudget::new(cfg.staging_bytes),
            PromotionLimits {
                max_in_flight: cfg.max_promotions_in_flight.max(1) as u64,
                cancel_abandoned: true,
            },
            Some(Expiry {
                clock,
                ttl_us: cfg.promotion_ttl_us,
            }),
        ));
        let (tx, rx) = flume::unbounded();
        // Workers exit when the store (the only sender) drops.
        engine
            .spawn_workers(cfg.promotion_workers, "tsl3-promote", rx)
            .map_err(|e| StoreError::new("local", format!("spawn promotion workers: {e}")))?;
        Ok(Self {
            engine,
            tx,
            promote_after_get: cfg.promote_after_get,
            stats: LocalStats::default(),
        })
    }

    pub fn dfs(&self) -> &Arc<DfsStore> {
        &self.engine.dfs
    }
    pub fn memory(&self) -> &MemoryTier {
        &self.engine.target
    }
    pub fn staging(&self) -> &StagingBudget {
        &self.engine.staging
    }
    pub fn promotion_stats(&self) -> &PromotionStats {
        &self.engine.stats
    }
    pub fn hooks(&self) -> &PromotionHooks {
        &self.engine.hooks
    }
    pub fn engine(&self) -> &Arc<PromotionEngine<MemoryTier>> {
        &self.engine
    }

    /// Starts a promotion trigger without blocking: wait on (or drop) the ticket.
    pub fn submit_prefetch(
        &self,
        keys: &[StorageKey],
    ) -> Result<PromotionTicket<MemoryTier>, StoreError> {
        self.engine.submit(keys, &self.tx)
    }

    /// Runs the expiry reaper now (waiters also run it while they wait).
    pub fn expire_stale(&self) -> u64 {
        self.engine.expire_stale()
    }

    /// Evicts a MEMORY replica (refused while leased).
    pub fn evict_memory(&self, key: &StorageKey) -> bool {
        self.engine.target.evict(key)
    }

    /// Removes one object from both tiers, unless a promotion pins its source; a live
    /// promotion past its source read is fenced (it would publish a removed object).
    pub fn remove(&self, key: &StorageKey) -> Result<RemoveOutcome, StoreError> {
        if self.engine.pins.is_pinned(key) {
            return Ok(RemoveOutcome::Pinned);
        }
        self.engine.fence_key(key);
        let in_memory = self.engine.target.remove(key);
        let in_dfs = self.engine.dfs.remove(key)?;
        Ok(if in_memory || in_dfs {
            RemoveOutcome::Removed
        } else {
            RemoveOutcome::Absent
        })
    }
}

impl Store for LocalStore {
    fn name(&self) -> &'static str {
        "local"
    }

    /// Memory copies and file I/O complete synchronously within the call.
    fn failures_retire(&self) -> bool {
        true
    }

    /// Promotion after a GET only with `promote_after_get` (the explicit
    /// `prefetch_to_memory` trigger works either way).
    fn capabilities(&self) -> StoreCapabilities {
        StoreCapabilities {
            promotion: self.promote_after_get,
        }
    }

    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        let target = &self.engine.target;
        Ok(self.engine.dfs.present(keys, |_, k| target.contains(k)))
    }

    /// Admission: a fresh lease on a MEMORY replica if one is resident now, else DFS; a
    /// large batch fans out over a few threads (`fan_out`).
    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError> {
        crate::l3::store::same_count("local", keys.len(), dests.len(), "destinations")?;
        let threads = self.engine.dfs.fan_out();
        Ok(read_fanned(keys, dests, threads, |k, d| {
            match self.engine.target.lease(k) {
                // A replica is handed out only for the key it was written for.
                Some(lease) if lease.target().key() != k => KeyResult::Invalid,
                Some(lease) => {
                    self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
                    lease.target().read_into(d)
                }
                None => {
                    self.stats.dfs_reads.fetch_add(1, Ordering::Relaxed);
                    self.engine.dfs.get_one(k, d)
                }
            }
        }))
    }

    /// Write-through: DFS (create-only) first, then a best-effort MEMORY copy.
    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError> {
        let results = self.engine.dfs.put(keys, srcs)?;
        for ((k, s), r) in keys.iter().zip(srcs).zip(&results) {
            if matches!(r, KeyResult::Ok { .. }) {
                self.engine.target.insert_copy(k, s);
            }
        }
        Ok(results)
    }

    /// Fails the namespace's live promotions, drops its MEMORY replicas, purges the DFS dir.
    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        self.engine.fence_namespace(ns);
        self.engine.target.remove_namespace(ns);
        self.engine.dfs.remove_namespace(ns)
    }

    fn prefetch_to_memory(&self, keys: &[StorageKey]) -> Result<Vec<PromotionResult>, StoreError> {
        Ok(self.submit_prefetch(keys)?.wait())
    }

    /// Only with `promote_after_get`: by default the GET's bytes are in Host already.
    fn promote_detached(&self, keys: &[StorageKey]) -> Result<usize, StoreError> {
        if !self.promote_after_get {
            return Ok(0);
        }
        Ok(self.submit_prefetch(keys)?.detach())
    }
}
