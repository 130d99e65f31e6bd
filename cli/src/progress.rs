//! A progress bar on stderr for real-time runs (a plain line every 10 % when
//! stderr is not a terminal).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const WIDTH: usize = 30;

/// Progress of a run of `total_ms`.
pub struct Progress {
    total_ms: u64,
    tty: bool,
    last_draw: Option<Instant>,
    last_decile: u64,
}

impl Progress {
    /// A bar for a run of `total_ms`.
    pub fn new(total_ms: u64) -> Self {
        Progress {
            total_ms: total_ms.max(1),
            tty: std::io::stderr().is_terminal(),
            last_draw: None,
            last_decile: 0,
        }
    }

    /// Sleep until `due` (the traffic's schedule), redrawing every 100 ms.
    pub fn wait_until(&mut self, due: Instant, start: Instant, status: &str) {
        loop {
            let now = Instant::now();
            if self.last_draw.is_none_or(|t| now - t >= Duration::from_millis(100)) {
                self.draw(now - start, status);
                self.last_draw = Some(now);
            }
            if now >= due {
                return;
            }
            std::thread::sleep((due - now).min(Duration::from_millis(100)));
        }
    }

    fn draw(&mut self, elapsed: Duration, status: &str) {
        let ms = (elapsed.as_millis() as u64).min(self.total_ms);
        let pct = ms * 100 / self.total_ms;
        let mut err = std::io::stderr().lock();
        if self.tty {
            let filled = (pct as usize * WIDTH) / 100;
            let _ = write!(
                err,
                "\r[{}{}] {pct:>3}% {:>6.1}/{:.1} s  {status}\x1b[K",
                "#".repeat(filled),
                "-".repeat(WIDTH - filled),
                ms as f64 / 1000.0,
                self.total_ms as f64 / 1000.0
            );
        } else if pct / 10 > self.last_decile {
            self.last_decile = pct / 10;
            let _ = writeln!(err, "{pct:>3}% of {:.1} s  {status}", self.total_ms as f64 / 1000.0);
        }
        let _ = err.flush();
    }

    /// Draw the full bar and end the line.
    pub fn finish(&mut self, status: &str) {
        self.draw(Duration::from_millis(self.total_ms), status);
        if self.tty {
            eprintln!();
        }
    }
}
