//! The verifier of client certificates: rustls's, which says why it refused a certificate
//! (revoked, unknown issuer, expired) but not whose it was. This one keeps what it refused,
//! so that the listener's log line for the failed handshake names the certificate (as the
//! request lines name those let in) beside the peer's address, which only the listener knows.

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

use crate::server::x509;
use crate::telemetry::throttle::Throttle;

/// rustls's verifier, naming the certificates it refuses.
#[derive(Debug)]
pub(super) struct Naming(pub(super) Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for Naming {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.0
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|e| keep(end_entity, e))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0
            .verify_tls12_signature(message, cert, dss)
            .inspect_err(|e| keep(cert, e))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0
            .verify_tls13_signature(message, cert, dss)
            .inspect_err(|e| keep(cert, e))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.0.requires_raw_public_keys()
    }
}

/// The certificate of the handshake this thread refused last, and why.
struct Refused {
    subject: String,
    serial: String,
    issuer: String,
    error: Error,
}

thread_local! {
    /// rustls calls the verifier from inside the poll that then fails the handshake (tokio-
    /// rustls returns `process_new_packets`'s error from that same poll), so the listener
    /// reads it on this thread before any other handshake can run here. The error kept with
    /// it is matched all the same, so a refusal can never be told of another's handshake.
    static REFUSED: RefCell<Option<Refused>> = const { RefCell::new(None) };
}

/// Refusals only: a certificate let in costs nothing here.
fn keep(cert: &CertificateDer<'_>, error: &Error) {
    let unread = || "(unreadable)".to_owned();
    let refused = Refused {
        subject: x509::subject(cert).unwrap_or_else(unread),
        serial: x509::serial(cert).unwrap_or_else(unread),
        issuer: x509::issuer(cert).unwrap_or_else(unread),
        error: error.clone(),
    };
    REFUSED.with(|r| *r.borrow_mut() = Some(refused));
}

/// What the verifier kept of the refusal that failed this handshake with `error`, if it ran.
fn kept_for(error: &io::Error) -> Option<Refused> {
    REFUSED.with(|r| r.borrow_mut().take()).filter(|kept| {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Error>())
            .is_some_and(|e| same(e, &kept.error))
    })
}

/// `==`, but rustls's `OtherError`, which never equals anything (webpki's reasons without a
/// variant of their own travel in it: a CA certificate presented as a client's, a v1
/// certificate, an unknown critical extension), is the same where it holds the same error.
fn same(a: &Error, b: &Error) -> bool {
    use rustls::{CertRevocationListError as Crl, CertificateError as Cert, OtherError};
    let one = |x: &OtherError, y: &OtherError| Arc::ptr_eq(&x.0, &y.0);
    match (a, b) {
        (Error::Other(x), Error::Other(y))
        | (Error::InvalidCertificate(Cert::Other(x)), Error::InvalidCertificate(Cert::Other(y)))
        | (
            Error::InvalidCertRevocationList(Crl::Other(x)),
            Error::InvalidCertRevocationList(Crl::Other(y)),
        ) => one(x, y),
        _ => a == b,
    }
}

/// Refusals logged at info.
static REFUSAL_LOGGED: Throttle = Throttle::every(Duration::from_secs(1));

/// Logs a handshake refused for its client certificate (`error`, as the handshake failed),
/// naming the peer and the certificate, when there was one: at info at most once a second
/// (a client retrying in a loop, or someone trying certificates, would fill the log), the
/// others at debug. The count of them all is
/// `hourglass_tls_handshake_failures_total{reason="client_certificate"}`.
pub(super) fn refused(peer: SocketAddr, error: &io::Error) {
    let kept = kept_for(error);
    let client_cert = kept.as_ref().map(|k| k.subject.as_str());
    let serial = kept.as_ref().map(|k| k.serial.as_str());
    let issuer = kept.as_ref().map(|k| k.issuer.as_str());
    // webpki's bare variant names (`Other(OtherError(UnsupportedCertVersion))`), in words.
    let problem = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<Error>())
        .and_then(|e| match e {
            Error::InvalidCertificate(c) => crate::pem::certificate_problem(c),
            _ => None,
        });
    if REFUSAL_LOGGED.due() {
        tracing::info!(%peer, client_cert, serial, issuer, %error, problem, "client certificate refused");
    } else {
        tracing::debug!(%peer, client_cert, serial, issuer, %error, problem, "client certificate refused");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::CertificateError;

    fn failed(e: impl Into<Error>) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, e.into())
    }

    /// A refusal is told only of the handshake it failed, and once.
    #[test]
    fn a_kept_refusal_names_only_its_own_handshake() {
        let cert = rcgen::generate_simple_self_signed(vec!["client".into()]).unwrap();
        let der = CertificateDer::from(cert.cert.der().to_vec());
        keep(&der, &CertificateError::Revoked.into());
        let kept = kept_for(&failed(CertificateError::Revoked)).unwrap();
        assert_eq!(kept.subject, "CN=rcgen self signed cert");
        assert_eq!(
            kept_for(&failed(CertificateError::Revoked)).map(|k| k.subject),
            None
        );
        // Another handshake's failure on this thread does not take it.
        keep(&der, &CertificateError::Revoked.into());
        assert_eq!(
            kept_for(&failed(Error::NoCertificatesPresented)).map(|k| k.subject),
            None
        );
        assert_eq!(
            kept_for(&io::ErrorKind::ConnectionReset.into()).map(|k| k.subject),
            None
        );
        // An OtherError is told by the error it holds, as it never compares equal.
        let other = |e: &str| {
            Error::from(CertificateError::Other(rustls::OtherError(Arc::new(
                io::Error::other(e.to_owned()),
            ))))
        };
        let ca_as_client = other("CaUsedAsEndEntity");
        keep(&der, &ca_as_client);
        assert_eq!(
            kept_for(&failed(other("CaUsedAsEndEntity"))).map(|k| k.subject),
            None
        );
        keep(&der, &ca_as_client);
        assert!(kept_for(&failed(ca_as_client)).is_some());
    }
}
