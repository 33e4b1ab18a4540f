//! Fuzz target: see `hourglass_fuzz::sse_scanner`.
#![cfg_attr(feature = "libfuzzer", no_main)]

#[cfg(feature = "libfuzzer")]
libfuzzer_sys::fuzz_target!(|data: &[u8]| hourglass_fuzz::sse_scanner(data));

#[cfg(not(feature = "libfuzzer"))]
fn main() {
    hourglass_fuzz::standalone("sse_scanner", hourglass_fuzz::sse_scanner);
}
