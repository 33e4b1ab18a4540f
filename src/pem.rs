//! Certificates and private keys from PEM, with errors that say what is wrong: what the
//! client listener's TLS and the upstreams' TLS both read.

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The certificates of a PEM file, in order; none is an error.
pub fn certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(certs)
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
}
