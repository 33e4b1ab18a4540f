//! Fuzz target: see `hourglass_fuzz::config`.
#![cfg_attr(feature = "libfuzzer", no_main)]

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hourglass_fuzz::config(data));

#[cfg(not(feature = "libfuzzer"))]
fn main() {
    hourglass_fuzz::standalone("config", hourglass_fuzz::config);
}
