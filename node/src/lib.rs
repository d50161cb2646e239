//! The edgevol CSI node plugin: runs on each workload host, connects the appliance's NVMe/TCP
//! subsystems with the Linux kernel initiator, formats and mounts them, and serves CSI
//! Identity + Node on a unix socket for the CO (kubelet). It never links `edgevol-core`.
//!
//! One file per host concern, below one [`host::Host`] trait:
//! * [`fabrics`]: connect (option string to `/dev/nvme-fabrics`), reuse, disconnect;
//! * [`initiator`]: whether the kernel's NVMe/TCP initiator is there, loading it if not;
//! * [`sysfs`]: controllers and namespaces (by NGUID/UUID) as the kernel shows them;
//! * [`mount`]: `/proc/self/mountinfo` and mount(8)/umount(8);
//! * [`fs`]: signature probe, mkfs, grow;
//! * [`state`]: records of staged volumes;
//! * [`volume`]: the operations, composed from the above, idempotent;
//! * [`legs`], [`raid`]: a replicated volume's legs (from publish_context) and their md RAID1
//!   (mdadm and md's sysfs), staged by `volume`'s replicated half;
//! * [`crypt`]: encrypted volumes: LUKS2 with cryptsetup, the passphrase from the CO's
//!   node-stage secret, the dm-crypt mapping staged instead of the device;
//! * [`keys`]: the node's DH-HMAC-CHAP keys, by enrolment with the appliance over mTLS;
//!   [`auth_support`]: whether the kernel can use them;
//! * [`appliances`]: a node reaching several appliances (topology, per-appliance enrolment);
//! * [`csi`]: thin gRPC handlers; [`hostnqn`]: the node id.

pub mod appliances;
pub mod auth_support;
mod command;
pub mod crypt;
pub mod csi;
pub mod error;
pub mod fabrics;
pub mod fs;
pub mod host;
pub mod hostnqn;
pub mod initiator;
pub mod keys;
pub mod legs;
pub mod mount;
pub mod raid;
pub mod state;
pub mod sysfs;
pub mod volume;

#[cfg(test)]
mod appliance_tests;
#[cfg(test)]
mod auth_tests;
#[cfg(test)]
mod crypt_tests;
#[cfg(test)]
mod fault_tests;
#[cfg(test)]
mod replicated_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod volume_tests;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use edgevol_proto::csi::v1::identity_server::IdentityServer;
use edgevol_proto::csi::v1::node_server::NodeServer;
use tokio::net::UnixListener;

use crate::appliances::{ApplianceKeys, Enrolments};
use crate::csi::identity::IdentityService;
use crate::csi::node::{NodeInfo, NodeService};
use crate::fabrics::FabricsConfig;
use crate::host::{Host, LinuxHost};
use crate::keys::{EnrolConfig, GrpcEnroller, KeySource};
use crate::state::StateStore;
use crate::volume::{VolumeConfig, Volumes};

/// Command-line flags of `edgevol-node`.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "edgevol-node", version, about = "edgevol CSI node plugin")]
pub struct Args {
    /// CSI endpoint: `unix:///path/to/csi.sock`.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    pub endpoint: String,
    /// Host NQN file (the node id); generated and persisted when missing.
    #[arg(long, default_value = "/etc/nvme/hostnqn")]
    pub node_id_file: PathBuf,
    /// Host id file (UUID); when missing, the UUID of a UUID-form host NQN is used.
    #[arg(long, default_value = "/etc/nvme/hostid")]
    pub hostid_file: PathBuf,
    /// Directory for staged-volume records (must survive plugin restarts).
    #[arg(long, default_value = "/var/lib/edgevol-node")]
    pub state_dir: PathBuf,
    /// max_volumes_per_node reported by NodeGetInfo (0 = no limit).
    #[arg(long, default_value_t = 0)]
    pub max_volumes_per_node: i64,
    /// Topology segment `key=value` reported by NodeGetInfo, repeatable. Give
    /// `edgevol.io/appliance=<id>` once for each appliance this node reaches: each becomes a
    /// presence key `appliance.edgevol.io/<id>=true` (and, when there is exactly one,
    /// `edgevol.io/appliance=<id>` stays too).
    #[arg(long = "topology", value_name = "KEY=VALUE")]
    pub topology: Vec<String>,
    /// Seconds after losing the appliance before the kernel fails queued I/O (-1 = never:
    /// I/O waits until --ctrl-loss-tmo). Well above an appliance reboot or firmware update:
    /// see the README's "Failure behaviour".
    #[arg(long, default_value_t = fabrics::DEFAULT_FAST_IO_FAIL_TMO, allow_negative_numbers = true)]
    pub fast_io_fail_tmo: i32,
    /// Seconds the kernel keeps reconnecting a lost controller before deleting it (-1 = forever).
    #[arg(long, default_value_t = fabrics::DEFAULT_CTRL_LOSS_TMO, allow_negative_numbers = true)]
    pub ctrl_loss_tmo: i32,
    /// fast_io_fail_tmo of a replicated volume's legs, in seconds: how long writes wait for a
    /// lost leg before the kernel fails its I/O and md goes on with the other legs.
    #[arg(long, default_value_t = volume::DEFAULT_LEG_FAST_IO_FAIL_TMO)]
    pub leg_fast_io_fail_tmo: i32,
    /// Seconds between checks that re-add a replicated volume's returned legs (and connect a
    /// leg whose controller the kernel gave up); NodeGetVolumeStats re-adds too.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub replica_check_secs: u64,
    /// Seconds between reconnect attempts.
    #[arg(long, default_value_t = fabrics::DEFAULT_RECONNECT_DELAY)]
    pub reconnect_delay: u32,
    /// NVMe Keep Alive Timeout in seconds: how long a silent appliance goes unnoticed.
    #[arg(long, default_value_t = fabrics::DEFAULT_KEEP_ALIVE_TMO)]
    pub keep_alive_tmo: u32,
    /// I/O queues per controller (0 = kernel default).
    #[arg(long, default_value_t = 0)]
    pub nr_io_queues: u32,
    /// Seconds to wait for a namespace and its device node after connecting.
    #[arg(long, default_value_t = 30)]
    pub device_wait_secs: u64,
    /// An appliance's control endpoint, ID=HOST:PORT of its edgevold's mTLS listener,
    /// repeatable (one per appliance this node reaches); a plain HOST:PORT serves every
    /// appliance without an endpoint of its own (a one-box site). The node enrols there with its
    /// host NQN and gets its DH-HMAC-CHAP keys for that appliance, and connects every volume
    /// with bidirectional authentication; a volume's appliance is the one its subsystem NQN
    /// names. Needs --appliance-ca, --node-cert and --node-key. Without it volumes connect
    /// without keys, which only an appliance that allows unauthenticated hosts accepts.
    #[arg(
        long,
        value_name = "[ID=]HOST:PORT",
        help_heading = "Data-path authentication"
    )]
    pub appliance: Vec<String>,
    /// The appliance's CA certificate (PEM).
    #[arg(long, value_name = "FILE", help_heading = "Data-path authentication")]
    pub appliance_ca: Option<PathBuf>,
    /// This node's certificate (PEM), role node: `edgevol pki issue --role node --name NODE`.
    #[arg(long, value_name = "FILE", help_heading = "Data-path authentication")]
    pub node_cert: Option<PathBuf>,
    /// The node certificate's private key (PEM).
    #[arg(long, value_name = "FILE", help_heading = "Data-path authentication")]
    pub node_key: Option<PathBuf>,
    /// Name every appliance's certificate must carry (default: HOST of its --appliance).
    #[arg(long, value_name = "NAME", help_heading = "Data-path authentication")]
    pub appliance_server_name: Option<String>,
    /// Seconds between enrolments that look for rotated keys (an operator's
    /// `edgevol keys rotate`); NodeStageVolume enrols too. New keys go to every connected
    /// controller of a staged volume, so the old ones can retire.
    #[arg(
        long,
        default_value_t = 60,
        value_name = "SECS",
        help_heading = "Data-path authentication"
    )]
    pub key_refresh_secs: u64,
    /// Seconds allowed to reach the appliance and enrol.
    #[arg(
        long,
        default_value_t = 10,
        value_name = "SECS",
        help_heading = "Data-path authentication"
    )]
    pub enrol_timeout_secs: u64,
    /// Memory of the argon2id KDF that unlocks an encrypted volume's LUKS2 key slot, in KiB
    /// (at most: cryptsetup takes less when even its fewest passes outlast --luks-iter-time-ms).
    /// Taken while a volume is formatted, opened or re-keyed, then given back.
    #[arg(long, default_value_t = crypt::DEFAULT_KDF.memory_kib, value_name = "KIB",
        help_heading = "Encrypted volumes")]
    pub luks_pbkdf_memory_kib: u32,
    /// How long one unlock of an encrypted volume's key slot takes on this node, in ms.
    #[arg(long, default_value_t = crypt::DEFAULT_KDF.iter_time_ms, value_name = "MS",
        help_heading = "Encrypted volumes")]
    pub luks_iter_time_ms: u32,
    /// Threads of one unlock (argon2id's parallelism).
    #[arg(long, default_value_t = crypt::DEFAULT_KDF.parallel, value_name = "N",
        help_heading = "Encrypted volumes")]
    pub luks_pbkdf_parallel: u32,
    /// sysfs root (tests).
    #[arg(long, default_value = "/sys", hide = true)]
    pub sys_root: PathBuf,
    /// /dev root (tests).
    #[arg(long, default_value = "/dev", hide = true)]
    pub dev_root: PathBuf,
    /// Source of fresh UUIDs for a generated host NQN (tests).
    #[arg(long, default_value = "/proc/sys/kernel/random/uuid", hide = true)]
    pub uuid_source: PathBuf,
}

/// Parses `unix:///abs/path` (or `unix:/abs/path`).
pub fn socket_path(endpoint: &str) -> Result<PathBuf, String> {
    let rest = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .ok_or_else(|| format!("endpoint {endpoint:?} must be unix:///absolute/path"))?;
    let path = Path::new(rest);
    if !path.is_absolute() {
        return Err(format!(
            "endpoint {endpoint:?} must name an absolute socket path"
        ));
    }
    Ok(path.to_path_buf())
}

/// Parses `--topology key=value` flags ([`appliances::node_topology`]).
pub fn parse_topology(flags: &[String]) -> Result<HashMap<String, String>, String> {
    appliances::node_topology(flags)
}

/// Reads the data-path authentication flags: `None` when none is given, an error when only
/// some are; else one enrolment per `--appliance` (with its appliance id, `None` for the plain
/// `HOST:PORT`).
pub fn enrol_config(args: &Args) -> Result<Option<Enrolments>, String> {
    let given = [
        ("--appliance", !args.appliance.is_empty()),
        ("--appliance-ca", args.appliance_ca.is_some()),
        ("--node-cert", args.node_cert.is_some()),
        ("--node-key", args.node_key.is_some()),
    ];
    let (false, Some(ca), Some(cert), Some(key)) = (
        args.appliance.is_empty(),
        &args.appliance_ca,
        &args.node_cert,
        &args.node_key,
    ) else {
        let missing: Vec<&str> = given.iter().filter(|g| !g.1).map(|g| g.0).collect();
        if missing.len() == given.len() {
            if args.appliance_server_name.is_some() {
                return Err("--appliance-server-name needs --appliance".to_owned());
            }
            return Ok(None);
        }
        return Err(format!(
            "data-path authentication needs --appliance, --appliance-ca, --node-cert and \
             --node-key together; missing: {}",
            missing.join(", ")
        ));
    };
    if args.key_refresh_secs == 0 || args.enrol_timeout_secs == 0 {
        return Err("--key-refresh-secs and --enrol-timeout-secs must be at least 1".to_owned());
    }
    let endpoints = appliances::parse_appliances(&args.appliance)?;
    Ok(Some(
        endpoints
            .into_iter()
            .map(|e| {
                let cfg = EnrolConfig {
                    address: e.address,
                    server_name: args.appliance_server_name.clone(),
                    ca: ca.clone(),
                    cert: cert.clone(),
                    key: key.clone(),
                    timeout: Duration::from_secs(args.enrol_timeout_secs),
                };
                (e.appliance, cfg)
            })
            .collect(),
    ))
}

/// A ready-to-serve plugin.
#[derive(Debug)]
pub struct Plugin {
    /// Socket path.
    pub socket: PathBuf,
    /// Node service.
    pub node: NodeService,
    /// The volumes and how often to look for rotated keys, when the node enrols.
    pub key_refresh: Option<(Arc<Volumes>, Duration)>,
    /// The volumes and how often to re-add returned legs of replicated volumes.
    pub replica_check: (Arc<Volumes>, Duration),
}

/// Builds the plugin from flags on a given host: checks the connection flags, reads (or
/// creates) the host NQN, opens the state directory, and brings the controllers of volumes
/// staged before (a restart) to the configured `fast_io_fail_tmo`. Every later call works from
/// the state records and what the kernel shows: nothing of a previous run is kept in memory.
pub fn build(args: &Args, host: Arc<dyn Host>) -> Result<Plugin, String> {
    let source = match enrol_config(args)? {
        Some(configs) => {
            let mut keys = ApplianceKeys::default();
            for (appliance, cfg) in configs {
                let enroller = GrpcEnroller::new(&cfg)?;
                tracing::info!(endpoint = %cfg.address,
                    appliance = appliance.as_deref().unwrap_or("(every)"),
                    "data-path authentication: DH-HMAC-CHAP keys by enrolment with the appliance");
                keys = keys.with(appliance, Arc::new(enroller) as Arc<dyn KeySource>);
            }
            Some(keys)
        }
        None => {
            tracing::warn!(
                "no --appliance: volumes connect without DH-HMAC-CHAP keys, which \
                only an appliance that allows unauthenticated hosts accepts \
                (nvme.allow_unauthenticated_hosts); anyone on the storage network who sends \
                this node's host NQN gets its volumes"
            );
            None
        }
    };
    build_with_keys(args, host, source)
}

/// [`build`] with the key sources given (tests).
pub fn build_with_keys(
    args: &Args,
    host: Arc<dyn Host>,
    source: Option<ApplianceKeys>,
) -> Result<Plugin, String> {
    let socket = socket_path(&args.endpoint)?;
    let topology = parse_topology(&args.topology)?;
    if args.max_volumes_per_node < 0 {
        return Err("--max-volumes-per-node must not be negative".to_owned());
    }
    if !(1..=60).contains(&args.leg_fast_io_fail_tmo) || args.replica_check_secs == 0 {
        return Err(
            "--leg-fast-io-fail-tmo must be 1 to 60 seconds and --replica-check-secs at least 1"
                .to_owned(),
        );
    }
    let nqn = hostnqn::load_or_create(&args.node_id_file, &args.uuid_source)
        .map_err(|e| format!("host NQN {}: {e}", args.node_id_file.display()))?;
    let ident = hostnqn::identity(nqn.clone(), &args.hostid_file)
        .map_err(|e| format!("host id {}: {e}", args.hostid_file.display()))?;
    let store = StateStore::open(&args.state_dir)
        .map_err(|e| format!("state dir {}: {e}", args.state_dir.display()))?;
    let fabrics = FabricsConfig {
        fast_io_fail_tmo: args.fast_io_fail_tmo,
        ctrl_loss_tmo: args.ctrl_loss_tmo,
        reconnect_delay: args.reconnect_delay,
        keep_alive_tmo: args.keep_alive_tmo,
        nr_io_queues: args.nr_io_queues,
    };
    fabrics.validate()?;
    let kdf = crypt::KdfConfig {
        memory_kib: args.luks_pbkdf_memory_kib,
        iter_time_ms: args.luks_iter_time_ms,
        parallel: args.luks_pbkdf_parallel,
    };
    kdf.validate()?;
    let cfg = VolumeConfig {
        host: ident,
        fabrics,
        device_wait: Duration::from_secs(args.device_wait_secs),
        poll: Duration::from_millis(100),
    };
    initiator::prepare(&*host);
    let mut volumes = Volumes::new(host, store, cfg)
        .with_leg_fast_io_fail_tmo(args.leg_fast_io_fail_tmo)
        .with_kdf(kdf);
    if let Some(source) = source {
        volumes = volumes.with_appliance_keys(source);
    }
    let volumes = Arc::new(volumes);
    let volumes_for_check = volumes.clone();
    let key_refresh = volumes
        .uses_keys()
        .then(|| (volumes.clone(), Duration::from_secs(args.key_refresh_secs)));
    let adopted = volumes.adopt();
    if adopted > 0 {
        tracing::info!(
            controllers = adopted,
            "staged volumes' controllers set to --fast-io-fail-tmo"
        );
    }
    let info = NodeInfo {
        node_id: nqn,
        max_volumes_per_node: args.max_volumes_per_node,
        topology,
    };
    Ok(Plugin {
        socket,
        node: NodeService::new(volumes, info),
        key_refresh,
        replica_check: (
            volumes_for_check,
            Duration::from_secs(args.replica_check_secs),
        ),
    })
}

/// Builds the plugin on the real host.
pub fn build_linux(args: &Args) -> Result<Plugin, String> {
    build(
        args,
        Arc::new(LinuxHost::new(&args.sys_root, &args.dev_root)),
    )
}

/// Binds the unix socket (replacing a stale one) and serves until `shutdown` completes.
pub async fn serve(
    plugin: Plugin,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), String> {
    if let Some(dir) = plugin.socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    match std::fs::remove_file(&plugin.socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing stale {}: {e}", plugin.socket.display())),
    }
    let listener = UnixListener::bind(&plugin.socket)
        .map_err(|e| format!("binding {}: {e}", plugin.socket.display()))?;
    let refresher = plugin
        .key_refresh
        .map(|(volumes, every)| tokio::spawn(refresh_keys(volumes, every)));
    let (volumes, every) = plugin.replica_check;
    let replica_checker = tokio::spawn(check_replicas(volumes, every));
    tracing::info!(socket = %plugin.socket.display(), "serving CSI Identity + Node");
    let served = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(IdentityService))
        .add_service(NodeServer::new(plugin.node))
        .serve_with_incoming_shutdown(edgevol_uds::incoming(listener), shutdown)
        .await
        .map_err(|e| format!("gRPC server: {e}"));
    if let Some(task) = refresher {
        task.abort();
    }
    replica_checker.abort();
    served
}

/// Every `every`, re-adds the returned legs of replicated volumes ([`Volumes::heal_replicated`]).
pub async fn check_replicas(volumes: Arc<Volumes>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let v = volumes.clone();
        match tokio::task::spawn_blocking(move || v.heal_replicated()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(legs = n, "returned legs re-added to their md arrays"),
            Err(e) => tracing::error!(error = %e, "replica check task failed"),
        }
    }
}

/// Enrols every `every` (the first time at once) and hands rotated keys to the controllers
/// ([`Volumes::refresh_keys`]). A failure is logged and retried at the next tick.
pub async fn refresh_keys(volumes: Arc<Volumes>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let v = volumes.clone();
        match tokio::task::spawn_blocking(move || v.refresh_keys()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "enrolment to look for rotated keys failed"),
            Err(e) => tracing::error!(error = %e, "key refresh task failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_and_topology_flags() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").unwrap(),
            PathBuf::from("/csi/csi.sock")
        );
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
        assert!(socket_path("unix://relative.sock").is_err());
        let t = parse_topology(&["edgevol.io/appliance=box1".into()]).unwrap();
        assert_eq!(t["edgevol.io/appliance"], "box1");
        assert!(parse_topology(&["novalue=".into()]).is_err());
        assert!(parse_topology(&["a=1".into(), "a=2".into()]).is_err());
    }

    #[test]
    fn enrolment_flags_come_all_together_or_not_at_all() {
        use clap::Parser;
        let parse = |extra: &[&str]| {
            let mut argv = vec!["edgevol-node"];
            argv.extend_from_slice(extra);
            enrol_config(&Args::parse_from(argv))
        };
        assert!(parse(&[]).unwrap().is_none());
        let all = [
            "--appliance=10.0.0.1:9500",
            "--appliance-ca=/ca.pem",
            "--node-cert=/n.pem",
            "--node-key=/n.key",
        ];
        let cfgs = parse(&all).unwrap().unwrap();
        let [(None, cfg)] = &cfgs[..] else {
            panic!("{cfgs:?}")
        };
        assert_eq!(cfg.address, "10.0.0.1:9500");
        assert_eq!(cfg.timeout, Duration::from_secs(10));
        let mut two = all[1..].to_vec();
        two.extend([
            "--appliance=box-1=10.0.0.1:9500",
            "--appliance=box-2=10.0.0.2:9500",
        ]);
        let cfgs = parse(&two).unwrap().unwrap();
        let named: Vec<(Option<&str>, &str)> = cfgs
            .iter()
            .map(|(id, c)| (id.as_deref(), c.address.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                (Some("box-1"), "10.0.0.1:9500"),
                (Some("box-2"), "10.0.0.2:9500")
            ]
        );
        two.push("--appliance=box-1=10.0.0.3:9500");
        assert!(parse(&two).unwrap_err().contains("given twice"));
        let e = parse(&all[..2]).unwrap_err();
        assert!(e.contains("missing: --node-cert, --node-key"), "{e}");
        let e = parse(&["--appliance-server-name=box"]).unwrap_err();
        assert!(e.contains("needs --appliance"), "{e}");
        let mut zero = all.to_vec();
        zero.push("--key-refresh-secs=0");
        assert!(parse(&zero).is_err());
        let help = {
            use clap::CommandFactory;
            Args::command().render_long_help().to_string()
        };
        for flag in [
            "--appliance <[ID=]HOST:PORT>",
            "--node-cert",
            "--key-refresh-secs",
        ] {
            assert!(help.contains(flag), "{flag}: {help}");
        }
    }
}
