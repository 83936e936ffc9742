//! The admission rules of planning calls (QUERY, GET, backup PUT), as pure functions of the
//! planning gates and the credits: the one shared place of the rules. The
//! StorageTransferManager applies them to its own credits when the Scheduler asks it for a
//! decision during a plan; nothing else decides admission. This module never allocates
//! IDs, tickets or Host blocks.

use super::credits::{CreditClass, Credits};
use super::manager::Refusal;
use super::{Destinations, HostRef};
use messages::settings::StorageConfig;

/// The manager's planning gates at the start of a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gates {
    /// L3 work stopped for this replica after quarantine.
    pub quarantined: bool,
    /// The pressure gate is closed.
    pub gate_closed: bool,
    /// Backup PUTs wait out a capacity backoff (the store just rejected keys as full).
    pub backups_paused: bool,
}

fn check_keys(cfg: &StorageConfig, n: usize) -> Result<(), Refusal> {
    if n == 0 {
        return Err(Refusal::NoKeys);
    }
    if n > cfg.max_keys_per_operation as usize {
        return Err(Refusal::TooManyKeys(n, cfg.max_keys_per_operation));
    }
    Ok(())
}

/// The credit refusal every QUERY would get now, whatever its keys: Host credits
/// exhausted, or no read operation credit left.
pub fn query_credit_refusal(credits: &Credits) -> Option<Refusal> {
    if credits.host_exhausted() {
        Some(Refusal::HostCredits)
    } else if !credits.fits(CreditClass::Read, 1, 0) {
        Some(Refusal::OperationCredits)
    } else {
        None
    }
}

/// A new QUERY of `keys` keys: charges one read operation credit when admitted. Host credit
/// exhaustion rejects it before any backend work.
pub fn admit_query(
    gates: Gates,
    credits: &mut Credits,
    cfg: &StorageConfig,
    keys: usize,
) -> Result<(), Refusal> {
    if gates.quarantined {
        return Err(Refusal::Disabled);
    }
    check_keys(cfg, keys)?;
    if gates.gate_closed {
        return Err(Refusal::PressureClosed);
    }
    if let Some(e) = query_credit_refusal(credits) {
        return Err(e);
    }
    if !credits.charge(CreditClass::Read, 1, 0) {
        return Err(Refusal::OperationCredits);
    }
    Ok(())
}

/// A GET of `keys` keys into `destinations`: charges one read operation credit and one
/// Host credit per destination when admitted.
pub fn admit_get(
    gates: Gates,
    credits: &mut Credits,
    cfg: &StorageConfig,
    keys: usize,
    destinations: &Destinations,
) -> Result<(), Refusal> {
    if gates.quarantined {
        return Err(Refusal::Disabled);
    }
    check_keys(cfg, keys)?;
    let Destinations { refs, ranges } = destinations;
    if keys != refs.len() || keys != ranges.len() {
        return Err(Refusal::Malformed(format!(
            "{keys} keys but {} destinations",
            destinations.len()
        )));
    }
    if ranges.iter().any(|r| r.len == 0) {
        return Err(Refusal::Malformed("empty Host range".into()));
    }
    if !distinct_refs(refs) {
        return Err(Refusal::Malformed("a Host reference appears twice".into()));
    }
    if gates.gate_closed {
        return Err(Refusal::PressureClosed);
    }
    if !credits.charge(CreditClass::Read, 1, destinations.len() as u32) {
        return Err(if credits.fits(CreditClass::Read, 1, 0) {
            Refusal::HostCredits
        } else {
            Refusal::OperationCredits
        });
    }
    Ok(())
}

/// How many keys the next backup PUT may carry now (0: none fits).
pub fn backup_room(credits: &Credits, cfg: &StorageConfig) -> usize {
    if !credits.fits(CreditClass::Backup, 1, 1) {
        return 0;
    }
    (credits.backup_hosts_available() as usize).min(cfg.max_keys_per_operation as usize)
}

/// Whether no Host reference appears twice. The scheduler hands out references in
/// ascending order, so one pass usually decides; any other order is sorted in a copy.
fn distinct_refs(refs: &[HostRef]) -> bool {
    if refs.windows(2).all(|w| w[0] < w[1]) {
        return true;
    }
    let mut refs = refs.to_vec();
    refs.sort_unstable();
    refs.windows(2).all(|w| w[0] != w[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage_transfer::tests_support::config;
    use messages::HostRange;

    fn dests(refs: &[u64]) -> Vec<(HostRef, HostRange)> {
        refs.iter()
            .map(|r| (HostRef(*r), HostRange::new(*r * 64, 64)))
            .collect()
    }

    #[test]
    fn a_get_naming_one_reference_twice_is_malformed_in_any_order() {
        let cfg = config();
        for refs in [&[3u64, 9, 3][..], &[1, 1], &[9, 4, 7, 4]] {
            let mut credits = Credits::new(&cfg);
            let d = dests(refs);
            let r = admit_get(
                Gates::default(),
                &mut credits,
                &cfg,
                d.len(),
                &d.clone().into(),
            );
            assert!(
                matches!(&r, Err(Refusal::Malformed(m)) if m.contains("appears twice")),
                "{refs:?}: {r:?}"
            );
        }
        // Distinct references pass, ascending (the scheduler's order) or not.
        for refs in [&[1u64, 2, 3][..], &[7, 2, 5], &[4]] {
            let mut credits = Credits::new(&cfg);
            let d = dests(refs);
            assert_eq!(
                admit_get(
                    Gates::default(),
                    &mut credits,
                    &cfg,
                    d.len(),
                    &d.clone().into()
                ),
                Ok(()),
                "{refs:?}"
            );
        }
    }
}
