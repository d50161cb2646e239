//! Whole transactions: the Linux-like host of `host.rs` against the target, through the AUTH
//! SQEs as the transport hands them over, for every hash and DH group and for each way one can
//! fail.

use core::time::Duration;

use super::host::{Host, HostConfig, HostError, TestRng};
use super::messages::{
    auth_id, Challenge, Message, Negotiate, Protocol, Reason, Reply, Success2, PROTOCOL_DHCHAP,
};
use super::*;
use crate::status::{Status, StatusCode};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const SUBNQN: &str = "nqn.2024-11.io.edgevol:box-7:v3";
const AL: u32 = 4096;

fn secret(hash: HashId, byte: u8) -> Secret {
    Secret::from_key(Some(hash), &vec![byte; hash.digest_len()]).unwrap()
}

fn host_key() -> Secret {
    secret(HashId::Sha256, 0x11)
}

fn ctrl_key() -> Secret {
    secret(HashId::Sha384, 0x22)
}

fn pair() -> KeyPair {
    KeyPair {
        host: host_key(),
        controller: Some(ctrl_key()),
    }
}

/// Target, host, generator and clock of one queue.
struct Rig {
    target: Authenticator,
    host: Host,
    rng: TestRng,
    now: Duration,
}

impl Rig {
    fn new(config: TargetConfig, host: HostConfig) -> Self {
        Rig {
            target: Authenticator::new(config).unwrap(),
            host: Host::new(host),
            rng: TestRng::new(7),
            now: Duration::from_secs(100),
        }
    }

    fn default_pair() -> Self {
        Rig::new(
            TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
            HostConfig::linux(HOSTNQN, SUBNQN, host_key(), Some(ctrl_key())),
        )
    }

    /// AUTH_Send through its SQE.
    fn send(&mut self, data: &[u8]) -> Result<Outcome, Status> {
        let sqe = AuthCommand::Send {
            tl: u32::try_from(data.len()).unwrap(),
        }
        .to_sqe(1);
        let cmd = AuthCommand::parse(&sqe)?;
        self.target.on_auth_send(&cmd, data, self.now)
    }

    /// The host's Negotiate for transaction `t_id`, sent.
    fn start(&mut self, t_id: u16) -> Result<Outcome, Status> {
        let neg = self.host.negotiate(t_id);
        self.send(&neg)
    }

    /// AUTH_Receive through its SQE.
    fn receive_al(&mut self, al: u32) -> Result<(Outcome, Vec<u8>), Status> {
        let cmd = AuthCommand::parse(&AuthCommand::Receive { al }.to_sqe(2))?;
        let mut buf = vec![0xee; 3];
        let outcome = self
            .target
            .on_auth_receive(&cmd, self.now, &mut self.rng, &mut buf)?;
        assert_eq!(
            buf.len(),
            al as usize,
            "AUTH_Receive data is exactly AL bytes"
        );
        Ok((outcome, buf))
    }

    fn receive(&mut self) -> (Outcome, Vec<u8>) {
        self.receive_al(AL).expect("receive completes")
    }

    /// Linux's host transaction from Negotiate to the end. `Ok` with the target's last outcome
    /// when the host finished without error.
    fn transaction(&mut self, t_id: u16) -> Result<Authenticated, (Outcome, Option<HostError>)> {
        let neg = self.host.negotiate(t_id);
        assert_eq!(self.send(&neg), Ok(Outcome::Continue));
        let (o, challenge) = self.receive();
        if o != Outcome::Continue {
            return Err((
                o,
                self.host.handle_challenge(&challenge, &mut self.rng).err(),
            ));
        }
        let reply = match self.host.handle_challenge(&challenge, &mut self.rng) {
            Ok(r) => r,
            Err(e) => {
                let o = match &e {
                    HostError::Refused { failure2, .. } => self.send(failure2).unwrap(),
                    HostError::Stopped(_) => Outcome::Continue,
                };
                return Err((o, Some(e)));
            }
        };
        assert_eq!(self.send(&reply), Ok(Outcome::Continue));
        let (o, success1) = self.receive();
        match self.host.handle_success1(&success1) {
            Ok(None) => match o {
                Outcome::Authenticated(a) => Ok(a),
                o => Err((o, None)),
            },
            Ok(Some(success2)) => {
                assert_eq!(o, Outcome::Continue, "bidirectional waits for Success2");
                match self.send(&success2).unwrap() {
                    Outcome::Authenticated(a) => Ok(a),
                    o => Err((o, None)),
                }
            }
            Err(e) => {
                let o = match (&e, o) {
                    (HostError::Refused { failure2, .. }, Outcome::Continue) => {
                        self.send(failure2).unwrap()
                    }
                    (_, o) => o,
                };
                Err((o, Some(e)))
            }
        }
    }
}

fn failed(reason: Reason, by_host: bool) -> Outcome {
    Outcome::Failed(Failed { reason, by_host })
}

#[test]
fn every_hash_and_dh_group_authenticates_both_ways() {
    for hash in HashId::ALL {
        for group in DhGroup::ALL {
            let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]);
            config.hashes = vec![hash];
            config.dh_groups = vec![group];
            let mut rig = Rig::new(
                config,
                HostConfig::linux(HOSTNQN, SUBNQN, host_key(), Some(ctrl_key())),
            );
            assert!(!rig.target.is_authenticated());
            let a = rig
                .transaction(u16::from(group.id()) << 4 | u16::from(hash.id()))
                .unwrap_or_else(|e| panic!("{hash} {group}: {e:?}"));
            assert_eq!(
                a,
                Authenticated {
                    key_index: 0,
                    hash,
                    dh_group: group,
                    bidirectional: true,
                    reauthentication: false,
                }
            );
            assert!(rig.target.is_authenticated());
            assert_eq!(rig.target.poll_timeout(), None);
        }
    }
}

#[test]
fn unidirectional_ends_with_success1() {
    for group in [DhGroup::Null, DhGroup::Ffdhe3072] {
        let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]);
        config.dh_groups = vec![group];
        let mut rig = Rig::new(config, HostConfig::linux(HOSTNQN, SUBNQN, host_key(), None));
        let a = rig.transaction(1).unwrap();
        assert!(!a.bidirectional);
        assert_eq!((a.hash, a.dh_group), (HashId::Sha256, group));
        assert!(rig.target.is_authenticated());
    }
}

#[test]
fn target_preference_decides_what_the_host_offers() {
    // Linux offers everything: the target's first choice wins.
    let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]);
    config.hashes = vec![HashId::Sha512, HashId::Sha256];
    config.dh_groups = vec![DhGroup::Ffdhe4096, DhGroup::Null];
    let mut rig = Rig::new(
        config,
        HostConfig::linux(HOSTNQN, SUBNQN, host_key(), Some(ctrl_key())),
    );
    let a = rig.transaction(3).unwrap();
    assert_eq!((a.hash, a.dh_group), (HashId::Sha512, DhGroup::Ffdhe4096));
}

#[test]
fn wrong_host_key_gets_failure1() {
    let mut rig = Rig::new(
        TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
        HostConfig::linux(
            HOSTNQN,
            SUBNQN,
            secret(HashId::Sha256, 0x12),
            Some(ctrl_key()),
        ),
    );
    let (o, e) = rig.transaction(1).unwrap_err();
    assert_eq!(o, failed(Reason::Failed, false));
    assert_eq!(e, Some(HostError::Stopped(Reason::Failed)));
    assert!(!rig.target.is_authenticated());
    // The controller is failed: no more AUTH commands.
    assert_eq!(rig.start(2), Err(StatusCode::CommandSequenceError.status()));
    assert_eq!(
        rig.receive_al(AL),
        Err(StatusCode::CommandSequenceError.status())
    );
}

#[test]
fn another_hosts_nqn_with_the_right_key_fails() {
    // The key is bound to the NQN through the transform and the response.
    let mut rig = Rig::new(
        TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
        HostConfig::linux(
            "nqn.2014-08.org.nvmexpress:uuid:other",
            SUBNQN,
            host_key(),
            None,
        ),
    );
    let (o, _) = rig.transaction(1).unwrap_err();
    assert_eq!(o, failed(Reason::Failed, false));
}

#[test]
fn wrong_controller_key_is_refused_by_the_host() {
    let mut rig = Rig::new(
        TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
        HostConfig::linux(
            HOSTNQN,
            SUBNQN,
            host_key(),
            Some(secret(HashId::Sha384, 0x23)),
        ),
    );
    let (o, e) = rig.transaction(1).unwrap_err();
    assert!(matches!(
        e,
        Some(HostError::Refused {
            reason: Reason::Failed,
            ..
        })
    ));
    // The host's Failure2 ends it on the target side.
    assert_eq!(o, failed(Reason::Failed, true));
    assert!(!rig.target.is_authenticated());
}

/// A re-authentication the host ends over the controller's response (Linux with a rotated pair
/// half applied: the new controller key, still the old host key): the host proved its key, so
/// the queue stays authenticated and the controller is not failed; the next transaction runs.
#[test]
fn a_re_authentication_the_host_ends_over_the_controller_key_keeps_the_queue() {
    let mut rig = Rig::default_pair();
    rig.transaction(1).expect("first authentication");
    rig.host = Host::new(HostConfig::linux(
        HOSTNQN,
        SUBNQN,
        host_key(),
        Some(secret(HashId::Sha384, 0x23)),
    ));
    let (o, e) = rig.transaction(2).unwrap_err();
    assert!(matches!(e, Some(HostError::Refused { .. })), "{e:?}");
    assert_eq!(
        o,
        Outcome::ControllerRejected(Failed {
            reason: Reason::Failed,
            by_host: true,
        })
    );
    assert!(rig.target.is_authenticated());
    assert_eq!(rig.target.poll_timeout(), None);
    rig.host = Host::new(HostConfig::linux(
        HOSTNQN,
        SUBNQN,
        host_key(),
        Some(ctrl_key()),
    ));
    let a = rig.transaction(3).expect("the next re-authentication");
    assert!(a.reauthentication);
}

#[test]
fn bidirectional_without_a_controller_key_is_refused() {
    let mut rig = Rig::new(
        TargetConfig::new(
            HOSTNQN,
            SUBNQN,
            vec![KeyPair {
                host: host_key(),
                controller: None,
            }],
        ),
        HostConfig::linux(HOSTNQN, SUBNQN, host_key(), Some(ctrl_key())),
    );
    let (o, e) = rig.transaction(1).unwrap_err();
    assert_eq!(o, failed(Reason::Failed, false));
    assert_eq!(e, Some(HostError::Stopped(Reason::Failed)));
}

#[test]
fn key_rotation_reports_the_pair_that_matched() {
    let old = pair();
    let new = KeyPair {
        host: secret(HashId::Sha512, 0x33),
        controller: Some(secret(HashId::Sha512, 0x44)),
    };
    for (host, ctrl, want) in [
        (old.host.clone(), old.controller.clone(), 0),
        (new.host.clone(), new.controller.clone(), 1),
    ] {
        let mut rig = Rig::new(
            TargetConfig::new(HOSTNQN, SUBNQN, vec![old.clone(), new.clone()]),
            HostConfig::linux(HOSTNQN, SUBNQN, host, ctrl),
        );
        assert_eq!(rig.transaction(9).unwrap().key_index, want);
    }
}

#[test]
fn reauthentication_on_a_live_queue() {
    let mut rig = Rig::default_pair();
    assert!(!rig.transaction(1).unwrap().reauthentication);
    // The queue stays authenticated while the next transaction runs.
    let neg = rig.host.negotiate(2);
    assert_eq!(rig.send(&neg), Ok(Outcome::Continue));
    assert!(rig.target.is_authenticated());
    let (_, challenge) = rig.receive();
    let reply = rig.host.handle_challenge(&challenge, &mut rig.rng).unwrap();
    assert_eq!(rig.send(&reply), Ok(Outcome::Continue));
    let (_, success1) = rig.receive();
    let success2 = rig.host.handle_success1(&success1).unwrap().unwrap();
    let Ok(Outcome::Authenticated(a)) = rig.send(&success2) else {
        panic!("re-authenticated")
    };
    assert!(a.reauthentication);

    // After a rotation that retired its key, the host's next re-authentication fails and the
    // queue loses its authentication.
    rig.target
        .set_keys(vec![KeyPair {
            host: secret(HashId::Sha256, 0x55),
            controller: None,
        }])
        .unwrap();
    let (o, _) = rig.transaction(3).unwrap_err();
    assert_eq!(o, failed(Reason::Failed, false));
    assert!(!rig.target.is_authenticated());
}

#[test]
fn a_new_negotiate_restarts_a_transaction_in_progress() {
    let mut rig = Rig::default_pair();
    let neg = rig.host.negotiate(1);
    assert_eq!(rig.send(&neg), Ok(Outcome::Continue));
    let _ = rig.receive();
    // The host gives up on transaction 1 and starts 2.
    assert_eq!(rig.transaction(2).map(|a| a.key_index), Ok(0));
}

#[test]
fn wrong_t_id_gets_failure1_incorrect_payload() {
    let mut rig = Rig::default_pair();
    let neg = rig.host.negotiate(5);
    assert_eq!(rig.send(&neg), Ok(Outcome::Continue));
    let (_, challenge) = rig.receive();
    let mut reply = rig.host.handle_challenge(&challenge, &mut rig.rng).unwrap();
    reply[4] = 6;
    assert_eq!(rig.send(&reply), Ok(Outcome::Continue));
    let (o, data) = rig.receive();
    assert_eq!(o, failed(Reason::IncorrectPayload, false));
    assert_eq!(&data[..8], &[0x00, 0xf1, 0, 0, 5, 0, 0x01, 0x06]);
    assert!(data[8..].iter().all(|&b| b == 0));
}

fn negotiate_bytes(m: &Negotiate) -> Vec<u8> {
    Message::Negotiate(m.clone()).to_bytes()
}

fn linux_negotiate() -> Negotiate {
    Negotiate {
        t_id: 4,
        sc_c: 0,
        protocols: vec![Protocol {
            auth_id: PROTOCOL_DHCHAP,
            hash_ids: vec![1, 2, 3],
            dh_group_ids: vec![0, 1, 2, 3, 4, 5],
        }],
    }
}

#[test]
fn refused_negotiations_carry_linux_reason_codes() {
    let only_sha512 = {
        let mut c = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]);
        c.hashes = vec![HashId::Sha512];
        c
    };
    let mut unknown_hash = linux_negotiate();
    unknown_hash.protocols[0].hash_ids = vec![1, 7];
    let mut unknown_group = linux_negotiate();
    unknown_group.protocols[0].dh_group_ids = vec![9];
    let mut concat = linux_negotiate();
    concat.sc_c = 1;
    let mut two = linux_negotiate();
    two.protocols.push(two.protocols[0].clone());
    let mut other_protocol = linux_negotiate();
    other_protocol.protocols[0].auth_id = 2;
    let cases: Vec<(TargetConfig, Vec<u8>, Reason)> = vec![
        (
            only_sha512,
            negotiate_bytes(&unknown_hash),
            Reason::HashUnusable,
        ),
        (
            TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
            negotiate_bytes(&unknown_group),
            Reason::DhGroupUnusable,
        ),
        (
            TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
            negotiate_bytes(&concat),
            Reason::ConcatMismatch,
        ),
        (
            TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
            negotiate_bytes(&two),
            Reason::HashUnusable,
        ),
        (
            TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
            negotiate_bytes(&other_protocol),
            Reason::IncorrectPayload,
        ),
        (
            TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]),
            negotiate_bytes(&linux_negotiate())[..40].to_vec(),
            Reason::IncorrectPayload,
        ),
    ];
    for (config, bytes, reason) in cases {
        let mut rig = Rig::new(config, HostConfig::linux(HOSTNQN, SUBNQN, host_key(), None));
        assert_eq!(rig.send(&bytes), Ok(Outcome::Continue), "{reason}");
        let (o, data) = rig.receive();
        assert_eq!(o, failed(reason, false));
        assert_eq!(
            Message::decode(&data),
            Ok(Message::Failure1(messages::Failure::new(4, reason)))
        );
    }
}

#[test]
fn out_of_order_messages_fail_the_controller() {
    // A Reply before the challenge was read.
    let mut rig = Rig::default_pair();
    assert_eq!(rig.start(1), Ok(Outcome::Continue));
    let reply = Message::Reply(Reply {
        t_id: 1,
        response: vec![0; 32],
        cvalid: false,
        challenge: vec![0; 32],
        seqnum: 0,
        dh_value: vec![],
    })
    .to_bytes();
    assert_eq!(
        rig.send(&reply),
        Ok(failed(Reason::IncorrectMessage, false))
    );

    // An AUTH_Receive before any Negotiate: Failure1 "failed", as Linux.
    let mut rig = Rig::default_pair();
    let (o, data) = rig.receive();
    assert_eq!(o, failed(Reason::Failed, false));
    assert_eq!(&data[..2], &[0x00, auth_id::FAILURE1]);

    // Two receives in a row: the second comes while the host should reply.
    let mut rig = Rig::default_pair();
    assert_eq!(rig.start(1), Ok(Outcome::Continue));
    let _ = rig.receive();
    assert_eq!(rig.receive().0, failed(Reason::Failed, false));

    // A Success2 instead of the Reply, a Challenge sent by the host, an unknown type, a
    // message too short for its header.
    for bogus in [
        Message::Success2(Success2 { t_id: 1 }).to_bytes(),
        Message::Challenge(Challenge {
            t_id: 1,
            hash_id: 1,
            dh_group_id: 0,
            seqnum: 1,
            challenge: vec![0; 32],
            dh_value: vec![],
        })
        .to_bytes(),
        vec![0x02, 0x00, 0, 0, 1, 0, 0, 0],
        vec![0x00],
    ] {
        let mut rig = Rig::default_pair();
        assert_eq!(rig.start(1), Ok(Outcome::Continue));
        let (_, challenge) = rig.receive();
        rig.host.handle_challenge(&challenge, &mut rig.rng).unwrap();
        assert_eq!(
            rig.send(&bogus),
            Ok(failed(Reason::IncorrectMessage, false)),
            "{bogus:02x?}"
        );
    }
}

#[test]
fn reply_checks() {
    // Each case edits a valid Reply.
    type Edit = fn(&mut Reply, &Challenge);
    let cases: [(DhGroup, Edit, Reason); 6] = [
        (
            DhGroup::Null,
            |r, _| {
                r.response.pop();
            },
            Reason::Failed,
        ),
        (
            DhGroup::Null,
            |r, _| r.dh_value = vec![2; 256],
            Reason::IncorrectPayload,
        ),
        (
            DhGroup::Ffdhe2048,
            |r, _| r.dh_value.clear(),
            Reason::IncorrectPayload,
        ),
        (
            DhGroup::Ffdhe2048,
            |r, _| r.dh_value = vec![0xff; 256],
            Reason::DhGroupUnusable,
        ),
        (
            DhGroup::Ffdhe2048,
            |r, _| r.dh_value.truncate(255),
            Reason::DhGroupUnusable,
        ),
        // Reflection: the host's challenge is the controller's own.
        (
            DhGroup::Null,
            |r, c| r.challenge = c.challenge.clone(),
            Reason::Failed,
        ),
    ];
    for (i, (group, edit, reason)) in cases.into_iter().enumerate() {
        let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]);
        config.dh_groups = vec![group];
        let mut rig = Rig::new(
            config,
            HostConfig::linux(HOSTNQN, SUBNQN, host_key(), Some(ctrl_key())),
        );
        assert_eq!(rig.start(1), Ok(Outcome::Continue));
        let (_, ch_bytes) = rig.receive();
        let Ok(Message::Challenge(ch)) = Message::decode(&ch_bytes) else {
            panic!("a challenge")
        };
        let reply = rig.host.handle_challenge(&ch_bytes, &mut rig.rng).unwrap();
        let Ok(Message::Reply(mut r)) = Message::decode(&reply) else {
            panic!("a reply")
        };
        edit(&mut r, &ch);
        assert_eq!(
            rig.send(&Message::Reply(r).to_bytes()),
            Ok(Outcome::Continue)
        );
        assert_eq!(rig.receive().0, failed(reason, false), "case {i}");
    }
}

#[test]
fn transaction_timeout_resets_like_linux() {
    let mut rig = Rig::default_pair();
    assert_eq!(rig.target.poll_timeout(), None);
    assert_eq!(rig.start(1), Ok(Outcome::Continue));
    let timeout = target::DEFAULT_TRANSACTION_TIMEOUT;
    assert_eq!(rig.target.poll_timeout(), Some(rig.now + timeout));
    // Each step re-arms the timer.
    rig.now += Duration::from_secs(30);
    let (_, challenge) = rig.receive();
    let deadline = rig.now + timeout;
    assert_eq!(rig.target.poll_timeout(), Some(deadline));
    let reply = rig.host.handle_challenge(&challenge, &mut rig.rng).unwrap();
    assert_eq!(
        rig.target.handle_timeout(deadline - Duration::from_secs(1)),
        None
    );
    rig.now = deadline + Duration::from_secs(1);
    assert_eq!(
        rig.target.handle_timeout(rig.now),
        Some(Expired {
            authenticated: false
        })
    );
    assert_eq!(rig.target.poll_timeout(), None);
    // The late Reply meets a reset transaction.
    assert_eq!(
        rig.send(&reply),
        Ok(failed(Reason::IncorrectMessage, false))
    );

    // A command after the deadline sees the reset even without handle_timeout; a fresh
    // Negotiate works.
    let mut rig = Rig::default_pair();
    assert_eq!(rig.start(1), Ok(Outcome::Continue));
    rig.now += target::DEFAULT_TRANSACTION_TIMEOUT;
    assert_eq!(rig.transaction(2).map(|a| a.key_index), Ok(0));

    // An expired re-authentication leaves the queue authenticated, as Linux does.
    let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()]);
    config.transaction_timeout = Duration::from_secs(5);
    let mut rig = Rig::new(
        config,
        HostConfig::linux(HOSTNQN, SUBNQN, host_key(), Some(ctrl_key())),
    );
    rig.transaction(1).unwrap();
    assert_eq!(rig.start(2), Ok(Outcome::Continue));
    rig.now += Duration::from_secs(5);
    assert_eq!(
        rig.target.handle_timeout(rig.now),
        Some(Expired {
            authenticated: true
        })
    );
    assert!(rig.target.is_authenticated());
}

#[test]
fn command_statuses() {
    let mut rig = Rig::default_pair();
    let neg = rig.host.negotiate(1);
    // Data shorter than TL.
    assert_eq!(
        rig.target
            .on_auth_send(&AuthCommand::Send { tl: 80 }, &neg, rig.now),
        Err(StatusCode::DataSglLengthInvalid.status())
    );
    // The wrong direction for the call.
    let mut buf = Vec::new();
    assert_eq!(
        rig.target.on_auth_receive(
            &AuthCommand::Send { tl: 8 },
            rig.now,
            &mut rig.rng,
            &mut buf
        ),
        Err(StatusCode::InvalidField.status())
    );
    assert_eq!(
        rig.receive_al(target::MAX_ALLOCATION_LEN + 1),
        Err(StatusCode::InvalidField.status())
    );
    assert_eq!(rig.send(&neg), Ok(Outcome::Continue));
    // An AL too small for the ffdhe2048 challenge (16 + 32 + 256) keeps the step: the host may
    // ask again with more.
    assert_eq!(
        rig.receive_al(303),
        Err(StatusCode::DataSglLengthInvalid.status())
    );
    let (o, challenge) = rig.receive_al(304).unwrap();
    assert_eq!(o, Outcome::Continue);
    let reply = rig.host.handle_challenge(&challenge, &mut rig.rng).unwrap();
    assert_eq!(rig.send(&reply), Ok(Outcome::Continue));
    // Success1 with R2 needs 16 + 32.
    assert_eq!(
        rig.receive_al(47),
        Err(StatusCode::DataSglLengthInvalid.status())
    );
    let (_, success1) = rig.receive_al(48).unwrap();
    let success2 = rig.host.handle_success1(&success1).unwrap().unwrap();
    assert!(matches!(rig.send(&success2), Ok(Outcome::Authenticated(_))));
    // A SECP other than E9h never reaches the authenticator.
    let mut sqe = AuthCommand::Send { tl: 8 }.to_sqe(1);
    sqe.0[43] = 0;
    assert_eq!(
        AuthCommand::parse(&sqe),
        Err(StatusCode::InvalidField.status())
    );
}

#[test]
fn config_checks_and_debug_shows_no_key() {
    let mut c = TargetConfig::new(HOSTNQN, SUBNQN, vec![]);
    assert_eq!(
        Authenticator::new(c.clone()).unwrap_err(),
        ConfigError::NoKeys
    );
    c.keys = vec![pair()];
    c.hashes.clear();
    assert_eq!(
        Authenticator::new(c.clone()).unwrap_err(),
        ConfigError::NoHash
    );
    c.hashes = vec![HashId::Sha256];
    c.dh_groups.clear();
    assert_eq!(
        Authenticator::new(c.clone()).unwrap_err(),
        ConfigError::NoDhGroup
    );
    c.dh_groups = vec![DhGroup::Null];
    c.subsys_nqn.clear();
    assert_eq!(
        Authenticator::new(c.clone()).unwrap_err(),
        ConfigError::EmptyNqn
    );

    let rig = Rig::default_pair();
    let shown = format!(
        "{:?} {:?}",
        rig.target,
        TargetConfig::new(HOSTNQN, SUBNQN, vec![pair()])
    );
    for key in [host_key(), ctrl_key()] {
        assert!(!shown.contains(key.encode().as_str()));
    }
    assert!(!shown.contains("17, 17, 17"), "{shown}");
    assert!(shown.contains("step: \"await-negotiate\""));
}

#[test]
fn challenges_are_fresh_per_transaction() {
    let mut rig = Rig::default_pair();
    let mut seen = Vec::new();
    for t_id in 1..=3 {
        assert_eq!(rig.start(t_id), Ok(Outcome::Continue));
        let (_, data) = rig.receive();
        let Ok(Message::Challenge(c)) = Message::decode(&data) else {
            panic!("challenge")
        };
        assert_eq!((c.t_id, c.hash_id, c.dh_group_id), (t_id, 1, 1));
        assert_ne!(c.seqnum, 0);
        assert_eq!(c.dh_value.len(), 256);
        assert!(!seen.contains(&(c.challenge.clone(), c.dh_value.clone())));
        seen.push((c.challenge, c.dh_value));
    }
}
