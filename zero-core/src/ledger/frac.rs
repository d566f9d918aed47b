//! Exact byte counts that may be fractions: the paper's formulas have Ψ/N terms that are
//! not integers when N does not divide Ψ, and "plan - formula == sum of explanations"
//! must hold exactly, so they are kept as reduced fractions of i128.

use std::ops::{Add, Neg, Sub};

/// `num / den` bytes, reduced, `den > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Frac {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    a = a.abs();
    b = b.abs();
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

impl Frac {
    /// Zero bytes.
    pub const ZERO: Frac = Frac { num: 0, den: 1 };

    /// `num / den` (den must be positive; 0 is taken as 1).
    pub fn new(num: i128, den: i128) -> Frac {
        let den = if den == 0 { 1 } else { den };
        let (num, den) = if den < 0 { (-num, -den) } else { (num, den) };
        let g = gcd(num, den);
        Frac {
            num: num / g,
            den: den / g,
        }
    }

    /// A whole number of bytes.
    pub fn int(n: i128) -> Frac {
        Frac { num: n, den: 1 }
    }

    /// Numerator (reduced).
    pub fn numer(self) -> i128 {
        self.num
    }

    /// Denominator (reduced, positive).
    pub fn denom(self) -> i128 {
        self.den
    }

    /// Multiply by a whole number.
    pub fn times(self, k: i128) -> Frac {
        Frac::new(self.num * k, self.den)
    }

    /// Nearest f64.
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

impl Add for Frac {
    type Output = Frac;
    fn add(self, o: Frac) -> Frac {
        Frac::new(self.num * o.den + o.num * self.den, self.den * o.den)
    }
}

impl Sub for Frac {
    type Output = Frac;
    fn sub(self, o: Frac) -> Frac {
        self + (-o)
    }
}

impl Neg for Frac {
    type Output = Frac;
    fn neg(self) -> Frac {
        Frac {
            num: -self.num,
            den: self.den,
        }
    }
}

impl std::iter::Sum for Frac {
    fn sum<I: Iterator<Item = Frac>>(it: I) -> Frac {
        it.fold(Frac::ZERO, |a, b| a + b)
    }
}

impl std::fmt::Display for Frac {
    /// Bytes in human units (GB = 1e9 as in the paper, MB, kB, B), signed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", human_bytes(self.to_f64()))
    }
}

/// Bytes with a decimal unit (the ZeRO paper's GB are 1e9 bytes).
pub fn human_bytes(b: f64) -> String {
    let a = b.abs();
    if a >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if a >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if a >= 1e3 {
        format!("{:.2} kB", b / 1e3)
    } else if b.fract() == 0.0 {
        format!("{b} B")
    } else {
        format!("{b:.3} B")
    }
}
