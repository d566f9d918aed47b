//! `train` in a build without HDF5 (the carried GPU build): stand-ins for `checkpoints`
//! and the HDF5 part of `init_from` with their interface. Training runs, `--init-from`
//! of safetensors too; `--ckpt-dir`, `--resume`, `--save-model` and `--init-from` of an
//! HDF5 file stop before the first step and say what to build. [`checkpoints::Resume`]
//! and [`init_from_h5::H5File`] have no values, so the code that would use one cannot
//! run.

use crate::features::missing;

/// Stand-in for `train/checkpoints.rs`.
pub mod checkpoints {
    use std::path::{Path, PathBuf};

    use zero_comm::Communicator;
    use zero_core::Engine;
    use zero_kernels::device::Device;

    use super::super::launch::Failure;
    use super::super::TrainArgs;
    use crate::config::LoadedConfig;

    /// A checkpoint to resume: there is none without HDF5.
    pub enum Resume {}

    impl Resume {
        /// Unreachable: there is no [`Resume`].
        pub fn step(&self) -> u64 {
            match *self {}
        }

        /// Unreachable: there is no [`Resume`].
        pub fn dir(&self) -> &Path {
            match *self {}
        }

        /// Unreachable: there is no [`Resume`].
        pub fn origin(&self) -> zero_models::data::Origin {
            match *self {}
        }
    }

    impl std::fmt::Display for Resume {
        fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match *self {}
        }
    }

    /// No default: `--resume` is refused ([`prepare`]).
    pub fn default_ckpt_dir(_resume: &Path) -> Option<std::path::PathBuf> {
        None
    }

    /// Refuse the options that read or write HDF5 files, before step 1.
    pub fn prepare<C: Communicator>(
        comm: &C,
        args: &TrainArgs,
        _loaded: &[LoadedConfig],
    ) -> Result<Option<Resume>, Failure> {
        let given: Vec<&str> = [
            ("--ckpt-dir", args.ckpt_dir.is_some()),
            ("--resume", args.resume.is_some()),
            ("--save-model", args.save_model.is_some()),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(flag, _)| *flag)
        .collect();
        if given.is_empty() {
            return Ok(None);
        }
        let what = format!(
            "`train {}` (checkpoints and model files are HDF5)",
            given.join(" ")
        );
        Err(Failure::same_everywhere(
            super::missing("hdf5", &what),
            comm.rank(),
        ))
    }

    /// Unreachable: there is no [`Resume`].
    pub fn load<C: Communicator, E: Communicator, D: Device>(
        _comm: &C,
        _engine: &mut Engine<'_, D, E>,
        resume: &Resume,
        _quiet: bool,
    ) -> Result<(), Failure> {
        match *resume {}
    }

    /// Unreachable in practice (`prepare` refuses `--ckpt-dir`); an error all the same.
    pub fn save<D: Device, E: Communicator>(
        _engine: &Engine<'_, D, E>,
        _dir: &Path,
        _keep_last: usize,
        _app_config: Option<&str>,
        _data: zero_models::data::Origin,
    ) -> anyhow::Result<PathBuf> {
        Err(super::missing("hdf5", "saving a checkpoint"))
    }
}

/// Stand-in for `train/init_from/h5.rs`: HDF5 model files. (`--init-from` of
/// safetensors needs no HDF5 and works in this build.)
pub mod init_from_h5 {
    use std::ops::Range;
    use std::path::Path;

    use zero_core::PartitionLayout;

    use super::super::init_from::Entry;

    /// An opened HDF5 model file: there is none without HDF5.
    pub enum H5File {}

    impl H5File {
        /// An HDF5 model file needs HDF5: always an error here.
        pub fn open(path: &Path) -> anyhow::Result<H5File> {
            Err(super::missing(
                "hdf5",
                &format!(
                    "--init-from {} (not safetensors, so read as an HDF5 model file)",
                    path.display()
                ),
            ))
        }

        /// Unreachable: there is no [`H5File`].
        pub fn entries(&self) -> &[Entry] {
            match *self {}
        }

        /// Unreachable: there is no [`H5File`].
        pub fn read(
            &self,
            _entry: usize,
            _range: Range<usize>,
            _out: &mut [f32],
        ) -> anyhow::Result<()> {
            match *self {}
        }
    }

    /// `--save-model` needs HDF5 (refused before step 1; an error all the same).
    pub fn save(
        path: &Path,
        _layout: &PartitionLayout,
        _values: &[f32],
        _step: u64,
    ) -> anyhow::Result<()> {
        Err(super::missing(
            "hdf5",
            &format!("--save-model {} (an HDF5 model file)", path.display()),
        ))
    }
}
