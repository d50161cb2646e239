//! CSI ids of the appliance's objects: `<appliance id>-<kind><number>`, e.g. `box-7-v12`.
//!
//! Stable (core never reuses a number) and unique across a fleet (the appliance id is part of
//! them), so a CO addressing several boxes through one proxy never confuses two volumes. An id
//! that does not parse, or names another appliance, is simply not found here
//! ([`Error::UnknownId`]).

use edgevol_core::{GroupId, GroupSnapshotId, SnapshotId, VolumeId};

use super::error::{Error, Kind};

/// Renders and parses the CSI ids of one appliance.
#[derive(Debug, Clone, Copy)]
pub struct Ids<'a> {
    appliance: &'a str,
}

impl<'a> Ids<'a> {
    /// The ids of appliance `appliance`.
    pub fn new(appliance: &'a str) -> Self {
        Ids { appliance }
    }

    fn render(&self, kind: &str, n: u64) -> String {
        format!("{}-{kind}{n}", self.appliance)
    }

    fn parse(&self, kind: &str, id: &str) -> Option<u64> {
        let digits = id
            .strip_prefix(self.appliance)?
            .strip_prefix('-')?
            .strip_prefix(kind)?;
        // Canonical form only: "v012" or "v+12" would alias "v12".
        if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
            return None;
        }
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// `<appliance>-v<n>`.
    pub fn volume(&self, id: VolumeId) -> String {
        self.render("v", id.0)
    }
    /// `<appliance>-s<n>`.
    pub fn snapshot(&self, id: SnapshotId) -> String {
        self.render("s", id.0)
    }
    /// `<appliance>-g<n>`.
    pub fn group(&self, id: GroupId) -> String {
        self.render("g", id.0)
    }
    /// `<appliance>-gs<n>`.
    pub fn group_snapshot(&self, id: GroupSnapshotId) -> String {
        self.render("gs", id.0)
    }

    /// The volume named by a CSI volume id, if it is one of ours.
    pub fn parse_volume(&self, id: &str) -> Option<VolumeId> {
        self.parse("v", id).map(VolumeId)
    }
    /// The snapshot named by a CSI snapshot id.
    pub fn parse_snapshot(&self, id: &str) -> Option<SnapshotId> {
        self.parse("s", id).map(SnapshotId)
    }
    /// The group named by a group id.
    pub fn parse_group(&self, id: &str) -> Option<GroupId> {
        self.parse("g", id).map(GroupId)
    }
    /// The group snapshot named by a group snapshot id.
    pub fn parse_group_snapshot(&self, id: &str) -> Option<GroupSnapshotId> {
        self.parse("gs", id).map(GroupSnapshotId)
    }

    /// `parsed`, or [`Error::UnknownId`] naming `id` as given.
    fn known<T>(kind: Kind, id: &str, parsed: Option<T>) -> Result<T, Error> {
        parsed.ok_or_else(|| Error::UnknownId(kind, id.to_owned()))
    }

    /// The volume named by `id`, or NOT_FOUND naming `id` as given.
    pub fn require_volume(&self, id: &str) -> Result<VolumeId, Error> {
        Self::known(Kind::Volume, id, self.parse_volume(id))
    }
    /// The snapshot named by `id`, or NOT_FOUND.
    pub fn require_snapshot(&self, id: &str) -> Result<SnapshotId, Error> {
        Self::known(Kind::Snapshot, id, self.parse_snapshot(id))
    }
    /// The group named by `id`, or NOT_FOUND.
    pub fn require_group(&self, id: &str) -> Result<GroupId, Error> {
        Self::known(Kind::Group, id, self.parse_group(id))
    }
    /// The group snapshot named by `id`, or NOT_FOUND.
    pub fn require_group_snapshot(&self, id: &str) -> Result<GroupSnapshotId, Error> {
        Self::known(Kind::GroupSnapshot, id, self.parse_group_snapshot(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_foreign_or_odd_ids_do_not_parse() {
        let ids = Ids::new("box-7");
        assert_eq!(ids.volume(VolumeId(12)), "box-7-v12");
        assert_eq!(ids.parse_volume("box-7-v12"), Some(VolumeId(12)));
        assert_eq!(
            ids.parse_snapshot(&ids.snapshot(SnapshotId(3))),
            Some(SnapshotId(3))
        );
        assert_eq!(ids.parse_group(&ids.group(GroupId(4))), Some(GroupId(4)));
        let gs = ids.group_snapshot(GroupSnapshotId(5));
        assert_eq!(ids.parse_group_snapshot(&gs), Some(GroupSnapshotId(5)));
        assert_eq!(ids.parse_group(&gs), None, "gs5 is not group s5");
        assert_eq!(
            ids.require_group("box-8-g1"),
            Err(Error::UnknownId(Kind::Group, "box-8-g1".into()))
        );
        assert_eq!(ids.require_volume("box-7-v12"), Ok(VolumeId(12)));
        for bad in [
            "box-8-v12",
            "box-7-v",
            "box-7-v012",
            "box-7-v+1",
            "box-7-s12",
            "box-7v12",
            "",
            "box-7-v99999999999999999999",
        ] {
            assert_eq!(ids.parse_volume(bad), None, "{bad:?}");
        }
    }
}
