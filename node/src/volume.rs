//! The node's volume operations, in host terms: stage, publish, unpublish, unstage, stats,
//! expand. The CSI handlers only convert requests into these and errors into statuses.
//!
//! Every step asks the kernel first (is a controller to this target connected? which disk
//! carries this NGUID? what is mounted at this path?) and does only what is missing, so a CO
//! retrying after a failure or a crash at any step converges. Mutating operations are
//! serialized by one lock: they are rare, and "is this controller still used by another
//! staged volume?" must not race with a concurrent stage.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::appliances::{ApplianceKeys, KeyScope};
use crate::auth_support::{self, AuthSupport};
use crate::crypt::{self, Encryption, KdfConfig, Keys, Passphrase};
use crate::error::{Error, Result};
use crate::fabrics::{self, Auth, FabricsConfig, HostIdentity, KeyUpdate, Target};
use crate::fs as filesystem;
use crate::host::{FsUsage, Host};
use crate::keys::{DhchapKeys, KeySource};
use crate::mount::{self, MountEntry};
use crate::state::{Publication, StagedVolume, StateStore};
use crate::sysfs::{self, Controller, FailFast, Namespace, NamespaceId};

mod replicated;
pub use replicated::DEFAULT_LEG_FAST_IO_FAIL_TMO;

/// Mount or block access.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Access {
    /// A filesystem mounted at the staging path.
    Mount {
        /// `ext4` or `xfs`.
        fs_type: String,
        /// mount(8) options from the capability.
        mount_flags: Vec<String>,
    },
    /// The raw namespace.
    Block,
}

/// CSI access modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// True for the reader-only modes.
    pub fn read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }

    fn multi_node_writer(self) -> bool {
        matches!(
            self,
            AccessMode::MultiNodeSingleWriter | AccessMode::MultiNodeMultiWriter
        )
    }
}

/// A volume capability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// Mount or block.
    pub access: Access,
    /// Access mode.
    pub mode: AccessMode,
}

/// NodeStageVolume, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageRequest {
    /// Volume id.
    pub volume_id: String,
    /// Absolute staging path.
    pub staging_path: PathBuf,
    /// Capability (fs type already resolved).
    pub capability: Capability,
    /// The subsystem.
    pub target: Target,
    /// The namespace.
    pub namespace: NamespaceId,
    /// An encrypted volume's mapping and passphrases; `None` for a plain volume.
    pub encrypted: Option<EncryptedStage>,
}

/// What staging an encrypted volume needs beyond a plain one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncryptedStage {
    /// Mapping name and discards (what the record keeps).
    pub encryption: Encryption,
    /// The passphrases from NodeStageVolume's secrets (never recorded).
    pub keys: Keys,
}

/// NodePublishVolume, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishRequest {
    /// Volume id.
    pub volume_id: String,
    /// Absolute staging path.
    pub staging_path: PathBuf,
    /// Absolute target path.
    pub target_path: PathBuf,
    /// Mount or block, and the mode.
    pub capability: Capability,
    /// Publish read-only.
    pub read_only: bool,
}

/// NodeExpandVolume, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandRequest {
    /// Volume id.
    pub volume_id: String,
    /// Where the volume is staged or published (absolute).
    pub volume_path: PathBuf,
    /// capacity_range.required_bytes (0 = not given).
    pub required_bytes: u64,
    /// capacity_range.limit_bytes (0 = no limit).
    pub limit_bytes: u64,
    /// The access the request's volume_capability names, if it has one; a mount's `fs_type`
    /// is empty when the capability leaves it unnamed.
    pub access: Option<Access>,
    /// The passphrase in the request's secrets, if any (an encrypted volume's mapping grows
    /// with the key the kernel holds; this one serves a host whose cryptsetup cannot read it).
    pub key: Option<Passphrase>,
}

/// Usage of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// A mounted filesystem.
    Filesystem(FsUsage),
    /// A block device of this many bytes.
    Block(u64),
}

/// NodeGetVolumeStats' answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStats {
    /// Usage.
    pub usage: Usage,
    /// `Some(message)` when the volume is abnormal.
    pub abnormal: Option<String>,
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct VolumeConfig {
    /// The host's NVMe identity.
    pub host: HostIdentity,
    /// Connection tunables.
    pub fabrics: FabricsConfig,
    /// How long to wait for a namespace and its device node (udev), or for a new size.
    pub device_wait: Duration,
    /// Poll interval of those waits.
    pub poll: Duration,
}

/// The volume operations of one node.
#[derive(Debug)]
pub struct Volumes {
    host: Arc<dyn Host>,
    store: StateStore,
    cfg: VolumeConfig,
    lock: Mutex<()>,
    /// Where the node's DH-HMAC-CHAP keys come from, per appliance; `None`: connect without
    /// keys.
    keys: Option<ApplianceKeys>,
    /// Per key scope (appliance), the key generation every controller of a staged volume of
    /// it was last given (in memory only: after a restart the first enrolment checks them all).
    generation: Mutex<HashMap<KeyScope, u64>>,
    /// `fast_io_fail_tmo` of a replicated volume's legs (md carries their I/O).
    leg_fast_io_fail_tmo: i32,
    /// How encrypted volumes' key slots are made.
    kdf: KdfConfig,
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

impl Volumes {
    /// Volume operations on `host`, recording state in `store`.
    pub fn new(host: Arc<dyn Host>, store: StateStore, cfg: VolumeConfig) -> Self {
        Volumes {
            host,
            store,
            cfg,
            lock: Mutex::new(()),
            keys: None,
            generation: Mutex::new(HashMap::new()),
            leg_fast_io_fail_tmo: DEFAULT_LEG_FAST_IO_FAIL_TMO,
            kdf: crypt::DEFAULT_KDF,
        }
    }

    /// Formats and re-keys encrypted volumes' LUKS2 key slots with this KDF.
    pub fn with_kdf(mut self, kdf: KdfConfig) -> Self {
        self.kdf = kdf;
        self
    }

    /// Connects with the keys `source` gives (enrolment with the appliance) from now on, for
    /// every appliance.
    pub fn with_keys(self, source: Arc<dyn KeySource>) -> Self {
        self.with_appliance_keys(ApplianceKeys::single(source))
    }

    /// Connects with the keys each appliance's enrolment gives (none when `keys` is empty).
    pub fn with_appliance_keys(mut self, keys: ApplianceKeys) -> Self {
        self.keys = (!keys.is_empty()).then_some(keys);
        self
    }

    /// Connects the legs of replicated volumes with this `fast_io_fail_tmo` (seconds).
    pub fn with_leg_fast_io_fail_tmo(mut self, secs: i32) -> Self {
        self.leg_fast_io_fail_tmo = secs;
        self
    }

    /// True when connects authenticate.
    pub fn uses_keys(&self) -> bool {
        self.keys.is_some()
    }

    /// Enrols with the appliance of `target` (when keys are configured) and hands a new
    /// generation to the controllers of that appliance's staged volumes. Call with the
    /// operation lock held.
    fn enrol(&self, target: &Target) -> Result<Option<DhchapKeys>> {
        let Some(sources) = &self.keys else {
            return Ok(None);
        };
        let (scope, source) = sources.for_subsystem(&target.subsysnqn)?;
        let keys = source.enrol(&self.cfg.host.nqn)?;
        self.roll_keys(&scope, &keys)?;
        Ok(Some(keys))
    }

    /// When `keys` are of another generation than the controllers were last given (or none
    /// since the start), writes them to every controller of a staged volume that holds other
    /// secrets: the kernel re-authenticates each of its queues with them, and uses them for
    /// its reconnects, so live volumes keep working after a rotation and the appliance can
    /// drop the old pair. Returns how many controllers it updated. The generation is noted
    /// only when every controller has it: a failure is retried at the next enrolment.
    fn roll_keys(&self, scope: &KeyScope, keys: &DhchapKeys) -> Result<usize> {
        let mut generations = self
            .generation
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let known = generations.get(scope).copied();
        if known == Some(keys.generation) {
            return Ok(0);
        }
        let mut seen = Vec::new();
        let (mut updated, mut failed) = (0, 0);
        let sources = self.keys.as_ref();
        let records = self.store.all()?;
        let targets = records
            .iter()
            .flat_map(|rec| rec.targets().into_iter().map(move |t| (rec, t)));
        for (rec, target) in targets {
            if sources.map(|s| s.scope_of(&target.subsysnqn)).as_ref() != Some(scope) {
                continue;
            }
            let Some(c) = fabrics::find_controller(&*self.host, target, &self.cfg.host)? else {
                continue;
            };
            if seen.contains(&c.name) {
                continue;
            }
            seen.push(c.name.clone());
            match fabrics::apply_keys(&*self.host, &c, keys) {
                Ok(KeyUpdate::Updated) => {
                    tracing::info!(controller = %c.name, generation = keys.generation,
                        "new DH-HMAC-CHAP keys given to the controller (it re-authenticates)");
                    updated += 1;
                }
                Ok(KeyUpdate::Unchanged) => {}
                Ok(KeyUpdate::NoKeys) => tracing::warn!(controller = %c.name,
                    volume_id = %rec.volume_id,
                    "controller connected without DH-HMAC-CHAP keys: the kernel takes no keys \
                    for it, and its reconnects fail once the appliance requires them; unstage \
                    and stage the volume to connect it with keys"),
                Ok(KeyUpdate::Unsupported) => tracing::warn!(controller = %c.name,
                    "this kernel has no NVMe authentication: the controller cannot take keys"),
                Err(e) => {
                    tracing::warn!(controller = %c.name, error = %e,
                        "could not give the controller the new DH-HMAC-CHAP keys; retried at \
                        the next enrolment");
                    failed += 1;
                }
            }
        }
        if failed == 0 {
            if known.is_some_and(|g| g != keys.generation) {
                tracing::info!(
                    appliance = scope.as_deref().unwrap_or("(every)"),
                    generation = keys.generation,
                    controllers = updated,
                    "DH-HMAC-CHAP keys rotated"
                );
            }
            generations.insert(scope.clone(), keys.generation);
        }
        Ok(updated)
    }

    /// Enrols again with every appliance and, on a new key generation, gives the new keys to
    /// every controller of a staged volume of that appliance (the periodic refresh). Returns
    /// how many controllers took new keys. One appliance that cannot be reached does not keep
    /// the others' keys from rolling: its error is returned after all were tried.
    pub fn refresh_keys(&self) -> Result<usize> {
        let _guard = self.guard();
        let Some(sources) = &self.keys else {
            return Ok(0);
        };
        let (mut updated, mut first_error) = (0, None);
        for (scope, source) in sources.all() {
            match source
                .enrol(&self.cfg.host.nqn)
                .and_then(|keys| self.roll_keys(&scope, &keys))
            {
                Ok(n) => updated += n,
                Err(e) => {
                    if first_error.is_some() {
                        tracing::warn!(appliance = scope.as_deref().unwrap_or("(every)"),
                            error = %e, "enrolment to look for rotated keys failed");
                    }
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(updated),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &VolumeConfig {
        &self.cfg
    }

    fn guard(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic while holding the lock leaves no in-memory state to protect: keep going.
        self.lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn device_path(&self, disk: &str) -> PathBuf {
        self.host.dev_root().join(disk)
    }

    fn namespace_id(rec: &StagedVolume) -> NamespaceId {
        NamespaceId {
            nguid: rec.nguid.clone(),
            uuid: rec.uuid.clone(),
        }
    }

    fn find_namespace(&self, id: &NamespaceId) -> Result<Option<Namespace>> {
        sysfs::find_namespace(&*self.host, id)
            .map_err(|e| Error::io("looking up the namespace", &e))
    }

    /// Waits (bounded) for the namespace to show in sysfs and its device node in /dev.
    fn wait_for_namespace(&self, id: &NamespaceId, controller: &str) -> Result<Namespace> {
        let mut waited = Duration::ZERO;
        loop {
            if let Some(ns) = self.find_namespace(id)? {
                if self.device_path(&ns.disk).exists() {
                    return Ok(ns);
                }
            }
            if waited >= self.cfg.device_wait {
                return Err(Error::Unavailable(format!(
                    "controller {controller} is connected but no namespace with NGUID {} / UUID {} \
                     and a device node appeared within {:?}",
                    id.nguid.as_deref().unwrap_or("-"),
                    id.uuid.as_deref().unwrap_or("-"),
                    self.cfg.device_wait
                )));
            }
            self.host.sleep(self.cfg.poll);
            waited += self.cfg.poll;
        }
    }

    /// NodeStageVolume.
    pub fn stage(&self, req: &StageRequest) -> Result<()> {
        let _guard = self.guard();
        if let Access::Mount { fs_type, .. } = &req.capability.access {
            filesystem::check_supported(fs_type)?;
            if req.capability.mode.multi_node_writer() {
                return Err(Error::FailedPrecondition(format!(
                    "volume {}: {fs_type} cannot be written from several nodes; multi-node \
                     writer modes need block access",
                    req.volume_id
                )));
            }
        }
        let mut rec = match self.store.get(&req.volume_id)? {
            Some(rec) => {
                if rec.staging_path != req.staging_path {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {} is already staged at {}, not {}",
                        req.volume_id,
                        path_str(&rec.staging_path),
                        path_str(&req.staging_path)
                    )));
                }
                if rec.capability != req.capability {
                    return Err(Error::AlreadyExists(format!(
                        "volume {} is already staged at {} with capability {:?}, incompatible \
                         with {:?}",
                        req.volume_id,
                        path_str(&rec.staging_path),
                        rec.capability,
                        req.capability
                    )));
                }
                if rec.target != req.target || Self::namespace_id(&rec) != req.namespace {
                    return Err(Error::AlreadyExists(format!(
                        "volume {} is already staged from another subsystem or namespace",
                        req.volume_id
                    )));
                }
                Self::check_same_encryption(&rec, req.encrypted.as_ref())?;
                rec
            }
            None => {
                let rec = StagedVolume {
                    volume_id: req.volume_id.clone(),
                    staging_path: req.staging_path.clone(),
                    capability: req.capability.clone(),
                    target: req.target.clone(),
                    nguid: req.namespace.nguid.clone(),
                    uuid: req.namespace.uuid.clone(),
                    controller: None,
                    disk: None,
                    publications: Vec::new(),
                    replicated: None,
                    encrypted: req.encrypted.as_ref().map(|e| e.encryption.clone()),
                };
                self.store.put(&rec)?;
                rec
            }
        };

        // Nothing was connected for a new record: its intent goes with a refusal, so a volume
        // that does not exist (or cannot be reached with keys) leaves nothing behind.
        let forget = |e: Error| -> Result<()> {
            if rec.controller.is_none() {
                self.store.remove(&req.volume_id)?;
            }
            Err(e)
        };
        let connected = fabrics::find_controller(&*self.host, &req.target, &self.cfg.host)?;
        // Nothing connects without the kernel's initiator: say which module and the fix first.
        if connected.is_none() {
            if let Err(e) = crate::initiator::require_fabrics(&*self.host, &req.volume_id) {
                return forget(e);
            }
        }
        if req.encrypted.is_some() {
            if let Err(e) = crypt::require_dm_crypt(&*self.host, &req.volume_id) {
                return forget(e);
            }
        }
        let keys = match self.enrol(&req.target) {
            Ok(k) => k,
            Err(e) if connected.is_none() => return forget(e),
            Err(e) => {
                // The controller is there already: no connect needs the keys.
                tracing::warn!(volume_id = %req.volume_id, error = %e,
                    "enrolment failed; staging goes on with the connected controller");
                None
            }
        };
        let auth = match self.connect_auth(&req.volume_id, keys.as_ref(), connected.is_some()) {
            Ok(auth) => auth,
            Err(e) => return forget(e),
        };
        let controller = match fabrics::ensure_connected(
            &*self.host,
            &req.target,
            &self.cfg.host,
            &self.cfg.fabrics,
            auth,
        ) {
            Ok(c) => c,
            Err(e @ (Error::NotFound(_) | Error::FailedPrecondition(_))) => return forget(e),
            Err(e) => return Err(e),
        };
        drop(keys);
        let ns = self.wait_for_namespace(&req.namespace, &controller)?;
        let staged = match &req.encrypted {
            Some(e) => self.open_encrypted(&req.volume_id, &ns.disk, e, &req.capability)?,
            None => ns,
        };
        if rec.controller.as_deref() != Some(&controller)
            || rec.disk.as_deref() != Some(&staged.disk)
        {
            rec.controller = Some(controller);
            rec.disk = Some(staged.disk.clone());
            self.store.put(&rec)?;
        }

        self.mount_staging(
            &req.staging_path,
            &req.capability,
            &staged.disk,
            &staged.dev,
        )
    }

    /// The roots in the mount table of a bind of block volume `rec`'s device node (`disk` in
    /// /dev): `/nvme1n1`, `/md127`, `/dm-3`; for an encrypted volume also `/mapper/<mapping>`,
    /// as mount(8) (libmount) canonicalises `/dev/dm-N` to `/dev/mapper/NAME` before it binds.
    fn block_roots(rec: &StagedVolume, disk: &str) -> Vec<String> {
        let mut roots = vec![format!("/{disk}")];
        if let Some(e) = &rec.encrypted {
            roots.push(format!("/mapper/{}", e.mapping));
        }
        roots
    }

    /// A stage of a staged volume must ask for the same encryption (or none) as the first.
    fn check_same_encryption(rec: &StagedVolume, asked: Option<&EncryptedStage>) -> Result<()> {
        if rec.encrypted.as_ref() == asked.map(|e| &e.encryption) {
            return Ok(());
        }
        let say = |e: Option<&Encryption>| match e {
            None => "unencrypted",
            Some(e) if e.discard => "encrypted with discards",
            Some(_) => "encrypted",
        };
        Err(Error::AlreadyExists(format!(
            "volume {} is already staged {}; the request asks for it {}",
            rec.volume_id,
            say(rec.encrypted.as_ref()),
            say(asked.map(|e| &e.encryption))
        )))
    }

    /// Opens (formatting on the first stage) the LUKS2 mapping of an encrypted volume on
    /// `disk` (its namespace or md array); returns the mapping, which is staged instead.
    fn open_encrypted(
        &self,
        volume_id: &str,
        disk: &str,
        stage: &EncryptedStage,
        capability: &Capability,
    ) -> Result<Namespace> {
        let device = self.device_path(disk);
        crypt::open(
            &*self.host,
            &self.kdf,
            &crypt::OpenRequest {
                volume_id,
                device: &device,
                disk,
                encryption: &stage.encryption,
                keys: &stage.keys,
                read_only: capability.mode.read_only(),
            },
        )
    }

    /// At unstage, after the unmount: flushes the mapping of an encrypted volume through
    /// dm-crypt and closes it. A flush that fails while the volume's appliance is `lost` is
    /// logged (the kernel has failed the queued writes: nothing is left to flush to).
    fn close_encrypted(&self, rec: &StagedVolume, lost: impl Fn() -> Result<bool>) -> Result<()> {
        let Some(e) = &rec.encrypted else {
            return Ok(());
        };
        let mapping = crypt::find_mapping(&*self.host, &e.mapping)
            .map_err(|err| Error::io(format!("looking up mapping {}", e.mapping), &err))?;
        let Some(mapping) = mapping else {
            tracing::warn!(volume_id = %rec.volume_id, mapping = %e.mapping,
                "LUKS2 mapping not open at unstage: nothing to close");
            return Ok(());
        };
        let device = self.device_path(&mapping.disk);
        if let Err(err) = self.host.sync_device(&device) {
            if !lost()? {
                return Err(Error::io(format!("flushing {}", path_str(&device)), &err));
            }
            tracing::warn!(volume_id = %rec.volume_id, device = %device.display(), error = %err,
                "flush failed and the appliance is unreachable: the kernel has failed the \
                queued writes, nothing is left to flush to");
        }
        crypt::close(&*self.host, &e.mapping)
    }

    /// How a connect authenticates with `keys` (from [`Volumes::enrol`]): a controller that is
    /// `connected` already takes them as they are; a new connect needs a kernel with NVMe
    /// authentication (FAILED_PRECONDITION naming the fix when it has none).
    fn connect_auth<'k>(
        &self,
        volume_id: &str,
        keys: Option<&'k DhchapKeys>,
        connected: bool,
    ) -> Result<Auth<'k>> {
        Ok(match keys {
            None => Auth::None,
            Some(keys) if connected => Auth::Keys {
                keys,
                kernel_checked: true,
            },
            Some(keys) => match auth_support::detect(&*self.host) {
                AuthSupport::No(how) => {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {volume_id}: {}",
                        auth_support::missing_message(&*self.host, &how)
                    )))
                }
                AuthSupport::Yes(_) => Auth::Keys {
                    keys,
                    kernel_checked: true,
                },
                AuthSupport::Unknown => Auth::Keys {
                    keys,
                    kernel_checked: false,
                },
            },
        })
    }

    /// The last step of NodeStageVolume, on the volume's device (`disk`, with `major:minor`
    /// `dev`): for mount access, a filesystem (made when the device has none) mounted at the
    /// staging path. The volume's own mount there already is success.
    fn mount_staging(
        &self,
        staging_path: &Path,
        capability: &Capability,
        disk: &str,
        dev: &str,
    ) -> Result<()> {
        let Access::Mount {
            fs_type,
            mount_flags,
        } = &capability.access
        else {
            // Block: the record is the staging; publish binds the device node.
            return Ok(());
        };
        let device = self.device_path(disk);
        let table = mount::table(&*self.host)?;
        if let Some(m) = mount::mount_at(&table, staging_path) {
            if m.dev == dev && m.root == "/" {
                return Ok(());
            }
            return Err(Error::FailedPrecondition(format!(
                "{} already has another mount ({} from {})",
                path_str(staging_path),
                m.fs_type,
                m.source
            )));
        }
        fs::create_dir_all(staging_path)
            .map_err(|e| Error::io(format!("creating {}", path_str(staging_path)), &e))?;
        let read_only = capability.mode.read_only();
        filesystem::ensure_filesystem(&*self.host, &device, fs_type, !read_only)?;
        let mut options = mount_flags.clone();
        if read_only {
            options.push("ro".to_owned());
        }
        mount::mount_fs(&*self.host, &device, staging_path, fs_type, &options)
    }

    /// Mounts of `disk` other than at `except` (publications, or foreign mounts).
    fn other_mounts<'a>(
        table: &'a [MountEntry],
        rec: &StagedVolume,
        ns: &Namespace,
        except: &[&Path],
    ) -> Vec<&'a MountEntry> {
        let block_roots = Self::block_roots(rec, &ns.disk);
        table
            .iter()
            .filter(|m| !except.contains(&m.mount_point.as_path()))
            .filter(|m| match rec.capability.access {
                Access::Mount { .. } => m.dev == ns.dev,
                Access::Block => block_roots.contains(&m.root),
            })
            .collect()
    }

    /// Before NodeUnstageVolume: refuses while the volume (on `device`, when present) is mounted
    /// anywhere but at its staging path.
    fn check_unpublished(
        table: &[MountEntry],
        rec: &StagedVolume,
        device: Option<&Namespace>,
        staging_path: &Path,
    ) -> Result<()> {
        let Some(device) = device else {
            return Ok(());
        };
        match Self::other_mounts(table, rec, device, &[staging_path]).first() {
            Some(m) => Err(Error::FailedPrecondition(format!(
                "volume {} is still published at {}; unpublish it first",
                rec.volume_id,
                path_str(&m.mount_point)
            ))),
            None => Ok(()),
        }
    }

    /// The other staged volumes reached through the same target (so the same controller).
    fn sharers(&self, rec: &StagedVolume) -> Result<Vec<String>> {
        Ok(self
            .store
            .all()?
            .into_iter()
            .filter(|o| o.volume_id != rec.volume_id && o.targets().contains(&&rec.target))
            .map(|o| o.volume_id)
            .collect())
    }

    /// True when `rec`'s appliance cannot be reached now: no controller, or one that is not
    /// live (reconnecting, or being torn down).
    fn lost(&self, rec: &StagedVolume) -> Result<bool> {
        Ok(
            fabrics::find_controller(&*self.host, &rec.target, &self.cfg.host)?
                .is_none_or(|c| c.state != "live"),
        )
    }

    /// Before NodeUnstageVolume touches the filesystem: makes sure that nothing below can wait
    /// on queued I/O for longer than `fast_io_fail_tmo`, without giving up on an appliance that
    /// may still come back (a reboot or firmware update) while a write could reach it.
    ///
    /// * A live controller gets the configured `fast_io_fail_tmo` if it had another (one
    ///   connected by an earlier version of the plugin): a loss during the unmount fails the
    ///   queued writes in bounded time.
    /// * A reconnecting controller with a finite `fast_io_fail_tmo` is left to the kernel: the
    ///   unmount's writes wait for the appliance until that timer (counted from the loss)
    ///   expires, then fail; if the appliance comes back first they reach it.
    /// * A reconnecting controller whose `fast_io_fail_tmo` is off would hold the writes until
    ///   `ctrl_loss_tmo`. It gets the same chance: up to `fast_io_fail_tmo` seconds to come back
    ///   (then it is handled as live); after that it is deleted, which fails the queued I/O at
    ///   once, and the unmount finds a device that is gone.
    ///
    /// Not called for a controller that other staged volumes use (it is not ours to delete):
    /// the kernel's own timers bound that case.
    fn settle_controller(&self, rec: &StagedVolume, c: Controller) -> Result<()> {
        if c.state == "live" {
            fabrics::apply_fail_fast(&*self.host, &c, &self.cfg.fabrics)?;
            return Ok(());
        }
        let fail_fast = sysfs::controller_fail_fast(&*self.host, &c.name)
            .map_err(|e| Error::io(format!("reading {}'s fast_io_fail_tmo", c.name), &e))?;
        let grace = match (fail_fast, self.cfg.fabrics.fail_fast()) {
            (FailFast::After(_), _) => return Ok(()),
            // The operator turned fast failing off: the kernel's ctrl_loss_tmo decides.
            (_, None) => return Ok(()),
            (_, Some(secs)) => Duration::from_secs(u64::from(secs)),
        };
        tracing::warn!(volume_id = %rec.volume_id, controller = %c.name, state = %c.state,
            ?grace, "controller lost and its queued I/O never fails fast: waiting for the \
            appliance before giving the controller up");
        let mut waited = Duration::ZERO;
        while waited < grace {
            self.host.sleep(self.cfg.poll);
            waited += self.cfg.poll;
            match sysfs::controller_state(&*self.host, &c.name)
                .map_err(|e| Error::io(format!("reading {}'s state", c.name), &e))?
                .as_deref()
            {
                None => return Ok(()),
                Some("live") => {
                    fabrics::apply_fail_fast(&*self.host, &c, &self.cfg.fabrics)?;
                    return Ok(());
                }
                Some(_) => {}
            }
        }
        tracing::warn!(volume_id = %rec.volume_id, controller = %c.name, ?waited,
            "the appliance did not come back: deleting the controller (its queued I/O fails)");
        fabrics::disconnect(&*self.host, &c.name)
    }

    /// NodeUnstageVolume: unmount (mount access), flush the device, delete the controller
    /// unless another staged volume uses it, forget the record.
    ///
    /// Bounded when the appliance is gone ([`Volumes::settle_controller`]): the kernel fails
    /// the unmount's queued writes `fast_io_fail_tmo` after it noticed the loss (at once for a
    /// closed connection, within about twice `keep_alive_tmo` for a silent appliance), the
    /// flush of a device whose controller is not live is skipped once it fails (the kernel has
    /// failed the writes: there is nothing left to flush to), and deleting a reconnecting
    /// controller fails whatever is still queued.
    pub fn unstage(&self, volume_id: &str, staging_path: &Path) -> Result<()> {
        let _guard = self.guard();
        let table = mount::table(&*self.host)?;
        let Some(rec) = self.store.get(volume_id)? else {
            if let Some(m) = mount::mount_at(&table, staging_path) {
                return Err(Error::NotFound(format!(
                    "volume {volume_id} is not staged by this plugin, but {} holds a {} mount \
                     from {}; refusing to touch it",
                    path_str(staging_path),
                    m.fs_type,
                    m.source
                )));
            }
            return Ok(());
        };
        if rec.staging_path != staging_path {
            // The spec: not staged at this path -> OK. The record stays for the right path.
            tracing::warn!(volume_id, staged_at = %rec.staging_path.display(),
                asked = %staging_path.display(), "unstage of a path the volume is not staged at");
            return Ok(());
        }
        if rec.replicated.is_some() {
            return self.unstage_replicated(&rec, staging_path, &table);
        }
        let shown = self.volume_device(&rec)?;
        Self::check_unpublished(&table, &rec, shown.as_ref(), staging_path)?;
        let sharers = self.sharers(&rec)?;
        if sharers.is_empty() {
            if let Some(c) = fabrics::find_controller(&*self.host, &rec.target, &self.cfg.host)? {
                self.settle_controller(&rec, c)?;
            }
        }
        if matches!(rec.capability.access, Access::Mount { .. }) {
            mount::unmount_all(&*self.host, staging_path)?;
        }
        self.close_encrypted(&rec, || self.lost(&rec))?;
        // Looked up again: the namespace went with a controller given up above.
        match self.find_namespace(&Self::namespace_id(&rec))? {
            Some(ns) => {
                let device = self.device_path(&ns.disk);
                if let Err(e) = self.host.sync_device(&device) {
                    if !self.lost(&rec)? {
                        return Err(Error::io(format!("flushing {}", path_str(&device)), &e));
                    }
                    tracing::warn!(volume_id, device = %device.display(), error = %e,
                        "flush failed and the appliance is unreachable: the kernel has failed \
                        the queued writes, nothing is left to flush to");
                }
            }
            None => tracing::warn!(
                volume_id,
                "namespace not present at unstage: nothing to flush"
            ),
        }
        if let Some(c) = fabrics::find_controller(&*self.host, &rec.target, &self.cfg.host)? {
            if sharers.is_empty() {
                fabrics::disconnect(&*self.host, &c.name)?;
            } else {
                tracing::info!(controller = %c.name, users = ?sharers,
                    "controller still used by other staged volumes: kept");
            }
        }
        self.store.remove(volume_id)
    }

    /// Brings the controllers of every staged volume to the configured `fast_io_fail_tmo`
    /// (at start: a controller connected by an earlier version of the plugin may have it off,
    /// and would queue I/O for `ctrl_loss_tmo` when its appliance goes away). Failures are
    /// logged, not fatal: the volumes keep working as they are. Returns how many changed.
    pub fn adopt(&self) -> usize {
        let _guard = self.guard();
        let records = match self.store.all() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the staged volumes at start");
                return 0;
            }
        };
        let mut changed = 0;
        for rec in &records {
            // A replicated volume's legs fail fast after the legs' own (short) timeout.
            let cfg = match rec.replicated {
                Some(_) => self.leg_fabrics(),
                None => self.cfg.fabrics,
            };
            for target in rec.targets() {
                let found = fabrics::find_controller(&*self.host, target, &self.cfg.host);
                let applied = found.and_then(|c| match c {
                    Some(c) => fabrics::apply_fail_fast(&*self.host, &c, &cfg),
                    None => Ok(false),
                });
                match applied {
                    Ok(true) => changed += 1,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(volume_id = %rec.volume_id, error = %e,
                        "could not set fast_io_fail_tmo on the volume's controller"),
                }
            }
        }
        changed
    }

    fn staged(&self, volume_id: &str) -> Result<StagedVolume> {
        self.store.get(volume_id)?.ok_or_else(|| {
            Error::NotFound(format!("volume {volume_id} is not staged on this node"))
        })
    }

    /// True when mount `m` is `rec`'s volume: for a mount volume, its filesystem (the device of
    /// its namespace, or of the mount at its staging path) at the filesystem's root; for a block
    /// volume, a bind of its disk's device node. Works from the record alone when the namespace
    /// is gone (controller lost).
    fn is_volume_mount(
        table: &[MountEntry],
        rec: &StagedVolume,
        ns: Option<&Namespace>,
        m: &MountEntry,
    ) -> bool {
        match rec.capability.access {
            Access::Mount { .. } => {
                let staged = mount::mount_at(table, &rec.staging_path).map(|s| s.dev.as_str());
                m.root == "/"
                    && (ns.map(|n| n.dev.as_str()) == Some(&m.dev) || staged == Some(&m.dev))
            }
            Access::Block => ns
                .map(|n| n.disk.as_str())
                .or(rec.disk.as_deref())
                .is_some_and(|disk| Self::block_roots(rec, disk).contains(&m.root)),
        }
    }

    /// NodePublishVolume.
    pub fn publish(&self, req: &PublishRequest) -> Result<()> {
        let _guard = self.guard();
        let rec = self.staged(&req.volume_id)?;
        let is_block = matches!(rec.capability.access, Access::Block);
        let wants_block = matches!(req.capability.access, Access::Block);
        let kind = |block: bool| if block { "block" } else { "mount" };
        let table = mount::table(&*self.host)?;
        let ns = self.volume_device(&rec)?;
        // The target first: the same publication again is OK, a different one ALREADY_EXISTS.
        if let Some(m) = mount::mount_at(&table, &req.target_path) {
            if !Self::is_volume_mount(&table, &rec, ns.as_ref(), m) {
                return Err(Error::AlreadyExists(format!(
                    "{} already holds another mount ({} from {})",
                    path_str(&req.target_path),
                    m.fs_type,
                    m.source
                )));
            }
            if wants_block != is_block || req.staging_path != rec.staging_path {
                return Err(Error::AlreadyExists(format!(
                    "volume {} is published at {} for {} access from {}; the request asks {} \
                     access from {}",
                    req.volume_id,
                    path_str(&req.target_path),
                    kind(is_block),
                    path_str(&rec.staging_path),
                    kind(wants_block),
                    path_str(&req.staging_path)
                )));
            }
            let asked = rec
                .publications
                .iter()
                .find(|p| p.target_path == req.target_path);
            if let Some(p) = asked {
                if p.read_only != req.read_only || p.capability != req.capability {
                    return Err(Error::AlreadyExists(format!(
                        "volume {} is published at {} {} with {:?}; the request asks {} with {:?}",
                        req.volume_id,
                        path_str(&req.target_path),
                        if p.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        },
                        p.capability,
                        if req.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        },
                        req.capability
                    )));
                }
            }
            return match (m.read_only(), req.read_only) {
                (ro, want) if ro == want => Ok(()),
                // A bind done before a failed read-only remount (this very request, or one
                // recorded before publications were): finish the step.
                (false, true) => mount::remount_read_only(&*self.host, &req.target_path),
                _ => Err(Error::AlreadyExists(format!(
                    "volume {} is published at {} read-only; the request asks read-write",
                    req.volume_id,
                    path_str(&req.target_path)
                ))),
            };
        }
        if rec.staging_path != req.staging_path {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is staged at {}, not {}",
                req.volume_id,
                path_str(&rec.staging_path),
                path_str(&req.staging_path)
            )));
        }
        if is_block != wants_block {
            return Err(Error::FailedPrecondition(format!(
                "volume {} is staged for {} access, publish asks for {}",
                req.volume_id,
                kind(is_block),
                kind(wants_block)
            )));
        }
        let ns = ns.ok_or_else(|| {
            Error::Unavailable(format!(
                "volume {}: its namespace is not present on this node (controller lost?)",
                rec.volume_id
            ))
        })?;
        let device = self.device_path(&ns.disk);
        if rec.capability.mode == AccessMode::SingleNodeSingleWriter && !req.read_only {
            let others =
                Self::other_mounts(&table, &rec, &ns, &[&rec.staging_path, &req.target_path]);
            if let Some(m) = others.iter().find(|m| !m.read_only()) {
                return Err(Error::FailedPrecondition(format!(
                    "volume {} is SINGLE_NODE_SINGLE_WRITER and already published read-write at {}",
                    req.volume_id,
                    path_str(&m.mount_point)
                )));
            }
        }
        let mut rec = rec;
        rec.publications
            .retain(|p| p.target_path != req.target_path);
        rec.publications.push(Publication {
            target_path: req.target_path.clone(),
            capability: req.capability.clone(),
            read_only: req.read_only,
        });
        self.store.put(&rec)?;
        if is_block {
            if let Some(parent) = req.target_path.parent() {
                fs::create_dir_all(parent)
                    .map_err(|e| Error::io(format!("creating {}", path_str(parent)), &e))?;
            }
            fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&req.target_path)
                .map_err(|e| Error::io(format!("creating {}", path_str(&req.target_path)), &e))?;
            mount::bind(&*self.host, &device, &req.target_path, req.read_only)
        } else {
            match mount::mount_at(&table, &rec.staging_path) {
                Some(m) if m.dev == ns.dev && m.root == "/" => {}
                _ => {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {} is not mounted at its staging path {}; stage it again",
                        req.volume_id,
                        path_str(&rec.staging_path)
                    )))
                }
            }
            fs::create_dir_all(&req.target_path)
                .map_err(|e| Error::io(format!("creating {}", path_str(&req.target_path)), &e))?;
            mount::bind(
                &*self.host,
                &rec.staging_path,
                &req.target_path,
                req.read_only,
            )
        }
    }

    /// NodeUnpublishVolume: unmount the volume's publication at `target_path`, then remove the
    /// file or directory publish created. Nothing there is success (idempotent); a mount there
    /// that is not this volume's is NOT_FOUND and left alone.
    pub fn unpublish(&self, volume_id: &str, target_path: &Path) -> Result<()> {
        let _guard = self.guard();
        let table = mount::table(&*self.host)?;
        if let Some(m) = mount::mount_at(&table, target_path) {
            let ours = match self.store.get(volume_id)? {
                Some(rec) => {
                    let ns = self.volume_device(&rec)?;
                    Self::is_volume_mount(&table, &rec, ns.as_ref(), m)
                }
                None => false,
            };
            if !ours {
                return Err(Error::NotFound(format!(
                    "volume {volume_id} is not published at {}: it holds a {} mount from {}; \
                     refusing to touch it",
                    path_str(target_path),
                    m.fs_type,
                    m.source
                )));
            }
            mount::unmount_all(&*self.host, target_path)?;
        }
        let removed = match fs::symlink_metadata(target_path) {
            Ok(meta) if meta.is_dir() => fs::remove_dir(target_path),
            Ok(_) => fs::remove_file(target_path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        removed.map_err(|e| {
            Error::io(
                format!("volume {volume_id}: removing {}", path_str(target_path)),
                &e,
            )
        })?;
        if let Some(mut rec) = self.store.get(volume_id)? {
            let before = rec.publications.len();
            rec.publications.retain(|p| p.target_path != target_path);
            if rec.publications.len() != before {
                self.store.put(&rec)?;
            }
        }
        Ok(())
    }

    /// Checks `path` is where `rec` is staged or published; returns the mount (if any).
    fn volume_path_mount<'a>(
        &self,
        table: &'a [MountEntry],
        rec: &StagedVolume,
        ns: Option<&Namespace>,
        path: &Path,
    ) -> Result<Option<&'a MountEntry>> {
        if matches!(rec.capability.access, Access::Block) && path == rec.staging_path {
            return Ok(None);
        }
        match mount::mount_at(table, path) {
            Some(m) if Self::is_volume_mount(table, rec, ns, m) => Ok(Some(m)),
            _ => Err(Error::NotFound(format!(
                "{} is not a path where volume {} is staged or published",
                path_str(path),
                rec.volume_id
            ))),
        }
    }

    /// NodeGetVolumeStats.
    pub fn stats(&self, volume_id: &str, volume_path: &Path) -> Result<VolumeStats> {
        let rec = self.staged(volume_id)?;
        if rec.replicated.is_some() {
            return self.stats_replicated(&rec, volume_path);
        }
        let ns = self.find_namespace(&Self::namespace_id(&rec))?;
        let shown = self.volume_device(&rec)?;
        let table = mount::table(&*self.host)?;
        self.volume_path_mount(&table, &rec, shown.as_ref(), volume_path)?;
        let abnormal = match fabrics::find_controller(&*self.host, &rec.target, &self.cfg.host)? {
            None => Some(format!(
                "no NVMe controller connected to {} at {}:{}",
                rec.target.subsysnqn, rec.target.traddr, rec.target.trsvcid
            )),
            Some(c) if c.state != "live" => Some(format!("controller {} is {}", c.name, c.state)),
            Some(_) if ns.is_none() => Some("the namespace is not present".to_owned()),
            Some(_) if shown.is_none() => Some(format!(
                "its LUKS2 mapping {} is not open",
                rec.encrypted.as_ref().map_or("", |e| e.mapping.as_str())
            )),
            Some(_) => None,
        };
        let usage = match (&rec.capability.access, &shown) {
            (Access::Mount { .. }, _) => Usage::Filesystem(
                self.host
                    .statvfs(volume_path)
                    .map_err(|e| Error::io(format!("statvfs {}", path_str(volume_path)), &e))?,
            ),
            (Access::Block, Some(ns)) => Usage::Block(
                sysfs::disk_size(&*self.host, &ns.disk)
                    .map_err(|e| Error::io(format!("size of {}", ns.disk), &e))?,
            ),
            (Access::Block, None) => Usage::Block(0),
        };
        Ok(VolumeStats { usage, abnormal })
    }

    /// The spec's "Exceeds capabilities" row of NodeExpandVolume: the request's capability
    /// (when it names one) must be the access the volume is staged with.
    fn check_expand_access(rec: &StagedVolume, asked: Option<&Access>) -> Result<()> {
        let mismatch = match (asked, &rec.capability.access) {
            (None, _) | (Some(Access::Block), Access::Block) => None,
            (Some(Access::Block), Access::Mount { fs_type, .. }) => Some(format!(
                "it is staged as a mounted {fs_type} filesystem, the request names block access"
            )),
            (Some(Access::Mount { .. }), Access::Block) => Some(
                "it is staged for block access, the request names a mounted filesystem".to_owned(),
            ),
            (Some(Access::Mount { fs_type: want, .. }), Access::Mount { fs_type: have, .. }) => {
                (!want.is_empty() && want != have)
                    .then(|| format!("it holds {have}, the request names {want}"))
            }
        };
        match mismatch {
            None => Ok(()),
            Some(why) => Err(Error::InvalidArgument(format!(
                "volume {}: volume_capability does not match the staged volume: {why}",
                rec.volume_id
            ))),
        }
    }

    /// Before NodeExpandVolume grows a mount volume's filesystem (on `dev`): it must be mounted
    /// read-write at the staging path.
    fn check_growable_mount(table: &[MountEntry], rec: &StagedVolume, dev: &str) -> Result<()> {
        if !matches!(rec.capability.access, Access::Mount { .. }) {
            return Ok(());
        }
        match mount::mount_at(table, &rec.staging_path) {
            Some(m) if m.dev == dev && m.root == "/" && m.read_only() => {
                Err(Error::FailedPrecondition(format!(
                    "volume {} is staged read-only at {}: its filesystem cannot grow while \
                     mounted read-only; stage it read-write to expand it",
                    rec.volume_id,
                    path_str(&rec.staging_path)
                )))
            }
            Some(m) if m.dev == dev && m.root == "/" => Ok(()),
            _ => Err(Error::FailedPrecondition(format!(
                "volume {} is not mounted at its staging path {}; stage it again",
                rec.volume_id,
                path_str(&rec.staging_path)
            ))),
        }
    }

    /// Rescans controller `c`, then polls (bounded) the size of its `disk` until it is at least
    /// `need` bytes (with `need` 0: once after the rescan). Returns the size it last read, below
    /// `need` only when the wait ran out.
    fn rescan_for_size(&self, c: &Controller, disk: &str, need: u64) -> Result<u64> {
        let attr = sysfs::controller_dir(&*self.host, &c.name).join("rescan_controller");
        self.host
            .write_attr(&attr, "1")
            .map_err(|e| Error::io(format!("rescanning {}", c.name), &e))?;
        // The rescan runs in the kernel's scan work: poll the size (bounded).
        let mut waited = Duration::ZERO;
        loop {
            let size = sysfs::disk_size(&*self.host, disk)
                .map_err(|e| Error::io(format!("size of {disk}"), &e))?;
            if size >= need && (need > 0 || waited > Duration::ZERO) {
                return Ok(size);
            }
            if waited >= self.cfg.device_wait {
                return Ok(size);
            }
            self.host.sleep(self.cfg.poll);
            waited += self.cfg.poll;
        }
    }

    /// NodeExpandVolume: rescan, wait for the size, grow the filesystem. Returns the new size.
    pub fn expand(&self, req: &ExpandRequest) -> Result<u64> {
        let _guard = self.guard();
        let volume_id = req.volume_id.as_str();
        let rec = self.staged(volume_id)?;
        if rec.replicated.is_some() {
            return self.expand_replicated(&rec, req);
        }
        let ns = self.find_namespace(&Self::namespace_id(&rec))?;
        let shown = self.volume_device(&rec)?;
        let table = mount::table(&*self.host)?;
        self.volume_path_mount(&table, &rec, shown.as_ref(), &req.volume_path)?;
        Self::check_expand_access(&rec, req.access.as_ref())?;
        let ns = ns.ok_or_else(|| {
            Error::Unavailable(format!(
                "volume {volume_id}: its namespace is not present on this node (controller lost?)"
            ))
        })?;
        let shown = shown.ok_or_else(|| {
            Error::Unavailable(format!(
                "volume {volume_id}: its LUKS2 mapping is not open; stage it again"
            ))
        })?;
        let size_of = || {
            sysfs::disk_size(&*self.host, &ns.disk)
                .map_err(|e| Error::io(format!("size of {}", ns.disk), &e))
        };
        let before = size_of()?;
        if req.limit_bytes > 0 && before > req.limit_bytes {
            return Err(Error::OutOfRange(format!(
                "volume {volume_id} is already {before} bytes, more than capacity_range.limit_bytes \
                 {}; volumes do not shrink",
                req.limit_bytes
            )));
        }
        Self::check_growable_mount(&table, &rec, &shown.dev)?;
        let c = fabrics::find_controller(&*self.host, &rec.target, &self.cfg.host)?
            .filter(|c| c.state == "live")
            .ok_or_else(|| {
                Error::Unavailable(format!("volume {volume_id}: no live controller to rescan"))
            })?;
        let required = req.required_bytes;
        let size = self.rescan_for_size(&c, &ns.disk, required)?;
        if size < required {
            return Err(Error::OutOfRange(format!(
                "volume {volume_id}: {} is {size} bytes after a rescan, less than \
                 capacity_range.required_bytes {required}; the node grows what the \
                 controller gave (ControllerExpandVolume first)",
                ns.disk
            )));
        }
        let shown = self.grow_mapping(&rec, shown, req.key.as_ref())?;
        if let Access::Mount { fs_type, .. } = &rec.capability.access {
            filesystem::grow(
                &*self.host,
                fs_type,
                &self.device_path(&shown.disk),
                &rec.staging_path,
            )?;
        }
        Ok(size)
    }

    /// NodeExpandVolume of an encrypted volume, once its device grew: the LUKS2 mapping grows
    /// to it (before the filesystem on it can). `shown` is returned as it is for a plain volume.
    fn grow_mapping(
        &self,
        rec: &StagedVolume,
        shown: Namespace,
        key: Option<&Passphrase>,
    ) -> Result<Namespace> {
        match &rec.encrypted {
            Some(e) => crypt::resize(&*self.host, &rec.volume_id, &e.mapping, key),
            None => Ok(shown),
        }
    }
}
