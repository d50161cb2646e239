//! `edgevol firmware boot-files`: the boot loaders' files of a factory image (slot A primary,
//! no trial), for `image/build.sh` to copy onto the boot partition. The appliance rewrites
//! `grubenv`, `syslinux.cfg` and the ADV in place later; `grub.cfg` never changes.

use std::path::{Path, PathBuf};

use edgevol_firmware::bootenv;
use edgevol_firmware::slots::{BootEnv, SlotId};

/// Writes `grub.cfg`, `grubenv` and `syslinux.cfg` into `dir`; returns their paths.
pub fn write_factory(dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let env = BootEnv {
        primary: SlotId::A,
        trial: None,
    };
    let files: [(&str, Vec<u8>); 3] = [
        ("grub.cfg", bootenv::grub_cfg().into_bytes()),
        ("grubenv", bootenv::grubenv(&env).to_vec()),
        (
            "syslinux.cfg",
            bootenv::syslinux_cfg(env.primary).into_bytes(),
        ),
    ];
    let mut written = Vec::with_capacity(files.len());
    for (name, data) in files {
        let path = dir.join(name);
        std::fs::write(&path, data).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factory_files_boot_slot_a_with_no_trial() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_factory(dir.path()).unwrap();
        assert_eq!(files.len(), 3);
        let env = bootenv::parse_grubenv(&std::fs::read(dir.path().join("grubenv")).unwrap());
        assert_eq!(
            env,
            Ok(BootEnv {
                primary: SlotId::A,
                trial: None
            })
        );
        let cfg = std::fs::read_to_string(dir.path().join("syslinux.cfg")).unwrap();
        assert_eq!(bootenv::parse_syslinux_primary(&cfg), Some(SlotId::A));
        let grub = std::fs::read_to_string(dir.path().join("grub.cfg")).unwrap();
        assert!(grub.contains("load_env -f ($root)/grubenv primary trial"));
    }
}
