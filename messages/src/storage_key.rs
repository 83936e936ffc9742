//! The backend object key, StorageKey: `<namespace>-<content hash>-g<group>-p<page>-s<shard>`
//! for a page of a block, or any other text a store or a test names an object by.
//!
//! A page key is held as its parts (the shared namespace text and the page's numbers), not
//! as text: the scheduler makes one per page on every QUERY, GET and PUT, and making one is
//! a reference count and a copy of 28 bytes, not a formatted allocation. Its text is written
//! only where a store needs it (`text`, `Display`, serde). This module owns the one mapping
//! between the two forms and must keep it exact: a text shaped like a page key is always
//! held as that page key, so two keys are equal exactly when their texts are equal, and a
//! key's text never changes with its form (DFS paths and Mooncake keys are that text).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// A backend object key. Built by [`crate::Namespace::key`] for pages (never containing DP
/// replica IDs, Host allocation IDs or cyclic owner ranks) or by [`StorageKey::new`] from
/// text. A clone is a reference count.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StorageKey {
    /// The namespace of a page key, or the whole text of any other key.
    text: Arc<str>,
    /// The page a page key names (None: `text` is the whole key).
    page: Option<PageName>,
}

/// The numbers of a page key after its namespace (the content hash as two words, so the
/// key stays 8-aligned and small).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct PageName {
    hash_hi: u64,
    hash_lo: u64,
    group: u32,
    page: u32,
    shard: u32,
}

/// The longest text after the namespace: `-` + 32 hex digits + three `-X` tags of up to
/// ten digits each.
const SUFFIX_MAX: usize = 1 + 32 + 3 * (2 + 10);

impl PageName {
    /// Writes `-{hash:032x}-g{group}-p{page}-s{shard}` into `out`; returns its length.
    fn write(&self, out: &mut [u8; SUFFIX_MAX]) -> usize {
        out[0] = b'-';
        out[1..17].copy_from_slice(&hex16(self.hash_hi));
        out[17..33].copy_from_slice(&hex16(self.hash_lo));
        let mut t = 33;
        for (tag, v) in [(b'g', self.group), (b'p', self.page), (b's', self.shard)] {
            out[t] = b'-';
            out[t + 1] = tag;
            t += 2;
            t += dec(v, &mut out[t..]);
        }
        t
    }

    /// The page name at the end of `s` and where the namespace before it ends, when `s`
    /// ends exactly as `write` writes one (lowercase hex, decimals without leading zeros).
    fn parse_suffix(s: &str) -> Option<(usize, PageName)> {
        let b = s.as_bytes();
        let mut end = b.len();
        let mut nums = [0u32; 3];
        for (slot, tag) in [(2usize, b's'), (1, b'p'), (0, b'g')] {
            let digits = b[..end]
                .iter()
                .rev()
                .take_while(|c| c.is_ascii_digit())
                .count();
            let start = end - digits;
            if digits == 0 || digits > 10 || (digits > 1 && b[start] == b'0') {
                return None;
            }
            if start < 2 || b[start - 1] != tag || b[start - 2] != b'-' {
                return None;
            }
            nums[slot] = s[start..end].parse().ok()?;
            end = start - 2;
        }
        if end < 33 || b[end - 33] != b'-' {
            return None;
        }
        let hex = &b[end - 32..end];
        if !hex.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let word = |h: &[u8]| u64::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok();
        Some((
            end - 33,
            PageName {
                hash_hi: word(&hex[..16])?,
                hash_lo: word(&hex[16..])?,
                group: nums[0],
                page: nums[1],
                shard: nums[2],
            },
        ))
    }
}

impl StorageKey {
    /// The key named by `s`. A text shaped like a page key is held as that page key (so it
    /// equals the key `Namespace::key` makes for the same page).
    pub fn new(s: impl Into<Arc<str>>) -> Self {
        let text: Arc<str> = s.into();
        match PageName::parse_suffix(&text) {
            Some((ns_end, page)) => StorageKey {
                text: Arc::from(&text[..ns_end]),
                page: Some(page),
            },
            None => StorageKey { text, page: None },
        }
    }

    /// The key of one page under the namespace text `ns` (what `Namespace::key` makes).
    pub fn page(ns: &Arc<str>, content_hash: u128, group: u32, page: u32, shard: u32) -> Self {
        StorageKey {
            text: Arc::clone(ns),
            page: Some(PageName {
                hash_hi: (content_hash >> 64) as u64,
                hash_lo: content_hash as u64,
                group,
                page,
                shard,
            }),
        }
    }

    /// The key's text (written out for a page key).
    pub fn text(&self) -> Cow<'_, str> {
        match &self.page {
            None => Cow::Borrowed(&self.text),
            Some(p) => {
                let mut suffix = [0u8; SUFFIX_MAX];
                let n = p.write(&mut suffix);
                let mut s = String::with_capacity(self.text.len() + n);
                s.push_str(&self.text);
                // Only ASCII digits, letters and '-' were written.
                s.extend(suffix[..n].iter().map(|&c| c as char));
                Cow::Owned(s)
            }
        }
    }

    /// Whether the key's text starts with `prefix` followed by '-' (a page key: its
    /// namespace is `prefix`, or starts with it and a '-').
    pub fn has_namespace_prefix(&self, prefix: &str) -> bool {
        fn starts(t: &str, prefix: &str) -> bool {
            t.len() > prefix.len() && t.starts_with(prefix) && t.as_bytes()[prefix.len()] == b'-'
        }
        let t: &str = &self.text;
        match self.page {
            None => starts(t, prefix),
            // The text is the namespace, then '-' and the page.
            Some(_) if prefix.len() < t.len() => starts(t, prefix),
            Some(_) if prefix.len() == t.len() => t == prefix,
            Some(_) => starts(&self.text(), prefix),
        }
    }

    /// Whether both keys share one text allocation (a clone of the same key, or page keys
    /// of one namespace).
    pub fn shares_text(&self, other: &StorageKey) -> bool {
        Arc::ptr_eq(&self.text, &other.text)
    }
}

impl fmt::Display for StorageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

impl fmt::Debug for StorageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StorageKey").field(&self.text()).finish()
    }
}

/// Keys order as their texts do (whichever form each is held in).
impl Ord for StorageKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.text().cmp(&other.text())
    }
}

impl PartialOrd for StorageKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// On the wire a key is its text (as it was when the key was a string).
impl Serialize for StorageKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for StorageKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(StorageKey::new(s))
    }
}

/// Writes `v` in decimal at the start of `out`; returns the digits written (at most 10).
fn dec(mut v: u32, out: &mut [u8]) -> usize {
    let mut tmp = [0u8; 10];
    let mut i = tmp.len();
    loop {
        i -= 1;
        tmp[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let n = tmp.len() - i;
    out[..n].copy_from_slice(&tmp[i..]);
    n
}

/// The sixteen lowercase hex digits of `x`, most significant first, computed a whole word at
/// a time: the nibbles are spread one per byte (nibble k in byte k), each byte becomes its
/// ASCII digit with one add (plus 39 where the nibble is 10 or more), and the bytes are
/// written most significant first.
fn hex16(x: u64) -> [u8; 16] {
    const LO32: u128 = 0x0000_0000_ffff_ffff_0000_0000_ffff_ffff;
    const LO16: u128 = 0x0000_ffff_0000_ffff_0000_ffff_0000_ffff;
    const LO8: u128 = 0x00ff_00ff_00ff_00ff_00ff_00ff_00ff_00ff;
    const LO4: u128 = 0x0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f_0f0f;
    const ONES: u128 = 0x0101_0101_0101_0101_0101_0101_0101_0101;
    let mut v = x as u128;
    v = (v | (v << 32)) & LO32;
    v = (v | (v << 16)) & LO16;
    v = (v | (v << 8)) & LO8;
    v = (v | (v << 4)) & LO4;
    // A byte holds 0..=15, so adding 6 carries into bit 4 exactly for 10..=15 and never
    // into the next byte; the digit is then at most 15 + 48 + 39 = 102.
    let letters = ((v + 6 * ONES) >> 4) & ONES;
    (v + 0x30 * ONES + 39 * letters).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::hash::{Hash, Hasher};

    fn hash_of(k: &StorageKey) -> u64 {
        let mut h = DefaultHasher::new();
        k.hash(&mut h);
        h.finish()
    }

    #[test]
    fn hex16_matches_the_formatter_for_every_nibble_in_every_position() {
        let mut cases = vec![0u64, u64::MAX, 0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
        for pos in 0..16 {
            for n in 0..16u64 {
                cases.push(n << (4 * pos));
                cases.push(!(n << (4 * pos)));
            }
        }
        for x in cases {
            assert_eq!(hex16(x), *format!("{x:016x}").as_bytes(), "{x:#x}");
        }
    }

    #[test]
    fn a_page_key_and_its_text_are_one_key() {
        let ns: Arc<str> = Arc::from("tsl3-0123456789abcdef");
        for (h, g, p, s) in [
            (0u128, 0u32, 0u32, 0u32),
            (u128::MAX, u32::MAX, 7, 1_000_000),
            (0x1234_5678_9abc_def0_0fed_cba9_8765_4321, 3, 10, 42),
        ] {
            let k = StorageKey::page(&ns, h, g, p, s);
            let text = format!("{ns}-{h:032x}-g{g}-p{p}-s{s}");
            assert_eq!(k.text(), text);
            assert_eq!(k.to_string(), text);
            let parsed = StorageKey::new(text.clone());
            assert_eq!(parsed, k, "{text}");
            assert_eq!(hash_of(&parsed), hash_of(&k));
            assert_eq!(parsed.cmp(&k), Ordering::Equal);
            assert!(parsed.page.is_some());
        }
    }

    #[test]
    fn texts_not_shaped_like_a_page_key_stay_text() {
        for t in [
            "a",
            "",
            "tsl3-00000000000c0a5e-big",
            // Uppercase hex, 31 digits, a leading zero, a missing or foreign tag, an
            // 11-digit number: none is what `write` writes.
            "ns-0123456789ABCDEF0123456789abcdef-g0-p0-s0",
            "ns-123456789abcdef0123456789abcdef-g0-p0-s0",
            "ns-0123456789abcdef0123456789abcdef-g01-p0-s0",
            "ns-0123456789abcdef0123456789abcdef-g0-p0",
            "ns-0123456789abcdef0123456789abcdef-g0-q0-s0",
            "ns-0123456789abcdef0123456789abcdef-g0-p0-s10000000000",
            "ns0123456789abcdef0123456789abcdef-g0-p0-s0",
            "0123456789abcdef0123456789abcdef-g0-p0-s0",
            "ns-0123456789abcdef0123456789abcdef-g0-p0-s4294967296",
        ] {
            let k = StorageKey::new(t);
            assert!(k.page.is_none(), "{t}");
            assert_eq!(k.text(), t);
        }
        // Exactly shaped, with an empty namespace: a page key whose namespace is "".
        let k = StorageKey::new("-0123456789abcdef0123456789abcdef-g0-p0-s0");
        assert_eq!(&*k.text, "");
        assert_eq!(k.text(), "-0123456789abcdef0123456789abcdef-g0-p0-s0");
    }

    #[test]
    fn keys_order_and_differ_as_their_texts_do() {
        let ns: Arc<str> = Arc::from("tsl3-00000000000000aa");
        let keys = [
            StorageKey::page(&ns, 1, 2, 0, 0),
            StorageKey::page(&ns, 1, 10, 0, 0),
            StorageKey::new("tsl3-00000000000000aa-zz"),
            StorageKey::new("tsl3-00000000000000aa-"),
            StorageKey::page(&ns, 0xf, 0, 0, 0),
        ];
        for a in &keys {
            for b in &keys {
                assert_eq!(a.cmp(b), a.text().cmp(&b.text()), "{a} {b}");
                assert_eq!(a == b, a.text() == b.text(), "{a} {b}");
            }
        }
    }

    #[test]
    fn the_namespace_prefix_holds_for_both_forms() {
        let ns: Arc<str> = Arc::from("tsl3-00000000000000aa");
        let page = StorageKey::page(&ns, 5, 0, 0, 0);
        let text = StorageKey::new("tsl3-00000000000000aa-big");
        for k in [&page, &text] {
            assert!(k.has_namespace_prefix("tsl3-00000000000000aa"), "{k}");
            assert!(k.has_namespace_prefix("tsl3"), "{k}");
            assert!(!k.has_namespace_prefix("tsl3-00000000000000a"), "{k}");
            assert!(!k.has_namespace_prefix("tsl3-00000000000000ab"), "{k}");
        }
        assert!(
            !StorageKey::new("tsl3-00000000000000aa").has_namespace_prefix("tsl3-00000000000000aa")
        );
        // A prefix longer than a page key's namespace is checked against its whole text.
        let short: Arc<str> = Arc::from("ns");
        let k = StorageKey::page(&short, 0xab << 120, 0, 0, 0);
        assert!(k.has_namespace_prefix("ns-ab000000000000000000000000000000"));
        assert!(!k.has_namespace_prefix("ns-ab00000000000000000000000000000"));
    }

    #[test]
    fn serde_carries_the_text() {
        let ns: Arc<str> = Arc::from("tsl3-00000000000000aa");
        let k = StorageKey::page(&ns, 0xabc, 1, 2, 3);
        let mp = rmp_serde::to_vec(&k).unwrap();
        let as_text: String = rmp_serde::from_slice(&mp).unwrap();
        assert_eq!(as_text, k.text());
        let back: StorageKey = rmp_serde::from_slice(&mp).unwrap();
        assert_eq!(back, k);
    }
}
