//! An `edgevold` run as a process on this host (dev file pool), which a node VM reaches through
//! slirp (10.0.2.2): the appliances of scripts/test-replicated-qemu.sh and
//! scripts/test-encrypted-qemu.sh. Killed when dropped.

use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use edgevol_proto::csi::v1::identity_client::IdentityClient;
use edgevol_proto::csi::v1::ProbeRequest;

use crate::appliance_channel;

/// How long an appliance has to listen and answer Probe ready.
pub const READY_S: u64 = 60;

/// The path in the environment variable `var`, which the test's script sets.
pub fn env_path(var: &str) -> PathBuf {
    PathBuf::from(
        std::env::var(var).unwrap_or_else(|_| panic!("{var} not set: run the test's script")),
    )
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Waits until the appliance `id` at `csi` answers Probe ready; panics after [`READY_S`],
/// naming its `log`.
pub async fn wait_probe_ready(id: &str, csi: SocketAddr, pki: &Path, log: &str) {
    let t = Instant::now();
    let mut identity = IdentityClient::new(appliance_channel(csi, pki, "controller").await);
    loop {
        if let Ok(r) = identity.probe(ProbeRequest {}).await {
            if r.into_inner().ready == Some(true) {
                return;
            }
        }
        assert!(
            t.elapsed() < crate::scaled_secs(READY_S),
            "{id} not ready within {:?} (log: {log})",
            crate::scaled_secs(READY_S)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One appliance as a child process, started again on the same data dir and ports.
#[derive(Debug)]
pub struct HostAppliance {
    /// Its appliance id.
    pub id: &'static str,
    /// Its CSI listener.
    pub csi: SocketAddr,
    /// Its data directory (the pool file is in it).
    pub dir: PathBuf,
    /// Its log (appended to by every start).
    pub log: PathBuf,
    /// `RUST_LOG` of its starts.
    pub rust_log: &'static str,
    nvme_port: u16,
    child: Option<Child>,
}

impl HostAppliance {
    /// `id`, its data directory and log under `work`, on free ports; not started.
    pub fn new(id: &'static str, work: &Path) -> HostAppliance {
        HostAppliance {
            id,
            csi: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: work.join(id),
            log: work.join(format!("{id}.log")),
            rust_log: "info",
            nvme_port: free_port(),
            child: None,
        }
    }

    /// Starts it (dev mode, the server pair of `pki`, hosts without DH-HMAC-CHAP keys allowed:
    /// the node VM's 6.1 kernel has no NVMe in-band authentication) and waits until it is ready.
    pub async fn start(&mut self, bin: &Path, pki: &Path) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("box log");
        let child = Command::new(bin.join("edgevold"))
            .arg("--dev")
            .arg("--data-dir")
            .arg(&self.dir)
            .args(["--appliance-id", self.id])
            .args(["--listen", &self.csi.to_string()])
            .args(["--nvme-listen", &format!("127.0.0.1:{}", self.nvme_port)])
            .args(["--nvme-advertise", "10.0.2.2"])
            .args(["--metrics-listen", "off"])
            .arg("--tls-ca")
            .arg(pki.join("ca.pem"))
            .arg("--tls-cert")
            .arg(pki.join("server.pem"))
            .arg("--tls-key")
            .arg(pki.join("server.key"))
            .args(["--nvme-allow-unauthenticated-hosts", "true"])
            .env("RUST_LOG", self.rust_log)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn edgevold");
        self.child = Some(child);
        let t = Instant::now();
        while std::net::TcpStream::connect(self.csi).is_err() {
            assert!(
                t.elapsed() < crate::scaled_secs(READY_S),
                "{} does not listen on {} within {:?} (log: {})",
                self.id,
                self.csi,
                crate::scaled_secs(READY_S),
                self.log.display()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_probe_ready(self.id, self.csi, pki, &self.log.display().to_string()).await;
    }

    /// SIGKILL, and reaped.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("a running edgevold");
        child.kill().expect("SIGKILL edgevold");
        child.wait().expect("reap edgevold");
    }
}

impl Drop for HostAppliance {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
