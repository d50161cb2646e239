//! Who must authenticate (DH-HMAC-CHAP) on the NVMe/TCP data path, and with which hashes and
//! DH groups.

use edgevol_nvmeof::auth::{DhGroup, HashId, TargetConfig};

use super::ConfigError;

/// Who must authenticate (DH-HMAC-CHAP) on the NVMe/TCP data path, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAuthPolicy {
    /// Whether a host whose NQN holds no keys (never enrolled, or revoked) may connect without
    /// authenticating. Off by default: every host authenticates. A host that holds keys always
    /// authenticates, whatever this says.
    pub allow_unauthenticated_hosts: bool,
    /// Hashes the target accepts, most preferred first (`nvme.auth_hashes`).
    pub hashes: Vec<HashId>,
    /// DH groups the target accepts, most preferred first (`nvme.auth_dh_groups`).
    pub dh_groups: Vec<DhGroup>,
}

impl Default for HostAuthPolicy {
    /// Authentication required; every hash (SHA-256 first) and every DH group (ffdhe2048 first,
    /// null last: a host that offers a group gets its forward secrecy).
    fn default() -> Self {
        let defaults = TargetConfig::new("-", "-", Vec::new());
        HostAuthPolicy {
            allow_unauthenticated_hosts: false,
            hashes: defaults.hashes,
            dh_groups: defaults.dh_groups,
        }
    }
}

/// Parses a non-empty list of names from `names` against the known `(name, value)`s.
pub(super) fn parse_names<T: Copy>(
    key: &str,
    names: &[String],
    known: impl Iterator<Item = (&'static str, T)> + Clone,
) -> Result<Vec<T>, ConfigError> {
    if names.is_empty() {
        return Err(ConfigError(format!("{key} is empty")));
    }
    names
        .iter()
        .map(|n| {
            known
                .clone()
                .find(|(name, _)| name == n)
                .map(|(_, v)| v)
                .ok_or_else(|| {
                    let all: Vec<_> = known.clone().map(|(name, _)| name).collect();
                    ConfigError(format!("{key}: unknown {n:?} (known: {})", all.join(", ")))
                })
        })
        .collect()
}

impl HostAuthPolicy {
    /// What the daemon logs as a warning at start about this policy, if anything.
    pub fn warning(&self) -> Option<&'static str> {
        self.allow_unauthenticated_hosts.then_some(
            "nvme.allow_unauthenticated_hosts is on: hosts without DH-HMAC-CHAP keys connect \
             unauthenticated, so anyone on the storage network who sends a published node's \
             host NQN gets that node's volumes",
        )
    }
}
