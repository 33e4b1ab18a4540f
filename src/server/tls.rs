//! TLS for the client listener: a rustls server config from PEM files, ALPN `h2`,
//! `http/1.1` and `http/1.0`, and optional client-certificate verification.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{VerifierBuilderError, WebPkiClientVerifier};
use rustls::sign::SigningKey;

use crate::config::ServerTls;
use crate::server::client_cert::Naming;
use crate::server::x509::{self, not_after, not_before};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("server.tls.{key} {path}: {reason}")]
    File {
        key: &'static str,
        path: String,
        reason: String,
    },
    #[error("server.tls: {0}")]
    Config(String),
}

fn file_err(key: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        key,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::config::file::read(path)
        .map_err(|e| file_err(key, path, format!("failed to read file: {e}")))
}

fn certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    crate::pem::certs(&read(key, path)?).map_err(|e| file_err(key, path, e))
}

/// Each `client_crl` CRL's issuer, and when it promised the next (its nextUpdate).
pub type CrlsDue = Vec<(String, SystemTime)>;

/// A CRL the listener serves, told apart from its issuer's earlier and later ones.
#[derive(Debug, Clone)]
pub struct ServedCrl {
    issuer_der: Vec<u8>,
    /// The key of the `client_ca` CA that signed it (`None` for an intermediate's CRL, or
    /// a signature this check cannot read): a CA whose key is replaced under the same name
    /// numbers its CRLs anew, and its CRLs are not compared with the old key's.
    signer: Option<Vec<u8>>,
    issuer: String,
    version: x509::CrlVersion,
}

impl ServedCrl {
    fn same_issuer(&self, other: &ServedCrl) -> bool {
        self.issuer_der == other.issuer_der && self.signer == other.signer
    }
}

/// The newest CRL of each issuer this process has served. It outlives the reloads that
/// serve an older one, or none at all (`client_crl` dropped for a while), so that a CRL
/// copied back later is still told apart from what was served before it; only a restart
/// forgets it.
#[derive(Debug, Default)]
pub struct ServedCrls(Vec<ServedCrl>);

impl ServedCrls {
    pub fn new(served: Vec<ServedCrl>) -> Self {
        let mut memory = ServedCrls::default();
        memory.remember(served);
        memory
    }

    /// What a reload's CRLs undo: each that is older than its issuer's newest served before
    /// (copied back from a backup, or from a stale mirror), whose clients revoked since are
    /// let in again. Only warned of: the file is the operator's, and a restart would serve
    /// it anyway.
    pub fn rolled_back(&self, now: &[ServedCrl], path: &Path) -> Vec<String> {
        now.iter()
            .filter_map(|crl| {
                let served = self
                    .of(crl)
                    .filter(|b| b.version.newer_than(&crl.version))?;
                Some(format!(
                    "server.tls.client_crl {}: the CRL from {} ({}) is older than one this \
                     process served before ({}): certificates revoked in between are accepted \
                     again; put the CA's newest CRL in place",
                    path.display(),
                    crl.issuer,
                    crl.version,
                    served.version
                ))
            })
            .collect()
    }

    /// Keeps, for each issuer, the newer of what it had and what is served now.
    pub fn remember(&mut self, now: Vec<ServedCrl>) {
        for crl in now {
            match self.0.iter_mut().find(|b| b.same_issuer(&crl)) {
                Some(b) if crl.version.newer_than(&b.version) => *b = crl,
                Some(_) => {}
                None => self.0.push(crl),
            }
        }
    }

    /// The newest served from `crl`'s issuer.
    fn of(&self, crl: &ServedCrl) -> Option<&ServedCrl> {
        self.0.iter().find(|b| b.same_issuer(crl))
    }
}

/// The verifier of client certificates, and what its CRLs need said.
struct ClientVerifier {
    verifier: Arc<dyn ClientCertVerifier>,
    crls_due: CrlsDue,
    served: Vec<ServedCrl>,
    /// What loading `client_ca` and the CRLs found that does not stop the listener.
    notes: Vec<String>,
}

/// The verifier of client certificates: signed by a CA of `client_ca` and, with
/// `client_crl`, revoked by none of its CRLs. With it, each CRL's issuer and nextUpdate, and
/// what loading the CRLs has to say.
fn client_verifier(
    tls: &ServerTls,
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<ClientVerifier, TlsError> {
    let cas = certs("client_ca", ca)?;
    // webpki trusts whatever key an anchor holds, CA or not: a client's own certificate
    // given as its CA refuses that client (and every client the real CA signed), while
    // certificates signed with its key would be accepted.
    let ca_notes: Vec<String> = cas
        .iter()
        .filter(|cert| x509::is_ca(cert) == Some(false))
        .map(|cert| {
            format!(
                "server.tls.client_ca {}: {} is no CA certificate (no basicConstraints CA:TRUE): \
                 client_ca takes the CAs that sign client certificates; those the real CA \
                 signed are refused, and any its key signs accepted",
                ca.display(),
                x509::subject(cert).unwrap_or_else(|| "a certificate".to_owned())
            )
        })
        .collect();
    let mut roots = rustls::RootCertStore::empty();
    for cert in &cas {
        roots
            .add(cert.clone())
            .map_err(|e| file_err("client_ca", ca, e))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let Some(path) = &tls.client_crl else {
        let verifier = builder.build().map_err(|e| file_err("client_ca", ca, e))?;
        let verifier = Arc::new(Naming(verifier));
        return Ok(ClientVerifier {
            verifier,
            crls_due: Vec::new(),
            served: Vec::new(),
            notes: ca_notes,
        });
    };
    let all = crate::pem::crls(&read("client_crl", path)?)
        .map_err(|e| file_err("client_crl", path, e))?;
    let (crls, read, crl_notes) = newest_per_issuer(all, path);
    // rustls's defaults stay: every certificate of the chain is checked, one whose status no
    // CRL tells is refused, and a CRL past its nextUpdate still revokes what it lists
    // (refusing every client instead would turn a CRL published late into an outage;
    // `warnings` says so).
    let verifier = builder.with_crls(crls).build().map_err(|e| match e {
        // rustls names the parser's error only.
        VerifierBuilderError::InvalidCrl(_) => {
            let hint = match read.iter().find(|crl| crl.v1) {
                Some(v1) => format!(
                    "the CRL from {} is a version 1 CRL (no version field, no extensions), \
                     and only version 2 CRLs are read: have the CA issue v2 CRLs (openssl \
                     ca -gencrl does once the CA has a crlnumber file or crl_extensions)",
                    v1.issuer
                ),
                None => "a certificate in DER, several DER CRLs run together, or a damaged \
                         file?"
                    .to_owned(),
            };
            file_err("client_crl", path, format!("{e} ({hint})"))
        }
        e => file_err("client_ca", ca, e),
    })?;
    // A CA without a CRL in the file, or with one its key did not sign, would have every
    // certificate it signed refused (its status unknown, the CRL's signature bad): said
    // here, at load, rather than by each of its clients' handshakes.
    // Each CRL's signer, the key of the `ServedCrl` memory, found by the same check.
    let mut signers: Vec<Option<Vec<u8>>> = vec![None; read.len()];
    let mut missing = Vec::new();
    for ca in &cas {
        let Some(subject) = x509::subject_der(ca) else {
            continue;
        };
        let name = || x509::subject(ca).unwrap_or_default();
        let Some(i) = read.iter().position(|crl| crl.issuer_der == subject) else {
            missing.push(name());
            continue;
        };
        match read[i].signed_by(ca) {
            Some(false) => {
                return Err(file_err(
                    "client_crl",
                    path,
                    format!(
                        "the CRL from {} is not signed by the key of the client_ca of that name \
                         (another CA's, or a key since replaced): every certificate that CA \
                         signed would be refused",
                        name()
                    ),
                ));
            }
            Some(true) => signers[i] = x509::key_der(ca),
            None => {}
        }
    }
    if !missing.is_empty() {
        return Err(file_err(
            "client_crl",
            path,
            format!(
                "no CRL from {} (a client_ca): every certificate it signed would be refused, \
                 its revocation status unknown",
                missing.join(", nor from ")
            ),
        ));
    }
    let crls_due = read
        .iter()
        .filter_map(|crl| Some((crl.issuer.clone(), crl.next_update?)))
        .collect();
    let served = read
        .into_iter()
        .zip(signers)
        .map(|(crl, signer)| ServedCrl {
            version: crl.version(),
            signer,
            issuer_der: crl.issuer_der,
            issuer: crl.issuer,
        })
        .collect();
    Ok(ClientVerifier {
        verifier: Arc::new(Naming(verifier)),
        crls_due,
        served,
        notes: ca_notes.into_iter().chain(crl_notes).collect(),
    })
}

/// The CRLs rustls is given: of several from one issuer, the newest alone. rustls consults
/// the first CRL whose issuer matches, so a newer CRL appended to the file (or an older one
/// left in front of it) would not revoke what it adds. The older ones are named in a note.
/// CRLs the gateway cannot read go to rustls as they are, which says what is wrong with them.
fn newest_per_issuer(
    all: Vec<CertificateRevocationListDer<'static>>,
    path: &Path,
) -> (
    Vec<CertificateRevocationListDer<'static>>,
    Vec<x509::Crl>,
    Vec<String>,
) {
    let mut kept: Vec<(CertificateRevocationListDer<'static>, Option<x509::Crl>)> = Vec::new();
    let mut older = Vec::new();
    for der in all {
        let crl = x509::crl(&der);
        let same = crl.as_ref().and_then(|crl| {
            kept.iter_mut()
                .find(|(_, k)| k.as_ref().is_some_and(|k| k.issuer_der == crl.issuer_der))
        });
        match (same, crl) {
            (Some((kept_der, Some(k))), Some(crl)) => {
                if crl.newer_than(k) {
                    older.push(std::mem::replace(k, crl).issuer);
                    *kept_der = der;
                } else {
                    older.push(crl.issuer);
                }
            }
            (_, crl) => kept.push((der, crl)),
        }
    }
    let notes = older
        .iter()
        .map(|issuer| {
            format!(
                "server.tls.client_crl {}: holds more than one CRL from {issuer}; the newest \
                 (by CRL number, else thisUpdate) is used and the older ignored",
                path.display()
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let (crls, read): (Vec<_>, Vec<_>) = kept.into_iter().unzip();
    (crls, read.into_iter().flatten().collect(), notes)
}

/// The acceptor's config, when its certificate expires, and when its CRLs are due.
pub struct ListenerTls {
    pub config: Arc<rustls::ServerConfig>,
    /// The leaf certificate's notAfter (`None` if it cannot be read from the DER, which
    /// rustls accepted all the same).
    pub expires: Option<SystemTime>,
    /// The leaf certificate's notBefore, read as `expires` is.
    pub valid_from: Option<SystemTime>,
    crls_due: CrlsDue,
    served: Vec<ServedCrl>,
    /// What loading the certificates and CRLs found that does not stop the listener.
    notes: Vec<String>,
}

/// When the listener's certificate is valid, as far as its DER tells.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Validity {
    pub from: Option<SystemTime>,
    pub until: Option<SystemTime>,
}

impl Validity {
    pub fn holds_at(&self, now: SystemTime) -> bool {
        self.from.is_none_or(|from| from <= now) && self.until.is_none_or(|until| now <= until)
    }
}

/// A reload's certificate that clients refuse now (expired, or not valid yet), held back
/// while the one served is valid: the served pair stays, and the rest of the reload applies
/// (audit MB 1: failing the whole reload, as for a key that does not fit, froze every other
/// change, a client key revoked included, until a renewal staged days early was valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// Said as a warning and by `/readyz`: the file, its dates, and when it is tried again.
    pub reason: String,
    /// `not_yet_valid` or `expired`: the `reason` label of
    /// `hourglass_tls_certificate_pending_timestamp_seconds`.
    pub state: &'static str,
    /// When it may be taken after all ([`due`]): the watcher reloads then.
    pub due: Option<SystemTime>,
}

/// Whether a reload's certificate, valid over `new`, is held back for its dates (see
/// [`Held`]). Where nothing valid is served (start-up, TLS turned on by this reload, a
/// served certificate that has run out too) it is not: it is served, with the warning.
pub fn held_for_dates(
    tls: &ServerTls,
    new: Validity,
    serving: Option<Validity>,
    now: SystemTime,
) -> Option<Held> {
    let serving = serving.filter(|v| v.holds_at(now))?;
    if new.holds_at(now) {
        return None;
    }
    let at = |t: Option<SystemTime>| {
        t.map_or("?".to_owned(), |t| {
            humantime::format_rfc3339_seconds(t).to_string()
        })
    };
    let not_yet = new.from.filter(|from| *from > now);
    let (state, label) = if not_yet.is_some() {
        ("is not valid yet", "not_yet_valid")
    } else {
        ("has expired", "expired")
    };
    // Said from what `due` takes, the earlier of the two (audit NB 5: a notBefore after the
    // served pair's end was said to be the time, which was that end).
    let when = match (not_yet, serving.until) {
        (Some(from), Some(until)) if until < from => {
            "when the one served runs out, before this one's notBefore"
        }
        (Some(_), _) => "its notBefore",
        (None, _) => "when the one served runs out",
    };
    let due = due(new, Some(serving), now);
    Some(Held {
        reason: format!(
            "server.tls.cert {}: the certificate {state} (valid from {} to {}; now {}): \
             clients would refuse it, so the pair served (valid until {}) is kept, and this \
             one tried again at {} ({when}); the rest of the config is applied",
            tls.cert.display(),
            at(new.from),
            at(new.until),
            at(Some(now)),
            at(serving.until),
            at(due),
        ),
        state: label,
        due,
    })
}

/// When a certificate [`held_for_dates`] held back may be taken after all: once it is
/// valid, or once the one served has run out (a second after, as a second is their unit).
/// Without this, a renewal issued a little ahead of its notBefore was refused for good: the
/// watcher reloads only a file that changes, and the served one then expired (audit EA).
pub fn due(new: Validity, serving: Option<Validity>, now: SystemTime) -> Option<SystemTime> {
    let from = new.from.filter(|from| *from > now);
    let until = serving.and_then(|s| s.until);
    [from, until]
        .into_iter()
        .flatten()
        .min()
        .map(|t| t + Duration::from_secs(1))
}

/// Under this much validity left, start-up, reloads and `check` warn: a certificate renewed
/// on time (Let's Encrypt renews with 30 days left) never gets this close.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

impl ListenerTls {
    /// What start-up, reloads and `check` warn of: the certificate's expiry, and CRLs that
    /// are past their nextUpdate, whose CA may have revoked more since.
    pub fn warnings(&self, tls: &ServerTls, now: SystemTime) -> Vec<String> {
        let mut out: Vec<String> = self.expiry_warning(tls, now).into_iter().collect();
        out.extend(self.undated_warnings(tls, now));
        out
    }

    /// [`ListenerTls::warnings`] but the certificate's dates: what a reload whose
    /// certificate is held back ([`Held`]) still has to say.
    fn undated_warnings(&self, tls: &ServerTls, now: SystemTime) -> Vec<String> {
        let mut out = self.notes.clone();
        let Some(path) = &tls.client_crl else {
            return out;
        };
        for (issuer, due) in &self.crls_due {
            if *due <= now {
                out.push(format!(
                    "server.tls.client_crl {}: the CRL from {issuer} was due to be replaced \
                     at {} (its nextUpdate); it still revokes what it lists, but not what \
                     was revoked since",
                    path.display(),
                    humantime::format_rfc3339_seconds(*due)
                ));
            }
        }
        out
    }

    /// When the certificate is valid.
    pub fn validity(&self) -> Validity {
        Validity {
            from: self.valid_from,
            until: self.expires,
        }
    }

    /// A warning when the certificate is not valid yet (a renewal installed early, a clock
    /// behind), has expired, or expires within `EXPIRY_WARNING`.
    pub fn expiry_warning(&self, tls: &ServerTls, now: SystemTime) -> Option<String> {
        if let Some(from) = self.valid_from.filter(|from| *from > now) {
            return Some(format!(
                "server.tls.cert {} is not valid until {} (its notBefore): clients will refuse \
                 it until then",
                tls.cert.display(),
                humantime::format_rfc3339_seconds(from)
            ));
        }
        let expires = self.expires?;
        let at = humantime::format_rfc3339_seconds(expires);
        let path = tls.cert.display();
        match expires.duration_since(now) {
            Err(_) => Some(format!(
                "server.tls.cert {path} expired at {at}: clients will refuse it"
            )),
            Ok(left) if left < EXPIRY_WARNING => Some(format!(
                "server.tls.cert {path} expires at {at}, in {} days",
                left.as_secs() / 86_400
            )),
            Ok(_) => None,
        }
    }
}

/// The key must be the first certificate's: a chain in the wrong order is named as such,
/// and a key that is no certificate's names both files.
fn check_key_fits(
    tls: &ServerTls,
    chain: &[CertificateDer<'static>],
    key: Arc<dyn rustls::sign::SigningKey>,
) -> Result<(), TlsError> {
    let fits = |c: &CertificateDer<'static>| {
        rustls::sign::CertifiedKey::new(vec![c.clone()], key.clone())
            .keys_match()
            .is_ok()
    };
    if fits(&chain[0]) {
        return Ok(());
    }
    let reason = match chain.iter().position(fits) {
        Some(i) => format!(
            "the key in {} is certificate {} of this file's, which must begin with the \
             server's own certificate (then its intermediates)",
            tls.key.display(),
            i + 1
        ),
        None => format!(
            "the key in {} is not this certificate's (nor any in the file)",
            tls.key.display()
        ),
    };
    Err(file_err("cert", &tls.cert, reason))
}

/// The key in `path`, and what signs with it. Loaded to tell a key of a kind the provider
/// cannot sign with (P-521, RSA-PSS) from a key that is not the certificate's: rustls says
/// "do not fit" of both.
fn signing_key(
    path: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<(PrivateKeyDer<'static>, Arc<dyn SigningKey>), TlsError> {
    let key = crate::pem::private_key(&read("key", path)?).map_err(|e| file_err("key", path, e))?;
    let signing = provider
        .key_provider
        .load_private_key(key.clone_key())
        .map_err(|_| {
            file_err(
                "key",
                path,
                "a key of a kind this server cannot sign with; it takes RSA, ECDSA P-256 or \
                 P-384, and Ed25519 keys",
            )
        })?;
    Ok((key, signing))
}

/// What stops the listener in the `[server.tls]` file `key` names (`cert`, `key`,
/// `client_ca`, `client_crl`), read alone: no PEM of its kind in it, a key of a kind this
/// server cannot sign with, a directory. `check` asks it of every file, so that one run
/// names each bad one (audit QB 4); what takes two files (a key that does not fit its
/// certificate, a CRL that is not its CA's) is [`server_config`]'s to say.
pub fn file_problem(key: &'static str, path: &Path) -> Result<(), TlsError> {
    match key {
        "key" => signing_key(path, &rustls::crypto::ring::default_provider()).map(drop),
        "client_crl" => crate::pem::crls(&read(key, path)?)
            .map(drop)
            .map_err(|e| file_err(key, path, e)),
        _ => certs(key, path).map(drop),
    }
}

/// Builds the acceptor's config. Called at start-up and on every reload, so a rotated
/// certificate is picked up without a restart.
pub fn server_config(tls: &ServerTls) -> Result<ListenerTls, TlsError> {
    let chain = certs("cert", &tls.cert)?;
    let expires = not_after(&chain[0]);
    let valid_from = not_before(&chain[0]);
    // Served all the same, as OpenSSL-based clients (curl) take it; rustls and webpki clients (Rust
    // SDKs, another hourglass in front of this one) refuse it with CaUsedAsEndEntity.
    let cert_notes: Vec<String> = (x509::is_ca(&chain[0]) == Some(true))
        .then(|| {
            format!(
                "server.tls.cert {}: {}; clients built on rustls or webpki refuse it",
                tls.cert.display(),
                crate::pem::CA_USED_AS_END_ENTITY
            )
        })
        .into_iter()
        .collect();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (key, signing) = signing_key(&tls.key, &provider)?;
    check_key_fits(tls, &chain, signing)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let (builder, crls_due, served, client_notes) = match &tls.client_ca {
        None => (
            builder.with_no_client_auth(),
            Vec::new(),
            Vec::new(),
            Vec::new(),
        ),
        Some(ca) => {
            let v = client_verifier(tls, ca, provider)?;
            (
                builder.with_client_cert_verifier(v.verifier),
                v.crls_due,
                v.served,
                v.notes,
            )
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(format!("cert and key do not fit together: {e}")))?;
    // http/1.0 too (RFC 7301 6): the HTTP/1 server serves it, as it does without ALPN.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    Ok(ListenerTls {
        config: Arc::new(config),
        expires,
        valid_from,
        crls_due,
        served,
        notes: cert_notes.into_iter().chain(client_notes).collect(),
    })
}

/// The listener's acceptor, the dates its gauges show once it serves, and what to warn of
/// then.
pub struct Acceptor {
    pub acceptor: Arc<tokio_rustls::TlsAcceptor>,
    pub expires: Option<SystemTime>,
    pub validity: Validity,
    pub crls_due: CrlsDue,
    pub crls: Vec<ServedCrl>,
    /// A certificate that has expired or soon will, CRLs due or superseded: said by the
    /// caller once this acceptor serves (a reload that fails serves on the old one).
    pub warnings: Vec<String>,
}

/// The listener's acceptor at start-up, where nothing is served yet.
pub fn acceptor(tls: &ServerTls) -> Result<Acceptor, TlsError> {
    reload_acceptor(tls, None).map(|(acceptor, _)| acceptor)
}

/// The listener's acceptor on a reload, given the one served and its certificate's dates.
/// A certificate [`held_for_dates`] holds back is not served: the new acceptor takes the
/// served one's certificate pair, and the rest of `[server.tls]` from the files (a
/// `client_ca` or CRL changed by the same reload is not held back with it); its dates and
/// the gauges' are the served pair's. A file that cannot be used at all (garbage, a key
/// that does not fit) fails the reload as before.
pub fn reload_acceptor(
    tls: &ServerTls,
    served: Option<(&tokio_rustls::TlsAcceptor, Validity)>,
) -> Result<(Acceptor, Option<Held>), TlsError> {
    let listener = server_config(tls)?;
    let now = SystemTime::now();
    let kept = served.and_then(|(acceptor, serving)| {
        let held = held_for_dates(tls, listener.validity(), Some(serving), now)?;
        Some((acceptor, serving, held))
    });
    let Some((served, serving, held)) = kept else {
        return Ok((
            Acceptor {
                warnings: listener.warnings(tls, now),
                validity: listener.validity(),
                acceptor: Arc::new(tokio_rustls::TlsAcceptor::from(listener.config)),
                expires: listener.expires,
                crls_due: listener.crls_due,
                crls: listener.served,
            },
            None,
        ));
    };
    let warnings = listener.undated_warnings(tls, now);
    let mut config = Arc::unwrap_or_clone(listener.config);
    config.cert_resolver = served.config().cert_resolver.clone();
    Ok((
        Acceptor {
            warnings,
            validity: serving,
            acceptor: Arc::new(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
            expires: serving.until,
            crls_due: listener.crls_due,
            crls: listener.served,
        },
        Some(held),
    ))
}

/// Why a client's TLS handshake failed, as `hourglass_tls_handshake_failures_total` counts
/// it (`timeout` is counted where the handshake is timed).
pub fn handshake_failure(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    let Some(tls) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return match e.kind() {
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
                "closed"
            }
            _ => "other",
        };
    };
    match tls {
        // A CRL that cannot vouch for the certificate (its signature fails, or its issuer
        // may not sign CRLs) refuses it as a revoked one is refused.
        rustls::Error::NoCertificatesPresented
        | rustls::Error::InvalidCertificate(_)
        | rustls::Error::InvalidCertRevocationList(_) => "client_certificate",
        rustls::Error::AlertReceived(_) => "alert",
        rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol => "incompatible",
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "malformed"
        }
        _ => "other",
    }
}

/// What a refused handshake says of the listener's own CRLs rather than of its client: a
/// chain with a CA that no CRL in `client_crl` covers (an intermediate's CRL missing; the
/// client reads `unknown_ca`), or a CRL that does not verify. Every such client is refused
/// alike, so it is logged as a warning, where debug holds the clients' own failures.
pub fn crl_problem(e: &std::io::Error) -> Option<&'static str> {
    use rustls::{CertificateError, Error};
    match e.get_ref()?.downcast_ref::<Error>()? {
        Error::InvalidCertificate(CertificateError::UnknownRevocationStatus) => Some(
            "a client certificate was refused: no CRL in client_crl covers a CA of its chain \
             (an intermediate CA that signs client certificates needs its own CRL there)",
        ),
        Error::InvalidCertRevocationList(_) => Some(
            "a client certificate was refused: a CRL in client_crl that covers its chain \
             cannot be used (its signature does not verify, or its issuer may not sign CRLs)",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
