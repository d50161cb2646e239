//! Does the host kernel's NVMe initiator do in-band authentication (DH-HMAC-CHAP)?
//!
//! Linux builds it with `CONFIG_NVME_AUTH` (6.0–6.6; from 6.7 the host half is
//! `CONFIG_NVME_HOST_AUTH`, which selects `CONFIG_NVME_AUTH`). A kernel without it still parses
//! `dhchap_secret=` in the connect string, but fails the Connect the target answers with
//! "authentication required" with a bare EIO, the same errno as "no such subsystem". So the
//! plugin asks before connecting with keys, from what the kernel shows, most exact first:
//!
//! 1. A fabrics controller in `/sys/class/nvme` has a `dhchap_secret` attribute exactly when the
//!    host half is built in (the attribute group is compiled only then).
//! 2. `modules.dep` of the running kernel (`/lib/modules/$(uname -r)`): when `nvme-core.ko` is a
//!    module, it depends on `nvme-auth.ko` exactly when the host half is built.
//! 3. `modules.builtin`: a built-in `nvme-core` can only use a built-in `nvme-auth`.
//! 4. `/sys/module/nvme_auth` (the module is loaded): likely, though it could serve a target.
//!
//! When none of these can be read (a container without `/lib/modules` and no controller yet) the
//! answer is [`AuthSupport::Unknown`]: the plugin connects and, should the kernel answer EIO,
//! names a missing `CONFIG_NVME_AUTH` among the possible causes.

use std::fs;

use crate::host::Host;
use crate::sysfs;

/// What the plugin could find out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthSupport {
    /// The kernel authenticates; the string says how this was found.
    Yes(String),
    /// The kernel cannot authenticate; the string says how this was found.
    No(String),
    /// Nothing to tell from.
    Unknown,
}

/// The lines of a `/lib/modules/RELEASE` index, or `None` when it cannot be read.
fn index(host: &dyn Host, release: &str, name: &str) -> Option<String> {
    fs::read_to_string(host.modules_root().join(release).join(name)).ok()
}

fn module_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    // modules.dep may name compressed modules (nvme-auth.ko.xz, .zst, .gz).
    file.split(".ko").next().unwrap_or(file)
}

/// Answers from the module indexes of kernel `release`.
fn from_module_indexes(host: &dyn Host, release: &str) -> Option<AuthSupport> {
    let dep = index(host, release, "modules.dep");
    let builtin = index(host, release, "modules.builtin");
    if let Some(dep) = &dep {
        for line in dep.lines() {
            let Some((module, deps)) = line.split_once(':') else {
                continue;
            };
            if module_name(module) != "nvme-core" {
                continue;
            }
            let found = format!("modules.dep of {release}");
            return Some(
                if deps
                    .split_whitespace()
                    .any(|d| module_name(d) == "nvme-auth")
                {
                    AuthSupport::Yes(format!("{found}: nvme-core uses nvme-auth"))
                } else {
                    AuthSupport::No(format!("{found}: nvme-core does not use nvme-auth"))
                },
            );
        }
    }
    if let Some(builtin) = &builtin {
        let has = |name: &str| builtin.lines().any(|l| module_name(l.trim()) == name);
        if has("nvme-core") {
            let found = format!("modules.builtin of {release}");
            return Some(if has("nvme-auth") {
                AuthSupport::Yes(format!("{found}: nvme-core and nvme-auth built in"))
            } else {
                AuthSupport::No(format!("{found}: nvme-core built in without nvme-auth"))
            });
        }
    }
    None
}

/// Finds out whether the host kernel authenticates NVMe connections.
pub fn detect(host: &dyn Host) -> AuthSupport {
    if let Ok(controllers) = sysfs::controllers(host) {
        let fabrics: Vec<_> = controllers
            .iter()
            .filter(|c| c.transport != "pcie" && !c.hostnqn.is_empty())
            .collect();
        if let Some(c) = fabrics.first() {
            let dir = sysfs::controller_dir(host, &c.name);
            return if dir.join("dhchap_secret").exists() {
                AuthSupport::Yes(format!("{} has a dhchap_secret attribute", c.name))
            } else {
                AuthSupport::No(format!("{} has no dhchap_secret attribute", c.name))
            };
        }
    }
    if let Ok(release) = host.kernel_release() {
        if let Some(answer) = from_module_indexes(host, release.trim()) {
            return answer;
        }
    }
    if host.sys_root().join("module/nvme_auth").exists() {
        return AuthSupport::Yes("the nvme_auth module is loaded".to_owned());
    }
    AuthSupport::Unknown
}

/// The message of a kernel without authentication, for the operator.
pub fn missing_message(host: &dyn Host, how: &str) -> String {
    let release = host.kernel_release().map_or_else(
        |_| "this kernel".to_owned(),
        |r| format!("kernel {}", r.trim()),
    );
    format!(
        "the host's {release} lacks NVMe in-band authentication ({how}), and the appliance \
         requires DH-HMAC-CHAP from this node: boot a kernel built with CONFIG_NVME_AUTH \
         (CONFIG_NVME_HOST_AUTH from Linux 6.7). Debian 12's 6.1 cloud kernel is built without \
         it; Debian's linux-image-6.12 from bookworm-security (e.g. \
         linux-image-6.12.*-cloud-amd64) has it"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeHost;

    #[test]
    fn a_controller_s_attributes_tell_exactly() {
        let host = FakeHost::new();
        host.set_modules(
            "6.12.0-test",
            "kernel/drivers/nvme/host/nvme-core.ko: kernel/drivers/nvme/common/nvme-auth.ko\n",
            "",
        );
        host.add_controller(
            "nvme0",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            "nqn.s",
            "nqn.h",
            "live",
        );
        // The fake's controllers have no dhchap attributes unless the kernel does auth: the
        // attribute wins over the module index.
        assert!(matches!(detect(&host), AuthSupport::No(w) if w.contains("nvme0")));
        host.set_kernel_auth(true);
        host.remove_controller_named("nvme0");
        host.add_controller(
            "nvme1",
            "tcp",
            "traddr=10.0.0.2,trsvcid=4420",
            "nqn.s",
            "nqn.h",
            "live",
        );
        assert!(matches!(detect(&host), AuthSupport::Yes(w) if w.contains("nvme1")));
        // A PCIe controller says nothing about fabrics authentication.
        host.remove_controller_named("nvme1");
        host.add_controller("nvme2", "pcie", "0000:00:04.0", "nqn.s", "", "live");
        assert!(matches!(detect(&host), AuthSupport::Yes(w) if w.contains("modules.dep")));
    }

    #[test]
    fn module_indexes_of_the_running_kernel() {
        let host = FakeHost::new();
        assert_eq!(detect(&host), AuthSupport::Unknown);
        // Debian 12's 6.1 cloud kernel: nvme-core is a module without nvme-auth.
        host.set_modules(
            "6.1.0-28-cloud-amd64",
            "kernel/drivers/nvme/host/nvme-fabrics.ko: kernel/drivers/nvme/host/nvme-core.ko\n\
             kernel/drivers/nvme/host/nvme-core.ko:\n",
            "kernel/drivers/ata/libata.ko\n",
        );
        let no = detect(&host);
        assert!(
            matches!(&no, AuthSupport::No(w) if w.contains("6.1.0-28-cloud-amd64")),
            "{no:?}"
        );
        let AuthSupport::No(how) = no else {
            unreachable!()
        };
        let msg = missing_message(&host, &how);
        for want in [
            "CONFIG_NVME_AUTH",
            "6.1.0-28-cloud-amd64",
            "bookworm-security",
            "linux-image-6.12",
        ] {
            assert!(msg.contains(want), "{msg}");
        }
        // 6.12: nvme-core uses nvme-auth (compressed module names too).
        host.set_modules(
            "6.12.9+bpo-cloud-amd64",
            "kernel/drivers/nvme/host/nvme-core.ko.xz: kernel/drivers/nvme/common/nvme-keyring.ko.xz \
             kernel/drivers/nvme/common/nvme-auth.ko.xz\n",
            "",
        );
        assert!(matches!(detect(&host), AuthSupport::Yes(_)));
        // Built in: both, or core alone.
        host.set_modules(
            "6.12.0-builtin",
            "",
            "kernel/drivers/nvme/host/nvme-core.ko\nkernel/drivers/nvme/common/nvme-auth.ko\n",
        );
        assert!(matches!(detect(&host), AuthSupport::Yes(w) if w.contains("built in")));
        host.set_modules(
            "6.1.0-builtin",
            "",
            "kernel/drivers/nvme/host/nvme-core.ko\n",
        );
        assert!(matches!(detect(&host), AuthSupport::No(_)));
        // Indexes that say nothing about nvme-core: the loaded module is the last hint.
        host.set_modules("6.12.0-other", "kernel/fs/ext4/ext4.ko:\n", "");
        assert_eq!(detect(&host), AuthSupport::Unknown);
        host.load_module("nvme_auth");
        assert!(matches!(detect(&host), AuthSupport::Yes(w) if w.contains("loaded")));
        assert_eq!(module_name("a/b/nvme-auth.ko.zst"), "nvme-auth");
    }
}
