//! A target on loopback serving one volume, with a host connected to it: the set-up of the
//! target's own end-to-end tests.

use std::net::SocketAddr;
use std::sync::Arc;

use edgevol_core::{VolumeId, VolumeSpec};
use edgevol_nvmeof::pdu::Digests;
use tempfile::TempDir;

use crate::config::NvmeConfig;
use crate::nvme::test_host::{Admin, Queue};
use crate::nvme::Target;
use crate::state::State;

/// What [`serve_one_volume`] set up.
pub struct Loopback {
    /// Holds the pool's file (and the host keys): keep it until the test ends.
    pub dir: TempDir,
    /// The appliance's state, with the pool.
    pub state: Arc<State>,
    /// The running target.
    pub target: Target,
    /// The volume.
    pub id: VolumeId,
    /// Where the target listens.
    pub addr: SocketAddr,
    /// The volume's subsystem NQN.
    pub nqn: String,
    /// The host's admin queue.
    pub admin: Admin,
    /// The host's I/O queue 1.
    pub q: Queue,
}

/// A file pool with a 1 MiB volume `name` published to `host`, served on loopback (no I/O
/// threads at start, unauthenticated hosts allowed), and `host` connected with I/O queue 1.
pub async fn serve_one_volume(host: &str, name: &str) -> Loopback {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = crate::pool::open(&[dir.path().join("pool.img")], true).unwrap();
    let id = pool.create_volume(VolumeSpec::new(name, 1 << 20)).unwrap();
    pool.publish(id, host, false).unwrap();
    let state = Arc::new(State::new("box".into(), Default::default()));
    state.set_pool(pool);
    let target = crate::nvme::start(
        state.clone(),
        &NvmeConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: "127.0.0.1".parse().unwrap(),
            io_threads: 0,
            io_cpus: Vec::new(),
            busy_poll: std::time::Duration::from_micros(crate::config::DEFAULT_BUSY_POLL_US),
        },
        crate::nvme::auth::HostAuth::new(
            Arc::new(crate::hostkeys::HostKeys::open(dir.path()).unwrap()),
            crate::config::HostAuthPolicy {
                allow_unauthenticated_hosts: true,
                ..Default::default()
            },
        ),
    )
    .await
    .unwrap();
    let (addr, nqn) = (target.endpoint, crate::naming::subsystem_nqn("box", id));
    let admin = Admin::connect(addr, &nqn, host, 0).await.unwrap();
    let q = admin
        .io_queue(addr, 1, &nqn, host, Digests::NONE)
        .await
        .unwrap();
    Loopback {
        dir,
        state,
        target,
        id,
        addr,
        nqn,
        admin,
        q,
    }
}
