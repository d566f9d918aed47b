//! Every checked-in PTX file must assemble with `ptxas` for sm_80 (A100) and sm_90 (H100),
//! so invalid PTX fails `cargo test` on any machine, GPU or not. `ptxas` comes from PATH or
//! from the PyPI wheel nvidia-cuda-nvcc-cu12 (`scripts/setup.sh --cuda` installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

fn find_ptxas() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("PTXAS") {
        return Some(PathBuf::from(p));
    }
    if let Ok(out) = Command::new("ptxas").arg("--version").output() {
        if out.status.success() {
            return Some(PathBuf::from("ptxas"));
        }
    }
    for py in ["python3", "python"] {
        let out = Command::new(py)
            .args([
                "-c",
                "import nvidia.cuda_nvcc as m; print(list(m.__path__)[0])",
            ])
            .output();
        if let Ok(out) = out {
            if out.status.success() {
                let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
                let p = Path::new(&dir).join("bin").join("ptxas");
                if p.is_file() {
                    return Some(p);
                }
            }
        }
    }
    None
}

#[test]
fn every_ptx_file_assembles_for_sm80_and_sm90() {
    let Some(ptxas) = find_ptxas() else {
        panic!(
            "ptxas not found (not on PATH, $PTXAS unset, no python package nvidia.cuda_nvcc): \
             run `scripts/setup.sh --cuda` to install it from PyPI (nvidia-cuda-nvcc-cu12)"
        );
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = std::env::temp_dir().join(format!("zero-kernels-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).expect("create a temporary directory");
    // An empty list would make the count below hold with nothing checked.
    assert!(
        !zero_kernels::ptx::SOURCES.is_empty(),
        "zero_kernels::ptx::SOURCES lists no PTX file"
    );
    let mut checked = 0;
    for s in zero_kernels::ptx::SOURCES {
        let ptx = root.join(s.ptx_path);
        assert!(ptx.is_file(), "{} missing", ptx.display());
        for arch in ARCHS {
            let cubin = out_dir.join(format!("{}.{arch}.cubin", s.name));
            let out = Command::new(&ptxas)
                .arg(format!("-arch={arch}"))
                .arg(&ptx)
                .arg("-o")
                .arg(&cubin)
                .output()
                .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
            assert!(
                out.status.success(),
                "ptxas -arch={arch} rejected {}:\n{}",
                s.ptx_path,
                String::from_utf8_lossy(&out.stderr)
            );
            let size = std::fs::metadata(&cubin).map(|m| m.len()).unwrap_or(0);
            assert!(size > 0, "ptxas wrote no code for {} ({arch})", s.ptx_path);
            checked += 1;
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    assert_eq!(checked, zero_kernels::ptx::SOURCES.len() * ARCHS.len());
}
