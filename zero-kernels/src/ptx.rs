//! The checked-in PTX of the CUDA kernels and what keeps it honest, without needing CUDA:
//! each `.ptx` file records, in its second line, a hash of the CUDA C it was generated
//! from (the `.cu` file with `cuda/bits.cuh` pasted in), so a plain `cargo test` notices a
//! `.cu` edited without regenerating; `ptxas` (tests/ptxas.rs) checks the PTX assembles
//! for sm_80 and sm_90; `zero-kernels-ptx --check` recompiles with NVRTC and compares
//! byte for byte where NVRTC is installed. The generator lowers NVRTC's `.version` line to
//! [`PTX_ISA_VERSION`], so that drivers older than the NVRTC load the PTX.
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

/// The PTX ISA version every checked-in module declares. NVRTC writes its own newest
/// (`.version 8.8` from CUDA 12.9), and a driver refuses a version newer than its CUDA
/// (CUDA_ERROR_UNSUPPORTED_PTX_VERSION: a 535 or 550 driver, CUDA 12.2 or 12.4, refuses
/// 8.8), while our kernels use nothing newer than ISA 7.0, the first that has `sm_80`.
/// So `zero-kernels-ptx` rewrites the line to this ([`with_isa_version`]); `ptxas`
/// (tests/ptxas.rs) rejects an instruction the declared version lacks, and it assembles
/// the same machine code from 7.0 as from 8.8 for sm_80 and sm_90.
pub const PTX_ISA_VERSION: &str = "7.0";

/// The oldest CUDA driver that loads [`PTX_ISA_VERSION`] (ISA 7.0 came with CUDA 11.0),
/// as `cuDriverGetVersion` reports it: 1000 * major + 10 * minor.
pub const PTX_ISA_MIN_DRIVER: i32 = 11000;

/// `ptx` (NVRTC's output) declaring [`PTX_ISA_VERSION`] instead of NVRTC's own version,
/// with a comment saying so; an error unless it has exactly one `.version` line.
pub fn with_isa_version(ptx: &str) -> Result<String, String> {
    let is_version = |l: &str| l.trim_start().starts_with(".version ");
    let found = ptx.lines().filter(|l| is_version(l)).count();
    if found != 1 {
        return Err(format!(
            "expected one `.version` line in NVRTC's PTX, found {found}"
        ));
    }
    let mut out = String::with_capacity(ptx.len() + 128);
    for line in ptx.split_inclusive('\n') {
        if is_version(line) {
            let nvrtc = line.trim().trim_start_matches(".version ").trim();
            out.push_str(&format!(
                "// .version lowered from NVRTC's {nvrtc} to {PTX_ISA_VERSION}, the lowest with sm_80, so that older drivers load it (PTX_ISA_VERSION in src/ptx.rs)\n.version {PTX_ISA_VERSION}\n"
            ));
        } else {
            out.push_str(line);
        }
    }
    Ok(out)
}

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

    /// The PTX ISA version the checked-in PTX declares (its `.version` line).
    pub fn isa_version(&self) -> Option<&'static str> {
        self.ptx
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(".version ").map(|v| v.trim()))
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

    /// Every module declares the lowered ISA version and targets sm_80: a file written by
    /// NVRTC without `zero-kernels-ptx`'s rewrite would need a newer driver than we claim.
    #[test]
    fn checked_in_ptx_declares_the_lowest_isa_version_for_sm80() {
        for s in SOURCES.iter() {
            assert_eq!(
                s.isa_version(),
                Some(PTX_ISA_VERSION),
                "{} declares another PTX ISA version; regenerate it with zero-kernels-ptx",
                s.ptx_path
            );
            assert_eq!(
                s.ptx.lines().filter(|l| l.starts_with(".version ")).count(),
                1,
                "{}",
                s.ptx_path
            );
            assert!(
                s.ptx.lines().any(|l| l.trim() == ".target sm_80"),
                "{} must target sm_80",
                s.ptx_path
            );
        }
    }

    #[test]
    fn the_isa_version_rewrite_changes_only_the_version_line() {
        let nvrtc =
            "//\n// Based on NVVM 7.0.1\n//\n\n.version 8.8\n.target sm_80\n.address_size 64\n";
        let lowered = with_isa_version(nvrtc).expect("one .version line");
        assert_eq!(
            lowered,
            format!(
                "//\n// Based on NVVM 7.0.1\n//\n\n// .version lowered from NVRTC's 8.8 to {PTX_ISA_VERSION}, the lowest with sm_80, so that older drivers load it (PTX_ISA_VERSION in src/ptx.rs)\n.version {PTX_ISA_VERSION}\n.target sm_80\n.address_size 64\n"
            )
        );
        assert!(with_isa_version(".target sm_80\n").is_err());
        assert!(with_isa_version(".version 8.8\n.version 8.8\n").is_err());
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
