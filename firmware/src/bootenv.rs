//! The boot loaders' side of [`BootEnv`]: both loaders implement "boot the trial slot once,
//! clearing it first, else the primary", each with its own writable state on the boot
//! partition, and this module renders (and reads back) exactly that state.
//!
//! - UEFI, GRUB: `grub.cfg` (static) reads `grubenv` (`primary=`, `trial=`); on a trial it sets
//!   `trial=` empty and `save_env`s before it loads the kernel.
//! - BIOS, syslinux: `syslinux.cfg` names the primary as `DEFAULT`; the trial is syslinux's
//!   boot-once command in its ADV (the last two sectors of `ldlinux.sys`), which `ldlinux`
//!   clears and writes back before it boots it.
//!
//! Every file is rewritten in place at a fixed size (`grubenv` 1024 bytes, the ADV 1024 bytes,
//! `syslinux.cfg` the same length whichever slot is primary, under one sector), so a loader that
//! reads by block lists still finds it and a cut tears at most one sector. The kernel command
//! line carries `edgevol.slot=` so the daemon knows what the loader picked.

use std::fmt;

use crate::slots::{BootEnv, SlotId};

/// Size of GRUB's environment block.
pub const GRUBENV_LEN: usize = 1024;
const GRUBENV_HEADER: &str = "# GRUB Environment Block\n";
/// Size of syslinux's ADV: two identical 512-byte copies.
pub const ADV_LEN: usize = 1024;
const ADV_COPY: usize = 512;
const ADV_MAGIC1: u32 = 0x5a2d_2fa5;
const ADV_MAGIC2: u32 = 0xa304_1767;
const ADV_MAGIC3: u32 = 0xdd28_bf64;
const ADV_END: u8 = 0;
const ADV_BOOTONCE: u8 = 1;
/// Kernel arguments common to both loaders and both slots.
pub const KERNEL_ARGS: &str = "console=ttyS0 panic=10 loglevel=4";

/// A boot loader file that does not read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootEnvError {
    /// Not a GRUB environment block.
    NotGrubenv,
    /// `primary=` missing or not `a`/`b`.
    BadPrimary,
    /// `trial=` neither empty nor `a`/`b`.
    BadTrial,
    /// Neither ADV copy is consistent.
    BadAdv,
    /// The ADV's boot-once command is not one of ours.
    ForeignBootOnce(String),
}

impl fmt::Display for BootEnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootEnvError::NotGrubenv => f.write_str("grubenv: not a GRUB environment block"),
            BootEnvError::BadPrimary => f.write_str("grubenv: primary is not a or b"),
            BootEnvError::BadTrial => f.write_str("grubenv: trial is not empty, a or b"),
            BootEnvError::BadAdv => f.write_str("ldlinux.sys: no consistent ADV copy"),
            BootEnvError::ForeignBootOnce(c) => {
                write!(
                    f,
                    "ldlinux.sys: boot-once command {c:?} is not a slot label"
                )
            }
        }
    }
}

impl std::error::Error for BootEnvError {}

/// The syslinux label of a slot.
pub fn label(slot: SlotId) -> String {
    format!("slot-{}", slot.letter())
}

/// The directory of a slot's kernel and initramfs on the boot partition.
pub fn slot_dir(slot: SlotId) -> String {
    format!("slot-{}", slot.letter())
}

/// `grubenv` for `env`.
pub fn grubenv(env: &BootEnv) -> [u8; GRUBENV_LEN] {
    let trial = env
        .trial
        .map(|s| s.letter().to_string())
        .unwrap_or_default();
    let text = format!(
        "{GRUBENV_HEADER}primary={}\ntrial={trial}\n",
        env.primary.letter()
    );
    let mut out = [b'#'; GRUBENV_LEN];
    out[..text.len()].copy_from_slice(text.as_bytes());
    out
}

/// Reads `grubenv` back (as GRUB may have left it: `trial=` emptied, variables reordered).
pub fn parse_grubenv(bytes: &[u8]) -> Result<BootEnv, BootEnvError> {
    let text = std::str::from_utf8(bytes).map_err(|_| BootEnvError::NotGrubenv)?;
    let body = text
        .strip_prefix(GRUBENV_HEADER)
        .ok_or(BootEnvError::NotGrubenv)?;
    let (mut primary, mut trial) = (None, None);
    for line in body.lines().take_while(|l| !l.starts_with('#')) {
        match line.split_once('=') {
            Some(("primary", v)) => {
                primary = Some(SlotId::from_letter(v).ok_or(BootEnvError::BadPrimary)?)
            }
            Some(("trial", "")) => trial = None,
            Some(("trial", v)) => {
                trial = Some(SlotId::from_letter(v).ok_or(BootEnvError::BadTrial)?)
            }
            _ => {}
        }
    }
    Ok(BootEnv {
        primary: primary.ok_or(BootEnvError::BadPrimary)?,
        trial,
    })
}

/// GRUB's script: boot-once from `grubenv`, then the slot's kernel. Static: the env varies, not
/// this file.
pub fn grub_cfg() -> String {
    format!(
        r#"# edgevol boot-once (UEFI): a trial slot boots once, cleared before it boots.
set timeout=0
search --no-floppy --label EDGEVOLBOOT --set root
load_env -f ($root)/grubenv primary trial
if [ "$trial" = a -o "$trial" = b ]; then
    set slot="$trial"
    set trial=
    save_env -f ($root)/grubenv trial
elif [ "$primary" = b ]; then
    set slot=b
else
    set slot=a
fi
echo "edgevol: booting slot $slot"
linux ($root)/slot-$slot/vmlinuz {KERNEL_ARGS} edgevol.slot=$slot edgevol.boot=uefi
initrd ($root)/slot-$slot/initramfs.gz
boot
"#
    )
}

/// `syslinux.cfg` with `primary` as the default. Same length for either slot.
pub fn syslinux_cfg(primary: SlotId) -> String {
    let mut out = format!("DEFAULT {}\nPROMPT 0\nTIMEOUT 0\n", label(primary));
    for slot in [SlotId::A, SlotId::B] {
        out.push_str(&format!(
            "LABEL {label}\n  KERNEL /{dir}/vmlinuz\n  INITRD /{dir}/initramfs.gz\n  APPEND {KERNEL_ARGS} edgevol.slot={letter} edgevol.boot=bios\n",
            label = label(slot),
            dir = slot_dir(slot),
            letter = slot.letter(),
        ));
    }
    out
}

/// The `DEFAULT` of a `syslinux.cfg` this module wrote.
pub fn parse_syslinux_primary(text: &str) -> Option<SlotId> {
    let default = text.lines().next()?.strip_prefix("DEFAULT slot-")?;
    SlotId::from_letter(default)
}

/// An ADV whose only entry is the boot-once command for `trial` (none: an empty ADV).
pub fn adv(trial: Option<SlotId>) -> [u8; ADV_LEN] {
    let mut copy = [0u8; ADV_COPY];
    if let Some(slot) = trial {
        let cmd = label(slot);
        copy[8] = ADV_BOOTONCE;
        // A label is 6 bytes: fits the TLV's one-byte length.
        copy[9] = u8::try_from(cmd.len()).unwrap_or(u8::MAX);
        copy[10..10 + cmd.len()].copy_from_slice(cmd.as_bytes());
        copy[10 + cmd.len()] = ADV_END;
    }
    copy[0..4].copy_from_slice(&ADV_MAGIC1.to_le_bytes());
    copy[ADV_COPY - 4..].copy_from_slice(&ADV_MAGIC3.to_le_bytes());
    // syslinux: the words from offset 4 up to the tail sum to ADV_MAGIC2.
    let sum = words(&copy[8..ADV_COPY - 4]).fold(0u32, u32::wrapping_add);
    copy[4..8].copy_from_slice(&ADV_MAGIC2.wrapping_sub(sum).to_le_bytes());
    let mut out = [0u8; ADV_LEN];
    out[..ADV_COPY].copy_from_slice(&copy);
    out[ADV_COPY..].copy_from_slice(&copy);
    out
}

/// The boot-once slot of an ADV (`None`: no boot-once pending). The first consistent copy
/// counts, as in syslinux.
pub fn parse_adv(bytes: &[u8]) -> Result<Option<SlotId>, BootEnvError> {
    let copy = bytes
        .chunks_exact(ADV_COPY)
        .take(2)
        .find(|c| adv_consistent(c))
        .ok_or(BootEnvError::BadAdv)?;
    let mut data = &copy[8..ADV_COPY - 4];
    while let [tag, len, rest @ ..] = data {
        if *tag == ADV_END {
            break;
        }
        let value = rest.get(..usize::from(*len)).ok_or(BootEnvError::BadAdv)?;
        if *tag == ADV_BOOTONCE && !value.is_empty() {
            let cmd = String::from_utf8_lossy(value).into_owned();
            return match cmd.strip_prefix("slot-").and_then(SlotId::from_letter) {
                Some(slot) => Ok(Some(slot)),
                None => Err(BootEnvError::ForeignBootOnce(cmd)),
            };
        }
        data = &rest[usize::from(*len)..];
    }
    Ok(None)
}

fn adv_consistent(copy: &[u8]) -> bool {
    copy.len() == ADV_COPY
        && copy[..4] == ADV_MAGIC1.to_le_bytes()
        && copy[ADV_COPY - 4..] == ADV_MAGIC3.to_le_bytes()
        && words(&copy[4..ADV_COPY - 4]).fold(0u32, u32::wrapping_add) == ADV_MAGIC2
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENVS: [BootEnv; 4] = [
        BootEnv {
            primary: SlotId::A,
            trial: None,
        },
        BootEnv {
            primary: SlotId::A,
            trial: Some(SlotId::B),
        },
        BootEnv {
            primary: SlotId::B,
            trial: None,
        },
        BootEnv {
            primary: SlotId::B,
            trial: Some(SlotId::A),
        },
    ];

    #[test]
    fn grubenv_round_trips_at_its_fixed_size() {
        for env in ENVS {
            let block = grubenv(&env);
            assert!(block.starts_with(GRUBENV_HEADER.as_bytes()));
            assert_eq!(block[GRUBENV_LEN - 1], b'#');
            assert_eq!(parse_grubenv(&block), Ok(env));
        }
    }

    #[test]
    fn grubenv_as_grub_leaves_it_after_a_trial() {
        // save_env rewrites the block: trial emptied, variables in its own order.
        let mut text = format!("{GRUBENV_HEADER}trial=\nprimary=a\n").into_bytes();
        text.resize(GRUBENV_LEN, b'#');
        assert_eq!(
            parse_grubenv(&text),
            Ok(BootEnv {
                primary: SlotId::A,
                trial: None
            })
        );
    }

    #[test]
    fn bad_grubenv_is_refused() {
        assert_eq!(parse_grubenv(b"primary=a\n"), Err(BootEnvError::NotGrubenv));
        let text = format!("{GRUBENV_HEADER}primary=c\n");
        assert_eq!(
            parse_grubenv(text.as_bytes()),
            Err(BootEnvError::BadPrimary)
        );
        let text = format!("{GRUBENV_HEADER}primary=a\ntrial=x\n");
        assert_eq!(parse_grubenv(text.as_bytes()), Err(BootEnvError::BadTrial));
        let text = format!("{GRUBENV_HEADER}trial=a\n");
        assert_eq!(
            parse_grubenv(text.as_bytes()),
            Err(BootEnvError::BadPrimary)
        );
    }

    #[test]
    fn syslinux_cfg_names_the_primary_at_a_fixed_length() {
        let a = syslinux_cfg(SlotId::A);
        let b = syslinux_cfg(SlotId::B);
        assert_eq!(a.len(), b.len());
        assert!(a.len() <= 512, "one sector: {}", a.len());
        assert_eq!(parse_syslinux_primary(&a), Some(SlotId::A));
        assert_eq!(parse_syslinux_primary(&b), Some(SlotId::B));
        assert!(
            a.contains("APPEND console=ttyS0 panic=10 loglevel=4 edgevol.slot=b edgevol.boot=bios")
        );
        assert_eq!(parse_syslinux_primary("DEFAULT edgevol\n"), None);
    }

    #[test]
    fn adv_matches_syslinux_checksum_and_round_trips() {
        for trial in [None, Some(SlotId::A), Some(SlotId::B)] {
            let adv = adv(trial);
            assert_eq!(adv[..ADV_COPY], adv[ADV_COPY..]);
            // syslinux's adv_consistent: sum of words [4, 508) == ADV_MAGIC2.
            assert!(adv_consistent(&adv[..ADV_COPY]));
            assert_eq!(parse_adv(&adv), Ok(trial));
        }
    }

    #[test]
    fn adv_with_one_torn_copy_still_reads() {
        let mut adv = adv(Some(SlotId::B));
        adv[20] ^= 0xff;
        assert_eq!(parse_adv(&adv), Ok(Some(SlotId::B)));
        adv[ADV_COPY + 20] ^= 0xff;
        assert_eq!(parse_adv(&adv), Err(BootEnvError::BadAdv));
    }

    #[test]
    fn the_empty_adv_syslinux_installs_reads_as_no_boot_once() {
        // syslinux_reset_adv: zeros, MAGIC1, checksum, MAGIC3 — what a fresh install holds.
        assert_eq!(parse_adv(&adv(None)), Ok(None));
        assert_eq!(parse_adv(&[0u8; ADV_LEN]), Err(BootEnvError::BadAdv));
    }

    #[test]
    fn a_foreign_boot_once_is_reported() {
        let mut copy = adv(None)[..ADV_COPY].to_vec();
        copy[8] = ADV_BOOTONCE;
        copy[9] = 4;
        copy[10..14].copy_from_slice(b"memt");
        let sum = words(&copy[8..ADV_COPY - 4]).fold(0u32, u32::wrapping_add);
        copy[4..8].copy_from_slice(&ADV_MAGIC2.wrapping_sub(sum).to_le_bytes());
        assert_eq!(
            parse_adv(&copy),
            Err(BootEnvError::ForeignBootOnce("memt".into()))
        );
    }

    #[test]
    fn grub_cfg_clears_the_trial_before_booting_it() {
        let cfg = grub_cfg();
        let clear = cfg.find("save_env -f ($root)/grubenv trial").unwrap();
        let boot = cfg.find("linux ($root)").unwrap();
        assert!(clear < boot);
        assert!(cfg.contains(KERNEL_ARGS));
    }
}
