//! A fake host for unit tests: a sysfs tree and /dev in a temp dir, a mount table, and a
//! command runner that records every command and models the few the plugin runs. It sits
//! below [`Host`]: everything above (sysfs lookups, mountinfo parsing, the volume flows) is the
//! real code.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::host::{CmdOutput, FsUsage, Host};

mod luks;
mod md;

pub use luks::HEADER_SECTORS as LUKS_HEADER_SECTORS;

#[derive(Debug, Clone)]
struct FakeMount {
    dev: String,
    root: String,
    mount_point: PathBuf,
    read_only: bool,
    fs_type: String,
    source: String,
}

#[derive(Debug, Clone)]
struct FakeNs {
    nguid: String,
    uuid: String,
    sectors: u64,
}

#[derive(Debug, Default)]
struct FakeState {
    mounts: Vec<FakeMount>,
    commands: Vec<(String, Vec<String>)>,
    fail: Vec<String>,
    fail_with: Vec<(String, i32, String)>,
    connect_errno: Option<i32>,
    fabrics_writes: Vec<String>,
    signatures: HashMap<String, String>,
    subsystems: HashMap<String, Vec<FakeNs>>,
    udev_delay: u32,
    pending_nodes: Vec<(PathBuf, u32)>,
    sleeps: u32,
    synced: Vec<PathBuf>,
    attr_writes: Vec<(PathBuf, String)>,
    ops: Vec<String>,
    state_changes: Vec<(String, String, u32)>,
    kernel_auth: bool,
    release: Option<String>,
    loadable: Vec<String>,
    modprobe_missing: bool,
    /// Programs not installed: running one is ENOENT, as for the real host.
    missing_programs: Vec<String>,
    /// Runs at the next connect, before the kernel answers (another caller's work meanwhile).
    during_connect: md::DuringConnect,
    hidden_device_nodes: bool,
    /// cryptsetup's headers and mappings.
    luks: luks::Luks,
}

/// The fake host.
#[derive(Debug)]
pub struct FakeHost {
    _dir: tempfile::TempDir,
    sys: PathBuf,
    dev: PathBuf,
    modules: PathBuf,
    /// A scratch directory for staging and target paths.
    pub work: PathBuf,
    state: Mutex<FakeState>,
}

fn write(path: &Path, value: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, format!("{value}\n")).unwrap();
}

fn arg_basename(p: &str) -> String {
    Path::new(p)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn ok(stdout: &str) -> io::Result<CmdOutput> {
    Ok(CmdOutput {
        code: Some(0),
        stdout: stdout.to_owned(),
        stderr: String::new(),
    })
}

fn fail(code: i32, stderr: &str) -> io::Result<CmdOutput> {
    Ok(CmdOutput {
        code: Some(code),
        stdout: String::new(),
        stderr: stderr.to_owned(),
    })
}

impl FakeHost {
    /// An empty host.
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        let dev = dir.path().join("dev");
        let work = dir.path().join("work");
        let modules = dir.path().join("lib/modules");
        for d in [&sys, &dev, &work, &modules] {
            fs::create_dir_all(d).unwrap();
        }
        let host = FakeHost {
            _dir: dir,
            sys,
            dev,
            modules,
            work,
            state: Mutex::new(FakeState::default()),
        };
        // The NVMe/TCP initiator is loaded unless a test says otherwise.
        host.load_module("nvme_fabrics");
        host.load_module("nvme_tcp");
        host.load_module("dm_crypt");
        fs::write(host.dev.join("nvme-fabrics"), "").unwrap();
        host
    }

    /// Unloads the NVMe/TCP initiator: no `/dev/nvme-fabrics`, no nvme_fabrics or nvme_tcp in
    /// `/sys/module`, and modprobe finds neither (see [`FakeHost::set_loadable`]).
    pub fn remove_initiator(&self) {
        fs::remove_file(self.dev.join("nvme-fabrics")).unwrap();
        for m in ["nvme_fabrics", "nvme_tcp"] {
            fs::remove_dir_all(self.sys.join("module").join(m)).unwrap();
        }
        self.st().loadable.clear();
    }

    /// modprobe (the plugin's, and the kernel's own request_module at a connect) can load
    /// these modules; loading nvme-tcp loads nvme-fabrics too, as its dependency.
    pub fn set_loadable(&self, modules: &[&str]) {
        self.st().loadable = modules.iter().map(|m| (*m).to_owned()).collect();
    }

    /// The plugin's image has no modprobe.
    pub fn set_modprobe_missing(&self) {
        self.st().modprobe_missing = true;
    }

    /// Modules load, but their device nodes never appear in this `/dev` (a container without
    /// the host's `/dev`).
    pub fn hide_device_nodes(&self) {
        self.st().hidden_device_nodes = true;
    }

    /// The running kernel is `release`, with no module indexes.
    pub fn set_release(&self, release: &str) {
        self.st().release = Some(release.to_owned());
    }

    /// Loads `module` (dash form) as the kernel would, when it is loadable.
    fn insert_module(&self, module: &str) -> bool {
        if !self.st().loadable.iter().any(|m| m == module) {
            return false;
        }
        self.load_module(&module.replace('-', "_"));
        if module == "nvme-tcp" || module == "nvme-fabrics" {
            self.load_module("nvme_fabrics");
            if !self.st().hidden_device_nodes {
                fs::write(self.dev.join("nvme-fabrics"), "").unwrap();
            }
        }
        true
    }

    fn st(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }

    /// Adds a disk to /sys/block (no device node).
    pub fn add_disk(&self, name: &str, dev: &str, nguid: &str, uuid: &str, sectors: u64) {
        let dir = self.sys.join("block").join(name);
        write(&dir.join("nguid"), nguid);
        write(&dir.join("uuid"), uuid);
        write(&dir.join("dev"), dev);
        write(&dir.join("size"), &sectors.to_string());
    }

    /// Adds a controller to /sys/class/nvme.
    pub fn add_controller(
        &self,
        name: &str,
        transport: &str,
        address: &str,
        subsysnqn: &str,
        hostnqn: &str,
        state: &str,
    ) {
        let dir = self.sys.join("class/nvme").join(name);
        write(&dir.join("transport"), transport);
        write(&dir.join("address"), address);
        write(&dir.join("subsysnqn"), subsysnqn);
        write(&dir.join("hostnqn"), hostnqn);
        write(&dir.join("state"), state);
        write(&dir.join("delete_controller"), "");
        write(&dir.join("rescan_controller"), "");
        // The kernel's defaults for a connect that names none of these options.
        write(&dir.join("fast_io_fail_tmo"), "off");
        write(&dir.join("ctrl_loss_tmo"), "600");
        write(&dir.join("reconnect_delay"), "10");
        write(&dir.join("kato"), "5");
        if self.st().kernel_auth && !hostnqn.is_empty() {
            // What the kernel shows for a controller connected without keys.
            write(&dir.join("dhchap_secret"), "none");
            write(&dir.join("dhchap_ctrl_secret"), "none");
        }
    }

    /// The kernel is built with NVMe in-band authentication (CONFIG_NVME_AUTH): fabrics
    /// controllers get `dhchap_secret` / `dhchap_ctrl_secret`, and a connect with keys works.
    /// Without it (the default) a connect with keys fails with EIO, as the target asks for an
    /// authentication the kernel cannot do.
    pub fn set_kernel_auth(&self, on: bool) {
        self.st().kernel_auth = on;
    }

    /// The running kernel is `release`, with these `modules.dep` and `modules.builtin`.
    pub fn set_modules(&self, release: &str, dep: &str, builtin: &str) {
        let dir = self.modules.join(release);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("modules.dep"), dep).unwrap();
        fs::write(dir.join("modules.builtin"), builtin).unwrap();
        self.st().release = Some(release.to_owned());
    }

    /// Module `name` is loaded (`/sys/module/NAME`).
    pub fn load_module(&self, name: &str) {
        fs::create_dir_all(self.sys.join("module").join(name)).unwrap();
    }

    /// Removes a controller attribute (a kernel that does not have it).
    pub fn remove_attr(&self, controller: &str, attr: &str) {
        fs::remove_file(self.sys.join("class/nvme").join(controller).join(attr)).unwrap();
    }

    /// A controller attribute as sysfs shows it.
    pub fn attr(&self, controller: &str, attr: &str) -> String {
        fs::read_to_string(self.sys.join("class/nvme").join(controller).join(attr))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// The kernel deletes a controller by itself (ctrl_loss_tmo spent), with its namespaces.
    pub fn remove_controller_named(&self, name: &str) {
        self.remove_controller(&self.sys.join("class/nvme").join(name));
    }

    /// Controller `name` turns `state` after `sleeps` more sleeps (an appliance coming back).
    pub fn set_controller_state_after(&self, name: &str, state: &str, sleeps: u32) {
        self.st()
            .state_changes
            .push((name.to_owned(), state.to_owned(), sleeps));
    }

    /// Sleeps so far.
    pub fn sleeps(&self) -> u32 {
        self.st().sleeps
    }

    /// Every host operation in order: `run PROGRAM ARGS`, `write ATTR of CONTROLLER`,
    /// `sync DEVICE`, `connect`.
    pub fn ops(&self) -> Vec<String> {
        self.st().ops.clone()
    }

    /// Sets a controller's state attribute.
    pub fn set_controller_state(&self, name: &str, state: &str) {
        write(&self.sys.join("class/nvme").join(name).join("state"), state);
    }

    /// Registers a subsystem whose namespace appears when it is connected.
    pub fn add_subsystem(&self, nqn: &str, nguid: &str, uuid: &str, sectors: u64) {
        self.st()
            .subsystems
            .entry(nqn.to_owned())
            .or_default()
            .push(FakeNs {
                nguid: nguid.to_owned(),
                uuid: uuid.to_owned(),
                sectors,
            });
    }

    /// Sets the size a subsystem's namespaces report after the next rescan.
    pub fn grow_subsystem(&self, nqn: &str, sectors: u64) {
        for ns in self.st().subsystems.get_mut(nqn).unwrap() {
            ns.sectors = sectors;
        }
    }

    /// Device nodes appear only after this many sleeps (udev lag).
    pub fn set_udev_delay(&self, sleeps: u32) {
        self.st().udev_delay = sleeps;
    }

    /// Makes blkid report `export` for `disk`.
    pub fn set_signature(&self, disk: &str, export: &str) {
        self.st()
            .signatures
            .insert(disk.to_owned(), export.to_owned());
    }

    /// The next operation `op` fails once (a program name, `connect`, `delete_controller`,
    /// `rescan_controller`, `sync`).
    pub fn fail_next(&self, op: &str) {
        self.st().fail.push(op.to_owned());
    }

    /// The next write to /dev/nvme-fabrics fails once with `errno` (EIO: the target answered the
    /// Connect with an error status; ECONNREFUSED: nothing listens).
    pub fn fail_next_connect(&self, errno: i32) {
        self.st().connect_errno = Some(errno);
    }

    /// The next run of `program` exits `code` with `stderr` once, doing nothing.
    pub fn fail_next_with(&self, program: &str, code: i32, stderr: &str) {
        self.st()
            .fail_with
            .push((program.to_owned(), code, stderr.to_owned()));
    }

    fn take_failure(&self, op: &str) -> bool {
        let mut st = self.st();
        match st.fail.iter().position(|f| f == op) {
            Some(i) => {
                st.fail.remove(i);
                true
            }
            None => false,
        }
    }

    /// Every option string written to /dev/nvme-fabrics.
    pub fn fabrics_writes(&self) -> Vec<String> {
        self.st().fabrics_writes.clone()
    }

    /// The argument lists of every run of `program`.
    pub fn all_commands(&self) -> Vec<(String, Vec<String>)> {
        self.st().commands.clone()
    }

    /// The arguments of every run of `program`.
    pub fn commands_of(&self, program: &str) -> Vec<Vec<String>> {
        self.st()
            .commands
            .iter()
            .filter(|(p, _)| p == program)
            .map(|(_, a)| a.clone())
            .collect()
    }

    /// Devices flushed.
    pub fn synced(&self) -> Vec<PathBuf> {
        self.st().synced.clone()
    }

    /// Sysfs attribute writes.
    pub fn attr_writes(&self) -> Vec<(PathBuf, String)> {
        self.st().attr_writes.clone()
    }

    /// Controllers present.
    pub fn controller_names(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.sys.join("class/nvme"))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Mount points, in mount order, with `ro` marks.
    pub fn mounts(&self) -> Vec<(PathBuf, bool)> {
        self.st()
            .mounts
            .iter()
            .map(|m| (m.mount_point.clone(), m.read_only))
            .collect()
    }

    /// Adds a foreign mount.
    pub fn add_mount(&self, dev: &str, mount_point: &Path, fs_type: &str, source: &str) {
        self.st().mounts.push(FakeMount {
            dev: dev.to_owned(),
            root: "/".to_owned(),
            mount_point: mount_point.to_owned(),
            read_only: false,
            fs_type: fs_type.to_owned(),
            source: source.to_owned(),
        });
    }

    fn parse_options(options: &str) -> HashMap<String, String> {
        options
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    fn mount(&self, args: &[String]) -> io::Result<CmdOutput> {
        let exists = |p: &str| Path::new(p).exists();
        match args
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["--bind", src, tgt] => {
                if !exists(src) || !exists(tgt) {
                    return fail(32, "mount: special device or mount point does not exist");
                }
                let mut st = self.st();
                let entry = if Path::new(src).starts_with(&self.dev) {
                    // libmount binds a device-mapper node by its /dev/mapper name.
                    let node = arg_basename(src);
                    let dm_name = self.sys.join("block").join(&node).join("dm/name");
                    let root = match fs::read_to_string(dm_name) {
                        Ok(name) => format!("/mapper/{}", name.trim()),
                        Err(_) => format!("/{node}"),
                    };
                    FakeMount {
                        dev: "0:5".into(),
                        root,
                        mount_point: PathBuf::from(tgt),
                        read_only: false,
                        fs_type: "devtmpfs".into(),
                        source: "udev".into(),
                    }
                } else if let Some(m) = st
                    .mounts
                    .iter()
                    .rev()
                    .find(|m| m.mount_point == Path::new(src))
                {
                    FakeMount {
                        mount_point: PathBuf::from(tgt),
                        read_only: false,
                        ..m.clone()
                    }
                } else {
                    FakeMount {
                        dev: "0:99".into(),
                        root: (*src).to_owned(),
                        mount_point: PathBuf::from(tgt),
                        read_only: false,
                        fs_type: "tmpfs".into(),
                        source: "tmpfs".into(),
                    }
                };
                st.mounts.push(entry);
                ok("")
            }
            ["-o", "remount,bind,ro", tgt] => {
                let mut st = self.st();
                match st
                    .mounts
                    .iter_mut()
                    .rev()
                    .find(|m| m.mount_point == Path::new(tgt))
                {
                    Some(m) => {
                        m.read_only = true;
                        ok("")
                    }
                    None => fail(32, "mount: not mounted"),
                }
            }
            ["-t", fs_type, rest @ ..] => {
                let (opts, src, tgt) = match rest {
                    ["-o", opts, src, tgt] => (*opts, *src, *tgt),
                    [src, tgt] => ("", *src, *tgt),
                    _ => return fail(1, "bad fake mount args"),
                };
                if !exists(src) || !exists(tgt) {
                    return fail(32, "mount: special device or mount point does not exist");
                }
                let disk = arg_basename(src);
                let dev = fs::read_to_string(self.sys.join("block").join(&disk).join("dev"))?;
                let sig = self.st().signatures.get(&disk).cloned().unwrap_or_default();
                if !sig.contains(&format!("TYPE={fs_type}")) {
                    return fail(32, "mount: wrong fs type, bad superblock");
                }
                self.st().mounts.push(FakeMount {
                    dev: dev.trim().to_owned(),
                    root: "/".into(),
                    mount_point: PathBuf::from(tgt),
                    read_only: opts.split(',').any(|o| o == "ro"),
                    fs_type: (*fs_type).to_owned(),
                    source: (*src).to_owned(),
                });
                ok("")
            }
            _ => fail(1, "bad fake mount args"),
        }
    }

    fn remove_controller(&self, ctrl_dir: &Path) {
        let name = arg_basename(&ctrl_dir.to_string_lossy());
        fs::remove_dir_all(ctrl_dir).unwrap();
        let prefix = format!("{name}n");
        if let Ok(entries) = fs::read_dir(self.sys.join("block")) {
            for e in entries {
                let disk = e.unwrap().file_name().to_string_lossy().into_owned();
                if disk.starts_with(&prefix) {
                    fs::remove_dir_all(self.sys.join("block").join(&disk)).unwrap();
                    let _ = fs::remove_file(self.dev.join(&disk));
                }
            }
        }
    }
}

impl Host for FakeHost {
    fn sys_root(&self) -> &Path {
        &self.sys
    }

    fn dev_root(&self) -> &Path {
        &self.dev
    }

    fn connect_fabrics(&self, options: &str) -> io::Result<String> {
        if !self.dev.join("nvme-fabrics").exists() {
            return Err(io::Error::from_raw_os_error(2)); // ENOENT: opening the device
        }
        self.st().fabrics_writes.push(options.to_owned());
        self.st().ops.push("connect".to_owned());
        let during = self.st().during_connect.take();
        if let Some(during) = during {
            during();
        }
        if self.take_failure("connect") {
            return Err(io::Error::from_raw_os_error(111)); // ECONNREFUSED
        }
        if let Some(errno) = self.st().connect_errno.take() {
            return Err(io::Error::from_raw_os_error(errno));
        }
        let o = Self::parse_options(options);
        // nvmf_create_ctrl: request_module("nvme-<transport>"), then EINVAL without a handler.
        let transport = format!("nvme-{}", o["transport"]);
        if !self
            .sys
            .join("module")
            .join(transport.replace('-', "_"))
            .exists()
            && !self.insert_module(&transport)
        {
            return Err(io::Error::from_raw_os_error(22)); // EINVAL
        }
        let kernel_auth = self.st().kernel_auth;
        if o.contains_key("dhchap_secret") && !kernel_auth {
            // The target asks for authentication the kernel cannot do: the Connect fails.
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        let address = format!("traddr={},trsvcid={}", o["traddr"], o["trsvcid"]);
        for c in crate::sysfs::controllers(self)? {
            if c.subsysnqn == o["nqn"]
                && c.hostnqn == o["hostnqn"]
                && c.usable()
                && c.traddr == o["traddr"]
                && c.trsvcid == o["trsvcid"]
            {
                return Err(io::Error::from_raw_os_error(114)); // EALREADY
            }
        }
        let existing = self.controller_names();
        let instance = (0..)
            .find(|i| !existing.contains(&format!("nvme{i}")))
            .unwrap();
        let name = format!("nvme{instance}");
        self.add_controller(
            &name,
            &o["transport"],
            &address,
            &o["nqn"],
            &o["hostnqn"],
            "live",
        );
        // What sysfs shows of the options, as the kernel prints them.
        let dir = self.sys.join("class/nvme").join(&name);
        let off_if_negative = |v: &str| {
            if v.starts_with('-') {
                "off".to_owned()
            } else {
                v.to_owned()
            }
        };
        for (opt, attr) in [
            ("fast_io_fail_tmo", "fast_io_fail_tmo"),
            ("ctrl_loss_tmo", "ctrl_loss_tmo"),
            ("reconnect_delay", "reconnect_delay"),
            ("keep_alive_tmo", "kato"),
        ] {
            if let Some(v) = o.get(opt) {
                write(&dir.join(attr), &off_if_negative(v));
            }
        }
        for opt in ["dhchap_secret", "dhchap_ctrl_secret"] {
            if let Some(v) = o.get(opt) {
                write(&dir.join(opt), v);
            }
        }
        let namespaces = self
            .st()
            .subsystems
            .get(&o["nqn"])
            .cloned()
            .unwrap_or_default();
        for (i, ns) in namespaces.iter().enumerate() {
            let disk = format!("{name}n{}", i + 1);
            self.add_disk(
                &disk,
                &format!("259:{}", instance * 10 + i),
                &ns.nguid,
                &ns.uuid,
                ns.sectors,
            );
            let node = self.dev.join(&disk);
            let delay = self.st().udev_delay;
            if delay == 0 {
                fs::write(&node, "").unwrap();
            } else {
                self.st().pending_nodes.push((node, delay));
            }
        }
        Ok(format!("instance={instance},cntlid=1\n"))
    }

    fn write_attr(&self, path: &Path, value: &str) -> io::Result<()> {
        let attr = arg_basename(&path.to_string_lossy());
        let ctrl = path
            .parent()
            .map(|d| arg_basename(&d.to_string_lossy()))
            .unwrap_or_default();
        self.st()
            .attr_writes
            .push((path.to_owned(), value.to_owned()));
        self.st().ops.push(format!("write {attr} of {ctrl}"));
        if self.take_failure(&attr) {
            return Err(io::Error::from_raw_os_error(16)); // EBUSY
        }
        if !path.exists() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        let ctrl_dir = path.parent().unwrap();
        match attr.as_str() {
            "delete_controller" => self.remove_controller(ctrl_dir),
            "rescan_controller" => {
                let nqn = fs::read_to_string(ctrl_dir.join("subsysnqn"))?
                    .trim()
                    .to_owned();
                let name = arg_basename(&ctrl_dir.to_string_lossy());
                let namespaces = self.st().subsystems.get(&nqn).cloned().unwrap_or_default();
                for (i, ns) in namespaces.iter().enumerate() {
                    let disk = self.sys.join("block").join(format!("{name}n{}", i + 1));
                    write(&disk.join("size"), &ns.sectors.to_string());
                }
            }
            "fast_io_fail_tmo" => {
                let v: i32 = value
                    .trim()
                    .parse()
                    .map_err(|_| io::Error::from_raw_os_error(22))?; // EINVAL
                let shown = if v < 0 {
                    "off".to_owned()
                } else {
                    v.to_string()
                };
                fs::write(path, format!("{shown}\n"))?;
            }
            "dhchap_secret" | "dhchap_ctrl_secret" => {
                // The kernel refuses a key for a controller connected without one, and
                // anything but a DHHC-1 string.
                if fs::read_to_string(path)?.trim() == "none" || !value.starts_with("DHHC-1:") {
                    return Err(io::Error::from_raw_os_error(22)); // EINVAL
                }
                fs::write(path, format!("{value}\n"))?;
            }
            _ => fs::write(path, value)?,
        }
        Ok(())
    }

    fn run(&self, program: &str, args: &[String]) -> io::Result<CmdOutput> {
        if self.st().missing_programs.iter().any(|p| p == program) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        self.st().commands.push((program.to_owned(), args.to_vec()));
        self.st()
            .ops
            .push(format!("run {program} {}", args.join(" ")));
        if self.take_failure(program) {
            return fail(1, &format!("{program}: injected failure"));
        }
        let injected = {
            let mut st = self.st();
            let at = st.fail_with.iter().position(|(p, _, _)| p == program);
            at.map(|i| st.fail_with.remove(i))
        };
        if let Some((_, code, stderr)) = injected {
            return fail(code, &stderr);
        }
        let last = args.last().map(String::as_str).unwrap_or_default();
        match program {
            "blkid" => match self.st().signatures.get(&arg_basename(last)) {
                Some(export) => ok(export),
                None => fail(2, ""),
            },
            "mkfs.ext4" | "mkfs.xfs" => {
                let fs_type = program.trim_start_matches("mkfs.");
                self.set_signature(&arg_basename(last), &format!("TYPE={fs_type}\n"));
                ok("")
            }
            "mount" => self.mount(args),
            "umount" => {
                let mut st = self.st();
                match st
                    .mounts
                    .iter()
                    .rposition(|m| m.mount_point == Path::new(last))
                {
                    Some(i) => {
                        st.mounts.remove(i);
                        ok("")
                    }
                    None => fail(32, "umount: not mounted"),
                }
            }
            "resize2fs" | "xfs_growfs" | "e2fsck" => ok(""),
            "mdadm" => self.mdadm(args),
            _ => fail(127, "command not found"),
        }
    }

    fn run_with_input(
        &self,
        program: &str,
        args: &[String],
        input: &[u8],
    ) -> io::Result<CmdOutput> {
        if self.st().missing_programs.iter().any(|p| p == program) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        self.st().commands.push((program.to_owned(), args.to_vec()));
        self.st()
            .ops
            .push(format!("run {program} {}", args.join(" ")));
        if self.take_failure(program) {
            return fail(1, &format!("{program}: injected failure"));
        }
        match program {
            "cryptsetup" => self.cryptsetup(args, input),
            _ => fail(127, "command not found"),
        }
    }

    fn mountinfo(&self) -> io::Result<String> {
        let st = self.st();
        let mut out = String::from("21 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n");
        for (i, m) in st.mounts.iter().enumerate() {
            out.push_str(&format!(
                "{} 21 {} {} {} {},relatime shared:{} - {} {} rw\n",
                100 + i,
                m.dev,
                m.root.replace(' ', "\\040"),
                m.mount_point.to_string_lossy().replace(' ', "\\040"),
                if m.read_only { "ro" } else { "rw" },
                i + 2,
                m.fs_type,
                m.source
            ));
        }
        Ok(out)
    }

    fn statvfs(&self, path: &Path) -> io::Result<FsUsage> {
        if !self.st().mounts.iter().any(|m| m.mount_point == path) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(FsUsage {
            total_bytes: 1 << 30,
            available_bytes: 1 << 29,
            used_bytes: 1 << 28,
            total_inodes: 65536,
            free_inodes: 65000,
        })
    }

    fn sync_device(&self, device: &Path) -> io::Result<()> {
        self.st().ops.push(format!("sync {}", device.display()));
        if self.take_failure("sync") {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        if !device.exists() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        self.st().synced.push(device.to_owned());
        Ok(())
    }

    fn sleep(&self, _duration: Duration) {
        let changes = {
            let mut st = self.st();
            let mut due = Vec::new();
            for (name, state, left) in &mut st.state_changes {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    due.push((name.clone(), state.clone()));
                }
            }
            st.state_changes.retain(|(_, _, left)| *left > 0);
            due
        };
        for (name, state) in changes {
            self.set_controller_state(&name, &state);
        }
        let mut st = self.st();
        st.sleeps += 1;
        for (node, left) in &mut st.pending_nodes {
            *left -= 1;
            if *left == 0 {
                fs::write(node, "").unwrap();
            }
        }
        st.pending_nodes.retain(|(_, left)| *left > 0);
    }

    fn kernel_release(&self) -> io::Result<String> {
        self.st()
            .release
            .clone()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn modules_root(&self) -> &Path {
        &self.modules
    }

    fn modprobe(&self, module: &str) -> io::Result<CmdOutput> {
        self.st()
            .commands
            .push(("modprobe".to_owned(), vec![module.to_owned()]));
        self.st().ops.push(format!("run modprobe {module}"));
        if self.st().modprobe_missing {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if self.insert_module(module) {
            return ok("");
        }
        let release = self.st().release.clone().unwrap_or_default();
        fail(
            1,
            &format!(
                "modprobe: FATAL: Module {module} not found in directory /lib/modules/{release}\n"
            ),
        )
    }
}

/// Log lines written while a test runs, every level.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with every log line of this thread captured; returns its result and the log.
pub fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    (out, text)
}
