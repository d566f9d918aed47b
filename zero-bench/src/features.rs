//! What a command says when this binary was built without a feature it needs (the carried
//! GPU build is `--no-default-features --features nccl`, CUDA and NCCL: no MPI, no HDF5,
//! so it runs on a machine that has neither). Only compiled into such a build.

/// `what` needs feature `feature` ("mpi" or "hdf5"), which this build left out: the error
/// names the feature and how to get it.
pub fn missing(feature: &str, what: &str) -> anyhow::Error {
    let library = match feature {
        "mpi" => "MPI",
        "hdf5" => "HDF5",
        other => other,
    };
    anyhow::anyhow!(
        "{what} needs {library}, and this zero-bench was built without it (feature `{feature}` \
         off, as in the carried GPU build); build it with default features (`cargo build -p \
         zero-bench --release`) or add `--features {feature}`"
    )
}
