#![no_main]
//! The DFS object reader: arbitrary bytes as the file of one key.
use std::sync::OnceLock;

static STORE: OnceLock<(tempfile::TempDir, actors::l3::store::dfs::DfsStore)> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (_, store) = STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temp dir");
        let store = actors::l3::store::dfs::DfsStore::open(dir.path(), 1).expect("a store");
        (dir, store)
    });
    actors::fuzz::dfs_object(store, data)
});
