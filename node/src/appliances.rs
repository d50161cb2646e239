//! A node that reaches several appliances: what NodeGetInfo reports for them, and which
//! appliance's control endpoint gives the DH-HMAC-CHAP keys for a volume.
//!
//! **Topology.** CSI gives a node one topology map, so `--topology edgevol.io/appliance=ID`
//! repeated (one per box the node reaches) becomes one presence key per appliance,
//! `appliance.edgevol.io/<ID>: "true"`, plus `edgevol.io/appliance: <ID>` for the first one, the
//! node's home box, so StorageClasses and volumes of a site that had one box keep matching it
//! when boxes are added (the contract in `edgevol_driver::fleet`).
//!
//! **Enrolment.** Each appliance has its own keys for this node, handed out by its own
//! Enrolment endpoint: `--appliance ID=HOST:PORT`, repeatable. A volume's appliance is the one
//! its subsystem NQN names (`nqn.2024-11.io.edgevol:<appliance id>:v<n>`). A plain
//! `--appliance HOST:PORT` (one box, as before) enrols for every appliance without an endpoint
//! of its own.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use edgevol_driver::fleet::{check_appliance_id, reach_key, APPLIANCE_KEY, REACHES};

use crate::error::{Error, Result};
use crate::keys::{EnrolConfig, KeySource};

/// The NQN prefix of every edgevol subsystem (the appliance's naming: `<prefix>:<appliance
/// id>:v<volume>`).
pub const SUBSYSTEM_NQN_PREFIX: &str = "nqn.2024-11.io.edgevol:";

/// The appliance an edgevol subsystem NQN names; `None` for any other NQN.
pub fn appliance_of_nqn(subsysnqn: &str) -> Option<&str> {
    let (id, volume) = subsysnqn
        .strip_prefix(SUBSYSTEM_NQN_PREFIX)?
        .split_once(':')?;
    let digits = volume.strip_prefix('v')?;
    (check_appliance_id(id).is_ok()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit()))
    .then_some(id)
}

/// NodeGetInfo's topology from the `--topology KEY=VALUE` flags: `edgevol.io/appliance` may be
/// repeated (each value becomes a presence key, and the key itself names the first, the home
/// box); any other key at most once.
pub fn node_topology(flags: &[String]) -> std::result::Result<HashMap<String, String>, String> {
    let mut out = HashMap::new();
    let mut appliances: Vec<&str> = Vec::new();
    for flag in flags {
        let (k, v) = flag
            .split_once('=')
            .filter(|(k, v)| !k.is_empty() && !v.is_empty())
            .ok_or_else(|| format!("--topology {flag:?} must be key=value"))?;
        if k == APPLIANCE_KEY {
            check_appliance_id(v).map_err(|e| format!("--topology {flag:?}: {e}"))?;
            if appliances.contains(&v) {
                return Err(format!("--topology {flag:?} given twice"));
            }
            appliances.push(v);
            continue;
        }
        if out.insert(k.to_owned(), v.to_owned()).is_some() {
            return Err(format!("--topology key {k:?} given twice"));
        }
    }
    if let Some(home) = appliances.first() {
        out.insert(APPLIANCE_KEY.to_owned(), (*home).to_owned());
    }
    for id in appliances {
        let key = reach_key(id);
        if out.insert(key.clone(), REACHES.to_owned()).is_some() {
            return Err(format!(
                "--topology key {key:?} is reported for --topology {APPLIANCE_KEY}={id} \
                 already; drop the explicit one"
            ));
        }
    }
    Ok(out)
}

/// One `--appliance` flag: `ID=HOST:PORT`, or `HOST:PORT` for every appliance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplianceEndpoint {
    /// The appliance id; `None` for the plain form.
    pub appliance: Option<String>,
    /// `HOST:PORT` of its mTLS control endpoint.
    pub address: String,
}

/// Parses the `--appliance` flags: at most one plain `HOST:PORT`, each id at most once.
pub fn parse_appliances(flags: &[String]) -> std::result::Result<Vec<ApplianceEndpoint>, String> {
    let mut out: Vec<ApplianceEndpoint> = Vec::new();
    for flag in flags {
        // A HOST:PORT never holds '=' (IPv6 literals are bracketed), an id never holds ':'.
        let endpoint = match flag.split_once('=') {
            Some((id, address)) => {
                check_appliance_id(id).map_err(|e| format!("--appliance {flag:?}: {e}"))?;
                ApplianceEndpoint {
                    appliance: Some(id.to_owned()),
                    address: address.to_owned(),
                }
            }
            None => ApplianceEndpoint {
                appliance: None,
                address: flag.clone(),
            },
        };
        if endpoint.address.is_empty() {
            return Err(format!("--appliance {flag:?}: expected [ID=]HOST:PORT"));
        }
        if out.iter().any(|e| e.appliance == endpoint.appliance) {
            return Err(match &endpoint.appliance {
                Some(id) => format!("--appliance {id}=... given twice"),
                None => "--appliance HOST:PORT (without an id) given twice: name each box, \
                         --appliance ID=HOST:PORT"
                    .to_owned(),
            });
        }
        out.push(endpoint);
    }
    Ok(out)
}

/// The enrolment endpoints of the `--appliance` flags, each with its appliance id (`None` for
/// the plain `HOST:PORT`).
pub type Enrolments = Vec<(KeyScope, EnrolConfig)>;

/// Which enrolment a volume's keys come from: an appliance's own (`Some(id)`), or the endpoint
/// given without an id (`None`). Key generations are counted per scope.
pub type KeyScope = Option<String>;

/// Where the node's keys come from, per appliance.
#[derive(Debug, Clone, Default)]
pub struct ApplianceKeys {
    by_appliance: BTreeMap<String, Arc<dyn KeySource>>,
    any: Option<Arc<dyn KeySource>>,
}

impl ApplianceKeys {
    /// One source for every appliance (a plain `--appliance HOST:PORT`).
    pub fn single(source: Arc<dyn KeySource>) -> Self {
        ApplianceKeys {
            by_appliance: BTreeMap::new(),
            any: Some(source),
        }
    }

    /// Adds the source of `appliance` (`None`: of every appliance without one of its own).
    pub fn with(mut self, appliance: Option<String>, source: Arc<dyn KeySource>) -> Self {
        match appliance {
            Some(id) => {
                self.by_appliance.insert(id, source);
            }
            None => self.any = Some(source),
        }
        self
    }

    /// True when no source is configured.
    pub fn is_empty(&self) -> bool {
        self.by_appliance.is_empty() && self.any.is_none()
    }

    /// The scope whose keys a controller to `subsysnqn` uses, whether or not it has a source.
    pub fn scope_of(&self, subsysnqn: &str) -> KeyScope {
        appliance_of_nqn(subsysnqn)
            .filter(|id| self.by_appliance.contains_key(*id))
            .map(str::to_owned)
    }

    /// The source for a volume of subsystem `subsysnqn`, with its scope. A subsystem of an
    /// appliance without an endpoint (and no plain `--appliance`) is FAILED_PRECONDITION:
    /// connecting it without keys would be refused, or unauthenticated.
    pub fn for_subsystem(&self, subsysnqn: &str) -> Result<(KeyScope, Arc<dyn KeySource>)> {
        let scope = self.scope_of(subsysnqn);
        let source = match &scope {
            Some(id) => self.by_appliance.get(id).cloned(),
            None => self.any.clone(),
        };
        source.map(|s| (scope, s)).ok_or_else(|| {
            let known: Vec<&str> = self.by_appliance.keys().map(String::as_str).collect();
            Error::FailedPrecondition(format!(
                "subsystem {subsysnqn} belongs to appliance {}, but edgevol-node has no \
                 --appliance ID=HOST:PORT for it to enrol with (it has: {}); add one and \
                 restart edgevol-node",
                appliance_of_nqn(subsysnqn).unwrap_or("(not an edgevol subsystem)"),
                known.join(", ")
            ))
        })
    }

    /// Every source with its scope (the periodic refresh enrols with each).
    pub fn all(&self) -> Vec<(KeyScope, Arc<dyn KeySource>)> {
        let mut out: Vec<(KeyScope, Arc<dyn KeySource>)> = self
            .by_appliance
            .iter()
            .map(|(id, s)| (Some(id.clone()), s.clone()))
            .collect();
        if let Some(any) = &self.any {
            out.push((None, any.clone()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn one_appliance_keeps_the_appliance_key_and_gains_its_presence_key() {
        let t = node_topology(&flags(&[
            "edgevol.io/appliance=box-1",
            "topology.kubernetes.io/zone=z1",
        ]))
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t["edgevol.io/appliance"], "box-1");
        assert_eq!(t["appliance.edgevol.io/box-1"], "true");
        assert_eq!(t["topology.kubernetes.io/zone"], "z1");
    }

    #[test]
    fn several_appliances_are_presence_keys_and_the_first_is_home() {
        let t = node_topology(&flags(&[
            "edgevol.io/appliance=box-1",
            "edgevol.io/appliance=box-2",
        ]))
        .unwrap();
        assert_eq!(
            t,
            HashMap::from([
                ("edgevol.io/appliance".to_owned(), "box-1".to_owned()),
                ("appliance.edgevol.io/box-1".to_owned(), "true".to_owned()),
                ("appliance.edgevol.io/box-2".to_owned(), "true".to_owned()),
            ])
        );
        assert!(node_topology(&[]).unwrap().is_empty());
    }

    #[test]
    fn bad_or_repeated_topology_flags_are_refused() {
        for (bad, why) in [
            (
                &["edgevol.io/appliance=b", "edgevol.io/appliance=b"][..],
                "twice",
            ),
            (&["zone=a", "zone=b"][..], "twice"),
            (&["edgevol.io/appliance=Box_1"][..], "[a-z0-9-]"),
            (&["novalue="][..], "key=value"),
            (
                &["edgevol.io/appliance=b", "appliance.edgevol.io/b=true"][..],
                "drop the explicit one",
            ),
        ] {
            let e = node_topology(&flags(bad)).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn appliance_flags_name_their_box_or_serve_every_box() {
        let a = parse_appliances(&flags(&["box-1=10.0.0.1:9500", "[fd00::2]:9500"])).unwrap();
        assert_eq!(
            a,
            [
                ApplianceEndpoint {
                    appliance: Some("box-1".into()),
                    address: "10.0.0.1:9500".into()
                },
                ApplianceEndpoint {
                    appliance: None,
                    address: "[fd00::2]:9500".into()
                },
            ]
        );
        for (bad, why) in [
            (&["a=1:1", "a=2:2"][..], "a=... given twice"),
            (&["1.1.1.1:1", "2.2.2.2:2"][..], "ID=HOST:PORT"),
            (&["BOX=1.1.1.1:1"][..], "[a-z0-9-]"),
            (&["box="][..], "[ID=]HOST:PORT"),
        ] {
            let e = parse_appliances(&flags(bad)).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_subsystem_nqn_names_its_appliance() {
        assert_eq!(
            appliance_of_nqn("nqn.2024-11.io.edgevol:box-7:v42"),
            Some("box-7")
        );
        for other in [
            "nqn.2024-11.io.edgevol:box-7:vx",
            "nqn.2024-11.io.edgevol:box-7:42",
            "nqn.2024-11.io.edgevol:Box:v1",
            "nqn.2014-08.org.nvmexpress:uuid:1",
            "nqn.2024-11.io.edgevol:box-7",
        ] {
            assert_eq!(appliance_of_nqn(other), None, "{other}");
        }
    }
}
