#![no_main]
//! The rank mesh's frame decoder (and the handshake's) over arbitrary bytes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| actors::fuzz::mesh_frames(data));
