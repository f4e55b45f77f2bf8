//! The serial console's output side: where the bytes go, and what the VMM
//! watches for in them.
//!
//! Output is written line by line (flushed at each newline and when the VM
//! stops) to stdout or a file. Each complete line is checked against:
//! * the `--until` regex: a match stops the VM cleanly;
//! * the end of a guest kernel panic (`---[ end Kernel panic`): the VM stops
//!   with a failure, reporting the panic message. Without this a panicked
//!   guest would spin until `--timeout`.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use regex::Regex;

/// Something that wants to hear about console lines.
pub trait ConsoleEvents: Send + Sync {
    /// The `--until` regex matched `line`.
    fn until_matched(&self, line: &str);
    /// The guest kernel panicked with `message`.
    fn guest_panicked(&self, message: &str);
}

/// The console's output side (the serial device's writer).
pub struct ConsoleSink {
    out: Box<dyn Write + Send>,
    line: Vec<u8>,
    /// How much of `line` already went to `out` (flushed partial line).
    written: usize,
    until: Option<Regex>,
    matched: bool,
    panic_message: Option<String>,
    events: Arc<dyn ConsoleEvents>,
    capture: Option<Arc<Mutex<Vec<u8>>>>,
    /// The output failed once (a closed pipe, a full disk): stop writing,
    /// keep watching.
    out_failed: bool,
}

impl std::fmt::Debug for ConsoleSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleSink")
            .field("until", &self.until)
            .finish()
    }
}

impl ConsoleSink {
    /// A sink writing to `out`, watching for `until`.
    pub fn new(
        out: Box<dyn Write + Send>,
        until: Option<Regex>,
        events: Arc<dyn ConsoleEvents>,
    ) -> Self {
        Self {
            out,
            line: Vec::with_capacity(256),
            written: 0,
            until,
            matched: false,
            panic_message: None,
            events,
            capture: None,
            out_failed: false,
        }
    }

    /// Also keeps a copy of everything written in `buf` (tests).
    pub fn with_capture(mut self, buf: Arc<Mutex<Vec<u8>>>) -> Self {
        self.capture = Some(buf);
        self
    }

    /// Writes `line[written..]` out; a failure is reported once and then
    /// output stops, so that `vmm run | head` does not flood the log.
    fn emit(&mut self) {
        if self.out_failed {
            return;
        }
        let r = self
            .out
            .write_all(&self.line[self.written..])
            .and_then(|_| self.out.flush());
        if let Err(e) = r {
            self.out_failed = true;
            tracing::warn!(
                "console output failed ({e}); the guest's console is discarded from now on"
            );
        }
        self.written = self.line.len();
    }

    fn end_line(&mut self) -> io::Result<()> {
        self.emit();
        let text = String::from_utf8_lossy(&self.line);
        let text = text.trim_end_matches(['\n', '\r']);
        if let Some(msg) = text.find("Kernel panic - not syncing") {
            if !text.contains("---[ end") {
                self.panic_message = Some(text[msg..].to_string());
            }
        }
        if text.contains("---[ end Kernel panic") {
            let m = self
                .panic_message
                .clone()
                .unwrap_or_else(|| text.to_string());
            self.events.guest_panicked(&m);
        }
        if !self.matched {
            if let Some(re) = &self.until {
                if re.is_match(text) {
                    self.matched = true;
                    self.events.until_matched(text);
                }
            }
        }
        self.line.clear();
        self.written = 0;
        Ok(())
    }
}

impl Write for ConsoleSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(c) = &self.capture {
            c.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
        }
        for &b in buf {
            self.line.push(b);
            if b == b'\n' || self.line.len() >= 4096 {
                self.end_line()?;
            }
        }
        Ok(buf.len())
    }

    /// Pushes a partial line out (a prompt shows up at once) but keeps it
    /// for matching: the serial device flushes after every byte.
    fn flush(&mut self) -> io::Result<()> {
        self.emit();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);
    impl ConsoleEvents for Seen {
        fn until_matched(&self, line: &str) {
            self.0.lock().unwrap().push(format!("until:{line}"));
        }
        fn guest_panicked(&self, message: &str) {
            self.0.lock().unwrap().push(format!("panic:{message}"));
        }
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn until_matches_once_and_output_is_complete() {
        let seen = Arc::new(Seen::default());
        let out = Buf::default();
        let mut s = ConsoleSink::new(
            Box::new(out.clone()),
            Some(Regex::new(r"root domain span: \S+").unwrap()),
            seen.clone(),
        );
        // Byte by byte, flushed after each, as the serial device does.
        for b in b"hello\r\nroot domain span: 0-7 (max)\nroot domain span: 0-3\npartial" {
            s.write_all(&[*b]).unwrap();
            s.flush().unwrap();
        }
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec!["until:root domain span: 0-7 (max)".to_string()]
        );
        assert_eq!(
            String::from_utf8_lossy(&out.0.lock().unwrap()),
            "hello\r\nroot domain span: 0-7 (max)\nroot domain span: 0-3\npartial"
        );
    }

    struct Broken;
    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_broken_output_still_matches() {
        let seen = Arc::new(Seen::default());
        let mut s = ConsoleSink::new(
            Box::new(Broken),
            Some(Regex::new("b").unwrap()),
            seen.clone(),
        );
        s.write_all(b"a\nb\n").unwrap();
        s.flush().unwrap();
        assert_eq!(*seen.0.lock().unwrap(), vec!["until:b".to_string()]);
    }

    #[test]
    fn panic_reported_at_its_end_marker() {
        let seen = Arc::new(Seen::default());
        let mut s = ConsoleSink::new(Box::new(io::sink()), None, seen.clone());
        s.write_all(b"[ 1.0] Kernel panic - not syncing: VFS: Unable to mount root fs\n")
            .unwrap();
        assert!(seen.0.lock().unwrap().is_empty());
        s.write_all(b"[ 1.1] ---[ end Kernel panic - not syncing: VFS ]---\n")
            .unwrap();
        assert_eq!(
            *seen.0.lock().unwrap(),
            vec!["panic:Kernel panic - not syncing: VFS: Unable to mount root fs".to_string()]
        );
    }
}
