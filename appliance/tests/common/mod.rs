//! Fixtures: a dev appliance in a temporary directory, and mTLS clients for it.
#![allow(dead_code)]

pub mod guest;
pub mod log_capture;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use edgevol_appliance::{start, Args, Config, Running};
use edgevol_pki::client::{ChannelError, MtlsTarget};
use edgevol_pki::tls::{client_config, TlsFiles};
use tokio_rustls::rustls::ClientConfig;
use tonic::transport::Channel;

/// Time a test client allows for TCP and the TLS handshake.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a test gives a pool to open and recover: a debug build on a loaded 2-core machine
/// (times [`time_scale`]).
pub const POOL_READY: std::time::Duration = std::time::Duration::from_secs(60);

/// How much wider real-time windows are on a busy machine: `EDGEVOL_TEST_TIME_SCALE`, a whole
/// number from 1 to 99 (default 1; `scripts/test.sh --under-load` sets 3). A test that lets a
/// timer fire (a keep-alive) or gives something a fixed time to happen widens it by this.
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

/// `d` times [`time_scale`].
pub fn scaled(d: std::time::Duration) -> std::time::Duration {
    d * time_scale()
}

/// A keep-alive timeout of `ms` milliseconds (a Connect's KATO) times [`time_scale`].
pub fn scaled_ms(ms: u32) -> u32 {
    ms * time_scale()
}

/// A temp dir on tmpfs where there is one (it takes `O_DIRECT`, as a drive does), else the
/// default temp dir: for pools whose data path should run as on a drive.
pub fn tmpfs_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// Waits until `state`'s pool is open; after [`POOL_READY`] panics saying whose pool it awaited.
pub async fn pool_ready(state: &edgevol_appliance::state::State) {
    if let Err(e) = state.wait_ready(scaled(POOL_READY)).await {
        panic!("{e}");
    }
}

/// A dev appliance on an ephemeral port with its data dir in a temp dir.
pub struct DevAppliance {
    pub dir: tempfile::TempDir,
    pub running: Running,
}

impl DevAppliance {
    pub async fn start() -> DevAppliance {
        Self::start_with(|_| {}).await
    }

    /// A dev appliance whose configuration `change` adjusts first.
    pub async fn start_with(change: impl FnOnce(&mut Config)) -> DevAppliance {
        let dir = tempfile::tempdir().unwrap();
        let mut config = dev_config(dir.path(), "127.0.0.1:0".parse().unwrap());
        change(&mut config);
        let running = start(config).await.unwrap();
        DevAppliance { dir, running }
    }

    /// Waits until its pool is open ([`pool_ready`]), so calls do not meet UNAVAILABLE.
    pub async fn ready(&self) {
        pool_ready(&self.running.state).await;
    }

    pub fn pki(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    pub fn addr(&self) -> SocketAddr {
        self.running.local_addr
    }

    /// The client TLS configuration of the dev certificate pair `name`.
    pub fn client_tls(&self, name: &str) -> Arc<ClientConfig> {
        tls_for(
            &self.pki(),
            &self.pki().join(format!("{name}.pem")),
            &self.pki().join(format!("{name}.key")),
        )
    }

    pub async fn channel(&self, name: &str) -> Channel {
        channel(self.addr(), self.client_tls(name)).await
    }
}

pub fn dev_config(dir: &Path, listen: SocketAddr) -> Config {
    Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.to_path_buf()),
        listen: Some(listen),
        nvme_listen: Some("127.0.0.1:0".parse().unwrap()),
        appliance_id: Some("test-box".into()),
        // These tests' hosts hold no DH-HMAC-CHAP keys; tests/host_auth.rs runs the default.
        nvme_allow_unauthenticated_hosts: Some(true),
        ..Args::default()
    })
    .unwrap()
}

pub fn tls_for(pki: &Path, cert: &Path, key: &Path) -> Arc<ClientConfig> {
    client_config(TlsFiles {
        ca: &pki.join("ca.pem"),
        cert,
        key,
    })
    .unwrap()
}

/// A gRPC channel over our own TLS connector (tonic's TLS is not compiled in: one TLS stack).
pub async fn channel(addr: SocketAddr, tls: Arc<ClientConfig>) -> Channel {
    try_channel(addr, tls).await.unwrap()
}

/// [`channel`], for callers that wait for a daemon to come up.
pub async fn try_channel(
    addr: SocketAddr,
    tls: Arc<ClientConfig>,
) -> Result<Channel, ChannelError> {
    MtlsTarget::new(&addr.to_string(), Some("localhost"), tls)
        .unwrap()
        .channel(CONNECT_TIMEOUT, None)
        .await
}

/// A 1 MiB single-node block volume named `name`: the request load tests and benches repeat.
pub fn block_volume(name: String) -> edgevol_proto::csi::v1::CreateVolumeRequest {
    use edgevol_proto::csi::v1::volume_capability::access_mode::Mode;
    use edgevol_proto::csi::v1::volume_capability::{AccessMode, AccessType, BlockVolume};
    use edgevol_proto::csi::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};
    CreateVolumeRequest {
        name,
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }],
        ..Default::default()
    }
}

/// The bytes of `len` at `offset` of volume `id`, read through core's mapping and the pool device
/// (holes as zeros): what the volume holds, independently of the data path under test.
pub async fn volume_bytes(
    state: &Arc<edgevol_appliance::state::State>,
    id: edgevol_core::VolumeId,
    offset: u64,
    len: u64,
) -> Vec<u8> {
    use edgevol_core::{BlockDevice, ReadSegment};
    state
        .on_pool(move |_, pool| {
            let segs: Vec<_> = pool.map_read(id, offset, len).unwrap().collect();
            let bs = u64::from(pool.device_mut().block_size());
            let mut out = Vec::new();
            for s in segs {
                match s {
                    ReadSegment::Data { device_offset, len } => {
                        let mut buf = vec![0u8; usize::try_from(len).unwrap()];
                        pool.device_mut()
                            .read(device_offset / bs, &mut buf)
                            .unwrap();
                        out.extend(buf);
                    }
                    ReadSegment::Zero { len } => {
                        out.extend(vec![0u8; usize::try_from(len).unwrap()]);
                    }
                }
            }
            out
        })
        .await
        .unwrap()
}

/// Enrols `host_nqn` for node `node` in `running`'s host-key store the way the Enrol RPC does,
/// with the node certificate `node` of the PKI in `pki` (issued first if missing): its pair.
pub fn enrol_node(
    running: &Running,
    pki: &Path,
    node: &str,
    host_nqn: &str,
) -> edgevol_appliance::hostkeys::HostKey {
    let cert = pki.join(format!("{node}.pem"));
    if !cert.exists() {
        edgevol_pki::files::issue(
            pki,
            edgevol_pki::Role::Node,
            node,
            edgevol_pki::Validity::days(1),
            false,
        )
        .unwrap();
    }
    let certs = edgevol_pki::tls::load_certs(&cert).unwrap();
    let fp = edgevol_appliance::transport::certificate_sha256(&certs[0]);
    running.host_keys.enrol(node, fp, host_nqn).unwrap().key
}

/// An appliance in this process whose NVMe/TCP target a QEMU guest reaches at 10.0.2.2 (slirp),
/// with its pool open. The pinned 6.1 guest kernel has no NVMe in-band authentication: hosts
/// connect unauthenticated (tests/nvme_auth_qemu.rs is DH-HMAC-CHAP on 6.12).
pub async fn qemu_appliance(dir: &Path, appliance_id: &str) -> Running {
    let config = Config::from_args(Args {
        dev: true,
        data_dir: Some(dir.to_path_buf()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        nvme_listen: Some("0.0.0.0:0".parse().unwrap()),
        nvme_advertise: Some("10.0.2.2".parse().unwrap()),
        appliance_id: Some(appliance_id.into()),
        nvme_allow_unauthenticated_hosts: Some(true),
        ..Args::default()
    })
    .unwrap();
    let running = start(config).await.unwrap();
    pool_ready(&running.state).await;
    running
}

/// The QEMU cache (kernels, logs): `EDGEVOL_QEMU_CACHE` or qemu/.cache, with its logs/ made.
pub fn qemu_cache() -> PathBuf {
    // Set but empty counts as unset, as in scripts/lib.sh.
    let cache = std::env::var_os("EDGEVOL_QEMU_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("qemu/.cache"));
    std::fs::create_dir_all(cache.join("logs")).unwrap();
    cache
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}
