//! Arbitrary bytes into the DH-HMAC-CHAP message decoder and the target's per-queue
//! authenticator.
//!
//! The decoder alone: nothing panics, and a decoded message re-encodes to bytes that decode to
//! the same message, no longer than the input. The authenticator: byte 0 picks the DH group
//! (ffdhe2048 for one input in four, null otherwise: a modular exponentiation under the
//! sanitizer costs more than the rest of the run), the step the rest of the input meets as an AUTH_Send (the first
//! message, after a Negotiate, after the Challenge was read, after a valid Reply and Success1
//! of a bidirectional transaction) and the AL of the AUTH_Receive that follows. Oracle: nothing
//! panics, a Receive returns exactly AL bytes holding a well-formed controller message, a
//! failed queue takes no more AUTH commands, and the queue is authenticated only after an
//! `Authenticated` outcome.
//!
//! Seeds (fuzz/corpus/auth_decode/): the test host's Negotiate, Reply and Success2 messages for
//! each step and DH group, so the mutations start from well-formed messages.
//!
//! Run from the repository root: `scripts/fuzz.sh auth_decode 60`
#![no_main]

use core::time::Duration;

use edgevol_nvmeof::auth::host::{Host, HostConfig, TestRng};
use edgevol_nvmeof::auth::messages::Message;
use edgevol_nvmeof::auth::{
    AuthCommand, Authenticator, DhGroup, HashId, KeyPair, Outcome, Secret, TargetConfig,
};
use edgevol_nvmeof::status::StatusCode;
use libfuzzer_sys::fuzz_target;

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:fuzz-host";
const SUBNQN: &str = "nqn.2024-11.io.edgevol:fuzz:v1";

fn secret(hash: HashId, byte: u8) -> Secret {
    Secret::from_key(Some(hash), &vec![byte; hash.digest_len()]).expect("valid key")
}

struct Queue {
    target: Authenticator,
    rng: TestRng,
    now: Duration,
    seen_authenticated: bool,
    failed: bool,
}

impl Queue {
    fn track(&mut self, outcome: &Outcome) {
        match outcome {
            Outcome::Authenticated(_) => self.seen_authenticated = true,
            Outcome::Failed(_) => self.failed = true,
            // Only a re-authentication ends so, and the queue stays authenticated.
            Outcome::ControllerRejected(_) => assert!(
                self.seen_authenticated && self.target.is_authenticated(),
                "a controller rejection on a queue that had not authenticated"
            ),
            Outcome::Continue => {}
        }
    }

    fn send(&mut self, data: &[u8]) -> Option<Outcome> {
        let tl = u32::try_from(data.len()).ok()?;
        let cmd = AuthCommand::Send { tl };
        match self.target.on_auth_send(&cmd, data, self.now) {
            Ok(o) => {
                assert!(!self.failed, "a failed queue took an AUTH_Send");
                self.track(&o);
                Some(o)
            }
            Err(s) => {
                assert!(
                    tl == 0 || (self.failed && s == StatusCode::CommandSequenceError.status()),
                    "unexpected AUTH_Send status {s:?}"
                );
                None
            }
        }
    }

    fn receive(&mut self, al: u32) -> Option<Vec<u8>> {
        let mut buf = Vec::new();
        let cmd = AuthCommand::Receive { al };
        match self
            .target
            .on_auth_receive(&cmd, self.now, &mut self.rng, &mut buf)
        {
            Ok(o) => {
                assert!(!self.failed, "a failed queue took an AUTH_Receive");
                assert_eq!(buf.len(), al as usize, "AUTH_Receive returns AL bytes");
                let msg = Message::decode(&buf).expect("the target sends well-formed messages");
                assert!(matches!(
                    msg,
                    Message::Challenge(_) | Message::Success1(_) | Message::Failure1(_)
                ));
                self.track(&o);
                Some(buf)
            }
            Err(_) => None,
        }
    }
}

fuzz_target!(|input: &[u8]| {
    // The decoder alone.
    if let Ok(m) = Message::decode(input) {
        let bytes = m.to_bytes();
        assert!(bytes.len() <= input.len(), "encoding grew: {m:?}");
        assert_eq!(Message::decode(&bytes).as_ref(), Ok(&m));
    }

    // The authenticator.
    let Some((&mode, body)) = input.split_first() else {
        return;
    };
    let group = if mode & 0x81 == 0x81 {
        DhGroup::Ffdhe2048
    } else {
        DhGroup::Null
    };
    let pair = KeyPair {
        host: secret(HashId::Sha256, 1),
        controller: Some(secret(HashId::Sha384, 2)),
    };
    let mut config = TargetConfig::new(HOSTNQN, SUBNQN, vec![pair.clone()]);
    config.dh_groups = vec![group];
    let mut q = Queue {
        target: Authenticator::new(config).expect("valid config"),
        rng: TestRng::new(u64::from(mode)),
        now: Duration::from_secs(1),
        seen_authenticated: false,
        failed: false,
    };
    let mut host = Host::new(HostConfig::linux(
        HOSTNQN,
        SUBNQN,
        pair.host.clone(),
        pair.controller.clone(),
    ));
    let step = (mode >> 1) & 3;
    if step >= 1 {
        let neg = host.negotiate(7);
        assert_eq!(q.send(&neg), Some(Outcome::Continue));
    }
    if step >= 2 {
        let challenge = q.receive(4096).expect("challenge");
        let reply = host
            .handle_challenge(&challenge, &mut q.rng)
            .expect("reply");
        if step == 3 {
            assert_eq!(q.send(&reply), Some(Outcome::Continue));
            let success1 = q.receive(4096).expect("success1");
            assert!(host
                .handle_success1(&success1)
                .expect("bidirectional")
                .is_some());
        }
    }
    let _ = q.send(body);
    let al = match (mode >> 3) & 3 {
        0 => 4096,
        1 => 8,
        2 => 48,
        _ => 16 + u32::from((mode >> 5) & 3) * 40,
    };
    let _ = q.receive(al);
    let _ = q.receive(4096);
    assert!(
        !q.target.is_authenticated() || q.seen_authenticated,
        "authenticated without an Authenticated outcome"
    );
});
