//! Fabrics commands (Linux `fabrics-cmd.c`): Connect of admin and I/O queues, Property Get and
//! Property Set over the controller's registers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use edgevol_nvmeof::auth::command::connect_result;
use edgevol_nvmeof::auth::target::DEFAULT_TRANSACTION_TIMEOUT;

use edgevol_nvmeof::fabrics::Rejected;
use edgevol_nvmeof::fabrics_cmd::{
    connect_sqe_offset, ConnectCmd, ConnectData, ConnectError, PropertyGet, PropertySet,
    PropertySize,
};
use edgevol_nvmeof::queue::Queue;
use edgevol_nvmeof::status::StatusCode;

use super::auth::{Admission, QueueAuth};
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

/// A queue after its Connect.
#[derive(Debug)]
pub struct Connected {
    /// What it is bound to.
    pub bound: Bound,
    /// The CQE result: the controller id, with ATR when the queue must authenticate.
    pub result: u64,
    /// The queue's authentication, when it must authenticate before anything else runs.
    pub auth: Option<Box<QueueAuth>>,
}

/// Executes a Connect on `queue` from `peer`: on success the queue is installed (Linux
/// `nvmet_execute_admin_connect` / `nvmet_execute_io_connect`). The host must be allowed on the
/// subsystem first (a volume's publications), then [`HostAuth::admit`] decides whether the
/// queue authenticates.
pub async fn connect(
    subs: &Subsystems,
    queue: &mut Queue,
    cmd: ConnectCmd,
    data: ConnectData,
    peer: Option<SocketAddr>,
) -> Result<Connected, Rejected> {
    let target = subs.resolve(&data.subsysnqn)?;
    if cmd.qid == 0 {
        let kind = match target {
            Target::Discovery => Kind::Discovery,
            Target::Volume(id) => Kind::Volume {
                id,
                readonly: subs.admit(id, data.hostnqn.clone()).await?,
            },
        };
        let kato = Duration::from_millis(u64::from(cmd.kato_ms));
        let timeout = transaction_timeout(Some(kato));
        let admission = subs
            .auth
            .admit(&data.hostnqn, &data.subsysnqn, peer, timeout)?;
        queue.install(0, cmd.sqsize).map_err(|_| sqsize_error())?;
        let ctrl = subs.create(&data.hostnqn, &data.subsysnqn, kind, cmd.kato_ms)?;
        tracing::info!(
            cntlid = ctrl.cntlid,
            host = %data.hostnqn,
            subsystem = %data.subsysnqn,
            ?peer,
            "controller created"
        );
        return Ok(connected(Bound::Admin(ctrl), admission));
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
    let admission = subs.auth.admit(
        &data.hostnqn,
        &data.subsysnqn,
        peer,
        transaction_timeout(ctrl.regs().kato),
    )?;
    queue
        .install(cmd.qid, cmd.sqsize)
        .map_err(|_| sqsize_error())?;
    ctrl.regs().connected.insert(cmd.qid);
    ctrl.touch();
    Ok(connected(Bound::Io(ctrl, cmd.qid), admission))
}

/// The shortest authentication transaction timeout, whatever the KATO.
pub const MIN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(30);

/// The authentication transaction timeout (also the time a queue has from its Connect to its
/// first authentication): the controller's keep-alive timeout, else 120 s, as Linux's target
/// has it, but at least [`MIN_TRANSACTION_TIMEOUT`]. Linux's host sends a 5 s KATO, and its
/// side of an ffdhe6144/8192 exchange takes longer than that on a slow CPU (a TCG guest), which
/// is work, not silence.
fn transaction_timeout(kato: Option<Duration>) -> Duration {
    kato.filter(|k| !k.is_zero())
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT)
        .max(MIN_TRANSACTION_TIMEOUT)
}

fn connected(bound: Bound, admission: Admission) -> Connected {
    let cntlid = bound.controller().cntlid;
    let auth = match admission {
        Admission::Open => None,
        Admission::Authenticate(a) => Some(a),
    };
    Connected {
        result: connect_result(cntlid, auth.is_some()),
        bound,
        auth,
    }
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
