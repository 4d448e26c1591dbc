//! Progress on stderr for the subcommands whose work is long: a bar for counted runs
//! (`simulate`) and a spinner naming the step under way (`doctor snapshot`, where
//! NVML's start-up alone takes seconds on GPUs without persistence mode). Both draw
//! only when stderr is a terminal, so piped and logged output stays plain.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of counted runs that only appears once the work has taken a second.
pub struct Progress {
    bar: ProgressBar,
    started: Instant,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if let Ok(style) =
            ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} runs")
        {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        Progress {
            bar,
            started: Instant::now(),
        }
    }

    pub fn tick(&self) {
        self.bar.inc(1);
        if self.bar.is_hidden()
            && self.started.elapsed() > Duration::from_secs(1)
            && std::io::stderr().is_terminal()
        {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A spinner naming the step under way. A step is one blocking call (starting NVML,
/// running `dmesg`), so the spinner ticks on its own thread rather than waiting for
/// the caller.
pub struct Steps {
    bar: ProgressBar,
}

impl Steps {
    pub fn new(what: &str) -> Steps {
        if !std::io::stderr().is_terminal() {
            return Steps {
                bar: ProgressBar::hidden(),
            };
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix}: {msg} [{elapsed}]") {
            bar.set_style(style);
        }
        bar.set_prefix(what.to_string());
        bar.enable_steady_tick(Duration::from_millis(120));
        Steps { bar }
    }

    pub fn step(&self, what: &str) {
        self.bar.set_message(what.to_string());
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Steps {
    /// An early return (an error on the way) clears the spinner before the error is printed.
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}
