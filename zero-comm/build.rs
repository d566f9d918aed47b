// Compiles src/shim.c, which exports MPI_IN_PLACE (a macro in mpi.h that mpi-sys does not
// bind), against the MPI library that mpi-sys links. Without feature `mpi` there is no
// MPI backend and nothing to compile: no probe, so a machine without MPI builds the crate.

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    if std::env::var_os("CARGO_FEATURE_MPI").is_none() {
        return;
    }
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            for (i, err) in errs.iter().enumerate() {
                println!("cargo:warning=MPI probe #{}: {err}", i + 1);
            }
            panic!("zero-comm: no MPI library found; install Open MPI (scripts/setup.sh)");
        }
    };
    let mut build = cc::Build::new();
    build.file("src/shim.c");
    if let Some(mpicc) = lib.mpicc {
        build.compiler(mpicc);
    } else {
        for inc in &lib.include_paths {
            build.include(inc);
        }
    }
    build.compile("zero_comm_shim");
}
