//! `edgevol snapshots diff`: the byte ranges a snapshot holds (`--allocated S`) or that changed
//! between two snapshots of one volume (`--base S1 --target S2`), as the appliance's CSI
//! SnapshotMetadata service streams them (controller or admin certificate).
//!
//! One line per range, printed as the stream arrives (a whole volume's ranges are never held):
//! `OFFSET LENGTH END`, in bytes, for scripts; then a summary line for operators. Ranges are
//! whole clusters; a cluster rewritten with the same bytes counts as changed (the appliance
//! compares its maps, not data).

use std::fmt::Write as _;

use edgevol_proto::csi::v1::snapshot_metadata_client::SnapshotMetadataClient;
use edgevol_proto::csi::v1::{BlockMetadata, GetMetadataAllocatedRequest, GetMetadataDeltaRequest};
use tonic::transport::Channel;

use super::call_err;
use super::units::human_bytes;

/// What to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Diff {
    /// The allocated ranges of one snapshot.
    Allocated(String),
    /// The ranges that differ between two snapshots of one volume.
    Delta {
        /// The older snapshot.
        base: String,
        /// The newer snapshot.
        target: String,
    },
}

/// The column header.
pub const HEADER: &str = "OFFSET LENGTH END\n";

/// Running totals, for the summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Ranges printed.
    pub ranges: u64,
    /// Bytes they cover.
    pub bytes: u64,
    /// The volume's size, as the stream reports it.
    pub capacity: i64,
}

/// One message's ranges as lines, added to `totals`.
pub fn lines(blocks: &[BlockMetadata], totals: &mut Totals) -> String {
    let mut out = String::new();
    for b in blocks {
        let _ = writeln!(
            out,
            "{} {} {}",
            b.byte_offset,
            b.size_bytes,
            b.byte_offset.saturating_add(b.size_bytes)
        );
        totals.ranges += 1;
        totals.bytes += u64::try_from(b.size_bytes).unwrap_or(0);
    }
    out
}

/// The summary line: how many ranges, how many bytes of the volume.
pub fn summary(what: &Diff, totals: &Totals) -> String {
    let share = if totals.capacity > 0 {
        #[allow(clippy::cast_precision_loss)] // a percentage to one decimal
        let pct = totals.bytes as f64 * 100.0 / totals.capacity as f64;
        format!(" ({pct:.1}%)")
    } else {
        String::new()
    };
    let verb = match what {
        Diff::Allocated(_) => "allocated",
        Diff::Delta { .. } => "changed",
    };
    format!(
        "{} range(s), {} {verb} of {}{share}\n",
        totals.ranges,
        human_bytes(i64::try_from(totals.bytes).unwrap_or(i64::MAX)),
        human_bytes(totals.capacity),
    )
}

/// Streams `what` from `starting_offset` on, giving each message's lines to `out` as it
/// arrives; the totals at the end.
pub async fn stream(
    channel: &Channel,
    what: &Diff,
    starting_offset: i64,
    out: &mut dyn FnMut(&str),
) -> Result<Totals, String> {
    let mut client = SnapshotMetadataClient::new(channel.clone());
    let mut totals = Totals::default();
    out(HEADER);
    match what {
        Diff::Allocated(snapshot) => {
            let mut stream = client
                .get_metadata_allocated(GetMetadataAllocatedRequest {
                    snapshot_id: snapshot.clone(),
                    starting_offset,
                    ..Default::default()
                })
                .await
                .map_err(call_err("GetMetadataAllocated"))?
                .into_inner();
            while let Some(msg) = stream
                .message()
                .await
                .map_err(call_err("GetMetadataAllocated"))?
            {
                totals.capacity = msg.volume_capacity_bytes;
                out(&lines(&msg.block_metadata, &mut totals));
            }
        }
        Diff::Delta { base, target } => {
            let mut stream = client
                .get_metadata_delta(GetMetadataDeltaRequest {
                    base_snapshot_id: base.clone(),
                    target_snapshot_id: target.clone(),
                    starting_offset,
                    ..Default::default()
                })
                .await
                .map_err(call_err("GetMetadataDelta"))?
                .into_inner();
            while let Some(msg) = stream
                .message()
                .await
                .map_err(call_err("GetMetadataDelta"))?
            {
                totals.capacity = msg.volume_capacity_bytes;
                out(&lines(&msg.block_metadata, &mut totals));
            }
        }
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bytes_and_the_summary_counts_them() {
        let mut totals = Totals {
            capacity: 16 << 20,
            ..Totals::default()
        };
        let blocks = [
            BlockMetadata {
                byte_offset: 0,
                size_bytes: 2 << 20,
            },
            BlockMetadata {
                byte_offset: 9 << 20,
                size_bytes: 1 << 20,
            },
        ];
        assert_eq!(
            lines(&blocks, &mut totals),
            "0 2097152 2097152\n9437184 1048576 10485760\n"
        );
        let what = Diff::Delta {
            base: "a".into(),
            target: "b".into(),
        };
        assert_eq!(
            summary(&what, &totals),
            "2 range(s), 3.0 MiB changed of 16.0 MiB (18.8%)\n"
        );
        let empty = Totals::default();
        assert_eq!(
            summary(&Diff::Allocated("s".into()), &empty),
            "0 range(s), 0 B allocated of 0 B\n"
        );
    }
}
