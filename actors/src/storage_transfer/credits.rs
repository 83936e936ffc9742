//! Operation credits and Host credits (StorageConfig: operation_credits, max_host_blocks).
//! Reads (QUERY/GET) may use the whole budget; backups (PUT) at most half of each, rounded
//! down. This module only counts: it never allocates Host blocks and never decides which
//! operation runs. A charge that does not fit changes nothing.

use messages::settings::StorageConfig;

/// Which budget an operation draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CreditClass {
    /// QUERY and GET: may use every credit.
    Read,
    /// PUT: at most half of the operation credits and half of the Host credits.
    Backup,
}

/// Credits in use against the fixed budgets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credits {
    operation_total: u32,
    host_total: u32,
    backup_operation_max: u32,
    backup_host_max: u32,
    operations_used: u32,
    hosts_used: u32,
    backup_operations_used: u32,
    backup_hosts_used: u32,
}

impl Credits {
    pub fn new(cfg: &StorageConfig) -> Self {
        Self {
            operation_total: cfg.operation_credits,
            host_total: cfg.max_host_blocks,
            backup_operation_max: cfg.backup_operation_credits(),
            backup_host_max: cfg.backup_host_credits(),
            operations_used: 0,
            hosts_used: 0,
            backup_operations_used: 0,
            backup_hosts_used: 0,
        }
    }

    /// Whether `ops` operation credits and `hosts` Host credits fit the class's budget now.
    pub fn fits(&self, class: CreditClass, ops: u32, hosts: u32) -> bool {
        let total_ok = self.operations_used as u64 + ops as u64 <= self.operation_total as u64
            && self.hosts_used as u64 + hosts as u64 <= self.host_total as u64;
        match class {
            CreditClass::Read => total_ok,
            CreditClass::Backup => {
                total_ok
                    && self.backup_operations_used as u64 + ops as u64
                        <= self.backup_operation_max as u64
                    && self.backup_hosts_used as u64 + hosts as u64 <= self.backup_host_max as u64
            }
        }
    }

    /// Charge when it fits; returns false (and changes nothing) otherwise.
    pub fn charge(&mut self, class: CreditClass, ops: u32, hosts: u32) -> bool {
        if !self.fits(class, ops, hosts) {
            return false;
        }
        self.operations_used += ops;
        self.hosts_used += hosts;
        if class == CreditClass::Backup {
            self.backup_operations_used += ops;
            self.backup_hosts_used += hosts;
        }
        true
    }

    /// Return credits charged earlier by the same class. Amounts come from the ticket's own
    /// record, so they never exceed what is in use.
    pub fn release(&mut self, class: CreditClass, ops: u32, hosts: u32) {
        debug_assert!(ops <= self.operations_used && hosts <= self.hosts_used);
        self.operations_used = self.operations_used.saturating_sub(ops);
        self.hosts_used = self.hosts_used.saturating_sub(hosts);
        if class == CreditClass::Backup {
            debug_assert!(ops <= self.backup_operations_used && hosts <= self.backup_hosts_used);
            self.backup_operations_used = self.backup_operations_used.saturating_sub(ops);
            self.backup_hosts_used = self.backup_hosts_used.saturating_sub(hosts);
        }
    }

    /// A write budget that can never admit a PUT (half of one credit rounds down to zero):
    /// candidates are rejected at once instead of waiting.
    pub fn write_budget_zero(&self) -> bool {
        self.backup_operation_max == 0 || self.backup_host_max == 0
    }

    /// Every Host credit is in use: a new QUERY is rejected before backend work.
    pub fn host_exhausted(&self) -> bool {
        self.hosts_used >= self.host_total
    }

    pub fn operations_used(&self) -> u32 {
        self.operations_used
    }
    pub fn hosts_used(&self) -> u32 {
        self.hosts_used
    }
    pub fn backup_operations_used(&self) -> u32 {
        self.backup_operations_used
    }
    pub fn backup_hosts_used(&self) -> u32 {
        self.backup_hosts_used
    }
    pub fn operation_total(&self) -> u32 {
        self.operation_total
    }
    pub fn host_total(&self) -> u32 {
        self.host_total
    }
    pub fn backup_operation_max(&self) -> u32 {
        self.backup_operation_max
    }
    pub fn backup_host_max(&self) -> u32 {
        self.backup_host_max
    }
    /// Most Host credits a backup could take right now.
    pub fn backup_hosts_available(&self) -> u32 {
        let total_left = self.host_total.saturating_sub(self.hosts_used);
        let backup_left = self.backup_host_max.saturating_sub(self.backup_hosts_used);
        total_left.min(backup_left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage_transfer::tests_support::config;

    #[test]
    fn reads_use_everything_backups_half_rounded_down() {
        let mut c = config();
        c.operation_credits = 5;
        c.max_host_blocks = 9;
        let mut k = Credits::new(&c);
        assert_eq!(k.backup_operation_max(), 2);
        assert_eq!(k.backup_host_max(), 4);
        assert!(k.charge(CreditClass::Backup, 1, 4));
        assert!(
            !k.charge(CreditClass::Backup, 1, 1),
            "backup Host half is 4"
        );
        assert!(k.charge(CreditClass::Backup, 1, 0));
        assert!(!k.charge(CreditClass::Backup, 1, 0), "backup op half is 2");
        assert!(k.charge(CreditClass::Read, 3, 5));
        assert!(!k.charge(CreditClass::Read, 1, 0), "all 5 in use");
        assert_eq!(k.operations_used(), 5);
        k.release(CreditClass::Backup, 1, 4);
        assert_eq!(k.backup_hosts_used(), 0);
        assert_eq!(k.hosts_used(), 5);
        assert!(k.fits(CreditClass::Read, 1, 4));
        assert!(!k.fits(CreditClass::Read, 1, 5));
    }

    #[test]
    fn one_credit_budget_admits_reads_and_no_backups() {
        let mut c = config();
        c.operation_credits = 1;
        let mut k = Credits::new(&c);
        assert!(k.write_budget_zero());
        assert!(!k.fits(CreditClass::Backup, 1, 1));
        assert!(k.charge(CreditClass::Read, 1, 3));
    }

    #[test]
    fn failed_charge_changes_nothing() {
        let mut c = config();
        c.operation_credits = 2;
        c.max_host_blocks = 2;
        let mut k = Credits::new(&c);
        let before = k.clone();
        assert!(!k.charge(CreditClass::Read, 1, 3));
        assert_eq!(k, before);
        assert!(k.charge(CreditClass::Read, 1, 2));
        assert!(k.host_exhausted());
    }

    /// The budgets against a model that keeps every charge still outstanding: a charge
    /// fits when the sums with it stay within the totals (and, for a backup, within the
    /// backup halves); every getter answers from those sums; a release returns exactly
    /// what its charge took.
    mod model {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Step {
            Charge(bool, u32, u32),
            Release(usize),
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                3 => (any::<bool>(), 0u32..4, 0u32..6).prop_map(|(b, o, h)| Step::Charge(b, o, h)),
                2 => (0usize..16).prop_map(Step::Release),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(300))]

            #[test]
            fn credits_keep_every_promise_of_their_model(
                ops_total in 0u32..7,
                host_total in 0u32..12,
                steps in proptest::collection::vec(step(), 1..40),
            ) {
                let mut c = config();
                c.operation_credits = ops_total;
                c.max_host_blocks = host_total;
                let mut k = Credits::new(&c);
                let (bops, bhosts) = (ops_total / 2, host_total / 2);
                prop_assert_eq!(k.operation_total(), ops_total);
                prop_assert_eq!(k.host_total(), host_total);
                prop_assert_eq!(k.backup_operation_max(), bops);
                prop_assert_eq!(k.backup_host_max(), bhosts);
                prop_assert_eq!(k.write_budget_zero(), bops == 0 || bhosts == 0);
                let mut held: Vec<(CreditClass, u32, u32)> = vec![];
                let sum = |held: &[(CreditClass, u32, u32)], backup_only: bool| {
                    held.iter()
                        .filter(|(cl, ..)| !backup_only || *cl == CreditClass::Backup)
                        .fold((0, 0), |(o, h), (_, a, b)| (o + a, h + b))
                };
                for st in steps {
                    match st {
                        Step::Charge(backup, o, h) => {
                            let class = if backup { CreditClass::Backup } else { CreditClass::Read };
                            let (uo, uh) = sum(&held, false);
                            let (bo, bh) = sum(&held, true);
                            let fits = uo + o <= ops_total
                                && uh + h <= host_total
                                && (!backup || (bo + o <= bops && bh + h <= bhosts));
                            prop_assert_eq!(k.fits(class, o, h), fits);
                            prop_assert_eq!(k.charge(class, o, h), fits);
                            if fits {
                                held.push((class, o, h));
                            }
                        }
                        Step::Release(i) => {
                            if held.is_empty() {
                                continue;
                            }
                            let (class, o, h) = held.swap_remove(i % held.len());
                            k.release(class, o, h);
                        }
                    }
                    let (uo, uh) = sum(&held, false);
                    let (bo, bh) = sum(&held, true);
                    prop_assert_eq!(k.operations_used(), uo);
                    prop_assert_eq!(k.hosts_used(), uh);
                    prop_assert_eq!(k.backup_operations_used(), bo);
                    prop_assert_eq!(k.backup_hosts_used(), bh);
                    prop_assert_eq!(k.host_exhausted(), uh >= host_total);
                    prop_assert_eq!(
                        k.backup_hosts_available(),
                        (host_total - uh).min(bhosts - bh)
                    );
                }
            }
        }
    }
}
