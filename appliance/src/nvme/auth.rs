//! In-band authentication on the data path, the policy half (the protocol is
//! [`edgevol_nvmeof::auth`]): at Connect, whether a host must authenticate and with which key
//! pairs (the host-key store); after a transaction, what its outcome leaves behind — a completed
//! key rotation, or a failure that is logged (host NQN, peer address, reason; never a key),
//! counted, and charged to the peer's address, which is turned away for a while after repeated
//! failures.
//!
//! Every queue of a host that holds keys authenticates: the admin queue and each I/O queue,
//! of volume and discovery controllers alike (Linux's host authenticates every queue the
//! Connect response asks it to). A host without keys is refused unless the appliance allows
//! unauthenticated hosts (`nvme.allow_unauthenticated_hosts`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use edgevol_nvmeof::auth::messages::{auth_id, auth_type, Header};
use edgevol_nvmeof::auth::{Authenticated, Authenticator, TargetConfig};
use edgevol_nvmeof::fabrics::Rejected;
use edgevol_nvmeof::fabrics_cmd::connect_data_offset;
use edgevol_nvmeof::status::StatusCode;

use crate::config::HostAuthPolicy;
use crate::hostkeys::HostKeys;

use super::subsys::connect_data_error;

/// Failures from one address within [`STRIKE_WINDOW`] after which it is turned away.
pub const MAX_STRIKES: u32 = 5;
/// The window in which failures add up, and how long a turned-away address waits.
pub const STRIKE_WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at most; older entries go first when more fail at once.
const MAX_TRACKED: usize = 4096;

/// The counters the metrics exporter shows.
#[derive(Debug, Default)]
pub struct AuthCounters {
    /// Queues that authenticated (re-authentications included).
    pub succeeded: AtomicU64,
    /// Transactions that failed or timed out.
    pub failed: AtomicU64,
    /// Connects refused before any transaction: no keys, or the address is turned away.
    pub refused: AtomicU64,
}

/// How a Connect proceeds.
#[derive(Debug)]
pub enum Admission {
    /// Without authentication: the host holds no keys and the appliance allows that.
    Open,
    /// The queue must authenticate (ATR in the Connect response) before anything else runs.
    Authenticate(Box<QueueAuth>),
}

/// One queue's authentication: the protocol state and what to tell the key store once it
/// completes.
#[derive(Debug)]
pub struct QueueAuth {
    /// The protocol state machine.
    pub authenticator: Authenticator,
    host_nqn: String,
    /// Generation of each candidate pair, by index.
    generations: Vec<u64>,
    /// How long a host may take, from Connect to a completed first authentication.
    timeout: Duration,
    /// When the first authentication must be complete (time since the connection's epoch).
    must_by: Option<Duration>,
}

impl QueueAuth {
    /// Whether the queue takes commands other than Fabrics ones.
    pub fn is_authenticated(&self) -> bool {
        self.authenticator.is_authenticated()
    }

    /// Starts the clock at the Connect (`now`): a queue that has not authenticated one
    /// transaction timeout later is closed, so an unauthenticated connection cannot hold a
    /// controller open with Fabrics commands alone.
    pub fn start(&mut self, now: Duration) {
        self.must_by = Some(now.saturating_add(self.timeout));
    }

    /// The next time [`QueueAuth::on_timer`] has something to do.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let first = self.must_by.filter(|_| !self.is_authenticated());
        match (self.authenticator.poll_timeout(), first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Expires what is due at `now`; `Some(why)` when the queue must close because it has not
    /// authenticated in time.
    pub fn on_timer(&mut self, now: Duration) -> Option<&'static str> {
        if let Some(expired) = self.authenticator.handle_timeout(now) {
            if !expired.authenticated {
                return Some("the authentication transaction timed out");
            }
        }
        match self.must_by {
            Some(by) if now >= by && !self.is_authenticated() => {
                Some("no authentication within the transaction timeout of the Connect")
            }
            _ => None,
        }
    }

    /// Whether an AUTH_Send's data is an AUTH_Negotiate (which starts a transaction).
    pub fn is_negotiate(data: &[u8]) -> bool {
        Header::decode(data)
            .is_ok_and(|h| h.auth_type == auth_type::COMMON && h.auth_id == auth_id::NEGOTIATE)
    }

    /// The host NQN (for the log).
    pub fn host_nqn(&self) -> &str {
        &self.host_nqn
    }
}

#[derive(Debug, Clone, Copy)]
struct Strikes {
    count: u32,
    since: Instant,
    last: Instant,
}

/// The data path's authentication policy, shared by every connection.
#[derive(Debug)]
pub struct HostAuth {
    keys: Arc<HostKeys>,
    policy: HostAuthPolicy,
    strikes: Mutex<HashMap<IpAddr, Strikes>>,
    /// What the exporter shows.
    pub counters: Arc<AuthCounters>,
}

impl HostAuth {
    /// The policy over the host-key store.
    pub fn new(keys: Arc<HostKeys>, policy: HostAuthPolicy) -> Self {
        HostAuth {
            keys,
            policy,
            strikes: Mutex::new(HashMap::new()),
            counters: Arc::default(),
        }
    }

    /// The store (the target's revocation hook is registered on it).
    pub fn keys(&self) -> &Arc<HostKeys> {
        &self.keys
    }

    /// Decides a Connect of `host_nqn` to `subsys_nqn` from `peer`: open, authenticate with
    /// the host's pairs, or refuse (Connect Invalid Host naming HOSTNQN for a host without
    /// keys; Connect Controller Busy, which a host retries, for an address turned away).
    pub fn admit(
        &self,
        host_nqn: &str,
        subsys_nqn: &str,
        peer: Option<SocketAddr>,
        transaction_timeout: Duration,
    ) -> Result<Admission, Rejected> {
        if let Some(ip) = peer.map(|p| p.ip()) {
            if self.turned_away(ip, Instant::now()) {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(host_nqn, %ip, "Connect from an address turned away after repeated authentication failures");
                return Err(StatusCode::ConnectControllerBusy.status().into());
            }
        }
        let keys = self.keys.keys_for(host_nqn);
        if keys.is_empty() {
            if self.policy.allow_unauthenticated_hosts {
                return Ok(Admission::Open);
            }
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                host_nqn,
                peer = ?peer,
                subsystem = subsys_nqn,
                reason = "the host holds no DH-HMAC-CHAP keys (not enrolled, or revoked)",
                "Connect refused"
            );
            return Err(connect_data_error(
                StatusCode::ConnectInvalidHost,
                connect_data_offset::HOSTNQN,
            ));
        }
        let generations = keys.iter().map(|k| k.generation).collect();
        let pairs = keys.iter().map(|k| k.to_auth()).collect();
        let mut config = TargetConfig::new(host_nqn, subsys_nqn, pairs);
        config.hashes.clone_from(&self.policy.hashes);
        config.dh_groups.clone_from(&self.policy.dh_groups);
        config.transaction_timeout = transaction_timeout;
        let authenticator = Authenticator::new(config).map_err(|e| {
            tracing::error!(host_nqn, error = %e, "authentication set-up failed");
            Rejected::from(StatusCode::InternalError.status())
        })?;
        Ok(Admission::Authenticate(Box::new(QueueAuth {
            authenticator,
            host_nqn: host_nqn.to_owned(),
            generations,
            timeout: transaction_timeout,
            must_by: None,
        })))
    }

    /// Gives `queue` the pairs that authenticate its host now (a rotation adds one, a completed
    /// rotation drops one), before a new transaction: the pairs a queue takes are otherwise
    /// those of its Connect, and a live controller could not re-authenticate with a rotated
    /// pair (Linux does, when the node writes it to `dhchap_secret` / `dhchap_ctrl_secret`).
    /// False when the host holds no pairs any more (revoked between its Connect and now, a race
    /// the revocation's disconnect can miss): the transaction must not start.
    pub fn refresh(&self, queue: &mut QueueAuth) -> bool {
        let keys = self.keys.keys_for(&queue.host_nqn);
        let generations: Vec<u64> = keys.iter().map(|k| k.generation).collect();
        if keys.is_empty() {
            return false;
        }
        if generations != queue.generations {
            let pairs = keys.iter().map(|k| k.to_auth()).collect();
            if queue.authenticator.set_keys(pairs).is_ok() {
                queue.generations = generations;
            }
        }
        true
    }

    /// A queue authenticated: clears its address's strikes and tells the store which pair
    /// the host used (which completes a pending rotation: a file write, so off the reactor).
    pub fn succeeded(&self, queue: &QueueAuth, done: &Authenticated, peer: Option<SocketAddr>) {
        self.counters.succeeded.fetch_add(1, Ordering::Relaxed);
        if let Some(ip) = peer.map(|p| p.ip()) {
            lock(&self.strikes).remove(&ip);
        }
        let Some(&generation) = queue.generations.get(done.key_index) else {
            return;
        };
        tracing::debug!(
            host_nqn = %queue.host_nqn,
            generation,
            hash = ?done.hash,
            dh_group = ?done.dh_group,
            bidirectional = done.bidirectional,
            reauthentication = done.reauthentication,
            "queue authenticated"
        );
        let (keys, host) = (self.keys.clone(), queue.host_nqn.clone());
        let confirm = move || {
            if let Err(e) = keys.confirm(&host, generation) {
                tracing::error!(host_nqn = %host, generation, error = %e, "recording the key rotation failed; the old key stays valid until the next authentication");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(confirm)),
            Err(_) => confirm(),
        }
    }

    /// A re-authentication the host ended because it did not accept the controller's response
    /// (after proving its own key: typically a key rotation half applied on the host): logged
    /// and counted as a failure, not charged to the peer's address; the queue stays
    /// authenticated.
    pub fn controller_rejected(
        &self,
        host_nqn: &str,
        peer: Option<SocketAddr>,
        why: &dyn std::fmt::Display,
    ) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            host_nqn,
            peer = ?peer,
            reason = %why,
            "re-authentication failed: the host refused the controller's response; the queue \
             stays authenticated with its earlier transaction"
        );
    }

    /// A transaction failed (or timed out, `why` says so): logs it, counts it, and charges it to
    /// the peer's address.
    pub fn failed(&self, host_nqn: &str, peer: Option<SocketAddr>, why: &dyn std::fmt::Display) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        let blocked = peer.is_some_and(|p| self.strike(p.ip(), Instant::now()));
        tracing::warn!(
            host_nqn,
            peer = ?peer,
            reason = %why,
            turned_away_for_s = blocked.then_some(STRIKE_WINDOW.as_secs()),
            "authentication failed"
        );
    }

    /// Counts a failure of `ip` at `now`; true when that turns it away.
    fn strike(&self, ip: IpAddr, now: Instant) -> bool {
        let mut all = lock(&self.strikes);
        if all.len() >= MAX_TRACKED && !all.contains_key(&ip) {
            all.retain(|_, s| now.duration_since(s.last) < STRIKE_WINDOW);
            if all.len() >= MAX_TRACKED {
                if let Some(oldest) = all.iter().min_by_key(|(_, s)| s.last).map(|(ip, _)| *ip) {
                    all.remove(&oldest);
                }
            }
        }
        let s = all.entry(ip).or_insert(Strikes {
            count: 0,
            since: now,
            last: now,
        });
        if now.duration_since(s.since) >= STRIKE_WINDOW && s.count < MAX_STRIKES {
            *s = Strikes {
                count: 0,
                since: now,
                last: now,
            };
        }
        s.count += 1;
        s.last = now;
        s.count == MAX_STRIKES
    }

    /// Whether `ip` failed [`MAX_STRIKES`] times and its last failure is under
    /// [`STRIKE_WINDOW`] old.
    fn turned_away(&self, ip: IpAddr, now: Instant) -> bool {
        let mut all = lock(&self.strikes);
        match all.get(&ip) {
            Some(s) if s.count >= MAX_STRIKES => {
                if now.duration_since(s.last) < STRIKE_WINDOW {
                    true
                } else {
                    all.remove(&ip);
                    false
                }
            }
            _ => false,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: bool) -> (tempfile::TempDir, HostAuth) {
        let dir = tempfile::tempdir().unwrap();
        let keys = Arc::new(HostKeys::open(dir.path()).unwrap());
        let auth = HostAuth::new(
            keys,
            HostAuthPolicy {
                allow_unauthenticated_hosts: allow,
                ..HostAuthPolicy::default()
            },
        );
        (dir, auth)
    }

    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
    const SUBSYS: &str = "nqn.2026-01.io.edgevol:a:v1";

    #[test]
    fn a_host_without_keys_is_refused_unless_the_appliance_allows_it() {
        let (_d, strict) = policy(false);
        let e = strict
            .admit(HOST, SUBSYS, None, Duration::from_secs(5))
            .expect_err("refused");
        assert_eq!(e.status, StatusCode::ConnectInvalidHost.status());
        assert_eq!(strict.counters.refused.load(Ordering::Relaxed), 1);
        let (_d, open) = policy(true);
        assert!(matches!(
            open.admit(HOST, SUBSYS, None, Duration::from_secs(5)),
            Ok(Admission::Open)
        ));
    }

    #[test]
    fn repeated_failures_turn_an_address_away_for_a_window() {
        let (_d, auth) = policy(true);
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let other: IpAddr = "192.0.2.8".parse().unwrap();
        let t0 = Instant::now();
        for i in 1..MAX_STRIKES {
            assert!(!auth.strike(ip, t0), "strike {i}");
            assert!(!auth.turned_away(ip, t0));
        }
        assert!(auth.strike(ip, t0));
        assert!(auth.turned_away(ip, t0 + Duration::from_secs(1)));
        assert!(!auth.turned_away(other, t0));
        let peer = SocketAddr::new(ip, 4420);
        let e = auth
            .admit(HOST, SUBSYS, Some(peer), Duration::from_secs(5))
            .expect_err("turned away");
        assert_eq!(e.status, StatusCode::ConnectControllerBusy.status());
        assert!(!auth.turned_away(ip, t0 + STRIKE_WINDOW));
    }

    #[test]
    fn failures_spread_over_more_than_a_window_do_not_add_up() {
        let (_d, auth) = policy(true);
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        let t0 = Instant::now();
        for i in 0..3 * MAX_STRIKES {
            let at = t0 + STRIKE_WINDOW / 2 * i;
            assert!(!auth.strike(ip, at), "failure {i}");
        }
    }

    #[test]
    fn a_queue_admitted_before_a_revocation_cannot_start_a_transaction_after_it() {
        let (_d, auth) = policy(false);
        auth.keys().enrol("node", [7; 32], HOST).unwrap();
        let Ok(Admission::Authenticate(mut queue)) =
            auth.admit(HOST, SUBSYS, None, Duration::from_secs(5))
        else {
            panic!("an enrolled host authenticates");
        };
        assert!(auth.refresh(&mut queue), "keys held");
        auth.keys().revoke("node").unwrap();
        assert!(
            !auth.refresh(&mut queue),
            "revoked between Connect and Negotiate"
        );
    }
}
