//! Command routing by queue state, as Linux `nvmet_req_init` does it: a queue without a
//! controller accepts only Connect; qid 0 takes admin and Fabrics admin commands (Property
//! Get/Set, Disconnect); other queues take I/O commands. Both kinds of connected queue take
//! AUTH_Send/AUTH_Receive (in-band authentication, [`crate::auth`]). Each parser checks fields and data
//! lengths and returns the command to execute, or the status (and CQE result) to complete with.

use crate::admin::{parse_admin, AdminCommand};
use crate::auth::AuthCommand;
use crate::fabrics_cmd::{
    connect_data_offset, fctype, ConnectCmd, ConnectData, ConnectError, PropertyGet, PropertySet,
    CNTLID_DYNAMIC,
};
use crate::io_cmd::{parse_io, IoCommand};
use crate::sqe::Sqe;
use crate::status::{Status, StatusCode};

/// The namespace an I/O queue serves (one per subsystem in edgevol).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Its namespace id.
    pub nsid: u32,
    /// log2 of its logical block size.
    pub lba_shift: u8,
}

/// What the parser needs to know about the queue a command arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueState {
    /// No Connect has succeeded yet.
    Unconnected,
    /// The admin queue of a controller.
    Admin,
    /// An I/O queue; `namespace` is `None` on a controller without one (discovery).
    Io {
        /// The namespace served.
        namespace: Option<NamespaceInfo>,
    },
}

/// A command ready to execute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Fabrics Connect.
    Connect {
        /// SQE fields.
        cmd: ConnectCmd,
        /// Connect data.
        data: ConnectData,
    },
    /// Fabrics Property Get.
    PropertyGet(PropertyGet),
    /// Fabrics Property Set.
    PropertySet(PropertySet),
    /// Fabrics Disconnect (of this I/O queue).
    Disconnect,
    /// Fabrics Authentication Send or Receive (SECP E9h, DH-HMAC-CHAP).
    Auth(AuthCommand),
    /// An admin command.
    Admin(AdminCommand),
    /// An I/O command.
    Io(IoCommand),
}

/// A command refused at parse time: complete it with this status and CQE result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Completion status.
    pub status: Status,
    /// CQE result (Connect: IATTR/IPO of the invalid parameter).
    pub result: u64,
}

impl From<Status> for Rejected {
    fn from(status: Status) -> Self {
        Rejected { status, result: 0 }
    }
}

impl From<ConnectError> for Rejected {
    fn from(e: ConnectError) -> Self {
        Rejected {
            status: e.status,
            result: u64::from(e.result),
        }
    }
}

fn invalid_opcode() -> Rejected {
    StatusCode::InvalidOpcode.status().into()
}

fn parse_connect(sqe: &Sqe, data: &[u8]) -> Result<Command, Rejected> {
    let cmd = ConnectCmd::parse(sqe)?;
    if sqe.data_pointer().length() != 1024 {
        return Err(StatusCode::DataSglLengthInvalid.status().into());
    }
    let data = ConnectData::parse(data)?;
    // Dynamic controller model: the admin queue asks for a new controller (0xffff), I/O queues
    // name the one they join.
    if (cmd.qid == 0) != (data.cntlid == CNTLID_DYNAMIC) {
        return Err(ConnectError::data_field(connect_data_offset::CNTLID).into());
    }
    Ok(Command::Connect { cmd, data })
}

fn expect_no_data(sqe: &Sqe) -> Result<(), Rejected> {
    if sqe.data_pointer().length() == 0 {
        Ok(())
    } else {
        Err(StatusCode::DataSglLengthInvalid.status().into())
    }
}

fn parse_auth(sqe: &Sqe) -> Result<Command, Rejected> {
    Ok(Command::Auth(AuthCommand::parse(sqe)?))
}

/// Parses `sqe` (with its host-to-controller `data`) for a queue in `state`.
pub fn parse(sqe: &Sqe, data: &[u8], state: &QueueState) -> Result<Command, Rejected> {
    match state {
        QueueState::Unconnected => {
            if sqe.is_fabrics() && sqe.fctype() == fctype::CONNECT {
                parse_connect(sqe, data)
            } else {
                Err(invalid_opcode())
            }
        }
        QueueState::Admin if sqe.is_fabrics() => match sqe.fctype() {
            fctype::PROPERTY_GET => {
                expect_no_data(sqe)?;
                Ok(Command::PropertyGet(PropertyGet::parse(sqe)?))
            }
            fctype::PROPERTY_SET => {
                expect_no_data(sqe)?;
                Ok(Command::PropertySet(PropertySet::parse(sqe)?))
            }
            fctype::AUTH_SEND | fctype::AUTH_RECEIVE => parse_auth(sqe),
            _ => Err(invalid_opcode()),
        },
        QueueState::Admin => Ok(Command::Admin(parse_admin(sqe)?)),
        QueueState::Io { .. } if sqe.is_fabrics() => match sqe.fctype() {
            fctype::DISCONNECT => {
                expect_no_data(sqe)?;
                Ok(Command::Disconnect)
            }
            fctype::AUTH_SEND | fctype::AUTH_RECEIVE => parse_auth(sqe),
            _ => Err(invalid_opcode()),
        },
        QueueState::Io { namespace } => {
            let Some(ns) = namespace else {
                return Err(invalid_opcode());
            };
            let io = parse_io(sqe, ns.lba_shift)?;
            let nsid = match io {
                IoCommand::Read { nsid, .. }
                | IoCommand::Write { nsid, .. }
                | IoCommand::WriteZeroes { nsid, .. }
                | IoCommand::DatasetManagement { nsid, .. } => nsid,
                IoCommand::Flush { nsid: 0xffff_ffff } => ns.nsid,
                IoCommand::Flush { nsid } => nsid,
            };
            if nsid != ns.nsid {
                return Err(StatusCode::InvalidNamespace.status().into());
            }
            Ok(Command::Io(io))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::opcode as admin_op;
    use crate::fabrics_cmd::PropertySize;
    use crate::io_cmd::opcode as io_op;

    fn connect(qid: u16, cntlid: u16) -> (Sqe, Vec<u8>) {
        let sqe = ConnectCmd {
            qid,
            sqsize: 31,
            cattr: 0,
            kato_ms: 5000,
        }
        .to_sqe(1);
        let data = ConnectData {
            hostid: [2; 16],
            cntlid,
            subsysnqn: "nqn.2026-01.io.edgevol:v1".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:h".into(),
        }
        .to_bytes();
        (sqe, data)
    }

    const IO: QueueState = QueueState::Io {
        namespace: Some(NamespaceInfo {
            nsid: 1,
            lba_shift: 9,
        }),
    };

    #[test]
    fn unconnected_queues_take_connect_only() {
        let (sqe, data) = connect(0, CNTLID_DYNAMIC);
        assert!(matches!(
            parse(&sqe, &data, &QueueState::Unconnected),
            Ok(Command::Connect { cmd, .. }) if cmd.qid == 0 && cmd.kato_ms == 5000
        ));
        let get = PropertyGet {
            size: PropertySize::Eight,
            offset: 0,
        }
        .to_sqe(2);
        assert_eq!(
            parse(&get, &[], &QueueState::Unconnected),
            Err(invalid_opcode())
        );
        let mut identify = Sqe::default();
        identify.set_opcode(admin_op::IDENTIFY);
        assert_eq!(
            parse(&identify, &[], &QueueState::Unconnected),
            Err(invalid_opcode())
        );
        // An admin Connect must ask for a dynamic controller; an I/O Connect must name one.
        let (sqe, data) = connect(0, 3);
        let e = parse(&sqe, &data, &QueueState::Unconnected).unwrap_err();
        assert_eq!(e.status, StatusCode::ConnectInvalidParameters.status());
        assert_eq!(e.result, (1 << 16) | 16);
        let (sqe, data) = connect(2, CNTLID_DYNAMIC);
        assert!(parse(&sqe, &data, &QueueState::Unconnected).is_err());
        let (sqe, data) = connect(2, 3);
        assert!(parse(&sqe, &data, &QueueState::Unconnected).is_ok());
    }

    #[test]
    fn admin_queue_routes_fabrics_and_admin() {
        let set = PropertySet {
            size: PropertySize::Four,
            offset: 0x14,
            value: 1,
        };
        assert_eq!(
            parse(&set.to_sqe(1), &[], &QueueState::Admin),
            Ok(Command::PropertySet(set))
        );
        let (sqe, data) = connect(0, CNTLID_DYNAMIC);
        assert_eq!(
            parse(&sqe, &data, &QueueState::Admin),
            Err(invalid_opcode())
        );
        let mut ka = Sqe::default();
        ka.set_opcode(admin_op::KEEP_ALIVE);
        assert_eq!(
            parse(&ka, &[], &QueueState::Admin),
            Ok(Command::Admin(AdminCommand::KeepAlive))
        );
        // A read opcode on the admin queue is Get Log Page's neighbour, not a read.
        let mut read = Sqe::default();
        read.set_opcode(0x04);
        assert_eq!(parse(&read, &[], &QueueState::Admin), Err(invalid_opcode()));
    }

    #[test]
    fn io_queues_check_the_namespace() {
        let mut w = Sqe::default();
        w.set_opcode(io_op::WRITE)
            .set_nsid(1)
            .set_cdw(12, 0)
            .set_transport_data(512);
        assert!(matches!(
            parse(&w, &[], &IO),
            Ok(Command::Io(IoCommand::Write { .. }))
        ));
        w.set_nsid(2);
        assert_eq!(
            parse(&w, &[], &IO),
            Err(StatusCode::InvalidNamespace.status().into())
        );
        let mut flush = Sqe::default();
        flush
            .set_opcode(io_op::FLUSH)
            .set_nsid(0xffff_ffff)
            .set_transport_data(0);
        assert!(parse(&flush, &[], &IO).is_ok());
        assert_eq!(
            parse(&flush, &[], &QueueState::Io { namespace: None }),
            Err(invalid_opcode())
        );
        let mut disconnect = Sqe::default();
        disconnect
            .set_opcode(crate::sqe::FABRICS_OPCODE)
            .set_fctype(fctype::DISCONNECT)
            .set_transport_data(0);
        assert_eq!(parse(&disconnect, &[], &IO), Ok(Command::Disconnect));
    }

    #[test]
    fn connected_queues_take_auth_commands() {
        let send = AuthCommand::Send { tl: 40 }.to_sqe(3);
        let receive = AuthCommand::Receive { al: 4096 }.to_sqe(4);
        for state in [QueueState::Admin, IO, QueueState::Io { namespace: None }] {
            assert_eq!(
                parse(&send, &[0; 40], &state),
                Ok(Command::Auth(AuthCommand::Send { tl: 40 }))
            );
            assert_eq!(
                parse(&receive, &[], &state),
                Ok(Command::Auth(AuthCommand::Receive { al: 4096 }))
            );
        }
        assert_eq!(
            parse(&send, &[0; 40], &QueueState::Unconnected),
            Err(invalid_opcode())
        );
        let mut wrong_protocol = send;
        wrong_protocol.0[43] = 0;
        assert_eq!(
            parse(&wrong_protocol, &[0; 40], &QueueState::Admin),
            Err(StatusCode::InvalidField.status().into())
        );
    }
}
