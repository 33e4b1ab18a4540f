//! What `hourglass check` reads beyond the config file, read as start-up reads it: the CA
//! files and client certificates, the provider keys and the client keys. A file that would stop the server (no PEM in
//! a `ca_file`, two keys in an `api_key_file`, a `client_keys_file` with none) fails the
//! check, not the deploy.

use std::path::Path;
use std::time::Duration;

use crate::auth::ClientKeys;
use crate::config::Config;
use crate::upstream::Upstream;

/// The errors start-up would stop at, one line each, scrubbed as start-up's are. A file this machine cannot open, or a
/// variable it does not have (a secret mounted only where the gateway runs), is left out:
/// [`Config::warnings`] names it.
pub fn startup_errors(config: &Config) -> Vec<String> {
    // Probed, not opened: a FIFO's open would wait for a writer (audit ME 2). One is no
    // missing file, and the read below refuses it, saying what it is.
    let missing = |p: Option<&Path>| p.is_some_and(|p| crate::config::file::probe(p).is_err());
    let mut errors = Vec::new();
    for up in &config.upstreams {
        let client_cert = up.client_cert.as_ref();
        if missing(up.ca_file.as_deref())
            || missing(up.api_key_file.as_deref())
            || missing(client_cert.map(|c| c.cert.as_path()))
            || missing(client_cert.map(|c| c.key.as_path()))
        {
            continue;
        }
        // Builds the clients as start-up does, connecting nothing; the bound is unused.
        if let Err(e) = Upstream::new(up.clone(), Duration::from_secs(1)) {
            errors.push(crate::config::scrub(&e.to_string()));
        }
    }
    if !missing(config.runs.store_ca_file.as_deref()) {
        if let Err(e) = crate::runs::runtime::store_ca(&config.runs) {
            errors.push(e);
        }
    }
    for r in &config.routes {
        let Some(auth) = &r.client_auth else { continue };
        let unset = auth
            .env
            .as_ref()
            .is_some_and(|v| std::env::var_os(v).is_none());
        if unset || missing(auth.file.as_deref()) {
            continue;
        }
        if let Err(e) = ClientKeys::load(&r.name, auth) {
            errors.push(crate::config::scrub(&e.to_string()));
        }
    }
    errors
}
