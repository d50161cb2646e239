//! Volumes and snapshots as ListVolumes and ListSnapshots page them out.

use std::collections::HashMap;

use edgevol_driver::fleet::LegMark;
use edgevol_proto::csi::v1::controller_client::ControllerClient;
use edgevol_proto::csi::v1::volume_content_source::Type as Source;
use edgevol_proto::csi::v1::{ListSnapshotsRequest, ListVolumesRequest};
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

/// Every volume (all pages).
pub async fn volumes(channel: &Channel) -> Result<Vec<VolumeRow>, String> {
    let mut client = ControllerClient::new(channel.clone());
    let mut rows = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_volumes(ListVolumesRequest {
                max_entries: PAGE,
                starting_token: token,
            })
            .await
            .map_err(call_err("ListVolumes"))?
            .into_inner();
        for entry in page.entries {
            let Some(v) = entry.volume else { continue };
            let status = entry.status.unwrap_or_default();
            let condition = match status.volume_condition {
                Some(c) if c.abnormal => format!("ABNORMAL: {}", c.message),
                _ => "ok".into(),
            };
            let (claim, pv) = k8s_names(&v.volume_context);
            let leg = leg_of(&v.volume_id, &v.volume_context);
            rows.push(VolumeRow {
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
            });
        }
        if page.next_token.is_empty() {
            return Ok(rows);
        }
        token = page.next_token;
    }
}

/// Every snapshot (all pages).
pub async fn snapshots(channel: &Channel) -> Result<Vec<SnapshotRow>, String> {
    let mut client = ControllerClient::new(channel.clone());
    let mut rows = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_snapshots(ListSnapshotsRequest {
                max_entries: PAGE,
                starting_token: token,
                ..Default::default()
            })
            .await
            .map_err(call_err("ListSnapshots"))?
            .into_inner();
        for entry in page.entries {
            let Some(s) = entry.snapshot else { continue };
            rows.push(SnapshotRow {
                id: s.snapshot_id,
                source: s.source_volume_id,
                size: s.size_bytes,
                created: s.creation_time.map_or(0, |t| t.seconds),
                ready: s.ready_to_use,
                group: (!s.group_snapshot_id.is_empty()).then_some(s.group_snapshot_id),
            });
        }
        if page.next_token.is_empty() {
            return Ok(rows);
        }
        token = page.next_token;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_names_come_from_the_volume_context() {
        let ctx = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
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
    fn a_leg_names_its_position_and_the_replicated_volume() {
        let ctx = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
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
