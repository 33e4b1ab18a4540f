//! Certificates, private keys and revocation lists from PEM, with errors that say what is
//! wrong: what the client listener's TLS and the upstreams' TLS read.

use std::borrow::Cow;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};

/// What webpki's `CaUsedAsEndEntity` means, also said of the listener's own certificate.
pub const CA_USED_AS_END_ENTITY: &str =
    "the certificate is a CA certificate (basicConstraints CA:TRUE, which `openssl req -x509` \
     sets unless given `-addext basicConstraints=critical,CA:FALSE`), not one for a server or \
     client: a CA certificate only signs others";

/// Plain words for what webpki found wrong with a certificate where rustls has no variant
/// of its own and prints webpki's variant name alone (`Other(OtherError(CaUsedAsEndEntity))`).
/// By that name: rustls-webpki is no direct dependency to downcast to, and its `Display` is
/// the name.
pub fn certificate_problem(e: &rustls::CertificateError) -> Option<&'static str> {
    let rustls::CertificateError::Other(other) = e else {
        return None;
    };
    Some(match other.0.to_string().as_str() {
        "CaUsedAsEndEntity" => CA_USED_AS_END_ENTITY,
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

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// The PEM without the UTF-8 byte order marks that begin a line. Windows tools write one at
/// the start of a file, so a chain concatenated from such files has one before an inner
/// `-----BEGIN` line; pki-types takes that line for text between blocks and skips the
/// block without a word (openssl reads it), losing an intermediate or a CA.
fn without_boms(pem: &[u8]) -> Cow<'_, [u8]> {
    if !pem.windows(BOM.len()).any(|w| w == BOM) {
        return Cow::Borrowed(pem);
    }
    let mut out = Vec::with_capacity(pem.len());
    let mut rest = pem;
    let mut line_start = true;
    while let Some((&byte, after)) = rest.split_first() {
        if line_start && rest.starts_with(BOM) {
            rest = &rest[BOM.len()..];
            continue;
        }
        line_start = byte == b'\n' || byte == b'\r';
        out.push(byte);
        rest = after;
    }
    Cow::Owned(out)
}

/// The certificates of a PEM file, in order; none is an error.
pub fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(&without_boms(pem))
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
    let crls = CertificateRevocationListDer::pem_slice_iter(&without_boms(data))
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
    let pem = without_boms(pem);
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        // PKCS#8 encrypted (`ENCRYPTED PRIVATE KEY`) reads as no key; the legacy form
        // (`Proc-Type: 4,ENCRYPTED` headers in an `RSA PRIVATE KEY` block, what `openssl
        // genrsa -aes256` writes) as a base64 error at the headers.
        let has = |what: &[u8]| pem.windows(what.len()).any(|w| w == what);
        if has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || has(b"Proc-Type: 4,ENCRYPTED") {
            return "the key is encrypted (with a passphrase), which the gateway cannot ask \
                    for: decrypt it first (`openssl pkey -in KEY -out PLAIN_KEY`) and give \
                    the decrypted file"
                .to_owned();
        }
        match e {
            // Also what a certificate given as the key reads as.
            pem::Error::NoItemsFound => "no unencrypted private key found (PEM \"PRIVATE \
                                         KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\"); \
                                         an encrypted key must be decrypted first"
                .to_owned(),
            e => pem_error(e),
        }
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

    /// Audit DE 2: a UTF-8 BOM before a BEGIN line (a chain concatenated from files Windows
    /// tools saved) is taken out, not the block it precedes.
    #[test]
    fn a_byte_order_mark_before_a_block_does_not_lose_it() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = |name: &str| {
            rcgen::CertificateParams::new(vec![name.to_string()])
                .unwrap()
                .self_signed(&key)
                .unwrap()
        };
        let (leaf, int) = (cert("leaf"), cert("int"));
        let bom = "\u{feff}";
        let chain = format!("{}{bom}{}", leaf.pem(), int.pem());
        assert_eq!(
            certs(chain.as_bytes()).unwrap(),
            vec![leaf.der().clone(), int.der().clone()]
        );
        let crlf = format!("{bom}{}", chain.replace('\n', "\r\n"));
        assert_eq!(certs(crlf.as_bytes()).unwrap().len(), 2);
        assert_eq!(
            certs(format!("{bom}{}", leaf.pem()).as_bytes()).unwrap(),
            vec![leaf.der().clone()]
        );
        let with_bom = format!("{bom}{}", key.serialize_pem());
        assert_eq!(
            private_key(with_bom.as_bytes()).unwrap().secret_der(),
            key.serialize_der()
        );
    }

    /// Audit DE 3: an encrypted key, in either PEM form, is said to be one.
    #[test]
    fn an_encrypted_key_is_said_to_be_one() {
        let legacy = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: \
                      AES-256-CBC,0123456789ABCDEF0123456789ABCDEF\n\nMIIBOgIBAAJBAKj34GkxFhD9\n\
                      -----END RSA PRIVATE KEY-----\n";
        let pkcs8 = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD9\n\
                     -----END ENCRYPTED PRIVATE KEY-----\n";
        for pem in [legacy, pkcs8] {
            let e = private_key(pem.as_bytes()).unwrap_err();
            assert!(e.starts_with("the key is encrypted"), "{e}");
            assert!(e.contains("openssl pkey -in KEY -out PLAIN_KEY"), "{e}");
        }
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
