//! The fake host's md: mdadm's create, assemble, examine, stop, remove, re-add, add and grow,
//! modelled on sysfs as the kernel shows arrays (`/sys/block/mdN/{dev,size,slaves/,md/}`), and
//! superblocks kept per namespace (by NGUID), so they survive a leg's controller going away and
//! coming back under another name. Tests play md's part when a leg's I/O fails
//! ([`FakeHost::md_fail_member`]) and when a resync ends ([`FakeHost::md_finish_resync`]).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{arg_basename, fail, ok, write, FakeHost};
use crate::host::CmdOutput;

/// Work another caller does while the next connect waits for the kernel.
#[derive(Default)]
pub(super) struct DuringConnect(Option<Box<dyn FnOnce() + Send>>);

impl DuringConnect {
    pub(super) fn take(&mut self) -> Option<Box<dyn FnOnce() + Send>> {
        self.0.take()
    }
}

impl std::fmt::Debug for DuringConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// A leg's superblock as the fake keeps it: `name:raid_disks:uuid`.
struct Superblock {
    name: String,
    raid_disks: usize,
    uuid: String,
}

impl Superblock {
    fn parse(text: &str) -> Option<Superblock> {
        let mut f = text.splitn(3, ':');
        Some(Superblock {
            name: f.next()?.to_owned(),
            raid_disks: f.next()?.parse().ok()?,
            uuid: f.next()?.to_owned(),
        })
    }

    fn render(&self) -> String {
        format!("{}:{}:{}", self.name, self.raid_disks, self.uuid)
    }
}

/// md's data offset in 512-byte sectors (the plugin's `--data-offset=1M`).
const OFFSET_SECTORS: u64 = 2048;

/// mdadm's `--uuid=` among `args`.
fn uuid_arg(args: &[&str]) -> Option<String> {
    args.iter()
        .find_map(|a| a.strip_prefix("--uuid="))
        .map(str::to_owned)
}

fn read(path: &Path) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl FakeHost {
    fn superblock(&self, disk: &str) -> PathBuf {
        let nguid = read(&self.sys.join("block").join(disk).join("nguid"));
        self.sys
            .parent()
            .unwrap()
            .join("md-superblocks")
            .join(nguid)
    }

    fn array_dir(&self, md: &str) -> PathBuf {
        self.sys.join("block").join(md)
    }

    fn disk_sectors(&self, disk: &str) -> u64 {
        read(&self.sys.join("block").join(disk).join("size"))
            .parse()
            .unwrap_or(0)
    }

    fn members(&self, md: &str) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(self.array_dir(md).join("md"))
            .map(|d| {
                d.filter_map(|e| {
                    let name = e.ok()?.file_name().to_string_lossy().into_owned();
                    name.strip_prefix("dev-").map(str::to_owned)
                })
                .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    fn set_member(&self, md: &str, disk: &str, state: &str) {
        let dir = self.array_dir(md);
        write(&dir.join(format!("md/dev-{disk}/state")), state);
        write(&dir.join("slaves").join(disk), "");
    }

    fn set_degraded(&self, md: &str) {
        let dir = self.array_dir(md);
        let raid_disks: usize = read(&dir.join("md/raid_disks")).parse().unwrap();
        let in_sync = self
            .members(md)
            .iter()
            .filter(|d| self.md_member_state(md, d) == "in_sync")
            .count();
        write(
            &dir.join("md/degraded"),
            &(raid_disks - in_sync).to_string(),
        );
    }

    fn resize_array(&self, md: &str) {
        let size = self
            .members(md)
            .iter()
            .filter(|d| self.sys.join("block").join(d).exists())
            .map(|d| self.disk_sectors(d))
            .min()
            .unwrap_or(0)
            .saturating_sub(OFFSET_SECTORS);
        write(&self.array_dir(md).join("size"), &size.to_string());
    }

    /// Starts array `name` over `disks` (superblocks written by the caller).
    fn start_array(&self, sb: &Superblock, disks: &[String]) -> String {
        let (name, raid_disks) = (&sb.name, sb.raid_disks);
        let md = (0..128u32)
            .rev()
            .map(|n| format!("md{n}"))
            .find(|m| !self.array_dir(m).exists())
            .unwrap();
        let dir = self.array_dir(&md);
        write(&dir.join("dev"), &format!("9:{}", &md[2..]));
        write(&dir.join("md/raid_disks"), &raid_disks.to_string());
        write(&dir.join("md/fake_name"), name);
        write(&dir.join("md/fake_uuid"), &sb.uuid);
        write(&dir.join("md/sync_action"), "idle");
        write(&dir.join("md/sync_completed"), "none");
        write(&dir.join("md/array_state"), "clean");
        for d in disks {
            self.set_member(&md, d, "in_sync");
        }
        self.set_degraded(&md);
        self.resize_array(&md);
        fs::write(self.dev.join(&md), "").unwrap();
        md
    }

    /// Runs the fake mdadm.
    pub(super) fn mdadm(&self, args: &[String]) -> io::Result<CmdOutput> {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let devices = |list: &[&str]| -> Vec<String> {
            list.iter()
                .filter(|x| !x.starts_with("--") && **x != "missing")
                .map(|x| arg_basename(x))
                .collect()
        };
        match a.as_slice() {
            ["--examine", dev] => {
                let sb = self.superblock(&arg_basename(dev));
                match fs::read_to_string(sb)
                    .ok()
                    .and_then(|t| Superblock::parse(&t))
                {
                    Some(sb) => ok(&format!(
                        "     Array UUID : {}\n           Name : {}\n",
                        sb.uuid, sb.name
                    )),
                    None => fail(1, &format!("mdadm: No md superblock detected on {dev}.")),
                }
            }
            ["--create", array, rest @ ..] => {
                let name = arg_basename(array);
                let raid_disks: usize = rest
                    .iter()
                    .find_map(|x| x.strip_prefix("--raid-devices="))
                    .unwrap()
                    .parse()
                    .unwrap();
                let sb = Superblock {
                    uuid: uuid_arg(rest).unwrap_or_else(|| format!("random-{name}")),
                    name,
                    raid_disks,
                };
                let disks = devices(rest);
                for d in &disks {
                    write(&self.superblock(d), &sb.render());
                }
                self.start_array(&sb, &disks);
                ok("")
            }
            ["--assemble", array, "--run", rest @ ..] => {
                let disks = devices(rest);
                let sbs: Vec<Option<Superblock>> = disks
                    .iter()
                    .map(|d| Superblock::parse(&read(&self.superblock(d))))
                    .collect();
                let Some(Some(first)) = sbs.first() else {
                    return fail(1, &format!("mdadm: no devices found for {array}"));
                };
                let same = |sb: &Option<Superblock>| {
                    sb.as_ref().is_some_and(|sb| {
                        sb.uuid == first.uuid && sb.raid_disks == first.raid_disks
                    })
                };
                if !sbs.iter().all(same) {
                    return fail(1, &format!("mdadm: no devices found for {array}"));
                }
                // Members carrying the UUID of an array that runs are refused, unless the
                // assembly gives them a new one (as mdadm 4.2 does).
                let update = rest.contains(&"--update=uuid");
                if let Some(md) = self.md_arrays().into_iter().find(|md| {
                    !update && read(&self.array_dir(md).join("md/fake_uuid")) == first.uuid
                }) {
                    return fail(
                        1,
                        &format!(
                            "mdadm: Found some drive for an array that is already active: \
                             /dev/{md}\nmdadm: giving up."
                        ),
                    );
                }
                let sb = Superblock {
                    name: arg_basename(array),
                    raid_disks: first.raid_disks,
                    uuid: match (update, uuid_arg(rest)) {
                        (true, Some(uuid)) => uuid,
                        _ => first.uuid.clone(),
                    },
                };
                for d in &disks {
                    write(&self.superblock(d), &sb.render());
                }
                self.start_array(&sb, &disks);
                ok("")
            }
            ["--run", md] => {
                let md = arg_basename(md);
                let dir = self.array_dir(&md);
                if read(&dir.join("md/array_state")) != "inactive" {
                    return fail(1, &format!("mdadm: /dev/{md} is already active"));
                }
                write(&dir.join("md/array_state"), "clean");
                write(&dir.join("md/sync_action"), "idle");
                write(&dir.join("md/sync_completed"), "none");
                self.set_degraded(&md);
                self.resize_array(&md);
                ok("")
            }
            ["--stop", md] => {
                let md = arg_basename(md);
                fs::remove_dir_all(self.array_dir(&md))?;
                fs::remove_file(self.dev.join(&md))?;
                ok("")
            }
            ["--grow", md, "--size=max"] => {
                self.resize_array(&arg_basename(md));
                ok("")
            }
            [md, "--remove", "detached"] => {
                let md = arg_basename(md);
                for d in self.members(&md) {
                    if !self.sys.join("block").join(&d).exists() {
                        self.drop_member(&md, &d);
                    }
                }
                ok("")
            }
            [md, "--remove", "failed"] => {
                let md = arg_basename(md);
                for d in self.members(&md) {
                    if self.md_member_state(&md, &d).contains("faulty") {
                        self.drop_member(&md, &d);
                    }
                }
                ok("")
            }
            [md, op @ ("--re-add" | "--add"), dev] => {
                let (md, disk) = (arg_basename(md), arg_basename(dev));
                let dir = self.array_dir(&md);
                let array = Superblock {
                    name: read(&dir.join("md/fake_name")),
                    raid_disks: read(&dir.join("md/raid_disks")).parse().unwrap(),
                    uuid: read(&dir.join("md/fake_uuid")),
                };
                let sb = self.superblock(&disk);
                let same = Superblock::parse(&read(&sb)).is_some_and(|s| s.uuid == array.uuid);
                if *op == "--re-add" && !same {
                    return fail(
                        1,
                        &format!("mdadm: --re-add for {dev} to /dev/{md} is not possible"),
                    );
                }
                write(&sb, &array.render());
                self.set_member(&md, &disk, "spare");
                write(&dir.join("md/sync_action"), "recover");
                let size = read(&dir.join("size"));
                write(&dir.join("md/sync_completed"), &format!("0 / {size}"));
                ok("")
            }
            _ => fail(1, &format!("fake mdadm: unexpected {}", args.join(" "))),
        }
    }

    fn drop_member(&self, md: &str, disk: &str) {
        let dir = self.array_dir(md);
        fs::remove_dir_all(dir.join(format!("md/dev-{disk}"))).unwrap();
        fs::remove_file(dir.join("slaves").join(disk)).unwrap();
        self.set_degraded(md);
    }

    /// What mdadm's udev rule does when a leg with a superblock appears and its array is not
    /// complete: an inactive array holding it (`/sys/block/mdN` with `slaves/`, no size yet).
    pub fn md_incremental(&self, disk: &str) {
        let sb = Superblock::parse(&read(&self.superblock(disk))).unwrap();
        let md = self.start_array(&sb, &[disk.to_owned()]);
        let dir = self.array_dir(&md);
        write(&dir.join("md/array_state"), "inactive");
        write(&dir.join("size"), "0");
        for attr in ["degraded", "sync_action", "sync_completed"] {
            fs::remove_file(dir.join("md").join(attr)).unwrap();
        }
    }

    /// `f` runs during the next connect, as another caller would meanwhile.
    pub fn during_next_connect(&self, f: impl FnOnce() + Send + 'static) {
        self.st().during_connect = DuringConnect(Some(Box::new(f)));
    }

    /// Copies the md superblock of the namespace `from` onto the namespace `to` (by NGUID), as a
    /// snapshot of one volume's leg restored into another's carries it.
    pub fn md_copy_superblock(&self, from_nguid: &str, to_nguid: &str) {
        let dir = self.sys.parent().unwrap().join("md-superblocks");
        fs::copy(dir.join(from_nguid), dir.join(to_nguid)).unwrap();
    }

    /// mdadm is not installed.
    pub fn remove_mdadm(&self) {
        self.st().missing_programs.push("mdadm".to_owned());
    }

    /// The md devices running.
    pub fn md_arrays(&self) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(self.sys.join("block"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("md"))
            .collect();
        out.sort();
        out
    }

    /// An array's member disks.
    pub fn md_members(&self, md: &str) -> Vec<String> {
        self.members(md)
    }

    /// A member's state flags.
    pub fn md_member_state(&self, md: &str, disk: &str) -> String {
        read(&self.array_dir(md).join(format!("md/dev-{disk}/state")))
    }

    /// md failed a member (its I/O failed): faulty, the array degraded.
    pub fn md_fail_member(&self, md: &str, disk: &str) {
        write(
            &self.array_dir(md).join(format!("md/dev-{disk}/state")),
            "faulty",
        );
        self.set_degraded(md);
    }

    /// md is halfway through a resync.
    pub fn md_sync_progress(&self, md: &str, done: u64) {
        let dir = self.array_dir(md);
        let size = read(&dir.join("size"));
        write(&dir.join("md/sync_completed"), &format!("{done} / {size}"));
    }

    /// md finished resyncing: every spare in sync, the array whole again.
    pub fn md_finish_resync(&self, md: &str) {
        for d in self.members(md) {
            if self.md_member_state(md, &d) == "spare" {
                self.set_member(md, &d, "in_sync");
            }
        }
        let dir = self.array_dir(md);
        write(&dir.join("md/sync_action"), "idle");
        write(&dir.join("md/sync_completed"), "none");
        self.set_degraded(md);
    }
}
