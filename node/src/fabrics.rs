//! NVMe over Fabrics connect and disconnect through the kernel's own interfaces.
//!
//! **Why write `/dev/nvme-fabrics` ourselves rather than call nvme-cli.** The kernel interface
//! is one write of a `key=value,...` option string to `/dev/nvme-fabrics` (answered with
//! `instance=N,cntlid=M` on the same descriptor) and one write of `1` to
//! `/sys/class/nvme/nvmeN/delete_controller`. That is all `nvme connect`/`nvme disconnect` do
//! underneath. Doing it directly:
//! * drops a runtime dependency whose flags and defaults changed across versions (libnvme
//!   rewrite, `/etc/nvme/config.json`, hostid handling) and that is not on minimal hosts;
//! * gives us the kernel's errno instead of parsed text (`EALREADY` for a duplicate connect,
//!   `EIO` when the target answers the Fabrics Connect with an error status: no such subsystem,
//!   or our host NQN not admitted; `ECONNREFUSED` when nothing listens);
//! * keeps every option explicit in one place, [`connect_options`], unit-tested.
//!
//! **Find before attach.** [`find_controller`] asks sysfs for a usable controller to the same
//! subsystem NQN, transport address/service and host NQN, and [`ensure_connected`] connects only
//! when there is none, so a retried NodeStageVolume reuses the live (or reconnecting)
//! controller; the kernel would refuse a duplicate anyway.

use std::net::IpAddr;

use crate::error::{Error, Result};
use crate::host::Host;
use crate::keys::DhchapKeys;
use crate::sysfs::{self, Controller, FailFast};

/// Tunables of the connection (flags of the binary), as the kernel's fabrics options
/// (drivers/nvme/host/fabrics.c, Linux 6.1) take them. What happens when the appliance goes away:
///
/// 1. The host notices: at once when the connection is closed or reset (the appliance's daemon
///    stops, ControllerUnpublishVolume closes this host's connections), or when a Keep Alive
///    gets no answer within `keep_alive_tmo` (the appliance lost power or the link is down):
///    within about twice `keep_alive_tmo`.
/// 2. The controller turns `connecting`: I/O is queued, not failed, and the kernel tries to
///    reconnect every `reconnect_delay` seconds.
/// 3. `fast_io_fail_tmo` seconds after step 2 the kernel fails the queued I/O and any new I/O
///    with an error, while it keeps reconnecting: an appliance that comes back later serves new
///    I/O again.
/// 4. After `ctrl_loss_tmo` worth of attempts (`ctrl_loss_tmo / reconnect_delay` attempts; an
///    attempt at a silent address also waits for its TCP SYN to time out, about 3 s, so the
///    wall time is longer) the kernel deletes the controller and its namespace.
///
/// An appliance reboot or firmware update must end inside step 2, never reach step 3: the
/// workload only sees a pause. See the README's "Failure behaviour".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricsConfig {
    /// Seconds after the loss of the connection before the kernel fails queued I/O; -1 = never
    /// (I/O waits until `ctrl_loss_tmo`).
    pub fast_io_fail_tmo: i32,
    /// Seconds the kernel keeps reconnecting a lost controller before deleting it; -1 = forever.
    pub ctrl_loss_tmo: i32,
    /// Seconds between reconnect attempts.
    pub reconnect_delay: u32,
    /// Keep Alive Timeout in seconds: how long a silent appliance goes unnoticed.
    pub keep_alive_tmo: u32,
    /// I/O queues to ask for; 0 = the kernel's default (one per CPU).
    pub nr_io_queues: u32,
}

/// Default `fast_io_fail_tmo`: 90 s. The appliance image boots to ready in about 4 s under
/// emulation; a real box adds its firmware's power-on self test, a firmware update its flash
/// write, and a large pool its journal replay, which 90 s covers several times over. It stays
/// below the kernel's 120 s hung-task report and the 2-minute deadline kubelet gives a CSI
/// call, so a workload and NodeUnstageVolume see an error instead of a hang.
pub const DEFAULT_FAST_IO_FAIL_TMO: i32 = 90;
/// Default `ctrl_loss_tmo`: 600 s, the kernel's own default. Queued I/O has failed long before
/// (`fast_io_fail_tmo`); until then an appliance that comes back after a longer outage serves
/// the volume again without a new NodeStageVolume, and a host whose access was revoked stops
/// knocking within minutes.
pub const DEFAULT_CTRL_LOSS_TMO: i32 = 600;
/// Default `reconnect_delay`: 2 s (the kernel's is 10): I/O resumes within about 2 s of the
/// appliance being ready again, at the cost of one refused or unanswered connect every 2 s
/// while it is away.
pub const DEFAULT_RECONNECT_DELAY: u32 = 2;
/// Default `keep_alive_tmo`: 5 s, the kernel's own (NVME_DEFAULT_KATO): a powered-off appliance
/// is noticed within about 10 s; shorter would turn a busy link's delays into false losses.
pub const DEFAULT_KEEP_ALIVE_TMO: u32 = 5;

impl Default for FabricsConfig {
    fn default() -> Self {
        FabricsConfig {
            fast_io_fail_tmo: DEFAULT_FAST_IO_FAIL_TMO,
            ctrl_loss_tmo: DEFAULT_CTRL_LOSS_TMO,
            reconnect_delay: DEFAULT_RECONNECT_DELAY,
            keep_alive_tmo: DEFAULT_KEEP_ALIVE_TMO,
            nr_io_queues: 0,
        }
    }
}

impl FabricsConfig {
    /// Checks what the kernel would refuse or silently defeat: `reconnect_delay` and
    /// `keep_alive_tmo` of 0 (the kernel rejects the first and replaces the second with its
    /// default), a `fast_io_fail_tmo` below -1, and a `fast_io_fail_tmo` not below a finite
    /// `ctrl_loss_tmo` (the controller would be deleted before I/O fails fast: the kernel only
    /// warns).
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.reconnect_delay == 0 {
            return Err("--reconnect-delay must be at least 1 second".to_owned());
        }
        if self.keep_alive_tmo == 0 {
            return Err("--keep-alive-tmo must be at least 1 second".to_owned());
        }
        if self.fast_io_fail_tmo < -1 {
            return Err("--fast-io-fail-tmo must be -1 (never) or a number of seconds".to_owned());
        }
        if self.ctrl_loss_tmo < -1 {
            return Err("--ctrl-loss-tmo must be -1 (forever) or a number of seconds".to_owned());
        }
        if self.ctrl_loss_tmo >= 0 && self.fast_io_fail_tmo >= self.ctrl_loss_tmo {
            return Err(format!(
                "--fast-io-fail-tmo {} must be below --ctrl-loss-tmo {}: the controller would be \
                 deleted before queued I/O fails fast",
                self.fast_io_fail_tmo, self.ctrl_loss_tmo
            ));
        }
        Ok(())
    }

    /// `fast_io_fail_tmo` as the kernel's sysfs attribute shows it (`None` = off).
    pub fn fail_fast(&self) -> Option<u32> {
        u32::try_from(self.fast_io_fail_tmo).ok()
    }
}

/// The host's NVMe identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// Host NQN (the CSI node id).
    pub nqn: String,
    /// Host identifier (UUID text), if known.
    pub id: Option<String>,
}

/// Where a volume's subsystem lives: parsed from publish_context at the edge.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Target {
    /// Only `tcp` today.
    pub transport: String,
    /// The target's IP address, in canonical form.
    pub traddr: String,
    /// The target's TCP port.
    pub trsvcid: u16,
    /// The subsystem NQN.
    pub subsysnqn: String,
}

impl Target {
    /// Validates the pieces a publish_context carries.
    pub fn parse(transport: &str, traddr: &str, trsvcid: &str, subsysnqn: &str) -> Result<Self> {
        if transport != "tcp" {
            return Err(Error::InvalidArgument(format!(
                "publish_context transport {transport:?} is not supported (only \"tcp\")"
            )));
        }
        let addr: IpAddr = traddr.parse().map_err(|_| {
            Error::InvalidArgument(format!(
                "publish_context targetAddress {traddr:?} is not an IP address"
            ))
        })?;
        let port: u16 = trsvcid.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "publish_context targetPort {trsvcid:?} is not a TCP port"
            ))
        })?;
        // An NQN is at most 223 bytes and must not break the comma-separated option string.
        if !subsysnqn.starts_with("nqn.")
            || subsysnqn.len() > 223
            || subsysnqn.contains([',', '=', '\n'])
            || subsysnqn.chars().any(char::is_whitespace)
        {
            return Err(Error::InvalidArgument(format!(
                "publish_context subsystemNqn {subsysnqn:?} is not a valid NQN"
            )));
        }
        Ok(Target {
            transport: transport.to_owned(),
            traddr: addr.to_string(),
            trsvcid: port,
            subsysnqn: subsysnqn.to_owned(),
        })
    }

    /// True when sysfs controller `c` is a controller of this host to this target.
    pub fn is_reached_by(&self, c: &Controller, host: &HostIdentity) -> bool {
        let same_addr = c
            .traddr
            .parse::<IpAddr>()
            .is_ok_and(|a| a.to_string() == self.traddr);
        c.transport == self.transport
            && c.subsysnqn == self.subsysnqn
            && same_addr
            && c.trsvcid == self.trsvcid.to_string()
            && c.hostnqn == host.nqn
    }
}

/// How a connect authenticates: the node's keys (bidirectional DH-HMAC-CHAP), or none (an
/// appliance that allows unauthenticated hosts). `kernel_checked` is false when the plugin could
/// not tell whether the kernel does NVMe authentication (see [`crate::auth_support`]).
#[derive(Debug, Clone, Copy)]
pub enum Auth<'a> {
    /// No keys.
    None,
    /// These keys.
    Keys {
        /// The pair.
        keys: &'a DhchapKeys,
        /// Whether the kernel was found to support authentication.
        kernel_checked: bool,
    },
}

/// The option string written to `/dev/nvme-fabrics` (tokens of drivers/nvme/host/fabrics.c).
/// With keys it carries secrets: it goes to the kernel and nowhere else (never a log line or an
/// error message).
pub fn connect_options(
    target: &Target,
    host: &HostIdentity,
    cfg: &FabricsConfig,
    keys: Option<&DhchapKeys>,
) -> String {
    let mut opts = format!(
        "nqn={},transport={},traddr={},trsvcid={},hostnqn={}",
        target.subsysnqn, target.transport, target.traddr, target.trsvcid, host.nqn
    );
    if let Some(id) = &host.id {
        opts.push_str(&format!(",hostid={id}"));
    }
    if cfg.nr_io_queues > 0 {
        opts.push_str(&format!(",nr_io_queues={}", cfg.nr_io_queues));
    }
    opts.push_str(&format!(
        ",keep_alive_tmo={},reconnect_delay={},ctrl_loss_tmo={},fast_io_fail_tmo={}",
        cfg.keep_alive_tmo, cfg.reconnect_delay, cfg.ctrl_loss_tmo, cfg.fast_io_fail_tmo
    ));
    if let Some(k) = keys {
        // Bidirectional: the host proves itself with its secret, the appliance with the
        // controller secret.
        opts.push_str(",dhchap_secret=");
        opts.push_str(k.host.expose());
        opts.push_str(",dhchap_ctrl_secret=");
        opts.push_str(k.ctrl.expose());
    }
    opts
}

/// Parses the kernel's `instance=N,cntlid=M` answer into the controller name `nvmeN`.
pub fn parse_connect_answer(answer: &str) -> Option<String> {
    answer
        .trim()
        .split(',')
        .find_map(|kv| kv.strip_prefix("instance="))
        .and_then(|n| n.parse::<u32>().ok())
        .map(|n| format!("nvme{n}"))
}

/// The usable controller of this host to `target`, if the kernel has one.
pub fn find_controller<H: Host + ?Sized>(
    host: &H,
    target: &Target,
    ident: &HostIdentity,
) -> Result<Option<Controller>> {
    let all = sysfs::controllers(host).map_err(|e| Error::io("listing NVMe controllers", &e))?;
    Ok(all
        .into_iter()
        .find(|c| c.usable() && target.is_reached_by(c, ident)))
}

/// Returns the controller to `target`, connecting only when none exists.
pub fn ensure_connected<H: Host + ?Sized>(
    host: &H,
    target: &Target,
    ident: &HostIdentity,
    cfg: &FabricsConfig,
    auth: Auth<'_>,
) -> Result<String> {
    if let Some(c) = find_controller(host, target, ident)? {
        return Ok(c.name);
    }
    let keys = match auth {
        Auth::None => None,
        Auth::Keys { keys, .. } => Some(keys),
    };
    // Wiped when dropped, on every path: with keys it holds secrets.
    let options = zeroize::Zeroizing::new(connect_options(target, ident, cfg, keys));
    // One line per connect, saying whether keys were used (never the keys, nor `options`).
    let authentication = match keys {
        Some(_) => "DH-HMAC-CHAP bidirectional",
        None => "none",
    };
    tracing::info!(subsysnqn = %target.subsysnqn, traddr = %target.traddr,
        trsvcid = target.trsvcid, authentication,
        key_generation = keys.map(|k| k.generation), "connecting NVMe/TCP controller");
    let answer = host.connect_fabrics(&options).map_err(|e| {
        crate::initiator::transport_missing(host, &e)
            .unwrap_or_else(|| connect_error(target, ident, &e, auth))
    })?;
    parse_connect_answer(&answer).ok_or_else(|| {
        Error::Internal(format!(
            "unexpected answer from /dev/nvme-fabrics: {answer:?}"
        ))
    })
}

/// The CSI outcome of a failed write to `/dev/nvme-fabrics`. The kernel turns a Fabrics Connect
/// that the target answered with an error status into EIO: the edgevol target answers so for a
/// subsystem it does not have (Connect Invalid Parameters on SUBNQN: the volume was deleted) and
/// for a host NQN the volume is not published to (Connect Invalid Host), both "the volume does
/// not exist" from this node's view (NOT_FOUND: the CO checks the volume and its
/// ControllerPublishVolume). Everything else (refused or unreachable port, timeouts, resets)
/// means the target could not be asked: UNAVAILABLE, a retry may succeed.
///
/// With keys, EIO also covers a failed authentication (the appliance's log says why), and, when
/// the plugin could not check the kernel, a kernel without NVMe authentication.
pub fn connect_error(
    target: &Target,
    ident: &HostIdentity,
    err: &std::io::Error,
    auth: Auth<'_>,
) -> Error {
    const EIO: i32 = 5;
    if err.raw_os_error() == Some(EIO) {
        let more = match auth {
            Auth::None => "",
            Auth::Keys {
                kernel_checked: true,
                ..
            } => ", or DH-HMAC-CHAP authentication failed (the appliance's log names the reason)",
            Auth::Keys {
                kernel_checked: false,
                ..
            } => {
                ", or DH-HMAC-CHAP authentication failed (the appliance's log names the reason), \
                 or this kernel lacks NVMe in-band authentication (CONFIG_NVME_AUTH; the plugin \
                 could not check: mount /lib/modules into its container)"
            }
        };
        Error::NotFound(format!(
            "the target at {}:{} refused to connect host {} to subsystem {} ({err}): the volume \
             does not exist there, or is not published to this node{more}",
            target.traddr, target.trsvcid, ident.nqn, target.subsysnqn
        ))
    } else {
        Error::Unavailable(format!(
            "connecting to {} at {}:{} failed: {err}",
            target.subsysnqn, target.traddr, target.trsvcid
        ))
    }
}

/// Makes controller `c` fail queued I/O after the configured `fast_io_fail_tmo`, when its own
/// setting differs (a controller connected by an earlier version of the plugin, with
/// `fast_io_fail_tmo` off, would queue I/O until `ctrl_loss_tmo`). The kernel reads the value
/// when the controller next starts reconnecting, so a loss already under way keeps the old one.
/// Returns whether it wrote; a kernel without the attribute is left as it is.
pub fn apply_fail_fast<H: Host + ?Sized>(
    host: &H,
    c: &Controller,
    cfg: &FabricsConfig,
) -> Result<bool> {
    let have = sysfs::controller_fail_fast(host, &c.name)
        .map_err(|e| Error::io(format!("reading {}'s fast_io_fail_tmo", c.name), &e))?;
    let want = match cfg.fail_fast() {
        Some(s) => FailFast::After(s),
        None => FailFast::Off,
    };
    if have == FailFast::Unknown || have == want {
        return Ok(false);
    }
    let attr = sysfs::controller_dir(host, &c.name).join("fast_io_fail_tmo");
    tracing::info!(controller = %c.name, was = ?have, now = ?want, "setting fast_io_fail_tmo");
    host.write_attr(&attr, &cfg.fast_io_fail_tmo.to_string())
        .map_err(|e| Error::io(format!("setting {}", attr.display()), &e))?;
    Ok(true)
}

/// What [`apply_keys`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUpdate {
    /// The controller took the keys (and re-authenticates with them).
    Updated,
    /// It holds these keys already.
    Unchanged,
    /// It was connected without keys: the kernel takes none for it.
    NoKeys,
    /// The kernel has no NVMe authentication (no `dhchap_secret` attribute).
    Unsupported,
}

/// Gives controller `c` the secrets of `keys` when it holds others, through its sysfs
/// `dhchap_ctrl_secret` and `dhchap_secret`. Each write makes the kernel re-authenticate every
/// queue of the controller, and it keeps the secrets for its reconnects. The controller secret
/// goes first: the re-authentication in between still presents the old host secret, which the
/// appliance accepts until the host has used the new pair, so the rotation completes only with
/// the whole new pair. Secrets are read and compared in memory only.
pub fn apply_keys<H: Host + ?Sized>(
    host: &H,
    c: &Controller,
    keys: &DhchapKeys,
) -> Result<KeyUpdate> {
    let dir = sysfs::controller_dir(host, &c.name);
    let read = |attr: &str| -> Result<Option<zeroize::Zeroizing<String>>> {
        match std::fs::read_to_string(dir.join(attr)) {
            Ok(v) => Ok(Some(zeroize::Zeroizing::new(v.trim().to_owned()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}'s {attr}", c.name), &e)),
        }
    };
    let (Some(have_host), Some(have_ctrl)) = (read("dhchap_secret")?, read("dhchap_ctrl_secret")?)
    else {
        return Ok(KeyUpdate::Unsupported);
    };
    if have_host.as_str() == "none" {
        return Ok(KeyUpdate::NoKeys);
    }
    if have_host.as_str() == keys.host.expose() && have_ctrl.as_str() == keys.ctrl.expose() {
        return Ok(KeyUpdate::Unchanged);
    }
    for (attr, secret) in [
        ("dhchap_ctrl_secret", &keys.ctrl),
        ("dhchap_secret", &keys.host),
    ] {
        // The error names the attribute, never the value.
        host.write_attr(&dir.join(attr), secret.expose())
            .map_err(|e| Error::io(format!("giving {} its new {attr}", c.name), &e))?;
    }
    Ok(KeyUpdate::Updated)
}

/// Deletes controller `name` (write `1` to its `delete_controller`). A controller that no
/// longer exists is already disconnected.
pub fn disconnect<H: Host + ?Sized>(host: &H, name: &str) -> Result<()> {
    let attr = sysfs::controller_dir(host, name).join("delete_controller");
    if !attr.exists() {
        return Ok(());
    }
    tracing::info!(controller = name, "deleting NVMe controller");
    host.write_attr(&attr, "1")
        .map_err(|e| Error::io(format!("disconnecting {name} ({})", attr.display()), &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;

    fn target() -> Target {
        Target::parse(
            "tcp",
            "10.0.0.2",
            "4420",
            "nqn.2024-01.io.edgevol:app1:vol1",
        )
        .unwrap()
    }

    fn ident() -> HostIdentity {
        HostIdentity {
            nqn: "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555".into(),
            id: Some("11111111-2222-3333-4444-555555555555".into()),
        }
    }

    #[test]
    fn option_string_has_every_token() {
        let cfg = FabricsConfig {
            fast_io_fail_tmo: -1,
            ctrl_loss_tmo: -1,
            reconnect_delay: 5,
            keep_alive_tmo: 7,
            nr_io_queues: 4,
        };
        assert_eq!(
            connect_options(&target(), &ident(), &cfg, None),
            "nqn=nqn.2024-01.io.edgevol:app1:vol1,transport=tcp,traddr=10.0.0.2,trsvcid=4420,\
             hostnqn=nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555,\
             hostid=11111111-2222-3333-4444-555555555555,nr_io_queues=4,keep_alive_tmo=7,\
             reconnect_delay=5,ctrl_loss_tmo=-1,fast_io_fail_tmo=-1"
        );
        let no_id = HostIdentity {
            nqn: "nqn.h".into(),
            id: None,
        };
        let s = connect_options(&target(), &no_id, &FabricsConfig::default(), None);
        assert!(!s.contains("hostid="), "{s}");
        assert!(
            !s.contains("nr_io_queues"),
            "default leaves queues to the kernel: {s}"
        );
        assert!(
            s.ends_with(
                ",keep_alive_tmo=5,reconnect_delay=2,ctrl_loss_tmo=600,fast_io_fail_tmo=90"
            ),
            "{s}"
        );
        // Every token is one the 6.1 kernel's opt_tokens table knows.
        let known = [
            "nqn",
            "transport",
            "traddr",
            "trsvcid",
            "hostnqn",
            "hostid",
            "nr_io_queues",
            "keep_alive_tmo",
            "reconnect_delay",
            "ctrl_loss_tmo",
            "fast_io_fail_tmo",
        ];
        for kv in connect_options(&target(), &ident(), &cfg, None).split(',') {
            let key = kv.split_once('=').map_or(kv, |(k, _)| k);
            assert!(known.contains(&key), "{key}");
        }
    }

    #[test]
    fn keys_end_the_option_string_as_tokens_the_kernel_knows() {
        let keys = DhchapKeys::validated(
            "DHHC-1:01:aGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGg2Cw==:".into(),
            "DHHC-1:01:Y2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2N5Ag==:".into(),
            4,
        )
        .unwrap();
        let s = connect_options(&target(), &ident(), &FabricsConfig::default(), Some(&keys));
        assert!(
            s.ends_with(
                ",fast_io_fail_tmo=90,\
                 dhchap_secret=DHHC-1:01:aGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGg2Cw==:,\
                 dhchap_ctrl_secret=DHHC-1:01:Y2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2NjY2N5Ag==:"
            ),
            "{s}"
        );
        // The kernel splits at commas only: each secret stays one token.
        let tokens: Vec<&str> = s.split(',').collect();
        assert_eq!(tokens.len(), 12, "{s}");
        let no_keys = connect_options(&target(), &ident(), &FabricsConfig::default(), None);
        assert!(!no_keys.contains("dhchap"), "{no_keys}");
    }

    #[test]
    fn apply_keys_tells_a_kernel_without_auth_and_a_controller_without_keys() {
        let host = FakeHost::new();
        let keys =
            DhchapKeys::validated("DHHC-1:01:bmV3:".into(), "DHHC-1:01:Y3Ry:".into(), 2).unwrap();
        host.add_controller(
            "nvme0",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            "nqn.s",
            "nqn.h",
            "live",
        );
        let c = |name: &str| Controller {
            name: name.into(),
            transport: "tcp".into(),
            traddr: "10.0.0.2".into(),
            trsvcid: "4420".into(),
            subsysnqn: "nqn.s".into(),
            hostnqn: "nqn.h".into(),
            state: "live".into(),
        };
        assert_eq!(
            apply_keys(&host, &c("nvme0"), &keys).unwrap(),
            KeyUpdate::Unsupported
        );
        host.set_kernel_auth(true);
        host.add_controller(
            "nvme1",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            "nqn.s",
            "nqn.h",
            "live",
        );
        assert_eq!(
            apply_keys(&host, &c("nvme1"), &keys).unwrap(),
            KeyUpdate::NoKeys
        );
        assert!(host.attr_writes().is_empty(), "nothing written to either");
    }

    #[test]
    fn defaults_fail_queued_io_in_bounded_time_but_outlast_a_reboot() {
        let d = FabricsConfig::default();
        d.validate().unwrap();
        // The appliance image boots to ready in ~4 s under TCG (BENCHMARKS.md); a real box's
        // reboot or firmware update must fit many times into the fast-fail window, and the window
        // must end before kubelet's 2-minute CSI deadline and the 120 s hung-task report.
        let fail_fast = d.fail_fast().expect("fast_io_fail_tmo is on by default");
        assert!((60..=100).contains(&fail_fast), "{fail_fast}");
        assert!(fail_fast + 2 * d.keep_alive_tmo < 120);
        assert!(d.ctrl_loss_tmo > d.fast_io_fail_tmo);
        assert!(d.reconnect_delay < d.keep_alive_tmo);

        let bad = |f: fn(&mut FabricsConfig)| {
            let mut c = FabricsConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.reconnect_delay = 0).contains("--reconnect-delay"));
        assert!(bad(|c| c.keep_alive_tmo = 0).contains("--keep-alive-tmo"));
        assert!(bad(|c| c.fast_io_fail_tmo = -2).contains("--fast-io-fail-tmo"));
        assert!(bad(|c| c.ctrl_loss_tmo = -5).contains("--ctrl-loss-tmo"));
        assert!(bad(|c| c.ctrl_loss_tmo = 90).contains("below --ctrl-loss-tmo 90"));
        // Off, or reconnecting forever, are the operator's choice.
        for (fail_fast, loss) in [(-1, 600), (90, -1), (-1, -1), (0, 1)] {
            let c = FabricsConfig {
                fast_io_fail_tmo: fail_fast,
                ctrl_loss_tmo: loss,
                ..FabricsConfig::default()
            };
            c.validate().unwrap();
            assert_eq!(c.fail_fast(), u32::try_from(fail_fast).ok());
        }
    }

    #[test]
    fn apply_fail_fast_sets_a_controller_that_differs() {
        let host = FakeHost::new();
        let id = ident();
        // Connected by an earlier plugin: fast_io_fail_tmo off.
        host.add_controller(
            "nvme3",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            &target().subsysnqn,
            &id.nqn,
            "live",
        );
        let c = find_controller(&host, &target(), &id).unwrap().unwrap();
        let cfg = FabricsConfig::default();
        assert_eq!(
            sysfs::controller_fail_fast(&host, "nvme3").unwrap(),
            FailFast::Off
        );
        assert!(apply_fail_fast(&host, &c, &cfg).unwrap());
        assert_eq!(
            sysfs::controller_fail_fast(&host, "nvme3").unwrap(),
            FailFast::After(90)
        );
        assert!(!apply_fail_fast(&host, &c, &cfg).unwrap(), "already right");
        let off = FabricsConfig {
            fast_io_fail_tmo: -1,
            ..cfg
        };
        assert!(apply_fail_fast(&host, &c, &off).unwrap());
        assert_eq!(
            sysfs::controller_fail_fast(&host, "nvme3").unwrap(),
            FailFast::Off
        );
        // A kernel without the attribute: nothing to do, not an error.
        host.remove_attr("nvme3", "fast_io_fail_tmo");
        assert_eq!(
            sysfs::controller_fail_fast(&host, "nvme3").unwrap(),
            FailFast::Unknown
        );
        assert!(!apply_fail_fast(&host, &c, &cfg).unwrap());
        // A controller connected by this plugin carries the options as the kernel shows them.
        let name = ensure_connected(&host, &target(), &id, &cfg, Auth::None);
        assert!(matches!(name, Ok(n) if n == "nvme3"), "reused");
        host.remove_controller_named("nvme3");
        let name = ensure_connected(&host, &target(), &id, &cfg, Auth::None).unwrap();
        assert_eq!(
            sysfs::controller_fail_fast(&host, &name).unwrap(),
            FailFast::After(90)
        );
    }

    #[test]
    fn target_parsing_rejects_bad_fields() {
        assert!(Target::parse("rdma", "10.0.0.2", "4420", "nqn.a").is_err());
        assert!(Target::parse("tcp", "host.example", "4420", "nqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "0", "nqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "70000", "nqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "4420", "iqn.a").is_err());
        assert!(Target::parse("tcp", "10.0.0.2", "4420", "nqn.a,traddr=x").is_err());
        let v6 = Target::parse("tcp", "FD00:0:0::2", "4420", "nqn.a").unwrap();
        assert_eq!(v6.traddr, "fd00::2");
    }

    #[test]
    fn connect_answer_names_the_controller() {
        assert_eq!(
            parse_connect_answer("instance=3,cntlid=1\n").as_deref(),
            Some("nvme3")
        );
        assert_eq!(parse_connect_answer("garbage"), None);
    }

    #[test]
    fn reuses_a_live_controller_and_ignores_others() {
        let host = FakeHost::new();
        let id = ident();
        // Same subsystem, other host NQN; same host, other port; a dying one.
        host.add_controller(
            "nvme0",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            &target().subsysnqn,
            "nqn.other",
            "live",
        );
        host.add_controller(
            "nvme1",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4421",
            &target().subsysnqn,
            &id.nqn,
            "live",
        );
        host.add_controller(
            "nvme2",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            &target().subsysnqn,
            &id.nqn,
            "deleting",
        );
        assert_eq!(find_controller(&host, &target(), &id).unwrap(), None);
        host.add_controller(
            "nvme4",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420,src_addr=10.0.0.9",
            &target().subsysnqn,
            &id.nqn,
            "connecting",
        );
        let name =
            ensure_connected(&host, &target(), &id, &FabricsConfig::default(), Auth::None).unwrap();
        assert_eq!(name, "nvme4");
        assert!(
            host.fabrics_writes().is_empty(),
            "no connect when one exists"
        );
    }

    #[test]
    fn connects_when_none_and_disconnect_is_idempotent() {
        let host = FakeHost::new();
        let id = ident();
        let name =
            ensure_connected(&host, &target(), &id, &FabricsConfig::default(), Auth::None).unwrap();
        assert_eq!(host.fabrics_writes().len(), 1);
        assert!(host.fabrics_writes()[0].starts_with("nqn=nqn.2024-01.io.edgevol:app1:vol1,"));
        assert_eq!(
            find_controller(&host, &target(), &id)
                .unwrap()
                .unwrap()
                .name,
            name
        );
        disconnect(&host, &name).unwrap();
        assert_eq!(find_controller(&host, &target(), &id).unwrap(), None);
        disconnect(&host, &name).unwrap();
    }

    #[test]
    fn connect_and_disconnect_failures_are_errors() {
        let host = FakeHost::new();
        host.fail_next("connect");
        let err = ensure_connected(
            &host,
            &target(),
            &ident(),
            &FabricsConfig::default(),
            Auth::None,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        let name = ensure_connected(
            &host,
            &target(),
            &ident(),
            &FabricsConfig::default(),
            Auth::None,
        )
        .unwrap();
        host.fail_next("delete_controller");
        assert!(disconnect(&host, &name).is_err());
    }
}
