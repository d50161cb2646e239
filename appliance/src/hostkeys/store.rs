//! [`HostKeys`]: the durable host-key store the enrolment service, the admin service and the
//! NVMe/TCP target share.
//!
//! The table in memory is always what the file holds: a change is applied to a copy, the copy
//! is written durably ([`StoreFile::save`]), and only then does it replace the table readers see
//! and the caller get its answer. Changes are serialized by one lock held across the write;
//! readers ([`HostKeys::keys_for`], [`HostKeys::list`]) never wait for a write. The one thing
//! kept in memory only until the next change is when a host last authenticated with its
//! current pair: writing the file at every connect of every queue would cost an fsync each.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use edgevol_nvmeof::auth::{KeyPair as AuthKeyPair, Secret};

use super::file::{StoreError, StoreFile};
use super::secret;
use super::table::{Confirmation, Fingerprint, KeyPair, Revocation, RevokedCert, Table};
use super::KeyError;

/// One pair that authenticates a host: what the target checks a host against.
#[derive(Debug, Clone)]
pub struct HostKey {
    /// The pair's generation: tell it back to [`HostKeys::confirm`].
    pub generation: u64,
    /// The host's secret (the host proves itself with it).
    pub host_secret: Secret,
    /// The controller's secret (the target proves itself with it, when the host asks).
    pub ctrl_secret: Secret,
}

impl HostKey {
    /// The pair as the target's authenticator takes it: bidirectional authentication is
    /// always possible, since every node has a controller secret.
    pub fn to_auth(&self) -> AuthKeyPair {
        AuthKeyPair {
            host: self.host_secret.clone(),
            controller: Some(self.ctrl_secret.clone()),
        }
    }
}

impl From<&KeyPair> for HostKey {
    fn from(p: &KeyPair) -> Self {
        HostKey {
            generation: p.generation,
            host_secret: p.host.clone(),
            ctrl_secret: p.ctrl.clone(),
        }
    }
}

/// The answer to an enrolment.
#[derive(Debug, Clone)]
pub struct Enrolment {
    /// The node's newest pair.
    pub key: HostKey,
    /// Whether this call bound the NQN to the node (its first enrolment).
    pub bound: bool,
}

/// A node as [`HostKeys::list`] shows it: never its secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its name.
    pub node: String,
    /// The host NQN bound to it.
    pub host_nqn: String,
    /// The newest pair's generation.
    pub generation: u64,
    /// Whether an older pair still works (the host has not used the newest yet).
    pub rotation_pending: bool,
    /// When it first enrolled (Unix seconds).
    pub enrolled: u64,
    /// When its newest pair was made (Unix seconds).
    pub keys_created: u64,
    /// When its host last authenticated (Unix seconds), if ever.
    pub last_authenticated: Option<u64>,
}

/// What [`HostKeys::list`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Every enrolled node, by name.
    pub nodes: Vec<NodeInfo>,
    /// Every revoked certificate, oldest first.
    pub revoked: Vec<RevokedCert>,
}

/// A revocation, as told to the hooks: the host to cut off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokedHost {
    /// The node whose keys were revoked.
    pub node: String,
    /// Its host NQN, which no longer authenticates.
    pub host_nqn: String,
}

/// Called after each revocation is durable (see [`HostKeys::on_revoke`]).
pub type RevokeHook = Arc<dyn Fn(&RevokedHost) + Send + Sync>;

/// The host-key store of one appliance.
pub struct HostKeys {
    file: StoreFile,
    /// Held across each change and its write: changes apply in order, none is lost.
    writer: Mutex<()>,
    /// What the file holds.
    table: RwLock<Arc<Table>>,
    /// Authentications with a current pair not yet written: node name → Unix seconds.
    seen: Mutex<BTreeMap<String, u64>>,
    hooks: Mutex<Vec<RevokeHook>>,
}

impl fmt::Debug for HostKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The table's secrets are redacted anyway; a count is all a log needs.
        f.debug_struct("HostKeys")
            .field("file", &self.file.path())
            .field("nodes", &self.read().nodes().count())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data consistent (the table is swapped whole), so a
    // panic elsewhere while holding a lock is no reason to stop serving keys.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl HostKeys {
    /// Opens the store of data directory `data_dir` (see [`super::file`] for what refuses).
    pub fn open(data_dir: &Path) -> Result<HostKeys, StoreError> {
        let file = StoreFile::in_dir(data_dir);
        let table = file.load()?;
        tracing::info!(
            path = %file.path().display(),
            nodes = table.nodes().count(),
            revoked_certificates = table.revoked().len(),
            "host key store loaded"
        );
        Ok(HostKeys {
            file,
            writer: Mutex::new(()),
            table: RwLock::new(Arc::new(table)),
            seen: Mutex::new(BTreeMap::new()),
            hooks: Mutex::new(Vec::new()),
        })
    }

    fn read(&self) -> Arc<Table> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Applies `change` to a copy of the table; if it changed something (its `bool`), writes
    /// the copy durably and installs it. On any error nothing changes.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Table) -> Result<(T, bool), KeyError>,
    ) -> Result<T, KeyError> {
        let _writing = lock(&self.writer);
        let mut next = Table::clone(&self.read());
        let (answer, changed) = change(&mut next)?;
        if changed {
            let seen = std::mem::take(&mut *lock(&self.seen));
            next.record_authentications(&seen);
            if let Err(e) = self.file.save(&next) {
                // Keep what was seen for the next write.
                let mut now_seen = lock(&self.seen);
                for (node, at) in seen {
                    let entry = now_seen.entry(node).or_insert(at);
                    *entry = (*entry).max(at);
                }
                return Err(KeyError::Store(e));
            }
            *self.table.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        }
        Ok(answer)
    }

    /// The pairs that authenticate `host_nqn`, newest first: empty for an NQN no node holds
    /// (never enrolled, or revoked), two while a rotation is pending.
    pub fn keys_for(&self, host_nqn: &str) -> Vec<HostKey> {
        self.read()
            .keys_for(host_nqn)
            .into_iter()
            .map(HostKey::from)
            .collect()
    }

    /// Tells the store that `host_nqn` authenticated with pair `generation`. If that is the
    /// pair of a pending rotation, the rotation completes: the older pair is dropped, durably,
    /// before this returns (it blocks on a file write then, once per rotation: call it off the
    /// async reactor). Otherwise only the time is noted, in memory.
    pub fn confirm(&self, host_nqn: &str, generation: u64) -> Result<Confirmation, StoreError> {
        let at = now();
        match self.read().confirmation(host_nqn, generation) {
            Confirmation::Unknown => return Ok(Confirmation::Unknown),
            Confirmation::Current => {
                if let Some((node, _)) = self.read().owner(host_nqn) {
                    lock(&self.seen).insert(node.to_owned(), at);
                }
                return Ok(Confirmation::Current);
            }
            Confirmation::Completed { .. } => {}
        }
        // Decided again under the writer lock: a rotation or revocation may have come between.
        let result = self.change(|t| {
            let c = t.confirm(host_nqn, generation, at);
            Ok((c, matches!(c, Confirmation::Completed { .. })))
        });
        match result {
            Ok(Confirmation::Completed { dropped }) => {
                tracing::info!(
                    host_nqn,
                    generation,
                    dropped,
                    "key rotation complete: the host authenticated with its new keys"
                );
                Ok(Confirmation::Completed { dropped })
            }
            Ok(other) => Ok(other),
            Err(KeyError::Store(e)) => Err(e),
            Err(other) => unreachable!("confirm fails only to write: {other}"),
        }
    }

    /// Calls `hook` after every revocation, once it is durable (the target closes the host's
    /// connections with it). Hooks run on the revoking thread, in the order they were added.
    pub fn on_revoke(&self, hook: RevokeHook) {
        lock(&self.hooks).push(hook);
    }

    /// Enrols `host_nqn` for node `node` presenting certificate `cert` (see [`Table::enrol`]):
    /// durable before it returns. Blocks on a file write when it changes the table.
    pub fn enrol(
        &self,
        node: &str,
        cert: Fingerprint,
        host_nqn: &str,
    ) -> Result<Enrolment, KeyError> {
        edgevol_pki::files::check_name(node).map_err(KeyError::InvalidNode)?;
        if !crate::naming::is_host_nqn(host_nqn) {
            return Err(KeyError::InvalidNqn(host_nqn.to_owned()));
        }
        let at = now();
        self.change(|t| {
            let e = t.enrol(node, cert, host_nqn, at, &mut secret::generate)?;
            let answer = Enrolment {
                key: HostKey::from(&e.pair),
                bound: e.bound,
            };
            Ok((answer, e.changed))
        })
    }

    /// Gives `node` a new pair, pending until its host authenticates with it; returns the new
    /// generation. Durable before it returns.
    pub fn rotate(&self, node: &str) -> Result<u64, KeyError> {
        edgevol_pki::files::check_name(node).map_err(KeyError::InvalidNode)?;
        let at = now();
        self.change(|t| Ok((t.rotate(node, at, &mut secret::generate)?, true)))
    }

    /// Removes `node`'s keys and binding and revokes its certificates, durably, then tells the
    /// hooks.
    pub fn revoke(&self, node: &str) -> Result<Revocation, KeyError> {
        edgevol_pki::files::check_name(node).map_err(KeyError::InvalidNode)?;
        let at = now();
        let revocation = self.change(|t| Ok((t.revoke(node, at)?, true)))?;
        lock(&self.seen).remove(node);
        let host = RevokedHost {
            node: revocation.node.clone(),
            host_nqn: revocation.host_nqn.clone(),
        };
        let hooks = lock(&self.hooks).clone();
        for hook in hooks {
            hook(&host);
        }
        Ok(revocation)
    }

    /// Every node and revoked certificate, without secrets.
    pub fn list(&self) -> Listing {
        let table = self.read();
        let seen = lock(&self.seen).clone();
        let nodes = table
            .nodes()
            .map(|(name, n)| NodeInfo {
                node: name.to_owned(),
                host_nqn: n.host_nqn.clone(),
                generation: n.newest().generation,
                rotation_pending: n.pending.is_some(),
                enrolled: n.enrolled,
                keys_created: n.newest().created,
                last_authenticated: n
                    .last_authenticated
                    .max(seen.get(name).copied().filter(|at| *at >= n.enrolled)),
            })
            .collect();
        Listing {
            nodes,
            revoked: table.revoked().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
    const B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";

    fn reopen(dir: &Path) -> HostKeys {
        HostKeys::open(dir).unwrap()
    }

    fn generations(keys: &HostKeys, nqn: &str) -> Vec<u64> {
        keys.keys_for(nqn).iter().map(|k| k.generation).collect()
    }

    #[test]
    fn every_change_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let keys = reopen(dir.path());
        let first = keys.enrol("node-a", [1; 32], A).unwrap();
        assert!(first.bound);
        let mode = std::fs::metadata(dir.path().join("host-keys"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);

        // Enrolment.
        let keys = reopen(dir.path());
        let again = keys.enrol("node-a", [1; 32], A).unwrap();
        assert!(!again.bound);
        assert_eq!(again.key.generation, first.key.generation);
        assert!(again.key.host_secret.ct_eq(&first.key.host_secret));
        assert!(again.key.ctrl_secret.ct_eq(&first.key.ctrl_secret));
        assert!(
            !first.key.host_secret.ct_eq(&first.key.ctrl_secret),
            "two secrets, drawn apart"
        );
        let pair = first.key.to_auth();
        assert!(pair.host.ct_eq(&first.key.host_secret));
        assert!(pair
            .controller
            .is_some_and(|c| c.ct_eq(&first.key.ctrl_secret)));

        // Rotation, pending.
        let g2 = keys.rotate("node-a").unwrap();
        let keys = reopen(dir.path());
        assert_eq!(generations(&keys, A), [g2, first.key.generation]);
        assert!(keys.list().nodes[0].rotation_pending);

        // Confirmation of the new pair drops the old one.
        assert_eq!(
            keys.confirm(A, g2).unwrap(),
            Confirmation::Completed {
                dropped: first.key.generation
            }
        );
        let keys = reopen(dir.path());
        assert_eq!(generations(&keys, A), [g2]);
        let listed = &keys.list().nodes[0];
        assert!(!listed.rotation_pending);
        assert!(listed.last_authenticated.is_some());

        // Revocation.
        keys.revoke("node-a").unwrap();
        let keys = reopen(dir.path());
        assert!(keys.keys_for(A).is_empty());
        assert!(keys.list().nodes.is_empty());
        assert_eq!(keys.list().revoked.len(), 1);
        assert!(matches!(
            keys.enrol("node-a", [1; 32], A),
            Err(KeyError::CertificateRevoked { .. })
        ));
    }

    #[test]
    fn a_failed_write_changes_nothing_and_answers_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let keys = reopen(dir.path());
        keys.enrol("node-a", [1; 32], A).unwrap();
        // A directory where the temporary file goes makes the next write fail.
        std::fs::create_dir(dir.path().join("host-keys.tmp")).unwrap();
        let e = keys.enrol("node-b", [2; 32], B).unwrap_err();
        assert!(matches!(e, KeyError::Store(_)), "{e}");
        assert!(keys.keys_for(B).is_empty(), "not acknowledged, not served");
        assert!(matches!(keys.rotate("node-a"), Err(KeyError::Store(_))));
        assert_eq!(generations(&keys, A), [1]);
        std::fs::remove_dir(dir.path().join("host-keys.tmp")).unwrap();
        assert_eq!(
            keys.rotate("node-a").unwrap(),
            2,
            "the failed rotation used no generation"
        );
    }

    #[test]
    fn authentication_times_are_kept_in_memory_and_written_with_the_next_change() {
        let dir = tempfile::tempdir().unwrap();
        let keys = reopen(dir.path());
        keys.enrol("node-a", [1; 32], A).unwrap();
        assert_eq!(keys.list().nodes[0].last_authenticated, None);
        let before = std::fs::read(dir.path().join("host-keys")).unwrap();
        assert_eq!(keys.confirm(A, 1).unwrap(), Confirmation::Current);
        assert!(keys.list().nodes[0].last_authenticated.is_some());
        assert_eq!(
            std::fs::read(dir.path().join("host-keys")).unwrap(),
            before,
            "no write for a current pair"
        );
        assert_eq!(keys.confirm(B, 1).unwrap(), Confirmation::Unknown);
        assert_eq!(keys.confirm(A, 7).unwrap(), Confirmation::Unknown);
        keys.enrol("node-b", [2; 32], B).unwrap();
        let keys = reopen(dir.path());
        assert!(keys.list().nodes[0].last_authenticated.is_some());
    }

    #[test]
    fn revocation_hooks_hear_of_each_revocation_after_it_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let keys = Arc::new(reopen(dir.path()));
        keys.enrol("node-a", [1; 32], A).unwrap();
        let heard = Arc::new(Mutex::new(Vec::new()));
        {
            let (heard, dir) = (heard.clone(), dir.path().to_path_buf());
            keys.on_revoke(Arc::new(move |host: &RevokedHost| {
                // Durable already: a fresh open agrees.
                let durable = HostKeys::open(&dir)
                    .unwrap()
                    .keys_for(&host.host_nqn)
                    .is_empty();
                heard.lock().unwrap().push((host.clone(), durable));
            }));
        }
        keys.revoke("node-a").unwrap();
        assert!(keys.revoke("node-a").is_err());
        let heard = heard.lock().unwrap();
        assert_eq!(
            *heard,
            [(
                RevokedHost {
                    node: "node-a".into(),
                    host_nqn: A.into()
                },
                true
            )]
        );
    }

    #[test]
    fn bad_names_and_nqns_are_refused_before_anything_happens() {
        let dir = tempfile::tempdir().unwrap();
        let keys = reopen(dir.path());
        assert!(matches!(
            keys.enrol("node-a", [1; 32], "not-an-nqn"),
            Err(KeyError::InvalidNqn(_))
        ));
        assert!(matches!(
            keys.enrol("../etc", [1; 32], A),
            Err(KeyError::InvalidNode(_))
        ));
        assert!(matches!(keys.rotate(""), Err(KeyError::InvalidNode(_))));
        assert!(matches!(
            keys.rotate("node-a"),
            Err(KeyError::UnknownNode(_))
        ));
        assert!(!dir.path().join("host-keys").exists(), "nothing written");
    }

    #[test]
    fn debug_output_carries_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let keys = reopen(dir.path());
        let e = keys.enrol("node-a", [1; 32], A).unwrap();
        let k = &e.key;
        let texts = [
            format!("{keys:?}"),
            format!("{e:?}"),
            format!("{:?}", keys.keys_for(A)),
            format!("{:?}", keys.list()),
            format!("{:?}", keys.read()),
            format!("{:?}", k.to_auth()),
        ];
        for text in texts {
            assert!(!text.contains("DHHC"), "{text}");
            for secret in [&k.host_secret, &k.ctrl_secret] {
                let encoded = secret.encode();
                let base64 = &encoded["DHHC-1:01:".len()..encoded.len() - 1];
                assert!(!text.contains(base64), "{text}");
            }
        }
    }
}
