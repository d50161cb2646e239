//! The host side of DH-HMAC-CHAP, as Linux's `nvme_queue_auth_work` runs it
//! (drivers/nvme/host/auth.c), for tests and benches (feature `test-initiator`).
//!
//! One transaction: [`Host::negotiate`] gives the AUTH_Negotiate to send (Linux offers SHA-256,
//! SHA-384, SHA-512 and every DH group); [`Host::handle_challenge`] takes the AUTH_Receive data
//! and gives the Reply to send; [`Host::handle_success1`] takes the next AUTH_Receive data and
//! gives the Success2 to send when the host asked for bidirectional authentication. Errors say
//! whether Linux would send an AUTH_Failure2 ([`HostError::Refused`]) or just stop
//! ([`HostError::Stopped`]: the controller's Failure1, or an unexpected message).
//!
//! [`TestRng`] is a deterministic generator for tests and benches: never use it for real keys.

use core::convert::Infallible;
use core::fmt;

use rand_core::{CryptoRng, TryCryptoRng, TryRng};
use zeroize::Zeroizing;

use super::dh::{DhGroup, PrivateKey, SessionKey};
use super::hash::{controller_response, host_response, HashId, ResponseInput};
use super::messages::{
    auth_id, auth_type, Challenge, Failure, Message, Negotiate, Protocol, Reason, Reply, Success2,
    PROTOCOL_DHCHAP, SC_C_NONE,
};
use super::secret::Secret;

/// The host's settings.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Host NQN.
    pub host_nqn: String,
    /// Subsystem NQN.
    pub subsys_nqn: String,
    /// `dhchap_secret`.
    pub host_secret: Secret,
    /// `dhchap_ctrl_secret`: present, the host asks for bidirectional authentication.
    pub ctrl_secret: Option<Secret>,
    /// Hashes offered, in order (Linux: all three).
    pub hashes: Vec<HashId>,
    /// DH groups offered, in order (Linux: null, then ffdhe2048 .. ffdhe8192).
    pub dh_groups: Vec<DhGroup>,
}

impl HostConfig {
    /// What Linux offers, with these secrets.
    pub fn linux(
        host_nqn: &str,
        subsys_nqn: &str,
        host_secret: Secret,
        ctrl_secret: Option<Secret>,
    ) -> Self {
        HostConfig {
            host_nqn: host_nqn.to_owned(),
            subsys_nqn: subsys_nqn.to_owned(),
            host_secret,
            ctrl_secret,
            hashes: HashId::ALL.to_vec(),
            dh_groups: DhGroup::ALL.to_vec(),
        }
    }
}

/// Why the host ended the transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    /// It refuses what the controller sent: send this AUTH_Failure2.
    Refused {
        /// The reason.
        reason: Reason,
        /// The AUTH_Failure2 to send with AUTH_Send.
        failure2: Vec<u8>,
    },
    /// It stops without a message: the controller sent AUTH_Failure1 with this reason, or
    /// something other than the expected message (Incorrect Message).
    Stopped(Reason),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Refused { reason, .. } => write!(f, "host refused: {reason}"),
            HostError::Stopped(reason) => write!(f, "host stopped: {reason}"),
        }
    }
}

impl std::error::Error for HostError {}

enum State {
    Idle,
    AwaitChallenge,
    AwaitSuccess1 {
        hash: HashId,
        session_key: Option<SessionKey>,
        c2: Option<(Zeroizing<Vec<u8>>, u32)>,
    },
}

/// One queue's host side.
pub struct Host {
    config: HostConfig,
    t_id: u16,
    state: State,
}

impl fmt::Debug for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("host_nqn", &self.config.host_nqn)
            .field("t_id", &self.t_id)
            .finish_non_exhaustive()
    }
}

impl Host {
    /// A host with these settings.
    pub fn new(config: HostConfig) -> Self {
        Host {
            config,
            t_id: 0,
            state: State::Idle,
        }
    }

    fn refuse(&mut self, reason: Reason) -> HostError {
        self.state = State::Idle;
        HostError::Refused {
            reason,
            failure2: Message::Failure2(Failure::new(self.t_id, reason)).to_bytes(),
        }
    }

    /// `nvme_auth_receive_validate`: a Failure1 or a wrong message stops the host.
    fn expect(&mut self, data: &[u8], id: u8) -> Result<Message, HostError> {
        let msg = Message::decode(data);
        if let Ok(Message::Failure1(f)) = &msg {
            self.state = State::Idle;
            return Err(HostError::Stopped(f.reason));
        }
        match msg {
            Ok(m) if data[0] == auth_type::DHCHAP && data[1] == id && m.t_id() == self.t_id => {
                Ok(m)
            }
            _ => {
                self.state = State::Idle;
                Err(HostError::Stopped(Reason::IncorrectMessage))
            }
        }
    }

    /// Starts transaction `t_id`: the AUTH_Negotiate to send.
    pub fn negotiate(&mut self, t_id: u16) -> Vec<u8> {
        self.t_id = t_id;
        self.state = State::AwaitChallenge;
        Message::Negotiate(Negotiate {
            t_id,
            sc_c: SC_C_NONE,
            protocols: vec![Protocol {
                auth_id: PROTOCOL_DHCHAP,
                hash_ids: self.config.hashes.iter().map(|h| h.id()).collect(),
                dh_group_ids: self.config.dh_groups.iter().map(|g| g.id()).collect(),
            }],
        })
        .to_bytes()
    }

    /// Takes the Challenge: the Reply to send.
    pub fn handle_challenge<R: CryptoRng + ?Sized>(
        &mut self,
        data: &[u8],
        rng: &mut R,
    ) -> Result<Vec<u8>, HostError> {
        if !matches!(self.state, State::AwaitChallenge) {
            return Err(self.refuse(Reason::IncorrectMessage));
        }
        let Message::Challenge(ch) = self.expect(data, auth_id::CHALLENGE)? else {
            return Err(HostError::Stopped(Reason::IncorrectMessage));
        };
        let reply = self.reply(&ch, rng)?;
        Ok(reply)
    }

    fn reply<R: CryptoRng + ?Sized>(
        &mut self,
        ch: &Challenge,
        rng: &mut R,
    ) -> Result<Vec<u8>, HostError> {
        // nvme_auth_process_dhchap_challenge.
        let Some(hash) = HashId::from_id(ch.hash_id) else {
            return Err(self.refuse(Reason::HashUnusable));
        };
        if ch.challenge.len() != hash.digest_len() {
            return Err(self.refuse(Reason::HashUnusable));
        }
        let Some(group) = DhGroup::from_id(ch.dh_group_id) else {
            return Err(self.refuse(Reason::DhGroupUnusable));
        };
        let (session_key, dh_value) = match (group, ch.dh_value.is_empty()) {
            (DhGroup::Null, true) => (None, Vec::new()),
            (DhGroup::Null, false) => return Err(self.refuse(Reason::IncorrectPayload)),
            (_, true) => return Err(self.refuse(Reason::DhGroupUnusable)),
            (_, false) => {
                let Ok(key) = PrivateKey::generate(group, rng) else {
                    return Err(self.refuse(Reason::DhGroupUnusable));
                };
                let Ok(ks) = key.shared_secret(&ch.dh_value) else {
                    return Err(self.refuse(Reason::IncorrectPayload));
                };
                (Some(ks), key.public_value())
            }
        };
        let transformed = self.config.host_secret.transform(&self.config.host_nqn);
        let r1 = host_response(
            &ResponseInput {
                hash,
                session_key: session_key.as_ref().map(SessionKey::as_bytes),
                challenge: &ch.challenge,
                seqnum: ch.seqnum,
                t_id: self.t_id,
            },
            transformed.as_bytes(),
            &self.config.host_nqn,
            &self.config.subsys_nqn,
        );
        let c2 = self.config.ctrl_secret.as_ref().map(|_| {
            let mut c2 = Zeroizing::new(vec![0u8; hash.digest_len()]);
            rng.fill_bytes(&mut c2);
            let s2 = loop {
                let s = rng.next_u32();
                if s != 0 {
                    break s;
                }
            };
            (c2, s2)
        });
        let reply = Message::Reply(Reply {
            t_id: self.t_id,
            response: r1.as_bytes().to_vec(),
            cvalid: c2.is_some(),
            challenge: c2
                .as_ref()
                .map_or_else(|| vec![0; hash.digest_len()], |(c, _)| c.to_vec()),
            seqnum: c2.as_ref().map_or(0, |(_, s)| *s),
            dh_value,
        })
        .to_bytes();
        self.state = State::AwaitSuccess1 {
            hash,
            session_key,
            c2,
        };
        Ok(reply)
    }

    /// Takes Success1: `Some(success2)` to send when the controller was authenticated too,
    /// `None` when the transaction is over (unidirectional).
    pub fn handle_success1(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>, HostError> {
        if !matches!(self.state, State::AwaitSuccess1 { .. }) {
            return Err(self.refuse(Reason::IncorrectMessage));
        }
        let Message::Success1(s1) = self.expect(data, auth_id::SUCCESS1)? else {
            return Err(HostError::Stopped(Reason::IncorrectMessage));
        };
        let State::AwaitSuccess1 {
            hash,
            session_key,
            c2,
        } = core::mem::replace(&mut self.state, State::Idle)
        else {
            return Err(self.refuse(Reason::IncorrectMessage));
        };
        // nvme_auth_process_dhchap_success1.
        if usize::from(s1.hl) != hash.digest_len() {
            return Err(self.refuse(Reason::HashUnusable));
        }
        let Some((c2, s2)) = c2 else {
            return Ok(None);
        };
        let Some(r2) = s1.response else {
            // Linux's host accepts a Success1 without R2 here; refusing is what a host that
            // asked for the controller's response should do.
            return Err(self.refuse(Reason::Failed));
        };
        let ctrl = self
            .config
            .ctrl_secret
            .as_ref()
            .map(|s| s.transform(&self.config.subsys_nqn));
        let Some(ctrl) = ctrl else {
            return Err(self.refuse(Reason::Failed));
        };
        let expected = controller_response(
            &ResponseInput {
                hash,
                session_key: session_key.as_ref().map(SessionKey::as_bytes),
                challenge: &c2,
                seqnum: s2,
                t_id: self.t_id,
            },
            ctrl.as_bytes(),
            &self.config.subsys_nqn,
            &self.config.host_nqn,
        );
        if !expected.ct_eq_bytes(&r2) {
            return Err(self.refuse(Reason::Failed));
        }
        Ok(Some(
            Message::Success2(Success2 { t_id: self.t_id }).to_bytes(),
        ))
    }
}

/// A deterministic generator (SHA-256 of seed and counter) for tests and benches. Not a source
/// of real keys.
#[derive(Clone)]
pub struct TestRng {
    seed: u64,
    counter: u64,
    block: [u8; 32],
    used: usize,
}

impl fmt::Debug for TestRng {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRng").field("seed", &self.seed).finish()
    }
}

impl TestRng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        TestRng {
            seed,
            counter: 0,
            block: [0; 32],
            used: 32,
        }
    }

    fn fill(&mut self, dst: &mut [u8]) {
        for b in dst {
            if self.used == self.block.len() {
                let mut input = [0u8; 16];
                input[..8].copy_from_slice(&self.seed.to_le_bytes());
                input[8..].copy_from_slice(&self.counter.to_le_bytes());
                self.counter += 1;
                self.block
                    .copy_from_slice(HashId::Sha256.digest(&input).as_bytes());
                self.used = 0;
            }
            *b = self.block[self.used];
            self.used += 1;
        }
    }
}

impl TryRng for TestRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        Ok(u32::from_le_bytes(b))
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let mut b = [0u8; 8];
        self.fill(&mut b);
        Ok(u64::from_le_bytes(b))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        self.fill(dst);
        Ok(())
    }
}

impl TryCryptoRng for TestRng {}
