//! The target's DH-HMAC-CHAP state machine of one queue (Linux
//! drivers/nvme/target/fabrics-cmd-auth.c, per `struct nvmet_sq`).
//!
//! Steps, named by the message the target waits for or has to send next:
//!
//! ```text
//!  AwaitNegotiate --Send(NEGOTIATE)--> SendChallenge --Receive--> AwaitReply
//!  AwaitReply --Send(REPLY)--> SendSuccess1 --Receive--> done (unidirectional: authenticated)
//!                                                  \--> AwaitSuccess2 --Send(SUCCESS2)--> done
//!  any step: Send(NEGOTIATE) restarts (re-authentication keeps the queue authenticated
//!  meanwhile); a refused Negotiate/Reply or a wrong t_id --> SendFailure1 --Receive--> failed
//!  an unexpected message, a host FAILURE2, a Receive while the host has to send --> failed
//!  except: a host FAILURE2 in AwaitSuccess2 of a re-authentication --> AwaitNegotiate, the
//!  queue still authenticated (Outcome::ControllerRejected)
//!  the transaction timeout --> AwaitNegotiate (authentication state unchanged)
//! ```

use core::fmt;
use core::time::Duration;

use rand_core::CryptoRng;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::command::AuthCommand;
use super::dh::{DhGroup, PrivateKey, SessionKey};
use super::hash::{controller_response, host_response, Digest, HashId, ResponseInput};
use super::messages::{
    auth_id, auth_type, Challenge, Failure, Header, Message, Negotiate, Reason, Reply, Success1,
    DESCRIPTOR_LEN, FAILURE_LEN, HEADER_LEN, MAX_DH_IDS, MAX_HASH_IDS, NEGOTIATE_HEADER_LEN,
    PROTOCOL_DHCHAP, SC_C_NONE,
};
use super::secret::Secret;
use crate::status::{Status, StatusCode};

/// Largest AUTH_Receive allocation length taken (Linux hosts use 4096; the largest message,
/// an ffdhe8192 challenge with SHA-512, is 1104 bytes).
pub const MAX_ALLOCATION_LEN: u32 = 64 * 1024;

/// Linux's transaction timeout when the controller has no keep-alive timeout
/// (`nvmet_execute_auth_send`: KATO, else 120 s).
pub const DEFAULT_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(120);

/// One candidate pair of secrets for a host: its own, and the controller's for bidirectional
/// authentication.
#[derive(Clone, Debug)]
pub struct KeyPair {
    /// The host secret (`dhchap_secret`).
    pub host: Secret,
    /// The controller secret (`dhchap_ctrl_secret`); without it a host asking for bidirectional
    /// authentication is refused.
    pub controller: Option<Secret>,
}

/// What the target knows about the queue's host and what it allows.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Host NQN from the Connect data.
    pub host_nqn: String,
    /// Subsystem NQN from the Connect data.
    pub subsys_nqn: String,
    /// Hashes the target accepts, most preferred first.
    pub hashes: Vec<HashId>,
    /// DH groups the target accepts, most preferred first.
    pub dh_groups: Vec<DhGroup>,
    /// Candidate key pairs, tried in order (several during a key rotation).
    pub keys: Vec<KeyPair>,
    /// How long a started transaction may wait for its next command: the controller's KATO, or
    /// [`DEFAULT_TRANSACTION_TIMEOUT`] without one (Linux).
    pub transaction_timeout: Duration,
}

impl TargetConfig {
    /// A configuration taking every hash (SHA-256 first) and every DH group (ffdhe2048 first,
    /// then the larger groups, then null), with Linux's default timeout.
    pub fn new(host_nqn: &str, subsys_nqn: &str, keys: Vec<KeyPair>) -> Self {
        TargetConfig {
            host_nqn: host_nqn.to_owned(),
            subsys_nqn: subsys_nqn.to_owned(),
            hashes: HashId::ALL.to_vec(),
            dh_groups: vec![
                DhGroup::Ffdhe2048,
                DhGroup::Ffdhe3072,
                DhGroup::Ffdhe4096,
                DhGroup::Ffdhe6144,
                DhGroup::Ffdhe8192,
                DhGroup::Null,
            ],
            keys,
            transaction_timeout: DEFAULT_TRANSACTION_TIMEOUT,
        }
    }
}

/// A configuration that cannot authenticate anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// An NQN is empty.
    EmptyNqn,
    /// No hash is allowed.
    NoHash,
    /// No DH group is allowed.
    NoDhGroup,
    /// No key pair.
    NoKeys,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigError::EmptyNqn => "an NQN is empty",
            ConfigError::NoHash => "no hash function is allowed",
            ConfigError::NoDhGroup => "no DH group is allowed",
            ConfigError::NoKeys => "no key pair",
        })
    }
}

impl std::error::Error for ConfigError {}

/// A completed authentication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Authenticated {
    /// Index in [`TargetConfig::keys`] of the pair that authenticated: once the host uses a
    /// rotated key, the caller can retire the others.
    pub key_index: usize,
    /// The negotiated hash.
    pub hash: HashId,
    /// The negotiated DH group.
    pub dh_group: DhGroup,
    /// The controller authenticated itself to the host too.
    pub bidirectional: bool,
    /// The queue was already authenticated (a re-authentication).
    pub reauthentication: bool,
}

/// A failed authentication: the queue is no longer authenticated and its controller must go
/// (Linux `nvmet_ctrl_fatal_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed {
    /// Why.
    pub reason: Reason,
    /// The host gave up (AUTH_Failure2 with this reason); otherwise the target refused.
    pub by_host: bool,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.by_host {
            write!(f, "host aborted authentication: {}", self.reason)
        } else {
            write!(f, "{}", self.reason)
        }
    }
}

/// What the caller does once the AUTH command has been handled. In every case the command
/// itself completes successfully (with the AUTH_Receive data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// The transaction goes on.
    Continue,
    /// The queue is authenticated: accept its other commands.
    Authenticated(Authenticated),
    /// Authentication failed: complete this command, then fail the controller (close the
    /// connection of every queue it has).
    Failed(Failed),
    /// A re-authentication the host ended with AUTH_Failure2 after the target had verified
    /// the host's response: the host did not accept the controller's response. The host proved
    /// its key in this transaction as in the earlier one, so the queue stays authenticated and
    /// the controller stays; whether to go on is the host's decision. Linux's host ends a
    /// re-authentication so while a key rotation is half done: it takes `dhchap_secret` and
    /// `dhchap_ctrl_secret` one at a time and re-authenticates after each, so one transaction
    /// runs with the old host key and the new controller key, and the target answers with the
    /// controller key of the pair the host key belongs to. (Linux's target does not fail the
    /// controller on a host's Failure2 either.) Complete the command; log it, do not count it
    /// against the host's address.
    ControllerRejected(Failed),
}

/// A transaction that outlived its timeout and was reset ([`Authenticator::handle_timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expired {
    /// The queue is still authenticated (from an earlier transaction).
    pub authenticated: bool,
}

enum Step {
    AwaitNegotiate,
    SendChallenge {
        hash: HashId,
        group: DhGroup,
    },
    AwaitReply {
        hash: HashId,
        group: DhGroup,
        c1: Zeroizing<Vec<u8>>,
        s1: u32,
        dh: Option<PrivateKey>,
    },
    SendSuccess1 {
        done: Authenticated,
        r2: Option<Digest>,
    },
    AwaitSuccess2 {
        done: Authenticated,
    },
    SendFailure1 {
        reason: Reason,
    },
    Failed,
}

impl Step {
    fn name(&self) -> &'static str {
        match self {
            Step::AwaitNegotiate => "await-negotiate",
            Step::SendChallenge { .. } => "send-challenge",
            Step::AwaitReply { .. } => "await-reply",
            Step::SendSuccess1 { .. } => "send-success1",
            Step::AwaitSuccess2 { .. } => "await-success2",
            Step::SendFailure1 { .. } => "send-failure1",
            Step::Failed => "failed",
        }
    }
}

/// The DH-HMAC-CHAP target of one queue. See the [module docs](super) for how to drive it.
pub struct Authenticator {
    config: TargetConfig,
    step: Step,
    t_id: u16,
    authenticated: bool,
    deadline: Option<Duration>,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("host_nqn", &self.config.host_nqn)
            .field("step", &self.step.name())
            .field("t_id", &self.t_id)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// The authenticator of a queue whose Connect was answered with ATR.
    pub fn new(config: TargetConfig) -> Result<Self, ConfigError> {
        check(&config)?;
        Ok(Authenticator {
            config,
            step: Step::AwaitNegotiate,
            t_id: 0,
            authenticated: false,
            deadline: None,
        })
    }

    /// True once a transaction has succeeded (and no later one has failed).
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// Replaces the candidate key pairs (a rotation or a revocation); the next Reply is checked
    /// against them. A queue already authenticated stays so until it re-authenticates.
    pub fn set_keys(&mut self, keys: Vec<KeyPair>) -> Result<(), ConfigError> {
        if keys.is_empty() {
            return Err(ConfigError::NoKeys);
        }
        self.config.keys = keys;
        Ok(())
    }

    /// When the transaction in progress expires, if one is.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.deadline
    }

    /// Resets a transaction whose timeout has passed at `now`, as Linux's
    /// `nvmet_auth_expired_work` does; the queue keeps its authentication state.
    pub fn handle_timeout(&mut self, now: Duration) -> Option<Expired> {
        match self.deadline {
            Some(d) if now >= d && !matches!(self.step, Step::Failed) => {
                self.step = Step::AwaitNegotiate;
                self.deadline = None;
                Some(Expired {
                    authenticated: self.authenticated,
                })
            }
            _ => None,
        }
    }

    fn arm(&mut self, now: Duration) {
        self.deadline = Some(now.saturating_add(self.config.transaction_timeout));
    }

    fn fail(&mut self, reason: Reason, by_host: bool) -> Outcome {
        self.step = Step::Failed;
        self.authenticated = false;
        self.deadline = None;
        Outcome::Failed(Failed { reason, by_host })
    }

    /// Handles an AUTH_Send (parsed with [`AuthCommand::parse`]) and its `data`, at `now`.
    ///
    /// `Err(status)`: complete the command with it (data length different from TL: Data SGL
    /// Length Invalid; after a failure: Command Sequence Error). Protocol errors are not
    /// command errors: they come back as [`Outcome::Failed`] or are reported to the host with
    /// AUTH_Failure1 on its next AUTH_Receive.
    pub fn on_auth_send(
        &mut self,
        cmd: &AuthCommand,
        data: &[u8],
        now: Duration,
    ) -> Result<Outcome, Status> {
        let AuthCommand::Send { tl } = *cmd else {
            return Err(StatusCode::InvalidField.status());
        };
        if usize::try_from(tl).ok() != Some(data.len()) {
            return Err(StatusCode::DataSglLengthInvalid.status());
        }
        if matches!(self.step, Step::Failed) {
            return Err(StatusCode::CommandSequenceError.status());
        }
        let _ = self.handle_timeout(now);
        let Ok(header) = Header::decode(data) else {
            return Ok(self.fail(Reason::IncorrectMessage, false));
        };
        match (header.auth_type, header.auth_id) {
            (auth_type::COMMON, auth_id::NEGOTIATE) => {
                // A Negotiate (re)starts a transaction in any step.
                self.t_id = header.t_id;
                self.step = match self.negotiate(data) {
                    Ok((hash, group)) => Step::SendChallenge { hash, group },
                    Err(reason) => Step::SendFailure1 { reason },
                };
                self.arm(now);
                Ok(Outcome::Continue)
            }
            (auth_type::COMMON, auth_id::FAILURE2) => match Message::decode(data) {
                Ok(Message::Failure2(f))
                    if self.authenticated
                        && f.t_id == self.t_id
                        && matches!(self.step, Step::AwaitSuccess2 { .. }) =>
                {
                    self.step = Step::AwaitNegotiate;
                    self.deadline = None;
                    Ok(Outcome::ControllerRejected(Failed {
                        reason: f.reason,
                        by_host: true,
                    }))
                }
                Ok(Message::Failure2(f)) => Ok(self.fail(f.reason, true)),
                _ => Ok(self.fail(Reason::IncorrectMessage, false)),
            },
            (auth_type::DHCHAP, id) => self.dhchap_send(id, header.t_id, data, now),
            _ => Ok(self.fail(Reason::IncorrectMessage, false)),
        }
    }

    fn dhchap_send(
        &mut self,
        id: u8,
        t_id: u16,
        data: &[u8],
        now: Duration,
    ) -> Result<Outcome, Status> {
        let expected = match self.step {
            Step::AwaitReply { .. } => auth_id::REPLY,
            Step::AwaitSuccess2 { .. } => auth_id::SUCCESS2,
            _ => return Ok(self.fail(Reason::IncorrectMessage, false)),
        };
        if id != expected {
            return Ok(self.fail(Reason::IncorrectMessage, false));
        }
        if t_id != self.t_id {
            self.step = Step::SendFailure1 {
                reason: Reason::IncorrectPayload,
            };
            self.arm(now);
            return Ok(Outcome::Continue);
        }
        match core::mem::replace(&mut self.step, Step::AwaitNegotiate) {
            Step::AwaitReply {
                hash,
                group,
                c1,
                s1,
                dh,
            } => {
                let reply = ReplyCheck {
                    hash,
                    group,
                    c1: &c1,
                    s1,
                    dh: dh.as_ref(),
                };
                self.step = match self.reply(&reply, data) {
                    Ok((done, r2)) => Step::SendSuccess1 { done, r2 },
                    Err(reason) => Step::SendFailure1 { reason },
                };
                self.arm(now);
                Ok(Outcome::Continue)
            }
            Step::AwaitSuccess2 { done } => match Message::decode(data) {
                Ok(Message::Success2(_)) => {
                    self.authenticated = true;
                    self.deadline = None;
                    Ok(Outcome::Authenticated(done))
                }
                _ => Ok(self.fail(Reason::IncorrectPayload, false)),
            },
            other => {
                // `expected` was derived from the step: unreachable, but keep the step.
                self.step = other;
                Ok(self.fail(Reason::IncorrectMessage, false))
            }
        }
    }

    /// `nvmet_auth_negotiate`, with the same reason codes.
    fn negotiate(&self, data: &[u8]) -> Result<(HashId, DhGroup), Reason> {
        if data.len() < NEGOTIATE_HEADER_LEN + DESCRIPTOR_LEN {
            return Err(Reason::IncorrectPayload);
        }
        if data[6] != SC_C_NONE {
            // Secure channel concatenation (TLS) is not offered.
            return Err(Reason::ConcatMismatch);
        }
        if data[7] != 1 {
            return Err(Reason::HashUnusable);
        }
        let negotiate: Negotiate = match Message::decode(data) {
            Ok(Message::Negotiate(n)) => n,
            _ => return Err(Reason::IncorrectPayload),
        };
        let Some(p) = negotiate.protocols.first() else {
            return Err(Reason::IncorrectPayload);
        };
        if p.auth_id != PROTOCOL_DHCHAP
            || p.hash_ids.len() > MAX_HASH_IDS
            || p.dh_group_ids.len() > MAX_DH_IDS
        {
            return Err(Reason::IncorrectPayload);
        }
        let hash = self
            .config
            .hashes
            .iter()
            .copied()
            .find(|h| p.hash_ids.contains(&h.id()))
            .ok_or(Reason::HashUnusable)?;
        let group = self
            .config
            .dh_groups
            .iter()
            .copied()
            .find(|g| p.dh_group_ids.contains(&g.id()))
            .ok_or(Reason::DhGroupUnusable)?;
        Ok((hash, group))
    }

    /// `nvmet_auth_reply` and the key part of `nvmet_auth_success1`: checks R1 against every
    /// candidate pair and computes R2 when the host asks for it.
    fn reply(
        &self,
        check: &ReplyCheck<'_>,
        data: &[u8],
    ) -> Result<(Authenticated, Option<Digest>), Reason> {
        let reply: Reply = match Message::decode(data) {
            Ok(Message::Reply(r)) => r,
            _ => return Err(Reason::IncorrectPayload),
        };
        if reply.response.len() != check.hash.digest_len() {
            // Linux: the host hash of a wrong length fails (nvmet_auth_host_hash -EINVAL).
            return Err(Reason::Failed);
        }
        let session_key: Option<SessionKey> = match (check.dh, reply.dh_value.is_empty()) {
            (None, true) => None,
            (None, false) | (Some(_), true) => return Err(Reason::IncorrectPayload),
            (Some(dh), false) => Some(
                dh.shared_secret(&reply.dh_value)
                    .map_err(|_| Reason::DhGroupUnusable)?,
            ),
        };
        let ks = session_key.as_ref().map(SessionKey::as_bytes);
        let r1_input = ResponseInput {
            hash: check.hash,
            session_key: ks,
            challenge: check.c1,
            seqnum: check.s1,
            t_id: self.t_id,
        };
        // Every candidate is computed, so the time taken does not tell which one matched.
        let mut matched = None;
        for (i, pair) in self.config.keys.iter().enumerate() {
            let key = pair.host.transform(&self.config.host_nqn);
            let expected = host_response(
                &r1_input,
                key.as_bytes(),
                &self.config.host_nqn,
                &self.config.subsys_nqn,
            );
            if expected.ct_eq_bytes(&reply.response) && matched.is_none() {
                matched = Some(i);
            }
        }
        let key_index = matched.ok_or(Reason::Failed)?;
        // Seqnum 0 with C2: no bidirectional authentication (C2 only feeds a TLS PSK, which
        // edgevol does not derive).
        let bidirectional = reply.cvalid && reply.seqnum != 0;
        let done = Authenticated {
            key_index,
            hash: check.hash,
            dh_group: check.group,
            bidirectional,
            reauthentication: self.authenticated,
        };
        if !bidirectional {
            return Ok((done, None));
        }
        // A host echoing our own challenge would make us answer it for an attacker (reflection).
        if bool::from(reply.challenge.as_slice().ct_eq(check.c1)) {
            return Err(Reason::Failed);
        }
        let ctrl = self
            .config
            .keys
            .get(key_index)
            .and_then(|p| p.controller.as_ref())
            .ok_or(Reason::Failed)?;
        let key = ctrl.transform(&self.config.subsys_nqn);
        let r2 = controller_response(
            &ResponseInput {
                hash: check.hash,
                session_key: ks,
                challenge: &reply.challenge,
                seqnum: reply.seqnum,
                t_id: self.t_id,
            },
            key.as_bytes(),
            &self.config.subsys_nqn,
            &self.config.host_nqn,
        );
        Ok((done, Some(r2)))
    }

    /// Handles an AUTH_Receive at `now`: `out` is replaced by exactly AL bytes (the message,
    /// zero-padded, as Linux sends it) to return as the command's data. `rng` supplies the
    /// challenge, its sequence number and the DH exponent.
    ///
    /// `Err(status)`: complete the command with it, without data (AL too small for the message
    /// or above [`MAX_ALLOCATION_LEN`]: Data SGL Length Invalid / Invalid Field, and the step
    /// is kept so the host may retry; after a failure: Command Sequence Error).
    pub fn on_auth_receive<R: CryptoRng + ?Sized>(
        &mut self,
        cmd: &AuthCommand,
        now: Duration,
        rng: &mut R,
        out: &mut Vec<u8>,
    ) -> Result<Outcome, Status> {
        let AuthCommand::Receive { al } = *cmd else {
            return Err(StatusCode::InvalidField.status());
        };
        if al > MAX_ALLOCATION_LEN {
            return Err(StatusCode::InvalidField.status());
        }
        if matches!(self.step, Step::Failed) {
            return Err(StatusCode::CommandSequenceError.status());
        }
        let _ = self.handle_timeout(now);
        let al = al as usize;
        let needed = match &self.step {
            Step::SendChallenge { hash, group } => {
                HEADER_LEN + hash.digest_len() + group.value_len()
            }
            Step::SendSuccess1 { done, r2 } => {
                HEADER_LEN + r2.as_ref().map_or(0, |_| done.hash.digest_len())
            }
            _ => FAILURE_LEN,
        };
        if al < needed {
            return Err(StatusCode::DataSglLengthInvalid.status());
        }
        out.clear();
        let outcome = match core::mem::replace(&mut self.step, Step::AwaitNegotiate) {
            Step::SendChallenge { hash, group } => {
                let mut c1 = Zeroizing::new(vec![0u8; hash.digest_len()]);
                rng.fill_bytes(&mut c1);
                let s1 = loop {
                    let s = rng.next_u32();
                    if s != 0 {
                        break s;
                    }
                };
                let dh = match group {
                    DhGroup::Null => None,
                    // Only the null group has no exchange, and it is the arm above.
                    _ => PrivateKey::generate(group, rng).ok(),
                };
                let dh_value = dh.as_ref().map_or_else(Vec::new, PrivateKey::public_value);
                Message::Challenge(Challenge {
                    t_id: self.t_id,
                    hash_id: hash.id(),
                    dh_group_id: group.id(),
                    seqnum: s1,
                    challenge: c1.to_vec(),
                    dh_value,
                })
                .encode(out);
                self.step = Step::AwaitReply {
                    hash,
                    group,
                    c1,
                    s1,
                    dh,
                };
                self.arm(now);
                Outcome::Continue
            }
            Step::SendSuccess1 { done, r2 } => {
                Message::Success1(Success1 {
                    t_id: self.t_id,
                    hl: done.hash.hl(),
                    response: r2.as_ref().map(|r| r.as_bytes().to_vec()),
                })
                .encode(out);
                if done.bidirectional {
                    self.step = Step::AwaitSuccess2 { done };
                    self.arm(now);
                    Outcome::Continue
                } else {
                    self.authenticated = true;
                    self.deadline = None;
                    Outcome::Authenticated(done)
                }
            }
            Step::SendFailure1 { reason } => {
                Message::Failure1(Failure::new(self.t_id, reason)).encode(out);
                self.fail(reason, false)
            }
            _ => {
                // The host should be sending: Linux answers Failure1 "failed" and gives up.
                Message::Failure1(Failure::new(self.t_id, Reason::Failed)).encode(out);
                self.fail(Reason::Failed, false)
            }
        };
        out.resize(al, 0);
        Ok(outcome)
    }
}

struct ReplyCheck<'a> {
    hash: HashId,
    group: DhGroup,
    c1: &'a [u8],
    s1: u32,
    dh: Option<&'a PrivateKey>,
}

fn check(config: &TargetConfig) -> Result<(), ConfigError> {
    if config.host_nqn.is_empty() || config.subsys_nqn.is_empty() {
        return Err(ConfigError::EmptyNqn);
    }
    if config.hashes.is_empty() {
        return Err(ConfigError::NoHash);
    }
    if config.dh_groups.is_empty() {
        return Err(ConfigError::NoDhGroup);
    }
    if config.keys.is_empty() {
        return Err(ConfigError::NoKeys);
    }
    Ok(())
}
