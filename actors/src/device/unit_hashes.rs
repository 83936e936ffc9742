//! UnitHashes: the emulated device's record, per slot, of the `kv::unit_hash` of every
//! digest unit of the slot's first bytes, taken when those bytes were produced (the
//! forward's writes) or restored (an H2D copy hashes what landed). A forward then
//! digests a context block from its record, O(blocks) instead of O(bytes): what attention
//! reading the block inside the modeled step time costs the emulator.
//!
//! It owns only the records. It never reads the arena on its own: a caller hands it the
//! bytes it just wrote or is about to read, and every path that writes device bytes
//! (`write`, an H2D copy, copy-on-write, the forward's writes) records or invalidates the
//! slot first, so a record always describes the bytes in the slot.

use crate::host::stream_copy;

/// Units smaller than this are not recorded (the record would cost more than 1/16 of
/// the arena): the forward hashes those blocks' bytes as before.
pub const MIN_RECORDED_UNIT: usize = 128;

/// Bytes copied before they are hashed in a fused copy (well inside a core's L2).
pub const FUSED_CHUNK: usize = 64 << 10;

#[derive(Debug, Default)]
struct SlotRecord {
    /// Bytes from the slot's start that `hashes` covers (0: no record).
    len: usize,
    hashes: Vec<u64>,
}

#[derive(Debug)]
pub struct UnitHashes {
    unit: usize,
    slot_bytes: usize,
    slots: Vec<SlotRecord>,
}

impl UnitHashes {
    /// No records and no unit yet (`set_unit` turns recording on).
    pub fn new(slots: usize, slot_bytes: usize) -> Self {
        Self {
            unit: 0,
            slot_bytes,
            slots: (0..slots).map(|_| SlotRecord::default()).collect(),
        }
    }

    /// The digest unit records are taken at (0: not recording). A different unit drops
    /// every record.
    pub fn set_unit(&mut self, unit: usize) {
        let unit = if unit >= MIN_RECORDED_UNIT { unit } else { 0 };
        if unit != self.unit {
            self.unit = unit;
            for s in &mut self.slots {
                s.len = 0;
            }
        }
    }

    pub fn unit(&self) -> usize {
        self.unit
    }

    /// The slot whose first byte is `addr` when `addr..addr + len` lies within it and
    /// `len` is a whole number of units.
    fn recordable(&self, addr: usize, len: usize) -> Option<usize> {
        if self.unit == 0 || self.slot_bytes == 0 {
            return None;
        }
        let slot = addr / self.slot_bytes;
        (addr.is_multiple_of(self.slot_bytes)
            && len <= self.slot_bytes
            && len.is_multiple_of(self.unit)
            && slot < self.slots.len())
        .then_some(slot)
    }

    /// Bytes `addr..addr + len` of the arena are about to change without a record.
    pub fn invalidate(&mut self, addr: usize, len: usize) {
        if self.slot_bytes == 0 || len == 0 {
            return;
        }
        let first = addr / self.slot_bytes;
        let last = (addr + len - 1) / self.slot_bytes;
        for s in first..=last.min(self.slots.len().saturating_sub(1)) {
            self.slots[s].len = 0;
        }
    }

    /// Records the unit hashes of `bytes`, which are now the arena's bytes from `addr`
    /// (a slot's first bytes); where they cannot be recorded the slot's record is dropped.
    pub fn record(&mut self, addr: usize, bytes: &[u8]) {
        let Some(slot) = self.recordable(addr, bytes.len()) else {
            self.invalidate(addr, bytes.len());
            return;
        };
        let unit = self.unit;
        let rec = &mut self.slots[slot];
        rec.hashes.clear();
        rec.hashes
            .extend(bytes.chunks_exact(unit).map(crate::model::kv::unit_hash));
        rec.len = bytes.len();
    }

    /// Copies `src` into `dst` (the arena's bytes from `addr`) and returns the unit hashes
    /// of what landed, when they can be recorded there. The copy runs in chunks of whole
    /// units (about [`FUSED_CHUNK`] bytes), streamed (`stream_copy`), and each chunk is
    /// hashed right after it landed from its source bytes, which the copy just loaded into
    /// cache and stored unchanged: one pass over memory instead of a copy and a re-read.
    /// Where no record can be taken it is a plain (streamed) copy and None.
    pub fn copy_hashed(&self, addr: usize, dst: &mut [u8], src: &[u8]) -> Option<Vec<u64>> {
        if self.recordable(addr, dst.len()).is_none() {
            stream_copy(dst, src);
            return None;
        }
        let unit = self.unit;
        let chunk = unit * (FUSED_CHUNK / unit).max(1);
        let mut hashes = Vec::with_capacity(dst.len() / unit);
        for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            stream_copy(d, s);
            hashes.extend(s.chunks_exact(unit).map(crate::model::kv::unit_hash));
        }
        Some(hashes)
    }

    /// Records `hashes` (from `copy_hashed`) for the `len` bytes now at `addr`; None drops
    /// the record of every slot they touch.
    pub fn store(&mut self, addr: usize, len: usize, hashes: Option<Vec<u64>>) {
        match (hashes, self.recordable(addr, len)) {
            (Some(h), Some(slot)) if h.len() * self.unit == len => {
                let rec = &mut self.slots[slot];
                rec.hashes = h;
                rec.len = len;
            }
            _ => self.invalidate(addr, len),
        }
    }

    /// The recorded unit hashes of the slot at `addr`'s first `len` bytes, when its record
    /// covers them.
    pub fn get(&self, addr: usize, len: usize) -> Option<&[u64]> {
        let slot = self.recordable(addr, len)?;
        let rec = &self.slots[slot];
        (rec.len >= len).then(|| &rec.hashes[..len / self.unit])
    }

    /// The slot at `to` now holds a copy of the slot at `from` (whole slots).
    pub fn copy_record(&mut self, from: usize, to: usize) {
        let (Some(f), Some(t)) = (
            self.recordable(from, self.slot_bytes),
            self.recordable(to, self.slot_bytes),
        ) else {
            self.invalidate(to, self.slot_bytes);
            return;
        };
        if f == t {
            return;
        }
        let (len, hashes) = {
            let src = &self.slots[f];
            (src.len, src.hashes.clone())
        };
        let dst = &mut self.slots[t];
        dst.len = len;
        dst.hashes.clear();
        dst.hashes.extend_from_slice(&hashes);
    }
}

impl UnitHashes {
    /// Slots with a record.
    pub fn recorded(&self) -> usize {
        self.slots.iter().filter(|s| s.len > 0).count()
    }

    /// The first slot whose record does not describe its bytes in `arena` (the invariant
    /// every writer keeps; tests check it after each kind of write).
    pub fn stale_slot(&self, arena: &[u8]) -> Option<usize> {
        self.slots.iter().enumerate().find_map(|(i, s)| {
            let start = i * self.slot_bytes;
            let bytes = arena.get(start..start + s.len)?;
            let fresh = bytes
                .chunks_exact(self.unit.max(1))
                .map(crate::model::kv::unit_hash);
            (s.len > 0 && !fresh.eq(s.hashes.iter().copied())).then_some(i)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kv::{fill_prng, unit_hash};

    const SLOT: usize = 1024;
    const UNIT: usize = 256;

    fn table() -> UnitHashes {
        let mut t = UnitHashes::new(4, SLOT);
        t.set_unit(UNIT);
        t
    }

    fn hashes(bytes: &[u8]) -> Vec<u64> {
        bytes.chunks_exact(UNIT).map(unit_hash).collect()
    }

    #[test]
    fn a_copy_records_the_hashes_of_the_bytes_that_landed() {
        let mut t = table();
        let mut src = vec![0u8; SLOT];
        fill_prng(1, &mut src);
        let mut arena = vec![0u8; 4 * SLOT];
        arena[2 * SLOT..3 * SLOT].copy_from_slice(&src);
        t.record(2 * SLOT, &arena[2 * SLOT..3 * SLOT]);
        assert_eq!(&arena[2 * SLOT..3 * SLOT], &src[..]);
        assert_eq!(t.get(2 * SLOT, SLOT), Some(&hashes(&src)[..]));
        // a prefix of the record serves a shorter block; nothing beyond it
        assert_eq!(t.get(2 * SLOT, 2 * UNIT), Some(&hashes(&src)[..2]));
        assert_eq!(t.get(3 * SLOT, SLOT), None);
        // a partial record does not serve a longer block
        t.record(SLOT, &src[..UNIT]);
        assert_eq!(t.get(SLOT, UNIT), Some(&hashes(&src)[..1]));
        assert_eq!(t.get(SLOT, 2 * UNIT), None);
    }

    #[test]
    fn a_fused_copy_lands_the_bytes_and_hashes_what_landed_chunk_by_chunk() {
        // A slot larger than one fused chunk, so the copy runs in several chunks.
        let slot = FUSED_CHUNK * 2 + 4 * UNIT;
        let mut t = UnitHashes::new(2, slot);
        t.set_unit(UNIT);
        let mut src = vec![0u8; slot];
        fill_prng(9, &mut src);
        let mut arena = vec![0u8; 2 * slot];
        let (first, second) = arena.split_at_mut(slot);
        let h = t.copy_hashed(slot, second, &src).expect("recordable");
        assert_eq!(second, &src[..]);
        assert_eq!(h, hashes(&src), "the same hashes a separate pass takes");
        t.store(slot, slot, Some(h));
        assert_eq!(t.get(slot, slot), Some(&hashes(&src)[..]));
        // not at a slot's start: a plain copy, no record
        assert_eq!(
            t.copy_hashed(4, &mut first[4..4 + UNIT], &src[..UNIT]),
            None
        );
        assert_eq!(&first[4..4 + UNIT], &src[..UNIT]);
        // one wrong source byte changes exactly the hash of its unit
        src[FUSED_CHUNK + 3] ^= 1;
        let h2 = t.copy_hashed(0, first, &src).unwrap();
        let diff: Vec<usize> = (0..h2.len())
            .filter(|i| h2[*i] != hashes(&second[..])[*i])
            .collect();
        assert_eq!(diff, vec![FUSED_CHUNK / UNIT]);
    }

    #[test]
    fn any_write_without_a_record_drops_the_record_of_every_slot_it_touches() {
        let mut t = table();
        let bytes = vec![7u8; SLOT];
        for s in 0..4 {
            t.record(s * SLOT, &bytes);
        }
        t.invalidate(SLOT + 10, SLOT);
        assert!(t.get(0, SLOT).is_some());
        assert_eq!(t.get(SLOT, SLOT), None);
        assert_eq!(t.get(2 * SLOT, SLOT), None);
        assert!(t.get(3 * SLOT, SLOT).is_some());
        // a copy not at a slot's start, or of a length that is no whole number of units,
        // is not recordable: it drops the records it overlaps
        let mut arena = vec![0u8; 4 * SLOT];
        arena[3 * SLOT + 4..3 * SLOT + 8].copy_from_slice(&[1; 4]);
        t.record(3 * SLOT + 4, &arena[3 * SLOT + 4..3 * SLOT + 8]);
        assert_eq!(t.get(3 * SLOT, SLOT), None);
        t.record(0, &bytes[..UNIT + 1]);
        assert_eq!(t.get(0, UNIT), None);
    }

    #[test]
    fn copy_on_write_copies_the_record_and_a_new_unit_drops_all() {
        let mut t = table();
        let mut a = vec![0u8; SLOT];
        fill_prng(2, &mut a);
        t.record(0, &a);
        t.copy_record(0, 3 * SLOT);
        assert_eq!(t.get(3 * SLOT, SLOT), Some(&hashes(&a)[..]));
        t.copy_record(SLOT, 2 * SLOT); // no record at the source: none at the target
        assert_eq!(t.get(2 * SLOT, SLOT), None);
        t.set_unit(2 * UNIT);
        assert_eq!(t.get(0, SLOT), None);
        // units below the recorded minimum turn recording off
        t.set_unit(8);
        assert_eq!(t.unit(), 0);
        t.record(0, &a);
        assert_eq!(t.get(0, SLOT), None);
    }
}
