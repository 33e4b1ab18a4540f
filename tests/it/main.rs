//! The functional integration tests, one binary: each module is one area of the gateway's
//! behaviour (budget, cancel, runs, ...), all sharing `support`. One binary links once, where a
//! file each linked the library and its dependencies twenty times. The heavy ones (scale, soak,
//! load) stay binaries of their own, and so does the layer check.

mod support;

mod admission;
mod backpressure;
mod balance;
mod budget;
mod cancel;
mod chain;
mod cli;
mod client_conns;
mod compatible_streams;
mod conformance;
mod descriptors;
mod ejection;
mod empty_streams;
mod faults;
mod gemini;
mod h2_upstream;
mod limits;
mod llama_errors;
mod ollama;
mod ops;
mod peer_headers;
mod properties;
mod provider;
mod replicas;
mod response_memory;
mod retry;
mod runs;
mod secrets;
mod smuggling;
mod stream;
mod stream_upstream;
mod stream_upstream_ends;
mod tls_clients;
mod uploads;
mod upstream_tls;
