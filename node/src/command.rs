//! Running a host program that must succeed: mount(8), umount(8), resize2fs, xfs_growfs.
//! Programs whose exit codes mean more than pass/fail (blkid, mkfs, e2fsck) read their
//! [`CmdOutput`](crate::host::CmdOutput) themselves.

use std::path::Path;

use crate::error::{Error, Result};
use crate::host::Host;

/// Runs `program` with `args`; anything but exit status 0 (a death by signal included) is an
/// error naming the command line, how it ended and what it wrote to stderr.
pub(crate) fn run_checked<H: Host + ?Sized>(
    host: &H,
    program: &str,
    args: Vec<String>,
) -> Result<()> {
    let out = host
        .run(program, &args)
        .map_err(|e| Error::io(format!("running {program}"), &e))?;
    if out.success() {
        return Ok(());
    }
    let ended = out
        .code
        .map_or_else(|| "killed by a signal".to_owned(), |c| format!("exit {c}"));
    Err(Error::Internal(format!(
        "{program} {} failed ({ended}): {}",
        args.join(" "),
        out.stderr.trim()
    )))
}

/// A path as a command argument.
pub(crate) fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::LinuxHost;

    fn sh(script: &str) -> Result<()> {
        run_checked(
            &LinuxHost::default(),
            "sh",
            vec!["-c".into(), script.into()],
        )
    }

    #[test]
    fn only_exit_status_zero_passes_and_failures_say_how_the_command_ended() {
        sh("exit 0").unwrap();
        let e = sh("echo 'no space left' >&2; exit 3").unwrap_err();
        assert!(
            matches!(&e, Error::Internal(m)
                if m == "sh -c echo 'no space left' >&2; exit 3 failed (exit 3): no space left"),
            "{e}"
        );
        // A command that died by a signal has no exit status: still a failure, said so.
        let e = sh("kill -KILL $$").unwrap_err();
        assert!(
            matches!(&e, Error::Internal(m) if m.contains("(killed by a signal)")),
            "{e}"
        );
        let e = run_checked(&LinuxHost::default(), "/nonexistent/program", Vec::new()).unwrap_err();
        assert!(
            matches!(&e, Error::Internal(m) if m.starts_with("running /nonexistent/program: ")),
            "{e}"
        );
    }
}
