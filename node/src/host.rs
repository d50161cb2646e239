//! Every access to the host goes through [`Host`]: the sysfs and /dev roots, the fabrics control
//! device, sysfs attribute writes, external commands, the mount table, statvfs, device flushes,
//! sleeping, the kernel's release and module indexes (what it was built with), and modprobe.
//!
//! The rest of the crate reads sysfs and /dev with plain `std::fs` under [`Host::sys_root`] and
//! [`Host::dev_root`], so unit tests point those at a temp dir holding a fake tree, and a fake
//! host below this trait models what the kernel does in reaction to writes (a controller
//! appears after a connect, disappears after `delete_controller`). Nothing above this trait is
//! replaced in tests.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// What a finished command left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdOutput {
    /// Exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl CmdOutput {
    /// True on exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Filesystem usage as statvfs(3) reports it, already multiplied out to bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsUsage {
    /// Size of the filesystem in bytes.
    pub total_bytes: u64,
    /// Bytes an unprivileged user may still allocate.
    pub available_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Inodes in total.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
}

/// The host the plugin drives. Methods block: callers run them off the async reactor.
pub trait Host: Send + Sync + fmt::Debug + 'static {
    /// Where sysfs is mounted (`/sys`).
    fn sys_root(&self) -> &Path;
    /// Where device nodes live (`/dev`).
    fn dev_root(&self) -> &Path;
    /// Writes one option string to `/dev/nvme-fabrics` in a single write and returns what the
    /// kernel answers on the same file descriptor (`instance=N,cntlid=M`).
    fn connect_fabrics(&self, options: &str) -> io::Result<String>;
    /// Writes a sysfs attribute (`delete_controller`, `rescan_controller`).
    fn write_attr(&self, path: &Path, value: &str) -> io::Result<()>;
    /// Runs `program` with `args`, stdin closed, and waits for it.
    fn run(&self, program: &str, args: &[String]) -> io::Result<CmdOutput>;
    /// Runs `program` with `args` and `input` on its stdin (then closed), and waits for it.
    /// The way secrets reach a command: never in its arguments, which any process on the host
    /// can read in /proc, nor in a file.
    fn run_with_input(&self, program: &str, args: &[String], input: &[u8])
        -> io::Result<CmdOutput>;
    /// The text of `/proc/self/mountinfo`.
    fn mountinfo(&self) -> io::Result<String>;
    /// statvfs(3) of a mounted path.
    fn statvfs(&self, path: &Path) -> io::Result<FsUsage>;
    /// Flushes a block device: its dirty page cache and the device's volatile write cache
    /// (fsync of the device node; the kernel sends an NVMe Flush).
    fn sync_device(&self, device: &Path) -> io::Result<()>;
    /// Sleeps (bounded waits for the kernel and udev).
    fn sleep(&self, duration: Duration);
    /// The running kernel's release (`uname -r`).
    fn kernel_release(&self) -> io::Result<String>;
    /// Where the kernels' module trees live (`/lib/modules`).
    fn modules_root(&self) -> &Path;
    /// Runs `modprobe MODULE` (loads a kernel module and what it depends on).
    fn modprobe(&self, module: &str) -> io::Result<CmdOutput>;
}

/// The real Linux host.
#[derive(Debug, Clone)]
pub struct LinuxHost {
    sys_root: PathBuf,
    dev_root: PathBuf,
    mountinfo: PathBuf,
    modules_root: PathBuf,
    modprobe: PathBuf,
}

impl Default for LinuxHost {
    fn default() -> Self {
        LinuxHost::new("/sys", "/dev")
    }
}

impl LinuxHost {
    /// A host with the given sysfs and /dev roots (tests point them at a temp dir).
    pub fn new(sys_root: impl Into<PathBuf>, dev_root: impl Into<PathBuf>) -> Self {
        LinuxHost {
            sys_root: sys_root.into(),
            dev_root: dev_root.into(),
            mountinfo: PathBuf::from("/proc/self/mountinfo"),
            modules_root: PathBuf::from("/lib/modules"),
            modprobe: PathBuf::from("modprobe"),
        }
    }

    /// Runs `program` instead of modprobe from `PATH` (tests point it at nothing, so that they
    /// never load a module into the machine running them).
    pub fn with_modprobe(mut self, program: impl Into<PathBuf>) -> Self {
        self.modprobe = program.into();
        self
    }
}

impl Host for LinuxHost {
    fn sys_root(&self) -> &Path {
        &self.sys_root
    }

    fn dev_root(&self) -> &Path {
        &self.dev_root
    }

    fn connect_fabrics(&self, options: &str) -> io::Result<String> {
        let path = self.dev_root.join("nvme-fabrics");
        let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
        // The kernel parses exactly one write per open file; a short write would be a second,
        // truncated connect, so anything but the full string is an error.
        let written = file.write(options.as_bytes())?;
        if written != options.len() {
            return Err(io::Error::other(format!(
                "short write to {}: {written} of {} bytes",
                path.display(),
                options.len()
            )));
        }
        let mut answer = String::new();
        file.read_to_string(&mut answer)?;
        Ok(answer)
    }

    fn write_attr(&self, path: &Path, value: &str) -> io::Result<()> {
        let mut file = OpenOptions::new().write(true).open(path)?;
        file.write_all(value.as_bytes())
    }

    fn run(&self, program: &str, args: &[String]) -> io::Result<CmdOutput> {
        let output = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        Ok(CmdOutput {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    fn run_with_input(
        &self,
        program: &str,
        args: &[String],
        input: &[u8],
    ) -> io::Result<CmdOutput> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // Callers pass a few hundred bytes at most, well below a pipe's buffer: the write
        // cannot wait on a child that has not started reading. A child that exits without
        // reading (EPIPE) is judged by its exit status below.
        if let Some(mut stdin) = child.stdin.take() {
            match stdin.write_all(input) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {}
                Err(e) => return Err(e),
            }
        }
        let output = child.wait_with_output()?;
        Ok(CmdOutput {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }

    fn mountinfo(&self) -> io::Result<String> {
        std::fs::read_to_string(&self.mountinfo)
    }

    fn statvfs(&self, path: &Path) -> io::Result<FsUsage> {
        let st = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
        // fsblkcnt_t/fsfilcnt_t and f_frsize are u64 on 64-bit Linux.
        let frag: u64 = st.fragment_size();
        let blocks: u64 = st.blocks();
        let free: u64 = st.blocks_free();
        let avail: u64 = st.blocks_available();
        Ok(FsUsage {
            total_bytes: blocks.saturating_mul(frag),
            available_bytes: avail.saturating_mul(frag),
            used_bytes: blocks.saturating_sub(free).saturating_mul(frag),
            total_inodes: st.files(),
            free_inodes: st.files_free(),
        })
    }

    fn sync_device(&self, device: &Path) -> io::Result<()> {
        File::open(device)?.sync_all()
    }

    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    fn kernel_release(&self) -> io::Result<String> {
        Ok(std::fs::read_to_string("/proc/sys/kernel/osrelease")?
            .trim()
            .to_owned())
    }

    fn modules_root(&self) -> &Path {
        &self.modules_root
    }

    fn modprobe(&self, module: &str) -> io::Result<CmdOutput> {
        self.run(&self.modprobe.to_string_lossy(), &[module.to_owned()])
    }
}
