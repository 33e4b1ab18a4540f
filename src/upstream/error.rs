//! Why an upstream's client could not be built.

#[derive(Debug, thiserror::Error)]
pub enum UpstreamBuildError {
    #[error("upstream {upstream:?}: ca_file {path}: {reason}")]
    CaFile {
        upstream: String,
        path: String,
        reason: String,
    },
    #[error("upstream {upstream:?}: TLS setup: {reason}")]
    Tls { upstream: String, reason: String },
    #[error("upstream {upstream:?}: the key in {var} is not a valid header value")]
    BadKey { upstream: String, var: String },
    #[error("upstream {upstream:?}: api_key_file {path}: {reason}")]
    KeyFile {
        upstream: String,
        path: String,
        reason: String,
    },
}
