//! Listings that page across appliances: ListVolumes, ListSnapshots, ListVolumeGroups.
//!
//! A page is filled from the appliances in configured order, each one's own listing continued
//! where the previous page stopped. The token says where: `<appliance id>:<that appliance's own
//! token>` (empty: from its start). Appliances name their pages by the last id listed, which
//! stays meaningful when that object is deleted or others are created; naming the appliance by
//! id (not position) keeps a token valid when appliances are added to the proxy's list. A token
//! naming no appliance of this proxy is not one it issued: `ABORTED`, as CSI says.
//!
//! ListVolumes hides the legs of replicated volumes but their last ([`crate::fleet_legs`]): a
//! page keeps asking the same appliance from its next token until the page is full, so hidden
//! legs do not leave pages short.

use edgevol_proto::csi::v1::{
    list_snapshots_response, list_volumes_response, ListSnapshotsRequest, ListSnapshotsResponse,
    ListVolumesRequest, ListVolumesResponse,
};
use edgevol_proto::volumegroup::{
    list_volume_groups_response, ListVolumeGroupsRequest, ListVolumeGroupsResponse,
};
use prost::Message;
use tonic::Status;

/// Where a page starts: the appliance's index, and its own token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// Index of the appliance in the proxy's list.
    pub appliance: usize,
    /// The appliance's token ("" for its first page).
    pub token: String,
}

/// The position a client's `starting_token` names.
pub fn parse(token: &str, ids: &[&str]) -> Result<Position, Status> {
    if token.is_empty() {
        return Ok(Position {
            appliance: 0,
            token: String::new(),
        });
    }
    token
        .split_once(':')
        .and_then(|(id, own)| {
            let appliance = ids.iter().position(|i| *i == id)?;
            Some(Position {
                appliance,
                token: own.to_owned(),
            })
        })
        .ok_or_else(|| {
            Status::aborted(format!(
                "starting_token {token:?} is not one this plugin issued; restart the listing"
            ))
        })
}

/// The token of a position.
pub fn render(id: &str, own: &str) -> String {
    format!("{id}:{own}")
}

/// A List call the proxy pages across appliances.
pub trait Listing: Message + Default + Clone + 'static {
    /// Its answer.
    type Answer: Message + Default + 'static;
    /// One entry of a page.
    type Entry;
    /// The gRPC method path.
    const PATH: &'static str;
    /// `max_entries`.
    fn max_entries(&self) -> i32;
    /// `starting_token`.
    fn starting_token(&self) -> &str;
    /// This request asking for `max` entries from `token`.
    fn page(&self, max: i32, token: String) -> Self;
    /// An answer's entries and next token.
    fn split(answer: Self::Answer) -> (Vec<Self::Entry>, String);
    /// The answer of a page.
    fn join(entries: Vec<Self::Entry>, next_token: String) -> Self::Answer;
    /// An appliance's entry as the proxy lists it, or `None` when it is not listed (a leg of a
    /// replicated volume other than its last: [`crate::fleet_legs`]).
    fn shown(entry: Self::Entry) -> Option<Self::Entry>;
}

macro_rules! listing {
    ($req:ty, $answer:ty, $entry:ty, $path:literal, $shown:expr) => {
        impl Listing for $req {
            type Answer = $answer;
            type Entry = $entry;
            const PATH: &'static str = $path;
            fn max_entries(&self) -> i32 {
                self.max_entries
            }
            fn starting_token(&self) -> &str {
                &self.starting_token
            }
            fn page(&self, max: i32, token: String) -> Self {
                let mut r = self.clone();
                r.max_entries = max;
                r.starting_token = token;
                r
            }
            fn split(answer: $answer) -> (Vec<$entry>, String) {
                (answer.entries, answer.next_token)
            }
            fn join(entries: Vec<$entry>, next_token: String) -> $answer {
                <$answer>::default_with(entries, next_token)
            }
            fn shown(entry: $entry) -> Option<$entry> {
                $shown(entry)
            }
        }
    };
}

/// Builds an answer from its two fields (the generated types have no constructor).
trait DefaultWith<E> {
    fn default_with(entries: Vec<E>, next_token: String) -> Self;
}

impl DefaultWith<list_volumes_response::Entry> for ListVolumesResponse {
    fn default_with(entries: Vec<list_volumes_response::Entry>, next_token: String) -> Self {
        ListVolumesResponse {
            entries,
            next_token,
        }
    }
}

impl DefaultWith<list_snapshots_response::Entry> for ListSnapshotsResponse {
    fn default_with(entries: Vec<list_snapshots_response::Entry>, next_token: String) -> Self {
        ListSnapshotsResponse {
            entries,
            next_token,
        }
    }
}

impl DefaultWith<list_volume_groups_response::Entry> for ListVolumeGroupsResponse {
    fn default_with(entries: Vec<list_volume_groups_response::Entry>, next_token: String) -> Self {
        ListVolumeGroupsResponse {
            entries,
            next_token,
        }
    }
}

listing!(
    ListVolumesRequest,
    ListVolumesResponse,
    list_volumes_response::Entry,
    "/csi.v1.Controller/ListVolumes",
    crate::fleet_legs::as_listed
);
listing!(
    ListSnapshotsRequest,
    ListSnapshotsResponse,
    list_snapshots_response::Entry,
    "/csi.v1.Controller/ListSnapshots",
    Some
);
listing!(
    ListVolumeGroupsRequest,
    ListVolumeGroupsResponse,
    list_volume_groups_response::Entry,
    "/volumegroup.Controller/ListVolumeGroups",
    Some
);

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn tokens_name_an_appliance_by_id_and_its_own_token() {
        let ids = ["a", "b-2"];
        assert_eq!(
            parse("", &ids).unwrap(),
            Position {
                appliance: 0,
                token: String::new()
            }
        );
        let t = render("b-2", "17");
        assert_eq!(t, "b-2:17");
        assert_eq!(
            parse(&t, &ids).unwrap(),
            Position {
                appliance: 1,
                token: "17".into()
            }
        );
        assert_eq!(parse(&render("b-2", ""), &ids).unwrap().token, "");
        for bad in ["17", "c:1", ":1"] {
            assert_eq!(parse(bad, &ids).unwrap_err().code(), Code::Aborted, "{bad}");
        }
    }
}
