//! The verifier of client certificates: rustls's, which says why it refused a certificate
//! (revoked, unknown issuer, expired) but not whose it was. This one names it in the log, so
//! that a refused client is found by its certificate's subject, as its requests are.

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

/// Refusals logged at info.
static REFUSAL_LOGGED: Throttle = Throttle::every(Duration::from_secs(1));

/// Logs a refused certificate: at info at most once a second (a client retrying in a loop,
/// or someone trying certificates, would fill the log), the others at debug. The count of
/// them all is `hourglass_tls_handshake_failures_total{reason="client_certificate"}`.
fn refused(cert: &CertificateDer<'_>, error: &Error) {
    let unread = || "(unreadable)".to_owned();
    let subject = x509::subject(cert).unwrap_or_else(unread);
    let serial = x509::serial(cert).unwrap_or_else(unread);
    let issuer = x509::issuer(cert).unwrap_or_else(unread);
    if REFUSAL_LOGGED.due() {
        tracing::info!(client_cert = %subject, %serial, %issuer, %error, "client certificate refused");
    } else {
        tracing::debug!(client_cert = %subject, %serial, %issuer, %error, "client certificate refused");
    }
}
