//! Admin command execution (Linux `admin-cmd.c`, and `discovery.c` for the discovery
//! controller): Identify, Get Log Page, Set/Get Features and Keep Alive. Async Event Requests
//! are parked by the admin queue (they complete when an event happens), not here.

use std::sync::atomic::Ordering;

use edgevol_core::VolumeId;
use edgevol_nvmeof::admin::{AdminCommand, Identify};
use edgevol_nvmeof::status::StatusCode;

use super::controller::{fid, Controller, Kind, AEN_NS_ATTR, DISCOVERY_KATO, MAX_IO_QUEUES};
use super::identify::{self, ControllerInfo, NamespaceInfo};
use super::status::{from_core, TargetStatus};
use super::subsys::{Subsystems, NSID};
use super::{discovery, log_page, MDTS};
use crate::naming;

/// Data and CQE result of an admin command.
#[derive(Debug, Default)]
pub struct Reply {
    /// CQE dword 0/1.
    pub result: u64,
    /// Controller-to-host data.
    pub data: Vec<u8>,
}

fn reply(result: u64) -> Result<Reply, TargetStatus> {
    Ok(Reply {
        result,
        data: Vec::new(),
    })
}

fn invalid_field() -> TargetStatus {
    StatusCode::InvalidField.into()
}

/// Executes an admin command other than Async Event Request.
pub async fn execute(
    subs: &Subsystems,
    ctrl: &Controller,
    cmd: AdminCommand,
) -> Result<Reply, TargetStatus> {
    match cmd {
        AdminCommand::KeepAlive => reply(0),
        AdminCommand::Identify(id) => identify(subs, ctrl, id).await,
        AdminCommand::SetFeatures { fid, save, cdw11 } => set_features(ctrl, fid, save, cdw11),
        AdminCommand::GetFeatures { fid, sel } => get_features(ctrl, fid, sel),
        AdminCommand::GetLogPage {
            lid,
            offset,
            len,
            rae,
            ..
        } => {
            let page = log(subs, ctrl, lid, rae).await?;
            Ok(Reply {
                result: 0,
                data: log_page::window(&page, offset, len),
            })
        }
        // Parked by the admin queue before it gets here.
        AdminCommand::AsyncEventRequest => Err(StatusCode::InternalError.into()),
    }
}

/// What Identify Namespace and the descriptors say about `volume`, read from the pool.
pub async fn namespace_info(
    subs: &Subsystems,
    volume: VolumeId,
    readonly: bool,
) -> Result<NamespaceInfo, TargetStatus> {
    subs.state
        .with_pool(move |_, pool| {
            let cs = u64::from(pool.cluster_size());
            let lba_shift = lba_shift(pool.device_mut());
            let uuid = pool.uuid();
            let v = pool.volume(volume).map_err(|e| from_core(&e))?;
            Ok(NamespaceInfo {
                size: v.size(),
                used: v.mapped_clusters().saturating_mul(cs),
                lba_shift,
                nguid: naming::nguid(uuid, volume),
                uuid: naming::namespace_uuid(uuid, volume),
                readonly,
            })
        })
        .await
}

/// log2 of the namespace's logical block: the device's block (4 KiB on files).
pub fn lba_shift(dev: &impl edgevol_core::BlockDevice) -> u8 {
    u8::try_from(dev.block_size().max(512).trailing_zeros()).unwrap_or(9)
}

fn serial(subs: &Subsystems, ctrl: &Controller) -> String {
    match ctrl.volume() {
        Some(v) => format!("ev{:x}", v.0),
        None => subs.state.appliance_id.chars().take(20).collect(),
    }
}

async fn identify(
    subs: &Subsystems,
    ctrl: &Controller,
    id: Identify,
) -> Result<Reply, TargetStatus> {
    let (volume, readonly) = match ctrl.kind {
        Kind::Volume { id, readonly } => (Some(id), readonly),
        Kind::Discovery => (None, false),
    };
    let data = match (id, volume) {
        (Identify::Controller, _) => identify::controller(&ControllerInfo {
            cntlid: ctrl.cntlid,
            kind: &ctrl.kind,
            subnqn: &ctrl.subnqn,
            serial: &serial(subs, ctrl),
            mdts: MDTS,
            io_in_capsule: super::IO_IN_CAPSULE,
        }),
        (_, None) => return Err(invalid_field()),
        (Identify::ActiveNamespaces { after }, Some(_)) => identify::active_namespaces(after),
        (Identify::Namespace { nsid }, Some(v)) if nsid == NSID => {
            identify::namespace(&namespace_info(subs, v, readonly).await?)
        }
        (Identify::NamespaceDescriptors { nsid }, Some(v)) if nsid == NSID => {
            identify::descriptors(&namespace_info(subs, v, readonly).await?)
        }
        // No limits of our own beyond MDTS and the spec's 256 ranges, and no extended LBA
        // formats: both structures are all zero, as nvmet serves them.
        (Identify::NvmController, Some(_)) => vec![0u8; identify::LEN],
        (Identify::NvmNamespace { nsid }, Some(_)) if nsid == NSID => {
            vec![0u8; identify::LEN]
        }
        _ => return Err(StatusCode::InvalidNamespace.into()),
    };
    Ok(Reply { result: 0, data })
}

fn set_features(ctrl: &Controller, id: u8, save: bool, cdw11: u32) -> Result<Reply, TargetStatus> {
    if save {
        return Err(TargetStatus::FeatureNotSaveable);
    }
    let discovery = matches!(ctrl.kind, Kind::Discovery);
    let mut regs = ctrl.regs();
    match id {
        fid::NUM_QUEUES if !discovery => {
            let (nsqr, ncqr) = (cdw11 & 0xffff, cdw11 >> 16);
            if nsqr == 0xffff || ncqr == 0xffff {
                return Err(invalid_field());
            }
            let want = u16::try_from(nsqr.min(ncqr) + 1).unwrap_or(MAX_IO_QUEUES);
            let granted = want.min(MAX_IO_QUEUES);
            regs.io_queues = granted;
            let g = u64::from(granted - 1);
            reply(g | (g << 16))
        }
        fid::ASYNC_EVENT => {
            regs.aec = if discovery { 0 } else { cdw11 & AEN_NS_ATTR };
            reply(0)
        }
        fid::KATO => {
            regs.kato = match (cdw11, discovery) {
                (0, true) => Some(DISCOVERY_KATO),
                (0, false) => None,
                (ms, _) => Some(std::time::Duration::from_secs(u64::from(ms).div_ceil(1000))),
            };
            reply(0)
        }
        fid::VOLATILE_WC if !discovery => {
            regs.wce = cdw11 & 1 != 0;
            reply(0)
        }
        _ => Err(invalid_field()),
    }
}

fn get_features(ctrl: &Controller, id: u8, sel: u8) -> Result<Reply, TargetStatus> {
    let discovery = matches!(ctrl.kind, Kind::Discovery);
    let regs = ctrl.regs();
    let known = matches!(id, fid::ASYNC_EVENT | fid::KATO)
        || (!discovery && matches!(id, fid::NUM_QUEUES | fid::VOLATILE_WC));
    if !known {
        return Err(invalid_field());
    }
    if sel == 3 {
        // Supported capabilities: changeable, not saveable.
        return reply(1 << 2);
    }
    let default = sel == 1;
    let value: u32 = match id {
        fid::NUM_QUEUES => {
            let n = u32::from(
                if default {
                    MAX_IO_QUEUES
                } else {
                    regs.io_queues
                } - 1,
            );
            n | (n << 16)
        }
        fid::ASYNC_EVENT => {
            if default {
                0
            } else {
                regs.aec
            }
        }
        fid::KATO => {
            let kato = if default { None } else { regs.kato };
            kato.map_or(0, |k| u32::try_from(k.as_millis()).unwrap_or(u32::MAX))
        }
        _ => u32::from(default || regs.wce),
    };
    reply(u64::from(value))
}

async fn log(
    subs: &Subsystems,
    ctrl: &Controller,
    lid: u8,
    rae: bool,
) -> Result<Vec<u8>, TargetStatus> {
    match (lid, &ctrl.kind) {
        (discovery::LID, Kind::Discovery) => discovery_log(subs, &ctrl.host).await,
        (log_page::ERROR, _) => Ok(ctrl.errors().page()),
        (log_page::SMART, Kind::Volume { id, .. }) => smart(subs, ctrl, *id).await,
        (log_page::CHANGED_NS, Kind::Volume { .. }) => Ok(ctrl.regs().take_changed(rae)),
        _ => Err(invalid_field()),
    }
}

/// The discovery log of `host`: the subsystems of the volumes published to it.
pub async fn discovery_log(subs: &Subsystems, host: &str) -> Result<Vec<u8>, TargetStatus> {
    let host = host.to_owned();
    let volumes: Vec<VolumeId> = subs
        .state
        .on_pool(move |_, pool| {
            pool.volumes(None)
                .filter(|v| v.publications().iter().any(|p| p.host == host))
                .map(|v| v.id())
                .collect()
        })
        .await?;
    let nqns = discovery::subsystems(&subs.state.appliance_id, &volumes);
    let genctr = discovery::generation(subs.changes(), &nqns);
    Ok(discovery::log_page(subs.endpoint, genctr, &nqns))
}

async fn smart(
    subs: &Subsystems,
    ctrl: &Controller,
    volume: VolumeId,
) -> Result<Vec<u8>, TargetStatus> {
    let capacity = subs.state.on_pool(|_, pool| pool.capacity()).await?;
    let c = subs.stats.volume(volume);
    Ok(log_page::smart(
        &capacity,
        &log_page::Traffic {
            bytes_read: c.read.bytes.load(Ordering::Relaxed),
            bytes_written: c.write.bytes.load(Ordering::Relaxed),
            reads: c.read.ops.load(Ordering::Relaxed),
            writes: c.write.ops.load(Ordering::Relaxed),
        },
        ctrl.errors().count(),
    ))
}
