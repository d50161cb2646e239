//! The `publish_context` of ControllerPublishVolume: what the appliance tells the node plugin
//! about where a volume is served. The appliance writes these keys, the node plugin reads them.

/// Always `tcp`.
pub const TRANSPORT: &str = "transport";
/// The value of [`TRANSPORT`].
pub const TRANSPORT_TCP: &str = "tcp";
/// The target's address hosts connect to.
pub const ADDRESS: &str = "targetAddress";
/// The target's TCP port.
pub const PORT: &str = "targetPort";
/// The volume's subsystem NQN.
pub const SUBSYSTEM_NQN: &str = "subsystemNqn";
/// Namespace NGUID, 32 lower-case hex digits.
pub const NGUID: &str = "nguid";
/// Namespace UUID, 8-4-4-4-12.
pub const UUID: &str = "uuid";
/// `true` when the host may only read.
pub const READONLY: &str = "readonly";
