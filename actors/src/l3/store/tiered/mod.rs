//! TieredStore: the Mooncake store as the MEMORY tier (shared by every engine host) over the
//! shared-DFS tier (`DfsStore`). QUERY is "in MEMORY or in DFS"; GET reads MEMORY first and
//! falls back to DFS (exact bytes and checksum verified by DfsStore) for a key MEMORY
//! provably stopped touching; PUT writes through (DFS create-only, then a create-only
//! MEMORY copy of each newly written object; a MEMORY capacity rejection leaves the DFS
//! copy standing); `prefetch_to_memory` is seed 003's DFS → MEMORY promotion, run by the
//! shared engine (`store::promotion`) with Mooncake as the target (`promotion`). Failures
//! do not prove retirement (Mooncake's contract). It owns the promotion workers and
//! staging; it must never report a MEMORY failure that may still touch a Host buffer as
//! retired, and never serve unverified DFS bytes.

pub mod promotion;
#[cfg(test)]
mod tests;

use super::dfs::DfsStore;
use super::mooncake::MooncakeStore;
use super::promotion::staging::StagingBudget;
use super::promotion::stats::PromotionStats;
use super::promotion::{PromotionLimits, Task};
use super::{KeyResult, PromotionResult, Store, StoreCapabilities, StoreError};
use messages::settings::LocalStoreSettings;
use messages::{Namespace, StorageKey};
use promotion::{MooncakePut, MooncakeTarget, TierHooks, TierLimits, TierPromotion, TierTicket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const NAME: &str = "tiered";

/// What the tiered store is built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TieredConfig {
    pub dfs_dir: PathBuf,
    pub dfs_io_concurrency: u32,
    pub limits: TierLimits,
}

impl TieredConfig {
    /// The DFS root from `[storage.mooncake] dfs_dir`; workers, staging, in-flight cap and
    /// DFS I/O concurrency from the `[storage.local]` promotion settings.
    pub fn from_settings(dfs_dir: &str, local: &LocalStoreSettings) -> Self {
        Self {
            dfs_dir: PathBuf::from(dfs_dir),
            dfs_io_concurrency: local.dfs_io_concurrency,
            limits: TierLimits {
                workers: local.promotion_workers,
                staging_bytes: local.staging_bytes,
                max_in_flight: local.max_promotions_in_flight,
            },
        }
    }
}

/// Where reads were served from.
#[derive(Debug, Default)]
pub struct TieredStats {
    pub memory_hits: AtomicU64,
    pub dfs_reads: AtomicU64,
    /// MEMORY copies of write-through PUTs refused for capacity (the DFS copy stands).
    pub memory_put_capacity: AtomicU64,
}

pub struct TieredStore {
    engine: Arc<TierPromotion>,
    tx: flume::Sender<Task<Arc<MooncakePut>>>,
    pub stats: TieredStats,
}

impl std::fmt::Debug for TieredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TieredStore")
            .field("engine", &self.engine)
            .finish()
    }
}

/// Whether a MEMORY GET row leaves the destination to a DFS read: the MEMORY tier
/// provably stopped touching it and did not deliver the object.
pub fn falls_back(r: &KeyResult) -> bool {
    matches!(
        r,
        KeyResult::Missing
            | KeyResult::ShortRead { .. }
            | KeyResult::Invalid
            | KeyResult::Failed { retired: true, .. }
    )
}

/// The row a write-through PUT reports: the DFS result, unless the MEMORY copy failed
/// without proving retirement (then that failure, so the Host buffer is not reused).
pub fn put_row(dfs: KeyResult, memory: Option<KeyResult>) -> KeyResult {
    match memory {
        Some(m @ KeyResult::Failed { retired: false, .. }) => m,
        _ => dfs,
    }
}

impl TieredStore {
    /// A tiered store over a connected Mooncake store and a DFS root (created if absent).
    pub fn open(memory: Arc<MooncakeStore>, cfg: &TieredConfig) -> Result<Self, StoreError> {
        let dfs = Arc::new(DfsStore::open(&cfg.dfs_dir, cfg.dfs_io_concurrency)?);
        Self::with_tiers(memory, dfs, cfg.limits)
    }

    /// A tiered store over any MEMORY-tier store (tests use MemoryStore/FaultyStore).
    pub fn with_tiers(
        memory: Arc<dyn Store>,
        dfs: Arc<DfsStore>,
        limits: TierLimits,
    ) -> Result<Self, StoreError> {
        // No expiry and no cancellation: a PUT cannot be fenced, and every attempt runs to
        // its end.
        let engine = Arc::new(TierPromotion::new(
            dfs,
            MooncakeTarget::new(memory),
            StagingBudget::new(limits.staging_bytes),
            PromotionLimits {
                max_in_flight: limits.max_in_flight.max(1) as u64,
                cancel_abandoned: false,
            },
            None,
        ));
        let (tx, rx) = flume::unbounded();
        // Workers exit when the store (the only sender) drops.
        engine
            .spawn_workers(limits.workers, "tsl3-tier-promote", rx)
            .map_err(|e| StoreError::new(NAME, format!("spawn promotion workers: {e}")))?;
        Ok(Self {
            engine,
            tx,
            stats: TieredStats::default(),
        })
    }

    pub fn dfs(&self) -> &Arc<DfsStore> {
        &self.engine.dfs
    }
    pub fn memory(&self) -> &Arc<dyn Store> {
        &self.engine.target.memory
    }
    pub fn staging(&self) -> &StagingBudget {
        &self.engine.staging
    }
    pub fn promotion_stats(&self) -> &PromotionStats {
        &self.engine.stats
    }
    pub fn hooks(&self) -> &TierHooks {
        &self.engine.hooks
    }
    pub fn engine(&self) -> &Arc<TierPromotion> {
        &self.engine
    }

    /// Starts a promotion trigger without blocking on it: wait on the ticket.
    pub fn submit_prefetch(&self, keys: &[StorageKey]) -> Result<TierTicket, StoreError> {
        self.engine.submit(keys, &self.tx)
    }
}

impl Store for TieredStore {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Mooncake does not infer retirement from a failed SDK call.
    fn failures_retire(&self) -> bool {
        false
    }

    fn capabilities(&self) -> StoreCapabilities {
        StoreCapabilities { promotion: true }
    }

    /// MEMORY OR DFS. A failed MEMORY query falls back to DFS alone (a query touches no
    /// Host payload, and every write-through object is in DFS).
    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        let memory = match self.engine.target.memory.query(keys) {
            Ok(m) if m.len() == keys.len() => m,
            Ok(_) => vec![false; keys.len()],
            Err(e) => {
                tracing::warn!(error = %e, "MEMORY query failed; answering from DFS");
                vec![false; keys.len()]
            }
        };
        Ok(self.engine.dfs.present(keys, |i, _| memory[i]))
    }

    /// MEMORY first; DFS for every key MEMORY provably did not deliver.
    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError> {
        crate::l3::store::same_count(NAME, keys.len(), dests.len(), "destinations")?;
        let mut rows = self.engine.target.memory.get(keys, dests)?;
        if rows.len() != keys.len() {
            return Err(StoreError::new(
                NAME,
                "MEMORY GET answered a different number of keys",
            ));
        }
        for ((k, d), r) in keys.iter().zip(dests.iter_mut()).zip(rows.iter_mut()) {
            if falls_back(r) {
                self.stats.dfs_reads.fetch_add(1, Ordering::Relaxed);
                *r = self.engine.dfs.get_one(k, d);
            } else if matches!(r, KeyResult::Ok { .. }) {
                self.stats.memory_hits.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(rows)
    }

    /// Write-through: DFS create-only first, then a create-only MEMORY copy of each object
    /// this call newly wrote to DFS.
    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError> {
        let dfs_rows = self.engine.dfs.put(keys, srcs)?;
        let fresh: Vec<usize> = (0..keys.len())
            .filter(|i| matches!(dfs_rows[*i], KeyResult::Ok { .. }))
            .collect();
        let mut memory_rows: Vec<Option<KeyResult>> = vec![None; keys.len()];
        if !fresh.is_empty() {
            let mk: Vec<StorageKey> = fresh.iter().map(|i| keys[*i].clone()).collect();
            let ms: Vec<&[u8]> = fresh.iter().map(|i| srcs[*i]).collect();
            let rows = self.engine.target.memory.put(&mk, &ms)?;
            if rows.len() != mk.len() {
                return Err(StoreError::new(
                    NAME,
                    "MEMORY PUT answered a different number of keys",
                ));
            }
            for (i, r) in fresh.into_iter().zip(rows) {
                if r == KeyResult::Capacity {
                    self.stats
                        .memory_put_capacity
                        .fetch_add(1, Ordering::Relaxed);
                }
                memory_rows[i] = Some(r);
            }
        }
        Ok(dfs_rows
            .into_iter()
            .zip(memory_rows)
            .map(|(d, m)| put_row(d, m))
            .collect())
    }

    /// Purges MEMORY and DFS while no promotion PUT is in progress (a later one finds its
    /// DFS source gone). Returns the number of DFS objects removed.
    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        let _purge = self.engine.purge_barrier();
        let removed = self.engine.dfs.remove_namespace(ns)?;
        self.engine.target.memory.remove_namespace(ns)?;
        Ok(removed)
    }

    fn prefetch_to_memory(&self, keys: &[StorageKey]) -> Result<Vec<PromotionResult>, StoreError> {
        Ok(self.submit_prefetch(keys)?.wait())
    }

    fn promote_detached(&self, keys: &[StorageKey]) -> Result<usize, StoreError> {
        Ok(self.submit_prefetch(keys)?.detach())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.engine.target.memory.close()
    }
}
