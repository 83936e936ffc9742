//! The poisoned-memory checker of debug (test) builds: a Host block the BlockPool frees is
//! filled with a poison pattern at once (`BlockPool::set_poison`, wired by the rank factory),
//! and every path that reads a block as valid KV — an H2D restore's source, a backup PUT's
//! source, a GET's destination after the store said Ok — checks it is not wholly poison.
//! A block read while freed, or published without its bytes ever landing, is then caught
//! where it happens. Release builds do none of it. It owns the pattern and the checks only;
//! it never decides what is freed.

use std::sync::atomic::{AtomicU64, Ordering};

/// The poison word, repeated over a freed block.
pub const POISON_WORD: u64 = 0xDEAD_BEEF_F00D_CAFE;

static FILLED: AtomicU64 = AtomicU64::new(0);

/// Whether the checker runs (debug builds: every test build and the binary tests spawn).
pub const fn enabled() -> bool {
    cfg!(debug_assertions)
}

/// Fills `bytes` with the poison pattern.
pub fn fill(bytes: &mut [u8]) {
    let word = POISON_WORD.to_le_bytes();
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    FILLED.fetch_add(1, Ordering::Relaxed);
}

/// Blocks poisoned so far in this process.
pub fn filled() -> u64 {
    FILLED.load(Ordering::Relaxed)
}

/// True when `bytes` (at least one word) are wholly the poison pattern: what a freed block
/// holds until something writes it.
pub fn is_poison(bytes: &[u8]) -> bool {
    let word = POISON_WORD.to_le_bytes();
    bytes.len() >= 8 && bytes.chunks(8).all(|c| c == &word[..c.len()])
}

/// A read of poison: a bug (a freed block read, or a block published without its data).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("poisoned-memory checker: {what} read a freed Host block (offset {offset}, {len} bytes)")]
pub struct PoisonRead {
    pub what: &'static str,
    pub offset: u64,
    pub len: u64,
}

/// Checks a block about to be read as valid KV.
pub fn check(what: &'static str, offset: u64, bytes: &[u8]) -> Result<(), PoisonRead> {
    if enabled() && is_poison(bytes) {
        return Err(PoisonRead {
            what,
            offset,
            len: bytes.len() as u64,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_blocks_are_poison_and_any_written_byte_is_not() {
        let mut b = vec![0u8; 4096];
        assert!(!is_poison(&b));
        fill(&mut b);
        assert!(is_poison(&b));
        assert!(check("test", 0, &b).is_err() == enabled());
        b[4095] = 1;
        assert!(!is_poison(&b), "one written byte is data");
        let mut odd = vec![0u8; 13];
        fill(&mut odd);
        assert!(is_poison(&odd));
        assert!(!is_poison(&[]), "an empty range is never poison");
    }
}
