//! In-band authentication: the target side of DH-HMAC-CHAP (NVMe base specification 2.x
//! "Authentication", TP 8006), sans-I/O, as Linux's nvmet does it
//! (drivers/nvme/target/fabrics-cmd-auth.c, auth.c; drivers/nvme/common/auth.c) and as Linux's
//! host (drivers/nvme/host/auth.c) expects it.
//!
//! Modules: [`secret`] (`DHHC-1:hh:…:` secrets and their NQN transform), [`hash`] (SHA-2,
//! HMAC, responses, augmented challenge), [`dh`] (null and RFC 7919 groups), [`messages`]
//! (every AUTH message, decode and encode), [`command`] (the AUTH_Send/Receive SQEs, the
//! Connect ATR bit, which commands need authentication), [`target`] (the per-queue state
//! machine) and, with the `test-initiator` feature, `host` (Linux's host side, for tests).
//!
//! # Driving one queue
//!
//! 1. **Connect.** When policy requires authentication for the host, answer the Connect (admin
//!    queue and every I/O queue) with [`command::connect_result`]`(cntlid, true)` (ATR set) and
//!    create an [`Authenticator`] from a [`TargetConfig`]: the Connect's host and subsystem
//!    NQNs, the allowed hashes and DH groups (preference order), the candidate [`KeyPair`]s
//!    (host secret + optional controller secret; several during a key rotation) and the
//!    transaction timeout (the controller's KATO, or 120 s).
//! 2. **Gate.** Until [`Authenticator::is_authenticated`], answer every command for which
//!    [`command::allowed_before_authentication`] is false with
//!    [`command::authentication_required`] (Authentication Required, 0x191, DNR). Fabrics
//!    commands (Property Get/Set, AUTH_Send/Receive, Disconnect) pass.
//! 3. **AUTH commands.** Parse with [`AuthCommand::parse`] (SECP E9h, SPSP 01h/01h, non-zero
//!    length matching the SGL; `Err(status)`: complete with it), then
//!    - AUTH_Send: [`Authenticator::on_auth_send`]`(&cmd, data, now)`;
//!    - AUTH_Receive: [`Authenticator::on_auth_receive`]`(&cmd, now, rng, &mut buf)`; `buf` is
//!      then exactly AL bytes: the command's read data.
//!
//!    `Err(status)` means complete the command with that status (the AL is too small, the
//!    data length does not match TL, a command after a failure). `Ok(outcome)` means complete
//!    it successfully (with `buf` for a Receive), then act on the [`Outcome`]:
//!    - `Continue`: nothing more;
//!    - `Authenticated(a)`: the queue takes all commands now; `a.key_index` names the key pair
//!      that matched (retire older pairs once the host uses the new one), `a.reauthentication`
//!      tells a re-authentication of a live queue;
//!    - `Failed(f)`: log `f` (never a key), then fail the controller: close every queue's
//!      connection (Linux `nvmet_ctrl_fatal_error`). A FAILURE1 the host must read is in
//!      `buf` of the Receive that returned it.
//! 4. **Timer.** [`Authenticator::poll_timeout`] gives the deadline of the transaction in
//!    progress; at that time call [`Authenticator::handle_timeout`]`(now)`: the transaction is
//!    reset (the host has to start again with a Negotiate), and a queue that is still not
//!    authenticated may be closed.
//! 5. **Re-authentication.** A host may send a Negotiate on an authenticated queue at any time
//!    (Linux does when its keys change); the queue stays authenticated during the transaction
//!    and loses it only if the transaction fails. [`Authenticator::set_keys`] changes the
//!    candidate pairs for the next one.
//!
//! A queue of a host that does not authenticate (Connect answered without ATR) has no
//! `Authenticator`: answer AUTH_Send/Receive there with Invalid Opcode (a Linux host
//! authenticates only when ATR asks it to).
//!
//! Randomness (challenges, sequence numbers, DH exponents) comes from the caller's
//! [`rand_core::CryptoRng`] (in edgevold, e.g. `rand::rng()`, a CSPRNG reseeded from the OS;
//! tests use a seeded one); time is a `Duration` since any monotonic origin. Secrets, session
//! keys and responses are zeroized when dropped and never shown by `Debug`.
//!
//! # Status summary
//!
//! | situation | answer |
//! |---|---|
//! | non-Fabrics command before authentication | Authentication Required (0x191), DNR |
//! | AUTH command: SECP not E9h, SPSP not 01h/01h, TL/AL 0 | Invalid Field, DNR |
//! | AUTH command: SGL length differs from TL/AL | Data SGL Length Invalid, DNR |
//! | AUTH_Receive: AL too small for the message to send | Data SGL Length Invalid, DNR (step kept) |
//! | AUTH_Receive: AL above [`target::MAX_ALLOCATION_LEN`] | Invalid Field, DNR |
//! | AUTH command after a failed transaction | Command Sequence Error, DNR |
//! | any protocol error (wrong message, t_id, key, hash, group) | success; FAILURE1 or `Failed` |

pub mod command;
pub mod dh;
pub mod hash;
#[cfg(any(test, feature = "test-initiator"))]
pub mod host;
pub mod messages;
pub mod secret;
pub mod target;

pub use command::AuthCommand;
pub use dh::DhGroup;
pub use hash::HashId;
pub use messages::Reason;
pub use secret::Secret;
pub use target::{
    Authenticated, Authenticator, ConfigError, Expired, Failed, KeyPair, Outcome, TargetConfig,
};

#[cfg(test)]
mod tests;
