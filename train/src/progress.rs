//! Progress on stderr: an indicatif bar (loss, learning rate, tokens/s, device memory)
//! when stderr is a terminal, plain log lines every `log_every` steps either way (above
//! the bar on a terminal; the only output otherwise, so logs of batch jobs stay readable).

use crate::metrics::{StepMetrics, format_memory};
use crate::trainer::TrainObserver;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

/// The console [`TrainObserver`].
pub struct ConsoleProgress {
    bar: Option<ProgressBar>,
    log_every: usize,
    /// Losses since the last log line (their mean is logged).
    window: Vec<f64>,
    started: Instant,
    /// Whether the bar is drawn (stderr is a terminal).
    pub interactive: bool,
}

impl ConsoleProgress {
    /// Logs a line every `log_every` steps (0: only the first and last step); draws a bar
    /// when stderr is a terminal.
    pub fn new(log_every: usize) -> Self {
        ConsoleProgress {
            bar: None,
            log_every,
            window: Vec::new(),
            started: Instant::now(),
            interactive: std::io::stderr().is_terminal(),
        }
    }

    fn println(&self, line: String) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Removes the bar (the summary printed next says where it ended).
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// `1:02:03` or `2:03`.
fn clock(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

impl TrainObserver for ConsoleProgress {
    fn on_start(&mut self, done: usize, total: usize) {
        self.started = Instant::now();
        if self.interactive {
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{elapsed_precise} [{bar:28.cyan/blue}] {pos}/{len} {msg} (eta {eta})",
                )
                .expect("a valid template")
                .progress_chars("=> "),
            );
            bar.set_position(done as u64);
            bar.set_message("compiling kernels, first step...");
            self.bar = Some(bar);
        }
    }

    fn on_step(&mut self, m: &StepMetrics, total: usize) {
        self.window.push(m.loss);
        if let Some(bar) = &self.bar {
            bar.set_position(m.step as u64);
            bar.set_message(format!(
                "loss {:.4} | lr {:.2e} | {:.0} tok/s | mem {}",
                m.loss,
                m.lr,
                m.tokens_per_second,
                format_memory(m.memory_bytes)
            ));
        }
        let due = if self.log_every == 0 {
            m.step == total
        } else {
            m.step.is_multiple_of(self.log_every) || m.step == total
        };
        if due || self.window.len() == 1 && m.step == 1 {
            let mean = self.window.iter().sum::<f64>() / self.window.len() as f64;
            let line = format!(
                "step {}/{total} | loss {:.4} (mean of {}: {:.4}) | lr {:.2e} | grad norm {:.3}{} | {:.0} tok/s | mem {} | {}",
                m.step,
                m.loss,
                self.window.len(),
                mean,
                m.lr,
                m.grad_norm,
                if m.clipped { " (clipped)" } else { "" },
                m.tokens_per_second,
                format_memory(m.memory_bytes),
                clock(self.started.elapsed().as_secs_f64()),
            );
            self.println(line);
            self.window.clear();
        }
    }

    fn on_checkpoint(&mut self, step: usize, dir: &Path) {
        self.println(format!(
            "checkpoint: step {step} saved to {}",
            dir.display()
        ));
    }
}
