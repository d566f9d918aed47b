//! The loss guard: a step's loss diverges when it is not finite, or is above
//! `spike_factor` times the median of the recent losses when that median is positive
//! (`[divergence]`). The loss is the
//! global batch's, agreed on every rank before the update, so every rank decides alike;
//! the policy (warn, stop, skip the step) is applied in `step.rs`.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::config::DivergenceConfig;

/// Losses needed before a spike can be called (a median of fewer says little).
pub const MIN_HISTORY: usize = 10;

/// Why a loss was called divergent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Divergence {
    /// The loss is inf or NaN.
    NonFinite,
    /// The loss is above `factor` times the recent `median`.
    Spike {
        /// The median of the recent losses.
        median: f64,
        /// The configured factor.
        factor: f64,
    },
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Divergence::NonFinite => f.write_str("not finite"),
            Divergence::Spike { median, factor } => write!(
                f,
                "above {factor} x the median {median:.4} of the recent losses"
            ),
        }
    }
}

/// The recent losses and the count of divergent steps (saved in checkpoints, so a
/// resumed run judges its first steps as the uninterrupted one would).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LossGuard {
    /// The last `window` losses of applied steps, oldest first.
    pub recent: VecDeque<f64>,
    /// Steps whose loss diverged so far.
    pub events: u64,
    /// Steps skipped in a row for their loss (`skip_step`), 0 after an applied step.
    #[serde(default)]
    pub skipped_in_a_row: usize,
}

impl LossGuard {
    /// Judge a step's `loss` (does not record it).
    pub fn judge(&self, loss: f64, cfg: &DivergenceConfig) -> Option<Divergence> {
        if !loss.is_finite() {
            return Some(Divergence::NonFinite);
        }
        // A spike is a multiple of a positive median: a loss that may be negative (a
        // log-likelihood of continuous data, an ELBO) has no such scale, and
        // `spike_factor = 0` turns the test off.
        // No history (window 0 keeps none) has no median: at least one loss is needed.
        let needed = MIN_HISTORY.min(cfg.window).max(1);
        if self.recent.len() < needed || cfg.spike_factor == 0.0 {
            return None;
        }
        let mut v: Vec<f64> = self.recent.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            0.5 * (v[mid - 1] + v[mid])
        };
        (median > 0.0 && loss > cfg.spike_factor * median).then_some(Divergence::Spike {
            median,
            factor: cfg.spike_factor,
        })
    }

    /// Remember the loss of an applied step (finite ones only), keeping `window`.
    pub fn record(&mut self, loss: f64, cfg: &DivergenceConfig) {
        if loss.is_finite() {
            self.recent.push_back(loss);
            while self.recent.len() > cfg.window {
                self.recent.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spikes_are_judged_against_the_median_once_enough_is_known() {
        let cfg = DivergenceConfig {
            window: 12,
            ..Default::default()
        };
        let mut g = LossGuard::default();
        assert_eq!(g.judge(f64::NAN, &cfg), Some(Divergence::NonFinite));
        assert_eq!(g.judge(f64::INFINITY, &cfg), Some(Divergence::NonFinite));
        for i in 0..9 {
            g.record(2.0 + 0.01 * i as f64, &cfg);
            assert_eq!(g.judge(100.0, &cfg), None, "fewer than 10 losses known");
        }
        g.record(2.09, &cfg);
        assert_eq!(g.judge(6.0, &cfg), None, "below 3 x 2.045");
        match g.judge(6.2, &cfg) {
            Some(Divergence::Spike { median, factor }) => {
                assert!((median - 2.045).abs() < 1e-12);
                assert_eq!(factor, 3.0);
            }
            other => panic!("{other:?}"),
        }
        for _ in 0..20 {
            g.record(1.0, &cfg);
        }
        assert_eq!(g.recent.len(), 12, "the window");
        assert!(g.judge(3.5, &cfg).is_some());
        g.record(f64::NAN, &cfg);
        assert_eq!(g.recent.len(), 12, "non-finite losses are not recorded");
        let off = DivergenceConfig {
            spike_factor: 0.0,
            ..cfg.clone()
        };
        assert_eq!(g.judge(1e30, &off), None, "spike_factor = 0: no spikes");
        assert_eq!(g.judge(f64::NAN, &off), Some(Divergence::NonFinite));
    }

    #[test]
    fn a_loss_below_zero_has_no_spikes() {
        // A negative log-likelihood of continuous data: losses around -5; a step at
        // -4 is above 3 x -5 but is no spike, and neither is one at a median of 0.
        let cfg = DivergenceConfig::default();
        let mut g = LossGuard::default();
        for i in 0..20 {
            g.record(-5.0 - 0.01 * i as f64, &cfg);
        }
        assert_eq!(g.judge(-4.0, &cfg), None);
        assert_eq!(g.judge(100.0, &cfg), None);
        let mut zero = LossGuard::default();
        for _ in 0..20 {
            zero.record(0.0, &cfg);
        }
        assert_eq!(zero.judge(1e-9, &cfg), None);
        assert_eq!(zero.judge(f64::INFINITY, &cfg), Some(Divergence::NonFinite));
    }

    #[test]
    fn no_history_judges_no_spike() {
        // window = 0 (refused by validation, but `judge` is public) keeps no losses.
        let cfg = DivergenceConfig {
            window: 0,
            ..Default::default()
        };
        let mut g = LossGuard::default();
        assert_eq!(g.judge(1e30, &cfg), None);
        assert_eq!(g.judge(f64::NAN, &cfg), Some(Divergence::NonFinite));
        g.record(1.0, &cfg);
        assert!(g.recent.is_empty());
        assert_eq!(g.judge(1e30, &cfg), None);
        // One loss kept by a window of 1 is a median of one.
        let one = DivergenceConfig {
            window: 1,
            ..Default::default()
        };
        assert_eq!(LossGuard::default().judge(1e30, &one), None);
        g.record(1.0, &one);
        assert!(g.judge(1e30, &one).is_some());
    }
}
