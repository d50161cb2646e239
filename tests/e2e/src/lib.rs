//! Host-side helpers of the QEMU end-to-end tests (scripts/test-e2e-qemu.sh): an mTLS channel to
//! the appliance VM's CSI port, a plaintext channel to the node VM's `edgevol-node` (through the
//! test-only `e2e-agent` splice), and the agent's shell with a time budget per command.
//!
//! Every remote step has a budget: [`within`] fails the test with the step's name when it is spent.
//! Budgets and real-time windows widen by [`time_scale`] on a busy machine.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use edgevol_pki::client::MtlsTarget;
use edgevol_pki::tls::{client_config, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

pub mod fio;
pub mod host_appliance;
pub mod md_resync;
pub mod rig;

/// How much wider budgets and real-time windows are on a busy machine:
/// `EDGEVOL_TEST_TIME_SCALE`, a whole number from 1 to 99 (default 1; `scripts/test.sh
/// --under-load` sets 3, and the QEMU scripts widen the VMs' own budgets by it too).
pub fn time_scale() -> u32 {
    match std::env::var("EDGEVOL_TEST_TIME_SCALE") {
        Err(_) => 1,
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| (1..100).contains(n))
            .unwrap_or_else(|| {
                panic!("EDGEVOL_TEST_TIME_SCALE must be a whole number from 1 to 99, not {v:?}")
            }),
    }
}

/// `secs` seconds times [`time_scale`].
pub fn scaled_secs(secs: u64) -> Duration {
    Duration::from_secs(secs * u64::from(time_scale()))
}

/// Awaits `fut` for at most `secs` (times [`time_scale`]), panicking with `what` when the budget
/// is spent.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    let budget = scaled_secs(secs);
    match tokio::time::timeout(budget, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: no answer within {budget:?}"),
    }
}

/// A gRPC channel to the appliance over mutual TLS with the client pair `name` of `pki`
/// (`ca.pem`, `NAME.pem`, `NAME.key`); the server certificate must be valid for `localhost`.
pub async fn appliance_channel(addr: SocketAddr, pki: &Path, name: &str) -> Channel {
    let tls = client_config(TlsFiles {
        ca: &pki.join("ca.pem"),
        cert: &pki.join(format!("{name}.pem")),
        key: &pki.join(format!("{name}.key")),
    })
    .expect("client TLS configuration from the appliance's PKI");
    let target = MtlsTarget::new(&addr.to_string(), Some("localhost"), tls).expect("address");
    within(
        30,
        "connect to the appliance",
        target.channel(Duration::from_secs(20), None),
    )
    .await
    .expect("mTLS connection to the appliance")
}

/// A plaintext gRPC channel to the node plugin (the agent splices it to the unix socket).
pub async fn node_channel(addr: SocketAddr) -> Channel {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(20));
    within(30, "connect to the node plugin", endpoint.connect())
        .await
        .expect("connection to the node plugin")
}

/// The shell of the node VM (test-only `e2e-agent --exec-port`).
#[derive(Debug, Clone, Copy)]
pub struct Agent {
    /// Forwarded exec port on the host.
    pub addr: SocketAddr,
}

impl Agent {
    /// Runs `command` with `sh -c` in the VM; the agent kills it after `budget` seconds times
    /// [`time_scale`] (124).
    pub async fn sh(&self, budget: u64, command: &str) -> (i32, String) {
        let addr = self.addr;
        let request = format!("{}\n{command}", scaled_secs(budget).as_secs());
        within(budget + 15, &format!("node VM: {command}"), async move {
            let mut conn = TcpStream::connect(addr).await.expect("agent connect");
            conn.write_all(request.as_bytes())
                .await
                .expect("agent send");
            conn.shutdown().await.expect("agent half-close");
            let mut answer = String::new();
            conn.read_to_string(&mut answer)
                .await
                .expect("agent answer");
            let (code, output) = answer
                .split_once('\n')
                .unwrap_or_else(|| panic!("agent answered {answer:?}"));
            (code.parse().expect("exit code"), output.to_owned())
        })
        .await
    }

    /// As [`Agent::sh`], and the command must succeed; returns its output.
    pub async fn ok(&self, budget: u64, command: &str) -> String {
        let (code, output) = self.sh(budget, command).await;
        assert_eq!(code, 0, "node VM: `{command}` exited {code}:\n{output}");
        output
    }
}

/// `host:port` from an environment variable the test script sets.
pub fn env_addr(var: &str) -> SocketAddr {
    let v = std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} not set: run scripts/test-e2e-qemu.sh"));
    v.parse()
        .unwrap_or_else(|_| panic!("{var}={v:?} is not HOST:PORT"))
}

/// The counters of the node's power-cut writer (`sh /tmp/pc.sh counts`: `name value` pairs).
#[derive(Debug)]
pub struct WriterCounts(String);

impl WriterCounts {
    /// Reads them in the node VM.
    pub async fn read(agent: &Agent) -> Self {
        WriterCounts(agent.ok(20, "sh /tmp/pc.sh counts").await)
    }

    /// The value of `name`; panics when it is missing or not a number.
    pub fn field(&self, name: &str) -> u64 {
        let words: Vec<&str> = self.0.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == name)
            .and_then(|i| words.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in {:?}", self.0))
    }
}

/// The lines of a node's `dmesg` that say I/O or the file system failed.
pub fn storage_errors(dmesg: &str) -> Vec<&str> {
    const MARKS: [&str; 4] = [
        "I/O error",
        "EXT4-fs error",
        "Aborting journal",
        "Remounting filesystem read-only",
    ];
    dmesg
        .lines()
        .filter(|l| MARKS.iter().any(|m| l.contains(m)))
        .collect()
}
