use super::*;
use std::path::PathBuf;

#[test]
fn an_expired_or_expiring_certificate_is_warned_of() {
    let tls = ServerTls {
        cert: "/etc/hourglass/tls.pem".into(),
        key: "/etc/hourglass/tls.key".into(),
        client_ca: None,
        client_crl: None,
    };
    let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    let listener = |expires| ListenerTls {
        config: Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::server::ResolvesServerCertUsingSni::new())),
        ),
        expires,
        valid_from: None,
        crls_due: Vec::new(),
        served: Vec::new(),
        notes: Vec::new(),
    };
    let expires = at(1_804_118_400); // 2027-03-04T00:00:00Z
    let day = 86_400;
    assert_eq!(
        listener(Some(expires)).expiry_warning(&tls, at(1_804_118_400 + 1)),
        Some(
            "server.tls.cert /etc/hourglass/tls.pem expired at 2027-03-04T00:00:00Z: \
             clients will refuse it"
                .to_owned()
        )
    );
    assert_eq!(
        listener(Some(expires)).expiry_warning(&tls, at(1_804_118_400 - 3 * day - 5)),
        Some(
            "server.tls.cert /etc/hourglass/tls.pem expires at 2027-03-04T00:00:00Z, in 3 days"
                .to_owned()
        )
    );
    assert_eq!(
        listener(Some(expires)).expiry_warning(&tls, at(1_804_118_400 - 15 * day)),
        None
    );
    assert_eq!(listener(None).expiry_warning(&tls, at(0)), None);
}

/// A server certificate valid over `from` to `until` (years), and its key, written to a
/// temporary directory.
fn server_pair(from: i32, until: i32) -> (tempfile::TempDir, ServerTls) {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(from, 6, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    let cert = params.self_signed(&key).unwrap();
    let tls = ServerTls {
        cert: dir.path().join("server.pem"),
        key: dir.path().join("server.key"),
        client_ca: None,
        client_crl: None,
    };
    std::fs::write(&tls.cert, cert.pem()).unwrap();
    std::fs::write(&tls.key, key.serialize_pem()).unwrap();
    (dir, tls)
}

/// A certificate installed before its notBefore is refused by every client, as an
/// expired one is: warned of alike, and a reload holds it back while a valid one is served.
#[test]
fn a_certificate_not_valid_yet_is_warned_of_and_held_back_over_a_valid_one() {
    let at = |y, m, d| {
        let secs = rcgen::date_time_ymd(y, m, d).unix_timestamp();
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.try_into().unwrap())
    };
    let now = at(2026, 12, 6);
    let (_dir, future) = server_pair(2027, 2028);
    let listener = server_config(&future).unwrap();
    assert_eq!(
        listener.warnings(&future, now),
        [format!(
            "server.tls.cert {} is not valid until 2027-06-01T00:00:00Z (its notBefore): \
             clients will refuse it until then",
            future.cert.display()
        )]
    );
    assert_eq!(
        listener.warnings(&future, at(2027, 7, 1)),
        Vec::<String>::new()
    );

    let (_dir, valid) = server_pair(2025, 2029);
    let valid_now = server_config(&valid).unwrap().validity();
    let serving = Some(valid_now);
    assert_eq!(
        held_for_dates(&future, listener.validity(), serving, now),
        Some(Held {
            reason: format!(
                "server.tls.cert {}: the certificate is not valid yet (valid from \
                 2027-06-01T00:00:00Z to 2028-01-01T00:00:00Z; now 2026-12-06T00:00:00Z): \
                 clients would refuse it, so the pair served (valid until \
                 2029-01-01T00:00:00Z) is kept, and this one tried again at \
                 2027-06-01T00:00:01Z (its notBefore); the rest of the config is applied",
                future.cert.display()
            ),
            state: "not_yet_valid",
            due: Some(at(2027, 6, 1) + Duration::from_secs(1)),
        })
    );
    let (_dir, expired) = server_pair(2024, 2025);
    let held = held_for_dates(
        &expired,
        server_config(&expired).unwrap().validity(),
        serving,
        now,
    )
    .unwrap();
    assert_eq!(held.state, "expired");
    assert!(
        held.reason.contains(
            "the certificate has expired (valid from 2024-06-01T00:00:00Z to 2025-01-01T00:00:00Z"
        ),
        "{}",
        held.reason
    );
    assert!(
        held.reason
            .contains("tried again at 2029-01-01T00:00:01Z (when the one served runs out)"),
        "{}",
        held.reason
    );
    // Nothing valid served (TLS off until now, or run out too): it is taken.
    assert_eq!(
        held_for_dates(&future, listener.validity(), None, now),
        None
    );
    let run_out = Some(server_config(&expired).unwrap().validity());
    assert_eq!(
        held_for_dates(&future, listener.validity(), run_out, now),
        None
    );
    assert_eq!(held_for_dates(&valid, valid_now, run_out, now), None);
    assert_eq!(held_for_dates(&valid, valid_now, serving, now), None);
}

/// Audit DE 4: a served certificate marked CA (`openssl req -x509`'s default), which
/// rustls and webpki clients refuse, and a `client_ca` that holds no CA are warned of.
#[test]
fn a_ca_certificate_served_or_a_leaf_given_as_client_ca_is_warned_of() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, contents: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, contents).unwrap();
        p
    };
    let self_signed = |is_ca: rcgen::IsCa| {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.is_ca = is_ca;
        (params.self_signed(&key).unwrap(), key)
    };
    let (ca_cert, ca_key) = self_signed(rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained));
    let (leaf, leaf_key) = self_signed(rcgen::IsCa::ExplicitNoCa);
    let (plain, plain_key) = self_signed(rcgen::IsCa::NoCa);
    assert_eq!(x509::is_ca(ca_cert.der()), Some(true));
    assert_eq!(x509::is_ca(leaf.der()), Some(false));
    assert_eq!(x509::is_ca(plain.der()), Some(false));
    assert_eq!(x509::is_ca(b"no certificate"), None);

    let tls =
        |cert: &rcgen::Certificate, key: &rcgen::KeyPair, client_ca: Option<PathBuf>| ServerTls {
            cert: write("server.pem", cert.pem()),
            key: write("server.key", key.serialize_pem()),
            client_ca,
            client_crl: None,
        };
    let now = SystemTime::now();
    let served_ca = tls(&ca_cert, &ca_key, None);
    let warnings = server_config(&served_ca).unwrap().warnings(&served_ca, now);
    assert_eq!(
        warnings,
        [format!(
            "server.tls.cert {}: {}; clients built on rustls or webpki refuse it",
            served_ca.cert.display(),
            crate::pem::CA_USED_AS_END_ENTITY
        )]
    );
    for (cert, key) in [(&leaf, &leaf_key), (&plain, &plain_key)] {
        let t = tls(cert, key, None);
        assert_eq!(
            server_config(&t).unwrap().warnings(&t, now),
            Vec::<String>::new()
        );
    }

    // A client's own certificate where its CA should be, after a CA that is one.
    let client_ca = write("clients.pem", format!("{}{}", ca_cert.pem(), leaf.pem()));
    let t = tls(&plain, &plain_key, Some(client_ca.clone()));
    assert_eq!(
        server_config(&t).unwrap().warnings(&t, now),
        [format!(
            "server.tls.client_ca {}: CN=rcgen self signed cert is no CA certificate (no \
             basicConstraints CA:TRUE): client_ca takes the CAs that sign client \
             certificates; those the real CA signed are refused, and any its key signs \
             accepted",
            client_ca.display()
        )]
    );
    let t = tls(&plain, &plain_key, Some(write("cas.pem", ca_cert.pem())));
    assert_eq!(
        server_config(&t).unwrap().warnings(&t, now),
        Vec::<String>::new()
    );
}

#[test]
fn revocation_refusals_are_client_certificate_failures() {
    use rustls::{CertRevocationListError, CertificateError};
    let reason = |e: rustls::Error| {
        handshake_failure(&std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    };
    for e in [
        CertificateError::Revoked.into(),
        CertificateError::UnknownRevocationStatus.into(),
        CertRevocationListError::BadSignature.into(),
    ] {
        assert_eq!(reason(e), "client_certificate");
    }
    // The listener's own CRLs at fault are warned of; a client's revoked certificate is not.
    let problem =
        |e: rustls::Error| crl_problem(&std::io::Error::new(std::io::ErrorKind::InvalidData, e));
    assert!(problem(CertificateError::UnknownRevocationStatus.into())
        .is_some_and(|p| p.contains("intermediate CA")));
    assert!(problem(CertRevocationListError::BadSignature.into())
        .is_some_and(|p| p.contains("signature does not verify")));
    assert_eq!(problem(CertificateError::Revoked.into()), None);
    assert_eq!(problem(CertificateError::UnknownIssuer.into()), None);
}

/// A directory holding a server certificate and key and a `client_ca` file of some CAs,
/// for listener configs that differ in their `client_crl` alone.
struct Listener {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
}

impl Listener {
    fn of(cas: &[&rcgen::Certificate]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let write = |name: &str, contents: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, contents).unwrap();
            p
        };
        Self {
            cert: write("server.pem", server.cert.pem()),
            key: write("server.key", server.key_pair.serialize_pem()),
            client_ca: write("ca.pem", cas.iter().map(|c| c.pem()).collect()),
            dir,
        }
    }

    fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, contents).unwrap();
        p
    }

    fn tls(&self, crl: &Path) -> ServerTls {
        ServerTls {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: Some(self.client_ca.clone()),
            client_crl: Some(crl.to_path_buf()),
        }
    }

    /// Why the listener refuses `crl`.
    fn error(&self, crl: &Path) -> String {
        match server_config(&self.tls(crl)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{} was accepted", crl.display()),
        }
    }
}

/// A CA named `cn`, and its key.
fn ca(cn: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    (params.self_signed(&key).unwrap(), key)
}

/// The CA's CRL number `number`, due at `next_update`, in PEM.
fn crl_of(
    ca: &rcgen::Certificate,
    key: &rcgen::KeyPair,
    number: u64,
    next_update: (i32, u8, u8),
) -> String {
    let (y, m, d) = next_update;
    rcgen::CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2020, 1, 1),
        next_update: rcgen::date_time_ymd(y, m, d),
        crl_number: rcgen::SerialNumber::from(number),
        issuing_distribution_point: None,
        revoked_certs: Vec::new(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(ca, key)
    .unwrap()
    .pem()
    .unwrap()
}

/// A CA, and a CRL it signed that is due at `next_update`.
fn ca_and_crl(cn: &str, next_update: (i32, u8, u8)) -> (rcgen::Certificate, String) {
    let (ca, key) = ca(cn);
    let pem = crl_of(&ca, &key, 1, next_update);
    (ca, pem)
}

#[test]
fn client_crl_must_hold_a_crl_from_every_client_ca_and_is_warned_of_when_due() {
    let (one, one_crl) = ca_and_crl("One CA", (2040, 1, 1));
    let (two, two_crl) = ca_and_crl("Two CA", (2021, 1, 1));
    let l = Listener::of(&[&one, &two]);

    // Both CAs' CRLs, in one PEM file: Two's is past its nextUpdate, and still used.
    let both = l.file("both.crl", format!("{one_crl}{two_crl}").as_bytes());
    let listener = server_config(&l.tls(&both)).unwrap();
    let at = |y, m, d| {
        let secs = rcgen::date_time_ymd(y, m, d).unix_timestamp();
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.try_into().unwrap())
    };
    assert_eq!(
        listener.warnings(&l.tls(&both), at(2030, 1, 1)),
        vec![format!(
            "server.tls.client_crl {}: the CRL from CN=Two CA was due to be replaced at \
             2021-01-01T00:00:00Z (its nextUpdate); it still revokes what it lists, but \
             not what was revoked since",
            both.display()
        )]
    );
    assert_eq!(
        listener.warnings(&l.tls(&both), at(2020, 6, 1)),
        Vec::<String>::new()
    );

    // A CA without a CRL would have all its clients refused: said at load.
    let only_one = l.file("one.crl", one_crl.as_bytes());
    assert_eq!(
        l.error(&only_one),
        format!(
            "server.tls.client_crl {}: no CRL from CN=Two CA (a client_ca): every \
             certificate it signed would be refused, its revocation status unknown",
            only_one.display()
        )
    );

    // DER is read too, one CRL to a file.
    let der = l.file("one.der", &crate::pem::crls(one_crl.as_bytes()).unwrap()[0]);
    assert!(l.error(&der).contains("no CRL from CN=Two CA"));

    // What is no CRL names the key and the file.
    let cert = l.file("cert-not-crl.pem", one.pem().as_bytes());
    assert_eq!(
        l.error(&cert),
        format!(
            "server.tls.client_crl {}: no CRL found (PEM \"X509 CRL\", or DER)",
            cert.display()
        )
    );
    let garbled = l.file(
        "garbled.crl",
        b"-----BEGIN X509 CRL-----\nMAMCAQE=\n-----END X509 CRL-----\n",
    );
    assert_eq!(
        l.error(&garbled),
        format!(
            "server.tls.client_crl {}: provided CRL could not be parsed: ParseError (a \
             certificate in DER, several DER CRLs run together, or a damaged file?)",
            garbled.display()
        )
    );
    assert!(l
        .error(&l.dir.path().join("absent.crl"))
        .contains("failed to read file"));
    // RFC 5280 allows a CRL without a version field (v1, no extensions); rustls reads
    // only v2. Said as such, rather than as a damaged file.
    let issuer = x509::subject_der(one.der()).unwrap();
    let v1 = yasna::construct_der(|w| {
        w.write_sequence(|w| {
            let algorithm = |w: yasna::DERWriter| {
                w.write_sequence(|w| {
                    w.next()
                        .write_oid(&yasna::models::ObjectIdentifier::from_slice(&[
                            1, 2, 840, 10045, 4, 3, 2,
                        ]))
                })
            };
            w.next().write_sequence(|w| {
                algorithm(w.next());
                w.next().write_der(&issuer);
                let at = yasna::models::UTCTime::parse(b"261201000000Z").unwrap();
                w.next().write_utctime(&at);
                let next = yasna::models::UTCTime::parse(b"270101000000Z").unwrap();
                w.next().write_utctime(&next);
            });
            algorithm(w.next());
            w.next().write_bitvec_bytes(&[0; 8], 64);
        })
    });
    let v1 = l.file("v1.crl", &v1);
    assert_eq!(
        l.error(&v1),
        format!(
            "server.tls.client_crl {}: provided CRL could not be parsed: ParseError (the \
             CRL from CN=One CA is a version 1 CRL (no version field, no extensions), and \
             only version 2 CRLs are read: have the CA issue v2 CRLs (openssl ca -gencrl \
             does once the CA has a crlnumber file or crl_extensions))",
            v1.display()
        )
    );
}

/// A CRL is checked at load against the CA it names: signed by that CA's key, and the
/// newest of several from it the one used. Every CA without one is named.
#[test]
fn client_crls_are_matched_to_their_cas_at_load() {
    let (one, one_key) = ca("One CA");
    let (two, two_key) = ca("Two CA");
    let l = Listener::of(&[&one, &two]);
    let until = (2090, 1, 1);
    let two_crl = crl_of(&two, &two_key, 1, until);

    // Another CA of the same name (or the CA before its key changed) signed it: every
    // client of One would be refused for the CRL's bad signature.
    let (impostor, impostor_key) = ca("One CA");
    let forged = crl_of(&impostor, &impostor_key, 1, until);
    let path = l.file("forged.crl", format!("{forged}{two_crl}").as_bytes());
    assert_eq!(
        l.error(&path),
        format!(
            "server.tls.client_crl {}: the CRL from CN=One CA is not signed by the key \
             of the client_ca of that name (another CA's, or a key since replaced): every \
             certificate that CA signed would be refused",
            path.display()
        )
    );

    // Two CRLs from One: the newer is used, wherever it is, and the older is noted.
    let (old, new) = (
        crl_of(&one, &one_key, 1, until),
        crl_of(&one, &one_key, 2, until),
    );
    for pem in [
        format!("{old}{new}{two_crl}"),
        format!("{new}{two_crl}{old}"),
    ] {
        let path = l.file("two-from-one.crl", pem.as_bytes());
        let listener = server_config(&l.tls(&path)).unwrap();
        assert_eq!(
            listener.warnings(&l.tls(&path), SystemTime::now()),
            [format!(
                "server.tls.client_crl {}: holds more than one CRL from CN=One CA; the \
                 newest (by CRL number, else thisUpdate) is used and the older ignored",
                path.display()
            )]
        );
    }

    // Every CA without a CRL is named at once.
    let (three, three_key) = ca("Three CA");
    let path = l.file("three.crl", crl_of(&three, &three_key, 1, until).as_bytes());
    assert_eq!(
        l.error(&path),
        format!(
            "server.tls.client_crl {}: no CRL from CN=One CA, nor from CN=Two CA (a \
             client_ca): every certificate it signed would be refused, its revocation \
             status unknown",
            path.display()
        )
    );
}

/// A reload whose CRL is older than its issuer's served before it lets revoked clients
/// back in: warned of, naming both. A newer CRL, the same one, or another issuer's are not.
/// What was served is remembered through reloads that serve an older CRL, or none.
#[test]
fn a_crl_older_than_one_served_before_is_warned_of() {
    let (one, one_key) = ca("One CA");
    let (two, two_key) = ca("Two CA");
    let l = Listener::of(&[&one, &two]);
    let until = (2090, 1, 1);
    let served = |one_number: u64, two_number: u64| {
        let crl = l.file(
            "clients.crl",
            format!(
                "{}{}",
                crl_of(&one, &one_key, one_number, until),
                crl_of(&two, &two_key, two_number, until)
            )
            .as_bytes(),
        );
        server_config(&l.tls(&crl)).unwrap().served
    };
    let path = l.dir.path().join("clients.crl");
    let (before, older, newer) = (served(7, 3), served(5, 3), served(8, 2));
    let warning = |now: u64, then: u64| {
        format!(
            "server.tls.client_crl {}: the CRL from CN=One CA (number {now}) is older than \
             one this process served before (number {then}): certificates revoked in \
             between are accepted again; put the CA's newest CRL in place",
            path.display()
        )
    };
    let mut memory = ServedCrls::new(before.clone());
    assert_eq!(memory.rolled_back(&older, &path), [warning(5, 7)]);
    assert_eq!(memory.rolled_back(&before, &path), Vec::<String>::new());
    assert_eq!(
        ServedCrls::new(older.clone()).rolled_back(&before, &path),
        Vec::<String>::new()
    );
    assert_eq!(
        ServedCrls::default().rolled_back(&older, &path),
        Vec::<String>::new()
    );
    assert_eq!(
        memory.rolled_back(&newer, &path).len(),
        1,
        "Two went 3 to 2"
    );
    // Serving the older one, then none (client_crl dropped for a while), forgets nothing.
    memory.remember(older.clone());
    memory.remember(Vec::new());
    assert_eq!(memory.rolled_back(&older, &path), [warning(5, 7)]);
    // Each issuer keeps its newest: One's 8, and Two's 3 over the 2 served with it.
    memory.remember(newer);
    assert_eq!(memory.rolled_back(&older, &path), [warning(5, 8)]);
    assert_eq!(memory.rolled_back(&before, &path), [warning(7, 8)]);
    // A CA whose key was replaced under the same name numbers its CRLs anew: its first
    // lets nothing the old one revoked back in, and is not taken for a roll-back.
    let (rekeyed, rekeyed_key) = ca("One CA");
    let l = Listener::of(&[&rekeyed]);
    let crl = l.file(
        "clients.crl",
        crl_of(&rekeyed, &rekeyed_key, 1, until).as_bytes(),
    );
    let fresh = server_config(&l.tls(&crl)).unwrap().served;
    assert_eq!(memory.rolled_back(&fresh, &path), Vec::<String>::new());
    memory.remember(fresh.clone());
    assert_eq!(memory.rolled_back(&fresh, &path), Vec::<String>::new());
    assert_eq!(memory.rolled_back(&older, &path), [warning(5, 8)]);
}

/// Audit NB 5: a held-back certificate whose notBefore comes after the served pair runs out
/// is tried again when that pair runs out (`due` takes the earlier), and the message said
/// the time was "its notBefore".
#[test]
fn a_held_back_certificate_names_why_it_is_tried_again_then() {
    let at = |y, m, d| {
        let secs = rcgen::date_time_ymd(y, m, d).unix_timestamp();
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs.try_into().unwrap())
    };
    let now = at(2026, 12, 6);
    let (_dir, future) = server_pair(2027, 2028);
    let new = server_config(&future).unwrap().validity();
    let (_dir, ending) = server_pair(2025, 2027);
    let serving = Some(server_config(&ending).unwrap().validity());
    let held = held_for_dates(&future, new, serving, now).unwrap();
    assert_eq!(held.due, Some(at(2027, 1, 1) + Duration::from_secs(1)));
    assert!(
        held.reason.contains(
            "tried again at 2027-01-01T00:00:01Z (when the one served runs out, before this \
             one's notBefore)"
        ),
        "{}",
        held.reason
    );
}
