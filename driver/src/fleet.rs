//! What the controller endpoint (`edgevol proxy` in front of several appliances) and the node
//! plugin agree on when a site has more than one box: how a node says which appliances it
//! reaches, how a replicated volume's id names its legs, and how ControllerPublishVolume hands
//! the node every leg.
//!
//! CSI gives a node one topology map, so a node cannot report two values of
//! [`APPLIANCE_KEY`]. A node that reaches several appliances reports one presence key per
//! appliance instead ([`reach_key`], value [`REACHES`]); a node that reaches exactly one
//! reports [`APPLIANCE_KEY`] as well, so volumes (and StorageClasses) from single-box sites keep
//! matching it.

/// The topology key naming one appliance: `edgevol.io/appliance=<appliance id>`.
pub const APPLIANCE_KEY: &str = "edgevol.io/appliance";
/// Prefix of the per-appliance presence keys: `appliance.edgevol.io/<appliance id>`.
pub const REACH_KEY_PREFIX: &str = "appliance.edgevol.io/";
/// The value of a presence key.
pub const REACHES: &str = "true";

/// `appliance.edgevol.io/<appliance>`: present (with [`REACHES`]) on every node that reaches it.
pub fn reach_key(appliance: &str) -> String {
    format!("{REACH_KEY_PREFIX}{appliance}")
}

/// The appliance a presence key names, if `key` is one.
pub fn reached_appliance(key: &str) -> Option<&str> {
    key.strip_prefix(REACH_KEY_PREFIX).filter(|a| !a.is_empty())
}

/// Joins the legs of a replicated volume (or snapshot) id: `box-7-v3+box-8-v5`. Appliance ids
/// are `[a-z0-9-]`, so the separator never occurs inside a leg's id.
pub const LEG_SEPARATOR: char = '+';

/// The legs of a CSI volume or snapshot id: one for a plain id, two or three for a replicated one.
pub fn legs(id: &str) -> impl Iterator<Item = &str> {
    id.split(LEG_SEPARATOR)
}

/// The id of a replicated object from its legs' ids, in leg order.
pub fn join_legs<'a>(legs: impl IntoIterator<Item = &'a str>) -> String {
    let mut id = String::new();
    for (i, leg) in legs.into_iter().enumerate() {
        if i > 0 {
            id.push(LEG_SEPARATOR);
        }
        id.push_str(leg);
    }
    id
}

/// CreateVolume parameter (StorageClass `replicas`): how many appliances hold a copy, 1 to 3.
pub const REPLICAS_PARAM: &str = "replicas";

/// publish_context and volume_context key of a replicated volume: its number of legs, `"2"` or
/// `"3"`. Absent for a plain volume, whose publish_context carries the
/// [`publish_context`](crate::publish_context) keys unprefixed.
pub const REPLICAS: &str = "replicas";

/// The publish_context key of leg `leg` (0-based) for one of the
/// [`publish_context`](crate::publish_context) keys: `leg0.targetAddress`.
pub fn leg_key(leg: usize, key: &str) -> String {
    format!("leg{leg}.{key}")
}

/// publish_context key of each leg: that leg's CSI volume id on its appliance (`leg1.volumeId`).
pub const LEG_VOLUME_ID: &str = "volumeId";

/// Where the data of a replicated volume's md RAID1 starts on each leg: the node creates the
/// array with `--metadata=1.2 --bitmap=internal --data-offset=1M` (superblock and write-intent
/// bitmap below it), so each leg is this much larger than the volume it carries, and the md
/// device offers exactly the leg's size minus this.
pub const MD_DATA_OFFSET_BYTES: u64 = 1 << 20;

/// The name of a replicated volume's (or snapshot's) leg on its appliance: the CO's name and
/// this suffix. Each appliance holds at most one leg of a volume, so the name alone finds it
/// again when CreateVolume is retried.
pub const LEG_NAME_SUFFIX: &str = "+leg";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicated_ids_round_trip_and_plain_ids_are_one_leg() {
        let id = join_legs(["box-7-v3", "box-8-v5"]);
        assert_eq!(id, "box-7-v3+box-8-v5");
        assert_eq!(legs(&id).collect::<Vec<_>>(), ["box-7-v3", "box-8-v5"]);
        assert_eq!(legs("box-7-v3").collect::<Vec<_>>(), ["box-7-v3"]);
    }

    #[test]
    fn presence_keys_name_their_appliance() {
        assert_eq!(reach_key("box-7"), "appliance.edgevol.io/box-7");
        assert_eq!(
            reached_appliance("appliance.edgevol.io/box-7"),
            Some("box-7")
        );
        assert_eq!(reached_appliance("appliance.edgevol.io/"), None);
        assert_eq!(reached_appliance(APPLIANCE_KEY), None);
        assert_eq!(leg_key(1, "targetAddress"), "leg1.targetAddress");
    }
}
