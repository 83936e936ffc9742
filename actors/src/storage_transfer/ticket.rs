//! Storage tickets: one per operation (QUERY, GET or PUT), named by a monotonic, never
//! reused OperationId. A ticket records its rows: a QUERY's and a GET's object keys, the
//! Host references it holds (GET destinations, PUT sources), a PUT's backup keys and bytes
//! (an operation's ranges, and a PUT's object keys, went out with it and are not kept
//! twice); the credits charged to it, its attached waiter and its state: Issued -> Completed (agreed StorageDone applied) -> Settled, or
//! Quarantined (an unretired result: every reference kept for the life of the process).
//! A ticket settles
//! exactly once; only settlement returns its credits. A ticket never releases a reference
//! before the agreed completion says the operation retired.

use super::credits::CreditClass;
use super::HostRef;
use crate::row_set::RowSet;
use messages::{OperationId, RequestId, StorageKey, StorageOpKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TicketState {
    /// Submitted; no agreed completion yet. References are held for native I/O.
    Issued,
    /// An agreed, retired completion was applied; the ticket still holds a Ready hold.
    Completed,
    /// An agreed, unretired completion: every reference is kept forever, credits stay
    /// charged.
    Quarantined,
    /// Credits returned and every reference released. Terminal.
    Settled,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub op: OperationId,
    pub kind: StorageOpKind,
    pub class: CreditClass,
    /// Per row of a GET: its object key (empty for a QUERY, whose keys went out with it,
    /// and for a PUT, whose rows are named by `backup`).
    pub keys: Vec<StorageKey>,
    /// The rows a completion must report: a QUERY's keys, a GET's or PUT's references.
    rows: usize,
    /// Per row of a GET or PUT: the Host reference (destination or source); empty for a
    /// QUERY.
    pub refs: Vec<HostRef>,
    /// Per row: whether the ticket still holds `refs[i]`.
    held: RowSet,
    /// Operation credits charged (1 until settlement).
    pub charged_operations: u32,
    /// Host credits charged: one per held reference.
    pub charged_hosts: u32,
    pub state: TicketState,
    /// The attached read waiter; None once detached (a detached result never publishes).
    pub waiter: Option<RequestId>,
    /// The clear epoch it was issued in (a cleared epoch's PUT never re-offers).
    pub epoch: u64,
    pub issued_us: u64,
    /// A StorageCancelOp was already emitted for it.
    pub cancel_sent: bool,
    /// A PUT's backup keys, row by row (for its settlement and re-offers); empty otherwise.
    pub backup: Vec<super::backup::BackupKey>,
    /// A PUT's source bytes (returned to the backup byte bound at settlement); 0 otherwise.
    pub put_bytes: u64,
}

impl Ticket {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        op: OperationId,
        kind: StorageOpKind,
        class: CreditClass,
        keys: Vec<StorageKey>,
        refs: Vec<HostRef>,
        waiter: Option<RequestId>,
        epoch: u64,
        issued_us: u64,
    ) -> Self {
        let held = RowSet::all(refs.len());
        let charged_hosts = refs.len() as u32;
        let rows = match kind {
            StorageOpKind::Query => keys.len(),
            StorageOpKind::Get | StorageOpKind::Put => refs.len(),
        };
        Self {
            op,
            kind,
            class,
            keys,
            rows,
            refs,
            held,
            charged_operations: 1,
            charged_hosts,
            state: TicketState::Issued,
            waiter,
            epoch,
            issued_us,
            cancel_sent: false,
            backup: Vec::new(),
            put_bytes: 0,
        }
    }

    /// The same ticket carrying a PUT's backup keys (one per row, beside its source
    /// references) and its source bytes.
    pub fn with_backup(mut self, backup: Vec<super::backup::BackupKey>, bytes: u64) -> Self {
        debug_assert_eq!(backup.len(), self.refs.len(), "one backup key per row");
        self.backup = backup;
        self.put_bytes = bytes;
        self
    }

    /// A QUERY's ticket: `keys` rows (the keys themselves go out with the operation).
    pub fn query(
        op: OperationId,
        keys: usize,
        waiter: RequestId,
        epoch: u64,
        issued_us: u64,
    ) -> Self {
        let mut t = Self::new(
            op,
            StorageOpKind::Query,
            CreditClass::Read,
            Vec::new(),
            Vec::new(),
            Some(waiter),
            epoch,
            issued_us,
        );
        t.rows = keys;
        t
    }

    /// The rows a completion must report: a QUERY's keys, a GET's or PUT's references.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// References the ticket still holds, in key order.
    pub fn held_refs(&self) -> Vec<HostRef> {
        self.held().collect()
    }

    fn held(&self) -> impl Iterator<Item = HostRef> + '_ {
        self.refs
            .iter()
            .enumerate()
            .filter(|(i, _)| self.held.contains(*i))
            .map(|(_, r)| *r)
    }

    /// Release the reference of row `i` (after retirement). Returns it when it was held.
    pub fn release_row(&mut self, i: usize) -> Option<HostRef> {
        if self.state == TicketState::Quarantined || self.state == TicketState::Settled {
            return None;
        }
        if !self.held.remove(i) {
            return None;
        }
        self.charged_hosts = self.charged_hosts.saturating_sub(1);
        self.refs.get(i).copied()
    }

    /// Settle: release every remaining reference, appended to `released`. Returns the
    /// (operation credits, Host credits) to return, or None (nothing appended) when the
    /// ticket cannot settle (already settled or quarantined).
    pub fn settle(&mut self, released: &mut Vec<HostRef>) -> Option<(u32, u32)> {
        if self.state == TicketState::Settled || self.state == TicketState::Quarantined {
            return None;
        }
        let before = released.len();
        released.extend(self.held());
        let hosts = self.charged_hosts;
        let ops = self.charged_operations;
        // charged_hosts always equals the number of held references.
        debug_assert_eq!(hosts as usize, released.len() - before);
        self.held.clear();
        self.charged_hosts = 0;
        self.charged_operations = 0;
        self.state = TicketState::Settled;
        Some((ops, hosts))
    }

    /// Quarantine: keep every held reference and every charged credit for good.
    pub fn quarantine(&mut self) -> Vec<HostRef> {
        self.state = TicketState::Quarantined;
        self.waiter = None;
        self.held_refs()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_ticket() -> Ticket {
        Ticket::new(
            OperationId(1),
            StorageOpKind::Get,
            CreditClass::Read,
            vec![StorageKey::new("a"), StorageKey::new("b")],
            vec![HostRef(10), HostRef(11)],
            Some(RequestId(7)),
            0,
            0,
        )
    }

    #[test]
    fn settles_exactly_once_and_releases_each_reference_once() {
        let mut t = get_ticket();
        assert_eq!(t.release_row(1), Some(HostRef(11)));
        assert_eq!(t.release_row(1), None);
        assert_eq!(t.charged_hosts, 1);
        let mut refs = Vec::new();
        let (ops, hosts) = t.settle(&mut refs).unwrap();
        assert_eq!(refs, vec![HostRef(10)]);
        assert_eq!((ops, hosts), (1, 1));
        assert_eq!(t.state, TicketState::Settled);
        assert!(t.settle(&mut Vec::new()).is_none());
        let mut kept = vec![HostRef(99)];
        assert_eq!(t.settle(&mut kept), None);
        assert_eq!(kept, vec![HostRef(99)], "a settled ticket appends nothing");
        let mut t = get_ticket();
        assert_eq!(t.settle(&mut kept), Some((1, 2)));
        assert_eq!(kept, vec![HostRef(99), HostRef(10), HostRef(11)]);
    }

    /// Rows past the first word are held and released one by one like the first ones,
    /// and no row past the ticket's own is ever held.
    #[test]
    fn a_ticket_holds_each_of_many_rows_once() {
        for n in [0usize, 1, 63, 64, 65, 128, 130] {
            let refs: Vec<HostRef> = (0..n as u64).map(HostRef).collect();
            let mut t = Ticket::new(
                OperationId(2),
                StorageOpKind::Put,
                CreditClass::Backup,
                Vec::new(),
                refs.clone(),
                None,
                0,
                0,
            );
            assert_eq!(t.held_refs(), refs, "{n} rows");
            assert_eq!(t.release_row(n), None, "no row {n} of {n}");
            assert_eq!(t.release_row(n + 64), None);
            let released: Vec<usize> = (0..n).filter(|i| i % 3 == 1).collect();
            for &i in &released {
                assert_eq!(t.release_row(i), Some(HostRef(i as u64)));
                assert_eq!(t.release_row(i), None);
            }
            let mut settled = Vec::new();
            let (_, hosts) = t.settle(&mut settled).unwrap();
            let kept: Vec<HostRef> = refs
                .iter()
                .copied()
                .filter(|r| !released.contains(&(r.0 as usize)))
                .collect();
            assert_eq!(settled, kept, "{n} rows");
            assert_eq!(hosts as usize, kept.len());
            assert!(t.held_refs().is_empty());
        }
    }

    #[test]
    fn quarantine_keeps_references_and_never_settles() {
        let mut t = get_ticket();
        assert_eq!(t.quarantine(), vec![HostRef(10), HostRef(11)]);
        assert!(t.settle(&mut Vec::new()).is_none());
        assert_eq!(t.release_row(0), None);
        assert_eq!(t.charged_hosts, 2);
        assert_eq!(t.waiter, None);
    }
}
