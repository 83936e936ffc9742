//! A set of the rows of one storage operation (row `i` of `0..len`), one bit per row: the
//! first 64 rows in a word of the set itself, any further rows in words beside it, so an
//! operation of up to 64 rows allocates nothing for it. A storage ticket keeps the rows
//! whose references it still holds in one; the scheduler keeps a GET's released rows in
//! another. It owns no reference and never decides what a row means; a row at or past
//! `len` is never a member.

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowSet {
    len: usize,
    first: u64,
    rest: Vec<u64>,
}

/// The word of `bits` low bits set.
fn low_bits(bits: usize) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

impl RowSet {
    /// No row of `0..len` a member.
    pub fn none(len: usize) -> Self {
        Self {
            len,
            first: 0,
            rest: vec![0; len.saturating_sub(1) / 64],
        }
    }

    /// Every row of `0..len` a member.
    pub fn all(len: usize) -> Self {
        Self {
            len,
            first: low_bits(len),
            rest: (64..len).step_by(64).map(|lo| low_bits(len - lo)).collect(),
        }
    }

    /// The rows it can hold (`0..len`).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Members.
    pub fn count(&self) -> usize {
        self.first.count_ones() as usize
            + self
                .rest
                .iter()
                .map(|w| w.count_ones() as usize)
                .sum::<usize>()
    }

    fn word_mut(&mut self, i: usize) -> Option<(&mut u64, u64)> {
        if i >= self.len {
            return None;
        }
        let w = match i / 64 {
            0 => &mut self.first,
            k => self.rest.get_mut(k - 1)?,
        };
        Some((w, 1u64 << (i % 64)))
    }

    pub fn contains(&self, i: usize) -> bool {
        if i >= self.len {
            return false;
        }
        let w = match i / 64 {
            0 => self.first,
            k => self.rest.get(k - 1).copied().unwrap_or(0),
        };
        w & (1u64 << (i % 64)) != 0
    }

    /// Makes row `i` a member; whether it was not one before (false past `len`).
    pub fn insert(&mut self, i: usize) -> bool {
        match self.word_mut(i) {
            Some((w, bit)) => {
                let fresh = *w & bit == 0;
                *w |= bit;
                fresh
            }
            None => false,
        }
    }

    /// Takes row `i` out; whether it was a member.
    pub fn remove(&mut self, i: usize) -> bool {
        match self.word_mut(i) {
            Some((w, bit)) => {
                let held = *w & bit != 0;
                *w &= !bit;
                held
            }
            None => false,
        }
    }

    /// Takes every row out (the words stay).
    pub fn clear(&mut self) {
        self.first = 0;
        self.rest.iter_mut().for_each(|w| *w = 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a list of flags, for sets within one word and across several: inserting,
    /// removing and counting agree, and no row at or past `len` is ever a member.
    #[test]
    fn a_row_set_agrees_with_a_list_of_flags() {
        for len in [0usize, 1, 5, 63, 64, 65, 127, 128, 129, 200] {
            for start_full in [false, true] {
                let mut set = if start_full {
                    RowSet::all(len)
                } else {
                    RowSet::none(len)
                };
                let mut flags = vec![start_full; len];
                assert_eq!(set.len(), len);
                assert_eq!(set.count(), flags.iter().filter(|f| **f).count());
                for step in 0..3 * len + 3 {
                    let i = (step * 37 + 11) % (len + 3);
                    if step % 3 == 0 {
                        let expected = i < len && flags[i];
                        assert_eq!(set.remove(i), expected, "remove {i} of {len}");
                        if i < len {
                            flags[i] = false;
                        }
                    } else {
                        let expected = i < len && !flags[i];
                        assert_eq!(set.insert(i), expected, "insert {i} of {len}");
                        if i < len {
                            flags[i] = true;
                        }
                    }
                    for (j, f) in flags.iter().enumerate() {
                        assert_eq!(set.contains(j), *f, "row {j} of {len}");
                    }
                    assert!(!set.contains(len) && !set.contains(len + 64));
                    assert_eq!(set.count(), flags.iter().filter(|f| **f).count());
                }
                set.clear();
                assert_eq!(set.count(), 0);
                assert_eq!(set.len(), len);
            }
        }
    }

    #[test]
    fn a_set_of_up_to_64_rows_keeps_no_words_beside_it() {
        assert!(RowSet::all(64).rest.is_empty());
        assert!(RowSet::none(64).rest.is_empty());
        assert_eq!(RowSet::all(65).rest.len(), 1);
        assert_eq!(RowSet::none(129).rest.len(), 2);
    }
}
