//! Certificates, private keys and revocation lists from PEM, with errors that say what is
//! wrong: what the client listener's TLS and the upstreams' TLS read.

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

/// Plain words for what webpki found wrong with a certificate where rustls has no variant
/// of its own and prints webpki's variant name alone (`Other(OtherError(CaUsedAsEndEntity))`).
/// By that name: rustls-webpki is no direct dependency to downcast to, and its `Display` is
/// the name.
pub fn certificate_problem(e: &rustls::CertificateError) -> Option<&'static str> {
    let rustls::CertificateError::Other(other) = e else {
        return None;
    };
    Some(match other.0.to_string().as_str() {
        "CaUsedAsEndEntity" => {
            "the certificate is a CA certificate (basicConstraints CA:TRUE, which `openssl req \
             -x509` sets unless given `-addext basicConstraints=critical,CA:FALSE`), not one \
             for a server or client: a CA certificate only signs others"
        }
        "EndEntityUsedAsCa" => {
            "a certificate of the chain signs another but is no CA certificate (basicConstraints \
             CA:FALSE or none)"
        }
        "UnsupportedCertVersion" => {
            "the certificate is X.509 version 1 or 2 (made without extensions); only version 3 \
             certificates are accepted"
        }
        "UnsupportedCriticalExtension" => {
            "the certificate has an extension marked critical that the gateway does not know"
        }
        _ => return None,
    })
}

/// The certificates of a PEM file, in order; none is an error.
pub fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
}

/// The CRLs of a PEM file (`X509 CRL` blocks), or the one CRL of a DER file; none is an
/// error, as a file that revoked nothing by mistake would go unnoticed.
pub fn crls(data: &[u8]) -> Result<Vec<CertificateRevocationListDer<'static>>, String> {
    let crls = CertificateRevocationListDer::pem_slice_iter(data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if !crls.is_empty() {
        return Ok(crls);
    }
    // Then DER: one CRL, a SEQUENCE (0x30); rustls parses it and says what is wrong with it.
    if data.first() == Some(&0x30) {
        return Ok(vec![data.to_vec().into()]);
    }
    Err("no CRL found (PEM \"X509 CRL\", or DER)".into())
}

/// A PEM error in words: pki-types writes a missing END line as its bytes.
fn pem_error(e: pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "a PEM block never ends (no \"-----END {}-----\" line): is the file cut short?",
            String::from_utf8_lossy(&end_marker)
        ),
        e => e.to_string(),
    }
}

/// The first private key of a PEM file.
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        // Also what an encrypted key, or a certificate given as the key, reads as.
        pem::Error::NoItemsFound => "no unencrypted private key found (PEM \"PRIVATE KEY\", \
                                     \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\"); an encrypted \
                                     key must be decrypted first"
            .to_owned(),
        e => e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_missing_is_said() {
        assert_eq!(certs(b"nothing").unwrap_err(), "no PEM certificate found");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        assert_eq!(certs(cert.pem().as_bytes()).unwrap().len(), 1);
        assert!(private_key(key.serialize_pem().as_bytes()).is_ok());
        let e = private_key(cert.pem().as_bytes()).unwrap_err();
        assert!(e.starts_with("no unencrypted private key found"), "{e}");
    }

    #[test]
    fn crls_are_read_from_pem_blocks_or_der() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let crl = |number: u64| {
            rcgen::CertificateRevocationListParams {
                this_update: rcgen::date_time_ymd(2020, 1, 1),
                next_update: rcgen::date_time_ymd(2030, 1, 1),
                crl_number: rcgen::SerialNumber::from(number),
                issuing_distribution_point: None,
                revoked_certs: Vec::new(),
                key_identifier_method: rcgen::KeyIdMethod::Sha256,
            }
            .signed_by(&ca, &key)
            .unwrap()
        };
        let (one, two) = (crl(1), crl(2));
        let pem = format!("{}{}{}", one.pem().unwrap(), ca.pem(), two.pem().unwrap());
        assert_eq!(
            crls(pem.as_bytes()).unwrap(),
            vec![one.der().clone(), two.der().clone()]
        );
        assert_eq!(crls(one.der()).unwrap(), vec![one.der().clone()]);
        let none = "no CRL found (PEM \"X509 CRL\", or DER)";
        assert_eq!(crls(ca.pem().as_bytes()).unwrap_err(), none);
        assert_eq!(crls(b"").unwrap_err(), none);
        let pem = one.pem().unwrap();
        let cut = &pem[..pem.len() - 30];
        assert_eq!(
            crls(cut.as_bytes()).unwrap_err(),
            "a PEM block never ends (no \"-----END X509 CRL-----\" line): is the file cut short?"
        );
    }
}

#[cfg(test)]
mod problem_tests {
    use super::*;
    use std::sync::Arc;

    fn other(name: &str) -> rustls::CertificateError {
        rustls::CertificateError::Other(rustls::OtherError(Arc::new(std::io::Error::other(
            name.to_owned(),
        ))))
    }

    #[test]
    fn webpki_s_bare_names_get_plain_words() {
        let words = certificate_problem(&other("CaUsedAsEndEntity")).unwrap();
        assert!(words.contains("is a CA certificate"), "{words}");
        let words = certificate_problem(&other("UnsupportedCertVersion")).unwrap();
        assert!(words.contains("version 3"), "{words}");
        assert_eq!(certificate_problem(&other("SomethingNew")), None);
        assert_eq!(
            certificate_problem(&rustls::CertificateError::UnknownIssuer),
            None
        );
    }
}
