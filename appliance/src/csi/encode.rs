//! Core objects as CSI messages: the one place that builds `Volume`, `Snapshot`,
//! `VolumeGroupSnapshot`, `VolumeGroup` and the publish context, so a volume looks the same from
//! every RPC that shows it (CSI asks for that).

use std::collections::HashMap;
use std::net::SocketAddr;

use edgevol_core::{
    BlockDevice, ContentSource, Group, GroupSnapshot, Pool, Snapshot as CoreSnapshot,
    Volume as CoreVolume, VolumeId,
};
use edgevol_proto::csi::v1::volume_content_source::{
    SnapshotSource, Type as SourceType, VolumeSource,
};
use edgevol_proto::csi::v1::{
    Snapshot, Volume, VolumeCondition, VolumeContentSource, VolumeGroupSnapshot,
};
use edgevol_proto::volumegroup::vg_volume_content_source::{
    self as vg_source, SnapshotSource as VgSnapshotSource, VolumeSource as VgVolumeSource,
};
use edgevol_proto::volumegroup::{VgTopology, VgVolume, VgVolumeContentSource, VolumeGroup};

use super::error::Error;
use super::ids::Ids;
use super::topology;
use crate::naming;
use crate::nvme::stats::MediaHealth;
use crate::state::State;

pub use edgevol_driver::publish_context;

/// A byte count or id as CSI's `int64`, saturating.
pub fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Nanoseconds since the epoch as a protobuf timestamp.
pub fn timestamp(nanos: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64_of(nanos / 1_000_000_000),
        nanos: i32::try_from(nanos % 1_000_000_000).unwrap_or(0),
    }
}

/// What a volume reports as volume_context: its parameters and the pool's cluster size.
pub fn volume_context<D: BlockDevice>(pool: &Pool<D>, v: &CoreVolume) -> HashMap<String, String> {
    context_of(v.parameters().to_vec(), pool.cluster_size())
}

fn context_of(parameters: Vec<(String, String)>, cluster_size: u32) -> HashMap<String, String> {
    let mut context = HashMap::with_capacity(parameters.len() + 1);
    context.extend(parameters);
    context.insert("edgevol.io/cluster-size".into(), cluster_size.to_string());
    context
}

/// What a volume's CSI message is made of, copied from core: taken under the pool lock, turned
/// into the message ([`VolumeFacts::into_volume`]) after it, so the group commit's hold of the
/// pool does not include building every call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeFacts {
    id: VolumeId,
    size: u64,
    parameters: Vec<(String, String)>,
    source: Option<ContentSource>,
    cluster_size: u32,
}

impl VolumeFacts {
    /// The facts of `v`, a volume of `pool`.
    pub fn of<D: BlockDevice>(pool: &Pool<D>, v: &CoreVolume) -> Self {
        VolumeFacts {
            id: v.id(),
            size: v.size(),
            parameters: v.parameters().to_vec(),
            source: v.source(),
            cluster_size: pool.cluster_size(),
        }
    }

    /// The volume's id.
    pub fn id(&self) -> VolumeId {
        self.id
    }

    /// The volume as the Controller service shows it (the same message as [`volume`]).
    pub fn into_volume(self, state: &State) -> Volume {
        let ids = Ids::new(&state.appliance_id);
        Volume {
            capacity_bytes: i64_of(self.size),
            volume_id: ids.volume(self.id),
            volume_context: context_of(self.parameters, self.cluster_size),
            content_source: self.source.map(|s| VolumeContentSource {
                r#type: Some(match s {
                    ContentSource::Snapshot(id) => SourceType::Snapshot(SnapshotSource {
                        snapshot_id: ids.snapshot(id),
                    }),
                    ContentSource::Volume(id) => SourceType::Volume(VolumeSource {
                        volume_id: ids.volume(id),
                    }),
                }),
            }),
            accessible_topology: vec![topology::segments(state)],
        }
    }
}

/// A volume as the Controller service shows it.
pub fn volume<D: BlockDevice>(state: &State, pool: &Pool<D>, v: &CoreVolume) -> Volume {
    VolumeFacts::of(pool, v).into_volume(state)
}

/// A volume as the VolumeGroup service shows it: the same fields in that proposal's types.
pub fn vg_volume<D: BlockDevice>(state: &State, pool: &Pool<D>, v: &CoreVolume) -> VgVolume {
    let Volume {
        capacity_bytes,
        volume_id,
        volume_context,
        content_source,
        accessible_topology,
    } = volume(state, pool, v);
    VgVolume {
        capacity_bytes,
        volume_id,
        volume_context,
        content_source: content_source
            .and_then(|s| s.r#type)
            .map(|t| VgVolumeContentSource {
                r#type: Some(match t {
                    SourceType::Snapshot(s) => vg_source::Type::Snapshot(VgSnapshotSource {
                        snapshot_id: s.snapshot_id,
                    }),
                    SourceType::Volume(v) => vg_source::Type::Volume(VgVolumeSource {
                        volume_id: v.volume_id,
                    }),
                }),
            }),
        accessible_topology: accessible_topology
            .into_iter()
            .map(|t| VgTopology {
                segments: t.segments,
            })
            .collect(),
    }
}

/// A snapshot: ready at once (snapshots are instant), with its group snapshot if any.
pub fn snapshot(ids: Ids<'_>, s: &CoreSnapshot) -> Snapshot {
    Snapshot {
        size_bytes: i64_of(s.size()),
        snapshot_id: ids.snapshot(s.id()),
        source_volume_id: ids.volume(s.source_volume()),
        creation_time: Some(timestamp(s.created_at())),
        ready_to_use: true,
        group_snapshot_id: s
            .group_snapshot()
            .map(|g| ids.group_snapshot(g))
            .unwrap_or_default(),
    }
}

/// A group snapshot: every member snapshot, ready.
pub fn group_snapshot<D: BlockDevice>(
    ids: Ids<'_>,
    pool: &Pool<D>,
    gs: &GroupSnapshot,
) -> Result<VolumeGroupSnapshot, Error> {
    let snapshots = gs
        .snapshots()
        .iter()
        .map(|&s| pool.snapshot(s).map(|s| snapshot(ids, s)))
        .collect::<Result<_, _>>()?;
    Ok(VolumeGroupSnapshot {
        group_snapshot_id: ids.group_snapshot(gs.id()),
        snapshots,
        creation_time: Some(timestamp(gs.created_at())),
        ready_to_use: true,
    })
}

/// A volume group: its parameters as context, and every member volume.
pub fn volume_group<D: BlockDevice>(
    state: &State,
    pool: &Pool<D>,
    group: &Group,
) -> Result<VolumeGroup, Error> {
    let ids = Ids::new(&state.appliance_id);
    let mut volumes = Vec::new();
    for v in pool.group_members(group.id())? {
        volumes.push(vg_volume(state, pool, pool.volume(v)?));
    }
    Ok(VolumeGroup {
        volume_group_id: ids.group(group.id()),
        volume_group_context: group.parameters().iter().cloned().collect(),
        volumes,
    })
}

/// The nodes a volume is published to.
pub fn published_nodes(v: &CoreVolume) -> Vec<String> {
    v.publications().iter().map(|p| p.host.clone()).collect()
}

/// A volume's condition: abnormal when its pool stopped after a device failure (every volume on
/// it then is: the pool refuses all work until the appliance reopens it), or when commands on
/// this volume failed on the medium since the daemon started (`health`, from the target: the
/// drive may be failing; other volumes keep being served).
pub fn condition<D: BlockDevice>(pool: &Pool<D>, health: Option<MediaHealth>) -> VolumeCondition {
    if let Some(kind) = pool.failure() {
        return VolumeCondition {
            abnormal: true,
            message: format!("pool stopped after a device failure ({kind}); restart the appliance"),
        };
    }
    match health {
        Some(MediaHealth {
            errors,
            last: Some((at, kind)),
        }) if errors > 0 => VolumeCondition {
            abnormal: true,
            message: format!(
                "{errors} I/O command(s) failed on the pool device's medium since the appliance started, \
                 the latest a {} at Unix time {at}; check the drive (edgevol status --metrics)",
                kind.as_str()
            ),
        },
        _ => VolumeCondition {
            abnormal: false,
            message: "pool healthy".into(),
        },
    }
}

/// Where and how a node reaches a published volume.
pub fn publish_context(
    appliance: &str,
    endpoint: SocketAddr,
    pool_uuid: [u8; 16],
    volume: VolumeId,
    readonly: bool,
) -> HashMap<String, String> {
    use publish_context as k;
    let mut context = HashMap::with_capacity(7);
    context.extend([
        (k::TRANSPORT.to_owned(), k::TRANSPORT_TCP.to_owned()),
        (k::ADDRESS.to_owned(), endpoint.ip().to_string()),
        (k::PORT.to_owned(), endpoint.port().to_string()),
        (
            k::SUBSYSTEM_NQN.to_owned(),
            naming::subsystem_nqn(appliance, volume),
        ),
        (
            k::NGUID.to_owned(),
            naming::hex(&naming::nguid(pool_uuid, volume)),
        ),
        (
            k::UUID.to_owned(),
            naming::uuid_string(naming::namespace_uuid(pool_uuid, volume)),
        ),
        (k::READONLY.to_owned(), readonly.to_string()),
    ]);
    context
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use edgevol_core::VolumeSpec;

    #[test]
    fn a_volume_built_from_facts_after_the_lock_is_the_volume_every_rpc_shows() {
        let dir = tempfile::tempdir().unwrap();
        let topology = BTreeMap::from([
            ("edgevol.io/appliance".to_owned(), "box".to_owned()),
            ("edgevol.io/rack".to_owned(), "r1".to_owned()),
        ]);
        let state = State::new("box".into(), topology);
        let mut pool = crate::pool::open(&[dir.path().join("pool.img")], true).unwrap();
        let source = pool.create_volume(VolumeSpec::new("a", 1 << 20)).unwrap();
        let mut spec = VolumeSpec::new("b", 2 << 20);
        spec.parameters = vec![("fsType".into(), "ext4".into())];
        spec.source = Some(ContentSource::Volume(source));
        let clone = pool.create_volume(spec).unwrap();
        let v = pool.volume(clone).unwrap();

        let facts = VolumeFacts::of(&pool, v);
        assert_eq!(facts.id(), clone);
        let built = facts.into_volume(&state);
        assert_eq!(built, volume(&state, &pool, v));
        let cluster = pool.cluster_size().to_string();
        assert_eq!(
            built,
            Volume {
                capacity_bytes: 2 << 20,
                volume_id: format!("box-v{}", clone.0),
                volume_context: HashMap::from([
                    ("fsType".to_owned(), "ext4".to_owned()),
                    ("edgevol.io/cluster-size".to_owned(), cluster),
                ]),
                content_source: Some(VolumeContentSource {
                    r#type: Some(SourceType::Volume(VolumeSource {
                        volume_id: format!("box-v{}", source.0),
                    })),
                }),
                accessible_topology: vec![edgevol_proto::csi::v1::Topology {
                    segments: HashMap::from([
                        ("edgevol.io/appliance".to_owned(), "box".to_owned()),
                        ("edgevol.io/rack".to_owned(), "r1".to_owned()),
                    ]),
                }],
            }
        );
    }

    #[test]
    fn the_publish_context_names_the_volume_for_the_node() {
        use publish_context as k;
        let endpoint: SocketAddr = "192.0.2.7:4420".parse().unwrap();
        let uuid = *b"0123456789abcdef";
        let context = publish_context("box", endpoint, uuid, VolumeId(12), true);
        assert_eq!(context.len(), 7);
        assert_eq!(context[k::TRANSPORT], k::TRANSPORT_TCP);
        assert_eq!(context[k::ADDRESS], "192.0.2.7");
        assert_eq!(context[k::PORT], "4420");
        assert_eq!(context[k::SUBSYSTEM_NQN], "nqn.2024-11.io.edgevol:box:v12");
        assert_eq!(context[k::NGUID], "3031323334353637000000000000000c");
        assert_eq!(context[k::UUID], "38396162-6364-8566-8000-00000000000c");
        assert_eq!(context[k::READONLY], "true");
    }
}
