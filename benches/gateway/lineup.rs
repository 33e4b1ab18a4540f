//! What a run may measure: the targets, where their programs are and which core they get
//! (`Env`), and the limits a scenario configures them with. The lowest floor of the harness:
//! the targets' start-up (`targets.rs`, `peers.rs`) and the scenarios build on it.

use std::path::PathBuf;
use std::time::Duration;

/// Where scripts/bench.sh installs LiteLLM and Portkey (relative to the crate root).
pub const LITELLM_VENV: &str = "target/litellm-venv";
pub const PORTKEY_DIR: &str = "target/portkey";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The client talks to the fake provider itself: the floor every gateway adds to.
    Direct,
    /// Hourglass with `--workers 1`: a current-thread runtime.
    Hourglass,
    /// Hourglass with the multi-thread runtime, two workers (what tokio's default gives on
    /// this 2-CPU machine) on the one pinned core. Hourglass's own default is now the
    /// current-thread runtime when the process may use only one CPU, as here.
    HourglassMt,
    /// Hourglass as `hourglass`, speaking HTTP/2 to the fake provider (h2c, prior knowledge):
    /// many client streams on few upstream connections, cancellation as a stream reset.
    /// Not in a default run: `--targets hourglass,hourglass-h2`.
    HourglassH2,
    /// HTTP/2 on both sides: the clients speak h2c (prior knowledge, 100 streams on a
    /// connection) to the gateway, which speaks h2c to the fake. Only in the `memory` and
    /// `leave` scenarios, only by name: `hourglass-h2h2`, `haproxy-h2h2`, `bare-hyper-h2h2`,
    /// and `direct-h2` (the clients' HTTP/2 to the fake itself, the floor of `leave`).
    HourglassH2H2,
    HaproxyH2H2,
    BareH2H2,
    DirectH2,
    Nginx,
    Haproxy,
    /// The floor of the mandated stack (`bare.rs`): hyper's server and hyper-util's pooled
    /// client with nothing of Hourglass in between.
    BarePool,
    /// The same with one upstream connection per client connection, in the client's task.
    BareConn,
    /// LiteLLM's proxy and Portkey's gateway, the LLM gateways users would pick instead
    /// (`peers.rs`).
    Litellm,
    Portkey,
}

impl Target {
    pub const ALL: [Target; 9] = [
        Target::Direct,
        Target::Hourglass,
        Target::HourglassMt,
        Target::Nginx,
        Target::Haproxy,
        Target::BarePool,
        Target::BareConn,
        Target::Litellm,
        Target::Portkey,
    ];
    /// Measured only when asked for by name.
    pub const EXTRA: [Target; 5] = [
        Target::HourglassH2,
        Target::HourglassH2H2,
        Target::HaproxyH2H2,
        Target::BareH2H2,
        Target::DirectH2,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Hourglass => "hourglass",
            Target::HourglassMt => "hourglass-mt",
            Target::HourglassH2 => "hourglass-h2",
            Target::HourglassH2H2 => "hourglass-h2h2",
            Target::HaproxyH2H2 => "haproxy-h2h2",
            Target::BareH2H2 => "bare-hyper-h2h2",
            Target::DirectH2 => "direct-h2",
            Target::Nginx => "nginx",
            Target::Haproxy => "haproxy",
            Target::BarePool => "bare-hyper",
            Target::BareConn => "bare-hyper-conn",
            Target::Litellm => "litellm",
            Target::Portkey => "portkey",
        }
    }

    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL
            .into_iter()
            .chain(Target::EXTRA)
            .find(|t| t.name() == name)
    }

    pub fn is_peer(self) -> bool {
        matches!(
            self,
            Target::Nginx
                | Target::Haproxy
                | Target::HaproxyH2H2
                | Target::Litellm
                | Target::Portkey
        )
    }

    /// The clients reach it over HTTP/2 (h2c with prior knowledge, many streams on one
    /// connection): only the `memory` and `leave` scenarios have such a client.
    pub fn h2_clients(self) -> bool {
        matches!(
            self,
            Target::HourglassH2H2 | Target::HaproxyH2H2 | Target::BareH2H2 | Target::DirectH2
        )
    }

    /// No gateway: the client talks to the fake provider itself.
    pub fn is_direct(self) -> bool {
        matches!(self, Target::Direct | Target::DirectH2)
    }

    /// Slow to install (a Python venv, an npm tree): left out of the quick run unless named.
    pub fn is_llm_peer(self) -> bool {
        matches!(self, Target::Litellm | Target::Portkey)
    }

    pub fn is_hourglass(self) -> bool {
        matches!(
            self,
            Target::Hourglass | Target::HourglassMt | Target::HourglassH2 | Target::HourglassH2H2
        )
    }

    pub fn is_bare(self) -> bool {
        matches!(self, Target::BarePool | Target::BareConn | Target::BareH2H2)
    }

    /// The bare hyper proxies have no time limits to measure.
    pub fn has_limits(self) -> bool {
        !(self.is_direct() || self.is_bare())
    }
}

/// Where things are and which cores to use.
#[derive(Clone, Debug)]
pub struct Env {
    pub hourglass: PathBuf,
    /// This harness's own binary, which is also the bare hyper proxy (`--bare-proxy`).
    pub harness: PathBuf,
    pub nginx: Option<PathBuf>,
    pub haproxy: Option<PathBuf>,
    pub litellm: Option<PathBuf>,
    /// Portkey's entry script, and the node that runs it.
    pub portkey: Option<PathBuf>,
    pub node: Option<PathBuf>,
    pub gateway_core: usize,
    pub run_dir: PathBuf,
    /// The open-files limit every process here lives with.
    pub nofile: u64,
}

impl Env {
    pub fn available(&self, t: Target) -> bool {
        match t {
            Target::Nginx => self.nginx.is_some(),
            Target::Haproxy | Target::HaproxyH2H2 => self.haproxy.is_some(),
            t => self.missing(t).is_none(),
        }
    }

    /// Why a target cannot run here, or `None` if it can be tried.
    pub fn missing(&self, t: Target) -> Option<String> {
        match t {
            Target::Litellm if self.litellm.is_none() => Some(format!(
                "LiteLLM is not installed in {LITELLM_VENV} (scripts/bench.sh installs it in a full \
                 run, or when --targets names it)"
            )),
            Target::Portkey if self.portkey.is_none() => Some(format!(
                "Portkey is not installed in {PORTKEY_DIR} (scripts/bench.sh installs it in a full \
                 run, or when --targets names it)"
            )),
            Target::Portkey if self.node.is_none() => Some("node is not installed".into()),
            _ => None,
        }
    }
}

/// The limits a gateway is configured with for one scenario: its read timeout is its idle
/// limit (and, for Hourglass, the first-token limit too).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub idle: Duration,
}

impl Limits {
    pub const RELAXED: Limits = Limits {
        idle: Duration::from_secs(30),
    };
}
