//! Run inside the QEMU guest by `scripts/test-hal-qemu.sh`: identifies an NVMe namespace through
//! admin passthrough, checks the serial (and EUI64/UUID when given) against what QEMU was told,
//! writes/reads/discards through the hal block backend (core's `BlockDevice` trait), then
//! concurrent I/O from threads through a [`DataHandle`](edgevol_hal::DataHandle) beside the
//! exclusive open (edgevold's data path), reads the SMART log before and after, and prints
//! `HAL-GUEST-CHECK PASS` (or `FAIL: reason`, exit 1).
//!
//! usage: `hal-guest-check DEVICE EXPECTED_SERIAL [EXPECTED_EUI64_HEX] [EXPECTED_UUID_HEX]`
//!
//! `hal-guest-check --scheduler DEVICE` (a disk whose kernel default is an elevator, such as
//! virtio-blk's `mq-deadline`): opening it for a pool selects `none`, says what it was, and I/O
//! still round-trips; prints `HAL-GUEST-CHECK SCHEDULER PASS`.

// Casts: test patterns deliberately keep the low byte of block numbers.
#![allow(clippy::cast_possible_truncation)]

#[cfg(target_os = "linux")]
fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 3 && args[1] == "--scheduler" {
        match scheduler(&args[2]) {
            Ok(()) => println!("HAL-GUEST-CHECK SCHEDULER PASS"),
            Err(e) => {
                println!("HAL-GUEST-CHECK FAIL: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.len() < 3 {
        eprintln!("usage: hal-guest-check DEVICE EXPECTED_SERIAL [EUI64_HEX] [UUID_HEX]");
        std::process::exit(2);
    }
    match check(
        &args[1],
        &args[2],
        args.get(3).map(String::as_str),
        args.get(4).map(String::as_str),
    ) {
        Ok(()) => println!("HAL-GUEST-CHECK PASS"),
        Err(e) => {
            println!("HAL-GUEST-CHECK FAIL: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("hal-guest-check runs on Linux only");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
fn scheduler(path: &str) -> Result<(), String> {
    use edgevol_core::BlockDevice;
    use edgevol_hal::scheduler::{active, Scheduler};
    use edgevol_hal::LinuxBlockDevice;

    let name = std::path::Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no device name")?;
    let sysfs = format!("/sys/block/{name}/queue/scheduler");
    let read = || std::fs::read_to_string(&sysfs).map_err(|e| format!("{sysfs}: {e}"));
    let before = read()?;
    let was = active(&before).ok_or(format!("no active scheduler in '{before}'"))?;
    println!("scheduler before: {}", before.trim());
    if was == "none" {
        return Err(format!(
            "{path} has no elevator to bypass ('{}')",
            before.trim()
        ));
    }
    let mut dev = LinuxBlockDevice::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let want = Scheduler::Bypassed { was: was.into() };
    if *dev.scheduler() != want {
        return Err(format!("open reported {:?}, not {want:?}", dev.scheduler()));
    }
    let after = read()?;
    println!("scheduler after: {}", after.trim());
    if active(&after) != Some("none") {
        return Err(format!("still '{}' after open", after.trim()));
    }
    let bs = BlockDevice::block_size(&dev) as usize;
    let data: Vec<u8> = (0..bs * 8).map(|i| (i % 251) as u8).collect();
    dev.write(16, &data).map_err(|e| format!("write: {e}"))?;
    dev.flush().map_err(|e| format!("flush: {e}"))?;
    let mut back = vec![0u8; data.len()];
    dev.read(16, &mut back).map_err(|e| format!("read: {e}"))?;
    if back != data {
        return Err("data read back differs".into());
    }
    drop(dev);
    let again = LinuxBlockDevice::open(path).map_err(|e| format!("reopen {path}: {e}"))?;
    if *again.scheduler() != Scheduler::Unchanged {
        return Err(format!("reopen reported {:?}", again.scheduler()));
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn check(path: &str, serial: &str, eui64: Option<&str>, uuid: Option<&str>) -> Result<(), String> {
    use edgevol_core::BlockDevice;
    use edgevol_hal::nvme::hex_id;
    use edgevol_hal::{BlockOptions, DataHandle, LinuxBlockDevice, NvmeDevice, PoolDevice};

    let mut dev = NvmeDevice::open(path).map_err(|e| format!("open {path}: {e}"))?;
    let c = dev
        .identify_controller()
        .map_err(|e| format!("identify controller: {e}"))?;
    println!(
        "controller: vid {:#06x} serial '{}' model '{}' firmware '{}' version {:#x} mdts {} nn {} oncs {:#x} vwc {} subnqn {}",
        c.vid, c.serial, c.model, c.firmware, c.version, c.mdts, c.nn, c.oncs, c.volatile_write_cache, c.subnqn
    );
    if c.serial != serial {
        return Err(format!("serial '{}' != expected '{serial}'", c.serial));
    }
    if c.model.is_empty() || c.firmware.is_empty() {
        return Err("empty model or firmware".into());
    }
    let ns = dev
        .identify_namespace()
        .map_err(|e| format!("identify namespace: {e}"))?;
    println!(
        "namespace {}: nsze {} ncap {} nuse {} dlfeat-read {} eui64 {} nguid {} uuid {}",
        dev.nsid(),
        ns.size_blocks,
        ns.capacity_blocks,
        ns.utilization_blocks,
        ns.dealloc_read_value,
        if ns.has_eui64() {
            hex_id(&ns.eui64)
        } else {
            "absent".into()
        },
        if ns.has_nguid() {
            hex_id(&ns.nguid)
        } else {
            "absent".into()
        },
        ns.uuid.map_or("absent".into(), |u| hex_id(&u)),
    );
    for (i, f) in ns.lba_formats.iter().enumerate() {
        let cur = if i == ns.current_format {
            " (in use)"
        } else {
            ""
        };
        println!(
            "  lbaf {i}: {} B data + {} B metadata, rp {}{cur}",
            f.data_size, f.metadata_size, f.relative_performance
        );
    }
    if let Some(want) = eui64 {
        if hex_id(&ns.eui64) != want.to_lowercase() {
            return Err(format!("eui64 {} != expected {want}", hex_id(&ns.eui64)));
        }
    }
    if let Some(want) = uuid {
        let got = ns.uuid.map(|u| hex_id(&u)).unwrap_or_default();
        if got != want.replace('-', "").to_lowercase() {
            return Err(format!("uuid {got} != expected {want}"));
        }
    }
    let lbs = ns.current_lba_format().data_size;
    if lbs != dev.block().logical_block_size() {
        return Err(format!(
            "LBA format {lbs} != BLKSSZGET {}",
            dev.block().logical_block_size()
        ));
    }
    if ns.size_blocks * u64::from(lbs) != dev.block().size_bytes() {
        return Err("NSZE x LBA size != BLKGETSIZE64".into());
    }
    let smart0 = dev.smart_log().map_err(|e| format!("smart log: {e}"))?;
    println!("smart before: {smart0:?}");

    // Sync path through core's trait.
    let bs = BlockDevice::block_size(&dev) as usize;
    let last = BlockDevice::block_count(&dev) - 16;
    let pattern = |b: u64| -> Vec<u8> {
        (0..bs * 16)
            .map(|i| (i as u64 ^ b).wrapping_mul(0x9E37) as u8)
            .collect()
    };
    for start in [0u64, 1000, last] {
        let data = pattern(start);
        dev.write(start, &data)
            .map_err(|e| format!("write {start}: {e}"))?;
    }
    dev.flush().map_err(|e| format!("flush: {e}"))?;
    let mut back = vec![0u8; bs * 16];
    for start in [0u64, 1000, last] {
        dev.read(start, &mut back)
            .map_err(|e| format!("read {start}: {e}"))?;
        if back != pattern(start) {
            return Err(format!("read back mismatch at block {start}"));
        }
    }
    println!("sync write/flush/read: ok (16 blocks x 3 places)");
    dev.discard(1000, 8).map_err(|e| format!("discard: {e}"))?;
    dev.read(1000, &mut back)
        .map_err(|e| format!("read after discard: {e}"))?;
    let zeroed = back[..8 * bs].iter().all(|&b| b == 0);
    println!(
        "discard: ok; deallocated blocks read {}",
        if zeroed {
            "zeros"
        } else {
            "old/unspecified data"
        }
    );
    if ns.dealloc_read_value == 1 && !zeroed {
        return Err("DLFEAT promises zeros after deallocate, got data".into());
    }
    if back[8 * bs..] != pattern(1000)[8 * bs..] {
        return Err("discard touched blocks outside its range".into());
    }

    // edgevold's data path: a second, non-exclusive handle shared by threads.
    let opts = BlockOptions {
        exclusive: false,
        ..BlockOptions::default()
    };
    let second = LinuxBlockDevice::open_with(path, &opts).map_err(|e| format!("reopen: {e}"))?;
    let data =
        DataHandle::open(&PoolDevice::Block(second)).map_err(|e| format!("data handle: {e}"))?;
    let bs64 = bs as u64;
    let errors: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..16u64)
            .map(|i| {
                let data = &data;
                s.spawn(move || -> Result<(), String> {
                    let at = (4096 + i * 4) * bs64;
                    let fill = i as u8 ^ 0x5A;
                    data.write_at(at, &vec![fill; bs * 4])
                        .map_err(|e| format!("write at {at}: {e}"))?;
                    let mut back = vec![0u8; bs * 4];
                    data.read_at(at, &mut back)
                        .map_err(|e| format!("read at {at}: {e}"))?;
                    if back.iter().any(|&b| b != fill) {
                        return Err(format!("mismatch at {at}"));
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .filter_map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("thread panicked".into()))
                    .err()
            })
            .collect()
    });
    if !errors.is_empty() {
        return Err(format!("data handle: {}", errors.join("; ")));
    }
    dev.flush()
        .map_err(|e| format!("flush after data handle: {e}"))?;
    println!("data handle: 16 concurrent write+read pairs from threads ok");

    let smart1 = dev.smart_log().map_err(|e| format!("smart log: {e}"))?;
    println!(
        "smart after: temperature {} C, percentage used {}%, media errors {}, critical warning {:#x}, host writes {} -> {}, data units written {} -> {}",
        smart1.temperature_celsius(),
        smart1.percentage_used,
        smart1.media_errors,
        smart1.critical_warning,
        smart0.host_write_commands,
        smart1.host_write_commands,
        smart0.data_units_written,
        smart1.data_units_written
    );
    if smart1.host_write_commands <= smart0.host_write_commands {
        return Err("SMART host write commands did not grow after writes".into());
    }
    if !(-40..=150).contains(&smart1.temperature_celsius()) {
        return Err(format!(
            "implausible temperature {}",
            smart1.temperature_celsius()
        ));
    }
    Ok(())
}
