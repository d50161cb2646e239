//! Every tracing event of the test process, at trace level, captured for inspection (the tests
//! that prove secrets never reach the log).

use std::io::Write;
use std::sync::{Arc, Mutex};

/// The captured log.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Installs the process-wide subscriber writing into a new capture (once per test binary).
    pub fn install() -> Captured {
        let log = Captured::default();
        let sink = log.clone();
        tracing_subscriber::fmt()
            .with_env_filter("trace")
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .init();
        log
    }

    /// What was logged so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}
