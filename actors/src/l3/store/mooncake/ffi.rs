//! Our own bindings to Mooncake's C interface (`store_c.h` of mooncake-store), loaded at run
//! time with libloading. This module owns the library handle, the client handle and the
//! `unsafe` calls; it turns every C argument into an owned, NUL-terminated or
//! bounds-known value before the call and reports raw return codes back. It never
//! interprets a code (that is `codes`), never panics across the boundary (Mooncake calls no
//! Rust code back: there are no callbacks, so no Rust panic can unwind through C frames),
//! and never keeps a pointer it was handed beyond one call, except registered buffers,
//! whose lifetime the caller (MooncakeStore) keeps.

use crate::host::HostCacheStorage;
use libloading::Library;
use std::ffi::{c_char, c_int, c_void, CString};
use std::ptr::NonNull;
use std::sync::Arc;

/// A result slot the library has not written: a batch call that leaves one unwritten
/// returned a malformed result.
pub const UNWRITTEN_I32: i32 = i32::MIN;
pub const UNWRITTEN_I64: i64 = i64::MIN;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FfiError {
    #[error("no Mooncake store library configured: set storage.mooncake.library_path or ${0}")]
    NoPath(&'static str),
    #[error("cannot load the Mooncake store library {path}: {reason} (are its dependencies on LD_LIBRARY_PATH? see deploy/mooncake/env.sh)")]
    Load { path: String, reason: String },
    #[error("the Mooncake store library {path} lacks the symbol {symbol}: {reason}")]
    Symbol {
        path: String,
        symbol: &'static str,
        reason: String,
    },
    #[error("mooncake_store_create returned NULL")]
    Create,
    #[error("{what} contains a NUL byte")]
    Nul { what: &'static str },
    #[error("a Host allocation of {0} bytes exceeds the address space")]
    TooLarge(u64),
    #[error(
        "this library has no mooncake_store_setup_with_tenant; tenant {0:?} cannot be selected"
    )]
    NoTenantSupport(String),
}

/// `mooncake_replicate_config_t`, field for field.
#[repr(C)]
struct ReplicateConfig {
    replica_num: usize,
    with_soft_pin: c_int,
    with_hard_pin: c_int,
    preferred_segments: *const *const c_char,
    preferred_segments_count: usize,
}

type Handle = *mut c_void;
type CreateFn = unsafe extern "C" fn() -> Handle;
type DestroyFn = unsafe extern "C" fn(Handle);
type SetupFn = unsafe extern "C" fn(
    Handle,
    *const c_char,
    *const c_char,
    u64,
    u64,
    *const c_char,
    *const c_char,
    *const c_char,
) -> c_int;
type SetupTenantFn = unsafe extern "C" fn(
    Handle,
    *const c_char,
    *const c_char,
    u64,
    u64,
    *const c_char,
    *const c_char,
    *const c_char,
    *const c_char,
) -> c_int;
type HealthFn = unsafe extern "C" fn(Handle) -> c_int;
type BatchPutFromFn = unsafe extern "C" fn(
    Handle,
    *const *const c_char,
    *const *mut c_void,
    *const usize,
    usize,
    *const ReplicateConfig,
    *mut c_int,
) -> c_int;
type BatchGetIntoFn = unsafe extern "C" fn(
    Handle,
    *const *const c_char,
    *const *mut c_void,
    *const usize,
    usize,
    *mut i64,
) -> c_int;
type BatchIsExistFn =
    unsafe extern "C" fn(Handle, *const *const c_char, usize, *mut c_int) -> c_int;
type RemoveByRegexFn = unsafe extern "C" fn(Handle, *const c_char, c_int) -> i64;
type RegisterFn = unsafe extern "C" fn(Handle, *mut c_void, usize) -> c_int;
type UnregisterFn = unsafe extern "C" fn(Handle, *mut c_void) -> c_int;

/// The loaded library and the entry points tsl3 uses. The function pointers stay valid
/// while `_lib` lives (it is never unloaded before them: same struct, dropped last).
pub struct MooncakeLibrary {
    path: String,
    create: CreateFn,
    destroy: DestroyFn,
    setup: SetupFn,
    setup_with_tenant: Option<SetupTenantFn>,
    health_check: HealthFn,
    batch_put_from: BatchPutFromFn,
    batch_get_into: BatchGetIntoFn,
    batch_is_exist: BatchIsExistFn,
    remove_by_regex: RemoveByRegexFn,
    register_buffer: RegisterFn,
    unregister_buffer: UnregisterFn,
    _lib: Library,
}

impl std::fmt::Debug for MooncakeLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakeLibrary")
            .field("path", &self.path)
            .field("tenants", &self.setup_with_tenant.is_some())
            .finish()
    }
}

/// The library path: the settings' path, else `$MOONCAKE_STORE_LIBRARY`.
pub fn library_path(configured: &str) -> Result<String, FfiError> {
    if !configured.is_empty() {
        return Ok(configured.to_string());
    }
    let var = crate::names::env::MOONCAKE_STORE_LIBRARY;
    match std::env::var(var) {
        Ok(p) if !p.is_empty() => Ok(p),
        _ => Err(FfiError::NoPath(var)),
    }
}

fn symbol<T: Copy>(lib: &Library, path: &str, name: &'static str) -> Result<T, FfiError> {
    // SAFETY: T is the exact `extern "C"` signature of `name` in store_c.h (checked by the
    // live tests, which call every entry point); the copied pointer is used only while the
    // Library lives (MooncakeLibrary keeps both together).
    unsafe { lib.get::<T>(name) }
        .map(|s| *s)
        .map_err(|e| FfiError::Symbol {
            path: path.to_string(),
            symbol: name,
            reason: e.to_string(),
        })
}

impl MooncakeLibrary {
    /// Loads the library and resolves every entry point; a missing one is a clear error.
    pub fn load(path: &str) -> Result<Arc<Self>, FfiError> {
        // SAFETY: loading runs the library's initialisers; libmooncake_store.so's only
        // global side effects are its logging and transfer-engine singletons. A missing
        // file or dependency is an Err, tested by `load_errors_are_clear`.
        let lib = unsafe { Library::new(path) }.map_err(|e| FfiError::Load {
            path: path.to_string(),
            reason: e.to_string(),
        })?;
        let p = path;
        Ok(Arc::new(Self {
            path: path.to_string(),
            create: symbol(&lib, p, "mooncake_store_create")?,
            destroy: symbol(&lib, p, "mooncake_store_destroy")?,
            setup: symbol(&lib, p, "mooncake_store_setup")?,
            setup_with_tenant: symbol(&lib, p, "mooncake_store_setup_with_tenant").ok(),
            health_check: symbol(&lib, p, "mooncake_store_health_check")?,
            batch_put_from: symbol(&lib, p, "mooncake_store_batch_put_from")?,
            batch_get_into: symbol(&lib, p, "mooncake_store_batch_get_into")?,
            batch_is_exist: symbol(&lib, p, "mooncake_store_batch_is_exist")?,
            remove_by_regex: symbol(&lib, p, "mooncake_store_remove_by_regex")?,
            register_buffer: symbol(&lib, p, "mooncake_store_register_buffer")?,
            unregister_buffer: symbol(&lib, p, "mooncake_store_unregister_buffer")?,
            _lib: lib,
        }))
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn supports_tenants(&self) -> bool {
        self.setup_with_tenant.is_some()
    }
}

/// Arguments of `mooncake_store_setup[_with_tenant]`.
#[derive(Clone, Debug)]
pub struct SetupArgs<'a> {
    pub local_hostname: &'a str,
    pub metadata_server: &'a str,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub protocol: &'a str,
    pub device_name: &'a str,
    pub master_server_addr: &'a str,
    /// None: plain `mooncake_store_setup` (the shared default tenant).
    pub tenant_id: Option<&'a str>,
}

fn cstring(s: &str, what: &'static str) -> Result<CString, FfiError> {
    CString::new(s).map_err(|_| FfiError::Nul { what })
}

/// Owned, NUL-terminated keys and their pointer array for one batch call.
pub struct CKeys {
    _owned: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

impl CKeys {
    pub fn new<'a>(keys: impl IntoIterator<Item = &'a str>) -> Result<Self, FfiError> {
        let owned = keys
            .into_iter()
            .map(|k| cstring(k, "a storage key"))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs = owned.iter().map(|c| c.as_ptr()).collect();
        Ok(Self {
            _owned: owned,
            ptrs,
        })
    }
    pub fn len(&self) -> usize {
        self.ptrs.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ptrs.is_empty()
    }
}

/// One Mooncake client (`mooncake_store_t`). Destroyed on drop.
#[derive(Debug)]
pub struct MooncakeClient {
    lib: Arc<MooncakeLibrary>,
    handle: NonNull<c_void>,
}

// SAFETY: the C client is internally synchronised: every entry point may be called from
// any thread, concurrently (notes/mooncake.md; exercised by the live tests, which call one
// client from the test thread and from executor-style worker threads).
unsafe impl Send for MooncakeClient {}
// SAFETY: as above; `&self` methods only pass the handle to thread-safe entry points.
unsafe impl Sync for MooncakeClient {}

impl MooncakeClient {
    pub fn create(lib: Arc<MooncakeLibrary>) -> Result<Self, FfiError> {
        // SAFETY: `create` takes no arguments and returns a fresh handle or NULL.
        let raw = unsafe { (lib.create)() };
        let handle = NonNull::new(raw).ok_or(FfiError::Create)?;
        Ok(Self { lib, handle })
    }

    pub fn library(&self) -> &Arc<MooncakeLibrary> {
        &self.lib
    }

    /// Connects to the master; returns the C return code (0 is success).
    pub fn setup(&self, a: &SetupArgs<'_>) -> Result<i32, FfiError> {
        let host = cstring(a.local_hostname, "local_hostname")?;
        let meta = cstring(a.metadata_server, "metadata_server")?;
        let proto = cstring(a.protocol, "protocol")?;
        let dev = cstring(a.device_name, "device_name")?;
        let master = cstring(a.master_server_addr, "master_server_addr")?;
        let h = self.handle.as_ptr();
        match a.tenant_id {
            None => {
                // SAFETY: every string is an owned CString alive for the call; the handle
                // is live (owned by self); the library copies what it keeps (store_c.h).
                Ok(unsafe {
                    (self.lib.setup)(
                        h,
                        host.as_ptr(),
                        meta.as_ptr(),
                        a.global_segment_size,
                        a.local_buffer_size,
                        proto.as_ptr(),
                        dev.as_ptr(),
                        master.as_ptr(),
                    )
                })
            }
            Some(tenant) => {
                let f = self
                    .lib
                    .setup_with_tenant
                    .ok_or_else(|| FfiError::NoTenantSupport(tenant.to_string()))?;
                let t = cstring(tenant, "tenant_id")?;
                // SAFETY: as for setup, plus the tenant CString alive for the call.
                Ok(unsafe {
                    f(
                        h,
                        host.as_ptr(),
                        meta.as_ptr(),
                        a.global_segment_size,
                        a.local_buffer_size,
                        proto.as_ptr(),
                        dev.as_ptr(),
                        master.as_ptr(),
                        t.as_ptr(),
                    )
                })
            }
        }
    }

    pub fn health_check(&self) -> i32 {
        // SAFETY: the handle is live; the call reads nothing from us.
        unsafe { (self.lib.health_check)(self.handle.as_ptr()) }
    }

    /// `batch_is_exist`: the overall code and one code per key (prefilled UNWRITTEN_I32).
    pub fn batch_is_exist(&self, keys: &CKeys) -> (i32, Vec<i32>) {
        let mut out = vec![UNWRITTEN_I32; keys.len()];
        if keys.is_empty() {
            return (0, out);
        }
        // SAFETY: `keys.ptrs` holds `len` valid C strings alive for the call; `out` has
        // exactly `len` writable slots.
        let rc = unsafe {
            (self.lib.batch_is_exist)(
                self.handle.as_ptr(),
                keys.ptrs.as_ptr(),
                keys.len(),
                out.as_mut_ptr(),
            )
        };
        (rc, out)
    }

    /// `batch_get_into` straight into the destinations (exclusive borrows for the whole
    /// call): the overall code and one byte count or error per key.
    pub fn batch_get_into(&self, keys: &CKeys, dests: &mut [&mut [u8]]) -> (i32, Vec<i64>) {
        let mut out = vec![UNWRITTEN_I64; keys.len()];
        if keys.is_empty() || keys.len() != dests.len() {
            return (if keys.is_empty() { 0 } else { -600 }, out);
        }
        let ptrs: Vec<*mut c_void> = dests.iter_mut().map(|d| d.as_mut_ptr().cast()).collect();
        let sizes: Vec<usize> = dests.iter().map(|d| d.len()).collect();
        // SAFETY: each destination pointer/size pair is an exclusively borrowed slice alive
        // for the call (the library writes at most `size` bytes into each: the live tests'
        // guard bytes around every destination check this); keys and `out` have `len` entries.
        let rc = unsafe {
            (self.lib.batch_get_into)(
                self.handle.as_ptr(),
                keys.ptrs.as_ptr(),
                ptrs.as_ptr(),
                sizes.as_ptr(),
                keys.len(),
                out.as_mut_ptr(),
            )
        };
        (rc, out)
    }

    /// `batch_put_from` from the sources (create-only, one replica, no pins): the overall
    /// code and one code per key.
    pub fn batch_put_from(&self, keys: &CKeys, srcs: &[&[u8]]) -> (i32, Vec<i32>) {
        let mut out = vec![UNWRITTEN_I32; keys.len()];
        if keys.is_empty() || keys.len() != srcs.len() {
            return (if keys.is_empty() { 0 } else { -600 }, out);
        }
        // The C signature takes `void **` but only reads the sources.
        let ptrs: Vec<*mut c_void> = srcs.iter().map(|s| s.as_ptr() as *mut c_void).collect();
        let sizes: Vec<usize> = srcs.iter().map(|s| s.len()).collect();
        let config = ReplicateConfig {
            replica_num: 1,
            with_soft_pin: 0,
            with_hard_pin: 0,
            preferred_segments: std::ptr::null(),
            preferred_segments_count: 0,
        };
        // SAFETY: each source pointer/size pair is a borrowed slice alive for the call, and
        // put_from only reads it (the round-trip tests compare the sources afterwards);
        // keys and `out` have `len` entries; `config` lives on this stack frame.
        let rc = unsafe {
            (self.lib.batch_put_from)(
                self.handle.as_ptr(),
                keys.ptrs.as_ptr(),
                ptrs.as_ptr(),
                sizes.as_ptr(),
                keys.len(),
                &config,
                out.as_mut_ptr(),
            )
        };
        (rc, out)
    }

    /// `remove_by_regex` (force: also leased objects): the count removed, or an error code.
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<i64, FfiError> {
        let p = cstring(pattern, "a removal pattern")?;
        // SAFETY: the pattern is an owned CString alive for the call; the handle is live.
        Ok(unsafe { (self.lib.remove_by_regex)(self.handle.as_ptr(), p.as_ptr(), force as c_int) })
    }

    /// Registers a whole Host allocation for zero-copy transfers. The caller keeps the
    /// Arc (and so the memory) until `unregister_host` succeeded.
    pub fn register_host(&self, host: &Arc<HostCacheStorage>) -> Result<i32, FfiError> {
        let len = usize::try_from(host.len()).map_err(|_| FfiError::TooLarge(host.len()))?;
        // SAFETY: `host` is a live allocation of `len` bytes from `base_ptr`; MooncakeStore
        // holds an Arc to it until `unregister_host` returned 0 (or retains it for the
        // process otherwise), so it outlives the registration (the live round trips read
        // through the registration after dropping their own handle).
        Ok(
            unsafe {
                (self.lib.register_buffer)(self.handle.as_ptr(), host.base_ptr().cast(), len)
            },
        )
    }

    /// Unregisters a Host allocation registered earlier.
    pub fn unregister_host(&self, host: &HostCacheStorage) -> i32 {
        // SAFETY: only the address is passed; the library looks it up in its own table.
        unsafe { (self.lib.unregister_buffer)(self.handle.as_ptr(), host.base_ptr().cast()) }
    }
}
impl Drop for MooncakeClient {
    fn drop(&mut self) {
        // SAFETY: the handle came from `create` and is destroyed exactly once, here; the
        // store drops its client only after every call through it returned.
        unsafe { (self.lib.destroy)(self.handle.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_errors_are_clear() {
        let e = MooncakeLibrary::load("/nonexistent/libmooncake_store.so").unwrap_err();
        assert!(matches!(e, FfiError::Load { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/libmooncake_store.so"));
        // A real library without the symbols: libc.
        let e = MooncakeLibrary::load("libc.so.6").unwrap_err();
        match e {
            FfiError::Symbol { symbol, .. } => assert_eq!(symbol, "mooncake_store_create"),
            other => panic!("expected a missing symbol, got {other}"),
        }
    }

    #[test]
    fn configured_path_wins_over_the_environment() {
        assert_eq!(library_path("/x/lib.so").unwrap(), "/x/lib.so");
    }

    #[test]
    fn keys_with_nul_are_rejected_before_any_call() {
        assert!(matches!(
            CKeys::new(["ok", "bad\0key"]),
            Err(FfiError::Nul { .. })
        ));
        let k = CKeys::new(["a", "b"]).unwrap();
        assert_eq!(k.len(), 2);
    }
}
