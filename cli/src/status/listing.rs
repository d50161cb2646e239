//! Volumes and snapshots as ListVolumes and ListSnapshots page them out.

use std::collections::HashMap;

use edgevol_driver::fleet::LegMark;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_content_source::Type as Source;
use edgevol_proto::csi::v1::{
    list_snapshots_response, list_volumes_response, ListSnapshotsRequest, ListVolumesRequest,
};
use tonic::transport::Channel;

use super::call_err;

/// Entries asked for per List call.
const PAGE: i32 = 1000;

/// One volume, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    /// CSI volume id.
    pub id: String,
    /// Size in bytes.
    pub size: i64,
    /// The snapshot or volume it was created from, if any.
    pub source: Option<String>,
    /// Nodes (host NQNs) it is published to.
    pub published: Vec<String>,
    /// `ok`, or the abnormal condition's message.
    pub condition: String,
    /// The Kubernetes claim (`namespace/name`) and PV it was provisioned for, when the CO sent
    /// that metadata (external-provisioner's `--extra-create-metadata`).
    pub claim: Option<String>,
    /// The Kubernetes PersistentVolume name, likewise.
    pub pv: Option<String>,
    /// For a leg of a replicated volume (listed on its own appliance): which leg of which
    /// volume, e.g. `1/2 of box-a-v3+box-b-v5`.
    pub leg: Option<String>,
    /// `luks2` (or `luks2+discard`) for a volume the node plugin keeps encrypted (its
    /// `encrypted` parameter); `None` for a plain one.
    pub encrypted: Option<String>,
}

/// One snapshot, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRow {
    /// CSI snapshot id.
    pub id: String,
    /// The volume it froze.
    pub source: String,
    /// Size in bytes.
    pub size: i64,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// Ready to use.
    pub ready: bool,
    /// The group snapshot it belongs to, if any.
    pub group: Option<String>,
}

/// The claim (`namespace/name`) and PV name in a volume's context (its CreateVolume
/// parameters, which the appliance returns as volume_context).
fn k8s_names(context: &HashMap<String, String>) -> (Option<String>, Option<String>) {
    let get = |k: &str| context.get(k).filter(|v| !v.is_empty()).cloned();
    let claim = match (
        get("csi.storage.k8s.io/pvc/namespace"),
        get("csi.storage.k8s.io/pvc/name"),
    ) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name),
        _ => None,
    };
    (claim, get("csi.storage.k8s.io/pv/name"))
}

/// The LEG cell of volume `id`: `i/n of <replicated id>`. The last leg names every leg; an
/// earlier one knows only the legs up to itself, so its id ends in `+…`.
fn leg_of(id: &str, context: &HashMap<String, String>) -> Option<String> {
    let mark = LegMark::of(context).ok()??;
    let volume = mark.volume_id(id);
    let more = if mark.is_last() { "" } else { "+…" };
    Some(format!("{}/{} of {volume}{more}", mark.index, mark.count))
}

/// The ENCRYPTED cell of a volume whose context holds its `encrypted` parameter.
fn encryption_of(context: &HashMap<String, String>) -> Option<String> {
    let on = |k: &str| context.get(k).is_some_and(|v| v == "true");
    match (on("encrypted"), on("encryptedDiscard")) {
        (false, _) => None,
        (true, false) => Some("luks2".into()),
        (true, true) => Some("luks2+discard".into()),
    }
}

/// The row of one ListVolumes entry (`None` for an entry without a volume).
fn volume_row(entry: list_volumes_response::Entry) -> Option<VolumeRow> {
    let v = entry.volume?;
    let status = entry.status.unwrap_or_default();
    let condition = match status.volume_condition {
        Some(c) if c.abnormal => format!("ABNORMAL: {}", c.message),
        _ => "ok".into(),
    };
    let (claim, pv) = k8s_names(&v.volume_context);
    let leg = leg_of(&v.volume_id, &v.volume_context);
    let encrypted = encryption_of(&v.volume_context);
    Some(VolumeRow {
        id: v.volume_id,
        size: v.capacity_bytes,
        source: v.content_source.and_then(|s| s.r#type).map(|t| match t {
            Source::Snapshot(s) => format!("snapshot {}", s.snapshot_id),
            Source::Volume(v) => format!("volume {}", v.volume_id),
        }),
        published: status.published_node_ids,
        condition,
        claim,
        pv,
        leg,
        encrypted,
    })
}

/// The row of one ListSnapshots entry (`None` for an entry without a snapshot).
fn snapshot_row(entry: list_snapshots_response::Entry) -> Option<SnapshotRow> {
    let s = entry.snapshot?;
    Some(SnapshotRow {
        id: s.snapshot_id,
        source: s.source_volume_id,
        size: s.size_bytes,
        created: s.creation_time.map_or(0, |t| t.seconds),
        ready: s.ready_to_use,
        group: (!s.group_snapshot_id.is_empty()).then_some(s.group_snapshot_id),
    })
}

/// Every row of a paged List call: `page(starting_token)` gives one page's rows and its
/// next_token, which is empty on the last page.
async fn all_pages<T>(
    mut page: impl AsyncFnMut(String) -> Result<(Vec<T>, String), String>,
) -> Result<Vec<T>, String> {
    let mut rows = Vec::new();
    let mut token = String::new();
    loop {
        let (page_rows, next_token) = page(token).await?;
        rows.extend(page_rows);
        if next_token.is_empty() {
            return Ok(rows);
        }
        token = next_token;
    }
}

/// Every volume (all pages).
pub async fn volumes(channel: &Channel) -> Result<Vec<VolumeRow>, String> {
    let mut client = ControllerClient::new(channel.clone());
    all_pages(async |starting_token| {
        let page = client
            .list_volumes(ListVolumesRequest {
                max_entries: PAGE,
                starting_token,
            })
            .await
            .map_err(call_err("ListVolumes"))?
            .into_inner();
        let rows = page.entries.into_iter().filter_map(volume_row).collect();
        Ok((rows, page.next_token))
    })
    .await
}

/// Every snapshot (all pages).
pub async fn snapshots(channel: &Channel) -> Result<Vec<SnapshotRow>, String> {
    let mut client = ControllerClient::new(channel.clone());
    all_pages(async |starting_token| {
        let page = client
            .list_snapshots(ListSnapshotsRequest {
                max_entries: PAGE,
                starting_token,
                ..Default::default()
            })
            .await
            .map_err(call_err("ListSnapshots"))?
            .into_inner();
        let rows = page.entries.into_iter().filter_map(snapshot_row).collect();
        Ok((rows, page.next_token))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[tokio::test]
    async fn all_pages_follows_next_token_to_the_last_page_and_stops_at_an_error() {
        let mut asked = Vec::new();
        let rows = all_pages(async |token: String| {
            asked.push(token.clone());
            Ok(match token.as_str() {
                "" => (vec![1, 2], "p2".to_owned()),
                "p2" => (vec![], "p3".to_owned()),
                _ => (vec![3], String::new()),
            })
        })
        .await;
        assert_eq!(rows, Ok(vec![1, 2, 3]));
        assert_eq!(asked, ["", "p2", "p3"]);

        let mut calls = 0;
        let failed = all_pages(async |token: String| {
            calls += 1;
            match token.as_str() {
                "" => Ok((vec![1], "p2".to_owned())),
                _ => Err("ListVolumes: unavailable".to_owned()),
            }
        })
        .await;
        assert_eq!(failed, Err("ListVolumes: unavailable".to_owned()));
        assert_eq!(calls, 2);
    }

    #[test]
    fn kubernetes_names_come_from_the_volume_context() {
        assert_eq!(
            k8s_names(&ctx(&[
                ("csi.storage.k8s.io/pvc/name", "data"),
                ("csi.storage.k8s.io/pvc/namespace", "shop"),
                ("csi.storage.k8s.io/pv/name", "pvc-1234"),
                ("provisioning", "thin"),
            ])),
            (Some("shop/data".into()), Some("pvc-1234".into()))
        );
        assert_eq!(k8s_names(&ctx(&[("provisioning", "thin")])), (None, None));
    }

    #[test]
    fn encryption_comes_from_the_volume_context() {
        assert_eq!(encryption_of(&ctx(&[("provisioning", "thin")])), None);
        assert_eq!(encryption_of(&ctx(&[("encrypted", "false")])), None);
        assert_eq!(
            encryption_of(&ctx(&[("encrypted", "true")])).as_deref(),
            Some("luks2")
        );
        assert_eq!(
            encryption_of(&ctx(&[("encrypted", "true"), ("encryptedDiscard", "true")])).as_deref(),
            Some("luks2+discard")
        );
    }

    #[test]
    fn a_leg_names_its_position_and_the_replicated_volume() {
        assert_eq!(
            leg_of("box-a-v3", &ctx(&[("edgevol.io/leg", "0/2")])).as_deref(),
            Some("0/2 of box-a-v3+…")
        );
        assert_eq!(
            leg_of(
                "box-b-v5",
                &ctx(&[
                    ("edgevol.io/leg", "1/2"),
                    ("edgevol.io/legs-before", "box-a-v3")
                ])
            )
            .as_deref(),
            Some("1/2 of box-a-v3+box-b-v5")
        );
        assert_eq!(
            leg_of(
                "box-b-v5",
                &ctx(&[
                    ("edgevol.io/leg", "1/3"),
                    ("edgevol.io/legs-before", "box-a-v3")
                ])
            )
            .as_deref(),
            Some("1/3 of box-a-v3+box-b-v5+…")
        );
        assert_eq!(leg_of("box-a-v1", &ctx(&[("provisioning", "thin")])), None);
    }
}
