//! What rank 0 shows while training: a progress bar (step, loss, tokens/s, loss scale)
//! when stderr is a terminal, otherwise one log line every `train.log_every` steps (and
//! the last), which is what lands in a Slurm output file. Other ranks show nothing.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use zero_core::StepReport;

/// Rank 0's view of one training run.
pub struct Progress {
    /// Rank 0 (shows things) or not.
    active: bool,
    bar: Option<ProgressBar>,
    log_every: usize,
    steps: usize,
    label: String,
}

impl Progress {
    /// Start showing a run of `steps` steps labelled `label` (e.g. "ZeRO-2"), `done` of
    /// them done already (a resumed run).
    pub fn new(
        active: bool,
        plain: bool,
        label: &str,
        (done, steps): (u64, usize),
        log_every: usize,
    ) -> Self {
        let bar = (active && !plain && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::new(steps as u64);
            bar.set_position(done);
            // The template is a constant: an error here is a bug of this file.
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix:>7} [{bar:30.cyan/blue}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_string());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            active,
            bar,
            log_every: log_every.max(1),
            steps,
            label: label.to_string(),
        }
    }

    /// One finished step.
    pub fn step(&self, r: &StepReport, tokens: u64) {
        if !self.active {
            return;
        }
        let tps = tokens as f64 / r.seconds.max(f64::MIN_POSITIVE);
        let skipped = match (r.skipped, r.diverged.is_some()) {
            (true, true) => " (skipped: loss diverged)",
            (true, false) => " (skipped: inf/NaN)",
            (false, true) => " (loss diverged)",
            (false, false) => "",
        };
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!(
                    "loss {:.4} | {} tok/s | scale {}{skipped}",
                    r.loss,
                    si(tps),
                    r.loss_scale
                ));
                bar.inc(1);
            }
            None => {
                let n = r.step as usize;
                if n.is_multiple_of(self.log_every) || n == self.steps || n == 1 {
                    log::info!(
                        "{} step {n}/{}: loss {:.4}, grad norm {:.3}, lr {:.3e}, loss scale {}, {} tok/s, {:.1} ms{skipped}",
                        self.label,
                        self.steps,
                        r.loss,
                        r.grad_norm,
                        r.lr,
                        r.loss_scale,
                        si(tps),
                        r.seconds * 1e3
                    );
                }
            }
        }
    }

    /// The run is over: leave the bar's last state on screen.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// 12345.6 -> "12.3k".
pub fn si(x: f64) -> String {
    if x >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}
