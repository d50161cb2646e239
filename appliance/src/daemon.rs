//! Starting and stopping the daemon.
//!
//! Everything that can be refused (data dir, lock, host-key store, PKI, TLS files, the listen
//! address) is checked before the first connection is accepted, so a bad start exits with one
//! line and never leaves a half-started daemon. The pool then opens in the background: Probe answers
//! `ready=false` until it has, and the daemon stops with an error if it cannot, or if opening it
//! or another task it cannot do without panics ([`watch`]).

mod watch;

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use edgevol_pki::tls::{server_config, TlsFiles};
use edgevol_pki::PkiError;
use edgevol_proto::edgevol::v1::enrolment_server::EnrolmentServer;
use edgevol_proto::edgevol::v1::firmware_server::FirmwareServer;
use edgevol_proto::edgevol::v1::host_keys_server::HostKeysServer;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::auth::AuthLayer;
use crate::config::{self, Config, TOPOLOGY_KEY};
use crate::hostkeys::service::{EnrolmentService, HostKeysService};
use crate::hostkeys::HostKeys;
use crate::nvme::TargetInfo;
use crate::pool;
use crate::state::{PoolUnavailable, State};
use crate::transport;

/// Why the daemon could not start or had to stop. Each renders as one line.
#[derive(Debug)]
pub enum DaemonError {
    /// The data directory is unusable.
    DataDir {
        /// The directory or file in it.
        path: PathBuf,
        /// What went wrong.
        error: io::Error,
    },
    /// Another daemon holds the data directory.
    Locked(PathBuf),
    /// The appliance id is invalid.
    Config(config::ConfigError),
    /// A PKI or TLS file is missing or unusable.
    Pki(PkiError),
    /// The listen address cannot be bound.
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the OS said.
        error: io::Error,
    },
    /// The pool could not be opened.
    Pool(pool::PoolError),
    /// The host-key store could not be read (missing is fine; damaged, or written by newer
    /// firmware, is not).
    HostKeys(crate::hostkeys::StoreError),
    /// Firmware management could not start.
    Firmware(crate::firmware::StartError),
    /// The gRPC server failed.
    Serve(tonic::transport::Error),
    /// The server task died.
    Task(String),
    /// A task the daemon cannot do without panicked (a bug): the daemon stops, and exits with
    /// [`DaemonError::exit_code`] for its supervisor to restart it.
    Panicked {
        /// Which task.
        task: &'static str,
        /// The panic's message.
        message: String,
    },
}

impl DaemonError {
    /// The exit status for this error: [`crate::nvme::workers::PANIC_EXIT`] (EX_SOFTWARE) for a
    /// panic, [`pool::UNSUPPORTED_EXIT`] (EX_CONFIG) for a pool this firmware cannot read,
    /// [`crate::hostkeys::file::TOO_NEW_EXIT`] for a host-key store or firmware state record
    /// newer firmware wrote, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            DaemonError::Panicked { .. } => crate::nvme::workers::PANIC_EXIT,
            DaemonError::Pool(pool::PoolError::Unsupported { .. }) => pool::UNSUPPORTED_EXIT,
            DaemonError::HostKeys(crate::hostkeys::StoreError::TooNew { .. })
            | DaemonError::Firmware(crate::firmware::StartError::Manager(
                edgevol_firmware::manager::FirmwareError::StoreTooNew(_),
            )) => crate::hostkeys::file::TOO_NEW_EXIT,
            _ => 1,
        }
    }
}

impl fmt::Display for DaemonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DaemonError::DataDir { path, error } => {
                write!(f, "data dir {}: {error}", path.display())
            }
            DaemonError::Locked(path) => write!(
                f,
                "data dir lock {} is held by another edgevold",
                path.display()
            ),
            DaemonError::Config(e) => write!(f, "{e}"),
            DaemonError::Pki(e) => write!(f, "TLS: {e}"),
            DaemonError::Listen { addr, error } => write!(f, "listen {addr}: {error}"),
            DaemonError::Pool(e) => write!(f, "pool: {e}"),
            DaemonError::HostKeys(e) => write!(f, "{e}"),
            DaemonError::Firmware(e) => write!(f, "{e}"),
            DaemonError::Serve(e) => write!(f, "gRPC server: {e}"),
            DaemonError::Task(e) => write!(f, "server task: {e}"),
            DaemonError::Panicked { task, message } => {
                write!(f, "{task} panicked (a bug; restarting recovers): {message}")
            }
        }
    }
}

impl std::error::Error for DaemonError {}

/// A started daemon.
#[derive(Debug)]
pub struct Running {
    /// Where the CSI endpoint listens.
    pub local_addr: SocketAddr,
    /// Where the Prometheus exporter listens, if it runs.
    pub metrics_addr: Option<SocketAddr>,
    /// The shared state.
    pub state: Arc<State>,
    /// The NVMe/TCP target, as the control plane sees it.
    pub target: TargetInfo,
    /// The nodes' data-path keys.
    pub host_keys: Arc<HostKeys>,
    stop: Arc<Notify>,
    task: JoinHandle<Result<(), DaemonError>>,
    _lock: File,
    _device_locks: Vec<pool::DeviceLock>,
}

impl Running {
    /// Stops accepting, lets calls in flight finish, and waits for the end.
    pub async fn stop(mut self) -> Result<(), DaemonError> {
        self.request_stop();
        self.wait().await
    }

    /// Waits until the daemon ends by itself (a fatal error) or is stopped.
    pub async fn wait(&mut self) -> Result<(), DaemonError> {
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join) => Err(watch::panicked("server task", join)),
        }
    }

    /// Asks the daemon to stop without waiting.
    pub fn request_stop(&self) {
        self.stop.notify_one();
    }
}

/// Checks everything, binds, and starts serving.
pub async fn start(config: Config) -> Result<Running, DaemonError> {
    let data_dir = &config.data_dir;
    prepare_data_dir(data_dir)?;
    let lock = lock_data_dir(data_dir)?;
    // Held, like the data dir, until the daemon stops: `edgevold format` refuses a held device.
    let device_locks =
        pool::lock_devices(&config.devices, config.dev).map_err(DaemonError::Pool)?;
    if config.dev {
        edgevol_pki::files::ensure_dev(&data_dir.join("pki")).map_err(DaemonError::Pki)?;
    }
    let host_keys = Arc::new(HostKeys::open(data_dir).map_err(DaemonError::HostKeys)?);
    // Before anything serves: this boot is recorded (trial, or fallback from one) first.
    let firmware = match &config.firmware {
        Some(fc) => Some((
            crate::firmware::start(fc).map_err(DaemonError::Firmware)?,
            fc.clone(),
        )),
        None => None,
    };
    // On an appliance image the plugin's version is the firmware's: an update shows in
    // GetPluginInfo once the new slot runs.
    let vendor_version = match &firmware {
        // The version never changes while running: a poisoned lock still holds it.
        Some((fw, _)) => fw
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .running_version()
            .to_owned(),
        None => edgevol_driver::identity::VENDOR_VERSION.to_owned(),
    };
    // Messages about a pool this firmware cannot read (or write) name this version.
    crate::pool_words::set_firmware_version(&vendor_version);
    if let Some(warning) = config.host_auth.warning() {
        tracing::warn!("{warning}");
    }
    let appliance_id = match &config.appliance_id {
        Some(id) => id.clone(),
        None => persisted_appliance_id(data_dir)?,
    };
    let tls = server_config(TlsFiles {
        ca: &config.tls.ca,
        cert: &config.tls.cert,
        key: &config.tls.key,
    })
    .map_err(DaemonError::Pki)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|error| DaemonError::Listen {
            addr: config.listen,
            error,
        })?;
    let local_addr = listener.local_addr().map_err(|error| DaemonError::Listen {
        addr: config.listen,
        error,
    })?;

    let metrics_listener = bind_metrics(&config).await?;

    let mut topology = config.topology.clone();
    topology.insert(TOPOLOGY_KEY.to_owned(), appliance_id.clone());
    let state = Arc::new(State::new(appliance_id, topology));
    let host_auth = crate::nvme::auth::HostAuth::new(host_keys.clone(), config.host_auth.clone());
    let target = crate::nvme::start(state.clone(), &config.nvme, host_auth)
        .await
        .map_err(|e| DaemonError::Listen {
            addr: e.addr,
            error: e.error,
        })?;

    // Stopped by `Running::stop`, or by the failure of a task in `watched`.
    let stop = Arc::new(Notify::new());
    let pool_open = {
        let state = state.clone();
        let (devices, dev, blank) = (config.devices.clone(), config.dev, config.format_blank);
        let fw = firmware.as_ref().map(|(fw, _)| fw.clone());
        tokio::task::spawn_blocking(move || {
            let mut pool = open_pool(&devices, dev, blank).map_err(DaemonError::Pool)?;
            // Before the pool is installed: the firmware service refuses updates and rollbacks
            // until this told it the pool in use.
            crate::pool_features::after_open(&mut pool, fw.as_ref());
            let c = pool.capacity();
            state.set_pool(pool);
            tracing::info!(
                total = c.total,
                free = c.free,
                used = c.used,
                "pool open: ready"
            );
            Ok(())
        })
    };

    // Each part gets the handles it needs: the state knows nothing of the target or metrics.
    let target_info = target.info();
    let registry = Arc::new(crate::metrics::Registry::default());
    if let Some((fw, _)) = &firmware {
        registry.watch_firmware(fw.clone());
    }
    let metrics = match metrics_listener {
        Some(listener) => {
            let sources = Arc::new(crate::metrics::Sources {
                state: state.clone(),
                subsystems: Some(target.subsystems.clone()),
                devices: config.devices.clone(),
                registry: registry.clone(),
            });
            Some(
                crate::metrics::MetricsServer::start(listener, sources).map_err(|error| {
                    DaemonError::Listen {
                        addr: config.metrics.listen.unwrap_or(config.listen),
                        error,
                    }
                })?,
            )
        }
        None => None,
    };
    let metrics_addr = metrics.as_ref().map(|m| m.local_addr);

    let server = tonic::transport::Server::builder()
        .layer(crate::metrics::csi::CsiMetricsLayer::new(registry))
        .layer(AuthLayer)
        .add_routes(crate::csi::routes(
            &state,
            Some(target_info.clone()),
            vendor_version,
        ))
        .add_service(HostKeysServer::new(HostKeysService::new(host_keys.clone())))
        .add_service(EnrolmentServer::new(EnrolmentService::new(
            host_keys.clone(),
        )))
        .add_optional_service(firmware.as_ref().map(|(fw, fc)| {
            FirmwareServer::new(crate::firmware::service::FirmwareService::new(
                fw.clone(),
                crate::firmware::Reboot::new(fc.reboot_command.clone(), state.clone()),
            ))
            // A bundle streams in chunks; each message stays small.
        }));
    let csi_serving = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let health = firmware.map(|(fw, fc)| {
        let probes = crate::firmware::health::Probes {
            state: state.clone(),
            csi_serving: csi_serving.clone(),
            // The listener itself, not the advertised address: a box without its storage link
            // is still healthy enough to keep (the operator may be fixing the network).
            nvme: loopback_if_unspecified(SocketAddr::new(
                config.nvme.listen.ip(),
                target_info.endpoint.port(),
            )),
        };
        tokio::spawn(crate::firmware::health::supervise(
            fw,
            probes,
            fc.health_hold,
            fc.watchdog,
            crate::firmware::Reboot::new(fc.reboot_command, state.clone()),
        ))
    });
    let incoming = transport::incoming(listener, tls);
    // The power-loss window: unflushed writes become durable every `sync_interval`.
    let stop_sync = Arc::new(Notify::new());
    let sync = tokio::spawn(crate::sync::run(
        state.clone(),
        config.sync_interval,
        stop_sync.clone(),
    ));
    let mut watched = watch::Watched {
        pool_open: Some(pool_open),
        health,
        sync: Some(sync),
    };
    let task = {
        let (stop, state) = (stop.clone(), state.clone());
        tokio::spawn(async move {
            csi_serving.store(true, std::sync::atomic::Ordering::Release);
            let (mut fatal, mut shut_down) = (None, false);
            let served = server
                .serve_with_incoming_shutdown(incoming, async {
                    fatal = watched.until_stop_or_failure(&stop).await;
                    shut_down = true;
                })
                .await;
            // The listener's accept task ended (a panic) and the server with it: not a stop.
            if served.is_ok() && !shut_down {
                fatal = Some(DaemonError::Task("the CSI listener ended".to_owned()));
            }
            csi_serving.store(false, std::sync::atomic::Ordering::Release);
            if let Some(e) = &fatal {
                tracing::error!(error = %e, "stopping");
            }
            // No more health: a watchdog stops being petted, as it should when the daemon ends.
            if let Some(health) = watched.health.take() {
                health.abort();
            }
            stop_sync.notify_one();
            if let Some(Err(e)) = watched.sync_stopped().await {
                fatal.get_or_insert(e);
            }
            served.map_err(DaemonError::Serve)?;
            target.stop().await;
            if let Some(metrics) = metrics {
                metrics.stop().await;
            }
            // Calls have drained: make the data path's allocations durable before exiting.
            tokio::task::spawn_blocking(move || flush_pool(&state))
                .await
                .map_err(|e| watch::panicked("pool flush", e))??;
            fatal.map_or(Ok(()), Err)
        })
    };
    Ok(Running {
        local_addr,
        metrics_addr,
        state,
        target: target_info,
        host_keys,
        stop,
        task,
        _lock: lock,
        _device_locks: device_locks,
    })
}

/// Where to reach a listener bound to 0.0.0.0 or [::] from this host.
fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// Binds the exporter's listener (see [`config::MetricsConfig`] for when a failure only warns).
async fn bind_metrics(config: &Config) -> Result<Option<TcpListener>, DaemonError> {
    let Some(addr) = config.metrics.listen else {
        return Ok(None);
    };
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(Some(listener)),
        Err(error) if config.metrics.best_effort => {
            tracing::warn!(%addr, %error, "metrics exporter not started (dev default address in use)");
            Ok(None)
        }
        Err(error) => Err(DaemonError::Listen { addr, error }),
    }
}

/// [`pool::open_with`]; in test builds, a device named [`PANICS_ON_OPEN`] panics instead.
fn open_pool(
    devices: &[PathBuf],
    dev: bool,
    blank: bool,
) -> Result<edgevol_core::Pool<pool::PoolDevice>, pool::PoolError> {
    #[cfg(test)]
    if devices.iter().any(|d| d.ends_with(PANICS_ON_OPEN)) {
        panic!("injected panic opening the pool");
    }
    pool::open_with(devices, dev, blank)
}

/// Test builds: the pool device name whose open panics.
#[cfg(test)]
const PANICS_ON_OPEN: &str = "panics-on-open.img";

fn flush_pool(state: &State) -> Result<(), DaemonError> {
    let mut pool = match state.lock_pool() {
        Ok(pool) => pool,
        Err(PoolUnavailable::NotReady) => return Ok(()),
        Err(e) => return Err(DaemonError::Task(e.to_string())),
    };
    pool.flush()
        .map_err(|e| DaemonError::Pool(pool::PoolError::Flush(e)))
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> DaemonError + '_ {
    move |error| DaemonError::DataDir {
        path: path.to_path_buf(),
        error,
    }
}

/// Creates the data directory when missing (its parents as usual, itself private, 0700: it holds
/// the host-key store and, in dev mode, the CA's key); an existing one keeps its mode. Then
/// checks it is a directory that can be read.
fn prepare_data_dir(dir: &Path) -> Result<(), DaemonError> {
    if !dir.exists() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(io_err(parent))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => tracing::info!(data_dir = %dir.display(), "created the data directory"),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(dir)(e)),
        }
    }
    let meta = fs::metadata(dir).map_err(io_err(dir))?;
    if !meta.is_dir() {
        return Err(DaemonError::DataDir {
            path: dir.to_path_buf(),
            error: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
        });
    }
    fs::read_dir(dir).map_err(io_err(dir))?;
    Ok(())
}

/// One daemon per data dir: two would corrupt the pool.
fn lock_data_dir(dir: &Path) -> Result<File, DaemonError> {
    let path = dir.join("edgevold.lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(fs::TryLockError::WouldBlock) => Err(DaemonError::Locked(path)),
        Err(fs::TryLockError::Error(e)) => Err(io_err(&path)(e)),
    }
}

/// The id kept in `DIR/appliance-id`, generated on first start.
fn persisted_appliance_id(dir: &Path) -> Result<String, DaemonError> {
    let path = dir.join("appliance-id");
    match fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim().to_owned();
            config::check_appliance_id(&id).map_err(|e| {
                DaemonError::Config(config::ConfigError(format!("{}: {e}", path.display())))
            })?;
            Ok(id)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let uuid = fs::read_to_string("/proc/sys/kernel/random/uuid").map_err(io_err(&path))?;
            let id = format!("ev-{}", &uuid.trim().replace('-', "")[..12]);
            let tmp = dir.join("appliance-id.tmp");
            let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
            writeln!(file, "{id}").map_err(io_err(&tmp))?;
            file.sync_all().map_err(io_err(&tmp))?;
            fs::rename(&tmp, &path).map_err(io_err(&path))?;
            Ok(id)
        }
        Err(e) => Err(io_err(&path)(e)),
    }
}

#[cfg(test)]
mod tests;
