//! TLS to an upstream: the rustls client config built from the upstream's files (the public
//! roots and/or its `ca_file`, the `client_cert` it presents), what a reload compares to
//! know whether the files changed, and what a failed connection's errors say about TLS.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::AlertDescription;

use crate::config::UpstreamConfig;
use crate::upstream::error::UpstreamBuildError;

/// One TLS file of an upstream, as read: the key that names it, where it is, what it held.
struct TlsFile<'a> {
    field: &'static str,
    path: &'a Path,
    bytes: Vec<u8>,
}

impl TlsFile<'_> {
    fn error(&self, upstream: &str, reason: String) -> UpstreamBuildError {
        UpstreamBuildError::TlsFile {
            upstream: upstream.to_owned(),
            field: self.field,
            path: self.path.display().to_string(),
            reason,
        }
    }
}

/// An upstream's `ca_file`, `client_cert` and `client_cert_key`, those it has, read now.
/// Files beside an http:// url are ignored (`check` says so), not read.
fn read(config: &UpstreamConfig) -> Result<[Option<TlsFile<'_>>; 3], UpstreamBuildError> {
    let https = config.url.scheme() == Some(&http::uri::Scheme::HTTPS);
    let cert = config.client_cert.as_ref();
    let named = [
        ("ca_file", config.ca_file.as_deref()),
        ("client_cert", cert.map(|c| c.cert.as_path())),
        ("client_cert_key", cert.map(|c| c.key.as_path())),
    ];
    let mut files = [None, None, None];
    for (slot, (field, path)) in files.iter_mut().zip(named) {
        let Some(path) = path.filter(|_| https) else {
            continue;
        };
        let bytes = crate::config::file::read(path).map_err(|e| UpstreamBuildError::TlsFile {
            upstream: config.name.clone(),
            field,
            path: path.display().to_string(),
            reason: format!("failed to read file: {e}"),
        })?;
        *slot = Some(TlsFile { field, path, bytes });
    }
    Ok(files)
}

/// What a reload compares: a digest of each TLS file's contents. A CA added to a `ca_file`
/// or taken out of it, or a client certificate renewed in place, needs a new config.
#[derive(PartialEq, Eq)]
pub(super) struct TlsFiles([Option<[u8; 32]>; 3]);

impl TlsFiles {
    fn of(files: &[Option<TlsFile<'_>>; 3]) -> Self {
        Self(files.each_ref().map(|f| {
            f.as_ref().map(|f| {
                let mut d = [0u8; 32];
                d.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, &f.bytes).as_ref());
                d
            })
        }))
    }

    /// The upstream's files as they are now.
    pub(super) fn now(config: &UpstreamConfig) -> Result<Self, UpstreamBuildError> {
        Ok(Self::of(&read(config)?))
    }
}

/// The TLS client config, and the files it was built from.
pub(super) fn tls_config(
    config: &UpstreamConfig,
) -> Result<(rustls::ClientConfig, TlsFiles), UpstreamBuildError> {
    let files = read(config)?;
    let [ca, cert, key] = &files;
    let upstream = &config.name;
    // Only a `ca_file` can fail to give roots.
    let roots = roots(config.trust_public_roots, ca.as_ref()).map_err(|e| match ca {
        Some(ca) => ca.error(upstream, e),
        None => tls_err(upstream, e),
    })?;
    let identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> = match (cert, key)
    {
        (Some(cert), Some(key)) => Some((
            crate::pem::certs(&cert.bytes).map_err(|e| cert.error(upstream, e))?,
            crate::pem::private_key(&key.bytes).map_err(|e| key.error(upstream, e))?,
        )),
        _ => None,
    };
    // An explicit provider: the process-wide default is ambiguous when more than one crypto
    // backend ends up in the dependency graph.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(upstream, e.to_string()))?
        .with_root_certificates(roots);
    let tls = match (identity, key) {
        // Also where a key that is not the certificate's is caught.
        (Some((chain, private)), Some(key)) => builder
            .with_client_auth_cert(chain, private)
            .map_err(|e| match (e, cert) {
                (
                    rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch),
                    Some(c),
                ) => key.error(
                    upstream,
                    format!("the key is not the certificate's in {}", c.path.display()),
                ),
                (e, _) => key.error(upstream, e.to_string()),
            })?,
        _ => builder.with_no_client_auth(),
    };
    Ok((tls, TlsFiles::of(&files)))
}

fn tls_err(upstream: &str, reason: String) -> UpstreamBuildError {
    UpstreamBuildError::Tls {
        upstream: upstream.to_owned(),
        reason,
    }
}

/// The roots an upstream's certificate must chain to: the bundled public ones (unless
/// `trust_public_roots = false`) and those of its `ca_file`.
fn roots(public: bool, ca: Option<&TlsFile<'_>>) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    if public {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    if let Some(ca) = ca {
        for cert in crate::pem::certs(&ca.bytes)? {
            roots.add(cert).map_err(|e| e.to_string())?;
        }
    }
    Ok(roots)
}

/// The rustls error in a failed connection's chain of errors, wherever the layers put it:
/// as a source; inside an `io::Error`, whose `source` skips the error it wraps (reached by
/// `get_ref` only: hyper-rustls wraps tokio-rustls's io::Error in another); inside h2's
/// error, which gives its IO error by `get_io` only; or, for an alert read with the response
/// (under TLS 1.3, after the handshake), as nothing but rustls's words for it, "received
/// fatal alert: X", in an `io::Error`.
fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<Cow<'a, rustls::Error>> {
    if let Some(tls) = e.downcast_ref::<rustls::Error>() {
        return Some(Cow::Borrowed(tls));
    }
    if let Some(io) = e.downcast_ref::<std::io::Error>() {
        let inner = io.get_ref()?;
        if let Some(name) = inner.to_string().strip_prefix("received fatal alert: ") {
            return (0..=u8::MAX)
                .map(AlertDescription::from)
                .find(|a| format!("{a:?}") == name)
                .map(|a| Cow::Owned(rustls::Error::AlertReceived(a)));
        }
        return tls_error(inner);
    }
    if let Some(io) = e.downcast_ref::<h2::Error>().and_then(h2::Error::get_io) {
        return tls_error(io);
    }
    e.source().and_then(tls_error)
}

/// Whether TLS is what failed: the handshake (a certificate, an alert, no version in
/// common, a server that does not speak TLS), or an alert the server sent for it later.
pub fn tls_failed(e: &(dyn std::error::Error + 'static)) -> bool {
    tls_error(e).is_some()
}

/// Whether the TLS handshake failed because the server has none of the protocols offered
/// by ALPN (RFC 7301 §3.2's `no_application_protocol` alert).
pub(super) fn refused_h2(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        tls_error(e).as_deref(),
        Some(rustls::Error::AlertReceived(
            AlertDescription::NoApplicationProtocol
        ))
    )
}

/// The upstream's certificate failed this gateway's checks (expired, another name, an
/// issuer not trusted): the same every time until the certificate or `ca_file` changes.
pub fn certificate_error(
    e: &(dyn std::error::Error + 'static),
) -> Option<rustls::CertificateError> {
    match tls_error(e)?.as_ref() {
        rustls::Error::InvalidCertificate(c) => Some(c.clone()),
        _ => None,
    }
}

/// The upstream ended the TLS handshake with an alert that every attempt will get again
/// until a config changes: `handshake_failure` (how OpenSSL servers refuse a missing client
/// certificate under TLS 1.2, or offer no version and suite in common),
/// `no_application_protocol` (ALPN), `protocol_version`, `insufficient_security`.
pub fn handshake_refused(e: &(dyn std::error::Error + 'static)) -> Option<AlertDescription> {
    use AlertDescription as A;
    match tls_error(e)?.as_ref() {
        rustls::Error::AlertReceived(
            a @ (A::HandshakeFailure
            | A::NoApplicationProtocol
            | A::ProtocolVersion
            | A::InsufficientSecurity),
        ) => Some(*a),
        _ => None,
    }
}

/// The upstream and the gateway have no TLS version in common: it answered the gateway's
/// TLS 1.2 and 1.3 with a `protocol_version` alert, or chose an older one.
pub fn no_common_tls_version(e: &(dyn std::error::Error + 'static)) -> bool {
    use rustls::PeerIncompatible as P;
    matches!(
        tls_error(e).as_deref(),
        Some(
            rustls::Error::AlertReceived(AlertDescription::ProtocolVersion)
                | rustls::Error::PeerIncompatible(
                    P::ServerDoesNotSupportTls12Or13 | P::ServerTlsVersionIsDisabledByOurConfig
                )
        )
    )
}

/// The upstream refused this gateway's client certificate, or the lack of one, with a TLS
/// alert. Under TLS 1.3 the alert comes after the client's handshake is over, so it reaches
/// a request already written; the server has read none of it.
pub fn client_certificate_refused(
    e: &(dyn std::error::Error + 'static),
) -> Option<AlertDescription> {
    use AlertDescription as A;
    match tls_error(e)?.as_ref() {
        rustls::Error::AlertReceived(
            a @ (A::CertificateRequired
            | A::BadCertificate
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnknownCA),
        ) => Some(*a),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// An upstream with a `ca_file` holding one CA, trusting the public roots or not.
    fn roots_of(public: bool) -> usize {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-roots-")
            .tempdir()
            .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let toml = format!(
            "[upstreams.u]\nurl = \"https://models.internal\"\nauth = \"none\"\n\
             ca_file = {:?}\ntrust_public_roots = {public}\n\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
            ca.display().to_string()
        );
        let config = Config::from_toml(&toml, "test").expect("config");
        let upstream = &config.upstreams[0];
        let [ca, _, _] = read(upstream).unwrap();
        roots(upstream.trust_public_roots, ca.as_ref())
            .unwrap()
            .len()
    }

    /// A `client_cert_key` that is not the `client_cert`'s is said so, naming both files,
    /// not as rustls's "keys may not be consistent: KeyMismatch" (audit Z3).
    #[test]
    fn a_client_key_that_is_not_the_certificate_s_names_both_files() {
        let dir = tempfile::Builder::new()
            .prefix("hourglass-client-")
            .tempdir()
            .unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (cert_path, key_path) = (dir.path().join("c.pem"), dir.path().join("other.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        std::fs::write(&key_path, other.serialize_pem()).unwrap();
        let toml = format!(
            "[upstreams.u]\nurl = \"https://models.internal\"\nauth = \"none\"\n\
             client_cert = {:?}\nclient_cert_key = {:?}\n\n\
             [[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n",
            cert_path.display().to_string(),
            key_path.display().to_string()
        );
        let config = Config::from_toml(&toml, "test").expect("config");
        let Err(e) = tls_config(&config.upstreams[0]) else {
            panic!("a key that is not the certificate's was taken");
        };
        assert_eq!(
            e.to_string(),
            format!(
                "upstream \"u\": client_cert_key {}: the key is not the certificate's in {}",
                key_path.display(),
                cert_path.display()
            )
        );
    }

    #[test]
    fn a_ca_file_alone_is_trusted_when_public_roots_are_not() {
        assert_eq!(roots_of(false), 1);
        assert_eq!(roots_of(true), webpki_roots::TLS_SERVER_ROOTS.len() + 1);
    }

    #[test]
    fn an_alert_is_found_wherever_the_layers_put_it() {
        let alert = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        let io = |e: Box<dyn std::error::Error + Send + Sync>| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, e)
        };
        // As the error itself, inside an io::Error, inside one inside another, and as words.
        let direct = io(Box::new(alert.clone()));
        let nested = io(Box::new(io(Box::new(alert.clone()))));
        let words = io(alert.to_string().into());
        for e in [&direct, &nested, &words] {
            assert_eq!(
                client_certificate_refused(e),
                Some(AlertDescription::CertificateRequired),
                "{e:?}"
            );
        }
        let h2 = io(Box::new(rustls::Error::AlertReceived(
            AlertDescription::NoApplicationProtocol,
        )));
        assert!(refused_h2(&h2));
        assert_eq!(client_certificate_refused(&h2), None);
        assert_eq!(certificate_error(&h2), None);
    }
}
