//! The files a run writes at its end or as it goes (`--metrics`, `--json`,
//! `--save-model`), checked before step 1: a path that cannot be written would otherwise
//! fail only after the training, losing its result, and an output that is one of the
//! run's inputs (the token file, the config) would be overwritten by it.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::args::TrainArgs;
use crate::config::Config;
use crate::outfile::{parent, same_file, same_target};

/// Check the outputs rank 0 writes (call it on rank 0).
pub fn check(args: &TrainArgs, config: &Config) -> anyhow::Result<()> {
    let mut outputs: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(p) = &config.train.metrics_file {
        if p.trim().is_empty() {
            bail!("train.metrics_file is empty; give a file path (or leave it unset for no metrics file)");
        }
        outputs.push(("--metrics", PathBuf::from(p)));
    }
    if let Some(p) = &args.json {
        outputs.push(("--json", p.clone()));
    }
    if let Some(p) = &args.save_model {
        // Written whole and renamed into place: a regular file (through a link), checked
        // now rather than after the last step.
        zero_core::files::replace_target(p).map_err(|e| anyhow::anyhow!("--save-model {e}"))?;
        outputs.push(("--save-model", p.clone()));
    }
    let mut inputs: Vec<(&str, PathBuf)> = Vec::new();
    if config.data.path != "builtin" {
        inputs.push(("data.path", PathBuf::from(&config.data.path)));
    }
    if let Some(p) = &args.config {
        inputs.push(("--config", p.clone()));
    }
    if let Some(p) = &args.init_from {
        inputs.push(("--init-from", p.clone()));
    }
    for (i, (flag, path)) in outputs.iter().enumerate() {
        if let Some((input, _)) = inputs.iter().find(|(_, p)| same_file(path, p)) {
            bail!(
                "{flag} {} is the run's {input}: it would be overwritten; write the output elsewhere",
                path.display()
            );
        }
        if let Some((other, _)) = outputs[..i]
            .iter()
            .find(|(_, p)| !is_special(path) && same_target(path, p))
        {
            bail!(
                "{flag} and {other} are both {}: give each output its own file",
                path.display()
            );
        }
        writable(flag, path)?;
    }
    Ok(())
}

/// `path` is not a directory, and its directory takes a new file (made and removed).
fn writable(flag: &str, path: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => bail!(
            "{flag} {}: that is a directory; give a file path",
            path.display()
        ),
        // A pipe, a terminal, /dev/stdout: opened when written (opening a pipe here
        // would wait for its reader).
        Ok(m) if !m.is_file() => return Ok(()),
        // An existing file: may this process write it? (Opened without truncating.)
        Ok(_) => {
            return match std::fs::OpenOptions::new().write(true).open(path) {
                Ok(_) => Ok(()),
                Err(e) => bail!(
                    "{flag} {}: cannot write it ({e}); give a file you can write (checked before step 1, so that the run's output is not lost at its end)",
                    path.display()
                ),
            };
        }
        Err(_) => {}
    }
    let dir = parent(path);
    let name = path
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    if let Err(e) = try_file_in(dir, &format!(".{name}.probe")) {
        bail!(
            "{flag} {}: cannot write a file in {} ({e}); give a path in an existing directory you can write (checked before step 1, so that the run's output is not lost at its end)",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

/// Create, write, sync and remove the file `<stem>-<pid>` in `dir`: this process can
/// create files there (and the filesystem takes data; a read-only mount fails here).
pub(super) fn try_file_in(dir: &Path, stem: &str) -> std::io::Result<()> {
    let file = dir.join(format!("{stem}-{}", std::process::id()));
    let written = std::fs::File::create(&file).and_then(|mut f| {
        std::io::Write::write_all(&mut f, b"zero-rs write probe\n")?;
        f.sync_all()
    });
    let removed = std::fs::remove_file(&file);
    written.and(removed)
}

/// `path` exists and is not a plain file (a pipe, a terminal, a device): written
/// through, never replaced or read back.
pub(super) fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

#[cfg(test)]
mod tests {
    use super::super::args::TestCli;
    use super::*;
    use clap::Parser;

    #[test]
    fn outputs_are_checked_against_inputs_each_other_and_their_directory() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("tokens.bin");
        std::fs::write(&data, b"x").unwrap();
        let mut config = Config::default();
        config.data.path = data.display().to_string();
        let mut args = TestCli::parse_from(["x"]).t;

        // The token file as the metrics file, through another spelling of its path.
        config.train.metrics_file = Some(format!("{}/./tokens.bin", dir.path().display()));
        let err = check(&args, &config).unwrap_err().to_string();
        assert!(
            err.contains("--metrics") && err.contains("data.path"),
            "{err}"
        );

        // Two outputs on one new file.
        config.train.metrics_file = Some(dir.path().join("m.jsonl").display().to_string());
        args.json = Some(dir.path().join("m.jsonl"));
        let err = check(&args, &config).unwrap_err().to_string();
        assert!(err.contains("--json and --metrics"), "{err}");

        // A directory that does not exist, and a directory as the file.
        args.json = Some(dir.path().join("report.json"));
        args.save_model = Some(dir.path().join("absent").join("model.h5"));
        let err = check(&args, &config).unwrap_err().to_string();
        assert!(
            err.contains("--save-model") && err.contains("absent"),
            "{err}"
        );
        args.save_model = Some(dir.path().to_path_buf());
        let err = check(&args, &config).unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");

        args.save_model = Some(dir.path().join("model.h5"));
        check(&args, &config).unwrap();
        // Nothing was left behind by the probes.
        let names = zero_core::files::entry_names(dir.path()).unwrap();
        assert_eq!(names, ["tokens.bin"]);
    }
}
