//! Raw-device baseline for the data-path benchmarks: 4 KiB random and 128 KiB sequential
//! read/write at queue depth 1 through (a) raw `pread`/`pwrite` on the same descriptor kind (the
//! baseline) and (b) the hal backend via core's `BlockDevice` trait. Prints a table with ratios
//! against (a) from the same run.
//!
//! usage: hal-bench PATH [--size-mib N] [--secs S]
//!   PATH: a block device (opened O_EXCL, O_DIRECT) or a file (created sparse, N MiB; default 256)

#[cfg(target_os = "linux")]
fn main() {
    if let Err(e) = bench::run() {
        eprintln!("hal-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("hal-bench runs on Linux only");
    std::process::exit(2);
}

#[cfg(target_os = "linux")]
mod bench {
    use std::fs::File;
    use std::os::unix::fs::{FileExt, FileTypeExt};
    use std::time::{Duration, Instant};

    use edgevol_core::BlockDevice;
    use edgevol_hal::{AlignedBuf, FileDevice, FileOptions, LinuxBlockDevice};

    #[derive(Clone, Copy)]
    struct Workload {
        name: &'static str,
        size: usize,
        random: bool,
        write: bool,
    }

    const WORKLOADS: [Workload; 4] = [
        Workload {
            name: "4k rand read",
            size: 4096,
            random: true,
            write: false,
        },
        Workload {
            name: "4k rand write",
            size: 4096,
            random: true,
            write: true,
        },
        Workload {
            name: "128k seq read",
            size: 131072,
            random: false,
            write: false,
        },
        Workload {
            name: "128k seq write",
            size: 131072,
            random: false,
            write: true,
        },
    ];

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Byte offset of op number `i` (sequential) or a random aligned one.
    fn offset(w: &Workload, i: u64, rng: &mut Rng, span: u64) -> u64 {
        let units = span / w.size as u64;
        let unit = if w.random {
            rng.next() % units
        } else {
            i % units
        };
        unit * w.size as u64
    }

    enum Dev {
        File(FileDevice),
        Block(LinuxBlockDevice),
    }

    impl Dev {
        fn clone_file(&self) -> Result<File, String> {
            match self {
                Dev::File(d) => d.try_clone_file(),
                Dev::Block(d) => d.try_clone_file(),
            }
            .map_err(|e| e.to_string())
        }
        fn as_block(&mut self) -> &mut dyn BlockDevice<Error = edgevol_hal::Error> {
            match self {
                Dev::File(d) => d,
                Dev::Block(d) => d,
            }
        }
    }

    pub(super) fn run() -> Result<(), String> {
        let args: Vec<String> = std::env::args().collect();
        let path = args
            .get(1)
            .ok_or("usage: hal-bench PATH [--size-mib N] [--secs S]")?;
        let mut size_mib = 256u64;
        let mut secs = 1.0f64;
        let mut i = 2;
        while i + 1 < args.len() {
            match args[i].as_str() {
                "--size-mib" => size_mib = args[i + 1].parse().map_err(|_| "bad --size-mib")?,
                "--secs" => secs = args[i + 1].parse().map_err(|_| "bad --secs")?,
                o => return Err(format!("unknown option {o}")),
            }
            i += 2;
        }
        let is_blk = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let mut dev = if is_blk {
            Dev::Block(LinuxBlockDevice::open(path).map_err(|e| e.to_string())?)
        } else {
            let opts = FileOptions {
                create_size: Some(size_mib << 20),
                ..Default::default()
            };
            Dev::File(FileDevice::open_with(path, &opts).map_err(|e| e.to_string())?)
        };
        let (bs, count, direct) = match &dev {
            Dev::File(d) => (d.block_size(), d.block_count(), d.is_direct()),
            Dev::Block(d) => (d.block_size(), d.block_count(), true),
        };
        // Benchmark over at most the first `size_mib` MiB; pre-fill so reads hit written data.
        let span = (count * u64::from(bs)).min(size_mib << 20);
        let raw = dev.clone_file()?;
        let fill = AlignedBuf::from_slice(&vec![0xA5u8; 1 << 20]);
        let mut off = 0;
        while off + (1 << 20) <= span {
            raw.write_all_at(&fill, off)
                .map_err(|e| format!("prefill: {e}"))?;
            off += 1 << 20;
        }
        raw.sync_data().map_err(|e| e.to_string())?;
        let dur = Duration::from_secs_f64(secs);
        println!(
            "hal-bench: {path} ({} MiB span, block {bs}, O_DIRECT {direct}, {secs} s per cell)",
            span >> 20
        );
        println!("| workload | path | MB/s | IOPS | vs raw |");
        println!("|---|---|---:|---:|---:|");
        for w in WORKLOADS {
            let base = raw_qd1(&raw, &w, span, dur)?;
            row(&w, "raw pread/pwrite QD1", base, base);
            let sync = hal_sync(dev.as_block(), &w, span, dur, bs)?;
            row(&w, "hal sync (BlockDevice) QD1", sync, base);
        }
        Ok(())
    }

    /// (bytes, ops, seconds)
    type Res = (u64, u64, f64);

    fn row(w: &Workload, path: &str, r: Res, base: Res) {
        let mbs = r.0 as f64 / r.2 / 1e6;
        let base_mbs = base.0 as f64 / base.2 / 1e6;
        println!(
            "| {} | {path} | {mbs:.1} | {:.0} | {:.2}x |",
            w.name,
            r.1 as f64 / r.2,
            mbs / base_mbs
        );
    }

    fn raw_qd1(f: &File, w: &Workload, span: u64, dur: Duration) -> Result<Res, String> {
        let mut buf = AlignedBuf::from_slice(&vec![0x3Cu8; w.size]);
        let mut rng = Rng(0x1234_5678);
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed() < dur {
            let off = offset(w, ops, &mut rng, span);
            if w.write {
                f.write_all_at(&buf, off).map_err(|e| e.to_string())?;
            } else {
                f.read_exact_at(&mut buf, off).map_err(|e| e.to_string())?;
            }
            ops += 1;
        }
        Ok((ops * w.size as u64, ops, start.elapsed().as_secs_f64()))
    }

    fn hal_sync(
        d: &mut dyn BlockDevice<Error = edgevol_hal::Error>,
        w: &Workload,
        span: u64,
        dur: Duration,
        bs: u32,
    ) -> Result<Res, String> {
        let mut buf = AlignedBuf::from_slice(&vec![0x3Cu8; w.size]);
        let mut rng = Rng(0x1234_5678);
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed() < dur {
            let blk = offset(w, ops, &mut rng, span) / u64::from(bs);
            if w.write {
                d.write(blk, &buf).map_err(|e| e.to_string())?;
            } else {
                d.read(blk, &mut buf).map_err(|e| e.to_string())?;
            }
            ops += 1;
        }
        Ok((ops * w.size as u64, ops, start.elapsed().as_secs_f64()))
    }
}
