//! The checked-in PTX of the CUDA kernels and what keeps it honest, without needing CUDA:
//! each `.ptx` file records, in its second line, a hash of the CUDA C it was generated
//! from (the `.cu` file with `cuda/bits.cuh` pasted in), so a plain `cargo test` notices a
//! `.cu` edited without regenerating; `ptxas` (tests/ptxas.rs) checks the PTX assembles
//! for sm_80 and sm_90; `zero-kernels-ptx --check` recompiles with NVRTC and compares
//! byte for byte where NVRTC is installed.
//!
//! Regenerate after editing a `.cu` file (needs the PyPI NVRTC wheel, which
//! `scripts/setup.sh --cuda` installs into its virtual environment, `$ZERO_VENV`, default
//! `~/.cache/zero-rs/venv`, and prints the line to use):
//!
//! ```text
//! LD_LIBRARY_PATH=$(~/.cache/zero-rs/venv/bin/python3 -c 'import nvidia.cuda_nvrtc; print(list(nvidia.cuda_nvrtc.__path__)[0] + "/lib")') \
//!   cargo run -p zero-kernels --features cuda --bin zero-kernels-ptx
//! ```
//!
//! Kernel entry names are derived from dtypes (`adamw_{grad}_{param}`, ...) by the
//! functions below, never typed at call sites; a test checks each exists in the PTX.

use crate::dtype::DType;

/// The shared header every `.cu` file includes (pasted in before compiling).
pub const HEADER: &str = include_str!("cuda/bits.cuh");
/// The include line replaced by [`HEADER`].
pub const INCLUDE_LINE: &str = "#include \"bits.cuh\"";

/// One CUDA C file and the PTX generated from it.
#[derive(Clone, Copy, Debug)]
pub struct PtxSource {
    /// Module name (also the PTX file's stem).
    pub name: &'static str,
    /// Path of the `.cu` file relative to the crate root.
    pub cu_path: &'static str,
    /// Path of the `.ptx` file relative to the crate root.
    pub ptx_path: &'static str,
    /// The `.cu` text.
    pub cu: &'static str,
    /// The checked-in PTX text.
    pub ptx: &'static str,
}

/// Every kernel module.
pub const SOURCES: &[PtxSource] = &[
    PtxSource {
        name: "adamw",
        cu_path: "src/adamw/adamw.cu",
        ptx_path: "src/adamw/adamw.ptx",
        cu: include_str!("adamw/adamw.cu"),
        ptx: include_str!("adamw/adamw.ptx"),
    },
    PtxSource {
        name: "cast",
        cu_path: "src/cast/cast.cu",
        ptx_path: "src/cast/cast.ptx",
        cu: include_str!("cast/cast.cu"),
        ptx: include_str!("cast/cast.ptx"),
    },
    PtxSource {
        name: "gradstats",
        cu_path: "src/gradstats/gradstats.cu",
        ptx_path: "src/gradstats/gradstats.ptx",
        cu: include_str!("gradstats/gradstats.cu"),
        ptx: include_str!("gradstats/gradstats.ptx"),
    },
    PtxSource {
        name: "quant",
        cu_path: "src/quant/quant.cu",
        ptx_path: "src/quant/quant.ptx",
        cu: include_str!("quant/quant.cu"),
        ptx: include_str!("quant/quant.ptx"),
    },
    PtxSource {
        name: "peer",
        cu_path: "src/cuda/peer.cu",
        ptx_path: "src/cuda/peer.ptx",
        cu: include_str!("cuda/peer.cu"),
        ptx: include_str!("cuda/peer.ptx"),
    },
    PtxSource {
        name: "attention",
        cu_path: "src/nn/cuda/attention.cu",
        ptx_path: "src/nn/cuda/attention.ptx",
        cu: include_str!("nn/cuda/attention.cu"),
        ptx: include_str!("nn/cuda/attention.ptx"),
    },
    PtxSource {
        name: "xent",
        cu_path: "src/nn/cuda/xent.cu",
        ptx_path: "src/nn/cuda/xent.ptx",
        cu: include_str!("nn/cuda/xent.cu"),
        ptx: include_str!("nn/cuda/xent.ptx"),
    },
    PtxSource {
        name: "norm",
        cu_path: "src/nn/cuda/norm.cu",
        ptx_path: "src/nn/cuda/norm.ptx",
        cu: include_str!("nn/cuda/norm.cu"),
        ptx: include_str!("nn/cuda/norm.ptx"),
    },
    PtxSource {
        name: "elementwise",
        cu_path: "src/nn/cuda/elementwise.cu",
        ptx_path: "src/nn/cuda/elementwise.ptx",
        cu: include_str!("nn/cuda/elementwise.cu"),
        ptx: include_str!("nn/cuda/elementwise.ptx"),
    },
    PtxSource {
        name: "llama",
        cu_path: "src/nn/cuda/llama.cu",
        ptx_path: "src/nn/cuda/llama.ptx",
        cu: include_str!("nn/cuda/llama.cu"),
        ptx: include_str!("nn/cuda/llama.ptx"),
    },
    PtxSource {
        name: "rows",
        cu_path: "src/nn/cuda/rows.cu",
        ptx_path: "src/nn/cuda/rows.ptx",
        cu: include_str!("nn/cuda/rows.cu"),
        ptx: include_str!("nn/cuda/rows.ptx"),
    },
];

/// NVRTC options the PTX is generated with: PTX for compute capability 8.0 (the driver
/// JIT-compiles it for newer GPUs), and IEEE arithmetic exactly as the CPU does it.
pub const NVRTC_OPTIONS: [&str; 5] = [
    "--gpu-architecture=compute_80",
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
];

impl PtxSource {
    /// The complete CUDA C compiled for this module: the `.cu` with the header pasted in.
    pub fn full_source(&self) -> String {
        self.cu.replacen(INCLUDE_LINE, HEADER, 1)
    }

    /// The first two lines every generated PTX file starts with.
    pub fn stamp(&self) -> String {
        format!(
            "// Generated from {} + src/cuda/bits.cuh by `cargo run -p zero-kernels --features cuda --bin zero-kernels-ptx` (NVRTC {}). Do not edit.\n// source-fnv1a64: {:016x}\n",
            self.cu_path,
            NVRTC_OPTIONS.join(" "),
            fnv1a64(self.full_source().as_bytes())
        )
    }

    /// The hash recorded in the checked-in PTX, if it has a stamp.
    pub fn recorded_hash(&self) -> Option<u64> {
        let line = self.ptx.lines().nth(1)?;
        let hex = line.strip_prefix("// source-fnv1a64: ")?;
        u64::from_str_radix(hex.trim(), 16).ok()
    }

    /// True when the checked-in PTX was generated from the current sources.
    pub fn is_current(&self) -> bool {
        self.recorded_hash() == Some(fnv1a64(self.full_source().as_bytes()))
    }

    /// The kernel entry points the PTX defines.
    pub fn entries(&self) -> Vec<&'static str> {
        self.ptx
            .lines()
            .filter_map(|l| {
                let rest = l.trim_start().strip_prefix(".visible .entry ")?;
                rest.split('(').next().map(str::trim)
            })
            .collect()
    }
}

/// 64-bit FNV-1a (a stable content hash; not for security).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Entry name of the fused AdamW kernel for a gradient type and 16-bit copy type.
pub fn adamw_entry(grad: DType, param: Option<DType>) -> String {
    format!(
        "adamw_{}_{}",
        grad.name(),
        param.map_or("none", |p| p.name())
    )
}

/// Entry name of a cast: `narrow_{half}` (f32 -> half), `widen_{half}` (half -> f32).
pub fn cast_entry(narrow: bool, half: DType) -> String {
    format!(
        "{}_{}",
        if narrow { "narrow" } else { "widen" },
        half.name()
    )
}

/// Entry name of the accumulate kernel `dst += src` for a destination and a source type.
pub fn accumulate_entry(dst: DType, src: DType) -> String {
    format!("accumulate_{}_{}", dst.name(), src.name())
}

/// Entry name of the gradient statistics kernel (`unscale_f32` writes back).
pub fn gradstats_entry(grad: DType, in_place: bool) -> String {
    if in_place {
        "unscale_f32".to_string()
    } else {
        format!("sumsq_{}", grad.name())
    }
}

/// Entry name of block-wise int8 quantization (`quantize_{dtype}`) or of reading the
/// codes back (`dequantize_{dtype}`), for f32 and bf16 values.
pub fn quant_entry(quantize: bool, dtype: DType) -> String {
    format!(
        "{}_{}",
        if quantize { "quantize" } else { "dequantize" },
        dtype.name()
    )
}

/// Entry name of block-wise int4 quantization (`quantize_int4_{dtype}`) or of reading the
/// codes back (`dequantize_int4_{dtype}`), for f32 and bf16 values.
pub fn quant4_entry(quantize: bool, dtype: DType) -> String {
    format!(
        "{}_int4_{}",
        if quantize { "quantize" } else { "dequantize" },
        dtype.name()
    )
}

/// Entry name of a thread-rank fold over peers' device buffers: `fold_{reduce}_{dtype}`,
/// `reduce` one of `sum`, `max`, `sum_upcast` (halves only).
pub fn peer_fold_entry(dtype: DType, reduce: &str) -> String {
    format!("fold_{reduce}_{}", dtype.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

    #[test]
    fn checked_in_ptx_is_generated_from_the_current_cu_files() {
        for s in SOURCES.iter() {
            assert!(
                s.is_current(),
                "{} is stale: {} or src/cuda/bits.cuh changed since it was generated \
                 (recorded hash {:?}, sources hash {:016x}); regenerate it as the doc of \
                 zero-kernels/src/ptx.rs says",
                s.ptx_path,
                s.cu_path,
                s.recorded_hash().map(|h| format!("{h:016x}")),
                fnv1a64(s.full_source().as_bytes())
            );
            assert!(
                s.cu.contains(INCLUDE_LINE),
                "{} must include bits.cuh",
                s.cu_path
            );
        }
    }

    /// The model-op launchers (src/cuda/nn/*.rs, compiled only with the `cuda` feature)
    /// name their kernels as string literals, `dev.kernel("name")`: each must be an entry
    /// of the PTX, checked here from the launchers' source text without the feature.
    #[test]
    fn every_kernel_the_model_launchers_name_is_in_the_ptx() {
        let all: Vec<&str> = SOURCES.iter().flat_map(|s| s.entries()).collect();
        let launchers = [
            ("cuda/nn/norm.rs", include_str!("cuda/nn/norm.rs")),
            (
                "cuda/nn/elementwise.rs",
                include_str!("cuda/nn/elementwise.rs"),
            ),
            ("cuda/nn/rows.rs", include_str!("cuda/nn/rows.rs")),
            ("cuda/nn/llama.rs", include_str!("cuda/nn/llama.rs")),
        ];
        let mut named = std::collections::BTreeSet::new();
        for (file, text) in launchers {
            // Literals passed to dev.kernel(..) or through a `name` argument: every
            // "..._f32" string literal.
            for lit in text.split('"').skip(1).step_by(2) {
                if lit.ends_with("_f32") && !lit.contains(' ') {
                    named.insert(lit);
                    assert!(
                        all.contains(&lit),
                        "{file} names kernel {lit}, not in the PTX"
                    );
                }
            }
        }
        assert!(named.len() >= 22, "found only {named:?} in the launchers");
    }

    #[test]
    fn every_entry_the_rust_side_names_is_in_the_ptx() {
        let all: Vec<&str> = SOURCES.iter().flat_map(|s| s.entries()).collect();
        let mut wanted = Vec::new();
        for g in FLOATS {
            wanted.push(adamw_entry(g, None));
            wanted.push(adamw_entry(g, Some(DType::BF16)));
            wanted.push(adamw_entry(g, Some(DType::F16)));
            for d in FLOATS {
                wanted.push(accumulate_entry(d, g));
            }
            wanted.push(gradstats_entry(g, false));
        }
        for h in [DType::BF16, DType::F16] {
            wanted.push(cast_entry(true, h));
            wanted.push(cast_entry(false, h));
        }
        wanted.push(gradstats_entry(DType::F32, true));
        wanted.push("gradstats_finish".to_string());
        for d in DType::ALL {
            wanted.push(peer_fold_entry(d, "sum"));
            wanted.push(peer_fold_entry(d, "max"));
        }
        for d in [DType::F32, DType::BF16] {
            wanted.push(quant_entry(true, d));
            wanted.push(quant_entry(false, d));
            wanted.push(quant4_entry(true, d));
            wanted.push(quant4_entry(false, d));
        }
        wanted.push(peer_fold_entry(DType::BF16, "sum_upcast"));
        wanted.push(peer_fold_entry(DType::F16, "sum_upcast"));
        // The model kernels the launchers of src/cuda/nn/{attention,xent}.rs name.
        for name in [
            "attention_forward_f32",
            "attention_backward_dq_f32",
            "attention_backward_dkv_f32",
            "attention_softmax_rows_f32",
            "attention_softmax_backward_rows_f32",
            "softmax_xent_forward_f32",
            "softmax_xent_backward_f32",
            "mean_f32",
        ] {
            wanted.push(name.to_string());
        }
        for w in &wanted {
            assert!(
                all.contains(&w.as_str()),
                "kernel {w} missing from the PTX (entries: {all:?})"
            );
        }
    }
}
