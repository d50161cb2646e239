//! `edgevol.v1.Firmware`: status, update, activate, rollback. Admin only (the auth layer lets no
//! other role reach an `edgevol.v1` service it does not list). Thin handlers: the manager does
//! the work off the reactor; every refusal becomes a status in [`status`], the one mapping.

use std::time::Duration;

use edgevol_firmware::boot_dir::LoaderView;
use edgevol_firmware::manager::{FirmwareError, FirmwareStatus};
use edgevol_firmware::slots::{BootEnv, BootOutcome, SlotError, Status as SlotStatus};
use edgevol_proto::edgevol::v1 as pb;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};

use super::{Reboot, Shared};

/// Largest bundle accepted: more than a boot partition slot can hold, so anything bigger is
/// refused while it streams, before it fills memory.
pub const MAX_BUNDLE: usize = 64 << 20;
/// Time between answering Activate and rebooting, so the answer reaches the client.
const REBOOT_DELAY: Duration = Duration::from_millis(500);

/// The one mapping from a firmware error to what a client is told. Exhaustive.
pub fn status(e: &FirmwareError) -> Status {
    match e {
        FirmwareError::Bundle(_) => Status::invalid_argument(e.to_string()),
        FirmwareError::Slot(slot) => match slot {
            SlotError::TrialInProgress
            | SlotError::WrongState { .. }
            | SlotError::NothingToRollBackTo => Status::failed_precondition(e.to_string()),
            SlotError::BadVersion => Status::invalid_argument(e.to_string()),
            SlotError::BootedUnusable { .. } => Status::internal(e.to_string()),
        },
        // Disk full or an I/O error on the boot partition: may succeed later; the state saved
        // before the failure is consistent (a half-written slot stays "writing", never booted).
        // The pool still opening: retry shortly.
        FirmwareError::Store(_) | FirmwareError::Boot(_) | FirmwareError::PoolNotOpen => {
            Status::unavailable(e.to_string())
        }
        // The firmware asked for cannot use this box's pool: the operator decides (another
        // bundle, or a forced rollback whose consequence the message spells out).
        FirmwareError::UpdateCannotReadPool { .. }
        | FirmwareError::RollbackCannotReadPool { .. }
        | FirmwareError::StoreTooNew(_) => Status::failed_precondition(e.to_string()),
    }
}

/// The service.
#[derive(Debug, Clone)]
pub struct FirmwareService {
    firmware: Shared,
    reboot: Reboot,
}

impl FirmwareService {
    /// Serves `firmware`; Activate reboots with `reboot`.
    pub fn new(firmware: Shared, reboot: Reboot) -> Self {
        FirmwareService { firmware, reboot }
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(
                &mut edgevol_firmware::manager::Firmware<edgevol_firmware::dir_media::DirMedia>,
            ) -> Result<T, FirmwareError>
            + Send
            + 'static,
    ) -> Result<T, Status> {
        let firmware = self.firmware.clone();
        match tokio::task::spawn_blocking(move || {
            let mut guard = firmware
                .lock()
                .map_err(|_| Status::internal("firmware manager poisoned by an earlier panic"))?;
            f(&mut guard).map_err(|e| status(&e))
        })
        .await
        {
            Ok(result) => result,
            Err(join) => Err(Status::internal(format!("firmware task: {join}"))),
        }
    }
}

fn env_text(env: &Result<BootEnv, String>) -> String {
    match env {
        Ok(BootEnv {
            primary,
            trial: Some(trial),
        }) => format!("slot {trial} once, then slot {primary}"),
        Ok(BootEnv {
            primary,
            trial: None,
        }) => format!("slot {primary}"),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// Encodes a status for the wire.
pub fn encode_status(s: &FirmwareStatus, running_version: &str) -> pb::FirmwareStatusResponse {
    let LoaderView { grub, syslinux } = &s.loaders;
    pb::FirmwareStatusResponse {
        running: s.running.to_string(),
        running_version: running_version.to_owned(),
        primary: s.slots.primary.to_string(),
        boot: match &s.boot {
            BootOutcome::Normal => "normal".into(),
            BootOutcome::Trial => "trial".into(),
            BootOutcome::RolledBack(_) => "rolled back".into(),
        },
        slots: [
            edgevol_firmware::slots::SlotId::A,
            edgevol_firmware::slots::SlotId::B,
        ]
        .into_iter()
        .map(|id| {
            let slot = s.slots.slot(id);
            // An update holds the manager for its whole write, so a status never sees one in
            // progress: a slot still "writing" is one whose write a power cut or crash ended.
            let state = match slot.status {
                SlotStatus::Writing => "interrupted".to_owned(),
                other => other.to_string(),
            };
            pb::FirmwareSlot {
                name: id.to_string(),
                state,
                version: slot.version.clone(),
                boots: slot.boots,
            }
        })
        .collect(),
        last_rollback: s
            .slots
            .last_rollback
            .as_ref()
            .map(|rb| format!("slot {} (version {}): {}", rb.slot, rb.version, rb.reason))
            .unwrap_or_default(),
        uefi_loader: env_text(grub),
        bios_loader: env_text(syslinux),
    }
}

#[tonic::async_trait]
impl pb::firmware_server::Firmware for FirmwareService {
    async fn status(
        &self,
        _request: Request<pb::FirmwareStatusRequest>,
    ) -> Result<Response<pb::FirmwareStatusResponse>, Status> {
        let (status, version) = self
            .with(|f| Ok((f.status(), f.running_version().to_owned())))
            .await?;
        Ok(Response::new(encode_status(&status, &version)))
    }

    async fn update(
        &self,
        request: Request<Streaming<pb::FirmwareChunk>>,
    ) -> Result<Response<pb::FirmwareUpdateResponse>, Status> {
        let mut stream = request.into_inner();
        let mut bundle = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if bundle.len() + chunk.data.len() > MAX_BUNDLE {
                return Err(Status::invalid_argument(format!(
                    "bundle larger than {MAX_BUNDLE} bytes: refused, nothing written"
                )));
            }
            bundle.extend_from_slice(&chunk.data);
        }
        tracing::info!(
            bytes = bundle.len(),
            "firmware: bundle received, verifying it and writing the inactive slot"
        );
        let (slot, manifest) = self
            .with(move |f| {
                if f.pool_in_use().is_none() {
                    return Err(FirmwareError::PoolNotOpen);
                }
                let manifest = f.update(&bundle)?;
                Ok((f.status().slots.trial(), manifest))
            })
            .await?;
        tracing::info!(version = %manifest.version, "firmware: update written and armed");
        Ok(Response::new(pb::FirmwareUpdateResponse {
            slot: slot.map(|s| s.to_string()).unwrap_or_default(),
            version: manifest.version,
        }))
    }

    async fn activate(
        &self,
        _request: Request<pb::FirmwareActivateRequest>,
    ) -> Result<Response<pb::FirmwareActivateResponse>, Status> {
        let next = self
            .with(|f| {
                Ok(f.reboot_changes_slot().then(|| {
                    let env = f.status().slots.boot_env();
                    env.trial.unwrap_or(env.primary)
                }))
            })
            .await?;
        let Some(slot) = next else {
            return Err(Status::failed_precondition(
                "nothing to activate: a reboot would run the same slot (update or roll back first)",
            ));
        };
        let reboot = self.reboot.clone();
        tokio::spawn(async move {
            tokio::time::sleep(REBOOT_DELAY).await;
            let _ = tokio::task::spawn_blocking(move || reboot.now()).await;
        });
        Ok(Response::new(pb::FirmwareActivateResponse {
            slot: slot.to_string(),
        }))
    }

    async fn rollback(
        &self,
        request: Request<pb::FirmwareRollbackRequest>,
    ) -> Result<Response<pb::FirmwareRollbackResponse>, Status> {
        let force = request.into_inner().force;
        let (slot, reads) = self
            .with(move |f| {
                if f.pool_in_use().is_none() {
                    return Err(FirmwareError::PoolNotOpen);
                }
                let slot = f.rollback(force)?;
                Ok((slot, f.slot_reads_pool(slot)))
            })
            .await?;
        tracing::warn!(next = %slot, force, "firmware: rollback requested");
        if reads.is_some_and(|r| r != edgevol_firmware::pool_format::Readability::ReadWrite) {
            tracing::warn!(next = %slot, "firmware: forced rollback to a slot that cannot use the pool: it will not serve it");
        }
        Ok(Response::new(pb::FirmwareRollbackResponse {
            slot: slot.to_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgevol_firmware::bundle::BundleError;
    use edgevol_firmware::pool_format::{Readability, Unreadable};
    use edgevol_firmware::slots::{SlotId, Slots};
    use tonic::Code;

    #[test]
    fn every_error_maps_to_a_status() {
        let cases = [
            (
                FirmwareError::Bundle(BundleError::BadSignature),
                Code::InvalidArgument,
            ),
            (
                FirmwareError::Slot(SlotError::TrialInProgress),
                Code::FailedPrecondition,
            ),
            (
                FirmwareError::Slot(SlotError::NothingToRollBackTo),
                Code::FailedPrecondition,
            ),
            (
                FirmwareError::Slot(SlotError::WrongState {
                    slot: SlotId::A,
                    status: SlotStatus::Bad,
                    action: "confirm",
                }),
                Code::FailedPrecondition,
            ),
            (
                FirmwareError::Slot(SlotError::BadVersion),
                Code::InvalidArgument,
            ),
            (
                FirmwareError::Slot(SlotError::BootedUnusable {
                    slot: SlotId::B,
                    status: SlotStatus::Empty,
                }),
                Code::Internal,
            ),
            (FirmwareError::Store("disk full".into()), Code::Unavailable),
            (FirmwareError::PoolNotOpen, Code::Unavailable),
            (
                FirmwareError::UpdateCannotReadPool {
                    version: "0.9".into(),
                    readability: Readability::No(Unreadable::VersionTooNew { pool: 4, newest: 3 }),
                },
                Code::FailedPrecondition,
            ),
            (
                FirmwareError::RollbackCannotReadPool {
                    slot: SlotId::A,
                    version: "1.0".into(),
                    readability: Readability::ReadOnly { bit: 2 },
                },
                Code::FailedPrecondition,
            ),
        ];
        for (e, code) in cases {
            let s = status(&e);
            assert_eq!(s.code(), code, "{e}");
            assert_eq!(s.message(), e.to_string());
        }
    }

    #[test]
    fn a_slot_left_writing_reads_as_interrupted() {
        // A power cut during an update: the record says slot B was being written.
        let mut slots = Slots::factory("1.0").unwrap();
        assert_eq!(slots.begin_write(SlotId::A).unwrap(), SlotId::B);
        assert_eq!(slots.reconcile(SlotId::A).unwrap(), BootOutcome::Normal);
        let status = FirmwareStatus {
            running: SlotId::A,
            boot: BootOutcome::Normal,
            slots,
            loaders: LoaderView {
                grub: Ok(BootEnv {
                    primary: SlotId::A,
                    trial: None,
                }),
                syslinux: Ok(BootEnv {
                    primary: SlotId::A,
                    trial: None,
                }),
            },
        };
        let wire = encode_status(&status, "1.0");
        let states: Vec<_> = wire.slots.iter().map(|s| s.state.as_str()).collect();
        assert_eq!(states, ["good", "interrupted"]);
        assert_eq!((wire.boot.as_str(), wire.primary.as_str()), ("normal", "A"));
    }

    #[test]
    fn loader_views_read_as_text() {
        assert_eq!(
            env_text(&Ok(BootEnv {
                primary: SlotId::A,
                trial: Some(SlotId::B)
            })),
            "slot B once, then slot A"
        );
        assert_eq!(
            env_text(&Ok(BootEnv {
                primary: SlotId::B,
                trial: None
            })),
            "slot B"
        );
        assert_eq!(env_text(&Err("gone".into())), "unreadable: gone");
    }
}
