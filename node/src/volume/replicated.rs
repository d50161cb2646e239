//! The node's operations on a replicated volume: every leg connected (as a plain volume is,
//! but failing its I/O fast, since md carries it), an md RAID1 over the legs' namespaces
//! ([`crate::raid`]), and the md device staged and published as a plain volume's namespace is.
//!
//! A leg whose appliance is gone: its controller fails queued I/O after the legs'
//! `fast_io_fail_tmo` (seconds), md fails the member and goes on with the others, and the
//! workload sees no error. NodeGetVolumeStats reports the volume degraded. When the appliance is
//! back (the kernel reconnected the controller, or the periodic check connected it again after
//! the kernel gave it up), the leg is re-added and md resyncs what its bitmap marked.

use std::path::Path;

use super::{path_str, Access, ExpandRequest, Usage, VolumeStats, Volumes};
use crate::crypt;
use crate::error::{Error, Result};
use crate::fabrics::{self, FabricsConfig};
use crate::fs as filesystem;
use crate::legs::{Leg, Replicated, ReplicatedStageRequest};
use crate::mount::{self, MountEntry};
use crate::raid::{self, ArrayStatus};
use crate::state::StagedVolume;
use crate::sysfs::Namespace;

/// Default `fast_io_fail_tmo` of a leg's controller, in seconds: how long a lost leg's queued
/// I/O waits for its appliance before the kernel fails it and md goes on with the other legs.
/// The workload's writes pause at most this long (after the loss is noticed: at once for a
/// closed connection, within about twice `keep_alive_tmo` for a silent appliance).
pub const DEFAULT_LEG_FAST_IO_FAIL_TMO: i32 = 5;

/// `e`'s CSI code with the message `msg`.
fn reworded(e: Error, msg: String) -> Error {
    match e {
        Error::InvalidArgument(_) => Error::InvalidArgument(msg),
        Error::NotFound(_) => Error::NotFound(msg),
        Error::AlreadyExists(_) => Error::AlreadyExists(msg),
        Error::FailedPrecondition(_) => Error::FailedPrecondition(msg),
        Error::OutOfRange(_) => Error::OutOfRange(msg),
        Error::Unavailable(_) => Error::Unavailable(msg),
        Error::Internal(_) => Error::Internal(msg),
    }
}

/// How a leg stands in its array.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LegState {
    /// A member holding all the data.
    InSync,
    /// Being copied onto: done/total sectors when md says.
    Resyncing(Option<(u64, u64)>),
    /// Not a working member (namespace gone, controller not live, faulty or out of the array).
    Missing,
}

impl StagedVolume {
    /// Every subsystem the volume is reached through: its legs', or its own.
    pub fn targets(&self) -> Vec<&fabrics::Target> {
        match &self.replicated {
            Some(r) => r.legs.iter().map(|l| &l.target).collect(),
            None => vec![&self.target],
        }
    }
}

impl Volumes {
    /// The connection tunables of a leg: the node's, with the legs' `fast_io_fail_tmo`.
    pub(super) fn leg_fabrics(&self) -> FabricsConfig {
        FabricsConfig {
            fast_io_fail_tmo: self.leg_fast_io_fail_tmo,
            ..self.cfg.fabrics
        }
    }

    /// Connects one leg (enrolling with its appliance when keys are configured) and waits for
    /// its namespace. A controller connected before gets the legs' `fast_io_fail_tmo`.
    fn connect_leg(&self, volume_id: &str, leg: &Leg) -> Result<Namespace> {
        let ident = &self.cfg.host;
        let connected = fabrics::find_controller(&*self.host, &leg.target, ident)?;
        let keys = match self.enrol(&leg.target) {
            Ok(k) => k,
            Err(e) if connected.is_none() => return Err(e),
            Err(e) => {
                tracing::warn!(volume_id, leg = %leg.volume_id, error = %e,
                    "enrolment failed; going on with the leg's connected controller");
                None
            }
        };
        let auth = self.connect_auth(volume_id, keys.as_ref(), connected.is_some())?;
        let cfg = self.leg_fabrics();
        let controller = fabrics::ensure_connected(&*self.host, &leg.target, ident, &cfg, auth)?;
        drop(keys);
        if let Some(c) = connected {
            fabrics::apply_fail_fast(&*self.host, &c, &cfg)?;
        }
        self.wait_for_namespace(&leg.namespace(), &controller)
    }

    /// The namespace of each leg that is present now (`None` for the others).
    fn leg_namespaces(&self, rep: &Replicated) -> Result<Vec<Option<Namespace>>> {
        rep.legs
            .iter()
            .map(|l| self.find_namespace(&l.namespace()))
            .collect()
    }

    /// The md array of `rep`, found through any present leg.
    fn find_array(&self, namespaces: &[Option<Namespace>]) -> Result<Option<ArrayStatus>> {
        let disks: Vec<&str> = namespaces
            .iter()
            .flatten()
            .map(|n| n.disk.as_str())
            .collect();
        let Some(md) = raid::find_array(&*self.host, &disks)
            .map_err(|e| Error::io("looking up the md array", &e))?
        else {
            return Ok(None);
        };
        raid::status(&*self.host, &md)
            .map(Some)
            .map_err(|e| Error::io(format!("reading {md}'s state"), &e))
    }

    /// The device a record's filesystem or block access is on: its namespace, or for a
    /// replicated volume its md array (as a [`Namespace`]: disk `md127`, its `major:minor`),
    /// or for an encrypted volume (of either kind) its open LUKS2 mapping (disk `dm-3`).
    pub(super) fn volume_device(&self, rec: &StagedVolume) -> Result<Option<Namespace>> {
        if let Some(e) = &rec.encrypted {
            return crypt::find_mapping(&*self.host, &e.mapping)
                .map_err(|err| Error::io(format!("looking up mapping {}", e.mapping), &err));
        }
        self.raw_device(rec)
    }

    /// The device below any encryption: the namespace, or the md array.
    fn raw_device(&self, rec: &StagedVolume) -> Result<Option<Namespace>> {
        let Some(rep) = &rec.replicated else {
            return self.find_namespace(&Self::namespace_id(rec));
        };
        Ok(self
            .find_array(&self.leg_namespaces(rep)?)?
            .map(|a| Namespace {
                disk: a.md,
                dev: a.dev,
                size_bytes: a.size_bytes,
            }))
    }

    /// Waits (bounded) for md to show the array after mdadm created or assembled it.
    fn wait_for_array(
        &self,
        rep: &Replicated,
        present: &[Option<Namespace>],
    ) -> Result<ArrayStatus> {
        let mut waited = std::time::Duration::ZERO;
        loop {
            if let Some(a) = self.find_array(present)?.filter(|a| a.state != "inactive") {
                return Ok(a);
            }
            if waited >= self.cfg.device_wait {
                return Err(Error::Unavailable(format!(
                    "md array {} was assembled but does not show in /sys/block within {:?}",
                    rep.array, self.cfg.device_wait
                )));
            }
            self.host.sleep(self.cfg.poll);
            waited += self.cfg.poll;
        }
    }

    /// Creates the array when no leg ever held one (new legs read as zeros), else assembles it
    /// from the legs that carry its superblock; a no-op when it runs already.
    fn ensure_array(&self, rep: &Replicated, present: &[Option<Namespace>]) -> Result<ArrayStatus> {
        if let Some(a) = self.find_array(present)? {
            if a.state != "inactive" {
                return Ok(a);
            }
            // A host with mdadm's udev rules assembles legs as they appear and waits for all.
            tracing::info!(array = %rep.array, md = %a.md,
                "md array assembled in part by udev and inactive: starting it with its legs");
            raid::run(&*self.host, &self.device_path(&a.md))?;
            return self.wait_for_array(rep, present);
        }
        let devices: Vec<Option<std::path::PathBuf>> = present
            .iter()
            .map(|n| n.as_ref().map(|n| self.device_path(&n.disk)))
            .collect();
        let mut members = Vec::new();
        for d in devices.iter().flatten() {
            if raid::has_superblock(&*self.host, d)? {
                members.push(d.clone());
            }
        }
        if members.is_empty() {
            tracing::info!(array = %rep.array, legs = devices.len(),
                "creating the md RAID1 over the legs (new legs: no initial resync)");
            raid::create(&*self.host, &rep.array, &devices)?;
        } else {
            tracing::info!(array = %rep.array, legs = members.len(), "assembling the md RAID1");
            raid::assemble(&*self.host, &rep.array, &members)?;
        }
        self.wait_for_array(rep, present)
    }

    /// Puts every present, live leg that is not a working member back into the array:
    /// `--re-add` (only the bitmap's dirty regions resync), or `--add` (a full copy) for a leg
    /// that never was a member or cannot be re-added. Returns how many legs went back.
    fn rejoin_legs(
        &self,
        rec: &StagedVolume,
        rep: &Replicated,
        present: &[Option<Namespace>],
        array: &ArrayStatus,
    ) -> Result<usize> {
        let md = self.device_path(&array.md);
        let mut cleared = false;
        let mut rejoined = 0;
        for (leg, ns) in rep.legs.iter().zip(present) {
            let Some(ns) = ns else { continue };
            let live = fabrics::find_controller(&*self.host, &leg.target, &self.cfg.host)?
                .is_some_and(|c| c.state == "live");
            if !live {
                continue;
            }
            let device = self.device_path(&ns.disk);
            if array.member(&ns.disk).is_some_and(|m| !m.faulty()) {
                continue;
            }
            if !std::mem::replace(&mut cleared, true) {
                self.clear_failed_members(&md, array)?;
            }
            let how = if raid::has_superblock(&*self.host, &device)? {
                match raid::re_add(&*self.host, &md, &device) {
                    Ok(()) => "re-added (md resyncs what its bitmap marked)",
                    Err(e) => {
                        tracing::warn!(volume_id = %rec.volume_id, leg = %leg.volume_id,
                            error = %e, "re-add refused: adding the leg with a full resync");
                        raid::add(&*self.host, &md, &device)?;
                        "added (full resync)"
                    }
                }
            } else {
                raid::add(&*self.host, &md, &device)?;
                "added (full resync)"
            };
            tracing::info!(volume_id = %rec.volume_id, leg = %leg.volume_id,
                appliance = %leg.appliance, array = %array.md, "{how}");
            rejoined += 1;
        }
        Ok(rejoined)
    }

    /// Frees the slots of failed members before a leg comes back: `--remove failed` (by state,
    /// as a leg's new disk may carry the old one's name) and `--remove detached` (members whose
    /// disk the kernel deleted with its controller).
    fn clear_failed_members(&self, md: &Path, array: &ArrayStatus) -> Result<()> {
        if array.members.iter().any(raid::Member::faulty) {
            raid::remove_failed(&*self.host, md)?;
        }
        let block = self.host.sys_root().join("block");
        if array.members.iter().any(|m| !block.join(&m.disk).exists()) {
            raid::remove_detached(&*self.host, md)?;
        }
        Ok(())
    }

    /// NodeStageVolume of a replicated volume.
    pub fn stage_replicated(&self, req: &ReplicatedStageRequest) -> Result<()> {
        let _guard = self.guard();
        let id = req.volume_id.as_str();
        if req.capability.mode.multi_node_writer() {
            return Err(Error::FailedPrecondition(format!(
                "volume {id} is replicated: its legs are mirrored by md on the node that stages \
                 it, so no other node may write to them; multi-node writer modes cannot work"
            )));
        }
        if let Access::Mount { fs_type, .. } = &req.capability.access {
            filesystem::check_supported(fs_type)?;
        }
        // Nothing connects without the kernel's initiator: say which module and the fix before
        // a record, a connect or an array (a leg's live controller means the initiator is there).
        if !self.any_leg_connected(&req.legs)? {
            crate::initiator::require_fabrics(&*self.host, id)?;
        }
        let rep = Replicated {
            array: raid::array_name(id),
            legs: req.legs.clone(),
        };
        let mut rec = match self.store.get(id)? {
            Some(rec) => {
                if rec.staging_path != req.staging_path {
                    return Err(Error::FailedPrecondition(format!(
                        "volume {id} is already staged at {}, not {}",
                        path_str(&rec.staging_path),
                        path_str(&req.staging_path)
                    )));
                }
                if rec.capability != req.capability || rec.replicated.as_ref() != Some(&rep) {
                    return Err(Error::AlreadyExists(format!(
                        "volume {id} is already staged at {} with another capability or other \
                         legs",
                        path_str(&rec.staging_path)
                    )));
                }
                Self::check_same_encryption(&rec, req.encrypted.as_ref())?;
                rec
            }
            None => {
                let first = &req.legs[0];
                let rec = StagedVolume {
                    volume_id: id.to_owned(),
                    staging_path: req.staging_path.clone(),
                    capability: req.capability.clone(),
                    target: first.target.clone(),
                    nguid: first.nguid.clone(),
                    uuid: first.uuid.clone(),
                    controller: None,
                    disk: None,
                    publications: Vec::new(),
                    replicated: Some(rep.clone()),
                    encrypted: req.encrypted.as_ref().map(|e| e.encryption.clone()),
                };
                self.store.put(&rec)?;
                rec
            }
        };

        if req.encrypted.is_some() {
            if let Err(e) = crypt::require_dm_crypt(&*self.host, id) {
                return self.no_leg(&rec, e);
            }
        }
        let mut present = Vec::with_capacity(rep.legs.len());
        let mut failures = Vec::new();
        let mut last_error = None;
        for leg in &rep.legs {
            match self.connect_leg(id, leg) {
                Ok(ns) => present.push(Some(ns)),
                Err(e) => {
                    failures.push(format!("{}: {e}", leg.describe()));
                    present.push(None);
                    last_error = Some(e);
                }
            }
        }
        if let (true, Some(e)) = (present.iter().all(Option::is_none), last_error) {
            // Not one leg: answered with the last leg's code, every leg's reason in the text.
            let why = format!(
                "volume {id}: no leg could be connected ({})",
                failures.join("; ")
            );
            return self.no_leg(&rec, reworded(e, why));
        }
        let array = self.ensure_array(&rep, &present)?;
        self.rejoin_legs(&rec, &rep, &present, &array)?;
        if !failures.is_empty() {
            tracing::warn!(volume_id = id, array = %array.md, missing = %failures.join("; "),
                "replicated volume staged degraded: md runs without the missing legs and \
                re-adds them when their appliance is back");
        }
        // LUKS2 sits on the md array: md mirrors ciphertext, and one key opens the volume.
        let (disk, dev) = match &req.encrypted {
            Some(e) => {
                let m = self.open_encrypted(id, &array.md, e, &req.capability)?;
                (m.disk, m.dev)
            }
            None => (array.md.clone(), array.dev.clone()),
        };
        if rec.disk.as_deref() != Some(&disk) {
            rec.disk = Some(disk.clone());
            self.store.put(&rec)?;
        }

        self.mount_staging(&req.staging_path, &req.capability, &disk, &dev)
    }

    /// No leg could be connected: a record that never had an array is forgotten (nothing is
    /// left behind), and the error goes back.
    fn no_leg(&self, rec: &StagedVolume, e: Error) -> Result<()> {
        let Some(rep) = &rec.replicated else {
            return Err(e);
        };
        if rec.disk.is_none() && !self.any_leg_connected(&rep.legs)? {
            self.store.remove(&rec.volume_id)?;
        }
        Err(e)
    }

    /// Whether the kernel holds a controller of any of `legs`.
    fn any_leg_connected(&self, legs: &[Leg]) -> Result<bool> {
        legs.iter().try_fold(false, |any, l| {
            Ok(any || fabrics::find_controller(&*self.host, &l.target, &self.cfg.host)?.is_some())
        })
    }

    /// Each leg's standing in `array`.
    fn leg_states(
        &self,
        rep: &Replicated,
        present: &[Option<Namespace>],
        array: &ArrayStatus,
    ) -> Result<Vec<LegState>> {
        let mut out = Vec::with_capacity(rep.legs.len());
        for (leg, ns) in rep.legs.iter().zip(present) {
            let live = fabrics::find_controller(&*self.host, &leg.target, &self.cfg.host)?
                .is_some_and(|c| c.state == "live");
            let member = ns.as_ref().and_then(|n| array.member(&n.disk));
            out.push(match member {
                Some(m) if live && m.in_sync() && !m.faulty() => LegState::InSync,
                Some(m) if live && !m.faulty() && array.syncing() => {
                    LegState::Resyncing(array.sync_completed)
                }
                _ => LegState::Missing,
            });
        }
        Ok(out)
    }

    /// The volume condition of a replicated volume: `None` when every leg is in sync.
    fn replicated_condition(
        &self,
        rep: &Replicated,
        present: &[Option<Namespace>],
        array: &ArrayStatus,
    ) -> Result<Option<String>> {
        let states = self.leg_states(rep, present, array)?;
        let mut problems = Vec::new();
        for (leg, state) in rep.legs.iter().zip(states) {
            match state {
                LegState::InSync => {}
                LegState::Missing => problems.push(format!("{} missing", leg.describe())),
                LegState::Resyncing(Some((done, total))) if total > 0 => problems.push(format!(
                    "{} resyncing, {}% done",
                    leg.describe(),
                    done.saturating_mul(100) / total
                )),
                LegState::Resyncing(_) => problems.push(format!("{} resyncing", leg.describe())),
            }
        }
        Ok((!problems.is_empty()).then(|| format!("degraded: {}", problems.join("; "))))
    }

    /// Re-adds the returned legs of one replicated volume. Call with the operation lock held.
    fn heal(&self, rec: &StagedVolume) -> Result<usize> {
        let Some(rep) = &rec.replicated else {
            return Ok(0);
        };
        let present = self.leg_namespaces(rep)?;
        let Some(array) = self.find_array(&present)? else {
            return Ok(0);
        };
        self.rejoin_legs(rec, rep, &present, &array)
    }

    /// The legs of running replicated volumes that have no controller at all (the kernel gave
    /// it up after `ctrl_loss_tmo`). Call with the operation lock held.
    fn given_up_legs(&self) -> Result<Vec<(String, Leg)>> {
        let mut out = Vec::new();
        for rec in self.store.all()? {
            let Some(rep) = &rec.replicated else {
                continue;
            };
            if self.find_array(&self.leg_namespaces(rep)?)?.is_none() {
                continue;
            }
            for leg in &rep.legs {
                if fabrics::find_controller(&*self.host, &leg.target, &self.cfg.host)?.is_none() {
                    out.push((rec.volume_id.clone(), leg.clone()));
                }
            }
        }
        Ok(out)
    }

    /// The periodic check: connects the legs whose controller the kernel gave up, then re-adds
    /// every returned leg of every staged replicated volume. Failures are logged and tried again
    /// at the next check; returns how many legs went back into their arrays.
    ///
    /// The connects run without the operation lock: to an appliance that is still away one can
    /// take the kernel's TCP connect timeout, and every other operation of the node would wait.
    /// A volume unstaged meanwhile gets its new controller disconnected again.
    pub fn heal_replicated(&self) -> usize {
        let lost = {
            let _guard = self.guard();
            self.given_up_legs().unwrap_or_else(|e| {
                tracing::warn!(error = %e, "looking for legs to reconnect");
                Vec::new()
            })
        };
        for (volume_id, leg) in lost {
            if let Err(e) = self.connect_leg(&volume_id, &leg) {
                tracing::debug!(volume_id, leg = %leg.volume_id, error = %e,
                    "leg still unreachable");
                continue;
            }
            let _guard = self.guard();
            let staged = self
                .store
                .all()
                .map(|all| all.iter().any(|r| r.targets().contains(&&leg.target)));
            if let Ok(false) = staged {
                tracing::info!(volume_id, leg = %leg.volume_id,
                    "volume unstaged while its leg reconnected: disconnecting the leg again");
                let undone = fabrics::find_controller(&*self.host, &leg.target, &self.cfg.host)
                    .and_then(|c| c.map_or(Ok(()), |c| fabrics::disconnect(&*self.host, &c.name)));
                if let Err(e) = undone {
                    tracing::warn!(volume_id, error = %e, "could not disconnect the leg");
                }
            }
        }
        let _guard = self.guard();
        let records = match self.store.all() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "reading the staged volumes for the replica check");
                return 0;
            }
        };
        let mut rejoined = 0;
        for rec in records.iter().filter(|r| r.replicated.is_some()) {
            match self.heal(rec) {
                Ok(n) => rejoined += n,
                Err(e) => tracing::warn!(volume_id = %rec.volume_id, error = %e,
                    "could not re-add a returned leg; tried again at the next check"),
            }
        }
        rejoined
    }

    /// NodeGetVolumeStats of a replicated volume: usage of the md device, and its condition
    /// after re-adding any leg that came back.
    pub(super) fn stats_replicated(
        &self,
        rec: &StagedVolume,
        volume_path: &Path,
    ) -> Result<VolumeStats> {
        let Some(rep) = &rec.replicated else {
            return Err(Error::Internal("not a replicated volume".to_owned()));
        };
        {
            let _guard = self.guard();
            if let Err(e) = self.heal(rec) {
                tracing::warn!(volume_id = %rec.volume_id, error = %e,
                    "could not re-add a returned leg");
            }
        }
        let present = self.leg_namespaces(rep)?;
        let array = self.find_array(&present)?;
        let md = array.as_ref().map(|a| Namespace {
            disk: a.md.clone(),
            dev: a.dev.clone(),
            size_bytes: a.size_bytes,
        });
        let shown = match &rec.encrypted {
            Some(_) => self.volume_device(rec)?,
            None => md,
        };
        let table = mount::table(&*self.host)?;
        self.volume_path_mount(&table, rec, shown.as_ref(), volume_path)?;
        let abnormal = match &array {
            None => Some(format!(
                "no leg of the replicated volume is present: md array {} is not running",
                rep.array
            )),
            Some(_) if shown.is_none() => Some(format!(
                "its LUKS2 mapping {} is not open",
                rec.encrypted.as_ref().map_or("", |e| e.mapping.as_str())
            )),
            Some(a) => self.replicated_condition(rep, &present, a)?,
        };
        let usage = match (&rec.capability.access, &shown) {
            (Access::Mount { .. }, _) => Usage::Filesystem(
                self.host
                    .statvfs(volume_path)
                    .map_err(|e| Error::io(format!("statvfs {}", path_str(volume_path)), &e))?,
            ),
            (Access::Block, Some(d)) => Usage::Block(d.size_bytes),
            (Access::Block, None) => Usage::Block(0),
        };
        Ok(VolumeStats { usage, abnormal })
    }

    /// NodeUnstageVolume of a replicated volume (its record is at `staging_path`): unmount,
    /// flush and stop the md array, disconnect every leg (also those whose appliance is gone),
    /// forget the record.
    pub(super) fn unstage_replicated(
        &self,
        rec: &StagedVolume,
        staging_path: &Path,
        table: &[MountEntry],
    ) -> Result<()> {
        let Some(rep) = &rec.replicated else {
            return Err(Error::Internal("not a replicated volume".to_owned()));
        };
        let id = rec.volume_id.as_str();
        let shown = self.volume_device(rec)?;
        Self::check_unpublished(table, rec, shown.as_ref(), staging_path)?;
        if matches!(rec.capability.access, Access::Mount { .. }) {
            mount::unmount_all(&*self.host, staging_path)?;
        }
        // md completes a flush on the legs that are there: a failure is never "lost".
        self.close_encrypted(rec, || Ok(false))?;
        let md = self.raw_device(rec)?;
        if let Some(md) = &md {
            let device = self.device_path(&md.disk);
            // md completes the flush on the legs that are there; it fails only with none.
            if let Err(e) = self.host.sync_device(&device) {
                return Err(Error::io(format!("flushing {}", path_str(&device)), &e));
            }
            raid::stop(&*self.host, &device)?;
        } else {
            tracing::warn!(volume_id = id, array = %rep.array,
                "md array not running at unstage: nothing to flush or stop");
        }
        let others = self.store.all()?;
        for leg in &rep.legs {
            let shared = others
                .iter()
                .any(|o| o.volume_id != id && o.targets().contains(&&leg.target));
            if shared {
                continue;
            }
            if let Some(c) = fabrics::find_controller(&*self.host, &leg.target, &self.cfg.host)? {
                fabrics::disconnect(&*self.host, &c.name)?;
            }
        }
        self.store.remove(id)
    }

    /// NodeExpandVolume of a replicated volume: every leg grew on its appliance (the controller
    /// side grows each by the same amount), so rescan each, grow the md array to them, then the
    /// filesystem.
    pub(super) fn expand_replicated(&self, rec: &StagedVolume, req: &ExpandRequest) -> Result<u64> {
        let Some(rep) = &rec.replicated else {
            return Err(Error::Internal("not a replicated volume".to_owned()));
        };
        let id = rec.volume_id.as_str();
        let present = self.leg_namespaces(rep)?;
        let array = self.find_array(&present)?.ok_or_else(|| {
            Error::Unavailable(format!(
                "volume {id}: its md array {} is not running",
                rep.array
            ))
        })?;
        let md = Namespace {
            disk: array.md.clone(),
            dev: array.dev.clone(),
            size_bytes: array.size_bytes,
        };
        let shown = match &rec.encrypted {
            Some(_) => self.volume_device(rec)?.ok_or_else(|| {
                Error::Unavailable(format!(
                    "volume {id}: its LUKS2 mapping is not open; stage it again"
                ))
            })?,
            None => md,
        };
        let table = mount::table(&*self.host)?;
        self.volume_path_mount(&table, rec, Some(&shown), &req.volume_path)?;
        Self::check_expand_access(rec, req.access.as_ref())?;
        if req.limit_bytes > 0 && array.size_bytes > req.limit_bytes {
            return Err(Error::OutOfRange(format!(
                "volume {id} is already {} bytes, more than capacity_range.limit_bytes {}; \
                 volumes do not shrink",
                array.size_bytes, req.limit_bytes
            )));
        }
        Self::check_growable_mount(&table, rec, &shown.dev)?;
        if let Some(why) = self.replicated_condition(rep, &present, &array)? {
            return Err(Error::Unavailable(format!(
                "volume {id}: a replicated volume grows only with every leg in sync ({why}); \
                 retry once the missing leg is back and resynced"
            )));
        }
        let leg_need = match req.required_bytes {
            0 => 0,
            r => r.saturating_add(raid::DATA_OFFSET_BYTES),
        };
        for (leg, ns) in rep.legs.iter().zip(&present) {
            let ns = ns.as_ref().ok_or_else(|| {
                Error::Unavailable(format!("volume {id}: {} is not present", leg.describe()))
            })?;
            let c = fabrics::find_controller(&*self.host, &leg.target, &self.cfg.host)?
                .filter(|c| c.state == "live")
                .ok_or_else(|| {
                    Error::Unavailable(format!(
                        "volume {id}: {} has no live controller",
                        leg.describe()
                    ))
                })?;
            let size = self.rescan_for_size(&c, &ns.disk, leg_need)?;
            if size < leg_need {
                return Err(Error::OutOfRange(format!(
                    "volume {id}: {} is {size} bytes after a rescan, less than the {leg_need} \
                     bytes capacity_range.required_bytes {} needs (md keeps {} bytes of each \
                     leg); the node grows what the controller gave (ControllerExpandVolume \
                     first)",
                    leg.describe(),
                    req.required_bytes,
                    raid::DATA_OFFSET_BYTES
                )));
            }
        }
        let device = self.device_path(&array.md);
        raid::grow_to_max(&*self.host, &device)?;
        let size = raid::status(&*self.host, &array.md)
            .map_err(|e| Error::io(format!("reading {}'s state", array.md), &e))?
            .size_bytes;
        if size < req.required_bytes {
            return Err(Error::OutOfRange(format!(
                "volume {id}: md array {} is {size} bytes after growing, less than \
                 capacity_range.required_bytes {}",
                array.md, req.required_bytes
            )));
        }
        let shown = self.grow_mapping(rec, shown, req.key.as_ref())?;
        if let Access::Mount { fs_type, .. } = &rec.capability.access {
            let device = self.device_path(&shown.disk);
            filesystem::grow(&*self.host, fs_type, &device, &rec.staging_path)?;
        }
        Ok(size)
    }
}
