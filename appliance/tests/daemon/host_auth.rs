//! In-band authentication on the data path (DH-HMAC-CHAP) with the default policy: every queue
//! of an enrolled host authenticates before anything but Fabrics commands runs, a host without
//! keys is refused, and wrong keys, rotation, revocation and repeated failures behave as a user
//! of a secure target expects. The host side is nvmeof's Linux-like test host on loopback TCP.

use crate::common;
use crate::nvme_host;

use std::net::SocketAddr;
use std::time::Duration;

use common::DevAppliance;
use edgevol_appliance::config::HostAuthPolicy;
use edgevol_appliance::hostkeys::{HostKey, HostKeys, Secret};
use edgevol_appliance::naming;
use edgevol_core::{VolumeId, VolumeSpec};
use edgevol_nvmeof::auth::host::{Host, HostConfig, HostError};
use edgevol_nvmeof::auth::messages::Reason;
use edgevol_nvmeof::auth::{DhGroup, HashId};
use edgevol_nvmeof::fabrics_cmd::CNTLID_DYNAMIC;
use edgevol_nvmeof::pdu::Digests;
use nvme_host::{io, ok, status, Admin, AuthEnd, Ended, Queue, WAIT};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:a0a0a0a0-1111-2222-3333-444444444444";
const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:b0b0b0b0-1111-2222-3333-444444444444";
const MIB: u64 = 1 << 20;
/// Connect response bit 17: the queue must authenticate.
const ATR: u64 = 1 << 17;

struct Fixture {
    app: DevAppliance,
    addr: SocketAddr,
}

impl Fixture {
    /// The default policy: authentication required.
    async fn start() -> Fixture {
        Self::start_with(|_| {}).await
    }

    /// Authentication required, with `change` applied to the policy.
    async fn start_with(change: impl FnOnce(&mut HostAuthPolicy)) -> Fixture {
        let app = DevAppliance::start_with(|c| {
            c.host_auth.allow_unauthenticated_hosts = false;
            change(&mut c.host_auth);
        })
        .await;
        app.ready().await;
        let addr = app.running.target.endpoint;
        Fixture { app, addr }
    }

    /// A volume published to `hosts`, and its subsystem NQN.
    async fn volume(&self, hosts: &[&str]) -> (VolumeId, String) {
        let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let id = self
            .app
            .running
            .state
            .on_pool(move |_, pool| {
                let mut spec = VolumeSpec::new("secure", 4 * MIB);
                spec.access_modes = edgevol_core::AccessModes::EMPTY
                    .with(edgevol_core::AccessMode::MultiNodeMultiWriter);
                let id = pool.create_volume(spec).unwrap();
                for h in &hosts {
                    pool.publish(id, h, false).unwrap();
                }
                id
            })
            .await
            .unwrap();
        (id, naming::subsystem_nqn("test-box", id))
    }

    /// Enrols `host_nqn` for node `node` (a node certificate of the dev PKI): its pair.
    fn enrol(&self, node: &str, host_nqn: &str) -> HostKey {
        common::enrol_node(&self.app.running, &self.app.pki(), node, host_nqn)
    }

    fn failures(&self) -> u64 {
        self.app
            .running
            .target
            .auth
            .failed
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Waits for the store to drop the old pair of a completed rotation (`confirm` runs off the
/// reactor after the authentication).
async fn old_pair_dropped(keys: &HostKeys) {
    tokio::time::timeout(WAIT, async {
        while keys.keys_for(HOST).len() != 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the old pair is dropped");
}

fn host(host_nqn: &str, subsys: &str, key: &HostKey) -> Host {
    Host::new(HostConfig::linux(
        host_nqn,
        subsys,
        key.host_secret.clone(),
        Some(key.ctrl_secret.clone()),
    ))
}

fn random_secret() -> Secret {
    let mut rng = edgevol_nvmeof::auth::host::TestRng::new(99);
    Secret::generate_for(HashId::Sha256, &mut rng)
}

/// Connects an admin queue by hand (no enable): the completion.
async fn raw_admin(addr: SocketAddr, subsys: &str, host_nqn: &str) -> (Queue, u64) {
    let mut q = Queue::open(addr, Digests::NONE, 8192).await;
    let c = q
        .connect(0, CNTLID_DYNAMIC, subsys, host_nqn, common::scaled_ms(5000))
        .await;
    ok(&c);
    (q, c.cqe.result)
}

async fn expect_closed(q: &mut Queue) {
    let ended = tokio::time::timeout(WAIT, q.wait_closed()).await;
    assert!(
        matches!(ended, Ok(Ended::Eof | Ended::TermReq)),
        "connection closes"
    );
}

fn auth_required(c: &edgevol_nvmeof::initiator::Completed) {
    // Authentication Required: SCT 1h, SC 91h, DNR.
    assert_eq!(status(c), (1, 0x91, true), "{:?}", c.cqe.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_without_keys_is_refused() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let Err(refused) = Admin::connect(f.addr, &subsys, HOST, 0).await else {
        panic!("refused");
    };
    // Connect Invalid Host, DNR.
    assert_eq!(status(&refused), (1, 0x84, true));
    // Discovery too: every controller of this appliance needs authentication.
    let Err(refused) = Admin::connect(f.addr, naming::DISCOVERY_NQN, HOST, 0).await else {
        panic!("refused");
    };
    assert_eq!(status(&refused), (1, 0x84, true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_queue_authenticates_bidirectionally_before_it_is_used() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let key = f.enrol("node", HOST);

    let (mut q, result) = raw_admin(f.addr, &subsys, HOST).await;
    assert_eq!(
        result & ATR,
        ATR,
        "the admin Connect asks for authentication"
    );
    let cntlid = u16::try_from(result & 0xffff).unwrap();
    let mut admin = Admin { q, cntlid };
    // Fabrics commands run before authentication (the host enables the controller), the rest
    // do not.
    admin.enable().await;
    auth_required(&admin.identify(1, 0).await);
    admin
        .q
        .authenticate(&mut host(HOST, &subsys, &key), 1)
        .await
        .expect("admin queue authenticates");
    ok(&admin.identify(1, 0).await);

    q = Queue::open(f.addr, Digests::NONE, nvme_host::IO_IN_CAPSULE).await;
    let c = q.connect(1, cntlid, &subsys, HOST, 0).await;
    ok(&c);
    assert_eq!(c.cqe.result & ATR, ATR, "every I/O queue authenticates too");
    let (sqe, d) = io::read(0, 8);
    auth_required(&q.cmd(sqe, d).await);
    q.authenticate(&mut host(HOST, &subsys, &key), 2)
        .await
        .expect("I/O queue authenticates");
    let data = vec![0x3cu8; 4096];
    let (sqe, d) = io::write(0, &data, true);
    ok(&q.cmd(sqe, d).await);
    let (sqe, d) = io::read(0, 8);
    let read = q.cmd(sqe, d).await;
    ok(&read);
    assert!(
        read.data[..data.len()] == data[..],
        "reads back what it wrote"
    );

    // Re-authentication of the live admin queue (Linux does it when its keys change).
    admin
        .q
        .authenticate(&mut host(HOST, &subsys, &key), 3)
        .await
        .expect("re-authentication");
    ok(&admin.keep_alive().await);
    assert_eq!(f.failures(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_keys_fail_and_the_controller_goes() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST, OTHER]).await;
    let key = f.enrol("node", HOST);
    let other = f.enrol("node-2", OTHER);

    // A wrong host key: the target answers AUTH_Failure1 and drops the controller.
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    let wrong = HostKey {
        host_secret: random_secret(),
        ..key.clone()
    };
    let end = q.authenticate(&mut host(HOST, &subsys, &wrong), 1).await;
    assert!(
        matches!(end, Err(AuthEnd::Host(HostError::Stopped(Reason::Failed)))),
        "{end:?}"
    );
    expect_closed(&mut q).await;

    // Another node's keys under this host's NQN.
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    let end = q.authenticate(&mut host(HOST, &subsys, &other), 1).await;
    assert!(
        matches!(end, Err(AuthEnd::Host(HostError::Stopped(_)))),
        "{end:?}"
    );
    expect_closed(&mut q).await;

    // A wrong controller key: the host refuses the controller's answer (AUTH_Failure2).
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    let wrong_ctrl = HostKey {
        ctrl_secret: random_secret(),
        ..key.clone()
    };
    let end = q
        .authenticate(&mut host(HOST, &subsys, &wrong_ctrl), 1)
        .await;
    assert!(
        matches!(end, Err(AuthEnd::Host(HostError::Refused { .. }))),
        "{end:?}"
    );
    expect_closed(&mut q).await;
    assert_eq!(f.failures(), 3);

    // The right keys still work.
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    q.authenticate(&mut host(HOST, &subsys, &key), 1)
        .await
        .expect("right keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_the_old_key_until_the_new_one_is_used_and_revocation_disconnects() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let old = f.enrol("node", HOST);
    let keys = f.app.running.host_keys.clone();
    let generation = keys.rotate("node").unwrap();
    let new = keys
        .keys_for(HOST)
        .into_iter()
        .find(|k| k.generation == generation)
        .expect("new pair");

    // Both work while the rotation is pending.
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    q.authenticate(&mut host(HOST, &subsys, &old), 1)
        .await
        .expect("old key during the rotation");
    assert_eq!(keys.keys_for(HOST).len(), 2);
    // Using the new one completes the rotation; the live queue re-authenticates with it.
    q.authenticate(&mut host(HOST, &subsys, &new), 2)
        .await
        .expect("new key");
    old_pair_dropped(&keys).await;
    let (mut stale, _) = raw_admin(f.addr, &subsys, HOST).await;
    let end = stale.authenticate(&mut host(HOST, &subsys, &old), 1).await;
    assert!(end.is_err(), "the old key no longer works");

    // Revocation: the live controller goes, and the host cannot come back.
    keys.revoke("node").unwrap();
    expect_closed(&mut q).await;
    let mut again = Queue::open(f.addr, Digests::NONE, 8192).await;
    let c = again
        .connect(0, CNTLID_DYNAMIC, &subsys, HOST, common::scaled_ms(5000))
        .await;
    assert_eq!(status(&c), (1, 0x84, true), "a revoked host is refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_failures_turn_the_address_away() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let key = f.enrol("node", HOST);
    let wrong = HostKey {
        host_secret: random_secret(),
        ..key.clone()
    };
    for i in 0..edgevol_appliance::nvme::auth::MAX_STRIKES {
        let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
        let end = q.authenticate(&mut host(HOST, &subsys, &wrong), 1).await;
        assert!(end.is_err(), "attempt {i}");
    }
    // Even the right key waits now: Connect Controller Busy, without DNR (a host retries).
    let mut q = Queue::open(f.addr, Digests::NONE, 8192).await;
    let c = q
        .connect(0, CNTLID_DYNAMIC, &subsys, HOST, common::scaled_ms(5000))
        .await;
    assert_eq!(status(&c), (1, 0x81, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_hashes_and_groups_are_the_only_ones_taken() {
    let f = Fixture::start_with(|p| {
        p.hashes = vec![HashId::Sha384];
        p.dh_groups = vec![DhGroup::Ffdhe3072];
    })
    .await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let key = f.enrol("node", HOST);
    // Linux offers every hash and group: the target picks its own.
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    q.authenticate(&mut host(HOST, &subsys, &key), 1)
        .await
        .expect("SHA-384 with ffdhe3072");
    // A host offering only SHA-256 finds no usable hash.
    let mut config = HostConfig::linux(
        HOST,
        &subsys,
        key.host_secret.clone(),
        Some(key.ctrl_secret.clone()),
    );
    config.hashes = vec![HashId::Sha256];
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    let end = q.authenticate(&mut Host::new(config), 1).await;
    assert!(
        matches!(
            end,
            Err(AuthEnd::Host(HostError::Stopped(Reason::HashUnusable)))
        ),
        "{end:?}"
    );
}

/// What Linux's host does with a rotated pair (found against the 6.12 kernel in QEMU,
/// tests/nvme_auth_qemu.rs): it takes `dhchap_ctrl_secret` and `dhchap_secret` one sysfs write
/// at a time and re-authenticates the live controller after each, so one re-authentication runs
/// with the old host key and the new controller key. The target answers with the old pair's
/// controller key, the host refuses it (AUTH_Failure2, "controller authentication failed"). The
/// controller used to be failed then, and Linux reconnected 10 s later with I/O stalled
/// meanwhile; now the queue stays authenticated and the next re-authentication, with the whole
/// new pair, completes the rotation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_authentication_the_host_ends_over_the_controller_key_keeps_the_queue() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let old = f.enrol("node", HOST);
    let (q, result) = raw_admin(f.addr, &subsys, HOST).await;
    let cntlid = u16::try_from(result & 0xffff).unwrap();
    let mut admin = Admin { q, cntlid };
    admin.enable().await;
    admin
        .q
        .authenticate(&mut host(HOST, &subsys, &old), 1)
        .await
        .expect("first authentication");
    let keys = f.app.running.host_keys.clone();
    let generation = keys.rotate("node").unwrap();
    let new = keys
        .keys_for(HOST)
        .into_iter()
        .find(|k| k.generation == generation)
        .expect("new pair");

    // Half applied: the new controller key, still the old host key.
    let half = HostKey {
        ctrl_secret: new.ctrl_secret.clone(),
        ..old.clone()
    };
    let end = admin
        .q
        .authenticate(&mut host(HOST, &subsys, &half), 2)
        .await;
    assert!(
        matches!(end, Err(AuthEnd::Host(HostError::Refused { .. }))),
        "the host refuses the old pair's controller response: {end:?}"
    );
    // The controller and the queue's authentication stay; the failure is counted.
    ok(&admin.keep_alive().await);
    ok(&admin.identify(1, 0).await);
    assert_eq!(f.failures(), 1);
    assert_eq!(
        keys.keys_for(HOST).len(),
        2,
        "the rotation is still pending"
    );

    // The whole new pair: the rotation completes.
    admin
        .q
        .authenticate(&mut host(HOST, &subsys, &new), 3)
        .await
        .expect("the new pair");
    old_pair_dropped(&keys).await;
    ok(&admin.keep_alive().await);

    // A first authentication the host ends so still fails the controller.
    let (mut q, _) = raw_admin(f.addr, &subsys, HOST).await;
    let stale_ctrl = HostKey {
        ctrl_secret: old.ctrl_secret.clone(),
        ..new.clone()
    };
    let end = q
        .authenticate(&mut host(HOST, &subsys, &stale_ctrl), 1)
        .await;
    assert!(
        matches!(end, Err(AuthEnd::Host(HostError::Refused { .. }))),
        "{end:?}"
    );
    expect_closed(&mut q).await;
    ok(&admin.keep_alive().await);
}

/// A host whose side of the exchange takes longer than its KATO (Linux's 6.12 host in a TCG
/// guest with ffdhe6144: more than its 5 s KATO; found in tests/nvme_auth_qemu.rs, where the
/// target tore the controller down, "keep-alive expired", and the host waited out its 60 s admin
/// command timeout): the keep-alive timer waits for the first authentication, and the
/// transaction timeout is at least 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_slower_than_its_kato_still_authenticates() {
    let f = Fixture::start().await;
    let (_, subsys) = f.volume(&[HOST]).await;
    let key = f.enrol("node", HOST);
    let mut q = Queue::open(f.addr, Digests::NONE, 8192).await;
    // A 1 s KATO, times the load's scale: enable and Identify after the exchange come within it.
    let c = q
        .connect(0, CNTLID_DYNAMIC, &subsys, HOST, common::scaled_ms(1000))
        .await;
    ok(&c);
    let cntlid = u16::try_from(c.cqe.result & 0xffff).unwrap();
    let mut h = host(HOST, &subsys, &key);
    let mut rng = edgevol_nvmeof::auth::host::TestRng::new(5);
    q.auth_send(h.negotiate(1)).await.expect("negotiate");
    let challenge = q.auth_receive().await.expect("challenge");
    // The host's DH, slowly: well past the KATO (2.5 times it).
    tokio::time::sleep(common::scaled(Duration::from_millis(2500))).await;
    let reply = h.handle_challenge(&challenge, &mut rng).expect("reply");
    q.auth_send(reply).await.expect("reply sent");
    let success1 = q.auth_receive().await.expect("success1");
    let success2 = h
        .handle_success1(&success1)
        .expect("controller authenticated")
        .expect("bidirectional");
    q.auth_send(success2).await.expect("success2");
    let mut admin = Admin { q, cntlid };
    admin.enable().await;
    ok(&admin.identify(1, 0).await);
    assert_eq!(f.failures(), 0);
    // Authenticated, the keep-alive timer runs again: a KATO without traffic ends the controller.
    expect_closed(&mut admin.q).await;
}
