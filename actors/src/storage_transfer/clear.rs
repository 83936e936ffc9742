//! Full cache clear, namespace rotation and weight update: the StorageTransferManager
//! rejects every outstanding storage operation (waits, Ready holds, candidates) without
//! draining QUERY/GET/PUT. In-flight tickets keep their native references until their agreed
//! completion proves retirement; quarantined references are never freed. The remote
//! namespace deletion is the caller's synchronous administrative call after agreed
//! preflight; its failure prevents local clearing, which this API models by taking the
//! deletion result. This module never calls the store.

use super::effects::RoundEffects;
use super::manager::StorageTransferManager;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClearKind {
    /// A full cache clear; the remote namespace is deleted first.
    FullClear,
    /// A new namespace: old objects become unreachable.
    NamespaceRotation,
    /// New weights: a new namespace hash.
    WeightUpdate,
    /// The replica's local caches (L1, optionally L2) are dropped while idle: L3 and every
    /// storage record are untouched, so nothing is rejected.
    LocalReset,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClearRefused {
    #[error("remote namespace deletion failed ({0}); the local cache is not cleared")]
    DeletionFailed(String),
}

impl StorageTransferManager {
    /// Clear after agreed preflight. `remote_deletion` is the result of the synchronous
    /// namespace deletion when the caller performed one (a full clear); an error refuses
    /// the clear and changes nothing.
    pub fn clear(
        &mut self,
        kind: ClearKind,
        remote_deletion: Option<Result<(), String>>,
    ) -> Result<RoundEffects, ClearRefused> {
        if let Some(Err(e)) = remote_deletion {
            return Err(ClearRefused::DeletionFailed(e));
        }
        let mut fx = RoundEffects::default();
        if kind == ClearKind::LocalReset {
            return Ok(fx);
        }
        // Every other kind rejects outstanding work the same way.
        self.reject_outstanding(&mut fx);
        Ok(fx)
    }
}
