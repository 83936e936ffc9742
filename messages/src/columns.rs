//! The columnar form of one report's completion records (format version 4): every record
//! of a report as flat columns (operation IDs, key counts, kinds and flags, one bitset per
//! per-key mask over the report's concatenated keys, the byte counts, the error texts), so
//! a report of any number of records decodes in one pass into a dozen arrays and a record
//! is a borrowed [`DoneView`] into them: no allocation, map or field name per record.
//!
//! This module owns the layout, its strict decoding and the per-record view (with the same
//! validation rules as [`StorageDone::validate`]). It never reduces records across owners
//! (that is agreement's job). Decoding never panics and never allocates more than the
//! bytes received justify: every malformed block is an error.
//!
//! Wire layout (inside one msgpack `bin`; "varint" is unsigned LEB128, minimal length):
//!
//! ```text
//! varint n (records), varint K (keys of all records), varint E (error text bytes)
//! n x varint   operation ID, zigzag delta from the previous record's (the first from 0)
//! n x varint   key count (they sum to K)
//! n x u8       bits 0-1 kind (query, get, put), bit 2 retired, bit 3 rejected,
//!              bit 4 error, bit 5 new writes (non-zero); other bits zero
//! u8           rejection code, for each rejected record in order
//! varint       new writes (non-zero), for each record with bit 5
//! varint       error text length, for each record with bit 4 (they sum to E)
//! 4 x W x u64  little-endian bitsets (W = ceil(K / 64)): success, missing, invalid,
//!              capacity; bit k is key k of the concatenated keys; bits >= K zero; no key
//!              both missing and invalid
//! K x varint   bytes per key
//! E bytes      the error texts, UTF-8, concatenated
//! ```

use crate::ids::OperationId;
use crate::ops::{ObjectFailure, ProtocolError, Rejection, StorageDone, StorageOpKind, REJECTIONS};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

const KIND: u8 = 0b11;
const RETIRED: u8 = 1 << 2;
const REJECTED: u8 = 1 << 3;
const ERRORED: u8 = 1 << 4;
const NEW_WRITES: u8 = 1 << 5;
const DEFINED: u8 = KIND | RETIRED | REJECTED | ERRORED | NEW_WRITES;

/// One report's completion records as columns. Built from records ([`Self::from_records`])
/// or decoded from the wire; equal columns encode to equal bytes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CompletionColumns {
    ops: Vec<u64>,
    /// Kind and flags of each record (the wire's per-record byte, rejection bit included).
    heads: Vec<u8>,
    rejections: Vec<Option<Rejection>>,
    new_writes: Vec<u32>,
    /// Record i's keys are `key_end[i - 1]..key_end[i]` of the concatenated keys.
    key_end: Vec<u32>,
    /// Record i's error text is `errors[err_end[i - 1]..err_end[i]]` (when bit 4 is set).
    err_end: Vec<u32>,
    errors: String,
    success: Vec<u64>,
    missing: Vec<u64>,
    invalid: Vec<u64>,
    capacity: Vec<u64>,
    bytes: Vec<u64>,
}

impl fmt::Debug for CompletionColumns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|v| v.to_done()))
            .finish()
    }
}

/// Bits `start..start + len` (len 1..=64) of a bitset, as the low bits of one word.
fn bits(words: &[u64], start: usize, len: usize) -> u64 {
    let (w, b) = (start / 64, start % 64);
    let lo = words.get(w).copied().unwrap_or(0) >> b;
    let hi = if b == 0 {
        0
    } else {
        words.get(w + 1).copied().unwrap_or(0) << (64 - b)
    };
    let v = lo | hi;
    if len >= 64 {
        v
    } else {
        v & ((1u64 << len) - 1)
    }
}

fn set_bit(words: &mut [u64], k: usize) {
    if let Some(w) = words.get_mut(k / 64) {
        *w |= 1 << (k % 64);
    }
}

fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A cursor over a received block; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }

    fn u8(&mut self) -> Result<u8, String> {
        let b = *self
            .buf
            .get(self.at)
            .ok_or_else(|| "completion columns end early".to_string())?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| "completion columns end early".to_string())?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    #[inline]
    fn varint(&mut self) -> Result<u64, String> {
        if let Some(&b) = self.buf.get(self.at) {
            if b < 0x80 {
                self.at += 1;
                return Ok(u64::from(b));
            }
        }
        self.varint_long()
    }

    fn varint_long(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            let part = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                return Err("completion columns: varint overflows 64 bits".into());
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    return Err("completion columns: varint is not minimal".into());
                }
                return Ok(v);
            }
        }
        Err("completion columns: varint overflows 64 bits".into())
    }

    /// A count of items that each take at least `min_bytes` of what is left.
    fn count(&mut self, min_bytes: usize, what: &str) -> Result<usize, String> {
        let n = self.varint()?;
        if n > (self.remaining() / min_bytes.max(1)) as u64 || n > u64::from(u32::MAX) {
            return Err(format!(
                "completion columns: {n} {what} cannot fit in {} bytes",
                self.remaining()
            ));
        }
        Ok(n as usize)
    }

    fn words(&mut self, n: usize) -> Result<Vec<u64>, String> {
        let raw = self.take(n.checked_mul(8).ok_or("completion columns overflow")?)?;
        Ok(raw
            .chunks_exact(8)
            .map(|c| {
                let mut w = [0u8; 8];
                w.copy_from_slice(c);
                u64::from_le_bytes(w)
            })
            .collect())
    }
}

impl CompletionColumns {
    /// The columns of `records` (in their order). A record whose per-key masks differ in
    /// length has no columnar form: its validation error is returned.
    pub fn from_records(records: &[StorageDone]) -> Result<Self, ProtocolError> {
        let n = records.len();
        let total: usize = records.iter().map(|d| d.success.len()).sum();
        let words = total.div_ceil(64);
        let mut c = Self {
            ops: Vec::with_capacity(n),
            heads: Vec::with_capacity(n),
            rejections: Vec::with_capacity(n),
            new_writes: Vec::with_capacity(n),
            key_end: Vec::with_capacity(n),
            err_end: Vec::with_capacity(n),
            errors: String::new(),
            success: vec![0; words],
            missing: vec![0; words],
            invalid: vec![0; words],
            capacity: vec![0; words],
            bytes: Vec::with_capacity(total),
        };
        if total > u32::MAX as usize {
            return Err(ProtocolError::new(
                records.first().map_or(OperationId(0), |d| d.op),
                format!("{total} keys in one report"),
            ));
        }
        let mut base = 0usize;
        for d in records {
            let k = d.success.len();
            if d.bytes.len() != k || d.failures.len() != k || d.capacity.len() != k {
                return Err(d.validate().err().unwrap_or_else(|| {
                    ProtocolError::new(d.op, "per-key masks differ in length")
                }));
            }
            for i in 0..k {
                if d.success[i] {
                    set_bit(&mut c.success, base + i);
                }
                match d.failures[i] {
                    Some(ObjectFailure::Missing) => set_bit(&mut c.missing, base + i),
                    Some(ObjectFailure::Invalid) => set_bit(&mut c.invalid, base + i),
                    None => {}
                }
                if d.capacity[i] {
                    set_bit(&mut c.capacity, base + i);
                }
            }
            c.bytes.extend_from_slice(&d.bytes);
            base += k;
            let mut head = d.kind.index() as u8;
            if d.retired {
                head |= RETIRED;
            }
            if d.rejection.is_some() {
                head |= REJECTED;
            }
            if let Some(e) = &d.error {
                head |= ERRORED;
                c.errors.push_str(e);
            }
            if d.new_writes != 0 {
                head |= NEW_WRITES;
            }
            if c.errors.len() > u32::MAX as usize {
                return Err(ProtocolError::new(d.op, "error texts too long"));
            }
            c.ops.push(d.op.0);
            c.heads.push(head);
            c.rejections.push(d.rejection);
            c.new_writes.push(d.new_writes);
            c.key_end.push(base as u32);
            c.err_end.push(c.errors.len() as u32);
        }
        Ok(c)
    }

    /// The records as owned [`StorageDone`]s (allocates per record: not for the round's
    /// hot path).
    pub fn to_records(&self) -> Vec<StorageDone> {
        self.iter().map(|v| v.to_done()).collect()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Keys of all records together.
    pub fn total_keys(&self) -> usize {
        self.bytes.len()
    }

    /// Record `i`, if there is one.
    pub fn get(&self, i: usize) -> Option<DoneView<'_>> {
        (i < self.len()).then(|| DoneView::new(self, i))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = DoneView<'_>> + '_ {
        (0..self.len()).map(move |i| DoneView::new(self, i))
    }

    /// Operation IDs of the records, in report order.
    pub fn op_ids(&self) -> &[u64] {
        &self.ops
    }

    /// Kind and flag byte of each record (bits 0-1 the kind: query, get, put).
    pub fn kinds_and_flags(&self) -> &[u8] {
        &self.heads
    }

    /// Where each record's keys end in the concatenated keys (record i's keys are
    /// `key_ends()[i - 1]..key_ends()[i]`, the first's from 0).
    pub fn key_ends(&self) -> &[u32] {
        &self.key_end
    }

    /// The per-key masks over the concatenated keys, as little-endian-ordered 64-key words
    /// (bit k of word w is key 64w + k): success, missing, invalid, capacity.
    pub fn mask_words(&self) -> [&[u64]; 4] {
        [&self.success, &self.missing, &self.invalid, &self.capacity]
    }

    /// Bytes per key over the concatenated keys.
    pub fn all_bytes(&self) -> &[u64] {
        &self.bytes
    }

    /// Whether every record passes [`DoneView::validate`], checked column by column: the
    /// mask conflicts word by word over the whole report, the per-record rules only where
    /// a record's kind or flags make them apply.
    pub fn all_valid(&self) -> bool {
        let conflicts = self
            .success
            .iter()
            .zip(&self.missing)
            .zip(&self.invalid)
            .zip(&self.capacity)
            .any(|(((s, m), i), c)| s & (m | i | c) != 0);
        if conflicts {
            return false;
        }
        let any_failure = self.missing.iter().chain(&self.invalid).any(|w| *w != 0);
        let any_capacity = self.capacity.iter().any(|w| *w != 0);
        let any_in = |mask: &[u64], start: usize, len: usize| {
            (0..len.div_ceil(64)).any(|c| bits(mask, start + c * 64, (len - c * 64).min(64)) != 0)
        };
        let mut start = 0usize;
        for (i, (&h, &end)) in self.heads.iter().zip(&self.key_end).enumerate() {
            let (s, len) = (start, end as usize - start);
            start = end as usize;
            let kind = h & KIND;
            if h & NEW_WRITES != 0 {
                let w = self.new_writes.get(i).copied().unwrap_or(0);
                if kind != 2 || w as usize > len {
                    return false;
                }
            }
            let failures =
                any_failure && (any_in(&self.missing, s, len) || any_in(&self.invalid, s, len));
            if kind != 1 && failures {
                return false;
            }
            if kind != 2 && any_capacity && any_in(&self.capacity, s, len) {
                return false;
            }
            if kind == 0
                && self
                    .bytes
                    .get(s..s + len)
                    .is_some_and(|b| b.iter().any(|b| *b != 0))
            {
                return false;
            }
            if h & REJECTED != 0 && (h & RETIRED == 0 || failures || any_in(&self.success, s, len))
            {
                return false;
            }
        }
        true
    }

    /// The wire bytes (the body of the `bin` this type serializes as).
    pub fn to_wire(&self) -> Vec<u8> {
        let n = self.len();
        let k = self.total_keys();
        let mut out = Vec::with_capacity(16 + n * 4 + k.div_ceil(64) * 32 + k * 3);
        put_varint(&mut out, n as u64);
        put_varint(&mut out, k as u64);
        put_varint(&mut out, self.errors.len() as u64);
        let mut prev = 0u64;
        for &op in &self.ops {
            put_varint(&mut out, zigzag(op.wrapping_sub(prev) as i64));
            prev = op;
        }
        let mut start = 0u32;
        for &end in &self.key_end {
            put_varint(&mut out, u64::from(end - start));
            start = end;
        }
        out.extend_from_slice(&self.heads);
        for r in self.rejections.iter().flatten() {
            out.push(REJECTIONS.iter().position(|x| x == r).unwrap_or(0) as u8);
        }
        for (&h, &w) in self.heads.iter().zip(&self.new_writes) {
            if h & NEW_WRITES != 0 {
                put_varint(&mut out, u64::from(w));
            }
        }
        let mut start = 0u32;
        for (&h, &end) in self.heads.iter().zip(&self.err_end) {
            if h & ERRORED != 0 {
                put_varint(&mut out, u64::from(end - start));
            }
            start = end;
        }
        for mask in [&self.success, &self.missing, &self.invalid, &self.capacity] {
            for w in mask {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        for &b in &self.bytes {
            put_varint(&mut out, b);
        }
        out.extend_from_slice(self.errors.as_bytes());
        out
    }

    /// Decodes and checks a block made by [`Self::to_wire`]. Any other input is an error.
    pub fn from_wire(buf: &[u8]) -> Result<Self, String> {
        let mut r = Reader { buf, at: 0 };
        // Each record takes at least 3 bytes (op, key count, head), each key one byte.
        let n = r.count(3, "records")?;
        let k = r.count(1, "keys")?;
        let e = r.count(1, "error bytes")?;
        let mut c = Self {
            ops: Vec::with_capacity(n),
            heads: Vec::with_capacity(n),
            rejections: Vec::with_capacity(n),
            new_writes: Vec::with_capacity(n),
            key_end: Vec::with_capacity(n),
            err_end: Vec::with_capacity(n),
            ..Self::default()
        };
        let mut prev = 0u64;
        for _ in 0..n {
            prev = prev.wrapping_add(unzigzag(r.varint()?) as u64);
            c.ops.push(prev);
        }
        let mut end = 0u64;
        for _ in 0..n {
            end += r.varint()?.min(u64::from(u32::MAX) + 1);
            if end > k as u64 {
                return Err(format!(
                    "completion columns: key counts exceed the {k} keys"
                ));
            }
            c.key_end.push(end as u32);
        }
        if end != k as u64 {
            return Err(format!(
                "completion columns: key counts sum to {end}, not {k}"
            ));
        }
        c.heads.extend_from_slice(r.take(n)?);
        for (i, &h) in c.heads.iter().enumerate() {
            if h & !DEFINED != 0 || (h & KIND) > 2 {
                return Err(format!(
                    "completion columns: record {i} has undefined kind or flags {h:#04x}"
                ));
            }
        }
        for &h in &c.heads {
            c.rejections.push(if h & REJECTED != 0 {
                let code = r.u8()?;
                Some(
                    *REJECTIONS
                        .get(code as usize)
                        .ok_or_else(|| format!("completion columns: unknown rejection {code}"))?,
                )
            } else {
                None
            });
        }
        for &h in &c.heads {
            c.new_writes.push(if h & NEW_WRITES != 0 {
                match r.varint()? {
                    0 => return Err("completion columns: new writes flagged but zero".into()),
                    w => u32::try_from(w)
                        .map_err(|_| format!("completion columns: {w} new writes"))?,
                }
            } else {
                0
            });
        }
        let mut end = 0u64;
        for &h in &c.heads {
            if h & ERRORED != 0 {
                end += r.varint()?.min(u64::from(u32::MAX) + 1);
                if end > e as u64 {
                    return Err(format!(
                        "completion columns: error lengths exceed the {e} bytes"
                    ));
                }
            }
            c.err_end.push(end as u32);
        }
        if end != e as u64 {
            return Err(format!(
                "completion columns: error lengths sum to {end}, not {e}"
            ));
        }
        let words = k.div_ceil(64);
        c.success = r.words(words)?;
        c.missing = r.words(words)?;
        c.invalid = r.words(words)?;
        c.capacity = r.words(words)?;
        let tail = if k % 64 == 0 { 0 } else { !0u64 << (k % 64) };
        for (name, mask) in [
            ("success", &c.success),
            ("missing", &c.missing),
            ("invalid", &c.invalid),
            ("capacity", &c.capacity),
        ] {
            if mask.last().is_some_and(|w| w & tail != 0) {
                return Err(format!("completion columns: {name} bits past the keys"));
            }
        }
        if let Some(w) = c
            .missing
            .iter()
            .zip(&c.invalid)
            .position(|(m, i)| m & i != 0)
        {
            let both = c.missing[w] & c.invalid[w];
            let key = w * 64 + both.trailing_zeros() as usize;
            let rec = c.key_end.partition_point(|&end| end as usize <= key);
            let (op, first) = (
                c.ops.get(rec).copied().unwrap_or(0),
                rec.checked_sub(1)
                    .and_then(|p| c.key_end.get(p))
                    .map_or(0, |&s| s as usize),
            );
            return Err(format!(
                "{}: key {} is both missing and invalid",
                OperationId(op),
                key - first
            ));
        }
        c.bytes.reserve_exact(k);
        for _ in 0..k {
            c.bytes.push(r.varint()?);
        }
        c.errors = std::str::from_utf8(r.take(e)?)
            .map_err(|_| "completion columns: error text is not UTF-8".to_string())?
            .to_string();
        if c.err_end
            .iter()
            .any(|&end| !c.errors.is_char_boundary(end as usize))
        {
            return Err("completion columns: error text split inside a character".into());
        }
        if r.remaining() != 0 {
            return Err(format!(
                "completion columns: {} bytes after the last column",
                r.remaining()
            ));
        }
        Ok(c)
    }
}

impl Serialize for CompletionColumns {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_wire())
    }
}

impl<'de> Deserialize<'de> for CompletionColumns {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CompletionColumns;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("completion columns as bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                CompletionColumns::from_wire(v).map_err(E::custom)
            }
        }
        d.deserialize_bytes(V)
    }
}

/// `#[serde(with)]` for a report's `Vec<StorageDone>`: the records travel as columns.
pub mod records {
    use super::*;

    pub fn serialize<S: Serializer>(records: &[StorageDone], s: S) -> Result<S::Ok, S::Error> {
        CompletionColumns::from_records(records)
            .map_err(serde::ser::Error::custom)?
            .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StorageDone>, D::Error> {
        Ok(CompletionColumns::deserialize(d)?.to_records())
    }
}

/// One record of [`CompletionColumns`], borrowed: where its keys lie in the report's
/// columns is worked out once, when the view is made.
#[derive(Clone, Copy)]
pub struct DoneView<'a> {
    c: &'a CompletionColumns,
    i: usize,
    head: u8,
    /// This record's keys are `start..start + len` of the concatenated keys.
    start: usize,
    len: usize,
}

impl fmt::Debug for DoneView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_done().fmt(f)
    }
}

impl<'a> DoneView<'a> {
    fn new(c: &'a CompletionColumns, i: usize) -> Self {
        let start = i
            .checked_sub(1)
            .and_then(|p| c.key_end.get(p))
            .map_or(0, |&s| s as usize);
        let end = c.key_end.get(i).map_or(start, |&e| e as usize);
        Self {
            c,
            i,
            head: c.heads.get(i).copied().unwrap_or(0),
            start,
            len: end.saturating_sub(start),
        }
    }

    pub fn op(&self) -> OperationId {
        OperationId(self.c.ops.get(self.i).copied().unwrap_or(0))
    }

    pub fn kind(&self) -> StorageOpKind {
        match self.head & KIND {
            0 => StorageOpKind::Query,
            1 => StorageOpKind::Get,
            _ => StorageOpKind::Put,
        }
    }

    /// Keys of this record.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn retired(&self) -> bool {
        self.head & RETIRED != 0
    }

    pub fn rejection(&self) -> Option<Rejection> {
        if self.head & REJECTED == 0 {
            return None;
        }
        self.c.rejections.get(self.i).copied().flatten()
    }

    pub fn error(&self) -> Option<&'a str> {
        if self.head & ERRORED == 0 {
            return None;
        }
        let start = self
            .i
            .checked_sub(1)
            .and_then(|p| self.c.err_end.get(p))
            .map_or(0, |&s| s as usize);
        let end = self.c.err_end.get(self.i).map_or(start, |&e| e as usize);
        self.c.errors.get(start..end)
    }

    pub fn new_writes(&self) -> u32 {
        if self.head & NEW_WRITES == 0 {
            return 0;
        }
        self.c.new_writes.get(self.i).copied().unwrap_or(0)
    }

    /// Bytes per key.
    pub fn bytes(&self) -> &'a [u64] {
        self.c
            .bytes
            .get(self.start..self.start + self.len)
            .unwrap_or(&[])
    }

    /// Number of 64-key chunks of the per-key masks.
    pub fn chunks(&self) -> usize {
        self.len.div_ceil(64)
    }

    /// Chunk `c` of all four masks: keys `64c..64c + 64` as (success, missing, invalid,
    /// capacity) words, bit j being key 64c + j; bits past the record's keys are zero.
    #[inline]
    pub fn masks(&self, c: usize) -> [u64; 4] {
        let len = self.len.saturating_sub(c * 64).min(64);
        if len == 0 {
            return [0; 4];
        }
        let at = self.start + c * 64;
        [
            bits(&self.c.success, at, len),
            bits(&self.c.missing, at, len),
            bits(&self.c.invalid, at, len),
            bits(&self.c.capacity, at, len),
        ]
    }

    /// [`StorageDone::validate`] over the view: the same rules, in the same order, with the
    /// same messages (the masks of a view always have equal lengths).
    pub fn validate(&self) -> Result<(), ProtocolError> {
        let err = |m: String| Err(ProtocolError::new(self.op(), m));
        let n = self.len();
        let (mut failures, mut capacity, mut success) = (false, false, false);
        for c in 0..self.chunks() {
            let [s, missing, invalid, cap] = self.masks(c);
            let f = missing | invalid;
            let bad = s & (f | cap);
            if bad != 0 {
                let j = bad.trailing_zeros();
                let key = c * 64 + j as usize;
                return if f >> j & 1 == 1 {
                    err(format!("key {key} reports success and an object failure"))
                } else {
                    err(format!(
                        "key {key} reports success and a capacity rejection"
                    ))
                };
            }
            failures |= f != 0;
            capacity |= cap != 0;
            success |= s != 0;
        }
        let kind = self.kind();
        if kind != StorageOpKind::Get && failures {
            return err(format!("{} cannot report read failures", kind.as_str()));
        }
        if kind != StorageOpKind::Put && capacity {
            return err(format!(
                "{} cannot report capacity rejections",
                kind.as_str()
            ));
        }
        if kind == StorageOpKind::Query && self.bytes().iter().any(|b| *b != 0) {
            return err("query cannot report transferred bytes".into());
        }
        if kind != StorageOpKind::Put && self.new_writes() != 0 {
            return err("only put reports new writes".into());
        }
        if self.new_writes() as usize > n {
            return err("more new writes than keys".into());
        }
        if self.rejection().is_some() {
            if !self.retired() {
                return err("a rejected operation is always retired".into());
            }
            if success || failures {
                return err("a rejected operation carries no per-key facts".into());
            }
        }
        Ok(())
    }

    /// The record as an owned [`StorageDone`].
    pub fn to_done(&self) -> StorageDone {
        let n = self.len;
        let s = self.start;
        let bit = |m: &[u64], i: usize| bits(m, s + i, 1) == 1;
        StorageDone {
            op: self.op(),
            kind: self.kind(),
            success: (0..n).map(|i| bit(&self.c.success, i)).collect(),
            bytes: self.bytes().to_vec(),
            failures: (0..n)
                .map(|i| {
                    if bit(&self.c.invalid, i) {
                        Some(ObjectFailure::Invalid)
                    } else if bit(&self.c.missing, i) {
                        Some(ObjectFailure::Missing)
                    } else {
                        None
                    }
                })
                .collect(),
            capacity: (0..n).map(|i| bit(&self.c.capacity, i)).collect(),
            retired: self.retired(),
            rejection: self.rejection(),
            error: self.error().map(str::to_string),
            new_writes: self.new_writes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(op: u64, keys: usize, seed: u64) -> StorageDone {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let kind = StorageOpKind::ALL[(next() % 3) as usize];
        let mut d = StorageDone::query(OperationId(op), vec![false; keys], next() % 4 != 0);
        d.kind = kind;
        for i in 0..keys {
            match next() % 6 {
                0 | 1 => d.success[i] = true,
                2 => d.failures[i] = Some(ObjectFailure::Missing),
                3 => d.failures[i] = Some(ObjectFailure::Invalid),
                4 => d.capacity[i] = true,
                _ => {}
            }
            d.bytes[i] = match next() % 3 {
                0 => 0,
                1 => 4096,
                _ => next(),
            };
        }
        d.rejection = (next() % 5 == 0).then(|| REJECTIONS[(next() % 7) as usize]);
        d.error = (next() % 4 == 0).then(|| format!("é{}", next() % 1000));
        d.new_writes = (next() % 3) as u32 * (next() % 2) as u32;
        d
    }

    #[test]
    fn columns_round_trip_records_and_views_validate_like_records() {
        for keys in [0usize, 1, 3, 63, 64, 65, 130] {
            let recs: Vec<StorageDone> = (0..9)
                .map(|i| {
                    sample(
                        1000 - i * 37 + (i % 2) * 5000,
                        keys + i as usize % 3,
                        i * 7 + keys as u64,
                    )
                })
                .collect();
            let c = CompletionColumns::from_records(&recs).unwrap();
            assert_eq!(c.to_records(), recs);
            for (v, d) in c.iter().zip(&recs) {
                assert_eq!(v.validate(), d.validate(), "{d:?}");
                assert_eq!(v.len(), d.len());
                assert_eq!(v.op(), d.op);
                let alone = CompletionColumns::from_records(std::slice::from_ref(d)).unwrap();
                assert_eq!(alone.all_valid(), d.validate().is_ok(), "{d:?}");
            }
            assert_eq!(c.all_valid(), recs.iter().all(|d| d.validate().is_ok()));
            let back = CompletionColumns::from_wire(&c.to_wire()).unwrap();
            assert_eq!(back, c);
            assert_eq!(back.to_wire(), c.to_wire(), "one encoding per value");
        }
    }

    /// `all_valid` against each rule alone: a report of a valid GET of 70 keys (its last key
    /// missing, a failure a GET may report), then one record breaking a single rule at its
    /// key 100 of 130 (so the record starts mid-word and the key lies in its second word),
    /// or breaking none, then a valid GET whose keys all failed. The random records above
    /// break several rules at once.
    #[test]
    fn all_valid_finds_each_rule_broken_alone_in_a_later_record() {
        let n = 130;
        let mut first = StorageDone::get(
            OperationId(1),
            vec![true; 70],
            vec![4096; 70],
            vec![None; 70],
            true,
        );
        first.success[69] = false;
        first.failures[69] = Some(ObjectFailure::Missing);
        // After the record under test: a valid GET whose keys all failed (a rule's walk
        // that ran past its record's keys would find them).
        let last = StorageDone::get(
            OperationId(3),
            vec![false; 10],
            vec![0; 10],
            vec![Some(ObjectFailure::Invalid); 10],
            true,
        );
        let query = StorageDone::query(OperationId(2), vec![false; n], true);
        let get = StorageDone::get(
            OperationId(2),
            vec![true; n],
            vec![9; n],
            vec![None; n],
            true,
        );
        let put = StorageDone::put(
            OperationId(2),
            vec![true; n],
            vec![9; n],
            vec![false; n],
            true,
        );
        let rejected =
            StorageDone::rejected(OperationId(2), StorageOpKind::Get, n, Rejection::Invalid);
        let broken = |base: &StorageDone, f: &dyn Fn(&mut StorageDone)| {
            let mut d = base.clone();
            f(&mut d);
            d
        };
        let k = 100;
        let cases: Vec<(&str, StorageDone)> = vec![
            ("a valid query", query.clone()),
            ("a valid get", get.clone()),
            ("a valid put", put.clone()),
            ("a valid rejection", rejected.clone()),
            (
                "success and missing",
                broken(&get, &|d| d.failures[k] = Some(ObjectFailure::Missing)),
            ),
            (
                "success and invalid",
                broken(&get, &|d| d.failures[k] = Some(ObjectFailure::Invalid)),
            ),
            (
                "success and capacity",
                broken(&put, &|d| d.capacity[k] = true),
            ),
            (
                "a query's failure",
                broken(&query, &|d| d.failures[k] = Some(ObjectFailure::Missing)),
            ),
            (
                "a put's failure",
                broken(&put, &|d| {
                    d.success[k] = false;
                    d.failures[k] = Some(ObjectFailure::Invalid);
                }),
            ),
            (
                "a get's capacity",
                broken(&get, &|d| {
                    d.success[k] = false;
                    d.capacity[k] = true;
                }),
            ),
            ("a query's bytes", broken(&query, &|d| d.bytes[k] = 1)),
            ("a get's new writes", broken(&get, &|d| d.new_writes = 1)),
            (
                "more new writes than keys",
                broken(&put, &|d| d.new_writes = n as u32 + 1),
            ),
            (
                "an unretired rejection",
                broken(&rejected, &|d| d.retired = false),
            ),
            (
                "a rejection's success",
                broken(&rejected, &|d| d.success[k] = true),
            ),
            (
                "a rejection's failure",
                broken(&rejected, &|d| d.failures[k] = Some(ObjectFailure::Missing)),
            ),
        ];
        for (what, d) in cases {
            let valid = d.validate().is_ok();
            assert_eq!(
                valid,
                what.starts_with("a valid"),
                "{what}: {:?}",
                d.validate()
            );
            let c =
                CompletionColumns::from_records(&[first.clone(), d.clone(), last.clone()]).unwrap();
            assert_eq!(c.all_valid(), valid, "{what}");
            // The record's view finds the same first fault, naming the same key.
            assert_eq!(c.get(1).map(|v| v.validate()), Some(d.validate()), "{what}");
            assert!(c.get(3).is_none());
        }
    }

    #[test]
    fn a_report_of_many_records_is_compact() {
        let recs: Vec<StorageDone> = (0..1000u64)
            .map(|i| {
                StorageDone::get(
                    OperationId(5000 + i),
                    vec![true; 4],
                    vec![4096; 4],
                    vec![None; 4],
                    true,
                )
            })
            .collect();
        let wire = CompletionColumns::from_records(&recs).unwrap().to_wire();
        // 1 byte op delta, 1 byte key count, 1 head byte, 4 x 2 bytes of byte counts and
        // 4 x 4 bits of masks per record.
        assert!(wire.len() <= 13 * 1000 + 32, "{} bytes", wire.len());
        let per_record = crate::encode(&recs).unwrap();
        assert!(
            wire.len() * 2 < per_record.len(),
            "{} vs {} bytes record by record",
            wire.len(),
            per_record.len()
        );
    }

    #[test]
    fn records_with_unequal_masks_have_no_columns() {
        let d = StorageDone::get(OperationId(2), vec![true], vec![1], vec![None], true);
        // Each of the other masks one entry longer or shorter than the success mask, alone.
        let longer: [&dyn Fn(&mut StorageDone); 3] =
            [&|d| d.bytes.push(3), &|d| d.failures.push(None), &|d| {
                d.capacity.push(false)
            }];
        let shorter: [&dyn Fn(&mut StorageDone); 3] =
            [&|d| d.bytes.clear(), &|d| d.failures.clear(), &|d| {
                d.capacity.clear()
            }];
        for (i, f) in longer.iter().chain(&shorter).enumerate() {
            let mut bad = d.clone();
            f(&mut bad);
            let e = CompletionColumns::from_records(&[d.clone(), bad]).unwrap_err();
            assert!(e.message.contains("differ in length"), "case {i}: {e}");
        }
    }

    fn one(d: StorageDone) -> Vec<u8> {
        CompletionColumns::from_records(&[d]).unwrap().to_wire()
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let d = StorageDone::get(
            OperationId(3),
            vec![true, false],
            vec![9, 0],
            vec![None, Some(ObjectFailure::Missing)],
            true,
        );
        let good = one(d.clone());
        assert!(CompletionColumns::from_wire(&good).is_ok());
        // Layout: n=1, K=2, E=0, op delta (6), key count 2, head, masks 4 x 8, bytes 9 0.
        assert_eq!(&good[..6], &[1, 2, 0, 6, 2, 0b101]);
        let bad = |f: &dyn Fn(&mut Vec<u8>), needle: &str| {
            let mut b = good.clone();
            f(&mut b);
            let e = CompletionColumns::from_wire(&b).unwrap_err();
            assert!(e.contains(needle), "{e} lacks {needle}");
        };
        bad(&|b| b[5] |= 0x80, "undefined kind or flags");
        bad(&|b| b[5] |= 0b11, "undefined kind or flags");
        bad(&|b| b[4] = 3, "key counts exceed");
        bad(&|b| b[4] = 1, "sum to 1, not 2");
        bad(&|b| b[1] = 120, "cannot fit");
        bad(&|b| b[0] = 120, "cannot fit");
        // 100 records of at least 3 bytes each cannot fit in the 39 bytes left.
        bad(&|b| b[0] = 100, "cannot fit");
        bad(&|b| b.push(0), "after the last column");
        bad(&|b| b[6] |= 0b100, "success bits past the keys");
        // Key 1 missing (missing mask at 14) and invalid (invalid mask at 22).
        bad(&|b| b[22] |= 0b10, "op3: key 1 is both missing and invalid");
        bad(
            &|b| {
                b.pop();
                b.extend_from_slice(&[0x80, 0x00]);
            },
            "not minimal",
        );
        for cut in 0..good.len() {
            assert!(
                CompletionColumns::from_wire(&good[..cut]).is_err(),
                "cut {cut}"
            );
        }
        let mut e = d.clone();
        e.error = Some("ab".into());
        let mut b = one(e);
        let last = b.len() - 1;
        b[last] = 0xff;
        assert!(CompletionColumns::from_wire(&b)
            .unwrap_err()
            .contains("not UTF-8"));
        let mut e = d;
        e.error = Some("é".into());
        e.rejection = Some(Rejection::Invalid);
        let b = one(e.clone());
        assert_eq!(
            CompletionColumns::from_wire(&b).unwrap().to_records(),
            vec![e]
        );
        let rej = StorageDone::rejected(OperationId(3), StorageOpKind::Get, 2, Rejection::Invalid);
        let mut b = one(rej);
        assert_eq!(b[6], 6, "the rejection code follows the head");
        b[6] = 7;
        assert!(CompletionColumns::from_wire(&b)
            .unwrap_err()
            .contains("unknown rejection 7"));
        let mut put = StorageDone::put(OperationId(3), vec![true], vec![1], vec![false], true);
        put.new_writes = 1;
        let mut b = one(put);
        assert_eq!(b[6], 1, "the new writes follow the head");
        b[6] = 0;
        assert!(CompletionColumns::from_wire(&b)
            .unwrap_err()
            .contains("new writes flagged but zero"));
        let mut huge = vec![];
        put_varint(&mut huge, u64::MAX);
        assert!(CompletionColumns::from_wire(&huge)
            .unwrap_err()
            .contains("cannot fit"));
        assert!(CompletionColumns::from_wire(&[0xff; 11])
            .unwrap_err()
            .contains("overflows"));
        // A key both missing and invalid is named within its record, in the second mask
        // word and above another failed key of that word: GET op 3 of 70 keys, key 0
        // missing, key 65 invalid, key 66 missing. Block: n, K, E, op delta, key count,
        // head (6 bytes), then four masks of two words: invalid's second word at 46.
        let mut wide = StorageDone::get(
            OperationId(3),
            vec![false; 70],
            vec![0; 70],
            vec![None; 70],
            true,
        );
        wide.failures[0] = Some(ObjectFailure::Missing);
        wide.failures[65] = Some(ObjectFailure::Invalid);
        wide.failures[66] = Some(ObjectFailure::Missing);
        let mut b = one(wide);
        assert_eq!(&b[..6], &[1, 70, 0, 6, 70, 0b101]);
        assert_eq!(b[46], 0b10, "key 65 invalid");
        b[46] |= 0b100;
        assert!(CompletionColumns::from_wire(&b)
            .unwrap_err()
            .contains("op3: key 66 is both missing and invalid"));
        // A tenth byte above 1 sets bits past the 64th.
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert!(CompletionColumns::from_wire(&over)
            .unwrap_err()
            .contains("overflows"));
    }

    /// The column accessors agreement reads (it compares and reduces the columns of every
    /// rank's report without a record view).
    #[test]
    fn the_columns_read_as_their_layout_says() {
        let get = StorageDone::get(
            OperationId(7),
            vec![true, false],
            vec![4096, 0],
            vec![None, Some(ObjectFailure::Invalid)],
            true,
        );
        let mut put = StorageDone::put(OperationId(5), vec![false], vec![0], vec![true], false);
        put.error = Some("full".into());
        let c = CompletionColumns::from_records(&[
            get,
            put,
            StorageDone::query(OperationId(9), vec![], true),
        ])
        .unwrap();
        assert_eq!(
            c.iter().map(|v| v.is_empty()).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert_eq!(c.op_ids(), &[7, 5, 9]);
        assert_eq!(c.kinds_and_flags(), &[1 | RETIRED, 2 | ERRORED, RETIRED]);
        assert_eq!(c.key_ends(), &[2, 3, 3]);
        assert_eq!(c.mask_words(), [&[0b001][..], &[0], &[0b010], &[0b100]]);
        assert_eq!(c.all_bytes(), &[4096, 0, 0]);
        assert_eq!((c.len(), c.total_keys()), (3, 3));
        assert_eq!(c.get(1).map(|v| v.op()), Some(OperationId(5)));
    }

    /// The smallest blocks: no record, and records with no key, whose counts exactly fill
    /// the bytes left (3 per record, after the key and error-byte counts).
    #[test]
    fn the_smallest_blocks_decode() {
        let empty = CompletionColumns::from_records(&[]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.to_wire(), vec![0, 0, 0]);
        assert_eq!(CompletionColumns::from_wire(&[0, 0, 0]).unwrap(), empty);
        for n in 1..4u64 {
            let recs: Vec<StorageDone> = (0..n)
                .map(|i| StorageDone::query(OperationId(i), vec![], true))
                .collect();
            let c = CompletionColumns::from_records(&recs).unwrap();
            assert!(!c.is_empty());
            let wire = c.to_wire();
            assert_eq!(wire.len() as u64, 3 + 3 * n);
            let back = CompletionColumns::from_wire(&wire).unwrap();
            assert_eq!(back.to_records(), recs);
        }
    }

    proptest::proptest! {
        #[test]
        fn random_blocks_never_panic(data in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            if let Ok(c) = CompletionColumns::from_wire(&data) {
                for v in c.iter() {
                    let _ = v.validate();
                }
                proptest::prop_assert_eq!(c.to_wire(), data, "only canonical blocks decode");
            }
        }

        #[test]
        fn random_records_round_trip(
            shape in proptest::collection::vec((0u64..1 << 40, 0usize..80, proptest::num::u64::ANY), 0..12)
        ) {
            let recs: Vec<StorageDone> =
                shape.iter().map(|&(op, keys, seed)| sample(op, keys, seed)).collect();
            let c = CompletionColumns::from_records(&recs).unwrap();
            let back = CompletionColumns::from_wire(&c.to_wire()).unwrap();
            proptest::prop_assert_eq!(back.to_records(), recs.clone());
            for (v, d) in back.iter().zip(&recs) {
                proptest::prop_assert_eq!(v.validate(), d.validate());
            }
            proptest::prop_assert_eq!(
                back.all_valid(),
                recs.iter().all(|d| d.validate().is_ok())
            );
        }
    }
}
