//! `edgevol firmware status|update|activate|rollback`: the appliance's A/B firmware over mTLS
//! with an admin certificate.

use std::fmt::Write;
use std::path::Path;

use edgevol_firmware::bundle;
use edgevol_proto::edgevol::v1::firmware_client::FirmwareClient;
use edgevol_proto::edgevol::v1::{
    FirmwareActivateRequest, FirmwareChunk, FirmwareRollbackRequest, FirmwareStatusRequest,
    FirmwareStatusResponse, FirmwareUpdateResponse,
};
use tonic::transport::Channel;

use crate::status::call_err;

/// Size of one streamed chunk: well under gRPC's default 4 MiB message limit.
pub const CHUNK: usize = 1 << 20;

/// Both slots, which one runs, and why the last update was rolled back.
pub async fn status(channel: &Channel) -> Result<FirmwareStatusResponse, String> {
    let answer = FirmwareClient::new(channel.clone())
        .status(FirmwareStatusRequest {})
        .await
        .map_err(call_err("Firmware.Status"))?;
    Ok(answer.into_inner())
}

/// Streams a bundle file; the appliance verifies it before writing anything. The file is
/// checked for the bundle magic first so a wrong file fails here, not after an upload.
pub async fn update(channel: &Channel, path: &Path) -> Result<FirmwareUpdateResponse, String> {
    let data = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Err(e @ bundle::BundleError::NotABundle) = bundle::inspect(&data) {
        return Err(format!("{}: {e}", path.display()));
    }
    let chunks: Vec<FirmwareChunk> = data
        .chunks(CHUNK)
        .map(|c| FirmwareChunk { data: c.to_vec() })
        .collect();
    let answer = FirmwareClient::new(channel.clone())
        .update(tokio_stream::iter(chunks))
        .await
        .map_err(call_err("Firmware.Update"))?;
    Ok(answer.into_inner())
}

/// Reboots into the armed update (or the slot a rollback chose); returns that slot.
pub async fn activate(channel: &Channel) -> Result<String, String> {
    let answer = FirmwareClient::new(channel.clone())
        .activate(FirmwareActivateRequest {})
        .await
        .map_err(call_err("Firmware.Activate"))?;
    Ok(answer.into_inner().slot)
}

/// Rolls back; returns the slot the next boot runs. Without `force` the appliance refuses a
/// slot whose firmware cannot read and write its pool (the error says what it would do).
pub async fn rollback(channel: &Channel, force: bool) -> Result<String, String> {
    let answer = FirmwareClient::new(channel.clone())
        .rollback(FirmwareRollbackRequest { force })
        .await
        .map_err(call_err("Firmware.Rollback"))?;
    Ok(answer.into_inner().slot)
}

/// What `firmware status` prints.
pub fn render_status(s: &FirmwareStatusResponse) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "running    slot {} (version {}), {} boot",
        s.running, s.running_version, s.boot
    );
    let _ = writeln!(out, "primary    slot {}", s.primary);
    for slot in &s.slots {
        let version = if slot.version.is_empty() {
            "-"
        } else {
            &slot.version
        };
        let _ = writeln!(
            out,
            "slot {}     {:<11} version {:<24} boots {}",
            slot.name, slot.state, version, slot.boots
        );
    }
    let _ = writeln!(
        out,
        "next boot  UEFI: {}; BIOS: {}",
        s.uefi_loader, s.bios_loader
    );
    let rollback = if s.last_rollback.is_empty() {
        "none"
    } else {
        &s.last_rollback
    };
    let _ = writeln!(out, "last rollback  {rollback}");
    out
}

/// What `firmware update` prints.
pub fn render_updated(r: &FirmwareUpdateResponse) -> String {
    format!(
        "version {} written to slot {} and armed to boot once; `edgevol firmware activate` \
         reboots into it (it is kept only if its health check passes)\n",
        r.version, r.slot
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_proto::edgevol::v1::FirmwareSlot;

    #[test]
    fn status_names_both_slots_and_the_rollback_reason() {
        let s = FirmwareStatusResponse {
            running: "A".into(),
            running_version: "1.0".into(),
            primary: "A".into(),
            boot: "rolled back".into(),
            slots: vec![
                FirmwareSlot {
                    name: "A".into(),
                    state: "good".into(),
                    version: "1.0".into(),
                    boots: 3,
                },
                FirmwareSlot {
                    name: "B".into(),
                    state: "bad".into(),
                    version: "2.0".into(),
                    boots: 1,
                },
            ],
            last_rollback: "slot B (version 2.0): edgevold exited with status 3".into(),
            uefi_loader: "slot A".into(),
            bios_loader: "slot A".into(),
        };
        let text = render_status(&s);
        assert!(
            text.contains("running    slot A (version 1.0), rolled back boot"),
            "{text}"
        );
        assert!(text.contains("slot B     bad"), "{text}");
        assert!(text.contains("edgevold exited with status 3"), "{text}");
    }
}
