//! What the gateway reads from a certificate's DER itself (RFC 5280 4.1): when it expires,
//! for the listener's own, and whom it names, for a client's. rustls has checked the
//! certificate by then; this only reads it.

use std::fmt::{self, Write};
use std::time::{Duration, SystemTime};

use yasna::models::ObjectIdentifier;
use yasna::tags::{TAG_BMPSTRING, TAG_IA5STRING, TAG_PRINTABLESTRING, TAG_UTF8STRING};
use yasna::{BERReader, Tag};

/// Reads `TBSCertificate` up to the field after `fields` of them (0 the serial, 4 the
/// subject) and hands the reader there to `at`.
/// The fields after it are skipped.
fn tbs<T>(
    der: &[u8],
    fields: usize,
    at: impl FnOnce(BERReader<'_, '_>) -> yasna::ASN1Result<T>,
) -> Option<T> {
    yasna::parse_ber(der, |r| {
        r.read_sequence(|r| {
            let value = r.next().read_sequence(|r| {
                // version [0] EXPLICIT DEFAULT v1, then serialNumber, signature, issuer,
                // validity, subject: `fields` of those five are skipped.
                r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
                for _ in 0..fields {
                    r.next().read_der()?;
                }
                let value = at(r.next())?;
                while r.read_optional(|r| r.read_der())?.is_some() {}
                Ok(value)
            })?;
            r.next().read_der()?;
            r.next().read_der()?;
            Ok(value)
        })
    })
    .ok()
}

/// A certificate's notBefore.
pub fn not_before(der: &[u8]) -> Option<SystemTime> {
    let unix = tbs(der, 3, |r| {
        r.read_sequence(|r| {
            let from = time(r.next())?;
            r.next().read_der()?;
            Ok(from)
        })
    })?;
    unix_time(unix)
}

/// A certificate's notAfter.
pub fn not_after(der: &[u8]) -> Option<SystemTime> {
    let unix = tbs(der, 3, |r| {
        r.read_sequence(|r| {
            r.next().read_der()?;
            time(r.next())
        })
    })?;
    unix_time(unix)
}

/// Whether a certificate is a CA's (basicConstraints cA, RFC 5280 4.2.1.9): `false` for one
/// without that extension, or without extensions at all. `None` if the DER cannot be read.
pub fn is_ca(der: &[u8]) -> Option<bool> {
    const BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];
    let extensions = yasna::parse_ber(der, |r| {
        r.read_sequence(|r| {
            let extensions = r.next().read_sequence(|r| {
                r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
                // serialNumber, signature, issuer, validity, subject, subjectPublicKeyInfo;
                // then the unique IDs [1] and [2], and the extensions [3], each optional.
                for _ in 0..6 {
                    r.next().read_der()?;
                }
                let mut extensions = None;
                while let Some(field) = r.read_optional(|r| r.read_tagged_der())? {
                    if field.tag() == Tag::context(3) {
                        extensions = Some(field.value().to_vec());
                    }
                }
                Ok(extensions)
            })?;
            r.next().read_der()?;
            r.next().read_der()?;
            Ok(extensions)
        })
    })
    .ok()?;
    let Some(extensions) = extensions else {
        return Some(false);
    };
    yasna::parse_der(&extensions, |r| {
        let mut ca = false;
        r.read_sequence_of(|r| {
            let found = r.read_sequence(|r| {
                let oid = r.next().read_oid()?;
                r.read_optional(|r| r.read_bool())?;
                let value = r.next().read_bytes()?;
                if oid.components().as_slice() != BASIC_CONSTRAINTS {
                    return Ok(None);
                }
                yasna::parse_der(&value, |r| {
                    r.read_sequence(|r| {
                        let ca = r.read_optional(|r| r.read_bool())?.unwrap_or(false);
                        r.read_optional(|r| r.read_der())?;
                        Ok(Some(ca))
                    })
                })
            })?;
            if let Some(found) = found {
                ca = found;
            }
            Ok(())
        })?;
        Ok(ca)
    })
    .ok()
}

/// A certificate's subject as RFC 4514 writes a distinguished name (`CN=agent-7,O=Acme`):
/// the last RDN first, values escaped, an attribute without a short name as its OID with
/// the value's DER in hex.
pub fn subject(der: &[u8]) -> Option<String> {
    tbs(der, 4, name)
}

/// A certificate's issuer, as [`subject`] writes a name.
pub fn issuer(der: &[u8]) -> Option<String> {
    tbs(der, 2, name)
}

/// A certificate's serial number in hex, as `openssl x509 -serial` and a CRL's entries show
/// it.
pub fn serial(der: &[u8]) -> Option<String> {
    let bytes = tbs(der, 0, |r| Ok(r.read_bigint_bytes()?.0))?;
    let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
    let hex = bytes[first..].iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02X}");
        out
    });
    Some(if hex.is_empty() { "00".to_owned() } else { hex })
}

/// A certificate's subject as its DER encodes it: what a CRL's issuer is compared with.
pub fn subject_der(der: &[u8]) -> Option<Vec<u8>> {
    tbs(der, 4, |r| r.read_der())
}

/// A certificate's SubjectPublicKeyInfo, as its DER encodes it: what tells a CA from another
/// of the same name, or from itself after its key was replaced.
pub fn key_der(der: &[u8]) -> Option<Vec<u8>> {
    tbs(der, 5, |r| r.read_der())
}

fn name(r: BERReader<'_, '_>) -> yasna::ASN1Result<String> {
    let mut rdns: Vec<String> = Vec::new();
    r.read_sequence_of(|r| {
        let mut rdn = String::new();
        r.read_set_of(|r| {
            r.read_sequence(|r| {
                let oid = r.next().read_oid()?;
                if !rdn.is_empty() {
                    rdn.push('+');
                }
                attribute(&mut rdn, &oid, r.next())
            })
        })?;
        rdns.push(rdn);
        Ok(())
    })?;
    rdns.reverse();
    Ok(rdns.join(","))
}

/// What the gateway reads from a CRL (RFC 5280 5.1) itself: rustls checks certificates
/// against it but says neither who issued it, nor until when, nor which of two CRLs from one
/// issuer is the newer, and it checks the CRL's signature only at a handshake.
pub struct Crl {
    /// The issuer's name as its DER encodes it, as [`subject_der`] reads a CA's.
    pub issuer_der: Vec<u8>,
    /// The issuer's name as [`subject`] writes it.
    pub issuer: String,
    /// When the CRL was issued, in seconds since the epoch.
    pub this_update: i64,
    /// When the issuer promised the next CRL (`None` if the CRL names no date).
    pub next_update: Option<SystemTime>,
    /// Its CRL number (RFC 5280 5.2.3), big-endian without leading zeros.
    pub number: Option<Vec<u8>>,
    /// A version 1 CRL (no version field, so no extensions), which RFC 5280 allows and
    /// rustls does not read.
    pub v1: bool,
    /// The signed `TBSCertList` (its DER), the signature's algorithm and the signature.
    tbs: Vec<u8>,
    algorithm: ObjectIdentifier,
    signature: Vec<u8>,
}

/// id-ce-cRLNumber.
const CRL_NUMBER: [u64; 4] = [2, 5, 29, 20];

/// Reads `TBSCertList` for its issuer, dates and CRL number; the revoked certificates are
/// skipped.
pub fn crl(der: &[u8]) -> Option<Crl> {
    yasna::parse_ber(der, |r| {
        r.read_sequence(|r| {
            let tbs = r.next().read_der()?;
            let algorithm = r.next().read_sequence(|r| {
                let oid = r.next().read_oid()?;
                while r.read_optional(|r| r.read_der())?.is_some() {}
                Ok(oid)
            })?;
            let (signature, _) = r.next().read_bitvec_bytes()?;
            let crl = yasna::parse_der(&tbs, |r| {
                r.read_sequence(|r| {
                    // version INTEGER OPTIONAL (v2), signature, issuer, thisUpdate,
                    // nextUpdate OPTIONAL, revokedCertificates OPTIONAL, crlExtensions [0].
                    let v1 = r.read_optional(|r| r.read_u8())?.is_none();
                    r.next().read_der()?;
                    let issuer_der = r.next().read_der()?;
                    let issuer = yasna::parse_der(&issuer_der, name)?;
                    let this_update = time(r.next())?;
                    let next_update = r.read_optional(time)?;
                    let mut number = None;
                    while let Some(n) = r.read_optional(|r| {
                        if r.lookahead_tag()? == yasna::Tag::context(0) {
                            r.read_tagged(yasna::Tag::context(0), crl_number)
                        } else {
                            r.read_der().map(|_| None)
                        }
                    })? {
                        number = number.or(n);
                    }
                    Ok((issuer_der, issuer, this_update, next_update, number, v1))
                })
            })?;
            let (issuer_der, issuer, this_update, next_update, number, v1) = crl;
            Ok(Crl {
                issuer_der,
                issuer,
                this_update,
                next_update: next_update.and_then(unix_time),
                number,
                v1,
                tbs,
                algorithm,
                signature,
            })
        })
    })
    .ok()
}

/// The CRL number among a CRL's extensions.
fn crl_number(r: BERReader<'_, '_>) -> yasna::ASN1Result<Option<Vec<u8>>> {
    let mut number = None;
    r.read_sequence_of(|r| {
        r.read_sequence(|r| {
            let oid = r.next().read_oid()?;
            r.read_optional(|r| r.read_bool())?;
            let value = r.next().read_bytes()?;
            if oid.components().as_slice() == CRL_NUMBER {
                let (bytes, _) = yasna::parse_der(&value, |r| r.read_bigint_bytes())?;
                let first = bytes.iter().position(|b| *b != 0).unwrap_or(bytes.len());
                number = Some(bytes[first..].to_vec());
            }
            Ok(())
        })
    })?;
    Ok(number)
}

/// Which of an issuer's CRLs one is: what tells it from the issuer's earlier and later ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrlVersion {
    number: Option<Vec<u8>>,
    this_update: i64,
}

impl CrlVersion {
    /// Whether this CRL supersedes `other` from the same issuer: the higher CRL number,
    /// or without numbers, the later thisUpdate.
    pub fn newer_than(&self, other: &CrlVersion) -> bool {
        match (&self.number, &other.number) {
            (Some(a), Some(b)) => (a.len(), a) > (b.len(), b),
            _ => self.this_update > other.this_update,
        }
    }
}

impl fmt::Display for CrlVersion {
    /// As `openssl crl -text` shows it: the number in decimal when it fits 64 bits, else
    /// in hex; without a number, the date it was issued.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.number {
            Some(n) if n.len() <= 8 => {
                let v = n.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b));
                write!(f, "number {v}")
            }
            Some(n) => {
                f.write_str("number 0x")?;
                n.iter().try_for_each(|b| write!(f, "{b:02X}"))
            }
            None => {
                let at = u64::try_from(self.this_update).unwrap_or_default();
                let at = SystemTime::UNIX_EPOCH + Duration::from_secs(at);
                write!(f, "issued {}", humantime::format_rfc3339_seconds(at))
            }
        }
    }
}

impl Crl {
    pub fn version(&self) -> CrlVersion {
        CrlVersion {
            number: self.number.clone(),
            this_update: self.this_update,
        }
    }

    /// Whether this CRL supersedes `other` from the same issuer (see [`CrlVersion`]).
    pub fn newer_than(&self, other: &Crl) -> bool {
        self.version().newer_than(&other.version())
    }

    /// Whether the CA certificate `ca` signed this CRL: `None` for a signature algorithm
    /// this check does not know (RSA-PSS, for one), which rustls still checks at each
    /// handshake.
    pub fn signed_by(&self, ca: &[u8]) -> Option<bool> {
        use ring::signature as sig;
        let (curve, key) = tbs(ca, 5, |r| {
            r.read_sequence(|r| {
                let curve = r.next().read_sequence(|r| {
                    r.next().read_oid()?;
                    let curve = r.read_optional(|r| r.read_oid())?;
                    while r.read_optional(|r| r.read_der())?.is_some() {}
                    Ok(curve)
                })?;
                Ok((curve, r.next().read_bitvec_bytes()?.0))
            })
        })?;
        const P256: &[u64] = &[1, 2, 840, 10045, 3, 1, 7];
        const P384: &[u64] = &[1, 3, 132, 0, 34];
        let curve = curve.as_ref().map(|c| c.components().as_slice());
        let algorithm: &dyn sig::VerificationAlgorithm =
            match (self.algorithm.components().as_slice(), curve) {
                ([1, 2, 840, 113549, 1, 1, 11], _) => &sig::RSA_PKCS1_2048_8192_SHA256,
                ([1, 2, 840, 113549, 1, 1, 12], _) => &sig::RSA_PKCS1_2048_8192_SHA384,
                ([1, 2, 840, 113549, 1, 1, 13], _) => &sig::RSA_PKCS1_2048_8192_SHA512,
                ([1, 2, 840, 10045, 4, 3, 2], Some(P256)) => &sig::ECDSA_P256_SHA256_ASN1,
                ([1, 2, 840, 10045, 4, 3, 2], Some(P384)) => &sig::ECDSA_P384_SHA256_ASN1,
                ([1, 2, 840, 10045, 4, 3, 3], Some(P256)) => &sig::ECDSA_P256_SHA384_ASN1,
                ([1, 2, 840, 10045, 4, 3, 3], Some(P384)) => &sig::ECDSA_P384_SHA384_ASN1,
                ([1, 3, 101, 112], _) => &sig::ED25519,
                _ => return None,
            };
        Some(
            sig::UnparsedPublicKey::new(algorithm, &key)
                .verify(&self.tbs, &self.signature)
                .is_ok(),
        )
    }
}

/// RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050.
fn time(r: BERReader<'_, '_>) -> yasna::ASN1Result<i64> {
    match r.lookahead_tag()? {
        yasna::tags::TAG_UTCTIME => Ok(r.read_utctime()?.datetime().unix_timestamp()),
        _ => Ok(r.read_generalized_time()?.datetime().unix_timestamp()),
    }
}

fn unix_time(secs: i64) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(u64::try_from(secs).ok()?))
}

/// The short names RFC 4514 3 lists, and the ones RFC 4519 adds that certificates use.
fn short_name(oid: &[u64]) -> Option<&'static str> {
    Some(match oid {
        [2, 5, 4, 3] => "CN",
        [2, 5, 4, 7] => "L",
        [2, 5, 4, 8] => "ST",
        [2, 5, 4, 10] => "O",
        [2, 5, 4, 11] => "OU",
        [2, 5, 4, 6] => "C",
        [2, 5, 4, 9] => "STREET",
        [2, 5, 4, 5] => "serialNumber",
        [0, 9, 2342, 19_200_300, 100, 1, 25] => "DC",
        [0, 9, 2342, 19_200_300, 100, 1, 1] => "UID",
        _ => return None,
    })
}

fn attribute(
    out: &mut String,
    oid: &ObjectIdentifier,
    r: BERReader<'_, '_>,
) -> yasna::ASN1Result<()> {
    let name = short_name(oid.components());
    let text = match (name, r.lookahead_tag()?) {
        (Some(_), TAG_UTF8STRING) => Some(r.read_utf8string()?),
        (Some(_), TAG_PRINTABLESTRING) => Some(r.read_printable_string()?),
        (Some(_), TAG_IA5STRING) => Some(r.read_ia5_string()?),
        (Some(_), TAG_BMPSTRING) => Some(r.read_bmp_string()?),
        _ => {
            // RFC 4514 2.4: a value of another type is `#` and its DER in hex.
            let value = r.read_der()?;
            write_name(out, name, oid);
            out.push_str("=#");
            for b in value {
                let _ = write!(out, "{b:02x}");
            }
            return Ok(());
        }
    };
    write_name(out, name, oid);
    out.push('=');
    escape(out, text.as_deref().unwrap_or_default());
    Ok(())
}

fn write_name(out: &mut String, name: Option<&str>, oid: &ObjectIdentifier) {
    match name {
        Some(n) => out.push_str(n),
        None => {
            let parts: Vec<String> = oid.components().iter().map(u64::to_string).collect();
            out.push_str(&parts.join("."));
        }
    }
}

/// RFC 4514 2.4: the characters that would end or split a value, a leading `#` or space
/// and a trailing space are escaped with `\`; NUL as `\00`.
fn escape(out: &mut String, value: &str) {
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        match c {
            '"' | '+' | ',' | ';' | '<' | '>' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '#' if i == 0 => out.push_str("\\#"),
            ' ' if i == 0 || i == last => out.push_str("\\ "),
            // Control characters as RFC 4514's hex pairs: a subject is whatever the client's
            // certificate says, and a newline or an escape sequence in it would forge log
            // lines in the text format; so would a line separator, and a bidi or zero-width
            // character would disguise the name (the access log's rule, audit AG 1).
            c if crate::http::headers::invisible(c) => {
                let mut utf8 = [0u8; 4];
                for b in c.encode_utf8(&mut utf8).bytes() {
                    let _ = write!(out, "\\{b:02X}");
                }
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_until(year: i32, month: u8, day: u8) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, month, day);
        params.self_signed(&key).unwrap().der().to_vec()
    }

    fn unix(t: SystemTime) -> u64 {
        t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs()
    }

    #[test]
    fn not_after_is_read_in_both_time_forms() {
        // RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050.
        assert_eq!(
            not_after(&cert_until(2027, 3, 4)).map(unix),
            Some(1_804_118_400)
        );
        assert_eq!(
            not_after(&cert_until(2051, 1, 1)).map(unix),
            Some(2_556_144_000)
        );
        assert_eq!(not_after(b"not a certificate"), None);
    }

    #[test]
    fn a_crl_is_read_for_its_issuer_and_next_update() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Clients CA");
        let ca = params.self_signed(&key).unwrap();
        let crl_until = |year, month, day| {
            rcgen::CertificateRevocationListParams {
                this_update: rcgen::date_time_ymd(2020, 1, 1),
                next_update: rcgen::date_time_ymd(year, month, day),
                crl_number: rcgen::SerialNumber::from(7),
                issuing_distribution_point: None,
                revoked_certs: vec![rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(2),
                    revocation_time: rcgen::date_time_ymd(2020, 1, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                }],
                key_identifier_method: rcgen::KeyIdMethod::Sha256,
            }
            .signed_by(&ca, &key)
            .unwrap()
            .der()
            .to_vec()
        };
        let crl_2027 = crl(&crl_until(2027, 3, 4)).unwrap();
        assert_eq!(crl_2027.number.as_deref(), Some(&[7u8][..]));
        assert_eq!(crl_2027.this_update, 1_577_836_800);
        assert_eq!(crl_2027.signed_by(ca.der()), Some(true));
        assert_eq!(crl_2027.issuer, "CN=Clients CA,O=Acme\\, Inc.");
        assert_eq!(Some(crl_2027.issuer_der), subject_der(ca.der()));
        assert_eq!(crl_2027.next_update.map(unix), Some(1_804_118_400));
        assert_eq!(
            crl(&crl_until(2051, 1, 1))
                .and_then(|c| c.next_update)
                .map(unix),
            Some(2_556_144_000)
        );
        assert!(crl(b"not a CRL").is_none());
        assert!(crl(ca.der()).is_none());
    }

    /// The signature is checked for each algorithm rustls's verifier takes from a CA; the
    /// newer of two CRLs is the one with the higher number, however long.
    #[test]
    fn a_crl_is_checked_against_its_cas_key_and_ordered_by_number() {
        let crl_of = |alg: &'static rcgen::SignatureAlgorithm, number: u64| {
            let key = rcgen::KeyPair::generate_for(alg).unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let ca = params.self_signed(&key).unwrap();
            let der = rcgen::CertificateRevocationListParams {
                this_update: rcgen::date_time_ymd(2020, 1, 1),
                next_update: rcgen::date_time_ymd(2090, 1, 1),
                crl_number: rcgen::SerialNumber::from(number),
                issuing_distribution_point: None,
                revoked_certs: Vec::new(),
                key_identifier_method: rcgen::KeyIdMethod::Sha256,
            }
            .signed_by(&ca, &key)
            .unwrap()
            .der()
            .to_vec();
            (ca.der().to_vec(), crl(&der).unwrap())
        };
        for alg in [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            &rcgen::PKCS_ED25519,
        ] {
            let (ca, crl) = crl_of(alg, 1);
            let (other, _) = crl_of(alg, 1);
            assert_eq!(crl.signed_by(&ca), Some(true), "{alg:?}");
            assert_eq!(crl.signed_by(&other), Some(false), "{alg:?}");
        }
        let number = |n| crl_of(&rcgen::PKCS_ECDSA_P256_SHA256, n).1;
        assert!(number(256).newer_than(&number(255)));
        assert!(!number(255).newer_than(&number(256)));
        assert!(number(1 << 40).newer_than(&number(2)));
        assert!(!number(2).newer_than(&number(2)));
        // Named in warnings as openssl shows them.
        assert_eq!(
            number(1 << 40).version().to_string(),
            "number 1099511627776"
        );
        let big = CrlVersion {
            number: Some(vec![1, 0, 0, 0, 0, 0, 0, 0, 0xAB]),
            this_update: 0,
        };
        assert_eq!(big.to_string(), "number 0x0100000000000000AB");
        let unnumbered = CrlVersion {
            number: None,
            this_update: 1_577_836_800,
        };
        assert_eq!(unnumbered.to_string(), "issued 2020-01-01T00:00:00Z");
    }

    #[test]
    fn the_subject_is_written_as_rfc_4514_writes_it() {
        use rcgen::{DistinguishedName, DnType, DnValue};
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CountryName,
            DnValue::PrintableString("DE".try_into().unwrap()),
        );
        dn.push(DnType::OrganizationName, "Acme, Inc.");
        // A `#` is escaped only where it would start the value.
        dn.push(DnType::CommonName, " #agent+7 ");
        dn.push(
            DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 99999, 1]),
            DnValue::Ia5String("x".try_into().unwrap()),
        );
        params.distinguished_name = dn;
        let der = params.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(
            subject(&der).as_deref(),
            Some("1.3.6.1.4.1.99999.1=#160178,CN=\\ #agent\\+7\\ ,O=Acme\\, Inc.,C=DE")
        );
        assert_eq!(subject(b"not a certificate"), None);
        // Self-signed: issued by its subject. Its serial as openssl prints it.
        assert_eq!(issuer(&der), subject(&der));
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.serial_number = Some(rcgen::SerialNumber::from(vec![0x00, 0x0A, 0xBC, 0x01]));
        let der = params.self_signed(&key).unwrap().der().to_vec();
        assert_eq!(serial(&der).as_deref(), Some("0ABC01"));
        assert_eq!(serial(b"not a certificate"), None);
        // A subject is the client's to write: nothing in it may start a log line.
        let mut forged = String::new();
        escape(&mut forged, "evil\n2026 INFO forged\x1b[31m\u{85}\0");
        assert_eq!(forged, "evil\\0A2026 INFO forged\\1B[31m\\C2\\85\\00");
        let mut hidden = String::new();
        escape(&mut hidden, "ok\u{2028}2026 INFO forged \u{202e}gpj");
        assert_eq!(hidden, "ok\\E2\\80\\A82026 INFO forged \\E2\\80\\AEgpj");
        let mut hash_first = String::new();
        escape(&mut hash_first, "#1");
        assert_eq!(hash_first, "\\#1");
    }
}
