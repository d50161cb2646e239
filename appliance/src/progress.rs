//! Progress of long operations for operators: a single redrawn line on a terminal, plain lines at
//! each 10% step anywhere else, so logs and serial consoles stay readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use edgevol_core::Progress;

/// Width used when the terminal's is unknown (`COLUMNS` is rarely exported).
const DEFAULT_WIDTH: usize = 80;
/// Narrowest bar worth drawing; below it the line is text only.
const MIN_BAR: usize = 10;
/// Redraws per second at most: a terminal over a slow serial line keeps up.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// One line of progress, exactly `width` columns when a bar fits:
/// `[#########.........]  50%    8.0 GiB /   16.0 GiB     2.0 GiB/s`. The fields have fixed
/// widths so the bar does not jitter between redraws; too narrow for a bar, the line is compact
/// text. Pure, for tests.
pub fn render(done: u64, total: u64, width: usize, elapsed: Duration) -> String {
    let done = done.min(total);
    let pct = percent(done, total);
    let rate = rate(done, elapsed).map(|r| format!("{r}/s"));
    let text = format!(
        " {pct:>3}%  {:>10} / {:>10}  {:>12}",
        human_bytes(done),
        human_bytes(total),
        rate.as_deref().unwrap_or("")
    );
    let Some(bar) = width.checked_sub(text.len() + 2).filter(|b| *b >= MIN_BAR) else {
        let rate = rate.map(|r| format!("  {r}")).unwrap_or_default();
        return format!(
            "{pct}%  {} / {}{rate}",
            human_bytes(done),
            human_bytes(total)
        );
    };
    let filled = if total == 0 {
        bar
    } else {
        usize::try_from(u128::from(done) * bar as u128 / u128::from(total)).unwrap_or(bar)
    };
    format!("[{}{}]{text}", "#".repeat(filled), ".".repeat(bar - filled))
}

/// Whole percent done, rounded down (100 only when done); an empty operation is done.
pub fn percent(done: u64, total: u64) -> u8 {
    if total == 0 {
        return 100;
    }
    let p = u128::from(done.min(total)) * 100 / u128::from(total);
    u8::try_from(p).unwrap_or(100)
}

/// A byte count as every edgevol tool shows sizes (binary units, truncated).
pub fn human_bytes(n: u64) -> String {
    edgevol_driver::units::human_bytes(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Bytes per second so far, once any time has passed.
fn rate(done: u64, elapsed: Duration) -> Option<String> {
    let micros = elapsed.as_micros();
    (micros > 0).then(|| {
        let per_sec = u128::from(done) * 1_000_000 / micros;
        human_bytes(u64::try_from(per_sec).unwrap_or(u64::MAX))
    })
}

/// Reports each 10% step once, for logs: [`Steps::next`] is the new step's percent when one
/// was reached (several at once report only the highest; 0% is not a step).
#[derive(Debug, Default)]
pub struct Steps {
    reached: u8,
}

impl Steps {
    /// The percent (10, 20... 100) of a step `p` reached that was not reported yet.
    pub fn next(&mut self, p: Progress) -> Option<u8> {
        let step = percent(p.done, p.total) / 10 * 10;
        (step > self.reached).then(|| {
            self.reached = step;
            step
        })
    }
}

/// Progress of one operation on stderr, as a bar on a terminal or lines otherwise.
#[derive(Debug)]
pub struct Reporter {
    label: String,
    start: Instant,
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    /// A terminal: the line is redrawn in place.
    Bar {
        width: usize,
        last: Option<Instant>,
        drawn: bool,
    },
    /// Not a terminal: one line per 10% step.
    Lines(Steps),
}

impl Reporter {
    /// Reports to stderr, choosing the bar when stderr is a terminal.
    pub fn stderr(label: &str) -> Self {
        let mode = if std::io::stderr().is_terminal() {
            let width = std::env::var("COLUMNS")
                .ok()
                .and_then(|c| c.parse::<usize>().ok())
                .unwrap_or(DEFAULT_WIDTH);
            Mode::Bar {
                // The label, a space, and one column spare: writing the last column wraps on
                // some terminals.
                width: width.saturating_sub(label.len() + 3),
                last: None,
                drawn: false,
            }
        } else {
            Mode::Lines(Steps::default())
        };
        Self {
            label: label.to_owned(),
            start: Instant::now(),
            mode,
        }
    }

    /// Shows `p` if it is worth showing (a redraw is due, or a new 10% step).
    pub fn update(&mut self, p: Progress) {
        let elapsed = self.start.elapsed();
        let mut err = std::io::stderr().lock();
        // Progress is best effort: a closed stderr must not fail the operation.
        let _ = match &mut self.mode {
            Mode::Bar { width, last, drawn } => {
                let now = Instant::now();
                if p.done < p.total && last.is_some_and(|t| now - t < REDRAW_EVERY) {
                    return;
                }
                *last = Some(now);
                *drawn = true;
                let line = render(p.done, p.total, *width, elapsed);
                // `\r` back to the start; `ESC[K` clears what a longer line left behind.
                write!(err, "\r{}: {line}\x1b[K", self.label).and_then(|()| err.flush())
            }
            Mode::Lines(steps) => match steps.next(p) {
                Some(step) => writeln!(
                    err,
                    "{}: {step:>3}% ({} of {}{})",
                    self.label,
                    human_bytes(p.done.min(p.total)),
                    human_bytes(p.total),
                    rate(p.done, elapsed)
                        .map(|r| format!(", {r}/s"))
                        .unwrap_or_default()
                ),
                None => Ok(()),
            },
        };
    }

    /// Ends the bar's line, so what follows starts on a line of its own.
    pub fn finish(&mut self) {
        if let Mode::Bar { drawn: true, .. } = self.mode {
            let _ = writeln!(std::io::stderr());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_bar_fills_the_width_and_says_percent_bytes_and_rate() {
        let line = render(8 * GIB, 16 * GIB, 70, Duration::from_secs(4));
        assert_eq!(line.chars().count(), 70, "{line:?}");
        assert!(
            line.ends_with("]  50%     8.0 GiB /   16.0 GiB     2.0 GiB/s"),
            "{line:?}"
        );
        let bar = &line[1..line.find(']').unwrap()];
        assert_eq!(
            bar.matches('#').count() * 2,
            bar.len(),
            "half full: {line:?}"
        );
        assert!(bar.starts_with('#') && bar.ends_with('.'));
    }

    #[test]
    fn redraws_keep_the_same_length() {
        let lens: Vec<usize> = [(0, 0), (1, 1), (512 << 20, 3), (64 * GIB, 9)]
            .iter()
            .map(|&(done, secs)| render(done, 64 * GIB, 72, Duration::from_secs(secs)).len())
            .collect();
        assert!(lens.iter().all(|&l| l == 72), "{lens:?}");
    }

    #[test]
    fn the_ends_of_the_range() {
        let start = render(0, 16 * GIB, 60, Duration::ZERO);
        assert!(start.starts_with("[...."), "{start:?}");
        assert_eq!(start.len(), 60, "{start:?}");
        assert!(
            start.ends_with("]   0%         0 B /   16.0 GiB              "),
            "no rate before time passes: {start:?}"
        );
        let done = render(16 * GIB, 16 * GIB, 60, Duration::from_millis(500));
        let bar = &done[1..done.find(']').unwrap()];
        assert!(bar.chars().all(|c| c == '#'), "full: {done:?}");
        assert!(
            done.ends_with("] 100%    16.0 GiB /   16.0 GiB    32.0 GiB/s"),
            "{done:?}"
        );
        // Past the total (a rounding caller) is shown as done, never above 100%.
        assert_eq!(
            render(17 * GIB, 16 * GIB, 60, Duration::from_secs(1)),
            render(16 * GIB, 16 * GIB, 60, Duration::from_secs(1))
        );
        assert!(
            render(0, 0, 40, Duration::ZERO).contains("100%"),
            "empty is done"
        );
    }

    #[test]
    fn percent_rounds_down_so_100_means_done() {
        assert_eq!(percent(999, 1000), 99);
        assert_eq!(percent(1000, 1000), 100);
        assert_eq!(percent(u64::MAX - 1, u64::MAX), 99, "no overflow");
    }

    #[test]
    fn a_narrow_terminal_gets_text_only() {
        let line = render(GIB, 4 * GIB, 30, Duration::from_secs(1));
        assert_eq!(line, "25%  1.0 GiB / 4.0 GiB  1.0 GiB/s");
    }

    #[test]
    fn human_bytes_in_binary_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(16 * GIB), "16.0 GiB");
        assert_eq!(human_bytes(3 << 40), "3.0 TiB");
    }

    #[test]
    fn steps_report_each_ten_percent_once() {
        let mut steps = Steps::default();
        let at = |done| Progress { done, total: 1000 };
        let seen: Vec<u8> = [0, 50, 99, 100, 150, 420, 999, 1000, 1000]
            .into_iter()
            .filter_map(|d| steps.next(at(d)))
            .collect();
        assert_eq!(seen, [10, 40, 90, 100]);
    }
}
