//! The serial log of a QEMU guest (qemu/run-guest.sh) whose script marks its steps with
//! `<MARK>-BEGIN name` .. `<MARK>-END name rc=N`: each step's output lines and exit code.

use std::collections::HashMap;

/// One guest step: its output lines and exit code.
#[derive(Debug, Default)]
pub struct Step {
    pub out: Vec<String>,
    pub rc: Option<i32>,
}

impl Step {
    pub fn text(&self) -> String {
        self.out.join("\n")
    }

    /// Asserts the step exited 0.
    pub fn ok(&self, name: &str) -> &Self {
        assert_eq!(
            self.rc,
            Some(0),
            "guest step {name} failed:\n{}",
            self.text()
        );
        self
    }

    /// The first word after `prefix` on the first line that starts with it.
    pub fn find_word_after(&self, prefix: &str) -> Option<&str> {
        self.out
            .iter()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
    }

    /// [`Step::find_word_after`], which must be there.
    pub fn word_after(&self, prefix: &str) -> &str {
        self.find_word_after(prefix)
            .unwrap_or_else(|| panic!("`{prefix}` in:\n{}", self.text()))
    }
}

/// Splits `log` into the steps marked with `mark` (e.g. `EVCLI`).
pub fn steps(log: &str, mark: &str) -> HashMap<String, Step> {
    let (begin, end) = (format!("{mark}-BEGIN "), format!("{mark}-END "));
    let mut steps: HashMap<String, Step> = HashMap::new();
    let mut current: Option<String> = None;
    for line in log.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix(&begin) {
            current = Some(name.trim().to_owned());
            steps.entry(name.trim().to_owned()).or_default();
        } else if let Some(ended) = line.strip_prefix(&end) {
            let (name, rc) = ended
                .split_once(" rc=")
                .unwrap_or_else(|| panic!("{end}name rc=N, got {line:?}"));
            steps.entry(name.to_owned()).or_default().rc = rc.trim().parse().ok();
            current = None;
        } else if let Some(name) = &current {
            steps
                .get_mut(name)
                .expect("begun")
                .out
                .push(line.to_owned());
        }
    }
    steps
}
