//! What the controller endpoint (`edgevol proxy` in front of several appliances) and the node
//! plugin agree on when a site has more than one box: how a node says which appliances it
//! reaches, how a replicated volume's id names its legs, and how ControllerPublishVolume hands
//! the node every leg.
//!
//! CSI gives a node one topology map, so a node cannot report two values of
//! [`APPLIANCE_KEY`]. A node reports one presence key per appliance it reaches ([`reach_key`],
//! value [`REACHES`]), and [`APPLIANCE_KEY`] for its home appliance: the first it was given,
//! so that volumes (and StorageClasses) of a site that had one box keep matching its nodes when
//! the site gains boxes. Where a segment carries presence keys, they alone say which
//! appliances it reaches; [`APPLIANCE_KEY`] decides only in segments without them.

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

/// An appliance id that [`check_appliance_id`] refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadApplianceId(pub String);

impl std::fmt::Display for BadApplianceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "appliance id {:?}: use 1-32 of [a-z0-9-], not starting or ending with '-'",
            self.0
        )
    }
}

impl std::error::Error for BadApplianceId {}

/// Checks an appliance id as edgevold accepts one: 1-32 of `[a-z0-9-]`, no '-' at either end
/// (it becomes part of NVMe qualified names, volume ids and topology keys and values).
pub fn check_appliance_id(id: &str) -> Result<(), BadApplianceId> {
    let ok = (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(BadApplianceId(id.to_owned()))
    }
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

/// CreateVolume parameter the proxy gives each leg, which the appliance stores and returns in the
/// leg's volume_context: `"<i>/<n>"`, this leg's 0-based position among the volume's `n` legs.
/// Legs are created in order, so the last leg ([`LegMark::is_last`]) exists only once every
/// other leg does, and names them all.
pub const LEG_PARAM: &str = "edgevol.io/leg";

/// The companion of [`LEG_PARAM`] on legs 1 and later: the ids of the legs before this one,
/// joined by [`LEG_SEPARATOR`]. With the leg's own id it gives the replicated volume's id.
pub const LEGS_BEFORE_PARAM: &str = "edgevol.io/legs-before";

/// The most legs a replicated volume has.
pub const MAX_LEGS: usize = 3;

/// What [`LEG_PARAM`] and [`LEGS_BEFORE_PARAM`] say about a volume: it is leg `index` of
/// `count`, after the legs `before`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegMark {
    /// 0-based position.
    pub index: usize,
    /// Number of legs of the replicated volume, 2 to [`MAX_LEGS`].
    pub count: usize,
    /// The ids of legs `0..index`, in order.
    pub before: Vec<String>,
}

/// Why a leg marking is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LegMarkError {
    /// [`LEG_PARAM`] is not `<i>/<n>` in decimal.
    Malformed(String),
    /// `n` is not 2 to [`MAX_LEGS`], or `i` is not below it.
    OutOfRange {
        /// i
        index: usize,
        /// n
        count: usize,
    },
    /// [`LEGS_BEFORE_PARAM`] without [`LEG_PARAM`].
    BeforeWithoutLeg,
    /// [`LEGS_BEFORE_PARAM`] does not list exactly `index` legs.
    BeforeCount {
        /// i
        index: usize,
        /// how many ids it lists
        listed: usize,
    },
    /// An id in [`LEGS_BEFORE_PARAM`] that is not a volume id (`[a-z0-9-]`, not empty).
    BadId(String),
}

impl std::fmt::Display for LegMarkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LegMarkError::Malformed(v) => write!(
                f,
                "parameter {LEG_PARAM}={v:?}: expected <leg>/<legs>, e.g. \"1/2\""
            ),
            LegMarkError::OutOfRange { index, count } => write!(
                f,
                "parameter {LEG_PARAM}=\"{index}/{count}\": a replicated volume has 2 to \
                 {MAX_LEGS} legs, numbered from 0"
            ),
            LegMarkError::BeforeWithoutLeg => write!(
                f,
                "parameter {LEGS_BEFORE_PARAM} is only accepted with {LEG_PARAM}"
            ),
            LegMarkError::BeforeCount { index, listed } => write!(
                f,
                "parameters {LEG_PARAM}, {LEGS_BEFORE_PARAM}: leg {index} comes after {index} \
                 legs, {listed} listed"
            ),
            LegMarkError::BadId(id) => write!(
                f,
                "parameter {LEGS_BEFORE_PARAM}: {id:?} is not a volume id"
            ),
        }
    }
}

impl std::error::Error for LegMarkError {}

fn is_volume_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl LegMark {
    /// The marking the two parameters' values give: `None` when neither is present.
    pub fn parse(leg: Option<&str>, before: Option<&str>) -> Result<Option<LegMark>, LegMarkError> {
        let Some(leg) = leg else {
            return match before {
                None => Ok(None),
                Some(_) => Err(LegMarkError::BeforeWithoutLeg),
            };
        };
        let number = |s: &str| -> Option<usize> {
            (!s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let (index, count) = leg
            .split_once('/')
            .and_then(|(i, n)| Some((number(i)?, number(n)?)))
            .ok_or_else(|| LegMarkError::Malformed(leg.to_owned()))?;
        if !(2..=MAX_LEGS).contains(&count) || index >= count {
            return Err(LegMarkError::OutOfRange { index, count });
        }
        let before: Vec<String> = match before {
            None => Vec::new(),
            Some(b) => legs(b).map(str::to_owned).collect(),
        };
        if before.len() != index {
            return Err(LegMarkError::BeforeCount {
                index,
                listed: before.len(),
            });
        }
        if let Some(bad) = before.iter().find(|id| !is_volume_id(id)) {
            return Err(LegMarkError::BadId(bad.clone()));
        }
        Ok(Some(LegMark {
            index,
            count,
            before,
        }))
    }

    /// The marking of a volume_context (or parameters) map.
    pub fn of<S: std::hash::BuildHasher>(
        map: &std::collections::HashMap<String, String, S>,
    ) -> Result<Option<LegMark>, LegMarkError> {
        LegMark::parse(
            map.get(LEG_PARAM).map(String::as_str),
            map.get(LEGS_BEFORE_PARAM).map(String::as_str),
        )
    }

    /// The marking of leg `index` of `count`, after `before`.
    pub fn new(index: usize, count: usize, before: &[&str]) -> LegMark {
        LegMark {
            index,
            count,
            before: before.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// The parameters that carry it (no [`LEGS_BEFORE_PARAM`] on leg 0).
    pub fn params(&self) -> Vec<(String, String)> {
        let mut p = vec![(
            LEG_PARAM.to_owned(),
            format!("{}/{}", self.index, self.count),
        )];
        if !self.before.is_empty() {
            p.push((
                LEGS_BEFORE_PARAM.to_owned(),
                join_legs(self.before.iter().map(String::as_str)),
            ));
        }
        p
    }

    /// Whether this is the volume's last leg, which names every other.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }

    /// The replicated volume's id, this leg's own id being `own` (complete on the last leg).
    pub fn volume_id(&self, own: &str) -> String {
        join_legs(self.before.iter().map(String::as_str).chain([own]))
    }
}

/// The appliance a leg's (or any plain) volume id names: `box-7-v3` -> `box-7`.
pub fn appliance_of(id: &str) -> &str {
    id.rsplit_once('-').map_or(id, |(a, _)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appliance_ids_are_1_to_32_of_lowercase_digits_and_inner_dashes() {
        for ok in ["a", "box-1", "0", &"a".repeat(32)] {
            assert_eq!(check_appliance_id(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-box", "box-", "Box_1", "box.1", "bøx", &"a".repeat(33)] {
            assert_eq!(
                check_appliance_id(bad),
                Err(BadApplianceId(bad.to_owned())),
                "{bad}"
            );
        }
        assert_eq!(
            BadApplianceId("Box_1".into()).to_string(),
            "appliance id \"Box_1\": use 1-32 of [a-z0-9-], not starting or ending with '-'"
        );
    }

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

    #[test]
    fn leg_marks_round_trip_and_bad_ones_are_refused() {
        let m = LegMark::new(2, 3, &["box-7-v3", "box-8-v5"]);
        let p: std::collections::HashMap<String, String> = m.params().into_iter().collect();
        assert_eq!(p[LEG_PARAM], "2/3");
        assert_eq!(p[LEGS_BEFORE_PARAM], "box-7-v3+box-8-v5");
        assert_eq!(LegMark::of(&p).unwrap(), Some(m.clone()));
        assert!(m.is_last());
        assert_eq!(m.volume_id("box-9-v1"), "box-7-v3+box-8-v5+box-9-v1");
        let first = LegMark::new(0, 2, &[]);
        assert_eq!(first.params().len(), 1, "leg 0 names no earlier leg");
        assert!(!first.is_last());
        assert_eq!(first.volume_id("box-7-v3"), "box-7-v3");
        assert_eq!(LegMark::parse(None, None), Ok(None));
        assert_eq!(appliance_of("box-7-v3"), "box-7");

        let bad = [
            (Some("1"), None, LegMarkError::Malformed("1".into())),
            (Some("a/2"), None, LegMarkError::Malformed("a/2".into())),
            (Some("+1/2"), None, LegMarkError::Malformed("+1/2".into())),
            (
                Some("0/1"),
                None,
                LegMarkError::OutOfRange { index: 0, count: 1 },
            ),
            (
                Some("3/4"),
                Some("a-v1+b-v1+c-v1"),
                LegMarkError::OutOfRange { index: 3, count: 4 },
            ),
            (
                Some("2/2"),
                Some("a-v1+b-v1"),
                LegMarkError::OutOfRange { index: 2, count: 2 },
            ),
            (None, Some("a-v1"), LegMarkError::BeforeWithoutLeg),
            (
                Some("1/2"),
                None,
                LegMarkError::BeforeCount {
                    index: 1,
                    listed: 0,
                },
            ),
            (
                Some("0/2"),
                Some("a-v1"),
                LegMarkError::BeforeCount {
                    index: 0,
                    listed: 1,
                },
            ),
            (
                Some("2/3"),
                Some("a-v1"),
                LegMarkError::BeforeCount {
                    index: 2,
                    listed: 1,
                },
            ),
            (
                Some("1/2"),
                Some("A-v1"),
                LegMarkError::BadId("A-v1".into()),
            ),
            (
                Some("2/3"),
                Some("a-v1+"),
                LegMarkError::BadId(String::new()),
            ),
        ];
        for (leg, before, want) in bad {
            assert_eq!(LegMark::parse(leg, before), Err(want), "{leg:?} {before:?}");
        }
    }
}
