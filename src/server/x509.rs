//! What the gateway reads from a certificate's DER itself (RFC 5280 4.1): when it expires,
//! for the listener's own, and whom it names, for a client's. rustls has checked the
//! certificate by then; this only reads it.

use std::fmt::Write;
use std::time::{Duration, SystemTime};

use yasna::models::ObjectIdentifier;
use yasna::tags::{TAG_BMPSTRING, TAG_IA5STRING, TAG_PRINTABLESTRING, TAG_UTF8STRING};
use yasna::{BERReader, Tag};

/// Reads `TBSCertificate` up to its subject and hands the reader at the subject to `at`.
/// The fields after it (the key, the unique ids, the extensions) are skipped.
fn tbs<T>(
    der: &[u8],
    fields: usize,
    at: impl FnOnce(BERReader<'_, '_>) -> yasna::ASN1Result<T>,
) -> Option<T> {
    yasna::parse_ber(der, |r| {
        r.read_sequence(|r| {
            let value = r.next().read_sequence(|r| {
                // version [0] EXPLICIT DEFAULT v1, then serialNumber, signature, issuer,
                // validity, subject: `fields` of those four after the serial are skipped.
                r.read_optional(|r| r.read_tagged(Tag::context(0), |r| r.read_der()))?;
                r.next().read_der()?;
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

/// A certificate's notAfter.
pub fn not_after(der: &[u8]) -> Option<SystemTime> {
    let unix = tbs(der, 2, |r| {
        r.read_sequence(|r| {
            r.next().read_der()?;
            time(r.next())
        })
    })?;
    unix_time(unix)
}

/// A certificate's subject as RFC 4514 writes a distinguished name (`CN=agent-7,O=Acme`):
/// the last RDN first, values escaped, an attribute without a short name as its OID with
/// the value's DER in hex.
pub fn subject(der: &[u8]) -> Option<String> {
    tbs(der, 3, name)
}

/// A certificate's subject as its DER encodes it: what a CRL's issuer is compared with.
pub fn subject_der(der: &[u8]) -> Option<Vec<u8>> {
    tbs(der, 3, |r| r.read_der())
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
/// against it but says neither who issued it nor until when.
pub struct Crl {
    /// The issuer's name as its DER encodes it, as [`subject_der`] reads a CA's.
    pub issuer_der: Vec<u8>,
    /// The issuer's name as [`subject`] writes it.
    pub issuer: String,
    /// When the issuer promised the next CRL (`None` if the CRL names no date).
    pub next_update: Option<SystemTime>,
}

/// Reads `TBSCertList` up to its nextUpdate; the revoked certificates and the extensions
/// after it are skipped.
pub fn crl(der: &[u8]) -> Option<Crl> {
    yasna::parse_ber(der, |r| {
        r.read_sequence(|r| {
            let crl = r.next().read_sequence(|r| {
                // version INTEGER OPTIONAL (v2), signature, issuer, thisUpdate, nextUpdate
                // OPTIONAL.
                r.read_optional(|r| r.read_u8())?;
                r.next().read_der()?;
                let issuer_der = r.next().read_der()?;
                let issuer = yasna::parse_der(&issuer_der, name)?;
                time(r.next())?;
                let next_update = r.read_optional(time)?;
                while r.read_optional(|r| r.read_der())?.is_some() {}
                Ok(Crl {
                    issuer_der,
                    issuer,
                    next_update: next_update.and_then(unix_time),
                })
            })?;
            r.next().read_der()?;
            r.next().read_der()?;
            Ok(crl)
        })
    })
    .ok()
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
            '\0' => out.push_str("\\00"),
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
        let mut hash_first = String::new();
        escape(&mut hash_first, "#1");
        assert_eq!(hash_first, "\\#1");
    }
}
