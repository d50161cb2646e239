//! The host-key table: which node holds which host NQN and keys, and which certificates were
//! revoked. A plain value with pure operations (the caller gives the time and the source of new
//! secrets); [`super::store`] makes each change durable and [`super::file`] encodes it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use edgevol_nvmeof::auth::Secret;

use super::secret::{dhchap, RandomFailed};
use super::KeyError;

/// SHA-256 of a certificate (DER).
pub type Fingerprint = [u8; 32];

/// Every node's keys and binding, and the revoked certificates.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Table {
    /// The generation the next key pair gets: generations only grow, over every node, so a
    /// generation names one pair for the life of the appliance.
    pub(super) next_generation: u64,
    /// Enrolled nodes by name (their certificates' common name).
    pub(super) nodes: BTreeMap<String, Node>,
    /// Certificates that may no longer enrol.
    pub(super) revoked: Vec<RevokedCert>,
}

/// One enrolled node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Node {
    /// The host NQN bound to it at its first enrolment.
    pub host_nqn: String,
    /// When it first enrolled (Unix seconds).
    pub enrolled: u64,
    /// The pair the host has authenticated with (or the first one).
    pub current: KeyPair,
    /// A newer pair from a rotation that the host has not authenticated with yet.
    pub pending: Option<KeyPair>,
    /// Every certificate it enrolled with: revoked with it.
    pub certificates: Vec<Fingerprint>,
    /// When the host last authenticated on the data path (Unix seconds), as last written.
    pub last_authenticated: Option<u64>,
}

/// A host secret and a controller secret, made together.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyPair {
    /// Which pair this is.
    pub generation: u64,
    /// When it was made (Unix seconds).
    pub created: u64,
    /// The host's secret: the host proves itself with it.
    #[serde(with = "dhchap")]
    pub host: Secret,
    /// The controller's secret: the appliance proves itself with it (bidirectional).
    #[serde(with = "dhchap")]
    pub ctrl: Secret,
}

/// A certificate that may no longer enrol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedCert {
    /// The node it belonged to.
    pub node: String,
    /// Its SHA-256.
    pub sha256: Fingerprint,
    /// When (Unix seconds).
    pub revoked: u64,
}

/// What an enrolment did.
#[derive(Debug)]
pub struct Enrolled {
    /// The pair to give the node: the newest.
    pub pair: KeyPair,
    /// Whether this enrolment bound the NQN (the node's first).
    pub bound: bool,
    /// Whether the table changed (a first enrolment, or a new certificate of the node).
    pub changed: bool,
}

/// What a revocation removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The node.
    pub node: String,
    /// The NQN that was bound to it.
    pub host_nqn: String,
    /// How many of its certificates were revoked.
    pub certificates: usize,
}

/// What a successful authentication with a pair means for the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// No pair of that generation belongs to that NQN (revoked meanwhile, or a stale caller).
    Unknown,
    /// The current pair: nothing changes but the time.
    Current,
    /// The pending pair: the rotation is complete and the older pair, of this generation, is gone.
    Completed {
        /// The generation that no longer works.
        dropped: u64,
    },
}

impl KeyPair {
    fn fresh(
        generation: u64,
        now: u64,
        secret: &mut dyn FnMut() -> Result<Secret, RandomFailed>,
    ) -> Result<KeyPair, KeyError> {
        Ok(KeyPair {
            generation,
            created: now,
            host: secret().map_err(|_| KeyError::Random)?,
            ctrl: secret().map_err(|_| KeyError::Random)?,
        })
    }
}

impl Node {
    /// The pair a node is given: the pending one if a rotation is under way.
    pub fn newest(&self) -> &KeyPair {
        self.pending.as_ref().unwrap_or(&self.current)
    }
}

impl Table {
    /// The node bound to `host_nqn`, if any.
    pub fn owner(&self, host_nqn: &str) -> Option<(&str, &Node)> {
        self.nodes
            .iter()
            .find(|(_, n)| n.host_nqn == host_nqn)
            .map(|(name, n)| (name.as_str(), n))
    }

    /// An enrolled node.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// Every enrolled node, by name.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.nodes.iter().map(|(name, n)| (name.as_str(), n))
    }

    /// The revoked certificates, oldest first.
    pub fn revoked(&self) -> &[RevokedCert] {
        &self.revoked
    }

    /// The pairs that authenticate `host_nqn`, newest first: none, one, or two during a rotation.
    pub fn keys_for(&self, host_nqn: &str) -> Vec<&KeyPair> {
        match self.owner(host_nqn) {
            Some((_, node)) => node.pending.iter().chain([&node.current]).collect(),
            None => Vec::new(),
        }
    }

    fn next_pair(
        &mut self,
        now: u64,
        secret: &mut dyn FnMut() -> Result<Secret, RandomFailed>,
    ) -> Result<KeyPair, KeyError> {
        let generation = self.next_generation.max(1);
        let pair = KeyPair::fresh(generation, now, secret)?;
        self.next_generation = generation + 1;
        Ok(pair)
    }

    /// Node `node`, presenting certificate `cert`, enrols `host_nqn`: the first enrolment binds
    /// the NQN to the node; later ones by the same node and NQN get the same (newest) pair.
    /// Refused: a revoked certificate, an NQN bound to another node, a node bound to another NQN.
    pub fn enrol(
        &mut self,
        node: &str,
        cert: Fingerprint,
        host_nqn: &str,
        now: u64,
        secret: &mut dyn FnMut() -> Result<Secret, RandomFailed>,
    ) -> Result<Enrolled, KeyError> {
        if self.revoked.iter().any(|r| r.sha256 == cert) {
            return Err(KeyError::CertificateRevoked {
                node: node.to_owned(),
            });
        }
        if let Some((owner, _)) = self.owner(host_nqn).filter(|(owner, _)| *owner != node) {
            return Err(KeyError::NqnBound {
                host_nqn: host_nqn.to_owned(),
                owner: owner.to_owned(),
            });
        }
        if let Some(existing) = self.nodes.get_mut(node) {
            if existing.host_nqn != host_nqn {
                return Err(KeyError::NodeBound {
                    node: node.to_owned(),
                    host_nqn: existing.host_nqn.clone(),
                });
            }
            let new_cert = !existing.certificates.contains(&cert);
            if new_cert {
                existing.certificates.push(cert);
            }
            return Ok(Enrolled {
                pair: existing.newest().clone(),
                bound: false,
                changed: new_cert,
            });
        }
        let pair = self.next_pair(now, secret)?;
        self.nodes.insert(
            node.to_owned(),
            Node {
                host_nqn: host_nqn.to_owned(),
                enrolled: now,
                current: pair.clone(),
                pending: None,
                certificates: vec![cert],
                last_authenticated: None,
            },
        );
        Ok(Enrolled {
            pair,
            bound: true,
            changed: true,
        })
    }

    /// A new pair for `node`, pending until the host authenticates with it; replaces a pending
    /// pair no host has used. Returns its generation.
    pub fn rotate(
        &mut self,
        node: &str,
        now: u64,
        secret: &mut dyn FnMut() -> Result<Secret, RandomFailed>,
    ) -> Result<u64, KeyError> {
        if !self.nodes.contains_key(node) {
            return Err(KeyError::UnknownNode(node.to_owned()));
        }
        let pair = self.next_pair(now, secret)?;
        let generation = pair.generation;
        if let Some(n) = self.nodes.get_mut(node) {
            n.pending = Some(pair);
        }
        Ok(generation)
    }

    /// Removes `node`'s keys and binding and revokes the certificates it enrolled with.
    pub fn revoke(&mut self, node: &str, now: u64) -> Result<Revocation, KeyError> {
        let removed = self
            .nodes
            .remove(node)
            .ok_or_else(|| KeyError::UnknownNode(node.to_owned()))?;
        for sha256 in &removed.certificates {
            self.revoked.push(RevokedCert {
                node: node.to_owned(),
                sha256: *sha256,
                revoked: now,
            });
        }
        Ok(Revocation {
            node: node.to_owned(),
            host_nqn: removed.host_nqn.clone(),
            certificates: removed.certificates.len(),
        })
    }

    /// What it means that `host_nqn` authenticated with pair `generation` (see
    /// [`Table::confirm`]), without changing anything.
    pub fn confirmation(&self, host_nqn: &str, generation: u64) -> Confirmation {
        let Some((_, node)) = self.owner(host_nqn) else {
            return Confirmation::Unknown;
        };
        match &node.pending {
            Some(p) if p.generation == generation => Confirmation::Completed {
                dropped: node.current.generation,
            },
            _ if node.current.generation == generation => Confirmation::Current,
            _ => Confirmation::Unknown,
        }
    }

    /// `host_nqn` authenticated with pair `generation` at `now`: a pending pair becomes current
    /// and the older one is dropped; the time is recorded.
    pub fn confirm(&mut self, host_nqn: &str, generation: u64, now: u64) -> Confirmation {
        let confirmation = self.confirmation(host_nqn, generation);
        let Some(node) = self.nodes.values_mut().find(|n| n.host_nqn == host_nqn) else {
            return confirmation;
        };
        match confirmation {
            Confirmation::Unknown => {}
            Confirmation::Current => node.last_authenticated = Some(now),
            Confirmation::Completed { .. } => {
                if let Some(pending) = node.pending.take() {
                    node.current = pending;
                }
                node.last_authenticated = Some(now);
            }
        }
        confirmation
    }

    /// Records authentications seen since the last write (node name, Unix seconds), keeping the
    /// later time; a time before the node enrolled belongs to an earlier node of that name.
    pub fn record_authentications(&mut self, seen: &BTreeMap<String, u64>) {
        for (name, at) in seen {
            if let Some(node) = self.nodes.get_mut(name).filter(|n| *at >= n.enrolled) {
                node.last_authenticated = node.last_authenticated.max(Some(*at));
            }
        }
    }

    /// Checks what a decoded table must hold: valid names and NQNs, one node per NQN, pending
    /// pairs newer than current ones, and every generation below `next_generation`.
    pub fn check(&self) -> Result<(), String> {
        let mut nqns = BTreeMap::new();
        for (name, node) in &self.nodes {
            edgevol_pki::files::check_name(name).map_err(|e| format!("node: {e}"))?;
            if !crate::naming::is_host_nqn(&node.host_nqn) {
                return Err(format!("node {name:?}: invalid host NQN"));
            }
            if let Some(other) = nqns.insert(node.host_nqn.as_str(), name) {
                return Err(format!(
                    "nodes {other:?} and {name:?} are bound to the same host NQN"
                ));
            }
            let newest = node.newest().generation;
            if node.current.generation == 0 || newest >= self.next_generation {
                return Err(format!("node {name:?}: generation out of range"));
            }
            if node
                .pending
                .as_ref()
                .is_some_and(|p| p.generation <= node.current.generation)
            {
                return Err(format!("node {name:?}: pending pair older than current"));
            }
            if node.certificates.is_empty() {
                return Err(format!("node {name:?}: no certificate"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
    const B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";

    /// The secret whose 32 bytes are all `n`.
    pub(crate) fn known(n: u8) -> Secret {
        Secret::from_key(Some(edgevol_nvmeof::auth::HashId::Sha256), &[n; 32]).unwrap()
    }

    /// Secrets 1, 2, 3, ... (see [`known`]): tells pairs apart in assertions.
    pub(crate) fn counter() -> impl FnMut() -> Result<Secret, RandomFailed> {
        let mut n = 0u8;
        move || {
            n += 1;
            Ok(known(n))
        }
    }

    fn generations(t: &Table, nqn: &str) -> Vec<u64> {
        t.keys_for(nqn).iter().map(|p| p.generation).collect()
    }

    #[test]
    fn the_first_enrolment_binds_and_later_ones_answer_the_same() {
        let mut t = Table::default();
        let mut s = counter();
        let e = t.enrol("node-a", [1; 32], A, 100, &mut s).unwrap();
        assert!(e.bound && e.changed);
        assert_eq!(e.pair.generation, 1);
        assert!(e.pair.host.ct_eq(&known(1)));
        assert!(e.pair.ctrl.ct_eq(&known(2)));
        let again = t.enrol("node-a", [1; 32], A, 200, &mut s).unwrap();
        assert!(!again.bound && !again.changed);
        assert_eq!(again.pair.generation, 1);
        assert!(again.pair.host.ct_eq(&known(1)), "same answer");
        // A renewed certificate of the same node is recorded, same keys.
        let renewed = t.enrol("node-a", [9; 32], A, 300, &mut s).unwrap();
        assert!(!renewed.bound && renewed.changed);
        assert_eq!(renewed.pair.generation, 1);
        assert_eq!(t.node("node-a").unwrap().certificates, [[1; 32], [9; 32]]);
        assert_eq!(t.node("node-a").unwrap().enrolled, 100);
        t.check().unwrap();
    }

    #[test]
    fn an_nqn_belongs_to_one_node_and_a_node_to_one_nqn() {
        let mut t = Table::default();
        let mut s = counter();
        t.enrol("node-a", [1; 32], A, 1, &mut s).unwrap();
        match t.enrol("node-b", [2; 32], A, 2, &mut s) {
            Err(KeyError::NqnBound { host_nqn, owner }) => {
                assert_eq!((host_nqn.as_str(), owner.as_str()), (A, "node-a"));
            }
            other => panic!("{other:?}"),
        }
        match t.enrol("node-a", [1; 32], B, 3, &mut s) {
            Err(KeyError::NodeBound { node, host_nqn }) => {
                assert_eq!((node.as_str(), host_nqn.as_str()), ("node-a", A));
            }
            other => panic!("{other:?}"),
        }
        assert!(t.node("node-b").is_none());
        assert_eq!(generations(&t, A), [1]);
        assert!(t.keys_for(B).is_empty());
    }

    #[test]
    fn rotation_keeps_the_old_pair_until_the_new_one_authenticates() {
        let mut t = Table::default();
        let mut s = counter();
        t.enrol("node-a", [1; 32], A, 1, &mut s).unwrap();
        assert_eq!(t.rotate("node-a", 5, &mut s).unwrap(), 2);
        assert_eq!(generations(&t, A), [2, 1], "newest first");
        let e = t.enrol("node-a", [1; 32], A, 6, &mut s).unwrap();
        assert_eq!(e.pair.generation, 2, "enrol answers the newest");
        assert!(e.pair.host.ct_eq(&known(3)));
        // The old pair still authenticates and changes nothing.
        assert_eq!(t.confirm(A, 1, 7), Confirmation::Current);
        assert_eq!(generations(&t, A), [2, 1]);
        assert_eq!(t.node("node-a").unwrap().last_authenticated, Some(7));
        // A second rotation before any use replaces the pending pair.
        assert_eq!(t.rotate("node-a", 8, &mut s).unwrap(), 3);
        assert_eq!(generations(&t, A), [3, 1]);
        assert_eq!(t.confirm(A, 2, 9), Confirmation::Unknown);
        assert_eq!(t.confirm(A, 3, 10), Confirmation::Completed { dropped: 1 });
        assert_eq!(generations(&t, A), [3]);
        assert_eq!(t.confirm(A, 1, 11), Confirmation::Unknown, "old pair gone");
        assert_eq!(t.node("node-a").unwrap().last_authenticated, Some(10));
        assert!(matches!(
            t.rotate("node-x", 1, &mut s),
            Err(KeyError::UnknownNode(n)) if n == "node-x"
        ));
        t.check().unwrap();
    }

    #[test]
    fn revocation_unbinds_and_blocks_the_nodes_certificates_only() {
        let mut t = Table::default();
        let mut s = counter();
        t.enrol("node-a", [1; 32], A, 1, &mut s).unwrap();
        t.enrol("node-a", [2; 32], A, 2, &mut s).unwrap();
        let r = t.revoke("node-a", 3).unwrap();
        assert_eq!(
            r,
            Revocation {
                node: "node-a".into(),
                host_nqn: A.into(),
                certificates: 2
            }
        );
        assert!(t.keys_for(A).is_empty());
        assert_eq!(t.confirm(A, 1, 4), Confirmation::Unknown);
        assert!(matches!(
            t.revoke("node-a", 4),
            Err(KeyError::UnknownNode(_))
        ));
        for cert in [[1; 32], [2; 32]] {
            assert!(matches!(
                t.enrol("node-a", cert, A, 5, &mut s),
                Err(KeyError::CertificateRevoked { .. })
            ));
        }
        // A newly issued certificate enrols again, may bind another NQN, gets a new generation.
        let e = t.enrol("node-a", [3; 32], B, 6, &mut s).unwrap();
        assert!(e.bound);
        assert_eq!(e.pair.generation, 2, "generations are never reused");
        // And the freed NQN may be bound by another node.
        t.enrol("node-b", [4; 32], A, 7, &mut s).unwrap();
        assert_eq!(t.revoked().len(), 2);
        t.check().unwrap();
    }

    #[test]
    fn authentications_seen_in_memory_keep_the_later_time() {
        let mut t = Table::default();
        let mut s = counter();
        t.enrol("node-a", [1; 32], A, 1, &mut s).unwrap();
        t.confirm(A, 1, 50);
        let seen = BTreeMap::from([("node-a".to_owned(), 40), ("gone".to_owned(), 60)]);
        t.record_authentications(&seen);
        assert_eq!(t.node("node-a").unwrap().last_authenticated, Some(50));
        let seen = BTreeMap::from([("node-a".to_owned(), 70)]);
        t.record_authentications(&seen);
        assert_eq!(t.node("node-a").unwrap().last_authenticated, Some(70));
        // An authentication of an earlier node of the same name is not this one's.
        t.revoke("node-a", 80).unwrap();
        t.enrol("node-a", [2; 32], A, 90, &mut s).unwrap();
        t.record_authentications(&BTreeMap::from([("node-a".to_owned(), 85)]));
        assert_eq!(t.node("node-a").unwrap().last_authenticated, None);
    }

    #[test]
    fn a_failing_random_source_changes_nothing() {
        let mut t = Table::default();
        let mut s = counter();
        t.enrol("node-a", [1; 32], A, 1, &mut s).unwrap();
        let mut broken = || Err(RandomFailed);
        assert!(matches!(
            t.enrol("node-b", [2; 32], B, 2, &mut broken),
            Err(KeyError::Random)
        ));
        assert!(matches!(
            t.rotate("node-a", 2, &mut broken),
            Err(KeyError::Random)
        ));
        assert!(t.node("node-b").is_none());
        assert_eq!(generations(&t, A), [1]);
        assert_eq!(t.next_generation, 2);
    }

    #[test]
    fn check_refuses_inconsistent_tables() {
        let mut s = counter();
        let mut t = Table::default();
        t.enrol("node-a", [1; 32], A, 1, &mut s).unwrap();
        t.enrol("node-b", [2; 32], B, 1, &mut s).unwrap();
        t.check().unwrap();
        let mut same_nqn = t.clone();
        same_nqn.nodes.get_mut("node-b").unwrap().host_nqn = A.into();
        assert!(same_nqn.check().unwrap_err().contains("same host NQN"));
        let mut stale = t.clone();
        stale.next_generation = 2;
        assert!(stale.check().unwrap_err().contains("out of range"));
        let mut bad_name = t.clone();
        let node = bad_name.nodes.remove("node-a").unwrap();
        bad_name.nodes.insert("../x".into(), node);
        assert!(bad_name.check().is_err());
        let mut old_pending = t.clone();
        let current = old_pending.nodes["node-b"].current.clone();
        let b = old_pending.nodes.get_mut("node-b").unwrap();
        b.pending = Some(current);
        assert!(old_pending.check().unwrap_err().contains("pending"));
    }
}
