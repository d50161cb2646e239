//! `edgevol`: the operator's command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use edgevol_cli::fail_trial::{self, Outcome};
use edgevol_cli::firmware_keys::{self, SignRequest};
use edgevol_cli::{boot_files, firmware, keys, proxy, status};
use edgevol_pki::files::{self, Pair, LEAF_DAYS};
use edgevol_pki::tls::{client_config, TlsFiles};
use edgevol_pki::{Role, Validity};

#[derive(Debug, Parser)]
#[command(name = "edgevol", version, about = "edgevol appliance admin CLI")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Certificates: the appliance CA, its server certificate, role certificates for clients.
    Pki {
        #[command(subcommand)]
        command: PkiCommand,
    },
    /// Serve plaintext gRPC on a unix socket for CO sidecars; forward it to the appliances over
    /// mTLS (one driver over all of them).
    Proxy {
        /// unix:///path/csi.sock
        #[arg(long)]
        listen: String,
        /// An appliance's CSI endpoint: ID=HOST:PORT (its appliance id); repeat for several. One
        /// appliance may be given as plain HOST:PORT.
        #[arg(long)]
        appliance: Vec<String>,
        /// TOML file listing the appliances: `[[appliance]]` tables of id, address, server_name.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The appliance CA certificate.
        #[arg(long)]
        ca: PathBuf,
        /// Our client certificate (role controller for a CO).
        #[arg(long)]
        cert: PathBuf,
        /// Our client key.
        #[arg(long)]
        key: PathBuf,
        /// Name to verify in the appliance certificate (default: HOST).
        #[arg(long)]
        server_name: Option<String>,
        /// Send csi.v1.Node calls to the node plugin listening here (unix:///path or /path)
        /// instead of the appliance: one socket for both, as a Docker Swarm plugin needs.
        #[arg(long)]
        node_socket: Option<String>,
    },
    /// Pool capacity, health and connected hosts of an appliance (observer role is enough).
    Status {
        #[command(flatten)]
        conn: Connection,
    },
    /// List the appliance's volumes.
    Volumes {
        #[command(flatten)]
        conn: Connection,
    },
    /// List the appliance's snapshots; `snapshots diff` lists the byte ranges a snapshot holds
    /// or that changed between two snapshots of one volume.
    #[command(args_conflicts_with_subcommands = true)]
    Snapshots {
        // The connection's own arguments, not a flattened `Option<Connection>`: clap makes such
        // an option `Some` only when an argument of the outer struct itself is given
        // (`--metrics`), so `snapshots --appliance ...` alone was refused.
        #[command(flatten)]
        appliance: Option<Appliance>,
        /// The appliance's metrics exporter, HOST:PORT.
        #[arg(long)]
        metrics: Option<String>,
        #[command(subcommand)]
        command: Option<SnapshotsCommand>,
    },
    /// The appliance's A/B firmware: status, update, activate, rollback (admin certificate).
    Firmware {
        #[command(subcommand)]
        command: FirmwareCommand,
    },
    /// The nodes' NVMe data-path keys (DH-HMAC-CHAP): rotate, revoke, list. Needs an admin
    /// certificate; no secret is ever shown.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotsCommand {
    /// Changed-block tracking: one `OFFSET LENGTH END` line (bytes) per range, then a summary.
    /// `--base S1 --target S2`: the ranges whose content may differ (whole clusters; a cluster
    /// rewritten with the same bytes counts); `--allocated S`: the ranges S holds. Needs a
    /// controller or admin certificate.
    Diff {
        #[command(flatten)]
        appliance: Appliance,
        /// The older snapshot.
        #[arg(long, requires = "target", required_unless_present = "allocated")]
        base: Option<String>,
        /// The newer snapshot of the same volume.
        #[arg(long, requires = "base")]
        target: Option<String>,
        /// List the allocated ranges of this snapshot instead.
        #[arg(long, conflicts_with_all = ["base", "target"])]
        allocated: Option<String>,
        /// Start at this byte (a range that starts before it is cut to it): resume an
        /// interrupted listing at the END of its last line.
        #[arg(long, default_value_t = 0)]
        starting_offset: i64,
    },
}

#[derive(Debug, Subcommand)]
enum FirmwareCommand {
    #[command(flatten)]
    Remote(RemoteFirmware),
    /// On the appliance, for its init: mark the running trial boot failed (edgevold exited or
    /// never became ready) so the previous slot boots next. Exit status 0: rolled back, reboot
    /// now; 3: not a trial boot, nothing changed.
    FailTrial {
        /// edgevold's exit status as the shell reports it (above 128: killed by a signal).
        #[arg(long, conflicts_with = "reason", required_unless_present = "reason")]
        exit_status: Option<i32>,
        /// What failed, when the daemon did not exit by itself.
        #[arg(long)]
        reason: Option<String>,
        /// The mounted boot partition.
        #[arg(long, default_value = "/boot")]
        boot_dir: PathBuf,
        /// The verification key baked into the image.
        #[arg(long, default_value = "/etc/edgevol/firmware-signing.pub")]
        public_key: PathBuf,
        /// The running version.
        #[arg(long, default_value = "/etc/edgevol/firmware-version")]
        version_file: PathBuf,
        /// The kernel command line.
        #[arg(long, default_value = "/proc/cmdline")]
        cmdline: PathBuf,
    },
    /// Write the boot loaders' files of a factory image (slot A primary, no trial) into DIR:
    /// grub.cfg and grubenv (UEFI), syslinux.cfg (BIOS). Used by image/build.sh.
    BootFiles {
        /// Where to write them.
        #[arg(long)]
        out: PathBuf,
    },
}

/// The firmware commands that talk to an appliance.
#[derive(Debug, Subcommand)]
enum RemoteFirmware {
    /// Both slots, which one runs, what the boot loaders boot next, why the last update was
    /// rolled back.
    Status {
        #[command(flatten)]
        appliance: Appliance,
    },
    /// Send a signed bundle: verified, written into the other slot, armed to boot once.
    Update {
        /// The bundle (`edgevol pki sign-firmware`, image/build.sh's edgevol.bundle).
        bundle: PathBuf,
        #[command(flatten)]
        appliance: Appliance,
    },
    /// Reboot the appliance into the armed update (or the slot a rollback chose).
    Activate {
        #[command(flatten)]
        appliance: Appliance,
    },
    /// Cancel an armed update, fail a running trial, or go back to the other good slot (at the
    /// next reboot: activate).
    Rollback {
        #[command(flatten)]
        appliance: Appliance,
        /// Roll back even to a slot whose firmware cannot read (or write) the pool: it boots,
        /// leaves the pool untouched and does not serve it, so the box is out of service until
        /// it boots firmware that reads the pool (from its console).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Give a node new keys. Its current keys keep working until its host has authenticated
    /// with the new ones once; then they stop working.
    Rotate {
        /// The node's name (its certificate's common name).
        #[arg(long)]
        node: String,
        #[command(flatten)]
        appliance: Appliance,
    },
    /// Revoke a node's keys: its host NQN no longer authenticates and its connections close;
    /// the certificates it enrolled with may not enrol again.
    Revoke {
        /// The node's name (its certificate's common name).
        #[arg(long)]
        node: String,
        #[command(flatten)]
        appliance: Appliance,
    },
    /// Every enrolled node (host NQN, key generation, pending rotation, times) and revoked
    /// certificate.
    List {
        #[command(flatten)]
        appliance: Appliance,
    },
}

/// How a command reaches the appliance over mTLS.
#[derive(Debug, clap::Args)]
struct Appliance {
    /// The appliance's CSI endpoint, HOST:PORT.
    #[arg(long)]
    appliance: String,
    /// The appliance CA certificate.
    #[arg(long)]
    ca: PathBuf,
    /// Our client certificate (observer is enough to read status; keys needs admin).
    #[arg(long)]
    cert: PathBuf,
    /// Our client key.
    #[arg(long)]
    key: PathBuf,
    /// Name to verify in the appliance certificate (default: HOST).
    #[arg(long)]
    server_name: Option<String>,
}

impl Appliance {
    async fn channel(&self) -> Result<tonic::transport::Channel, String> {
        let tls = client_config(TlsFiles {
            ca: &self.ca,
            cert: &self.cert,
            key: &self.key,
        })
        .map_err(|e| e.to_string())?;
        status::connect(&self.appliance, self.server_name.as_deref(), tls).await
    }
}

/// How `status`, `volumes` and `snapshots` reach the appliance.
#[derive(Debug, clap::Args)]
struct Connection {
    #[command(flatten)]
    appliance: Appliance,
    /// The appliance's metrics exporter, HOST:PORT: pool usage, device health and connected
    /// hosts, which CSI has no call for.
    #[arg(long)]
    metrics: Option<String>,
}

#[derive(Debug, Subcommand)]
enum PkiCommand {
    /// Create a CA (ca.pem, ca.key) and a server certificate (server.pem, server.key) in DIR.
    Init {
        /// The PKI directory.
        #[arg(long)]
        dir: PathBuf,
        /// DNS name or IP address of the appliance; repeat for several.
        #[arg(long = "san", required = true)]
        sans: Vec<String>,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Issue a client certificate NAME.pem / NAME.key carrying ROLE, signed by DIR's CA.
    Issue {
        /// The PKI directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// admin, controller, observer or node (a workload host: may only enrol for its keys).
        #[arg(long)]
        role: Role,
        /// The client's name (certificate common name and file name).
        #[arg(long)]
        name: String,
        /// Validity in days.
        #[arg(long, default_value_t = LEAF_DAYS)]
        days: u32,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Issue another appliance's server certificate NAME.pem / NAME.key, signed by DIR's CA: the
    /// appliances of a site share one CA (image/build.sh --pki puts it on a box).
    Server {
        /// The PKI directory holding ca.pem and ca.key.
        #[arg(long)]
        dir: PathBuf,
        /// The appliance's name (file name).
        #[arg(long)]
        name: String,
        /// DNS name or IP address of the appliance; repeat for several.
        #[arg(long = "san", required = true)]
        sans: Vec<String>,
        /// Validity in days.
        #[arg(long, default_value_t = LEAF_DAYS)]
        days: u32,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Create the firmware signing key: DIR/firmware-signing.key (keep it off the appliance)
    /// and DIR/firmware-signing.pub (image/build.sh bakes it into the image).
    FirmwareKey {
        /// Where to put the key pair.
        #[arg(long)]
        dir: PathBuf,
        /// Overwrite an existing key (appliances built with the old one will refuse bundles
        /// signed with the new one).
        #[arg(long)]
        force: bool,
    },
    /// Build and sign a firmware update bundle from a kernel and an initramfs.
    SignFirmware {
        /// The signing key (firmware-signing.key).
        #[arg(long)]
        key: PathBuf,
        /// The kernel image.
        #[arg(long)]
        kernel: PathBuf,
        /// The initramfs.
        #[arg(long)]
        initramfs: PathBuf,
        /// The firmware version the bundle installs.
        #[arg(long)]
        version: String,
        /// The target architecture.
        #[arg(long, default_value = std::env::consts::ARCH)]
        arch: String,
        /// The bundle to write.
        #[arg(long)]
        out: PathBuf,
        /// The pools the firmware reads, as its edgevold records them in its slot
        /// ("edgevol-pool-format 1 versions 3-4 compatible 0x0 read-only-compatible 0x0
        /// incompatible 0x0"): declared, signed, in the manifest, so appliances refuse an update
        /// that cannot read their pool. Without it the bundle declares nothing and is read as
        /// firmware that reads exactly pool format version 3 (what firmware predating the
        /// declaration accepts).
        #[arg(long)]
        pool_format: Option<String>,
    },
    /// Check a firmware bundle against a verification key, as the appliance does.
    VerifyFirmware {
        /// The bundle.
        #[arg(long)]
        bundle: PathBuf,
        /// The verification key (firmware-signing.pub).
        #[arg(long)]
        public: PathBuf,
        /// The architecture to expect.
        #[arg(long, default_value = std::env::consts::ARCH)]
        arch: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgevol: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Pki {
            command: PkiCommand::Init { dir, sans, force },
        } => {
            let (ca, server) = files::init(&dir, &sans, force).map_err(|e| e.to_string())?;
            print_pair("CA", &ca);
            print_pair("server", &server);
            Ok(())
        }
        Command::Pki {
            command:
                PkiCommand::Issue {
                    dir,
                    role,
                    name,
                    days,
                    force,
                },
        } => {
            files::check_name(&name)?;
            let pair = files::issue(&dir, role, &name, Validity::days(days), force)
                .map_err(|e| e.to_string())?;
            print_pair(&format!("{role} client {name:?}"), &pair);
            Ok(())
        }
        Command::Pki {
            command:
                PkiCommand::Server {
                    dir,
                    name,
                    sans,
                    days,
                    force,
                },
        } => {
            files::check_name(&name)?;
            let pair = files::issue_server(&dir, &name, &sans, Validity::days(days), force)
                .map_err(|e| e.to_string())?;
            print_pair(&format!("server {name:?}"), &pair);
            Ok(())
        }
        Command::Pki {
            command: PkiCommand::FirmwareKey { dir, force },
        } => {
            let files = firmware_keys::create_key(&dir, force)?;
            println!(
                "firmware signing key {}: {} (public {})",
                files.id,
                files.private.display(),
                files.public.display()
            );
            Ok(())
        }
        Command::Pki {
            command:
                PkiCommand::SignFirmware {
                    key,
                    kernel,
                    initramfs,
                    version,
                    arch,
                    out,
                    pool_format,
                },
        } => {
            let manifest = firmware_keys::sign(&SignRequest {
                key: &key,
                kernel: &kernel,
                initramfs: &initramfs,
                version: &version,
                arch: &arch,
                out: &out,
                pool_format: pool_format.as_deref(),
            })?;
            println!("bundle {}", out.display());
            print!("{}", firmware_keys::render_manifest(&manifest));
            Ok(())
        }
        Command::Pki {
            command:
                PkiCommand::VerifyFirmware {
                    bundle,
                    public,
                    arch,
                },
        } => {
            let manifest = firmware_keys::verify(&bundle, &public, &arch)?;
            println!("bundle {}: verified", bundle.display());
            print!("{}", firmware_keys::render_manifest(&manifest));
            Ok(())
        }
        Command::Proxy {
            listen,
            appliance,
            config,
            ca,
            cert,
            key,
            server_name,
            node_socket,
        } => {
            let path = proxy::socket_path(&listen)?;
            let specs = edgevol_cli::fleet_config::gather(&appliance, config.as_deref())?;
            let node = node_socket
                .as_deref()
                .map(proxy::socket_path)
                .transpose()?
                .map(edgevol_cli::node_route::NodeRoute::new);
            let tls = client_config(TlsFiles {
                ca: &ca,
                cert: &cert,
                key: &key,
            })
            .map_err(|e| e.to_string())?;
            let mut upstreams = Vec::with_capacity(specs.len());
            for spec in &specs {
                let name = spec.server_name.as_deref().or(server_name.as_deref());
                let upstream = proxy::Upstream::new(&spec.address, name, tls.clone())?;
                upstreams.push((spec.id.clone().unwrap_or_default(), upstream));
            }
            let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let listener = proxy::bind(&path).await?;
                for spec in &specs {
                    tracing::info!(socket = %path.display(), appliance = %spec.address, id = spec.id.as_deref().unwrap_or("-"), "proxy serving");
                }
                if upstreams.len() == 1 {
                    let (_, upstream) = upstreams.remove(0);
                    proxy::serve_with_node(listener, upstream, node, shutdown_signal()).await;
                } else {
                    proxy::serve_fleet(listener, upstreams, node, shutdown_signal()).await;
                }
                let _ = std::fs::remove_file(&path);
                Ok(())
            })
        }
        Command::Status { conn } => show(&conn, Show::Status),
        Command::Volumes { conn } => show(&conn, Show::Volumes),
        Command::Snapshots {
            command:
                Some(SnapshotsCommand::Diff {
                    appliance,
                    base,
                    target,
                    allocated,
                    starting_offset,
                }),
            ..
        } => {
            let what = match (allocated, base, target) {
                (Some(s), _, _) => status::diff::Diff::Allocated(s),
                (None, Some(base), Some(target)) => status::diff::Diff::Delta { base, target },
                _ => return Err("give --base and --target, or --allocated".into()),
            };
            snapshots_diff(&appliance, &what, starting_offset)
        }
        Command::Snapshots {
            appliance: Some(appliance),
            metrics,
            ..
        } => show(&Connection { appliance, metrics }, Show::Snapshots),
        Command::Snapshots { .. } => {
            Err("snapshots needs --appliance, --ca, --cert and --key (or `snapshots diff`)".into())
        }
        Command::Keys { command } => manage_keys(command),
        Command::Firmware { command } => manage_firmware(command),
    }
}

fn manage_keys(command: KeysCommand) -> Result<(), String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let text = runtime.block_on(async {
        match command {
            KeysCommand::Rotate { node, appliance } => {
                let channel = appliance.channel().await?;
                let generation = keys::rotate(&channel, &node).await?;
                Ok::<_, String>(keys::render_rotated(&node, generation))
            }
            KeysCommand::Revoke { node, appliance } => {
                let channel = appliance.channel().await?;
                let revoked = keys::revoke(&channel, &node).await?;
                Ok(keys::render_revoked(&node, &revoked))
            }
            KeysCommand::List { appliance } => {
                let channel = appliance.channel().await?;
                Ok(keys::render_list(&keys::list(&channel).await?))
            }
        }
    })?;
    print!("{text}");
    Ok(())
}

fn manage_firmware(command: FirmwareCommand) -> Result<(), String> {
    match command {
        FirmwareCommand::Remote(remote) => remote_firmware(remote),
        FirmwareCommand::BootFiles { out } => {
            for path in boot_files::write_factory(&out)? {
                println!("{}", path.display());
            }
            Ok(())
        }
        FirmwareCommand::FailTrial {
            exit_status,
            reason,
            boot_dir,
            public_key,
            version_file,
            cmdline,
        } => {
            let reason = match (exit_status, reason) {
                (Some(status), _) => fail_trial::exit_reason(status),
                (None, Some(text)) => edgevol_firmware::slots::Reason::HealthCheckFailed(text),
                (None, None) => return Err("give --exit-status or --reason".into()),
            };
            let paths = fail_trial::Paths {
                boot_dir,
                public_key,
                version_file,
                cmdline,
            };
            match fail_trial::fail_trial(&paths, reason)? {
                Outcome::RolledBack(slot) => {
                    println!("trial failed: slot {slot} boots next");
                    Ok(())
                }
                Outcome::NotOnTrial => {
                    println!("not a trial boot: nothing changed");
                    std::process::exit(NOT_ON_TRIAL)
                }
            }
        }
    }
}

/// `fail-trial`'s exit status outside a trial boot (init then keeps the box up).
const NOT_ON_TRIAL: i32 = 3;

fn remote_firmware(command: RemoteFirmware) -> Result<(), String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let text = runtime.block_on(async {
        match command {
            RemoteFirmware::Status { appliance } => {
                let channel = appliance.channel().await?;
                Ok::<_, String>(firmware::render_status(&firmware::status(&channel).await?))
            }
            RemoteFirmware::Update { bundle, appliance } => {
                let channel = appliance.channel().await?;
                Ok(firmware::render_updated(
                    &firmware::update(&channel, &bundle).await?,
                ))
            }
            RemoteFirmware::Activate { appliance } => {
                let channel = appliance.channel().await?;
                let slot = firmware::activate(&channel).await?;
                Ok(format!("rebooting into slot {slot}\n"))
            }
            RemoteFirmware::Rollback { appliance, force } => {
                let channel = appliance.channel().await?;
                let slot = firmware::rollback(&channel, force).await?;
                Ok(format!(
                    "the next boot runs slot {slot} (`edgevol firmware activate` reboots now)\n"
                ))
            }
        }
    })?;
    print!("{text}");
    Ok(())
}

fn show(conn: &Connection, what: Show) -> Result<(), String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let text = runtime.block_on(async {
        let channel = conn.appliance.channel().await?;
        match what {
            Show::Status => {
                let report = status::status(&channel, conn.metrics.as_deref()).await?;
                Ok::<_, String>(status::render_status(&report))
            }
            Show::Volumes => {
                let rows = status::volumes(&channel).await?;
                let metrics = match &conn.metrics {
                    Some(addr) => Some(status::fetch_metrics(addr).await?),
                    None => None,
                };
                Ok(status::render_volumes(&rows, metrics.as_ref()))
            }
            Show::Snapshots => Ok(status::render_snapshots(
                &status::snapshots(&channel).await?,
            )),
        }
    })?;
    print!("{text}");
    Ok(())
}

fn snapshots_diff(
    appliance: &Appliance,
    what: &status::diff::Diff,
    starting_offset: i64,
) -> Result<(), String> {
    use std::io::Write as _;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let channel = appliance.channel().await?;
        let mut stdout = std::io::stdout().lock();
        let mut failed = None;
        let totals = status::diff::stream(&channel, what, starting_offset, &mut |text| {
            if failed.is_none() {
                failed = stdout.write_all(text.as_bytes()).err();
            }
        })
        .await?;
        if let Some(e) = failed {
            return Err(format!("writing the ranges: {e}"));
        }
        stdout
            .write_all(status::diff::summary(what, &totals).as_bytes())
            .map_err(|e| format!("writing the ranges: {e}"))
    })
}

enum Show {
    Status,
    Volumes,
    Snapshots,
}

fn print_pair(what: &str, pair: &Pair) {
    println!(
        "{what}: {} (key {})",
        pair.cert.display(),
        pair.key.display()
    );
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
