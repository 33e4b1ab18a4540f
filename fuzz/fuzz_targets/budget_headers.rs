//! Fuzz target: see `hourglass_fuzz::budget_headers`.
#![cfg_attr(feature = "libfuzzer", no_main)]

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hourglass_fuzz::budget_headers(data));

#[cfg(not(feature = "libfuzzer"))]
fn main() {
    hourglass_fuzz::standalone("budget_headers", hourglass_fuzz::budget_headers);
}
