//! DfsStore: the shared-DFS tier. Objects are files under a root directory that may be a
//! shared mount (NFS/CephFS/3FS) used by many engine hosts at once: `<root>/<namespace>/<rest>`.
//! It owns the on-disk object format (a header with magic, format version, logical length,
//! xxh3-64 checksum and a per-write generation) and create-only atomic publication (temp
//! file, fsync, `hard_link` into place, fsync the directory). A PUT of several objects is
//! group-committed: every temp file is written, one `syncfs` makes them all durable, then
//! each is linked into place and each directory is synced once. It must never publish a
//! partial object, never replace an existing object, never resolve a key outside its
//! namespace directory, and never return unvalidated bytes as a success.

use super::fan_out::{check_fanned, fan_out_threads, read_fanned};
use super::{KeyResult, Store, StoreError};
use messages::identity::KEY_PREFIX;
use messages::{Namespace, StorageKey};
use parking_lot::{Condvar, Mutex};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

use super::faulty::Gate;

/// File magic of a DFS object.
pub const DFS_MAGIC: [u8; 8] = *b"TSL3DFS\0";
/// On-disk format version of a DFS object (2: the header binds the object to its key).
pub const DFS_FORMAT_VERSION: u32 = 2;
/// Header bytes before the payload.
pub const DFS_HEADER_LEN: usize = 64;
/// Payload bytes written per `write` call (a write hook runs after each chunk).
pub const DFS_WRITE_CHUNK: usize = 1 << 20;
/// Prefix of temporary files and tombstones: never a valid object name.
const TEMP_PREFIX: &str = ".tmp-";
const TOMBSTONE_PREFIX: &str = ".tombstone-";

/// Native codes of retired DFS failures (negative, distinct from errno values).
pub mod code {
    /// The key is not `tsl3-<16hex>-<name>` or would escape its namespace directory.
    pub const BAD_KEY: i64 = -2001;
    /// An I/O error without an OS errno.
    pub const IO: i64 = -2002;
}

/// The identity a reader can prove: a generation is unique per write, so equal
/// (generation, checksum, length) means the very object that was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjectIdentity {
    pub len: u64,
    pub checksum: u64,
    pub generation: u64,
}

/// The 128-bit hash of a full key (namespace included) that a header binds its object to:
/// an object copied, linked or restored under another key never validates.
pub fn key_hash(key: &StorageKey) -> u128 {
    xxh3_128(key.text().as_bytes())
}

/// Why a stored object was proven invalid (the `reason` of
/// `tsl3_dfs_invalid_objects_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The key is not a plain object name of its namespace.
    BadKey,
    /// Not our magic or format version, or the header's own checksum fails.
    Header,
    /// The header belongs to another key or namespace.
    Identity,
    /// The file size disagrees with the header's length (truncated or extended).
    Length,
    /// The payload's checksum disagrees with the header's.
    Checksum,
    /// The object could not be opened or read for lack of permission: not proven corrupt,
    /// so never removed, but never used either.
    Unreadable,
    /// The destination is shorter than the object.
    TooLong,
}

impl InvalidReason {
    pub const ALL: [InvalidReason; 7] = [
        InvalidReason::BadKey,
        InvalidReason::Header,
        InvalidReason::Identity,
        InvalidReason::Length,
        InvalidReason::Checksum,
        InvalidReason::Unreadable,
        InvalidReason::TooLong,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            InvalidReason::BadKey => "bad_key",
            InvalidReason::Header => "header",
            InvalidReason::Identity => "identity",
            InvalidReason::Length => "length",
            InvalidReason::Checksum => "checksum",
            InvalidReason::Unreadable => "unreadable",
            InvalidReason::TooLong => "too_long",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
    /// Whether the file at the key's path is proven not to be the key's object, so that it
    /// is removed and a later create-only PUT of the key can land.
    fn proves_corrupt(self) -> bool {
        matches!(
            self,
            InvalidReason::Header
                | InvalidReason::Identity
                | InvalidReason::Length
                | InvalidReason::Checksum
        )
    }
}

/// The fixed-size object header: magic, version, logical length, payload checksum,
/// generation, the key hash, and a checksum of the header bytes before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectHeader {
    pub version: u32,
    pub identity: ObjectIdentity,
    pub key_hash: u128,
}

impl ObjectHeader {
    pub fn encode(&self) -> [u8; DFS_HEADER_LEN] {
        let mut h = [0u8; DFS_HEADER_LEN];
        h[0..8].copy_from_slice(&DFS_MAGIC);
        h[8..12].copy_from_slice(&self.version.to_le_bytes());
        // 12..16 reserved (zero).
        h[16..24].copy_from_slice(&self.identity.len.to_le_bytes());
        h[24..32].copy_from_slice(&self.identity.checksum.to_le_bytes());
        h[32..40].copy_from_slice(&self.identity.generation.to_le_bytes());
        h[40..56].copy_from_slice(&self.key_hash.to_le_bytes());
        let sum = xxh3_64(&h[..56]);
        h[56..64].copy_from_slice(&sum.to_le_bytes());
        h
    }

    /// The header, or Header when the magic, version or header checksum is not ours.
    pub fn decode(h: &[u8; DFS_HEADER_LEN]) -> Result<Self, InvalidReason> {
        if h[0..8] != DFS_MAGIC {
            return Err(InvalidReason::Header);
        }
        let mut b8 = [0u8; 8];
        let mut u64_at = |o: usize| {
            b8.copy_from_slice(&h[o..o + 8]);
            u64::from_le_bytes(b8)
        };
        if xxh3_64(&h[..56]) != u64_at(56) {
            return Err(InvalidReason::Header);
        }
        let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if version != DFS_FORMAT_VERSION {
            return Err(InvalidReason::Header);
        }
        let mut b16 = [0u8; 16];
        b16.copy_from_slice(&h[40..56]);
        Ok(Self {
            version,
            identity: ObjectIdentity {
                len: u64_at(16),
                checksum: u64_at(24),
                generation: u64_at(32),
            },
            key_hash: u128::from_le_bytes(b16),
        })
    }
}

/// A key split at its namespace: `<namespace>/<name>` (over the key's text, written out
/// for a page key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectPath<'a> {
    text: std::borrow::Cow<'a, str>,
    /// Where the namespace ends (the '-' before the name).
    ns_len: usize,
}

impl ObjectPath<'_> {
    /// The namespace directory: `tsl3-<16 hex>`.
    pub fn namespace(&self) -> &str {
        &self.text[..self.ns_len]
    }
    /// The object's file name within it.
    pub fn name(&self) -> &str {
        &self.text[self.ns_len + 1..]
    }
}

/// Splits and validates a key: `tsl3-<16 hex>-<name>`, where `name` is one plain path
/// component (no separators, no NUL, no `..`, not starting with '.').
pub fn split_key(key: &StorageKey) -> Option<ObjectPath<'_>> {
    let text = key.text();
    let s: &str = &text;
    let ns_len = KEY_PREFIX.len() + 16;
    if !s.starts_with(KEY_PREFIX) || s.len() <= ns_len + 1 || !s.is_char_boundary(ns_len) {
        return None;
    }
    let (namespace, rest) = s.split_at(ns_len);
    if !namespace[KEY_PREFIX.len()..]
        .bytes()
        .all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let name = rest.strip_prefix('-')?;
    if name.is_empty()
        || name.starts_with('.')
        || name.contains("..")
        || name.contains(['/', '\\', '\0'])
        || name.len() > 200
    {
        return None;
    }
    Some(ObjectPath { text, ns_len })
}

/// Whether a namespace string is a valid directory name (`tsl3-<16 hex>`).
fn valid_namespace(ns: &str) -> bool {
    ns.len() == KEY_PREFIX.len() + 16
        && ns.starts_with(KEY_PREFIX)
        && ns[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit())
}

/// A generation unique per write across processes and hosts: a random u64 (never 0).
pub fn new_generation() -> u64 {
    loop {
        let g: u64 = rand::random();
        if g != 0 {
            return g;
        }
    }
}

/// A counting semaphore bounding concurrent file I/O (`dfs_io_concurrency`).
#[derive(Debug)]
pub struct IoLimiter {
    limit: usize,
    used: Mutex<usize>,
    cv: Condvar,
    peak: AtomicU64,
}

/// One held I/O slot; released on drop.
#[derive(Debug)]
pub struct IoPermit<'a> {
    limiter: &'a IoLimiter,
}

impl IoLimiter {
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            used: Mutex::new(0),
            cv: Condvar::new(),
            peak: AtomicU64::new(0),
        }
    }
    pub fn acquire(&self) -> IoPermit<'_> {
        let mut used = self.used.lock();
        while *used >= self.limit {
            self.cv.wait(&mut used);
        }
        *used += 1;
        self.peak.fetch_max(*used as u64, Ordering::Relaxed);
        IoPermit { limiter: self }
    }
    /// The most slots ever held at once.
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for IoPermit<'_> {
    fn drop(&mut self) {
        let mut used = self.limiter.used.lock();
        *used -= 1;
        self.limiter.cv.notify_one();
    }
}

/// Counters of the DFS tier.
#[derive(Debug, Default)]
pub struct DfsStats {
    pub objects_written: AtomicU64,
    pub already_exists: AtomicU64,
    pub reads_ok: AtomicU64,
    pub reads_missing: AtomicU64,
    /// Reads that found an invalid object (every reason).
    pub reads_invalid: AtomicU64,
    /// Reads that failed with an I/O error (a retired native failure).
    pub reads_failed: AtomicU64,
    /// PUT keys refused for lack of space or quota (ENOSPC, EDQUOT).
    pub puts_capacity: AtomicU64,
    /// PUT keys that failed otherwise (read-only directory, permissions, I/O).
    pub puts_failed: AtomicU64,
    /// Invalid objects found, by `InvalidReason::index`.
    invalid: [AtomicU64; InvalidReason::ALL.len()],
    /// Invalid objects removed so that a later PUT of their key lands.
    pub invalid_removed: AtomicU64,
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Payload reads into a buffer of the store's own (`read_object`: promotion staging).
    /// A GET (`get_one`) never stages: its payload is read straight into the destination,
    /// checksummed in the same pass.
    pub staged_reads: AtomicU64,
}

impl DfsStats {
    /// Invalid objects found for one reason.
    pub fn invalid(&self, r: InvalidReason) -> u64 {
        self.invalid[r.index()].load(Ordering::Relaxed)
    }
    fn record_invalid(&self, r: InvalidReason) {
        self.invalid[r.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// Test hooks: a gate passed after each written payload chunk of a PUT.
#[derive(Debug, Default)]
pub struct DfsHooks {
    pub after_write_chunk: Mutex<Option<Arc<Gate>>>,
}

/// Why a validated read failed.
#[derive(Debug)]
pub enum ReadError {
    Missing,
    /// Not this key's valid object (bad key, header, identity, length, checksum, or an
    /// unreadable file).
    Invalid(InvalidReason),
    Io(io::Error),
}

/// The shared-DFS store.
#[derive(Debug)]
pub struct DfsStore {
    root: PathBuf,
    io: IoLimiter,
    /// Threads one batched GET may fan out over (`fan_out`).
    fan_out: usize,
    pub stats: DfsStats,
    pub hooks: DfsHooks,
}

/// No space or quota left: ENOSPC, EDQUOT (a capacity rejection, not an outage).
pub fn is_capacity(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

fn io_code(e: &io::Error) -> i64 {
    e.raw_os_error().map(|c| c as i64).unwrap_or(code::IO)
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl DfsStore {
    /// A store rooted at `root` (created if absent) with `io_concurrency` file slots.
    pub fn open(root: impl Into<PathBuf>, io_concurrency: u32) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root)
            .map_err(|e| StoreError::new("dfs", format!("create {}: {e}", root.display())))?;
        Ok(Self {
            root,
            io: IoLimiter::new(io_concurrency as usize),
            fan_out: fan_out_threads(io_concurrency as usize),
            stats: DfsStats::default(),
            hooks: DfsHooks::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Threads one batched GET may fan out over: the machine's parallelism, capped at
    /// the file slots.
    pub fn fan_out(&self) -> usize {
        self.fan_out
    }

    /// Which keys are present: `known(index, key)`, or else this key's valid object (its
    /// header read, as `stat`). A QUERY of many keys fans its header reads out over the
    /// store's threads (`check_fanned`), so a long prompt's QUERY is not one file at a time.
    pub fn present(
        &self,
        keys: &[StorageKey],
        known: impl Fn(usize, &StorageKey) -> bool + Sync,
    ) -> Vec<bool> {
        check_fanned(keys, self.fan_out, |i, k| {
            known(i, k) || self.stat(k).is_ok()
        })
    }

    pub fn io_limiter(&self) -> &IoLimiter {
        &self.io
    }

    /// The file of a key, or None for a key that is not a plain object name.
    pub fn object_path(&self, key: &StorageKey) -> Option<PathBuf> {
        let p = split_key(key)?;
        Some(self.root.join(p.namespace()).join(p.name()))
    }

    fn read_header(key: &StorageKey, file: &mut File) -> Result<ObjectHeader, ReadError> {
        let mut h = [0u8; DFS_HEADER_LEN];
        match file.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ReadError::Invalid(InvalidReason::Header))
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
        let header = ObjectHeader::decode(&h).map_err(ReadError::Invalid)?;
        if header.key_hash != key_hash(key) {
            return Err(ReadError::Invalid(InvalidReason::Identity));
        }
        let size = file.metadata().map_err(ReadError::Io)?.len();
        if size != DFS_HEADER_LEN as u64 + header.identity.len {
            return Err(ReadError::Invalid(InvalidReason::Length));
        }
        Ok(header)
    }

    fn open_object(&self, key: &StorageKey) -> Result<(PathBuf, File), ReadError> {
        let path = self
            .object_path(key)
            .ok_or(ReadError::Invalid(InvalidReason::BadKey))?;
        // Non-blocking open: a FIFO (or device) planted at an object path never blocks a
        // reader; only a regular file can be an object.
        let opened = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
                .open(&path)
        };
        match opened {
            Ok(f) => match f.metadata() {
                Ok(m) if m.is_file() => Ok((path, f)),
                Ok(_) => Err(ReadError::Invalid(InvalidReason::Unreadable)),
                Err(e) => Err(ReadError::Io(e)),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ReadError::Missing),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                Err(ReadError::Invalid(InvalidReason::Unreadable))
            }
            Err(e) => Err(ReadError::Io(e)),
        }
    }

    /// Runs one validated read of `key` and settles its evidence: counts it, and removes a
    /// file proven not to be this key's object (`retire_invalid`).
    fn validated<T>(
        &self,
        key: &StorageKey,
        read: impl FnOnce(&mut File) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let (path, mut file) = match self.open_object(key) {
            Ok(x) => x,
            Err(e) => return Err(self.count_failure(e)),
        };
        match read(&mut file) {
            Ok(v) => Ok(v),
            Err(ReadError::Invalid(r)) if r.proves_corrupt() => {
                self.retire_invalid(&path, &file);
                Err(self.count_failure(ReadError::Invalid(r)))
            }
            Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
                Err(self.count_failure(ReadError::Invalid(InvalidReason::Unreadable)))
            }
            Err(e) => Err(self.count_failure(e)),
        }
    }

    fn count_failure(&self, e: ReadError) -> ReadError {
        match &e {
            ReadError::Missing => self.stats.reads_missing.fetch_add(1, Ordering::Relaxed),
            ReadError::Invalid(r) => {
                self.stats.record_invalid(*r);
                self.stats.reads_invalid.fetch_add(1, Ordering::Relaxed)
            }
            ReadError::Io(_) => self.stats.reads_failed.fetch_add(1, Ordering::Relaxed),
        };
        e
    }

    /// Removes the file at `path` if it still is the very file `opened` (same device and
    /// inode): it is renamed to a tombstone first, so a valid object published at the path
    /// meanwhile by another host is put back (create-only) instead of being lost.
    fn retire_invalid(&self, path: &Path, opened: &File) {
        use std::os::unix::fs::MetadataExt;
        let Ok(seen) = opened.metadata() else { return };
        let Some(dir) = path.parent() else { return };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tomb = dir.join(format!(
            "{TOMBSTONE_PREFIX}{name}-{:016x}",
            new_generation()
        ));
        if fs::rename(path, &tomb).is_err() {
            return; // already gone (another reader retired it) or not removable here
        }
        let same = fs::metadata(&tomb)
            .map(|m| m.dev() == seen.dev() && m.ino() == seen.ino())
            .unwrap_or(false);
        if same {
            self.stats.invalid_removed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(object = %path.display(), "dfs: removed an invalid object");
        } else {
            // A newer object took the path after we opened ours: put it back unless an
            // even newer one is already there.
            let _ = fs::hard_link(&tomb, path);
        }
        let _ = fs::remove_file(&tomb);
        let _ = fsync_dir(dir);
    }

    /// The identity of the stored object (reads and validates the header only).
    pub fn stat(&self, key: &StorageKey) -> Result<ObjectIdentity, ReadError> {
        let _permit = self.io.acquire();
        self.validated(key, |f| Ok(Self::read_header(key, f)?.identity))
    }

    /// Reads a whole object into a fresh buffer after validating identity, length and
    /// checksum.
    pub fn read_object(&self, key: &StorageKey) -> Result<(ObjectIdentity, Vec<u8>), ReadError> {
        self.read_object_with(key, |_| None)
    }

    /// `read_object` into the buffer `buffer(len)` gives once the header named the payload
    /// length (an empty buffer of that capacity, e.g. a MEMORY-tier spare), or a fresh one.
    pub fn read_object_with(
        &self,
        key: &StorageKey,
        buffer: impl FnOnce(usize) -> Option<Vec<u8>>,
    ) -> Result<(ObjectIdentity, Vec<u8>), ReadError> {
        let _permit = self.io.acquire();
        self.stats.staged_reads.fetch_add(1, Ordering::Relaxed);
        let r = self.validated(key, |f| {
            let h = Self::read_header(key, f)?;
            let len = usize::try_from(h.identity.len)
                .map_err(|_| ReadError::Invalid(InvalidReason::Length))?;
            let (buf, sum) = read_payload_owned(f, len, buffer(len).unwrap_or_default())?;
            if sum != h.identity.checksum {
                return Err(ReadError::Invalid(InvalidReason::Checksum));
            }
            Ok((h.identity, buf))
        });
        if let Ok((id, _)) = &r {
            self.stats.reads_ok.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_read.fetch_add(id.len, Ordering::Relaxed);
        }
        r
    }

    /// Reads one key into `dest` with MemoryStore's contract: exact length → Ok; a longer
    /// destination → ShortRead (the object's bytes land first); a shorter one → Invalid.
    /// A file proven not to be this key's object is removed (see `retire_invalid`).
    pub fn get_one(&self, key: &StorageKey, dest: &mut [u8]) -> KeyResult {
        let _permit = self.io.acquire();
        let r = self.validated(key, |f| {
            let h = Self::read_header(key, f)?;
            let len = h.identity.len;
            if len > dest.len() as u64 {
                return Err(ReadError::Invalid(InvalidReason::TooLong));
            }
            let body = &mut dest[..len as usize];
            if read_payload_hashed(f, body)? != h.identity.checksum {
                return Err(ReadError::Invalid(InvalidReason::Checksum));
            }
            Ok(len)
        });
        match r {
            Ok(len) => {
                self.stats.reads_ok.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_read.fetch_add(len, Ordering::Relaxed);
                if len < dest.len() as u64 {
                    KeyResult::ShortRead { bytes: len }
                } else {
                    KeyResult::Ok { bytes: len }
                }
            }
            Err(ReadError::Missing) => KeyResult::Missing,
            Err(ReadError::Invalid(_)) => KeyResult::Invalid,
            Err(ReadError::Io(e)) => KeyResult::Failed {
                code: io_code(&e),
                retired: true,
            },
        }
    }

    /// A fresh temp path beside `target`'s directory entry (never a valid object name).
    fn temp_path(dir: &Path, name: &str) -> (PathBuf, u64) {
        let generation = new_generation();
        let tmp = dir.join(format!(
            "{TEMP_PREFIX}{name}-{generation:016x}-{}",
            std::process::id()
        ));
        (tmp, generation)
    }

    /// Writes one object (header, then the payload in chunks, the write hook after each)
    /// into a new temp file, not yet durable; the open file is returned.
    fn write_temp(
        &self,
        tmp: &Path,
        key: &StorageKey,
        src: &[u8],
        generation: u64,
    ) -> io::Result<File> {
        let header = ObjectHeader {
            version: DFS_FORMAT_VERSION,
            identity: ObjectIdentity {
                len: src.len() as u64,
                checksum: crate::host::bulk_hash::xxh3_64(src),
                generation,
            },
            key_hash: key_hash(key),
        };
        let mut f = OpenOptions::new().write(true).create_new(true).open(tmp)?;
        f.write_all(&header.encode())?;
        for chunk in src.chunks(DFS_WRITE_CHUNK) {
            f.write_all(chunk)?;
            let gate = self.hooks.after_write_chunk.lock().clone();
            if let Some(g) = gate {
                g.pass();
            }
        }
        Ok(f)
    }

    /// Create-only atomic publication of one object: Ok when this call published it,
    /// AlreadyExists when an object (from any process) already holds the key.
    pub fn put_one(&self, key: &StorageKey, src: &[u8]) -> KeyResult {
        let Some(p) = split_key(key) else {
            return KeyResult::Failed {
                code: code::BAD_KEY,
                retired: true,
            };
        };
        let _permit = self.io.acquire();
        let dir = self.root.join(p.namespace());
        let target = dir.join(p.name());
        if target.exists() {
            self.stats.already_exists.fetch_add(1, Ordering::Relaxed);
            return KeyResult::AlreadyExists;
        }
        let (tmp, generation) = Self::temp_path(&dir, p.name());
        let r = (|| -> io::Result<KeyResult> {
            fs::create_dir_all(&dir)?;
            self.write_temp(&tmp, key, src, generation)?.sync_all()?;
            match fs::hard_link(&tmp, &target) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    return Ok(KeyResult::AlreadyExists)
                }
                Err(e) => return Err(e),
            }
            Ok(KeyResult::Ok {
                bytes: src.len() as u64,
            })
        })();
        let _ = fs::remove_file(&tmp);
        match r {
            Ok(KeyResult::Ok { bytes }) => {
                // The link is the publication; make the directory entry durable.
                if let Err(e) = fsync_dir(&dir) {
                    tracing::warn!(dir = %dir.display(), error = %e, "dfs directory fsync failed");
                }
                self.stats.objects_written.fetch_add(1, Ordering::Relaxed);
                self.stats.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                KeyResult::Ok { bytes }
            }
            Ok(other) => {
                self.stats.already_exists.fetch_add(1, Ordering::Relaxed);
                other
            }
            Err(e) => self.put_failure(&e),
        }
    }

    /// The retired result of a PUT key whose write failed: no space or quota is a
    /// capacity rejection (re-offered later, never an outage); anything else a failure.
    fn put_failure(&self, e: &io::Error) -> KeyResult {
        if is_capacity(e) {
            self.stats.puts_capacity.fetch_add(1, Ordering::Relaxed);
            KeyResult::Capacity
        } else {
            self.stats.puts_failed.fetch_add(1, Ordering::Relaxed);
            KeyResult::Failed {
                code: io_code(e),
                retired: true,
            }
        }
    }

    /// Create-only atomic publication of a batch, group-committed: objects that already
    /// exist are skipped before any write; every other one is written to its temp file,
    /// one `syncfs` makes all of them durable, then each is linked into place (no object is
    /// visible before its bytes are durable) and each directory touched is synced once.
    /// One result per key, in input order.
    pub fn put_batch(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Vec<KeyResult> {
        if keys.len() <= 1 {
            return keys
                .iter()
                .zip(srcs)
                .map(|(k, s)| self.put_one(k, s))
                .collect();
        }
        struct Staged {
            index: usize,
            tmp: PathBuf,
            target: PathBuf,
            dir: PathBuf,
            bytes: u64,
        }
        let mut results: Vec<Option<KeyResult>> = vec![None; keys.len()];
        let mut staged: Vec<Staged> = Vec::with_capacity(keys.len());
        let _permit = self.io.acquire();
        let mut made_dirs: Vec<PathBuf> = vec![];
        for (i, (key, src)) in keys.iter().zip(srcs).enumerate() {
            let Some(p) = split_key(key) else {
                results[i] = Some(KeyResult::Failed {
                    code: code::BAD_KEY,
                    retired: true,
                });
                continue;
            };
            let dir = self.root.join(p.namespace());
            let target = dir.join(p.name());
            if target.exists() {
                self.stats.already_exists.fetch_add(1, Ordering::Relaxed);
                results[i] = Some(KeyResult::AlreadyExists);
                continue;
            }
            let (tmp, generation) = Self::temp_path(&dir, p.name());
            let written = (|| -> io::Result<()> {
                if !made_dirs.contains(&dir) {
                    fs::create_dir_all(&dir)?;
                    made_dirs.push(dir.clone());
                }
                self.write_temp(&tmp, key, src, generation).map(drop)
            })();
            match written {
                Ok(()) => staged.push(Staged {
                    index: i,
                    tmp,
                    target,
                    dir,
                    bytes: src.len() as u64,
                }),
                Err(e) => {
                    let _ = fs::remove_file(&tmp);
                    results[i] = Some(self.put_failure(&e));
                }
            }
        }
        // One flush for the whole batch: the temp files' data and metadata are durable
        // before any of them is linked into place.
        let flushed = match staged.first() {
            None => Ok(()),
            Some(first) => {
                File::open(&first.dir).and_then(|d| rustix::fs::syncfs(&d).map_err(io::Error::from))
            }
        };
        let mut linked_dirs: Vec<PathBuf> = vec![];
        for st in staged {
            let r = match &flushed {
                Err(e) => self.put_failure(e),
                Ok(()) => match fs::hard_link(&st.tmp, &st.target) {
                    Ok(()) => {
                        if !linked_dirs.contains(&st.dir) {
                            linked_dirs.push(st.dir.clone());
                        }
                        self.stats.objects_written.fetch_add(1, Ordering::Relaxed);
                        self.stats
                            .bytes_written
                            .fetch_add(st.bytes, Ordering::Relaxed);
                        KeyResult::Ok { bytes: st.bytes }
                    }
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        self.stats.already_exists.fetch_add(1, Ordering::Relaxed);
                        KeyResult::AlreadyExists
                    }
                    Err(e) => self.put_failure(&e),
                },
            };
            let _ = fs::remove_file(&st.tmp);
            results[st.index] = Some(r);
        }
        // The links are the publication; make the directory entries durable, once each.
        for dir in linked_dirs {
            if let Err(e) = fsync_dir(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "dfs directory fsync failed");
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or(KeyResult::Failed {
                    code: code::BAD_KEY,
                    retired: true,
                })
            })
            .collect()
    }

    /// Unlinks one object (administrative; readers holding it open keep their copy).
    pub fn remove(&self, key: &StorageKey) -> Result<bool, StoreError> {
        let path = self
            .object_path(key)
            .ok_or_else(|| StoreError::new("dfs", format!("invalid key {key}")))?;
        let _permit = self.io.acquire();
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::new("dfs", format!("remove {key}: {e}"))),
        }
    }
}

/// Bytes read (and hashed) per step of a validated read: small enough that each chunk is
/// still in cache when it is hashed, so the payload crosses memory once.
const READ_CHUNK: usize = 256 * 1024;

fn eof_is_truncation(e: io::Error) -> ReadError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ReadError::Invalid(InvalidReason::Length)
    } else {
        ReadError::Io(e)
    }
}

/// Reads exactly `buf.len()` payload bytes into `buf`, hashing each chunk as it lands (one
/// pass over the bytes); returns the payload's xxh3-64.
fn read_payload_hashed(f: &mut File, buf: &mut [u8]) -> Result<u64, ReadError> {
    let mut h = crate::host::bulk_hash::BulkHasher::new();
    for chunk in buf.chunks_mut(READ_CHUNK) {
        f.read_exact(chunk).map_err(eof_is_truncation)?;
        h.update(chunk);
    }
    Ok(h.digest())
}

/// Reads exactly `len` payload bytes into `buf` (emptied first; grown only when its
/// capacity is short; its memory is written once, by the read, never zeroed first),
/// hashing each chunk as it lands; returns it and its xxh3-64.
fn read_payload_owned(
    f: &mut File,
    len: usize,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, u64), ReadError> {
    buf.clear();
    if buf.capacity() < len {
        buf.try_reserve_exact(len)
            .map_err(|_| ReadError::Invalid(InvalidReason::Length))?;
    }
    let mut h = crate::host::bulk_hash::BulkHasher::new();
    while buf.len() < len {
        let start = buf.len();
        let want = (len - start).min(READ_CHUNK) as u64;
        let got = Read::take(&mut *f, want)
            .read_to_end(&mut buf)
            .map_err(ReadError::Io)?;
        if got as u64 != want {
            return Err(ReadError::Invalid(InvalidReason::Length));
        }
        h.update(&buf[start..]);
    }
    Ok((buf, h.digest()))
}

impl Store for DfsStore {
    fn name(&self) -> &'static str {
        "dfs"
    }

    /// File I/O completes synchronously: a failed call no longer touches the buffers.
    fn failures_retire(&self) -> bool {
        true
    }

    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        Ok(self.present(keys, |_, _| false))
    }

    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError> {
        crate::l3::store::same_count("dfs", keys.len(), dests.len(), "destinations")?;
        Ok(read_fanned(keys, dests, self.fan_out, |k, d| {
            self.get_one(k, d)
        }))
    }

    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError> {
        crate::l3::store::same_count("dfs", keys.len(), srcs.len(), "sources")?;
        Ok(self.put_batch(keys, srcs))
    }

    /// Renames the namespace directory to a tombstone (one atomic step: no new reader finds
    /// it), then removes the tombstone. Returns the number of objects removed.
    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        if !valid_namespace(ns.as_str()) {
            return Err(StoreError::new(
                "dfs",
                format!("invalid namespace {}", ns.0),
            ));
        }
        let _permit = self.io.acquire();
        let dir = self.root.join(ns.as_str());
        let tomb = self.root.join(format!(
            "{TOMBSTONE_PREFIX}{}-{:016x}",
            ns.as_str(),
            new_generation()
        ));
        match fs::rename(&dir, &tomb) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StoreError::new("dfs", format!("purge {}: {e}", ns.0))),
        }
        let _ = fsync_dir(&self.root);
        let removed = fs::read_dir(&tomb)
            .map(|it| {
                it.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count() as u64
            })
            .unwrap_or(0);
        fs::remove_dir_all(&tomb)
            .map_err(|e| StoreError::new("dfs", format!("remove tombstone of {}: {e}", ns.0)))?;
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom};

    fn ns(n: u64) -> Namespace {
        Namespace(format!("tsl3-{n:016x}").into())
    }
    fn k(n: u64, name: &str) -> StorageKey {
        StorageKey::new(format!("tsl3-{n:016x}-{name}"))
    }
    fn store() -> (tempfile::TempDir, DfsStore) {
        let d = tempfile::tempdir().unwrap();
        let s = DfsStore::open(d.path().join("dfs"), 4).unwrap();
        (d, s)
    }

    #[test]
    fn keys_split_at_the_namespace_and_never_escape() {
        let key = k(0xab, "00ff-g1-p2-s0");
        let p = split_key(&key).unwrap();
        assert_eq!(p.namespace(), "tsl3-00000000000000ab");
        assert_eq!(p.name(), "00ff-g1-p2-s0");
        for bad in [
            "tsl3-00000000000000ab-../x",
            "tsl3-00000000000000ab-a/b",
            "tsl3-00000000000000ab-..",
            "tsl3-00000000000000ab-a..b",
            "tsl3-00000000000000ab-.hidden",
            "tsl3-00000000000000ab-a\\b",
            "tsl3-00000000000000ab-",
            "tsl3-zz000000000000ab-x",
            "tsl3-00000000000000ab",
            "other-00000000000000ab-x",
            "/etc/passwd",
        ] {
            assert!(split_key(&StorageKey::new(bad)).is_none(), "{bad}");
        }
        let (_d, s) = store();
        let evil = StorageKey::new("tsl3-00000000000000ab-../../escape");
        assert_eq!(
            s.put(std::slice::from_ref(&evil), &[b"x"]).unwrap(),
            vec![KeyResult::Failed {
                code: code::BAD_KEY,
                retired: true
            }]
        );
        let mut d = [0u8; 1];
        assert_eq!(
            s.get(&[evil], &mut [&mut d]).unwrap(),
            vec![KeyResult::Invalid]
        );
        assert!(!s.root().parent().unwrap().join("escape").exists());
    }

    #[test]
    fn create_only_exact_bytes_short_and_missing() {
        let (_d, s) = store();
        let r = s
            .put(&[k(1, "a"), k(1, "b")], &[b"hello", b"world!"])
            .unwrap();
        assert_eq!(
            r,
            vec![KeyResult::Ok { bytes: 5 }, KeyResult::Ok { bytes: 6 }]
        );
        assert_eq!(
            s.put(&[k(1, "a")], &[b"HELLO"]).unwrap(),
            vec![KeyResult::AlreadyExists]
        );
        let id1 = s.stat(&k(1, "a")).unwrap();
        assert_eq!(id1.len, 5);
        assert_eq!(id1.checksum, xxh3_64(b"hello"));
        assert_eq!(s.query(&[k(1, "a"), k(1, "z")]).unwrap(), vec![true, false]);
        let (mut a, mut z, mut long, mut short) = ([0u8; 5], [0u8; 5], [0u8; 8], [0u8; 3]);
        let r = s
            .get(
                &[k(1, "a"), k(1, "z"), k(1, "b"), k(1, "b")],
                &mut [&mut a, &mut z, &mut long, &mut short],
            )
            .unwrap();
        assert_eq!(
            r,
            vec![
                KeyResult::Ok { bytes: 5 },
                KeyResult::Missing,
                KeyResult::ShortRead { bytes: 6 },
                KeyResult::Invalid
            ]
        );
        assert_eq!(&a, b"hello", "create-only: the first value stays");
        assert_eq!(&long[..6], b"world!");
        // No temporary file remains after publication.
        let names: Vec<String> = fs::read_dir(s.root().join(ns(1).as_str()))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn generations_differ_per_write() {
        let (_d, s) = store();
        s.put(&[k(1, "a")], &[b"same"]).unwrap();
        let g1 = s.stat(&k(1, "a")).unwrap();
        assert!(s.remove(&k(1, "a")).unwrap());
        s.put(&[k(1, "a")], &[b"same"]).unwrap();
        let g2 = s.stat(&k(1, "a")).unwrap();
        assert_eq!(g1.checksum, g2.checksum);
        assert_ne!(g1.generation, g2.generation);
    }

    #[test]
    fn corrupted_payload_header_or_length_is_invalid_counted_and_removed() {
        let (_d, s) = store();
        let data = vec![7u8; 1000];
        s.put(&[k(2, "a"), k(2, "b"), k(2, "c")], &[&data, &data, &data])
            .unwrap();
        // Flip a payload byte.
        let mut f = OpenOptions::new()
            .write(true)
            .open(s.object_path(&k(2, "a")).unwrap())
            .unwrap();
        f.seek(SeekFrom::Start(DFS_HEADER_LEN as u64 + 500))
            .unwrap();
        f.write_all(&[8]).unwrap();
        // Truncate another.
        let f = OpenOptions::new()
            .write(true)
            .open(s.object_path(&k(2, "b")).unwrap())
            .unwrap();
        f.set_len(DFS_HEADER_LEN as u64 + 999).unwrap();
        // Break the magic of the third.
        let mut f = OpenOptions::new()
            .write(true)
            .open(s.object_path(&k(2, "c")).unwrap())
            .unwrap();
        f.write_all(b"X").unwrap();
        let (mut a, mut b, mut c) = (vec![0u8; 1000], vec![0u8; 1000], vec![0u8; 1000]);
        let r = s
            .get(
                &[k(2, "a"), k(2, "b"), k(2, "c")],
                &mut [&mut a, &mut b, &mut c],
            )
            .unwrap();
        assert_eq!(r, vec![KeyResult::Invalid; 3]);
        assert_eq!(s.stats.reads_invalid.load(Ordering::Relaxed), 3);
        assert_eq!(s.stats.invalid(InvalidReason::Checksum), 1);
        assert_eq!(s.stats.invalid(InvalidReason::Length), 1);
        assert_eq!(s.stats.invalid(InvalidReason::Header), 1);
        // Proven invalid: removed, so the next reader finds nothing and a PUT lands.
        assert_eq!(s.stats.invalid_removed.load(Ordering::Relaxed), 3);
        assert!(matches!(s.read_object(&k(2, "a")), Err(ReadError::Missing)));
        let r = s
            .put(&[k(2, "a"), k(2, "b"), k(2, "c")], &[&data, &data, &data])
            .unwrap();
        assert_eq!(r, vec![KeyResult::Ok { bytes: 1000 }; 3]);
        for key in [k(2, "a"), k(2, "b"), k(2, "c")] {
            assert_eq!(s.read_object(&key).unwrap().1, data);
        }
        assert_no_leftovers(&s, "tsl3-0000000000000002");
    }

    fn assert_no_leftovers(s: &DfsStore, ns: &str) {
        for e in fs::read_dir(s.root().join(ns)).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().to_string();
            assert!(!name.starts_with('.'), "{name} left in {ns}");
        }
    }

    #[test]
    fn an_object_under_another_key_or_namespace_never_validates() {
        let (_d, s) = store();
        s.put(&[k(7, "src")], &[b"the source's kv".as_slice()])
            .unwrap();
        let src = s.object_path(&k(7, "src")).unwrap();
        // A valid object copied over another key's file, and into another namespace.
        for victim in [k(7, "dst"), k(8, "src")] {
            let path = s.object_path(&victim).unwrap();
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::copy(&src, &path).unwrap();
            assert!(matches!(
                s.stat(&victim),
                Err(ReadError::Invalid(InvalidReason::Identity))
            ));
            // Removed on sight: QUERY reports it absent and the key's own PUT lands.
            assert_eq!(s.query(std::slice::from_ref(&victim)).unwrap(), vec![false]);
            assert_eq!(
                s.put(std::slice::from_ref(&victim), &[b"own".as_slice()])
                    .unwrap(),
                vec![KeyResult::Ok { bytes: 3 }]
            );
            let mut d = [0u8; 3];
            assert_eq!(
                s.get(std::slice::from_ref(&victim), &mut [&mut d]).unwrap(),
                vec![KeyResult::Ok { bytes: 3 }]
            );
            assert_eq!(&d, b"own");
        }
        assert_eq!(s.stats.invalid(InvalidReason::Identity), 2);
        // The source itself is untouched.
        assert_eq!(s.read_object(&k(7, "src")).unwrap().1, b"the source's kv");
    }

    #[test]
    fn random_bytes_a_fifo_or_a_directory_at_an_object_path_are_invalid_and_never_block() {
        let (_d, s) = store();
        let noise = s.object_path(&k(9, "noise")).unwrap();
        fs::create_dir_all(noise.parent().unwrap()).unwrap();
        let bytes: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        fs::write(&noise, &bytes).unwrap();
        let fifo = s.object_path(&k(9, "fifo")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let dir = s.object_path(&k(9, "dir")).unwrap();
        fs::create_dir(&dir).unwrap();
        let mut dests = [vec![0u8; 16], vec![0u8; 16], vec![0u8; 16]];
        let [a, b, c] = &mut dests;
        let r = s
            .get(
                &[k(9, "noise"), k(9, "fifo"), k(9, "dir")],
                &mut [a.as_mut_slice(), b.as_mut_slice(), c.as_mut_slice()],
            )
            .unwrap();
        assert_eq!(r, vec![KeyResult::Invalid; 3]);
        assert_eq!(s.stats.invalid(InvalidReason::Header), 1);
        assert_eq!(s.stats.invalid(InvalidReason::Unreadable), 2);
        // Random bytes are proven corrupt and removed; what we cannot read is left alone.
        assert!(!noise.exists());
        assert!(fifo.exists() && dir.exists());
        assert!(dests.iter().all(|d| d.iter().all(|b| *b == 0)));
    }

    #[test]
    fn a_reader_never_removes_an_object_published_after_it_opened_its_file() {
        let (_d, s) = store();
        let key = k(10, "raced");
        let path = s.object_path(&key).unwrap();
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"garbage that is not an object").unwrap();
        let (p, opened) = s.open_object(&key).unwrap();
        // Meanwhile another host removes the garbage and publishes the valid object.
        fs::remove_file(&path).unwrap();
        assert_eq!(
            s.put(std::slice::from_ref(&key), &[b"valid".as_slice()])
                .unwrap(),
            vec![KeyResult::Ok { bytes: 5 }]
        );
        s.retire_invalid(&p, &opened);
        assert_eq!(s.read_object(&key).unwrap().1, b"valid");
        assert_eq!(s.stats.invalid_removed.load(Ordering::Relaxed), 0);
        assert_no_leftovers(&s, "tsl3-000000000000000a");
    }

    #[test]
    fn headers_round_trip_and_any_flipped_header_byte_is_invalid() {
        let h = ObjectHeader {
            version: DFS_FORMAT_VERSION,
            identity: ObjectIdentity {
                len: 77,
                checksum: 0x1234,
                generation: 99,
            },
            key_hash: key_hash(&k(1, "x")),
        };
        let bytes = h.encode();
        assert_eq!(ObjectHeader::decode(&bytes), Ok(h));
        for i in 0..DFS_HEADER_LEN {
            let mut b = bytes;
            b[i] ^= 0x10;
            assert_eq!(
                ObjectHeader::decode(&b),
                Err(InvalidReason::Header),
                "byte {i}"
            );
        }
    }

    #[test]
    fn purge_is_one_namespace_only() {
        let (_d, s) = store();
        s.put(&[k(1, "a"), k(1, "b"), k(2, "a")], &[b"x", b"y", b"z"])
            .unwrap();
        assert_eq!(s.remove_namespace(&ns(1)).unwrap(), 2);
        assert_eq!(s.query(&[k(1, "a"), k(2, "a")]).unwrap(), vec![false, true]);
        assert_eq!(s.remove_namespace(&ns(1)).unwrap(), 0);
        assert!(s.remove_namespace(&Namespace("../x".into())).is_err());
        // No tombstone remains.
        let left: Vec<_> = fs::read_dir(s.root()).unwrap().collect();
        assert_eq!(left.len(), 1);
        // The namespace is writable again.
        assert_eq!(
            s.put(&[k(1, "a")], &[b"new"]).unwrap(),
            vec![KeyResult::Ok { bytes: 3 }]
        );
    }

    #[test]
    fn a_paused_writer_publishes_nothing_until_it_finishes() {
        let d = tempfile::tempdir().unwrap();
        let s = Arc::new(DfsStore::open(d.path(), 4).unwrap());
        let g = Gate::new();
        *s.hooks.after_write_chunk.lock() = Some(g.clone());
        let data: Vec<u8> = (0..DFS_WRITE_CHUNK * 2 + 10).map(|i| i as u8).collect();
        let s2 = s.clone();
        let d2 = data.clone();
        let t = std::thread::spawn(move || s2.put(&[k(3, "big")], &[&d2]).unwrap());
        g.wait_entered(1);
        assert_eq!(s.query(&[k(3, "big")]).unwrap(), vec![false]);
        let mut dest = vec![0u8; data.len()];
        assert_eq!(
            s.get(&[k(3, "big")], &mut [&mut dest]).unwrap(),
            vec![KeyResult::Missing]
        );
        g.release();
        assert_eq!(
            t.join().unwrap(),
            vec![KeyResult::Ok {
                bytes: data.len() as u64
            }]
        );
        let (_, bytes) = s.read_object(&k(3, "big")).unwrap();
        assert_eq!(bytes, data);
    }

    #[test]
    fn a_batch_is_group_committed_create_only_and_in_input_order() {
        let (_d, s) = store();
        assert_eq!(
            s.put(&[k(5, "old")], &[b"first".as_slice()]).unwrap(),
            vec![KeyResult::Ok { bytes: 5 }]
        );
        let keys = [
            k(5, "a"),
            k(5, "old"),
            StorageKey::new("tsl3-00000000000000ab-.hidden".to_string()),
            k(5, "b"),
            k(5, "a"),
            k(6, "c"),
        ];
        let srcs: [&[u8]; 6] = [b"alpha", b"second", b"x", b"beta", b"again", b"gamma"];
        let r = s.put(&keys, &srcs).unwrap();
        assert_eq!(r[0], KeyResult::Ok { bytes: 5 });
        assert_eq!(
            r[1],
            KeyResult::AlreadyExists,
            "create-only: never replaced"
        );
        assert!(matches!(r[2], KeyResult::Failed { retired: true, .. }));
        assert_eq!(r[3], KeyResult::Ok { bytes: 4 });
        assert_eq!(
            r[4],
            KeyResult::AlreadyExists,
            "a key twice in one batch lands once"
        );
        assert_eq!(r[5], KeyResult::Ok { bytes: 5 });
        for (key, want) in [
            (k(5, "a"), b"alpha".as_slice()),
            (k(5, "old"), b"first"),
            (k(5, "b"), b"beta"),
            (k(6, "c"), b"gamma"),
        ] {
            assert_eq!(s.read_object(&key).unwrap().1, want);
        }
        // No temp file is left behind.
        for ns in ["tsl3-0000000000000005", "tsl3-0000000000000006"] {
            let dir = s.root().join(ns);
            for e in std::fs::read_dir(&dir).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().to_string();
                assert!(
                    !name.starts_with(TEMP_PREFIX),
                    "{name} left in {}",
                    dir.display()
                );
            }
        }
    }

    #[test]
    fn a_paused_batch_publishes_none_of_its_objects_until_it_finishes() {
        let d = tempfile::tempdir().unwrap();
        let s = Arc::new(DfsStore::open(d.path(), 4).unwrap());
        let g = Gate::new();
        *s.hooks.after_write_chunk.lock() = Some(g.clone());
        let s2 = s.clone();
        let t = std::thread::spawn(move || {
            s2.put(&[k(3, "one"), k(3, "two")], &[b"11".as_slice(), b"22"])
                .unwrap()
        });
        // Paused inside the first object's write: neither object is visible.
        g.wait_entered(1);
        assert_eq!(
            s.query(&[k(3, "one"), k(3, "two")]).unwrap(),
            vec![false, false]
        );
        g.release();
        assert_eq!(
            t.join().unwrap(),
            vec![KeyResult::Ok { bytes: 2 }, KeyResult::Ok { bytes: 2 }]
        );
        assert_eq!(
            s.query(&[k(3, "one"), k(3, "two")]).unwrap(),
            vec![true, true]
        );
    }

    #[test]
    fn concurrent_io_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let s = Arc::new(DfsStore::open(d.path(), 2).unwrap());
        let g = Gate::new();
        *s.hooks.after_write_chunk.lock() = Some(g.clone());
        let threads: Vec<_> = (0..5)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || s.put(&[k(4, &format!("o{i}"))], &[b"abc"]).unwrap())
            })
            .collect();
        g.wait_entered(2);
        // Two writers hold both slots at the gate; the others wait for a slot.
        assert_eq!(g.entered(), 2);
        g.release();
        for t in threads {
            assert_eq!(t.join().unwrap(), vec![KeyResult::Ok { bytes: 3 }]);
        }
        assert_eq!(s.io_limiter().peak(), 2);
    }

    #[test]
    fn racing_creators_publish_exactly_one_object() {
        let d = tempfile::tempdir().unwrap();
        let s = Arc::new(DfsStore::open(d.path(), 8).unwrap());
        let threads: Vec<_> = (0..6u8)
            .map(|i| {
                let s = s.clone();
                std::thread::spawn(move || s.put_one(&k(5, "race"), &[i; 64]))
            })
            .collect();
        let results: Vec<KeyResult> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let oks = results
            .iter()
            .filter(|r| matches!(r, KeyResult::Ok { .. }))
            .count();
        assert_eq!(oks, 1, "{results:?}");
        let (_, bytes) = s.read_object(&k(5, "race")).unwrap();
        assert!(bytes.iter().all(|b| *b == bytes[0]));
    }

    #[test]
    fn a_read_into_a_reused_buffer_holds_exactly_the_object() {
        let (_d, s) = store();
        let key = k(4, "reuse");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        s.put(std::slice::from_ref(&key), &[&data]).unwrap();
        // A spare with old bytes and the exact capacity, then one too small to hold it.
        let mut old = vec![0xEEu8; data.len()];
        old.truncate(10);
        let cap = old.capacity();
        let (_, got) = s
            .read_object_with(&key, |len| {
                assert_eq!(len, data.len());
                Some(old)
            })
            .unwrap();
        assert_eq!(got, data);
        assert_eq!(
            got.capacity(),
            cap,
            "the buffer itself was filled, not a new one"
        );
        let (_, got) = s.read_object_with(&key, |_| Some(vec![1u8; 3])).unwrap();
        assert_eq!(got, data);
    }
}
