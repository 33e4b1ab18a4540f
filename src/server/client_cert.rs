//! The verifier of client certificates: rustls's, which says why it refused a certificate
//! (revoked, unknown issuer, expired) but not whose it was. This one names it in the log, so
//! that a refused client is found by its certificate's subject, as its requests are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};

use crate::server::x509;

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
            .inspect_err(|e| refused(end_entity, e))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.0.requires_raw_public_keys()
    }
}

/// When a refusal was last logged at info, in seconds since the epoch.
static REFUSAL_LOGGED: AtomicU64 = AtomicU64::new(0);

/// Logs a refused certificate: at info at most once a second (a client retrying in a loop,
/// or someone trying certificates, would fill the log), the others at debug. The count of
/// them all is `hourglass_tls_handshake_failures_total{reason="client_certificate"}`.
fn refused(cert: &CertificateDer<'_>, error: &Error) {
    let unread = || "(unreadable)".to_owned();
    let subject = x509::subject(cert).unwrap_or_else(unread);
    let serial = x509::serial(cert).unwrap_or_else(unread);
    let issuer = x509::issuer(cert).unwrap_or_else(unread);
    if once_per(&REFUSAL_LOGGED, 1) {
        tracing::info!(client_cert = %subject, %serial, %issuer, %error, "client certificate refused");
    } else {
        tracing::debug!(client_cert = %subject, %serial, %issuer, %error, "client certificate refused");
    }
}

/// Whether `secs` have passed since `last` (seconds since the epoch), taking the turn if so:
/// for log lines that a client in a loop could repeat without end.
pub(super) fn once_per(last: &AtomicU64, secs: u64) -> bool {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let then = last.load(Ordering::Relaxed);
    now >= then + secs
        && last
            .compare_exchange(then, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}
