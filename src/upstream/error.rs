//! Why an upstream's client could not be built.

#[derive(Debug, thiserror::Error)]
pub enum UpstreamBuildError {
    /// `ca_file`, `client_cert` or `client_cert_key`.
    #[error("upstream {upstream:?}: {field} {path}: {reason}")]
    TlsFile {
        upstream: String,
        field: &'static str,
        path: String,
        reason: String,
    },
    #[error("upstream {upstream:?}: TLS setup: {reason}")]
    Tls { upstream: String, reason: String },
    #[error("upstream {upstream:?}: the key in {var} must be printable ASCII without spaces")]
    BadKey { upstream: String, var: String },
    #[error("upstream {upstream:?}: api_key_file {path}: {reason}")]
    KeyFile {
        upstream: String,
        path: String,
        reason: String,
    },
    /// Its egress proxy (the environment's) is one it cannot use.
    #[error("upstream {upstream:?}: {reason}")]
    Proxy { upstream: String, reason: String },
}
