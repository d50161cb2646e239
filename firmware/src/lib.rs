//! edgevol's firmware life cycle, without I/O.
//!
//! - [`bundle`]: the signed update bundle (kernel, initramfs, version, architecture, the SHA-256 of
//!   each part, an Ed25519 signature). [`bundle::verify`] refuses a bad signature, a truncated
//!   bundle or another architecture before the caller writes anything.
//! - [`key`]: the Ed25519 signing key (PKCS#8 PEM, kept by the operator) and the verification key
//!   (hex, baked into the image).
//! - [`slots`]: the A/B slot state machine (good / try-once / bad, boot counters, why the last
//!   update was rolled back) and the boot-loader view derived from it.
//! - [`bootenv`]: the boot loaders' files that implement that env: GRUB's `grubenv` and
//!   `grub.cfg` (UEFI), syslinux's `syslinux.cfg` and boot-once ADV (BIOS).
//! - [`boot_dir`]: the mounted boot partition: slots written, synced and read back from the
//!   device; the loaders' files rewritten in place.
//! - [`manager`]: the three kept in step for the daemon: update, confirm, fail, rollback, status.
//! - [`pool_format`]: which pools a firmware reads (format versions, features), declared in its
//!   bundle and kept per slot, so updates and rollbacks never strand the pool.
//! - [`record`]: that state persisted as two checksummed, sequenced copies, so a power cut in the
//!   middle of a write leaves the previous state.
//!
//! Crypto is `ring`'s, the one provider of the tree.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod boot_dir;
pub mod bootenv;
pub mod bundle;
pub mod dir_media;
pub mod key;
pub mod manager;
pub mod pool_format;
pub mod record;
pub mod slots;
