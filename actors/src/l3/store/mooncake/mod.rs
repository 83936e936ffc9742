//! MooncakeStore: the Store over a Mooncake master and its independent storage owners,
//! through our own bindings to the C interface (`ffi`) and the seed's return-code contract
//! (`codes`). It owns one Mooncake client (setup with the deployment's tenant, and
//! `global_segment_size = 0` by default so that an engine host mounts no storage of its
//! own), the registration of the shared Host allocation, and the adapter counters. Keys carry
//! no rank or Host offset: an object written from one cyclic owner's Host range can be
//! restored into any other. It never retries, never sleeps and never decides scheduling:
//! every call blocks on the executor's worker thread and returns facts.

pub mod bench;
pub mod codes;
pub mod ffi;
pub mod live;

use super::{KeyResult, Store, StoreError};
use crate::host::HostCacheStorage;
use ffi::{CKeys, FfiError, MooncakeClient, MooncakeLibrary, SetupArgs};
use messages::settings::MooncakeStoreSettings;
use messages::{Namespace, StorageKey};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const NAME: &str = "mooncake";

fn ffi_err(e: FfiError) -> StoreError {
    StoreError::new(NAME, e.to_string())
}

/// The adapter's counters (atomics: the store is shared by the executor's workers).
#[derive(Debug, Default)]
pub struct MooncakeCounters {
    /// Adapter invocations that reached the library (one per batch call).
    pub backend_calls: AtomicU64,
    /// PUT rows reported successful: new writes plus create-only rejections (-705).
    pub put_successes: AtomicU64,
    /// PUT rows that were new native writes (code 0). Note: the 0.3.13 master answers 0,
    /// not -705, to a second put of an existing key and keeps the first value, so a
    /// deduplicated put of the same key counts here too.
    pub new_writes: AtomicU64,
}

/// A Mooncake Store client.
pub struct MooncakeStore {
    client: MooncakeClient,
    tenant: String,
    registered: Mutex<Vec<Arc<HostCacheStorage>>>,
    pub counters: MooncakeCounters,
}

impl std::fmt::Debug for MooncakeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MooncakeStore")
            .field("library", self.client.library())
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl MooncakeStore {
    /// Loads the library (settings path, else `$MOONCAKE_STORE_LIBRARY`), creates a client
    /// and sets it up in the settings' tenant. Any failure is one StoreError naming it.
    pub fn connect(settings: &MooncakeStoreSettings) -> Result<Self, StoreError> {
        let path = ffi::library_path(&settings.library_path).map_err(ffi_err)?;
        let lib = MooncakeLibrary::load(&path).map_err(ffi_err)?;
        Self::connect_with(lib, settings)
    }

    /// As `connect`, with an already loaded library.
    pub fn connect_with(
        lib: Arc<MooncakeLibrary>,
        settings: &MooncakeStoreSettings,
    ) -> Result<Self, StoreError> {
        let tenant = settings.tenant_id.clone();
        // The plain setup joins the shared default tenant; any other tenant needs the
        // tenant entry point.
        let tenant_arg = if lib.supports_tenants() {
            Some(tenant.as_str())
        } else if tenant == "default" {
            None
        } else {
            return Err(ffi_err(FfiError::NoTenantSupport(tenant)));
        };
        let client = MooncakeClient::create(lib).map_err(ffi_err)?;
        let rc = client
            .setup(&SetupArgs {
                local_hostname: &settings.local_hostname,
                metadata_server: &settings.metadata_server,
                global_segment_size: settings.global_segment_size,
                local_buffer_size: settings.local_buffer_size,
                protocol: &settings.protocol,
                device_name: &settings.device_name,
                master_server_addr: &settings.master_server_addr,
                tenant_id: tenant_arg,
            })
            .map_err(ffi_err)?;
        if rc != 0 {
            return Err(StoreError::new(
                NAME,
                format!(
                    "setup against master {} (metadata {}, tenant {tenant}) returned {rc}",
                    settings.master_server_addr, settings.metadata_server
                ),
            ));
        }
        Ok(Self {
            client,
            tenant,
            registered: Mutex::new(Vec::new()),
            counters: MooncakeCounters::default(),
        })
    }

    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Registers the shared Host allocation for zero-copy transfers. The store keeps the
    /// allocation alive while registered (unregistered in `close`).
    pub fn register_host(&self, host: &Arc<HostCacheStorage>) -> Result<(), StoreError> {
        let mut reg = self.registered.lock();
        if reg.iter().any(|h| Arc::ptr_eq(h, host)) {
            return Ok(());
        }
        let rc = self.client.register_host(host).map_err(ffi_err)?;
        if rc != 0 {
            return Err(StoreError::new(
                NAME,
                format!("register_buffer of {} Host bytes returned {rc}", host.len()),
            ));
        }
        reg.push(host.clone());
        Ok(())
    }

    /// The client's health check code (0 healthy).
    pub fn health_check(&self) -> i32 {
        self.client.health_check()
    }

    fn keys(keys: &[StorageKey]) -> Result<CKeys, StoreError> {
        let texts: Vec<_> = keys.iter().map(StorageKey::text).collect();
        CKeys::new(texts.iter().map(|k| &**k)).map_err(ffi_err)
    }

    fn call_failed(what: &str, rc: i32) -> StoreError {
        StoreError::new(NAME, format!("{what} returned {rc}"))
    }
}

impl Store for MooncakeStore {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Mooncake does not infer retirement from a failed SDK call.
    fn failures_retire(&self) -> bool {
        false
    }

    fn query(&self, keys: &[StorageKey]) -> Result<Vec<bool>, StoreError> {
        let ck = Self::keys(keys)?;
        self.counters.backend_calls.fetch_add(1, Ordering::Relaxed);
        let (rc, codes) = self.client.batch_is_exist(&ck);
        if rc != 0 {
            return Err(Self::call_failed("batch_is_exist", rc));
        }
        codes
            .into_iter()
            .map(|c| codes::exist_result(c).map_err(|e| StoreError::new(NAME, e.to_string())))
            .collect()
    }

    fn get(
        &self,
        keys: &[StorageKey],
        dests: &mut [&mut [u8]],
    ) -> Result<Vec<KeyResult>, StoreError> {
        crate::l3::store::same_count(NAME, keys.len(), dests.len(), "destinations")?;
        let ck = Self::keys(keys)?;
        let expected: Vec<u64> = dests.iter().map(|d| d.len() as u64).collect();
        self.counters.backend_calls.fetch_add(1, Ordering::Relaxed);
        let (rc, codes) = self.client.batch_get_into(&ck, dests);
        if rc != 0 {
            return Err(Self::call_failed("batch_get_into", rc));
        }
        codes
            .into_iter()
            .zip(expected)
            .map(|(c, n)| codes::get_result(c, n).map_err(|e| StoreError::new(NAME, e.to_string())))
            .collect()
    }

    fn put(&self, keys: &[StorageKey], srcs: &[&[u8]]) -> Result<Vec<KeyResult>, StoreError> {
        crate::l3::store::same_count(NAME, keys.len(), srcs.len(), "sources")?;
        let ck = Self::keys(keys)?;
        self.counters.backend_calls.fetch_add(1, Ordering::Relaxed);
        let (rc, codes) = self.client.batch_put_from(&ck, srcs);
        if rc != 0 {
            return Err(Self::call_failed("batch_put_from", rc));
        }
        let results = codes
            .into_iter()
            .zip(srcs)
            .map(|(c, s)| {
                codes::put_result(c, s.len() as u64)
                    .map_err(|e| StoreError::new(NAME, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for r in &results {
            let (success, new_write) = codes::put_success(r);
            if success {
                self.counters.put_successes.fetch_add(1, Ordering::Relaxed);
            }
            if new_write {
                self.counters.new_writes.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(results)
    }

    fn remove_namespace(&self, ns: &Namespace) -> Result<u64, StoreError> {
        let pattern = codes::namespace_pattern(ns.as_str());
        self.counters.backend_calls.fetch_add(1, Ordering::Relaxed);
        let n = self
            .client
            .remove_by_regex(&pattern, true)
            .map_err(ffi_err)?;
        if n < 0 {
            return Err(StoreError::new(
                NAME,
                format!("remove_by_regex {pattern:?} returned {n}"),
            ));
        }
        Ok(n as u64)
    }

    fn close(&self) -> Result<(), StoreError> {
        let mut reg = self.registered.lock();
        let mut failed = Vec::new();
        for host in reg.drain(..) {
            let rc = self.client.unregister_host(&host);
            if rc != 0 {
                // Still possibly addressed by the library: keep it for the process.
                host.retain_for_process();
                failed.push(rc);
            }
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(StoreError::new(
                NAME,
                format!("unregister_buffer returned {failed:?}"),
            ))
        }
    }
}
