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
    /// Per key: whether the ticket still holds `refs[i]`.
    pub held: Vec<bool>,
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
        let held = vec![true; refs.len()];
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
            .zip(&self.held)
            .filter(|(_, h)| **h)
            .map(|(r, _)| *r)
    }

    /// Release the reference of row `i` (after retirement). Returns it when it was held.
    pub fn release_row(&mut self, i: usize) -> Option<HostRef> {
        if self.state == TicketState::Quarantined || self.state == TicketState::Settled {
            return None;
        }
        match self.held.get_mut(i) {
            Some(h) if *h => {
                *h = false;
                self.charged_hosts = self.charged_hosts.saturating_sub(1);
                self.refs.get(i).copied()
            }
            _ => None,
        }
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
        self.held.iter_mut().for_each(|h| *h = false);
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

    pub fn is_read(&self) -> bool {
        self.kind != StorageOpKind::Put
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
