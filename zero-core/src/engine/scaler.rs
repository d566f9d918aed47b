//! Dynamic loss scaling for fp16 training (Micikevicius et al., "Mixed Precision
//! Training", ICLR 2018, §3.2; the policy of apex/DeepSpeed's DynamicLossScaler).
//!
//! The loss is multiplied by `scale` before the backward so small gradients survive in
//! fp16; gradients are divided by it before the step. On an overflow (inf/NaN anywhere,
//! on any rank) the step is skipped everywhere; after `hysteresis` consecutive overflows
//! the scale is multiplied by `backoff` (never below `min_scale`). After `growth_interval`
//! clean steps in a row it is multiplied by `growth`. A clean step restores the hysteresis
//! budget. With scaling off (fp32, bf16) the scale stays 1 and nothing changes.
//! Overflows at the floor are counted (`skips_at_min`): many in a row mean fp16 can no
//! longer represent this training's gradients, and the engine stops
//! (`precision.max_skips_at_min_scale`).

use serde::{Deserialize, Serialize};

use crate::config::PrecisionConfig;

/// The largest loss scale (2^127): the largest power of two f32 holds (the scaled
/// gradient's weight is an f32), far past any scale fp16 gradients can use (their range
/// ends at 65504), and finite, so that growth can never make it infinite, where every
/// step would overflow and no backoff could bring it down.
pub const MAX_LOSS_SCALE: f64 = 1.7014118346046923e38; // 2^127

/// The smallest loss scale (2^-126, f32's smallest normal number): gradients are
/// multiplied by 1/scale in f32, and 1/scale past f32::MAX (scales below about 2^-128)
/// is infinite, which would turn every step into an "overflow". The config
/// (`precision.min_scale`, `initial_scale`) and an imported scaler are held to it.
pub const MIN_LOSS_SCALE: f64 = f32::MIN_POSITIVE as f64; // 2^-126

/// The scaler's whole state (saved in checkpoints so a resumed run continues exactly).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// Current scale (1 when scaling is off).
    pub scale: f64,
    /// Whether dynamic scaling is on.
    pub enabled: bool,
    /// Factor on growth.
    pub growth: f64,
    /// Clean steps before growing.
    pub growth_interval: usize,
    /// Factor on backoff.
    pub backoff: f64,
    /// Overflows tolerated before backing off.
    pub hysteresis: usize,
    /// Floor of the scale.
    pub min_scale: f64,
    /// Clean steps since the last overflow or growth.
    pub clean_steps: usize,
    /// Hysteresis budget left.
    pub hysteresis_left: usize,
    /// Overflowing steps in a row at `min_scale` (0 after a clean step).
    #[serde(default)]
    pub skips_at_min: usize,
}

impl LossScaler {
    /// The scaler a precision config asks for.
    pub fn new(p: &PrecisionConfig) -> LossScaler {
        let enabled = p.loss_scaling();
        LossScaler {
            scale: if enabled { p.initial_scale } else { 1.0 },
            enabled,
            growth: p.growth_factor,
            growth_interval: p.growth_interval,
            backoff: p.backoff_factor,
            hysteresis: p.hysteresis.max(1),
            min_scale: p.min_scale,
            clean_steps: 0,
            hysteresis_left: p.hysteresis.max(1),
            skips_at_min: 0,
        }
    }

    /// This scaler's state (scale and counters) under the policy of `p` (growth, backoff,
    /// hysteresis, floor): what a resumed run continues with when its precision is the
    /// saved one. The scale is kept within the new floor.
    pub fn with_policy_of(&self, p: &PrecisionConfig) -> LossScaler {
        let fresh = LossScaler::new(p);
        // max and min, not clamp: a floor nothing validated (scaling off) may be NaN.
        let ceiling = MAX_LOSS_SCALE.max(fresh.min_scale);
        LossScaler {
            scale: self.scale.max(fresh.min_scale).min(ceiling),
            clean_steps: self.clean_steps,
            hysteresis_left: self.hysteresis_left.clamp(1, fresh.hysteresis),
            skips_at_min: self.skips_at_min,
            ..fresh
        }
    }

    /// Record the outcome of a step (`overflow`: some gradient was inf/NaN on some rank).
    pub fn update(&mut self, overflow: bool) {
        if !self.enabled {
            return;
        }
        if overflow {
            if self.scale <= self.min_scale {
                self.skips_at_min = self.skips_at_min.saturating_add(1);
            }
            self.clean_steps = 0;
            self.hysteresis_left = self.hysteresis_left.saturating_sub(1);
            if self.hysteresis_left == 0 {
                self.scale = (self.scale * self.backoff).max(self.min_scale);
                self.hysteresis_left = self.hysteresis;
            }
        } else {
            self.skips_at_min = 0;
            self.clean_steps = self.clean_steps.saturating_add(1);
            self.hysteresis_left = self.hysteresis;
            if self.clean_steps >= self.growth_interval {
                self.scale = (self.scale * self.growth).min(MAX_LOSS_SCALE);
                self.clean_steps = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineConfig as Config;

    fn fp16() -> LossScaler {
        let mut c = Config::default();
        c.precision.dtype = crate::config::Precision::Fp16;
        LossScaler::new(&c.precision)
    }

    #[test]
    fn defaults_follow_the_issue() {
        let s = fp16();
        assert!(s.enabled);
        assert_eq!(s.scale, 65536.0);
        assert_eq!(
            (s.growth, s.growth_interval, s.backoff, s.hysteresis),
            (2.0, 1000, 0.5, 2)
        );
    }

    #[test]
    fn backs_off_after_hysteresis_overflows_and_grows_after_clean_run() {
        let mut s = fp16();
        s.update(true); // first overflow: budget 2 -> 1, scale kept
        assert_eq!(s.scale, 65536.0);
        s.update(true); // second in a row: back off
        assert_eq!(s.scale, 32768.0);
        s.update(true);
        s.update(false); // a clean step restores the budget
        s.update(true);
        assert_eq!(s.scale, 32768.0);
        for _ in 0..1000 {
            s.update(false);
        }
        assert_eq!(s.scale, 65536.0);
    }

    #[test]
    fn overflows_at_the_floor_are_counted_until_a_clean_step() {
        let mut s = fp16();
        s.min_scale = 16384.0;
        s.update(true);
        s.update(true); // the second overflow in a row backs off: 65536 -> 32768
        assert_eq!(s.scale, 32768.0);
        assert_eq!(s.skips_at_min, 0, "32768 is above the floor");
        s.update(true);
        s.update(true);
        assert_eq!(s.scale, 16384.0);
        s.update(true);
        s.update(true);
        assert_eq!((s.scale, s.skips_at_min), (16384.0, 2));
        s.update(false);
        assert_eq!(s.skips_at_min, 0);
    }

    #[test]
    fn growth_stops_at_a_finite_ceiling_from_which_backoff_comes_down() {
        let mut s = fp16();
        (s.growth, s.growth_interval) = (1e300, 1);
        s.update(false);
        s.update(false);
        assert_eq!(s.scale, MAX_LOSS_SCALE);
        s.update(true);
        s.update(true);
        assert_eq!(s.scale, MAX_LOSS_SCALE / 2.0);
    }

    #[test]
    fn never_below_the_floor_and_inert_when_disabled() {
        let mut s = fp16();
        s.min_scale = 1000.0;
        for _ in 0..200 {
            s.update(true);
        }
        assert_eq!(s.scale, 1000.0);
        let mut off = LossScaler::new(&Config::default().precision);
        off.update(true);
        assert_eq!((off.enabled, off.scale), (false, 1.0));
    }
}
