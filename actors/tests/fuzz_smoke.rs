//! The bounded fuzz smoke run of the README test command: each fuzz target of
//! `actors::fuzz` on its valid seeds and on seeded mutations of them (bit flips, hostile
//! length prefixes, truncation, splices, random bytes). 0 panics, and no invalid input is
//! accepted. `TSL3_FUZZ_ITERATIONS` raises the count (default 3000 per target; the deep
//! runs are the cargo-fuzz targets in fuzz/).

use actors::fuzz;

fn iterations() -> usize {
    std::env::var(actors::names::env::FUZZ_ITERATIONS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

#[test]
fn the_mesh_frame_decoder_survives_hostile_bytes() {
    let seeds = fuzz::mesh_seeds();
    assert!(seeds.len() >= 3);
    let n = fuzz::smoke(0x5eed_0001, iterations(), &seeds, &fuzz::mesh_frames);
    assert_eq!(n, seeds.len() + iterations());
}

#[test]
fn the_dfs_object_reader_accepts_only_the_keys_own_valid_objects() {
    let dir = tempfile::tempdir().unwrap();
    let store = actors::l3::store::dfs::DfsStore::open(dir.path(), 2).unwrap();
    let seeds = fuzz::dfs_seeds(&store);
    assert_eq!(seeds.len(), 3, "seeds are real objects of the fuzz key");
    let n = fuzz::smoke(0x5eed_0002, iterations() / 3, &seeds, &|d: &[u8]| {
        fuzz::dfs_object(&store, d)
    });
    assert!(n > seeds.len());
}

#[test]
fn request_bodies_survive_hostile_bytes() {
    let seeds = fuzz::completion_seeds();
    let n = fuzz::smoke(0x5eed_0003, iterations(), &seeds, &fuzz::completion_body);
    assert_eq!(n, seeds.len() + iterations());
}

#[test]
fn the_mutator_reaches_hostile_shapes() {
    // The harness itself: mutations differ from their seeds and include length prefixes.
    let seeds = fuzz::mesh_seeds();
    let mut rng = fuzz::Rng::new(7);
    let outs: Vec<Vec<u8>> = (0..500).map(|_| fuzz::mutate(&mut rng, &seeds)).collect();
    assert!(outs.iter().filter(|o| !seeds.contains(o)).count() > 450);
    assert!(outs.iter().any(|o| o.starts_with(&u32::MAX.to_be_bytes())));
    assert!(
        outs.iter().any(|o| o.len() < 4),
        "truncated below the length prefix"
    );
}
