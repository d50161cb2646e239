//! What md shows in the node VM about a replicated volume's leg while its box is away and while
//! it resyncs: the array's own view (`md/degraded`, the member's `state`), the block layer's
//! write counters of the md device and of each leg, and the surviving leg's write-intent bitmap
//! (`mdadm -X`). From them, [`ResyncFigures`] shows a resync that copied only the chunks the
//! bitmap marked, a bound a full copy of the leg cannot meet.

use crate::Agent;

/// The write-intent bitmap of a member as `mdadm -X` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bitmap {
    /// Chunks the bitmap covers (`Bitmap : 8 bits (chunks), ...`).
    pub bits: u64,
    /// Chunks marked dirty (`..., 1 dirty (12.5%)`).
    pub dirty: u64,
    /// Bytes per chunk (`Chunksize : 64 MB`; mdadm's units are powers of 1024).
    pub chunk_bytes: u64,
}

impl Bitmap {
    /// Parses `mdadm -X` output; `None` when a line is missing or malformed.
    pub fn parse(examine: &str) -> Option<Bitmap> {
        let field = |name: &str| {
            examine.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim())
            })
        };
        let nums: Vec<u64> = field("Bitmap")?
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect();
        let (&bits, &dirty) = (nums.first()?, nums.get(1)?);
        let mut chunk = field("Chunksize")?.split_whitespace();
        let n: u64 = chunk.next()?.parse().ok()?;
        let unit = match chunk.next()? {
            "B" => 1,
            "KB" => 1 << 10,
            "MB" => 1 << 20,
            "GB" => 1 << 30,
            _ => return None,
        };
        Some(Bitmap {
            bits,
            dirty,
            chunk_bytes: n * unit,
        })
    }
}

/// Bytes written so far, from `/sys/block/X/stat` lines (field 7, sectors written), summed over
/// the lines (one per device); `None` when there is none or one is malformed.
pub fn bytes_written(stats: &str) -> Option<u64> {
    let mut sectors = 0;
    let mut lines = 0;
    for line in stats.lines().filter(|l| !l.trim().is_empty()) {
        sectors += line.split_whitespace().nth(6)?.parse::<u64>().ok()?;
        lines += 1;
    }
    (lines > 0).then_some(sectors * 512)
}

/// A member's standing in its array, from `md/dev-<disk>/state` (`gone`: md no longer lists it).
pub fn out_of_array(state: &str) -> bool {
    let state = state.trim();
    state == "gone" || state.split(',').any(|f| f == "faulty")
}

/// md's view of one array and one of its legs, read in one shell command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegView {
    /// `md/degraded`.
    pub degraded: u32,
    /// `md/sync_action`.
    pub sync_action: String,
    /// `md/dev-<leg>/state`, or `gone`.
    pub leg_state: String,
}

impl LegView {
    /// Reads it for the leg on `disk` of the array `md`.
    pub async fn read(agent: &Agent, md: &str, disk: &str) -> LegView {
        let out = agent
            .ok(
                10,
                &format!(
                    "cat /sys/block/{md}/md/degraded /sys/block/{md}/md/sync_action; \
                     cat /sys/block/{md}/md/dev-{disk}/state 2>/dev/null || echo gone"
                ),
            )
            .await;
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        let [degraded, sync_action, leg_state] = lines[..] else {
            panic!("{md}, {disk}: {out:?}");
        };
        LegView {
            degraded: degraded
                .parse()
                .unwrap_or_else(|_| panic!("{md}/md/degraded {degraded:?}")),
            sync_action: sync_action.to_owned(),
            leg_state: leg_state.to_owned(),
        }
    }

    /// md runs without the leg: one member short, the leg faulty or taken out.
    pub fn leg_failed_out(&self) -> bool {
        self.degraded == 1 && out_of_array(&self.leg_state)
    }
}

/// The `/sys/block` names whose write counters count the writes to `disk`: a namespace head of
/// native NVMe multipath (`nvme1n1`) counts nothing itself (6.1), its paths do (`nvme1c1n1`,
/// `nvme<subsystem>c<controller>n<namespace>`); any other disk counts its own.
pub fn counting_devices(disk: &str) -> String {
    let head = disk.strip_prefix("nvme").and_then(|rest| {
        let (subsys, ns) = rest.split_once('n')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        (digits(subsys) && digits(ns)).then(|| format!("nvme{subsys}c*n{ns}"))
    });
    head.unwrap_or_else(|| disk.to_owned())
}

/// Bytes written so far to a block device of the node VM (`md126`, `nvme1n1`): see
/// [`counting_devices`].
pub async fn written(agent: &Agent, disk: &str) -> u64 {
    let devices = counting_devices(disk);
    let stat = agent
        .ok(10, &format!("cat /sys/block/{devices}/stat"))
        .await;
    bytes_written(&stat).unwrap_or_else(|| panic!("write counters of {disk} ({devices}): {stat:?}"))
}

/// The counters a resync is judged by, read while the returning leg is still out of the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeforeReAdd {
    /// Bytes written so far to the returning leg's disk.
    pub leg: u64,
    /// Bytes written so far to the surviving leg's disk.
    pub survivor: u64,
    /// The surviving leg's bitmap: what the returning leg missed.
    pub bitmap: Bitmap,
    /// Whether the leg was still out of the array when the counters were read (and after).
    pub leg_out: bool,
}

impl BeforeReAdd {
    /// Reads them, and the leg's state before and after, for the array `md` whose leg on `leg`
    /// is away and whose leg on `survivor` carries it.
    pub async fn read(agent: &Agent, md: &str, leg: &str, survivor: &str) -> BeforeReAdd {
        let first = LegView::read(agent, md, leg).await;
        let (leg_written, survivor_written) =
            (written(agent, leg).await, written(agent, survivor).await);
        let examine = agent
            .ok(
                20,
                &format!("blockdev --flushbufs /dev/{survivor}; mdadm -X /dev/{survivor}"),
            )
            .await;
        let last = LegView::read(agent, md, leg).await;
        BeforeReAdd {
            leg: leg_written,
            survivor: survivor_written,
            bitmap: Bitmap::parse(&examine)
                .unwrap_or_else(|| panic!("mdadm -X /dev/{survivor}:\n{examine}")),
            leg_out: out_of_array(&first.leg_state) && out_of_array(&last.leg_state),
        }
    }
}

/// What the returning leg received from the moment [`BeforeReAdd`] was read until md had
/// resynced it, against what its bitmap allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncFigures {
    /// Bytes written to the returning leg: the resync, plus the writers' writes once it was
    /// back, plus md's metadata.
    pub leg_written: u64,
    /// Bytes written to the surviving leg over the same time: at least the writers' writes the
    /// returning leg also got, plus md's metadata.
    pub survivor_written: u64,
    /// The surviving leg's bitmap before the leg came back.
    pub bitmap: Bitmap,
    /// The array's size in bytes.
    pub size: u64,
}

/// md's own writes to a leg around a re-add that the other leg may not get (the superblock and
/// bitmap pages in the 1 MiB before the data).
pub const METADATA_SLACK: u64 = 1 << 20;

impl ResyncFigures {
    /// The figures from the counters before the re-add and after the resync.
    pub fn new(before: &BeforeReAdd, leg_now: u64, survivor_now: u64, size: u64) -> Self {
        ResyncFigures {
            leg_written: leg_now.saturating_sub(before.leg),
            survivor_written: survivor_now.saturating_sub(before.survivor),
            bitmap: before.bitmap,
            size,
        }
    }

    /// The most the returning leg may have received if md copied only the dirty chunks.
    pub fn bound(&self) -> u64 {
        self.bitmap.dirty * self.bitmap.chunk_bytes + self.survivor_written + METADATA_SLACK
    }

    /// Err unless the leg received something, and at most [`Self::bound`]: the resync copied
    /// no more than the dirty chunks (a full copy writes [`Self::size`] bytes onto the leg).
    pub fn check(&self) -> Result<(), String> {
        if self.leg_written == 0 {
            return Err(format!("nothing was written to the returning leg: {self}"));
        }
        if self.leg_written > self.bound() {
            return Err(format!(
                "the resync copied more than the dirty chunks: {self}"
            ));
        }
        Ok(())
    }

    /// As [`Self::check`], and the leg received under half the array's size: the bound is far
    /// from a full copy (the writers touched a small part of the volume).
    pub fn check_well_below_size(&self) -> Result<(), String> {
        self.check()?;
        if self.leg_written * 2 >= self.size {
            return Err(format!(
                "the returning leg received half the array or more: {self}"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for ResyncFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const MIB: f64 = (1 << 20) as f64;
        let b = self.bitmap;
        write!(
            f,
            "returning leg got {:.1} MiB; bitmap {} of {} chunks dirty x {} MiB = {:.1} MiB; \
             surviving leg got {:.1} MiB meanwhile; bound {:.1} MiB; array {:.0} MiB",
            self.leg_written as f64 / MIB,
            b.dirty,
            b.bits,
            b.chunk_bytes >> 20,
            (b.dirty * b.chunk_bytes) as f64 / MIB,
            self.survivor_written as f64 / MIB,
            self.bound() as f64 / MIB,
            self.size as f64 / MIB,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    const EXAMINE: &str = "        Filename : /dev/nvme1n1
           Magic : 6d746962
         Version : 4
          Events : 212
  Events Cleared : 180
           State : OK
       Chunksize : 4 MB
          Daemon : 5s flush period
      Write Mode : Normal
       Sync Size : 524288 (512.00 MiB 536.87 MB)
          Bitmap : 128 bits (chunks), 17 dirty (13.3%)
";

    #[test]
    fn bitmaps_stats_and_member_states_parse() {
        assert_eq!(
            Bitmap::parse(EXAMINE),
            Some(Bitmap {
                bits: 128,
                dirty: 17,
                chunk_bytes: 4 * MIB
            })
        );
        assert_eq!(
            Bitmap::parse(&EXAMINE.replace("4 MB", "512 KB")).map(|b| b.chunk_bytes),
            Some(512 << 10)
        );
        assert_eq!(Bitmap::parse(&EXAMINE.replace("4 MB", "4 XB")), None);
        assert_eq!(Bitmap::parse("mdadm: no bitmap"), None);
        let stat = "  1200  3  96000  400  5000  7  81920  900  0  1300  1300  0 0 0 0\n";
        assert_eq!(bytes_written(stat), Some(81920 * 512));
        let two_paths = format!("{stat}{}", stat.replace("81920", "100"));
        assert_eq!(bytes_written(&two_paths), Some(82020 * 512));
        assert_eq!(bytes_written("1 2 3"), None);
        assert_eq!(bytes_written(""), None);
        assert_eq!(counting_devices("nvme1n1"), "nvme1c*n1");
        assert_eq!(counting_devices("nvme12n3"), "nvme12c*n3");
        assert_eq!(counting_devices("nvme1c1n1"), "nvme1c1n1");
        assert_eq!(counting_devices("md126"), "md126");
        assert_eq!(counting_devices("nvme1n"), "nvme1n");
        assert!(out_of_array("faulty,write_error\n"));
        assert!(out_of_array("gone"));
        assert!(!out_of_array("in_sync"));
        assert!(!out_of_array("spare"));
    }

    fn figures(leg_written: u64, survivor_written: u64) -> ResyncFigures {
        ResyncFigures {
            leg_written,
            survivor_written,
            bitmap: Bitmap {
                bits: 128,
                dirty: 17,
                chunk_bytes: 4 * MIB,
            },
            size: 512 * MIB,
        }
    }

    #[test]
    fn a_resync_of_the_dirty_chunks_passes_and_a_full_copy_does_not() {
        // 17 dirty chunks of 4 MiB copied, and 20 MiB of writers' writes on both legs.
        let partial = figures(68 * MIB + 20 * MIB, 20 * MIB + (64 << 10));
        assert_eq!(partial.check_well_below_size(), Ok(()));
        // A full copy: the whole leg, plus the same writers' writes.
        let full = figures(512 * MIB + 20 * MIB, 20 * MIB);
        assert!(full.check().is_err());
        assert!(full.check_well_below_size().is_err());
        // Many writers' writes on the surviving leg before the re-add widen the bound, but
        // cannot hide a full copy from the size check.
        let busy = figures(512 * MIB + 10 * MIB, 460 * MIB);
        assert_eq!(busy.check(), Ok(()));
        assert!(busy.check_well_below_size().is_err());
        // Nothing copied at all is no resync either.
        assert!(figures(0, 20 * MIB).check().is_err());
    }
}
