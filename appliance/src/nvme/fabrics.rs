//! Fabrics commands (Linux `fabrics-cmd.c`): Connect of admin and I/O queues, Property Get and
//! Property Set over the controller's registers.

use std::sync::Arc;

use edgevol_nvmeof::fabrics::Rejected;
use edgevol_nvmeof::fabrics_cmd::{
    connect_sqe_offset, ConnectCmd, ConnectData, ConnectError, PropertyGet, PropertySet,
    PropertySize,
};
use edgevol_nvmeof::queue::Queue;
use edgevol_nvmeof::status::StatusCode;

use super::controller::{cap, reg, CcEffect, Controller, Kind, VERSION};
use super::status::TargetStatus;
use super::subsys::{Subsystems, Target};

/// What a queue became after its Connect.
#[derive(Debug, Clone)]
pub enum Bound {
    /// The admin queue of a new controller.
    Admin(Arc<Controller>),
    /// I/O queue `qid` of a live controller.
    Io(Arc<Controller>, u16),
}

impl Bound {
    /// The controller.
    pub fn controller(&self) -> &Arc<Controller> {
        match self {
            Bound::Admin(c) | Bound::Io(c, _) => c,
        }
    }
}

fn sqsize_error() -> Rejected {
    ConnectError::sqe_field(connect_sqe_offset::SQSIZE).into()
}

/// Executes a Connect on `queue`: on success the queue is installed and the CQE result is the
/// controller id (Linux `nvmet_execute_admin_connect` / `nvmet_execute_io_connect`).
pub async fn connect(
    subs: &Subsystems,
    queue: &mut Queue,
    cmd: ConnectCmd,
    data: ConnectData,
) -> Result<(Bound, u64), Rejected> {
    let target = subs.resolve(&data.subsysnqn)?;
    if cmd.qid == 0 {
        let kind = match target {
            Target::Discovery => Kind::Discovery,
            Target::Volume(id) => Kind::Volume {
                id,
                readonly: subs.admit(id, data.hostnqn.clone()).await?,
            },
        };
        queue.install(0, cmd.sqsize).map_err(|_| sqsize_error())?;
        let ctrl = subs.create(&data.hostnqn, &data.subsysnqn, kind, cmd.kato_ms)?;
        tracing::info!(
            cntlid = ctrl.cntlid,
            host = %data.hostnqn,
            subsystem = %data.subsysnqn,
            "controller created"
        );
        let result = u64::from(ctrl.cntlid);
        return Ok((Bound::Admin(ctrl), result));
    }
    let ctrl = subs.find(data.cntlid, &data.hostnqn, &data.subsysnqn)?;
    let qid_error = || -> Rejected {
        let mut e = ConnectError::sqe_field(connect_sqe_offset::QID);
        e.status = StatusCode::ConnectInvalidParameters.status();
        e.into()
    };
    if matches!(ctrl.kind, Kind::Discovery) || cmd.qid > ctrl.regs().io_queues {
        return Err(qid_error());
    }
    if ctrl.regs().connected.contains(&cmd.qid) {
        return Err(StatusCode::CommandSequenceError.status().into());
    }
    queue
        .install(cmd.qid, cmd.sqsize)
        .map_err(|_| sqsize_error())?;
    ctrl.regs().connected.insert(cmd.qid);
    ctrl.touch();
    let result = u64::from(ctrl.cntlid);
    Ok((Bound::Io(ctrl, cmd.qid), result))
}

/// Property Get.
pub fn property_get(ctrl: &Controller, get: PropertyGet) -> Result<u64, TargetStatus> {
    let regs = ctrl.regs();
    match (get.size, get.offset) {
        (PropertySize::Eight, reg::CAP) => Ok(cap()),
        (PropertySize::Four, reg::VS) => Ok(u64::from(VERSION)),
        (PropertySize::Four, reg::CC) => Ok(u64::from(regs.cc)),
        (PropertySize::Four, reg::CSTS) => Ok(u64::from(regs.csts)),
        _ => Err(StatusCode::InvalidField.into()),
    }
}

/// Property Set: CC only. Returns what the write asks the target to do.
pub fn property_set(ctrl: &Controller, set: PropertySet) -> Result<CcEffect, TargetStatus> {
    match (set.size, set.offset) {
        (PropertySize::Four, reg::CC) => {
            let value = u32::try_from(set.value).map_err(|_| StatusCode::InvalidField)?;
            Ok(ctrl.regs().write_cc(value))
        }
        _ => Err(StatusCode::InvalidField.into()),
    }
}
