//! The CacheCoordinator: geometry, namespace, the Device and Host block pools and the local
//! TailTable, and the operations the Scheduler drives read and write transactions with:
//! admission match (probe), query planning, reservation, publication after GET, Ready-hold
//! release, abandonment, D2H publication, PUT source references and eviction.
//!
//! It owns group matching, allocation and pinning; ordinary probes see published Device and
//! Host data only. It must never establish a hit from a hint (existence hints and tail hints
//! only stand in for the matcher's masks), never free a referenced or pinned block, and never
//! let a map's iteration order shape a result.

use super::credits::{pack, PackScratch, QueryCredits};
use super::geometry::CacheGeometry;
use super::keys::{page_key, BlockAddr, ContentHash, PromptIndex};
use super::matcher::{
    requirement, Availability, BlockSlot, Candidate, Have, MatchTable, RequiredBlock,
};
use super::pool::{page_of, BlockPool, Device, EntryState, HeldBlock, Host, PoolError};
use super::tail::{TailCandidate, TailHint, TailTable};
use messages::{HostRange, Namespace, StorageKey};
use std::cell::Cell;
use std::collections::BTreeSet;
use thiserror::Error;

/// Pool sizes of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Device slots per group.
    pub device_blocks: Vec<u32>,
    /// Host slots per group.
    pub host_blocks: Vec<u32>,
    /// Capacity of the local TailTable.
    pub tail_capacity: usize,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum CacheError {
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("{what}: expected {expected} entries, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("coordinator config: {0}")]
    Config(String),
}

/// What ordinary admission may reuse now (real Device + published Host).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionMatch {
    /// The longest legal boundary.
    pub boundary: u32,
    /// The longest legal boundary from Device alone.
    pub device_tokens: u32,
    /// Tokens above the Device hit that Host supplies (boundary - device_tokens).
    pub host_tokens: u32,
    /// The tail when the boundary is nonaligned.
    pub tail: Option<TailCandidate>,
    /// Host blocks the H2D copies read (required blocks the Device does not hold).
    pub host_blocks: Vec<BlockAddr>,
    /// A partial history block is reused: it follows the tail copy-on-write path.
    pub copy_on_write: bool,
}

/// Limits of the bounded extension a QUERY considers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryLimits {
    /// The extension above the complete local hit (0 = up to the request bound).
    pub lookahead_tokens: u32,
    /// An extension shorter than this bypasses L3.
    pub min_extension_tokens: u32,
}

/// Why a request skips L3 preparation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bypass {
    /// The local hit already covers the reusable request bound.
    LocalCoversBound,
    /// The longest extension is below the configured minimum.
    ExtensionBelowMinimum,
    /// No boundary's complete missing set fits the credits.
    NoCreditFit,
}

/// One boundary a QUERY covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedBoundary {
    pub boundary: u32,
    pub tail: Option<TailCandidate>,
    /// Keys this boundary added (0 when longer boundaries already asked for them).
    pub new_keys: u32,
}

/// One key of a QUERY: a page of a missing block, and the block's place in the prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryRow {
    pub block: BlockAddr,
    pub slot: BlockSlot,
    pub page: u32,
}

/// The QUERY a request needs, or why it needs none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryPlan {
    pub local_tokens: u32,
    pub device_tokens: u32,
    pub bypass: Option<Bypass>,
    /// Primary first, then fallbacks longest first.
    pub boundaries: Vec<PlannedBoundary>,
    pub keys: Vec<StorageKey>,
    /// Parallel to `keys`.
    pub rows: Vec<QueryRow>,
    /// The primary's Host charge (new destinations + warm Host references).
    pub host_blocks: u32,
}

impl QueryPlan {
    /// Turns the agreed per-key existence into block existence hints: a block exists only
    /// when every one of its page keys does. Tail candidates ride along.
    pub fn existence_hints(&self, exists: &[bool]) -> Result<ExistenceHints, CacheError> {
        let mut hints = ExistenceHints::default();
        self.existence_hints_into(exists, &mut hints)?;
        Ok(hints)
    }

    /// `existence_hints` into `out`'s lists (emptied first; a caller that keeps one set of
    /// hints reuses its buffers). On an error `out` is left empty.
    pub fn existence_hints_into(
        &self,
        exists: &[bool],
        out: &mut ExistenceHints,
    ) -> Result<(), CacheError> {
        out.clear();
        if exists.len() != self.rows.len() {
            return Err(CacheError::Length {
                what: "existence",
                expected: self.rows.len(),
                got: exists.len(),
            });
        }
        out.tails
            .extend(self.boundaries.iter().filter_map(|b| b.tail));
        // No key exists (a common answer for a new prompt): no block does either.
        if !exists.contains(&true) {
            return Ok(());
        }
        // A block exists when every one of its rows does. A plan's rows (`plan_query`'s)
        // name each complete block in one run of adjacent rows, blocks in increasing order:
        // one pass then keeps each run whose rows all exist, already sorted and distinct.
        // Rows in any other order take the general pass below.
        let tail_rows = match Self::full_blocks_in_runs(&self.rows, exists, &mut out.full) {
            Some(tail_rows) => tail_rows,
            None => {
                out.full.clear();
                self.full_blocks_any_order(exists, &mut out.full)
            }
        };
        // Tail blocks (a QUERY asks for a few at most): by address, searched linearly.
        if tail_rows {
            let rows = || self.rows.iter().zip(exists);
            let tail_rows = || rows().filter(|(r, _)| r.slot == BlockSlot::Tail);
            for (r, _) in tail_rows().filter(|(_, ok)| **ok) {
                let missing = tail_rows().any(|(m, ok)| !*ok && m.block == r.block);
                if !missing && !out.tail_blocks.contains(&r.block) {
                    out.tail_blocks.push(r.block);
                }
            }
        }
        Ok(())
    }

    /// The existing complete blocks of `rows` into `blocks` when each block's rows are one
    /// run of adjacent rows and the runs' blocks increase (tail rows may come between
    /// runs): then each run whose rows all exist is kept, in order, and the answer is
    /// whether some row is a tail row. None (with `blocks` holding a part) as soon as the
    /// rows are in another order.
    fn full_blocks_in_runs(
        rows: &[QueryRow],
        exists: &[bool],
        blocks: &mut Vec<HintedBlock>,
    ) -> Option<bool> {
        let mut run: Option<(HintedBlock, bool)> = None;
        let mut tail_rows = false;
        for (r, ok) in rows.iter().zip(exists) {
            let BlockSlot::Full(k) = r.slot else {
                tail_rows = true;
                continue;
            };
            let b = HintedBlock::new(r.block, k);
            run = match run {
                Some((last, all)) if last == b => Some((last, all && *ok)),
                Some((last, all)) if last < b => {
                    if all {
                        blocks.push(last);
                    }
                    Some((b, *ok))
                }
                None => Some((b, *ok)),
                Some(_) => return None,
            };
        }
        if let Some((last, true)) = run {
            blocks.push(last);
        }
        Some(tail_rows)
    }

    /// The existing complete blocks of rows in any order into `blocks` (sorted, distinct);
    /// whether some row is a tail row.
    fn full_blocks_any_order(&self, exists: &[bool], blocks: &mut Vec<HintedBlock>) -> bool {
        // The existing rows' blocks gather at the front of the list, the missing rows'
        // behind them; each half is sorted, and one merge pass keeps the distinct existing
        // blocks that no missing row names.
        let mut present = 0;
        let mut tail_rows = false;
        for (r, ok) in self.rows.iter().zip(exists) {
            let BlockSlot::Full(k) = r.slot else {
                tail_rows = true;
                continue;
            };
            blocks.push(HintedBlock::new(r.block, k));
            if *ok {
                let last = blocks.len() - 1;
                blocks.swap(present, last);
                present += 1;
            }
        }
        blocks[..present].sort_unstable();
        blocks[present..].sort_unstable();
        let (mut kept, mut missing) = (0, present);
        for i in 0..present {
            let b = blocks[i];
            if kept > 0 && blocks[kept - 1] == b {
                continue;
            }
            while missing < blocks.len() && blocks[missing] < b {
                missing += 1;
            }
            if blocks.get(missing) == Some(&b) {
                continue;
            }
            blocks[kept] = b;
            kept += 1;
        }
        blocks.truncate(kept);
        tail_rows
    }
}

/// A complete block named by its place in the prompt (group, then position in the group)
/// and its hash: hints are looked up by place (an integer search), and the hash keeps a
/// hint of another prompt from standing in for this one's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HintedBlock {
    /// `group << 32 | position`.
    pub place: u64,
    pub hash: ContentHash,
}

impl HintedBlock {
    pub fn new(addr: BlockAddr, k: u32) -> Self {
        Self {
            place: Self::place(addr.group, k),
            hash: addr.hash,
        }
    }

    fn place(group: u32, k: u32) -> u64 {
        (group as u64) << 32 | k as u64
    }
}

/// Temporary existence hints for reservation: blocks known to exist in L3, and the tail
/// candidates the query covered. They never establish a hit by themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExistenceHints {
    /// Complete blocks, sorted and distinct (looked up by place).
    pub full: Vec<HintedBlock>,
    /// Tail blocks, distinct (looked up by address).
    pub tail_blocks: Vec<BlockAddr>,
    pub tails: Vec<TailCandidate>,
}

impl ExistenceHints {
    /// No block is known to exist.
    pub fn is_empty(&self) -> bool {
        self.full.is_empty() && self.tail_blocks.is_empty()
    }

    /// Forgets every block and tail (the lists keep their buffers).
    pub fn clear(&mut self) {
        self.full.clear();
        self.tail_blocks.clear();
        self.tails.clear();
    }

    /// Whether block `addr`, at `slot` of its group, is known to exist.
    pub fn has(&self, addr: BlockAddr, slot: BlockSlot) -> bool {
        match slot {
            BlockSlot::Full(k) => {
                let place = HintedBlock::place(addr.group, k);
                self.full
                    .binary_search_by(|b| b.place.cmp(&place))
                    .is_ok_and(|i| self.full[i].hash == addr.hash)
            }
            BlockSlot::Tail => self.tail_blocks.contains(&addr),
        }
    }
}

/// One GET (or PUT) row: a page and its Host range (its object key is kept in a list of
/// its own beside the rows, which the operation takes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferRow {
    pub block: BlockAddr,
    pub page: u32,
    pub range: HostRange,
    /// Whether this rank copies the row (page-cyclic owner translation).
    pub locally_owned: bool,
}

/// A PUT's source rows and, beside them, each row's page key.
pub type SourceRows = (Vec<TransferRow>, Vec<StorageKey>);

/// Host destinations reserved for a GET. Holds one reference per destination block (the GET
/// ticket's); no warm dependency stays pinned. Consumed by `publish_host` or `abandon`.
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    pub boundary: u32,
    pub device_tokens: u32,
    pub tail: Option<TailCandidate>,
    pub rows: Vec<TransferRow>,
    /// Each row's page key, in row order: the GET takes the list (no copy of a key).
    pub keys: Vec<StorageKey>,
    /// Destination blocks, each one held reference (its slot kept: published or released
    /// without probing the index again).
    pub destinations: Vec<HeldBlock<Host>>,
    /// New destinations plus temporary warm references checked against the Host credits.
    pub charged_host_blocks: u32,
    /// The boundary is shorter than the longest one the hints made legal.
    pub shortened: bool,
    tail_hint: Option<TailHint>,
    tail_destinations: Vec<BlockAddr>,
}

impl Reservation {
    pub fn host_ranges(&self) -> Vec<HostRange> {
        self.rows.iter().map(|r| r.range).collect()
    }
    /// Whether a GET is needed at all.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A block with its position in its group's page sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlacedBlock {
    pub addr: BlockAddr,
    pub block_index: u64,
}

/// Published blocks protected until admission hands them to an H2D ticket (or expiry), one
/// held reference each.
#[derive(Debug, PartialEq, Eq)]
pub struct ReadyHold {
    pub blocks: Vec<HeldBlock<Host>>,
}

/// See the module documentation.
#[derive(Debug)]
pub struct CacheCoordinator {
    geometry: CacheGeometry,
    namespace: Namespace,
    device: BlockPool<Device>,
    host: BlockPool<Host>,
    tails: TailTable,
    /// The match buffers one planning call borrows and returns (taken out of the cell for
    /// the call, so a match allocates nothing once they have grown to the prompts' size).
    spare: SpareMatch,
    /// Lists of ended reservations and Ready holds, for the next reservations.
    lists: SpareLists,
    /// The last bound `local_covers_bound` found covered (see `CoveredBound`).
    covered: Cell<Option<CoveredBound>>,
}

/// A bound found covered by local data: which prompt prefix (its bound and the hash that
/// names its tokens), and how many entries each pool had withdrawn then. Adding entries
/// never uncovers a bound, so while neither count has moved the same prefix is still
/// covered; a repeated prompt (n samples of one prompt, a retried request) is then
/// answered without probing its blocks again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CoveredBound {
    bound: u32,
    prefix: ContentHash,
    withdrawn: (u64, u64),
}

/// The emptied lists of reservations and Ready holds that ended (at most `SPARE_LISTS` of
/// each kind kept): a reservation takes its rows and destinations lists from here.
#[derive(Debug, Default)]
struct SpareLists {
    rows: Vec<Vec<TransferRow>>,
    held: Vec<Vec<HeldBlock<Host>>>,
}

impl SpareLists {
    fn keep_rows(&mut self, mut rows: Vec<TransferRow>) {
        if rows.capacity() > 0 && self.rows.len() < SPARE_LISTS {
            rows.clear();
            self.rows.push(rows);
        }
    }

    /// Keeps an emptied list of held blocks (one still holding a reference is dropped:
    /// a handle is never forgotten here).
    fn keep_held(&mut self, held: Vec<HeldBlock<Host>>) {
        if held.is_empty() && held.capacity() > 0 && self.held.len() < SPARE_LISTS {
            self.held.push(held);
        }
    }
}

/// The coordinator's match buffers, lent to one call at a time (`take`, then `set` back).
/// Boxed, so a loan moves one pointer, not the buffers' headers; a call made while the
/// buffers are out (none is today) would get fresh ones.
#[derive(Default)]
struct SpareMatch(std::cell::Cell<Option<Box<MatchScratch>>>);

impl SpareMatch {
    fn take(&self) -> Box<MatchScratch> {
        self.0.take().unwrap_or_default()
    }
    fn set(&self, m: Box<MatchScratch>) {
        self.0.set(Some(m))
    }
    /// Lends the buffers to `f` and takes them back.
    fn lend<R>(&self, f: impl FnOnce(&mut MatchScratch) -> R) -> R {
        let mut m = self.take();
        let r = f(&mut m);
        self.set(m);
        r
    }
}

impl std::fmt::Debug for SpareMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpareMatch")
    }
}

/// Buffers a match reuses: the table, the tail candidates, the required blocks, the
/// candidate list and the packing's records; and the lists of QUERY plans answered and
/// handed back (`recycle_plan`), for the next plans.
#[derive(Debug, Default)]
struct MatchScratch {
    table: MatchTable,
    tails: Vec<TailCandidate>,
    required: Vec<RequiredBlock>,
    candidates: Vec<Candidate>,
    pack: PackScratch,
    plans: Vec<PlanLists>,
}

/// The two lists of a handed-back QUERY plan, emptied.
#[derive(Debug, Default)]
struct PlanLists {
    boundaries: Vec<PlannedBoundary>,
    rows: Vec<QueryRow>,
}

/// Emptied lists of one kind kept at most for reuse (about a round's operations; more
/// are freed).
const SPARE_LISTS: usize = 64;

/// A block's level in the real pools (and, for a reservation, the existence hints): a
/// published Device entry, else a published Host entry; a Host entry in flight for another
/// GET is neither visible nor reservable; otherwise a hinted block is Assumed.
struct PoolLevels<'a> {
    device: &'a BlockPool<Device>,
    host: &'a BlockPool<Host>,
    hints: Option<&'a ExistenceHints>,
}

impl Availability for PoolLevels<'_> {
    /// Inlined into the match table's loops (one call per block of every match).
    #[inline(always)]
    fn level(&mut self, a: BlockAddr, slot: BlockSlot) -> Have {
        if self.device.contains(a) {
            return Have::Device;
        }
        match self.host.state(a) {
            Some(EntryState::Published) => Have::Host,
            Some(EntryState::Unpublished) => Have::Missing,
            None => match self.hints {
                Some(h) if h.has(a, slot) => Have::Assumed,
                _ => Have::Missing,
            },
        }
    }
}

impl CacheCoordinator {
    pub fn new(
        geometry: CacheGeometry,
        namespace: Namespace,
        config: &CoordinatorConfig,
    ) -> Result<Self, CacheError> {
        let n = geometry.group_count();
        if config.device_blocks.len() != n || config.host_blocks.len() != n {
            return Err(CacheError::Config(format!(
                "device_blocks and host_blocks need one entry per group ({n})"
            )));
        }
        let bytes: Vec<u64> = geometry.groups().iter().map(|g| g.block_bytes()).collect();
        Ok(Self {
            device: BlockPool::new(&config.device_blocks, &bytes),
            host: BlockPool::new(&config.host_blocks, &bytes),
            tails: TailTable::new(config.tail_capacity),
            spare: Default::default(),
            lists: SpareLists::default(),
            covered: Cell::new(None),
            geometry,
            namespace,
        })
    }

    pub fn geometry(&self) -> &CacheGeometry {
        &self.geometry
    }
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }
    pub fn device(&self) -> &BlockPool<Device> {
        &self.device
    }
    pub fn host(&self) -> &BlockPool<Host> {
        &self.host
    }
    pub fn device_mut(&mut self) -> &mut BlockPool<Device> {
        &mut self.device
    }
    pub fn host_mut(&mut self) -> &mut BlockPool<Host> {
        &mut self.host
    }
    pub fn tail_table(&self) -> &TailTable {
        &self.tails
    }

    /// Bytes of the Host allocation the pools address.
    pub fn host_bytes(&self) -> u64 {
        self.host.region_bytes()
    }

    /// Whether tails are on (the TailTable has capacity): admission matches tail boundaries
    /// and a prompt's partial last blocks are cached under their tail addresses. Off: only
    /// aligned boundaries are queried, reserved and reused.
    pub fn tails_enabled(&self) -> bool {
        self.tails.capacity() > 0
    }

    /// Records the local tail hint of an indexed prompt's nonaligned end `boundary`, once
    /// the blocks of that tail are published on the Device (the forward that writes them is
    /// planned). False when aligned or tails are off. A hint only proposes the boundary.
    pub fn record_prompt_tail(
        &mut self,
        index: &PromptIndex,
        tokens: &[u32],
        boundary: u32,
    ) -> bool {
        if !self.tails_enabled() {
            return false;
        }
        match TailCandidate::at(index, tokens, boundary) {
            Some(t) => self.tails.record(index, t),
            None => false,
        }
    }

    /// Tail candidates of a prompt in (lo, bound]: local hints plus the exact request bound
    /// (none when tails are off), each carrying this prompt's identity at its boundary (the
    /// tail table offers only matching ones; an `extra` tail that does not match is passed
    /// over), so the match table need not hash them again. Into `v` (emptied first).
    fn tail_candidates(
        &self,
        v: &mut Vec<TailCandidate>,
        index: &PromptIndex,
        tokens: &[u32],
        lo: u32,
        bound: u32,
        extra: &[TailCandidate],
    ) {
        v.clear();
        if !self.tails_enabled() {
            return;
        }
        self.tails.candidates_into(v, index, tokens, lo, bound);
        let own = TailCandidate::at(index, tokens, bound);
        v.extend(own);
        let mut scratch = Vec::new();
        for t in extra
            .iter()
            .filter(|t| t.boundary > lo && t.boundary <= bound.min(index.len()))
        {
            // The bound's own identity is already known; any other boundary is hashed.
            let exact = match own {
                Some(o) if o.boundary == t.boundary => o.hash == t.hash,
                _ => {
                    !t.boundary.is_multiple_of(index.parent_tokens().max(1))
                        && index.tail_identity(&mut scratch, tokens, t.boundary) == t.hash
                }
            };
            if exact {
                v.push(*t);
            }
        }
        v.sort();
        v.dedup();
    }

    /// Rebuilds `table` for this prompt over real Device and Host entries (and `hints`).
    #[allow(clippy::too_many_arguments)]
    fn table(
        &self,
        table: &mut MatchTable,
        index: &PromptIndex,
        tokens: &[u32],
        bound: u32,
        tails: &[TailCandidate],
        hints: Option<&ExistenceHints>,
        clamp: Option<Have>,
    ) {
        // Every tail comes from `tail_candidates`: this prompt's own identities.
        let avail = PoolLevels {
            device: &self.device,
            host: &self.host,
            hints,
        };
        table.rebuild(
            &self.geometry,
            index,
            tokens,
            bound,
            tails,
            clamp,
            avail,
            true,
        );
    }

    fn bound(tokens: &[u32], reusable: u32) -> u32 {
        reusable.min(tokens.len() as u32)
    }

    /// The index of `tokens` up to `bound`: a view of the caller's index of the whole
    /// prompt (hashed once per request), or hashed now.
    fn index_for(&self, whole: Option<&PromptIndex>, tokens: &[u32], bound: u32) -> PromptIndex {
        match whole {
            Some(i) => {
                debug_assert!(i.len() >= bound, "an index of the whole prompt");
                i.limited(bound)
            }
            None => PromptIndex::new(&self.geometry, tokens, bound),
        }
    }

    /// Ordinary admission's full answer (and the local probe): the longest legal boundary
    /// over real Device and published Host blocks, how many tokens each tier supplies, the
    /// Host blocks it reads and whether a partial history block is copied on write. Tail
    /// boundaries are candidates when tails are on (`tail_candidates`); off, only aligned
    /// boundaries are. (The scheduler's admission asks `admission_boundary_in`.)
    pub fn admission_match(&self, tokens: &[u32], reusable: u32) -> AdmissionMatch {
        self.spare
            .lend(|m| self.admission_match_into(m, tokens, reusable))
    }

    fn admission_match_into(
        &self,
        m: &mut MatchScratch,
        tokens: &[u32],
        reusable: u32,
    ) -> AdmissionMatch {
        let MatchScratch {
            table,
            tails,
            required,
            ..
        } = m;
        let bound = Self::bound(tokens, reusable);
        let index = self.index_for(None, tokens, bound);
        let (device, best) = self.admission_table(table, tails, &index, tokens, bound);
        let device_tokens = device.map_or(0, |c| c.boundary);
        let Some(best) = best else {
            return AdmissionMatch {
                boundary: 0,
                device_tokens: 0,
                host_tokens: 0,
                tail: None,
                host_blocks: Vec::new(),
                copy_on_write: false,
            };
        };
        table.required_blocks_into(&index, best, required);
        AdmissionMatch {
            boundary: best.boundary,
            device_tokens,
            host_tokens: best.boundary - device_tokens,
            tail: best.tail.map(|i| table.tail(i)),
            host_blocks: required
                .iter()
                .filter(|b| b.have == Have::Host)
                .map(|b| b.addr)
                .collect(),
            copy_on_write: self.partial_history(required),
        }
    }

    /// The admission table over real Device and published Host blocks: the longest
    /// boundary legal on the Device alone, and the longest legal over both.
    fn admission_table(
        &self,
        table: &mut MatchTable,
        tails: &mut Vec<TailCandidate>,
        index: &PromptIndex,
        tokens: &[u32],
        bound: u32,
    ) -> (Option<Candidate>, Option<Candidate>) {
        self.tail_candidates(tails, index, tokens, 0, bound, &[]);
        self.table(table, index, tokens, bound, tails, None, Some(Have::Host));
        (table.longest(0, Have::Device), table.longest(0, Have::Host))
    }

    /// `admission_match`'s boundary and Device tokens only, over the request's index of its
    /// whole prompt (what admission plans its blocks from): no list of the Host blocks, no
    /// copy-on-write check.
    pub fn admission_boundary_in(
        &self,
        whole: &PromptIndex,
        tokens: &[u32],
        reusable: u32,
    ) -> (u32, u32) {
        self.spare.lend(|m| {
            let bound = Self::bound(tokens, reusable);
            let index = self.index_for(Some(whole), tokens, bound);
            let (device, best) =
                self.admission_table(&mut m.table, &mut m.tails, &index, tokens, bound);
            (
                best.map_or(0, |c| c.boundary),
                device.map_or(0, |c| c.boundary),
            )
        })
    }

    fn partial_history(&self, required: &[RequiredBlock]) -> bool {
        required.iter().any(|b| {
            b.slot == BlockSlot::Tail
                && self.geometry.group(b.addr.group as usize).kind
                    != super::geometry::GroupKind::State
        })
    }

    /// Whether the request bound itself is legal over real Device and published Host blocks
    /// (every block it requires, its tail blocks included, is local): then local data covers
    /// the bound and no QUERY can extend the hit (`plan_query_rows_in` would bypass with
    /// `LocalCoversBound`). It looks up only the bound's own requirement, the highest blocks
    /// first and then the tail, and builds no match table: false at the first missing block.
    /// The same prefix found covered last time, with nothing withdrawn from either pool
    /// since, is covered without probing (`CoveredBound`).
    /// A nonaligned bound with tails off is no candidate, so false.
    pub fn local_covers_bound(&self, whole: &PromptIndex, tokens: &[u32], reusable: u32) -> bool {
        let bound = Self::bound(tokens, reusable).min(whole.len());
        if bound == 0 {
            return true;
        }
        let aligned = bound.is_multiple_of(self.geometry.parent_tokens());
        if !aligned && !self.tails_enabled() {
            return false;
        }
        let mut scratch = Vec::new();
        // The hash naming tokens [0, bound): the parent chain at an aligned bound, else the
        // tail identity there (worked out once per request by its whole index).
        let prefix = if aligned {
            whole.parent_hash(bound / self.geometry.parent_tokens())
        } else {
            whole.tail_identity(&mut scratch, tokens, bound)
        };
        let now = CoveredBound {
            bound,
            prefix,
            withdrawn: (self.device.withdrawn(), self.host.withdrawn()),
        };
        if self.covered.get() == Some(now) {
            return true;
        }
        for (g, spec) in self.geometry.groups().iter().enumerate() {
            let (on_device, on_host) = (self.device.published_in(g), self.host.published_in(g));
            let local = |h: ContentHash| on_device(h) || on_host(h);
            let (start, end, tail) = requirement(spec.kind, spec.block_tokens, bound);
            // The bound lies inside the index, so its blocks are all hashed. They are looked
            // up (highest first) before the tail block is hashed: a new prompt misses there.
            let Some(blocks) = whole.block_hashes(g).get(start as usize..end as usize) else {
                return false;
            };
            if !blocks.iter().rev().all(|&h| local(h)) {
                return false;
            }
            if tail && !local(whole.tail_block_hash(&mut scratch, tokens, g, bound)) {
                return false;
            }
        }
        self.covered.set(Some(now));
        true
    }

    /// Query planning: the keys of the Host suffix above the complete local hit, packed
    /// into the credits (longest complete boundary first, whole-set fallbacks after).
    pub fn plan_query(
        &self,
        tokens: &[u32],
        reusable: u32,
        credits: QueryCredits,
        limits: QueryLimits,
    ) -> QueryPlan {
        let mut plan = self.plan_query_rows(tokens, reusable, credits, limits);
        plan.keys = self.query_keys(&plan);
        plan
    }

    /// The page keys of a plan's rows, in row order (what `plan_query` puts in `keys`).
    pub fn query_keys(&self, plan: &QueryPlan) -> Vec<StorageKey> {
        plan.rows
            .iter()
            .map(|r| page_key(&self.namespace, &self.geometry, r.block, r.page))
            .collect()
    }

    /// `plan_query` without the page keys (`keys` stays empty; `query_keys` makes them):
    /// a caller whose QUERY may still be refused builds no key strings for nothing.
    pub fn plan_query_rows(
        &self,
        tokens: &[u32],
        reusable: u32,
        credits: QueryCredits,
        limits: QueryLimits,
    ) -> QueryPlan {
        self.plan_query_rows_in(None, tokens, reusable, credits, limits)
    }

    /// `plan_query_rows` over the request's index of its whole prompt (None: hashed now).
    pub fn plan_query_rows_in(
        &self,
        whole: Option<&PromptIndex>,
        tokens: &[u32],
        reusable: u32,
        credits: QueryCredits,
        limits: QueryLimits,
    ) -> QueryPlan {
        self.spare
            .lend(|m| self.plan_query_rows_into(m, whole, tokens, reusable, credits, limits))
    }

    fn plan_query_rows_into(
        &self,
        m: &mut MatchScratch,
        whole: Option<&PromptIndex>,
        tokens: &[u32],
        reusable: u32,
        credits: QueryCredits,
        limits: QueryLimits,
    ) -> QueryPlan {
        let MatchScratch {
            table,
            tails,
            candidates,
            pack: pack_scratch,
            plans,
            ..
        } = m;
        let bound = Self::bound(tokens, reusable);
        let index = self.index_for(whole, tokens, bound);
        self.tail_candidates(tails, &index, tokens, 0, bound, &[]);
        self.table(table, &index, tokens, bound, tails, None, None);
        let (local, device) = table.longest_pair(0, Have::Host, Have::Device);
        let local = local.map_or(0, |c| c.boundary);
        let device = device.map_or(0, |c| c.boundary);
        let mut plan = QueryPlan {
            local_tokens: local,
            device_tokens: device,
            bypass: None,
            boundaries: Vec::new(),
            keys: Vec::new(),
            rows: Vec::new(),
            host_blocks: 0,
        };
        if local >= bound {
            plan.bypass = Some(Bypass::LocalCoversBound);
            return plan;
        }
        let hi = if limits.lookahead_tokens == 0 {
            bound
        } else {
            bound.min(local.saturating_add(limits.lookahead_tokens))
        };
        candidates.clear();
        candidates.extend(table.candidates_in(local, hi));
        match candidates.first() {
            Some(c) if c.boundary - local >= limits.min_extension_tokens.max(1) => {}
            _ => {
                plan.bypass = Some(Bypass::ExtensionBelowMinimum);
                return plan;
            }
        }
        let Some(packing) = pack(pack_scratch, table, &index, candidates, credits) else {
            plan.bypass = Some(Bypass::NoCreditFit);
            return plan;
        };
        plan.host_blocks = packing.host_blocks;
        // A QUERY goes out: its lists are those of an answered plan when one was handed
        // back (`recycle_plan`), so a steady flow of QUERYs allocates none.
        let lists = plans.pop().unwrap_or_default();
        plan.boundaries = lists.boundaries;
        plan.rows = lists.rows;
        plan.boundaries
            .extend(packing.boundaries.iter().map(|b| PlannedBoundary {
                boundary: b.candidate.boundary,
                tail: b.candidate.tail.map(|i| table.tail(i)),
                new_keys: b.new_keys,
            }));
        let rows: usize = packing
            .blocks
            .iter()
            .map(|b| table.pages(b.addr.group as usize) as usize)
            .sum();
        plan.rows.reserve_exact(rows);
        for b in packing.blocks {
            for page in 0..table.pages(b.addr.group as usize) {
                plan.rows.push(QueryRow {
                    block: b.addr,
                    slot: b.slot,
                    page,
                });
            }
        }
        plan
    }

    /// Takes back an answered (or abandoned) QUERY plan: its lists, emptied, serve the next
    /// plans (at most `SPARE_LISTS` are kept).
    pub fn recycle_plan(&self, plan: QueryPlan) {
        let QueryPlan {
            mut boundaries,
            mut rows,
            ..
        } = plan;
        if boundaries.capacity() == 0 && rows.capacity() == 0 {
            return;
        }
        self.spare.lend(|m| {
            if m.plans.len() < SPARE_LISTS {
                boundaries.clear();
                rows.clear();
                m.plans.push(PlanLists { boundaries, rows });
            }
        });
    }

    /// The handed-back plan lists kept now (`recycle_plan`).
    pub fn spare_plans(&self) -> usize {
        self.spare.lend(|m| m.plans.len())
    }

    /// Reservation after agreed existence: re-match above the Device-only hit with the
    /// hints, pin the real Host dependencies while allocating destinations, shorten and retry
    /// under shortage, and release the temporary pins before returning.
    pub fn reserve(
        &mut self,
        tokens: &[u32],
        reusable: u32,
        hints: &ExistenceHints,
        host_credits: u32,
    ) -> Result<Reservation, CacheError> {
        self.reserve_in(None, tokens, reusable, hints, host_credits)
    }

    /// `reserve` over the request's index of its whole prompt (None: hashed now).
    pub fn reserve_in(
        &mut self,
        whole: Option<&PromptIndex>,
        tokens: &[u32],
        reusable: u32,
        hints: &ExistenceHints,
        host_credits: u32,
    ) -> Result<Reservation, CacheError> {
        let mut m = self.spare.take();
        let r = self.reserve_into(&mut m, whole, tokens, reusable, hints, host_credits);
        self.spare.set(m);
        r
    }

    fn reserve_into(
        &mut self,
        m: &mut MatchScratch,
        whole: Option<&PromptIndex>,
        tokens: &[u32],
        reusable: u32,
        hints: &ExistenceHints,
        host_credits: u32,
    ) -> Result<Reservation, CacheError> {
        let MatchScratch {
            table,
            tails,
            required,
            ..
        } = m;
        let bound = Self::bound(tokens, reusable);
        let index = self.index_for(whole, tokens, bound);
        self.tail_candidates(tails, &index, tokens, 0, bound, &hints.tails);
        self.table(
            table,
            &index,
            tokens,
            bound,
            tails,
            Some(hints),
            Some(Have::Assumed),
        );
        let device_tokens = table.longest(0, Have::Device).map_or(0, |c| c.boundary);
        let mut longest_legal = None;
        let ceiling = table.legal_ceiling(Have::Assumed);
        for c in table.candidates_in(device_tokens, ceiling) {
            let t = table.tally(c);
            if !t.legal_at(Have::Assumed) {
                continue;
            }
            longest_legal.get_or_insert(c.boundary);
            let shortened = longest_legal != Some(c.boundary);
            let dest = t.blocks_at(Have::Assumed);
            let warm = t.blocks_at(Have::Host);
            let tail = c.tail.map(|i| table.tail(i));
            if dest == 0 {
                // Local data covers this boundary: nothing to read.
                return Ok(self.empty_reservation(c.boundary, device_tokens, tail, shortened));
            }
            if dest + warm > host_credits {
                continue;
            }
            table.required_blocks_into(&index, c, required);
            if let Some(mut r) = self.try_allocate(required, dest + warm)? {
                r.boundary = c.boundary;
                r.device_tokens = device_tokens;
                r.tail = tail;
                r.shortened = shortened;
                r.tail_hint = tail.and_then(|t| TailHint::of(&index, t));
                return Ok(r);
            }
        }
        Ok(self.empty_reservation(
            device_tokens,
            device_tokens,
            None,
            longest_legal.is_some_and(|b| b > device_tokens),
        ))
    }

    fn empty_reservation(
        &self,
        boundary: u32,
        device_tokens: u32,
        tail: Option<TailCandidate>,
        shortened: bool,
    ) -> Reservation {
        Reservation {
            boundary,
            device_tokens,
            tail,
            rows: Vec::new(),
            keys: Vec::new(),
            destinations: Vec::new(),
            charged_host_blocks: 0,
            shortened,
            tail_hint: None,
            tail_destinations: Vec::new(),
        }
    }

    /// Pins warm Host dependencies, allocates every destination or none, unpins.
    fn try_allocate(
        &mut self,
        required: &[RequiredBlock],
        charge: u32,
    ) -> Result<Option<Reservation>, CacheError> {
        // Walked in place (no lists of their own): the warm Host dependencies, and the
        // destinations (every Assumed block), allocated in order.
        let warm = || {
            required
                .iter()
                .filter(|b| b.have == Have::Host)
                .map(|b| b.addr)
        };
        for a in warm() {
            self.host.pin(a)?;
        }
        let dests = || required.iter().filter(|b| b.have == Have::Assumed);
        let enough = (0..self.geometry.group_count()).all(|g| {
            let n = dests().filter(|b| b.addr.group as usize == g).count() as u64;
            self.host.available(g as u32) >= n
        });
        // The first `taken` destinations are allocated; each one's rows are written as it
        // is (its Host range comes with the allocation).
        // The rows and destinations lists of an ended reservation when there is one.
        let mut held = self.lists.held.pop().unwrap_or_default();
        let mut ok = enough;
        let (mut rows, mut keys) = (self.lists.rows.pop().unwrap_or_default(), Vec::new());
        if enough {
            let pages: usize = dests()
                .map(|b| self.geometry.group(b.addr.group as usize).pages_per_block as usize)
                .sum();
            rows.reserve_exact(pages);
            keys.reserve_exact(pages);
            held.reserve_exact(dests().count());
            for b in dests() {
                let Ok((_, h, block)) = self.host.allocate_held(b.addr) else {
                    ok = false;
                    break;
                };
                held.push(h);
                let g = b.addr.group as usize;
                let spec = self.geometry.group(g);
                for page in 0..spec.pages_per_block {
                    keys.push(page_key(&self.namespace, &self.geometry, b.addr, page));
                    rows.push(TransferRow {
                        block: b.addr,
                        page,
                        range: page_of(block, page, spec.page_bytes),
                        locally_owned: self.geometry.owns_page(g, b.block_index, page),
                    });
                }
            }
        }
        let taken = held.len();
        let result = if ok {
            Some(Reservation {
                boundary: 0,
                device_tokens: 0,
                tail: None,
                rows,
                keys,
                destinations: held,
                charged_host_blocks: charge,
                shortened: false,
                tail_hint: None,
                tail_destinations: dests()
                    .take(taken)
                    .filter(|b| b.slot == BlockSlot::Tail)
                    .map(|b| b.addr)
                    .collect(),
            })
        } else {
            for h in held.drain(..) {
                self.host.release_held(h)?;
            }
            self.lists.keep_held(held);
            self.lists.keep_rows(rows);
            None
        };
        for a in warm() {
            self.host.unpin(a)?;
        }
        Ok(result)
    }

    /// Publication after the GET retired on every owner: blocks whose rows all succeeded
    /// become published Host entries under a Ready hold; the others are freed. A tail hint
    /// is recorded only after Host data was published under it.
    pub fn publish_host(
        &mut self,
        reservation: Reservation,
        row_ok: &[bool],
    ) -> Result<ReadyHold, CacheError> {
        if row_ok.len() != reservation.rows.len() {
            let expected = reservation.rows.len();
            // The reservation is dropped with its references still held: a malformed
            // completion is the caller's protocol error, never a free.
            return Err(CacheError::Length {
                what: "row results",
                expected,
                got: row_ok.len(),
            });
        }
        let mut failed = BTreeSet::new();
        for (row, ok) in reservation.rows.iter().zip(row_ok) {
            if !ok {
                failed.insert(row.block);
            }
        }
        self.lists.keep_rows(reservation.rows);
        // The hold keeps the published destinations (their held references) in the
        // reservation's own list; a failed one (rare) leaves it, released.
        let mut blocks = reservation.destinations;
        let mut i = 0;
        while i < blocks.len() {
            if failed.contains(&blocks[i].addr()) {
                self.host.release_held(blocks.remove(i))?;
            } else {
                self.host.publish_held(&blocks[i])?;
                i += 1;
            }
        }
        let hold = ReadyHold { blocks };
        if let Some(hint) = reservation.tail_hint {
            let published = !reservation.tail_destinations.is_empty()
                && reservation
                    .tail_destinations
                    .iter()
                    .all(|a| !failed.contains(a));
            if published {
                self.tails.record_hint(hint);
            }
        }
        Ok(hold)
    }

    /// Ends a Ready hold (expiry, or after admission took its own references).
    pub fn release_hold(&mut self, hold: ReadyHold) -> Result<(), CacheError> {
        self.release_list(hold.blocks)
    }

    /// Gives a list's held references back, then keeps the emptied list for the next
    /// reservation.
    fn release_list(&mut self, mut blocks: Vec<HeldBlock<Host>>) -> Result<(), CacheError> {
        for h in blocks.drain(..) {
            self.host.release_held(h)?;
        }
        self.lists.keep_held(blocks);
        Ok(())
    }

    /// Frees a reservation whose GET retired without publishing (detached, cancelled or
    /// expired). Never call it for an unretired (quarantined) operation.
    pub fn abandon(&mut self, reservation: Reservation) -> Result<(), CacheError> {
        self.lists.keep_rows(reservation.rows);
        self.release_list(reservation.destinations)
    }

    /// The ended reservations' lists kept now: (rows lists, destinations lists).
    pub fn spare_reservation_lists(&self) -> (usize, usize) {
        (self.lists.rows.len(), self.lists.held.len())
    }

    /// Gives held Host references back (each without an index probe).
    pub fn release_held(
        &mut self,
        blocks: impl IntoIterator<Item = HeldBlock<Host>>,
    ) -> Result<(), CacheError> {
        for h in blocks {
            self.host.release_held(h)?;
        }
        Ok(())
    }

    /// Takes one reference on each published Host block (H2D ticket at admission).
    pub fn acquire_host_refs(&mut self, blocks: &[BlockAddr]) -> Result<(), CacheError> {
        for (i, b) in blocks.iter().enumerate() {
            if !self.host.contains(*b) {
                for done in &blocks[..i] {
                    self.host.release(*done)?;
                }
                return Err(PoolError::Unknown {
                    tier: "host",
                    group: b.group,
                }
                .into());
            }
            self.host.acquire(*b)?;
        }
        Ok(())
    }

    pub fn release_host_refs(&mut self, blocks: &[BlockAddr]) -> Result<(), CacheError> {
        for b in blocks {
            self.host.release(*b)?;
        }
        Ok(())
    }

    /// Every block a prefill of `tokens[..upto]` computes: complete Full and SWA blocks and
    /// the State checkpoint at each complete interval.
    pub fn computed_blocks(&self, tokens: &[u32], upto: u32) -> Vec<BlockAddr> {
        self.placed_blocks(tokens, upto)
            .into_iter()
            .map(|b| b.addr)
            .collect()
    }

    /// `computed_blocks` with each block's position (what owner translation needs, e.g. for
    /// backup candidates).
    pub fn placed_blocks(&self, tokens: &[u32], upto: u32) -> Vec<PlacedBlock> {
        let index = PromptIndex::new(&self.geometry, tokens, upto);
        let mut out = Vec::new();
        for g in 0..self.geometry.group_count() {
            for k in 0..index.full_blocks(g) {
                out.push(PlacedBlock {
                    addr: BlockAddr::new(g, index.block_hash(g, k)),
                    block_index: k as u64,
                });
            }
        }
        out
    }

    /// The blocks a boundary requires (tail blocks included when it is nonaligned).
    pub fn blocks_at(&self, tokens: &[u32], boundary: u32) -> Vec<BlockAddr> {
        let boundary = Self::bound(tokens, boundary);
        let index = PromptIndex::new(&self.geometry, tokens, boundary);
        let tails: Vec<TailCandidate> = TailCandidate::at(&index, tokens, boundary)
            .into_iter()
            .collect();
        let table = MatchTable::build(
            &self.geometry,
            &index,
            tokens,
            boundary,
            &tails,
            None,
            |_, _| Have::Missing,
        );
        let c = Candidate {
            boundary,
            tail: if tails.is_empty() { None } else { Some(0) },
        };
        table
            .required_blocks(&index, c)
            .into_iter()
            .map(|b| b.addr)
            .collect()
    }

    /// Inserts computed Device blocks (published, unreferenced).
    pub fn insert_device(&mut self, blocks: &[BlockAddr]) -> Result<Vec<ContentHash>, CacheError> {
        let mut evicted = Vec::new();
        for b in blocks {
            self.device.insert_published(*b, &mut evicted)?;
        }
        Ok(evicted)
    }

    /// D2H completion: publishes Host L2 entries immediately (never waits for L3). Returns
    /// the blocks that were new (backup candidates).
    pub fn publish_d2h(&mut self, blocks: &[BlockAddr]) -> Result<Vec<BlockAddr>, CacheError> {
        let mut evicted = Vec::new();
        let mut new = Vec::new();
        for b in blocks {
            if self.host.insert_published(*b, &mut evicted)? {
                new.push(*b);
            }
        }
        Ok(new)
    }

    /// PUT dispatch: rechecks Host residency and takes one source reference per block;
    /// the rows and their page keys. None (and no reference) when any block is no longer
    /// resident.
    pub fn backup_sources(
        &mut self,
        blocks: &[PlacedBlock],
    ) -> Result<Option<SourceRows>, CacheError> {
        if !blocks.iter().all(|b| self.host.contains(b.addr)) {
            return Ok(None);
        }
        let addrs: Vec<BlockAddr> = blocks.iter().map(|b| b.addr).collect();
        self.acquire_host_refs(&addrs)?;
        let (mut rows, mut keys) = (Vec::new(), Vec::new());
        for b in blocks {
            let g = b.addr.group as usize;
            let spec = self.geometry.group(g);
            for page in 0..spec.pages_per_block {
                keys.push(page_key(&self.namespace, &self.geometry, b.addr, page));
                rows.push(TransferRow {
                    block: b.addr,
                    page,
                    range: self.host.page_range(b.addr, page, spec.page_bytes)?,
                    locally_owned: self.geometry.owns_page(g, b.block_index, page),
                });
            }
        }
        Ok(Some((rows, keys)))
    }

    /// A full clear (cache clear, namespace rotation, weight update) without draining:
    /// every unreferenced Device and Host block is freed, referenced ones become invisible
    /// and free when their references drop (in-flight storage I/O keeps its bytes), the
    /// tails are forgotten, and later keys use `namespace`. Returns the blocks kept for
    /// their references.
    pub fn clear(&mut self, namespace: Namespace) -> usize {
        let kept = self.device.clear() + self.host.clear();
        self.tails = TailTable::new(self.tails.capacity());
        self.namespace = namespace;
        kept
    }

    /// Drops the local caches without touching L3 or the namespace: the Device pool
    /// always, the Host pool when `host`. Referenced blocks stay (invisible) until their
    /// references end, as with `clear`. Returns how many blocks were kept that way.
    pub fn reset_local(&mut self, host: bool) -> usize {
        let mut kept = self.device.clear();
        if host {
            kept += self.host.clear();
        }
        kept
    }

    /// Evicts up to `n` unreferenced Host blocks of a group (LRU).
    pub fn evict_host(&mut self, group: u32, n: usize) -> Vec<ContentHash> {
        self.host.evict_lru(group, n)
    }

    /// Evicts up to `n` unreferenced Device blocks of a group (LRU).
    pub fn evict_device(&mut self, group: u32, n: usize) -> Vec<ContentHash> {
        self.device.evict_lru(group, n)
    }
}
