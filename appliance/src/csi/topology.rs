//! Where the appliance lies: its topology segments (the appliance segment included), and
//! whether a CSI topology names it. Every volume is reachable exactly where the appliance is.

use std::collections::HashMap;

use edgevol_driver::fleet::{reach_key, reached_appliance, APPLIANCE_KEY, REACHES};
use edgevol_proto::csi::v1::Topology;

use super::error::Error;
use crate::state::State;

/// The appliance's segments, as CSI shows a volume's accessible topology.
pub fn segments(state: &State) -> Topology {
    let mut segments = HashMap::with_capacity(state.topology.len());
    segments.extend(state.topology.iter().map(|(k, v)| (k.clone(), v.clone())));
    Topology { segments }
}

/// Whether the appliance lies in `t`: every segment of `t` matches ours. Presence keys
/// (`appliance.edgevol.io/<id>: "true"`, a node reaching several appliances), where `t` has
/// any, must name this appliance, and `edgevol.io/appliance` then names only the node's home
/// box, which may be another.
pub fn contains(state: &State, t: &Topology) -> bool {
    let reaches = t.segments.keys().any(|k| reached_appliance(k).is_some());
    if reaches
        && t.segments
            .get(&reach_key(&state.appliance_id))
            .map(String::as_str)
            != Some(REACHES)
    {
        return false;
    }
    t.segments.iter().all(|(k, v)| {
        reached_appliance(k).is_some()
            || (reaches && k == APPLIANCE_KEY)
            || state.topology.get(k) == Some(v)
    })
}

/// CreateVolume's requisite topologies: none, or one that includes the appliance.
pub fn check_requisite(state: &State, requisite: &[Topology]) -> Result<(), Error> {
    if requisite.is_empty() || requisite.iter().any(|t| contains(state, t)) {
        Ok(())
    } else {
        Err(Error::OutsideTopology(state.topology.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    fn topology(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        }
    }

    #[test]
    fn a_topology_contains_the_appliance_when_every_segment_matches() {
        let state = State::new(
            "box".into(),
            BTreeMap::from([
                ("edgevol.io/appliance".to_owned(), "box".to_owned()),
                ("zone".to_owned(), "a".to_owned()),
            ]),
        );
        assert!(contains(&state, &topology(&[("zone", "a")])));
        assert!(contains(&state, &topology(&[])));
        assert!(!contains(&state, &topology(&[("zone", "b")])));
        assert!(!contains(&state, &topology(&[("rack", "1")])));
        assert_eq!(segments(&state).segments.len(), 2);

        // A node reaching this box and another, whose home box is the other.
        let reaching = |ids: &[&str]| {
            let mut t = topology(&[("edgevol.io/appliance", "other"), ("zone", "a")]);
            for id in ids {
                t.segments
                    .insert(format!("appliance.edgevol.io/{id}"), "true".to_owned());
            }
            t
        };
        assert!(contains(&state, &reaching(&["box", "other"])));
        assert!(!contains(&state, &reaching(&["other"])));
        assert!(!contains(
            &state,
            &topology(&[("edgevol.io/appliance", "other")])
        ));
        let mut elsewhere_zone = reaching(&["box"]);
        elsewhere_zone.segments.insert("zone".into(), "b".into());
        assert!(!contains(&state, &elsewhere_zone));

        assert_eq!(check_requisite(&state, &[]), Ok(()));
        let elsewhere = topology(&[("zone", "b")]);
        assert_eq!(
            check_requisite(&state, &[elsewhere.clone(), topology(&[("zone", "a")])]),
            Ok(())
        );
        assert_eq!(
            check_requisite(&state, &[elsewhere]),
            Err(Error::OutsideTopology(state.topology.clone()))
        );
    }
}
