//! Which appliance a CSI topology allows, and the order in which CreateVolume tries them.
//!
//! A segment names appliance X by `edgevol.io/appliance: X` (a node that reaches one box) or by
//! the presence key `appliance.edgevol.io/X: "true"` (a node that reaches several reports one
//! per box). A segment allows X when every appliance it names by the first key is X and, if it
//! carries presence keys, one of them is X's. A segment that names no appliance allows every
//! one; the appliance itself then checks its other keys.
//!
//! Placement is a pure function of the request, the volume's name and the candidates' free
//! space: the boxes the preferred segments allow come first (in the segments' order), then the
//! other allowed boxes; each group by free space (largest first; a box whose space is unknown
//! last), then in rendezvous-hash order of (name, appliance id). Free space changes, and the
//! first attempt of a CreateVolume changes it itself, so before placing, the router asks every
//! candidate whether it already holds the name ([`EXISTING_ONLY_PARAM`]); when one does not
//! answer, it places in the name's order alone, which a retry repeats
//! ([`crate::fleet_router`]).

use std::collections::HashMap;

use edgevol_driver::fleet::{reach_key, reached_appliance, APPLIANCE_KEY, REACHES};
use edgevol_proto::csi::v1::{Topology, TopologyRequirement};

/// Set by the proxy on a CreateVolume that only asks whether the appliance holds the name:
/// edgevold answers the volume (or ALREADY_EXISTS) as an idempotent CreateVolume would, or
/// NOT_FOUND, and creates nothing. Refused from a StorageClass; edgevold spells it the same
/// (`edgevol_appliance::csi::params::EXISTING_ONLY_PARAM`).
pub const EXISTING_ONLY_PARAM: &str = "edgevol.io/existing-only";

/// Whether `segment` names any appliance at all.
pub fn names_an_appliance(segment: &HashMap<String, String>) -> bool {
    segment
        .keys()
        .any(|k| k == APPLIANCE_KEY || reached_appliance(k).is_some())
}

/// Whether a volume on appliance `id` is accessible from `segment`: presence keys, where the
/// segment has any, say which appliances it reaches (its appliance key then only names a node's
/// home box); else its appliance key, if any.
pub fn allows(segment: &HashMap<String, String>, id: &str) -> bool {
    let mut reached = segment
        .iter()
        .filter(|(_, v)| v.as_str() == REACHES)
        .filter_map(|(k, _)| reached_appliance(k))
        .peekable();
    if reached.peek().is_some() {
        return reached.any(|a| a == id);
    }
    segment.get(APPLIANCE_KEY).is_none_or(|v| v == id)
}

/// `segment` as appliance `id` checks it: presence keys gone, the appliance key set to `id`
/// when the segment named an appliance, every other key kept for the appliance to check.
pub fn for_appliance(segment: &HashMap<String, String>, id: &str) -> HashMap<String, String> {
    let named = names_an_appliance(segment);
    let mut out: HashMap<String, String> = segment
        .iter()
        .filter(|(k, _)| reached_appliance(k).is_none() && k.as_str() != APPLIANCE_KEY)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if named {
        out.insert(APPLIANCE_KEY.to_owned(), id.to_owned());
    }
    out
}

/// The accessibility requirements as appliance `id` checks them: the requisite segments that
/// allow it, rewritten by [`for_appliance`]; preferred ones likewise.
pub fn requirement_for(req: &TopologyRequirement, id: &str) -> TopologyRequirement {
    let rewrite = |ts: &[Topology]| -> Vec<Topology> {
        ts.iter()
            .filter(|t| allows(&t.segments, id))
            .map(|t| Topology {
                segments: for_appliance(&t.segments, id),
            })
            .collect()
    };
    TopologyRequirement {
        requisite: rewrite(&req.requisite),
        preferred: rewrite(&req.preferred),
    }
}

/// The segment a volume on `id` adds to its accessible topology for nodes reaching several
/// appliances: `{appliance.edgevol.io/<id>: "true"}`.
pub fn presence_segment(id: &str) -> Topology {
    Topology {
        segments: HashMap::from([(reach_key(id), REACHES.to_owned())]),
    }
}

/// FNV-1a: stable across processes and releases, unlike std's hasher.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Indices of `ids` in rendezvous order for `name` (highest score first), then the boxes with
/// the most free space first (`free[i]`; unknown or absent: last), the sort being stable.
fn rank(name: &str, ids: &[&str], free: &[Option<i64>], mut which: Vec<usize>) -> Vec<usize> {
    which.sort_by_key(|&i| std::cmp::Reverse(fnv1a(&[name.as_bytes(), ids[i].as_bytes()])));
    which.sort_by_key(|&i| std::cmp::Reverse(free.get(i).copied().flatten()));
    which
}

/// The appliances (indices into `ids`) CreateVolume of `name` may use, in the name's order
/// alone (no free space known); empty when the requisite topology allows none.
pub fn order(requirement: Option<&TopologyRequirement>, ids: &[&str], name: &str) -> Vec<usize> {
    order_by_free(requirement, ids, name, &[])
}

/// [`order`] with the boxes of each preference group by free space first: `free[i]` is box
/// `i`'s free bytes, `None` when unknown.
pub fn order_by_free(
    requirement: Option<&TopologyRequirement>,
    ids: &[&str],
    name: &str,
    free: &[Option<i64>],
) -> Vec<usize> {
    let all: Vec<usize> = (0..ids.len()).collect();
    let Some(req) = requirement else {
        return rank(name, ids, free, all);
    };
    let allowed: Vec<usize> = if req.requisite.is_empty() {
        all
    } else {
        all.into_iter()
            .filter(|&i| req.requisite.iter().any(|t| allows(&t.segments, ids[i])))
            .collect()
    };
    let mut out = Vec::with_capacity(allowed.len());
    for t in &req.preferred {
        let group: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|i| !out.contains(i) && allows(&t.segments, ids[*i]))
            .collect();
        out.extend(rank(name, ids, free, group));
    }
    let rest: Vec<usize> = allowed.into_iter().filter(|i| !out.contains(i)).collect();
    out.extend(rank(name, ids, free, rest));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn topo(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: seg(pairs),
        }
    }

    #[test]
    fn segments_allow_the_appliances_they_name() {
        let one = seg(&[(APPLIANCE_KEY, "a"), ("appliance.edgevol.io/a", "true")]);
        assert!(allows(&one, "a"));
        assert!(!allows(&one, "b"));
        let two = seg(&[
            ("appliance.edgevol.io/a", "true"),
            ("appliance.edgevol.io/b", "true"),
        ]);
        assert!(allows(&two, "a") && allows(&two, "b") && !allows(&two, "c"));
        // A node reaching a and b whose home box is a.
        let home = seg(&[
            (APPLIANCE_KEY, "a"),
            ("appliance.edgevol.io/a", "true"),
            ("appliance.edgevol.io/b", "true"),
        ]);
        assert!(allows(&home, "a") && allows(&home, "b") && !allows(&home, "c"));
        let zone = seg(&[("zone", "x")]);
        assert!(allows(&zone, "c") && !names_an_appliance(&zone));
        assert_eq!(
            for_appliance(&two, "b"),
            seg(&[(APPLIANCE_KEY, "b")]),
            "presence keys become the key the appliance checks"
        );
        assert_eq!(for_appliance(&zone, "b"), zone, "other keys kept");
    }

    #[test]
    fn requisite_limits_preferred_leads_and_a_name_always_gets_the_same_order() {
        let ids = ["a", "b", "c"];
        let free = order(None, &ids, "vol-1");
        assert_eq!(free.len(), 3);
        assert_eq!(order(None, &ids, "vol-1"), free, "stable");
        let names: Vec<Vec<usize>> = (0..40)
            .map(|i| order(None, &ids, &format!("pvc-{i}")))
            .collect();
        for first in 0..3 {
            assert!(
                names.iter().any(|o| o[0] == first),
                "every box comes first for some name"
            );
        }

        let req = TopologyRequirement {
            requisite: vec![
                topo(&[(APPLIANCE_KEY, "c")]),
                topo(&[("appliance.edgevol.io/b", "true")]),
            ],
            preferred: vec![topo(&[("appliance.edgevol.io/b", "true")])],
        };
        assert_eq!(order(Some(&req), &ids, "vol-1"), vec![1, 2]);
        let only_a = TopologyRequirement {
            requisite: vec![topo(&[(APPLIANCE_KEY, "x")])],
            preferred: vec![],
        };
        assert!(order(Some(&only_a), &ids, "v").is_empty());
        let rewritten = requirement_for(&req, "b");
        assert_eq!(rewritten.requisite, vec![topo(&[(APPLIANCE_KEY, "b")])]);
    }

    #[test]
    fn free_space_orders_boxes_of_equal_preference_and_the_name_breaks_ties() {
        let ids = ["a", "b", "c"];
        let by_name = order(None, &ids, "vol-1");
        let last = by_name[2];
        let mut free = vec![Some(10); 3];
        free[last] = Some(20);
        assert_eq!(
            order_by_free(None, &ids, "vol-1", &free)[0],
            last,
            "most free first"
        );
        assert_eq!(
            order_by_free(None, &ids, "vol-1", &[Some(5); 3]),
            by_name,
            "equal space: the name's order"
        );
        let mut unknown = vec![Some(1); 3];
        unknown[by_name[0]] = None;
        assert_eq!(order_by_free(None, &ids, "vol-1", &unknown)[2], by_name[0]);

        // Preference beats space: c is preferred though a has the most.
        let req = TopologyRequirement {
            requisite: vec![],
            preferred: vec![topo(&[(APPLIANCE_KEY, "c")])],
        };
        let free = [Some(100), Some(50), Some(1)];
        assert_eq!(
            order_by_free(Some(&req), &ids, "vol-1", &free),
            vec![2, 0, 1]
        );
        // Requisite still limits.
        let req = TopologyRequirement {
            requisite: vec![topo(&[(APPLIANCE_KEY, "b")])],
            preferred: vec![],
        };
        assert_eq!(order_by_free(Some(&req), &ids, "vol-1", &free), vec![1]);
        let rewritten = requirement_for(&req, "b");
        assert_eq!(rewritten.requisite, vec![topo(&[(APPLIANCE_KEY, "b")])]);
    }
}
