//! The serial log of a QEMU guest (qemu/run-guest.sh) whose script marks its steps with
//! `<MARK>-BEGIN name` .. `<MARK>-END name rc=N`: each step's output lines and exit code.

use std::collections::HashMap;

/// One guest step: its output lines and exit code.
#[derive(Debug, Default)]
pub struct Step {
    pub out: Vec<String>,
    pub rc: Option<i32>,
}

impl Step {
    pub fn text(&self) -> String {
        self.out.join("\n")
    }

    /// Asserts the step exited 0.
    pub fn ok(&self, name: &str) -> &Self {
        assert_eq!(
            self.rc,
            Some(0),
            "guest step {name} failed:\n{}",
            self.text()
        );
        self
    }

    /// The first word after `prefix` on the first line that starts with it.
    pub fn find_word_after(&self, prefix: &str) -> Option<&str> {
        self.out
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
    }

    /// [`Step::find_word_after`], which must be there.
    pub fn word_after(&self, prefix: &str) -> &str {
        self.find_word_after(prefix)
            .unwrap_or_else(|| panic!("`{prefix}` in:\n{}", self.text()))
    }
}

/// Splits `log` into the steps marked with `mark` (e.g. `EVCLI`).
pub fn steps(log: &str, mark: &str) -> HashMap<String, Step> {
    let (begin, end) = (format!("{mark}-BEGIN "), format!("{mark}-END "));
    let mut steps: HashMap<String, Step> = HashMap::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix(&begin) {
            current = Some(name.trim().to_owned());
            steps.entry(name.trim().to_owned()).or_default();
        } else if let Some(ended) = line.strip_prefix(&end) {
            let (name, rc) = ended
                .split_once(" rc=")
                .unwrap_or_else(|| panic!("{end}name rc=N, got {line:?}"));
            steps.entry(name.to_owned()).or_default().rc = rc.trim().parse().ok();
            current = None;
        } else if let Some(name) = &current {
            steps
                .get_mut(name)
                .expect("begun")
                .out
                .push(line.to_owned());
        }
    }
    steps
}

/// qemu/run-guest.sh for a guest on slirp (it reaches this host at 10.0.2.2) with the nvme-tcp
/// and virtio-net modules: run-guest options are added with [`GuestRun::args`], then
/// [`GuestRun::run`] boots it.
pub struct GuestRun {
    cmd: std::process::Command,
    qemu: Vec<String>,
}

impl GuestRun {
    /// A guest named `name` with `mem_mb` of memory, its serial log at `log`, killed after
    /// `timeout_s`.
    pub fn new(name: &str, log: &std::path::Path, timeout_s: u64, mem_mb: u32) -> Self {
        let mut cmd = std::process::Command::new(super::repo_root().join("qemu/run-guest.sh"));
        cmd.args(["--name", name, "--timeout", &timeout_s.to_string()])
            .args(["--mem", &mem_mb.to_string()])
            .arg("--log")
            .arg(log)
            .args(["--module", "nvme-tcp", "--module", "virtio_pci"])
            .args(["--module", "virtio_net"]);
        let qemu = [
            "-netdev",
            "user,id=n0",
            "-device",
            "virtio-net-pci,netdev=n0",
        ];
        GuestRun {
            cmd,
            qemu: qemu.map(str::to_owned).to_vec(),
        }
    }

    /// More run-guest.sh options.
    pub fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, args: I) -> Self {
        self.cmd.args(args);
        self
    }

    /// Copies the repository's `qemu/<script>` into the guest as `/etc/<script>`.
    pub fn script(self, script: &str) -> Self {
        let src = super::repo_root().join("qemu").join(script);
        self.args(["--file", &format!("{}:/etc/{script}", src.display())])
    }

    /// Another QEMU device (after the NIC).
    pub fn device(mut self, device: &str) -> Self {
        self.qemu.extend(["-device".to_owned(), device.to_owned()]);
        self
    }

    /// Boots the guest to run `cmd`; passes when it exits 0 and printed `pass_marker`.
    pub async fn run(mut self, cmd: &str, pass_marker: &str) -> std::process::ExitStatus {
        self.cmd
            .args(["--cmd", cmd, "--pass-marker", pass_marker, "--"])
            .args(&self.qemu);
        tokio::task::spawn_blocking(move || self.cmd.status())
            .await
            .unwrap()
            .expect("qemu/run-guest.sh")
    }
}
