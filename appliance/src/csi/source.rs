//! CreateVolume's content source: parsed at the edge ([`SourceRef::parse`]), resolved to a core
//! source and its size on the pool ([`SourceRef::resolve`]).

use edgevol_core::{BlockDevice, ContentSource, Pool};
use edgevol_proto::csi::v1::volume_content_source::Type as SourceType;
use edgevol_proto::csi::v1::VolumeContentSource;
use tonic::Status;

use super::error::Error;
use super::ids::Ids;

/// A content source as the request names it: a CSI id, not yet looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceRef {
    /// Restore a snapshot.
    Snapshot(String),
    /// Clone a volume.
    Volume(String),
}

impl SourceRef {
    /// `volume_content_source`, if given: it must name a snapshot or a volume.
    pub fn parse(source: Option<VolumeContentSource>) -> Result<Option<Self>, Status> {
        match source.map(|s| s.r#type) {
            None => Ok(None),
            Some(None) => Err(Status::invalid_argument(
                "volume_content_source has no snapshot or volume",
            )),
            Some(Some(SourceType::Snapshot(s))) => Ok(Some(SourceRef::Snapshot(s.snapshot_id))),
            Some(Some(SourceType::Volume(v))) => Ok(Some(SourceRef::Volume(v.volume_id))),
        }
    }

    /// The core source and its size in bytes. An id that is not ours, or names nothing, is
    /// NOT_FOUND (the spec's row for a missing source).
    pub fn resolve<D: BlockDevice>(
        &self,
        ids: Ids<'_>,
        pool: &Pool<D>,
    ) -> Result<(ContentSource, u64), Error> {
        Ok(match self {
            SourceRef::Snapshot(s) => {
                let id = ids.require_snapshot(s)?;
                (ContentSource::Snapshot(id), pool.snapshot(id)?.size())
            }
            SourceRef::Volume(v) => {
                let id = ids.require_volume(v)?;
                (ContentSource::Volume(id), pool.volume(id)?.size())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_proto::csi::v1::volume_content_source::SnapshotSource;

    #[test]
    fn a_source_names_a_snapshot_or_a_volume() {
        assert_eq!(SourceRef::parse(None).unwrap(), None);
        let e = SourceRef::parse(Some(VolumeContentSource { r#type: None })).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let snap = VolumeContentSource {
            r#type: Some(SourceType::Snapshot(SnapshotSource {
                snapshot_id: "box-s1".into(),
            })),
        };
        assert_eq!(
            SourceRef::parse(Some(snap)).unwrap(),
            Some(SourceRef::Snapshot("box-s1".into()))
        );
    }
}
