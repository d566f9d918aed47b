//! Element types that model states and collectives are made of.
//!
//! One vocabulary for every layer above: `DType` names a type at run time (for logs,
//! ledgers, checkpoints and the communicator's consistency check); `Element` ties a Rust
//! type to its `DType` at compile time. Sizes are in bytes.

use half::{bf16, f16};

/// An element type, named at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary64.
    F64,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE 754 binary16.
    F16,
    /// Unsigned byte.
    U8,
    /// Unsigned 32-bit integer (token ids, class labels).
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
}

impl DType {
    /// Every dtype, in a fixed order (tests iterate over it).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::U8,
        DType::U32,
        DType::I32,
        DType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 => 1,
        }
    }

    /// Short lower-case name (`f32`, `bf16`, ...), as used in configs and logs.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::U8 => "u8",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// True for the 16-bit floating types, which MPI has no native type for.
    pub const fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// True for floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
                format!("unknown dtype '{s}'; expected one of {}", names.join(", "))
            })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that is one of the [`DType`]s. Sealed: the set is closed, so every layer
/// above can match on `DType` exhaustively.
pub trait Element:
    sealed::Sealed
    + bytemuck::Pod
    + Copy
    + Default
    + PartialEq
    + Send
    + Sync
    + std::fmt::Debug
    + 'static
{
    /// The run-time name of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(f32 => F32, f64 => F64, bf16 => BF16, f16 => F16, u8 => U8, u32 => U32, i32 => I32, i64 => I64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F32.size_bytes(), std::mem::size_of::<f32>());
        assert_eq!(DType::BF16.size_bytes(), std::mem::size_of::<bf16>());
        assert_eq!(DType::F16.size_bytes(), std::mem::size_of::<f16>());
        assert_eq!(DType::I64.size_bytes(), std::mem::size_of::<i64>());
        assert_eq!(<u8 as Element>::DTYPE.size_bytes(), 1);
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("float"
            .parse::<DType>()
            .unwrap_err()
            .contains("expected one of"));
    }
}
