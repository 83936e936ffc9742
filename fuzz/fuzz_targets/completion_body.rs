#![no_main]
//! The HTTP request bodies: completions and the admin commands.
libfuzzer_sys::fuzz_target!(|data: &[u8]| actors::fuzz::completion_body(data));
