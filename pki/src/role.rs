//! Roles a client certificate can carry.

use std::fmt;
use std::str::FromStr;

/// Prefix of the URI SAN that carries a client's role: `urn:edgevol:role:controller`.
pub const ROLE_URI_PREFIX: &str = "urn:edgevol:role:";

/// What a client may do on the appliance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Everything.
    Admin,
    /// What a container orchestrator needs: Identity, Controller, GroupController, VolumeGroup.
    Controller,
    /// Read-only: Identity and the List/Get RPCs.
    Observer,
    /// A workload host running `edgevol-node`: may only enrol for its data-path keys. The
    /// certificate's name is the node's identity, to which the appliance binds its host NQN.
    Node,
}

impl Role {
    /// Every role, in order of decreasing power.
    pub const ALL: [Role; 4] = [Role::Admin, Role::Controller, Role::Observer, Role::Node];

    /// The role's name as written in certificates and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Controller => "controller",
            Role::Observer => "observer",
            Role::Node => "node",
        }
    }

    /// The URI SAN that carries this role.
    pub fn uri(self) -> String {
        format!("{ROLE_URI_PREFIX}{}", self.as_str())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!("unknown role {s:?} (expected admin, controller, observer or node)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_is_refused() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
            assert!(role.uri().starts_with(ROLE_URI_PREFIX));
        }
        assert!("root".parse::<Role>().unwrap_err().contains("root"));
    }
}
