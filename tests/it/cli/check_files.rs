//! `hourglass check` reads every file a config names (TLS certificates and keys, the client
//! CRL, upstream CAs and keys, the run store's CA) as start-up does, and fails where it would.

use super::*;

/// `check` reads the TLS files as start-up does: a key that does not fit its certificate
/// fails the check (exit 1), not the deploy; a file this machine cannot read (a secret
/// mounted only where the gateway runs) is a warning, as key files are, and so is a key
/// every user can read.
#[test]
fn check_reads_the_tls_files_as_start_up_does() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-tls-")
        .tempdir()
        .unwrap();
    let one = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let two = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let file = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let cert = file("one.pem", one.cert.pem());
    let key = file("one.key", one.key_pair.serialize_pem());
    let other_key = file("two.key", two.key_pair.serialize_pem());
    let config = |cert: &str, key: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[server.tls]\ncert = {cert:?}\nkey = {key:?}\n\n\
             [upstreams.up]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n"
        )
    };
    let run = |text: String| {
        let path = dir.path().join("tls.toml");
        std::fs::write(&path, text).unwrap();
        let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &str, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    mode(&key, 0o600);
    let (code, stderr) = run(config(&cert, &key));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    // A key every user of the machine can read is warned of, as key files are.
    mode(&key, 0o644);
    let (code, stderr) = run(config(&cert, &key));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "warning: server.tls.key {key} is open to every user (mode 644); chmod 600 it"
        )),
        "{stderr}"
    );
    let (code, stderr) = run(config(&cert, &other_key));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "server.tls.cert {cert}: the key in {other_key} is not this certificate's"
        )),
        "{stderr}"
    );
    // A chain in the wrong order is told from a key that fits nothing (both were "do not
    // fit together", naming neither file).
    let reversed = file(
        "reversed.pem",
        format!("{}{}", two.cert.pem(), one.cert.pem()),
    );
    let (code, stderr) = run(config(&reversed, &key));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "server.tls.cert {reversed}: the key in {key} is certificate 2 of this file's, \
             which must begin with the server's own certificate"
        )),
        "{stderr}"
    );
    // A certificate where the key should be: no key in it.
    let (code, stderr) = run(config(&cert, &cert));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "server.tls.key {cert}: no unencrypted private key found"
        )),
        "{stderr}"
    );
    // An expired certificate is served (rustls does not check its own), with a warning.
    let old_key = rcgen::KeyPair::generate().unwrap();
    let mut old = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    old.not_before = rcgen::date_time_ymd(2020, 1, 1);
    old.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let old_cert = file("old.pem", old.self_signed(&old_key).unwrap().pem());
    let old_key = file("old.key", old_key.serialize_pem());
    mode(&old_key, 0o600);
    let (code, stderr) = run(config(&old_cert, &old_key));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "warning: server.tls.cert {old_cert} expired at 2021-01-01T00:00:00Z: clients will refuse it"
        )),
        "{stderr}"
    );
    let (code, stderr) = run(config("/nonexistent/cert.pem", &key));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: server.tls.cert /nonexistent/cert.pem")
            && stderr.contains("will not start without it"),
        "{stderr}"
    );
}

/// `check` reads `client_crl` as start-up does: named in what it prints, a CRL past its
/// nextUpdate a warning, a file with no CRL in it an error, a missing one a warning.
#[test]
fn check_reads_the_client_crl_as_start_up_does() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-crl-")
        .tempdir()
        .unwrap();
    let file = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name = rcgen::DistinguishedName::new();
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "Clients CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let crl = rcgen::CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2020, 1, 1),
        next_update: rcgen::date_time_ymd(2021, 1, 1),
        crl_number: rcgen::SerialNumber::from(1),
        issuing_distribution_point: None,
        revoked_certs: Vec::new(),
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&ca, &ca_key)
    .unwrap();
    let cert = file("server.pem", server.cert.pem());
    let key = file("server.key", server.key_pair.serialize_pem());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ca = file("ca.pem", ca.pem());
    let stale = file("stale.crl", crl.pem().unwrap());
    let run = |crl: &str| {
        let path = dir.path().join("crl.toml");
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n\n[server.tls]\ncert = {cert:?}\nkey = {key:?}\n\
                 client_ca = {ca:?}\nclient_crl = {crl:?}\n\n\
                 [upstreams.up]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
                 [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n"
            ),
        )
        .unwrap();
        let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = run(&stale);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!(", client_crl {stale}\n")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "warning: server.tls.client_crl {stale}: the CRL from CN=Clients CA was due to be \
             replaced at 2021-01-01T00:00:00Z (its nextUpdate)"
        )),
        "{stderr}"
    );
    let (code, _, stderr) = run(&ca);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("server.tls.client_crl {ca}: no CRL found")),
        "{stderr}"
    );
    let (code, _, stderr) = run("/nonexistent/clients.crl");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: server.tls.client_crl /nonexistent/clients.crl")
            && stderr.contains("will not start without it"),
        "{stderr}"
    );
}

/// `check` reads the provider keys, CA files and client keys as start-up does: a file that
/// would stop the server (no PEM in a `ca_file` or a `client_cert`, two keys or none in an
/// `api_key_file`, a `client_keys_file` with no key) fails the check, not the deploy; one this machine cannot
/// read is still only a warning. A `ca_file` beside an `http://` url is ignored by both.
#[test]
fn check_reads_the_key_and_ca_files_as_start_up_does() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-files-")
        .tempdir()
        .unwrap();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        p.display().to_string()
    };
    let not_pem = file("bad.pem", "not a certificate\n");
    let two_keys = file(
        "two.key",
        "sk-aaaaaaaaaaaaaaaaaaaaaaaa\nsk-bbbbbbbbbbbbbbbbbbbbbbbb\n",
    );
    let no_keys = file("none.keys", "# nobody yet\n");
    let config = |upstream: &str, route: &str| {
        format!(
            "[upstreams.up]\n{upstream}\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n{route}\n"
        )
    };
    let run = |text: String| {
        let path = dir.path().join("files.toml");
        std::fs::write(&path, text).unwrap();
        let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (upstream, route, want) in [
        (
            format!("url = \"https://127.0.0.1:9\"\nauth = \"none\"\nca_file = {not_pem:?}"),
            String::new(),
            "no PEM certificate found",
        ),
        (
            format!("url = \"https://127.0.0.1:9\"\napi_key_file = {two_keys:?}"),
            String::new(),
            "exactly one key",
        ),
        (
            "url = \"https://127.0.0.1:9\"\nauth = \"none\"".to_owned(),
            format!("client_keys_file = {no_keys:?}"),
            "hold no key",
        ),
        (
            format!(
                "url = \"https://127.0.0.1:9\"\nauth = \"none\"\n\
                 client_cert = {not_pem:?}\nclient_cert_key = {not_pem:?}"
            ),
            String::new(),
            "client_cert",
        ),
    ] {
        let (code, stderr) = run(config(&upstream, &route));
        assert_eq!(code, Some(1), "{upstream} {route}: {stderr}");
        assert!(stderr.contains(want), "{stderr}");
    }
    let (code, stderr) = run(config(
        &format!("url = \"http://127.0.0.1:9\"\nauth = \"none\"\nca_file = {not_pem:?}"),
        "",
    ));
    assert_eq!(code, Some(0), "ignored beside http://: {stderr}");
    let (code, stderr) = run(config(
        "url = \"https://127.0.0.1:9\"\napi_key_file = \"/nonexistent/key\"",
        "",
    ));
    assert_eq!(code, Some(0), "unreadable here, a warning: {stderr}");
    assert!(stderr.contains("/nonexistent/key"), "{stderr}");
    let (code, stderr) = run(config(
        "url = \"https://127.0.0.1:9\"\nauth = \"none\"\n\
         client_cert = \"/nonexistent/gw.pem\"\nclient_cert_key = \"/nonexistent/gw.key\"",
        "",
    ));
    assert_eq!(code, Some(0), "unreadable here, a warning: {stderr}");
    assert!(stderr.contains("/nonexistent/gw.pem"), "{stderr}");
}

/// `store_ca_file` is read by `check` as start-up reads it: a file with no certificate (which
/// would leave nothing trusted, and every store command failing) fails the check, naming the
/// key and the file; one this machine cannot open is a warning.
#[test]
fn check_reads_the_store_ca_file_as_start_up_does() {
    let route = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"u\"\n";
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-store-ca-")
        .tempdir()
        .unwrap();
    std::fs::write(dir.path().join("bad.pem"), "not a certificate\n").unwrap();
    let config = |ca: &str| {
        let path = dir.path().join("store.toml");
        std::fs::write(
            &path,
            format!(
                "[runs]\nstore = \"rediss://127.0.0.1:1/0\"\nstore_ca_file = \"{ca}\"\n\
                 [upstreams.u]\nurl = \"http://127.0.0.1:1\"\n{route}"
            ),
        )
        .unwrap();
        let out = hourglass(&["check", "--config", path.to_str().unwrap()]);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let bad = dir.path().join("bad.pem");
    let (code, stderr) = config("bad.pem");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "runs: store_ca_file {}: no PEM certificate found",
            bad.display()
        )),
        "{stderr}"
    );
    let (code, stderr) = config("absent.pem");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: runs: store_ca_file") && stderr.contains("absent.pem"),
        "{stderr}"
    );
}

/// Every `[server.tls]` file this machine cannot read is named in one run, as the other file
/// keys are, so that `check --strict` as a deploy gate lists them all at once: it named only
/// the first (cert), then, once cert and key were there, client_ca but not client_crl (audit
/// PE 2).
#[test]
fn check_names_every_unreadable_tls_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-tls-all-")
        .tempdir()
        .unwrap();
    let run = |cert: &str, key: &str, strict: bool| {
        let path = dir.path().join("tls.toml");
        std::fs::write(
            &path,
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\n\n[server.tls]\ncert = {cert:?}\nkey = {key:?}\n\
                 client_ca = \"/nonexistent/ca.pem\"\nclient_crl = \"/nonexistent/clients.crl\"\n\n\
                 [upstreams.up]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
                 [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n"
            ),
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let args: &[&str] = if strict {
            &["check", "--strict", "--config", path]
        } else {
            &["check", "--config", path]
        };
        let out = hourglass(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let named = |stderr: &str, level: &str, key: &str, file: &str| {
        stderr.contains(&format!("{level}: server.tls.{key} {file}: "))
    };
    let missing = [
        ("cert", "/nonexistent/cert.pem"),
        ("key", "/nonexistent/key.pem"),
        ("client_ca", "/nonexistent/ca.pem"),
        ("client_crl", "/nonexistent/clients.crl"),
    ];
    let (code, stderr) = run(missing[0].1, missing[1].1, false);
    assert_eq!(code, Some(0), "{stderr}");
    for (key, file) in missing {
        assert!(named(&stderr, "warning", key, file), "{key}: {stderr}");
    }
    let (code, stderr) = run(missing[0].1, missing[1].1, true);
    assert_eq!(code, Some(1), "{stderr}");
    for (key, file) in missing {
        assert!(named(&stderr, "error", key, file), "{key}: {stderr}");
    }
    // Cert and key readable: the two client files that are not are both named.
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.path().join("server.pem");
    std::fs::write(&cert, server.cert.pem()).unwrap();
    let key = dir.path().join("server.key");
    std::fs::write(&key, server.key_pair.serialize_pem()).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, stderr) = run(cert.to_str().unwrap(), key.to_str().unwrap(), true);
    assert_eq!(code, Some(1), "{stderr}");
    for (key, file) in &missing[2..] {
        assert!(named(&stderr, "error", key, file), "{key}: {stderr}");
    }
    assert!(!stderr.contains("server.tls.cert"), "{stderr}");
}

/// Every bad `[server.tls]` file is named in one run, the unreadable and the readable but
/// wrong alike: an empty certificate was never mentioned while another file could not be
/// read, and of several wrong files only the first was named (audit QB 4).
#[test]
fn check_names_every_bad_tls_file_readable_or_not() {
    let dir = tempfile::Builder::new()
        .prefix("hourglass-cli-tls-bad-")
        .tempdir()
        .unwrap();
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert = dir.path().join("empty.pem");
    std::fs::write(&cert, "").unwrap();
    // A certificate where the key should be: no key in it.
    let key = dir.path().join("nokey.pem");
    std::fs::write(&key, server.cert.pem()).unwrap();
    let ca = dir.path().join("cas");
    std::fs::create_dir(&ca).unwrap();
    let crl = "/nonexistent/clients.crl";
    let path = dir.path().join("tls.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\n[server.tls]\ncert = {cert:?}\nkey = {key:?}\n\
             client_ca = {ca:?}\nclient_crl = {crl:?}\n\n\
             [upstreams.up]\nurl = \"http://127.0.0.1:9\"\nauth = \"none\"\n\n\
             [[routes]]\nname = \"chat\"\npath_prefix = \"/\"\nupstream = \"up\"\n"
        ),
    )
    .unwrap();
    let path = path.to_str().unwrap();
    for strict in [false, true] {
        let args: &[&str] = if strict {
            &["check", "--strict", "--config", path]
        } else {
            &["check", "--config", path]
        };
        let out = hourglass(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "strict {strict}: {stderr}");
        for (key, file) in [("cert", &cert), ("key", &key), ("client_ca", &ca)] {
            assert!(
                stderr.contains(&format!("server.tls.{key} {}: ", file.display())),
                "strict {strict}, {key}: {stderr}"
            );
        }
        let level = if strict { "error" } else { "warning" };
        assert!(
            stderr.contains(&format!("{level}: server.tls.client_crl {crl}: ")),
            "strict {strict}: {stderr}"
        );
    }
}
