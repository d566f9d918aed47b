//! Parsing of the quantities `zero-bench plan` takes on its command line: counts
//! (`70e9`, `7.5e9`, `1.5B`, `512`), memory sizes (`80GiB`, `141GB`, `1TB`), link
//! bandwidths (`100` = 100 Gb/s, `100Gbps`, `25GB/s`) and latencies (`5` = 5 us, `2us`,
//! `1.5ms`).
//!
//! Counts are parsed exactly (decimal mantissa and exponent in integers, never through
//! f64), so `7.5e9` is 7 500 000 000 and `1.23456789e3` is refused as not whole. Every
//! error says what was given and what would be accepted.

/// A decimal number `digits x 10^exp10`, exactly, from text like `7.5`, `75e8`, `1.5E+9`.
fn parse_decimal(s: &str) -> Result<(u128, i32), String> {
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, "0"),
    };
    let exp: i32 = exp
        .parse()
        .map_err(|_| format!("'{s}': the exponent '{exp}' is not a whole number"))?;
    let mant = mant.replace('_', "");
    let (int, frac) = mant.split_once('.').unwrap_or((&mant, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(format!("'{s}' has no digits"));
    }
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return Err(format!("'{s}' is not a number"));
    }
    let mut digits: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(u128::from(c as u8 - b'0')))
            .ok_or_else(|| format!("'{s}' has too many digits"))?;
    }
    let scale = i32::try_from(frac.len()).map_err(|_| format!("'{s}' is too long"))?;
    Ok((digits, exp.saturating_sub(scale)))
}

/// `digits x 10^exp10 x mult` as a whole number, or an error naming `what`.
fn whole(s: &str, what: &str, digits: u128, exp10: i32, mult: u128) -> Result<u64, String> {
    let mut v = digits.checked_mul(mult);
    if exp10 >= 0 {
        for _ in 0..exp10 {
            v = v.and_then(|x| x.checked_mul(10));
        }
    } else {
        // Exact division only: 7.5 x 10^9 is whole, 1.5 bytes is not.
        for _ in 0..exp10.unsigned_abs() {
            v = v.and_then(|x| (x % 10 == 0).then_some(x / 10));
            if v.is_none() {
                return Err(format!("{what} '{s}' is not a whole number"));
            }
        }
    }
    v.and_then(|x| u64::try_from(x).ok())
        .ok_or_else(|| format!("{what} '{s}' is too large"))
}

/// Split `s` into a numeric head and a unit tail (the tail starts at the first letter
/// that is not an exponent marker followed by a digit or sign, or at a '/').
fn split_unit(s: &str) -> (&str, &str) {
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        let exp_marker = (c == b'e' || c == b'E')
            && i > 0
            && b.get(i + 1)
                .is_some_and(|n| n.is_ascii_digit() || *n == b'+' || *n == b'-');
        if (c.is_ascii_alphabetic() && !exp_marker) || c == b'/' {
            return (s[..i].trim(), s[i..].trim());
        }
    }
    (s.trim(), "")
}

fn reject_sign(s: &str, what: &str) -> Result<(), String> {
    if s.starts_with('-') {
        return Err(format!("{what} must be positive, got '{s}'"));
    }
    Ok(())
}

/// A count such as a parameter count or a number of GPUs: `512`, `70e9`, `7.5e9`,
/// `1_000`, or with a suffix K, M, B (or G), T for 10^3, 10^6, 10^9, 10^12 (`1.5B`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    reject_sign(t, "a count")?;
    let t = t.strip_prefix('+').unwrap_or(t);
    let (num, unit) = split_unit(t);
    if num.is_empty() {
        return Err(format!(
            "'{s}' is not a count; write a number such as 512, 70e9, 7.5e9 or 1.5B"
        ));
    }
    let mult: u128 = match unit {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "B" | "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "'{s}': unknown suffix '{other}'; write a number such as 512, 70e9, 7.5e9 or 1.5B (K, M, B, T)"
            ))
        }
    };
    let (digits, exp) = parse_decimal(num).map_err(|e| format!("count {e}"))?;
    whole(s, "count", digits, exp, mult)
}

/// A positive count (>= 1), with `what` in the message.
pub fn parse_positive(s: &str, what: &str) -> Result<u64, String> {
    let v = parse_count(s)?;
    if v == 0 {
        return Err(format!("{what} must be at least 1, got {s}"));
    }
    Ok(v)
}

/// A memory size in bytes: `80GiB`, `80 GiB`, `141GB`, `1.5TB`, `512MiB`, `4096` (bytes).
/// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (kB, MB, GB, TB)
/// of 1000, as the ZeRO paper's and the vendors' GB are. Units are case-insensitive
/// except that bit notation (`Gb`, `Mb`, ...) is refused.
pub fn parse_mem(s: &str) -> Result<u64, String> {
    let t = s.trim();
    reject_sign(t, "a memory size")?;
    let (num, unit) = split_unit(t);
    if num.is_empty() {
        return Err(format!(
            "'{s}' is not a memory size; write a number with a unit, e.g. 80GiB or 141GB"
        ));
    }
    if matches!(unit, "Kb" | "kb" | "Mb" | "Gb" | "Tb") {
        return Err(format!(
            "memory size '{s}': '{unit}' reads as bits; write bytes, e.g. 80GiB or 80GB"
        ));
    }
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "memory size '{s}': unknown unit '{unit}'; use KiB, MiB, GiB, TiB (1024) or kB, MB, GB, TB (1000), e.g. 80GiB"
            ))
        }
    };
    let (digits, exp) = parse_decimal(num).map_err(|e| format!("memory size {e}"))?;
    // Sizes like 1.5GiB are whole; round a fraction of a byte down rather than refuse.
    let mut v = digits.checked_mul(mult);
    if exp >= 0 {
        for _ in 0..exp {
            v = v.and_then(|x| x.checked_mul(10));
        }
    } else {
        for _ in 0..exp.unsigned_abs() {
            v = v.map(|x| x / 10);
        }
    }
    let v = v
        .and_then(|x| u64::try_from(x).ok())
        .ok_or_else(|| format!("memory size '{s}' is too large"))?;
    if v == 0 {
        return Err(format!("memory size must be positive, got '{s}'"));
    }
    Ok(v)
}

/// A positive finite float (`12.5`, `1e-6`).
fn parse_f64(num: &str, s: &str, what: &str) -> Result<f64, String> {
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{what} '{s}' is not a number"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{what} must be positive and finite, got '{s}'"));
    }
    Ok(v)
}

/// A link bandwidth in bytes per second. A bare number is Gb/s (bits, as NICs are sold:
/// `100` = 100 Gb/s = 12.5 GB/s). Units: `Gbps`/`Gb/s`, `Mbps`/`Mb/s`, `Tbps`/`Tb/s`
/// (bits; lower-case b) and `GB/s`/`GBps`, `MB/s`/`MBps`, `TB/s`/`TBps` (bytes).
pub fn parse_bandwidth(s: &str) -> Result<f64, String> {
    let t = s.trim();
    reject_sign(t, "a bandwidth")?;
    let (num, unit) = split_unit(t);
    let v = parse_f64(num, s, "bandwidth")?;
    let per_s = unit
        .strip_suffix("/s")
        .or_else(|| unit.strip_suffix("ps"))
        .unwrap_or(unit);
    let bytes_per_s = match (unit, per_s) {
        ("", _) => v * 1e9 / 8.0,
        (_, "Gb") => v * 1e9 / 8.0,
        (_, "Mb") => v * 1e6 / 8.0,
        (_, "Tb") => v * 1e12 / 8.0,
        (_, "GB") => v * 1e9,
        (_, "MB") => v * 1e6,
        (_, "TB") => v * 1e12,
        (_, "GiB") => v * (1u64 << 30) as f64,
        _ => {
            return Err(format!(
                "bandwidth '{s}': unknown unit '{unit}'; write 100 (Gb/s), 100Gbps, 100Gb/s or 12.5GB/s"
            ))
        }
    };
    Ok(bytes_per_s)
}

/// A latency in seconds. A bare number is microseconds (`5` = 5 us); units `ns`, `us`,
/// `ms`, `s`.
pub fn parse_latency(s: &str) -> Result<f64, String> {
    let t = s.trim();
    reject_sign(t, "a latency")?;
    let (num, unit) = split_unit(t);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("latency '{s}' is not a number"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("latency must be >= 0 and finite, got '{s}'"));
    }
    let scale = match unit {
        "" | "us" => 1e-6,
        "ns" => 1e-9,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => {
            return Err(format!(
                "latency '{s}': unknown unit '{unit}'; write 5 (us), 5us, 500ns or 0.1ms"
            ))
        }
    };
    Ok(v * scale)
}

/// The most data-parallel ranks a plan is made for: above the largest GPU clusters
/// built, and low enough that planning every rank stays quick.
pub const MAX_RANKS: u64 = 1 << 18;

/// A list of world sizes (`8,64,512`), each at most [`MAX_RANKS`].
pub fn parse_world_list(s: &str, what: &str) -> Result<Vec<u64>, String> {
    let v = parse_count_list(s, what)?;
    match v.iter().find(|&&n| n > MAX_RANKS) {
        Some(n) => Err(format!(
            "{what} {n}: plans are made for at most {MAX_RANKS} ranks"
        )),
        None => Ok(v),
    }
}

/// A comma-separated list of positive counts (`8,64,512`), each at least 1.
pub fn parse_count_list(s: &str, what: &str) -> Result<Vec<u64>, String> {
    let v: Vec<u64> = s
        .split(',')
        .map(|x| parse_positive(x, what))
        .collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err(format!("{what}: give at least one value"));
    }
    Ok(v)
}

/// A fraction in [0, 1): `0.1` or `10%`.
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v: f64 = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|x| x / 100.0),
        None => t.parse(),
    }
    .map_err(|_| format!("'{s}' is not a fraction; write 0.1 or 10%"))?;
    if !(0.0..1.0).contains(&v) {
        return Err(format!(
            "the fraction must be in [0, 1) (0% to <100%), got '{s}'"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_exactly() {
        assert_eq!(parse_count("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_count("7.5e9"), Ok(7_500_000_000));
        assert_eq!(parse_count("70e9"), Ok(70_000_000_000));
        assert_eq!(parse_count("1.5B"), Ok(1_500_000_000));
        assert_eq!(parse_count("512"), Ok(512));
        assert_eq!(parse_count("1_000"), Ok(1000));
        assert_eq!(parse_count("175e+9"), Ok(175_000_000_000));
        assert_eq!(parse_count("2.5E3"), Ok(2500));
        assert_eq!(parse_count("0.5K"), Ok(500));
    }

    #[test]
    fn bad_counts_are_refused_with_the_value() {
        for bad in [
            "-1",
            "1.5",
            "abc",
            "",
            "1e",
            "7.5x",
            "1e400",
            "1.23456789e3",
        ] {
            let e = parse_count(bad).unwrap_err();
            assert!(e.contains(bad), "message for '{bad}' names it: {e}");
        }
        assert!(parse_positive("0", "--gpus")
            .unwrap_err()
            .contains("at least 1"));
        assert_eq!(parse_count_list("8,64,512", "--gpus"), Ok(vec![8, 64, 512]));
        assert!(parse_count_list("8,0", "--gpus").is_err());
        assert!(parse_count_list("8,,64", "--gpus").is_err());
    }

    #[test]
    fn memory_sizes_binary_and_decimal() {
        assert_eq!(parse_mem("80GiB"), Ok(80 << 30));
        assert_eq!(parse_mem("80 GiB"), Ok(80 << 30));
        assert_eq!(parse_mem("80gib"), Ok(80 << 30));
        assert_eq!(parse_mem("141GB"), Ok(141_000_000_000));
        assert_eq!(parse_mem("1.5TB"), Ok(1_500_000_000_000));
        assert_eq!(parse_mem("512MiB"), Ok(512 << 20));
        assert_eq!(parse_mem("64KiB"), Ok(64 << 10));
        assert_eq!(parse_mem("4096"), Ok(4096));
        assert_eq!(parse_mem("1.5GiB"), Ok(3 << 29));
        for bad in ["80Gb", "80 parsecs", "-1GiB", "0GiB", "GiB", "eighty"] {
            assert!(parse_mem(bad).is_err(), "'{bad}' refused");
        }
    }

    #[test]
    fn bandwidth_bits_and_bytes() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
        assert!(close(parse_bandwidth("100").unwrap(), 12.5e9));
        assert!(close(parse_bandwidth("100Gbps").unwrap(), 12.5e9));
        assert!(close(parse_bandwidth("100Gb/s").unwrap(), 12.5e9));
        assert!(close(parse_bandwidth("400 Gbps").unwrap(), 50e9));
        assert!(close(parse_bandwidth("25GB/s").unwrap(), 25e9));
        assert!(close(parse_bandwidth("900GBps").unwrap(), 900e9));
        assert!(close(parse_bandwidth("1.6Tbps").unwrap(), 200e9));
        for bad in ["0", "-5", "100 furlongs", "fast"] {
            assert!(parse_bandwidth(bad).is_err(), "'{bad}' refused");
        }
    }

    #[test]
    fn latencies_and_fractions() {
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12;
        assert!(close(parse_latency("5").unwrap(), 5e-6));
        assert!(close(parse_latency("2us").unwrap(), 2e-6));
        assert!(close(parse_latency("500ns").unwrap(), 5e-7));
        assert!(close(parse_latency("0.1ms").unwrap(), 1e-4));
        assert!(parse_latency("-1").is_err());
        assert!(parse_latency("5 parsecs").is_err());
        assert!(close(parse_fraction("10%").unwrap(), 0.1));
        assert!(close(parse_fraction("0.05").unwrap(), 0.05));
        assert!(parse_fraction("100%").is_err());
        assert!(parse_fraction("-0.1").is_err());
    }
}
