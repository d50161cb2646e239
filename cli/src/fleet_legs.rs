//! How ListVolumes shows replicated volumes: once, by their own id, never as their legs.
//!
//! Each leg carries its marking ([`LegMark`]: position, number of legs, and the ids of the legs
//! before it), stored by its appliance and returned in its volume_context. Legs are made in
//! order, so the last leg exists only once all the others do, and names them: the proxy hides
//! every leg but the last, and shows the last as the replicated volume. Hiding is per entry, so
//! each appliance's own page tokens stay valid.
//!
//! The entry's published nodes are the last leg's: ControllerPublishVolume publishes legs first
//! to last and Unpublish last to first, so the last leg is published to a node only while every
//! leg is (asking every leg's appliance per entry would make a listing as slow as its slowest
//! box, and a box that is down would hide its volumes' attachments).

use edgevol_driver::fleet::{appliance_of, legs, LegMark, MD_DATA_OFFSET_BYTES};
use edgevol_proto::csi::v1::list_volumes_response::{Entry, VolumeStatus};
use edgevol_proto::csi::v1::VolumeCondition;

use crate::fleet_replicas::{replicated_context, topology_of};

/// `entry` as the proxy lists it: a plain volume as it is, the last leg of a replicated volume
/// as that volume, any other leg not at all.
pub fn as_listed(entry: Entry) -> Option<Entry> {
    let Some(leg) = entry.volume.as_ref() else {
        return Some(entry);
    };
    let mark = match LegMark::of(&leg.volume_context) {
        Ok(Some(mark)) => mark,
        // Not a leg; or a marking the appliance would have refused (shown as it is).
        Ok(None) | Err(_) => return Some(entry),
    };
    if !mark.is_last() {
        return None;
    }
    let id = mark.volume_id(&leg.volume_id);
    let boxes: Vec<&str> = legs(&id).map(appliance_of).collect();
    let offset = i64::try_from(MD_DATA_OFFSET_BYTES).unwrap_or(i64::MAX);
    let volume = edgevol_proto::csi::v1::Volume {
        capacity_bytes: leg.capacity_bytes.saturating_sub(offset).max(0),
        volume_id: id.clone(),
        volume_context: replicated_context(&leg.volume_context, mark.count),
        // Each leg names its own source leg; the replicated source's id is not known here.
        content_source: None,
        accessible_topology: topology_of(&boxes),
    };
    let status = entry.status.map(|s| VolumeStatus {
        published_node_ids: s.published_node_ids,
        volume_condition: s.volume_condition.map(|c| VolumeCondition {
            message: if c.abnormal {
                format!(
                    "degraded: leg {} on {}: {}",
                    leg.volume_id,
                    boxes[boxes.len() - 1],
                    c.message
                )
            } else {
                c.message
            },
            abnormal: c.abnormal,
        }),
    });
    Some(Entry {
        volume: Some(volume),
        status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_driver::fleet::{LEGS_BEFORE_PARAM, LEG_PARAM, REPLICAS};
    use edgevol_proto::csi::v1::Volume;
    use std::collections::HashMap;

    fn leg(id: &str, marks: &[(&str, &str)], abnormal: bool) -> Entry {
        let mut volume_context: HashMap<String, String> = marks
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        volume_context.insert("edgevol.io/cluster-size".into(), "65536".into());
        Entry {
            volume: Some(Volume {
                capacity_bytes: 65 << 20,
                volume_id: id.into(),
                volume_context,
                ..Default::default()
            }),
            status: Some(VolumeStatus {
                published_node_ids: vec!["nqn.node".into()],
                volume_condition: Some(VolumeCondition {
                    abnormal,
                    message: if abnormal { "media errors" } else { "ok" }.into(),
                }),
            }),
        }
    }

    #[test]
    fn only_the_last_leg_shows_and_it_shows_the_replicated_volume() {
        assert!(as_listed(leg("a-v1", &[(LEG_PARAM, "0/3")], false)).is_none());
        assert!(as_listed(leg(
            "b-v2",
            &[(LEG_PARAM, "1/3"), (LEGS_BEFORE_PARAM, "a-v1")],
            false
        ))
        .is_none());
        let e = as_listed(leg(
            "box-c-v3",
            &[(LEG_PARAM, "2/3"), (LEGS_BEFORE_PARAM, "a-v1+b-v2")],
            true,
        ))
        .unwrap();
        let v = e.volume.unwrap();
        assert_eq!(v.volume_id, "a-v1+b-v2+box-c-v3");
        assert_eq!(v.capacity_bytes, 64 << 20);
        assert_eq!(v.volume_context[REPLICAS], "3");
        assert!(!v.volume_context.contains_key(LEG_PARAM));
        assert!(!v.volume_context.contains_key(LEGS_BEFORE_PARAM));
        assert_eq!(v.accessible_topology[0].segments.len(), 3);
        assert_eq!(
            v.accessible_topology[0].segments["appliance.edgevol.io/box-c"],
            "true"
        );
        let s = e.status.unwrap();
        assert_eq!(s.published_node_ids, ["nqn.node"]);
        let c = s.volume_condition.unwrap();
        assert!(c.abnormal);
        assert!(
            c.message.contains("leg box-c-v3 on box-c: media errors"),
            "{}",
            c.message
        );

        let plain = leg("a-v9", &[], false);
        assert_eq!(as_listed(plain.clone()), Some(plain));
    }
}
