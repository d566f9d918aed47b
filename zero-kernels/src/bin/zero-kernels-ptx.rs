//! Regenerate (default) or check (`--check`) the checked-in PTX of zero-kernels from its
//! CUDA C sources with NVRTC (see `src/ptx.rs`). Needs libnvrtc on LD_LIBRARY_PATH (PyPI
//! nvidia-cuda-nvrtc-cu12, installed by `scripts/setup.sh --cuda`); no GPU needed. The
//! `.version` line NVRTC writes is lowered to `zero_kernels::ptx::PTX_ISA_VERSION`.

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::path::Path;
use std::process::ExitCode;
use zero_kernels::ptx::{with_isa_version, PtxSource, NVRTC_OPTIONS, SOURCES};

fn generate(s: &PtxSource) -> Result<String, String> {
    let opts = CompileOptions {
        options: NVRTC_OPTIONS.iter().map(|o| o.to_string()).collect(),
        name: Some(format!("{}.cu", s.name)),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(s.full_source(), opts)
        .map_err(|e| format!("NVRTC failed on {}: {e:?}", s.cu_path))?;
    // NVRTC declares its own newest PTX ISA (8.8 for CUDA 12.9), which drivers older than
    // that CUDA refuse although our kernels need only 7.0: declare the lowest instead
    // (PTX_ISA_VERSION in src/ptx.rs; ptxas checks the instructions against it).
    let ptx = with_isa_version(&ptx.to_src()).map_err(|e| format!("{}: {e}", s.cu_path))?;
    Ok(format!("{}{}", s.stamp(), ptx))
}

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some("-h" | "--help") => {
            println!(
                "usage: zero-kernels-ptx [--check]\n\nRegenerates the checked-in PTX of zero-kernels from its .cu files with NVRTC\n(declaring PTX ISA {}), or with --check compares it byte for byte. Needs\nlibnvrtc on LD_LIBRARY_PATH (scripts/setup.sh --cuda); no GPU.",
                zero_kernels::ptx::PTX_ISA_VERSION
            );
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("error: unknown argument '{other}' (usage: zero-kernels-ptx [--check])");
            return ExitCode::from(2);
        }
    };
    // cudarc panics when it cannot load libnvrtc: look first.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!(
            "error: libnvrtc not found. Run `scripts/setup.sh --cuda` and put the wheel's lib \
             directory on LD_LIBRARY_PATH, as it prints: with its virtual environment \
             (ZERO_VENV, default ~/.cache/zero-rs/venv), \
             export LD_LIBRARY_PATH=$(~/.cache/zero-rs/venv/bin/python3 -c 'import nvidia.cuda_nvrtc; print(list(nvidia.cuda_nvrtc.__path__)[0] + \"/lib\")')"
        );
        return ExitCode::from(1);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = 0;
    for s in SOURCES {
        let text = match generate(s) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        };
        let path = root.join(s.ptx_path);
        if check {
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            if on_disk == text {
                println!("ok      {}", s.ptx_path);
            } else {
                println!(
                    "STALE   {} (differs from what NVRTC generates now)",
                    s.ptx_path
                );
                stale += 1;
            }
        } else if let Err(e) = std::fs::write(&path, &text) {
            eprintln!("error: writing {}: {e}", path.display());
            return ExitCode::from(1);
        } else {
            println!("wrote   {} ({} bytes)", s.ptx_path, text.len());
        }
    }
    if stale > 0 {
        eprintln!("error: {stale} PTX file(s) stale; run without --check to regenerate");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
