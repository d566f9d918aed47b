//! Outputs written whole: under a temporary name beside the target, then put in place.
//! [`replace_target`] says what that target is, so that a rename never replaces what the
//! user named with something else. An output that must not replace an existing file is
//! put in place with a hard link ([`place_new`]), which fails when the name exists, so
//! two writers racing for one name cannot both succeed. The temporary names are tracked
//! while written ([`track_temporary`]), for a signal handler to remove them
//! ([`take_tracked`]), and one left by a killed process is removed by the next writer of
//! the same output ([`remove_stale_temporaries`]).

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::Duration;

/// The names of what `dir` holds, sorted: what a caller checks for leftovers (no
/// temporary file after a whole write, no partial step after a failed save).
pub fn entry_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut names = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<Vec<String>>>()?;
    names.sort();
    Ok(names)
}

/// Why an output cannot be written whole at a path.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The path is a directory.
    #[error("'{0}' is a directory; give a file path")]
    Directory(PathBuf),
    /// The path is a device, a FIFO or a socket.
    #[error("'{0}' is not a regular file (a device, a FIFO or a socket), and this output is written to a temporary file renamed over it, which would replace it; give a regular file path")]
    Special(PathBuf),
    /// A chain of symbolic links too long (or a loop).
    #[error("'{0}': too many levels of symbolic links")]
    TooManyLinks(PathBuf),
    /// The path, or a link on the way, cannot be examined.
    #[error("'{path}': {source}")]
    Io {
        /// The path examined.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The directory the output would be created in does not exist.
    #[error("directory '{0}' does not exist; create it first")]
    NoDirectory(PathBuf),
    /// What the output's path puts it in is not a directory.
    #[error(
        "'{0}' is not a directory, so nothing can be created in it; give a path in a directory"
    )]
    NotADirectory(PathBuf),
    /// The output exists, and this one does not replace an existing file.
    #[error("'{0}' exists; not overwriting it")]
    Exists(PathBuf),
    /// The output appeared while it was being written (another process).
    #[error("'{0}' exists; not overwriting it (it appeared while this output was being written: another process wrote it)")]
    Appeared(PathBuf),
    /// Making the written output durable and putting it in place failed.
    #[error("{what} '{path}': {source}")]
    Place {
        /// What was being done ("fsync", "rename into place", "link into place").
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The temporary name an output is written under before it is renamed to `out`: in
/// the same directory (so the rename is atomic), hidden, with the process id.
pub fn partial_path(out: &Path) -> PathBuf {
    let name = out
        .file_name()
        .map_or("output".into(), |n| n.to_string_lossy().into_owned());
    out.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// The directory an output at `out` is created in ("." for a bare file name).
fn directory_of(out: &Path) -> &Path {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Check, before any work, that an output can be created at `path`: what it names (a
/// symbolic link followed: [`replace_target`]) is no directory or special file, the
/// directory it goes in exists, and, unless `overwrite`, nothing is there yet. Returns
/// the file that will be written.
pub fn check_output(path: &Path, overwrite: bool) -> Result<PathBuf, OutputError> {
    let target = replace_target(path)?;
    let dir = directory_of(&target);
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(OutputError::NotADirectory(dir.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(OutputError::NoDirectory(dir.to_path_buf()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            return Err(OutputError::NoDirectory(dir.to_path_buf()))
        }
        Err(source) => {
            return Err(OutputError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    }
    if !overwrite && std::fs::symlink_metadata(&target).is_ok() {
        return Err(OutputError::Exists(target));
    }
    Ok(target)
}

/// Whether a failed link(2) says that this file system makes no hard links (EPERM on
/// vfat and some network file systems, EOPNOTSUPP or ENOSYS from FUSE, EXDEV or EMLINK
/// from some others), so that a checked rename is the way left to place a file.
fn no_hard_links(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    // EPERM is 1 on every Unix; EACCES (also PermissionDenied) is a real refusal. std
    // files Linux's EOPNOTSUPP (= ENOTSUP, 95) under no kind of its own: by number.
    matches!(e.raw_os_error(), Some(1) | Some(95))
        || matches!(
            e.kind(),
            K::Unsupported | K::CrossesDevices | K::TooManyLinks
        )
}

/// Whether `a` and `b` name one file (device and inode; neither followed if a link).
fn same_inode(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(a), std::fs::symlink_metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => false,
    }
}

/// Put the complete file `tmp` in place at `out` without replacing anything: a hard link
/// (which fails when `out` exists, atomically, so of two writers racing for `out` one
/// gets [`OutputError::Appeared`]), then `tmp` removed. Where the file system makes no
/// hard links, a rename after checking that `out` does not exist (a race with another
/// writer there can still replace). On an error `tmp` is left for the caller to remove.
pub fn place_new(tmp: &Path, out: &Path) -> Result<(), OutputError> {
    match std::fs::hard_link(tmp, out) {
        Ok(()) => {}
        // NFS may answer a retransmitted link that succeeded with EEXIST: `out` is then
        // our own file (the same inode as `tmp`), in place.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && same_inode(tmp, out) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(OutputError::Appeared(out.to_path_buf()))
        }
        Err(e) if no_hard_links(&e) => {
            log::debug!(
                "no hard link for '{}' ({e}): a checked rename instead",
                out.display()
            );
            return match std::fs::symlink_metadata(out) {
                Ok(_) => Err(OutputError::Appeared(out.to_path_buf())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::rename(tmp, out)
                    .map_err(|source| OutputError::Place {
                        what: "rename into place",
                        path: out.to_path_buf(),
                        source,
                    }),
                Err(source) => Err(OutputError::Io {
                    path: out.to_path_buf(),
                    source,
                }),
            };
        }
        Err(source) => {
            return Err(OutputError::Place {
                what: "link into place",
                path: out.to_path_buf(),
                source,
            })
        }
    }
    // `out` is whole under its name: a `tmp` left is a warning, not lost work.
    if let Err(e) = std::fs::remove_file(tmp) {
        log::warn!(
            "wrote '{}', but could not remove its temporary '{}' ({e}); remove it",
            out.display(),
            tmp.display()
        );
    }
    Ok(())
}

/// Write `out` through [`partial_path`]: `write` fills the temporary file; it is fsynced
/// and put in place only when complete (then the directory fsynced), and removed on
/// failure, so `out` is either as before or whole, a crash included. An existing `out` is
/// an error unless `overwrite` (then it is replaced whole, by a rename); without
/// `overwrite` the file is put in place by [`place_new`], so an `out` that another
/// process creates meanwhile is not replaced either. A symbolic link is written through
/// (its target replaced; [`replace_target`]), and a device, FIFO or socket is refused, as
/// is a directory that does not exist. The temporary name is tracked while it exists
/// ([`track_temporary`]), and one of `out` left by a killed process is removed first
/// ([`remove_stale_temporaries`]). Any error type that an [`OutputError`] converts into.
pub fn write_whole<T, E: From<OutputError>>(
    out: &Path,
    overwrite: bool,
    write: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, E> {
    let out = &check_output(out, overwrite)?;
    remove_stale_temporaries(out);
    let tmp = partial_path(out);
    let tracked = track_temporary(&tmp);
    let place = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| OutputError::Place { what, path, source }
    };
    let result = write(&tmp).and_then(|v| {
        // The bytes reach the disk before the name does: else a crash soon after the
        // rename can leave `out` empty or partial (and, with `overwrite`, the old file gone).
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(place("fsync", &tmp))?;
        if overwrite {
            std::fs::rename(&tmp, out).map_err(place("rename into place", out))?;
        } else {
            place_new(&tmp, out)?;
        }
        Ok(v)
    });
    if result.is_err() && std::fs::symlink_metadata(&tmp).is_ok() {
        if let Err(e) = std::fs::remove_file(&tmp) {
            log::warn!("could not remove the partial '{}': {e}", tmp.display());
        }
    }
    drop(tracked);
    let v = result?;
    // The new name recorded in the directory. The output is whole under its name already,
    // so a failure here is a warning (the file may not survive a crash), not lost work.
    sync_directory_of(out);
    Ok(v)
}

/// fsync the directory of `out` after a file was put in place there; a failure is a
/// warning (the file is whole under its name, but may not survive a crash).
pub fn sync_directory_of(out: &Path) {
    if let Err(e) = std::fs::File::open(directory_of(out)).and_then(|d| d.sync_all()) {
        log::warn!(
            "wrote '{}', but could not fsync its directory ({e}): a crash soon may lose it",
            out.display()
        );
    }
}

/// The file a written-whole output at `path` replaces: `path` itself, or, when `path` is
/// a symbolic link, the file it points to (existing or not; the link stays a link). An
/// error when that is something a rename must not replace: a directory, or a device, a
/// FIFO or a socket (`/dev/null` would become a plain file; an HDF5 or token file needs a
/// regular one), or when it cannot be examined (no permission).
pub fn replace_target(path: &Path) -> Result<PathBuf, OutputError> {
    let mut target = path.to_path_buf();
    // A chain of links, followed as the kernel would (bounded like its 40).
    for _ in 0..40 {
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&target).map_err(|source| OutputError::Io {
                    path: target.clone(),
                    source,
                })?;
                target = match target.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(m) if m.is_dir() => return Err(OutputError::Directory(path.to_path_buf())),
            Ok(m) if !m.is_file() => return Err(OutputError::Special(path.to_path_buf())),
            Ok(_) => return Ok(target),
            // Not there yet (or its directory is not): it is created.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                return Ok(target)
            }
            Err(source) => {
                return Err(OutputError::Io {
                    path: target,
                    source,
                })
            }
        }
    }
    Err(OutputError::TooManyLinks(path.to_path_buf()))
}

/// How many temporary files can be tracked at once (one per output being written).
const TRACKED: usize = 16;

/// The temporary files being written, as NUL-terminated absolute paths (null: a free
/// slot). Whoever swaps a pointer out owns it: [`TrackedTemporary`]'s drop frees it, and
/// [`take_tracked`] (in a signal handler) keeps it, the process being about to end.
static TRACKED_PATHS: [AtomicPtr<c_char>; TRACKED] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; TRACKED];

/// A temporary file tracked for [`take_tracked`] until this is dropped.
#[must_use = "the file is tracked until this is dropped"]
pub struct TrackedTemporary {
    slot: Option<(usize, *mut c_char)>,
}

/// Track the temporary file `tmp` (not created yet, or being written) until the returned
/// value is dropped, for a signal handler to remove with [`take_tracked`]. When all slots
/// are taken (many outputs at once) it is not tracked, and a file a signal leaves is
/// removed by a later writer ([`remove_stale_temporaries`]).
pub fn track_temporary(tmp: &Path) -> TrackedTemporary {
    use std::os::unix::ffi::OsStrExt;
    // Absolute: the handler must not depend on the current directory.
    let path = std::path::absolute(tmp).unwrap_or_else(|_| tmp.to_path_buf());
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return TrackedTemporary { slot: None };
    };
    let ptr = c.into_raw();
    for (i, slot) in TRACKED_PATHS.iter().enumerate() {
        if slot
            .compare_exchange(
                std::ptr::null_mut(),
                ptr,
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            return TrackedTemporary {
                slot: Some((i, ptr)),
            };
        }
    }
    // SAFETY: `ptr` came from `into_raw` just above and was stored nowhere.
    drop(unsafe { CString::from_raw(ptr) });
    log::debug!("{} not tracked: all slots taken", tmp.display());
    TrackedTemporary { slot: None }
}

impl Drop for TrackedTemporary {
    fn drop(&mut self) {
        let Some((i, ptr)) = self.slot else { return };
        // Ours again unless a signal handler took it (it keeps it: the process ends).
        if TRACKED_PATHS[i]
            .compare_exchange(
                ptr,
                std::ptr::null_mut(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            )
            .is_ok()
        {
            // SAFETY: `ptr` came from `CString::into_raw` in `track_temporary`, and the
            // exchange just made this the only owner of it.
            drop(unsafe { CString::from_raw(ptr) });
        }
    }
}

/// Hand each tracked temporary path (NUL-terminated, absolute) to `remove`, once, taking
/// it out of the tracking: what a handler of a signal that ends the process calls, with
/// `remove` calling unlink(2). Async-signal-safe as long as `remove` is: atomic swaps of
/// a static array only, nothing allocated or freed (the paths taken are never freed).
pub fn take_tracked(mut remove: impl FnMut(*const c_char)) {
    for slot in &TRACKED_PATHS {
        let ptr = slot.swap(std::ptr::null_mut(), Ordering::SeqCst);
        if !ptr.is_null() {
            remove(ptr);
        }
    }
}

/// How long a temporary file of a process that is gone stays untouched before
/// [`remove_stale_temporaries`] removes it: a writer on another machine sharing the
/// directory (whose process id means nothing here) writes more often than that.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// The process id of a temporary file of the output named `name`: `.NAME.partial-PID`
/// ([`partial_path`]) or `.NAME.tmp-PID` (token files).
fn temporary_pid(file: &str, name: &str) -> Option<u32> {
    let rest = file.strip_prefix('.')?.strip_prefix(name)?;
    let pid = rest
        .strip_prefix(".partial-")
        .or_else(|| rest.strip_prefix(".tmp-"))?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Remove the temporary files of the output `out` that a killed process left (SIGKILL,
/// a crash, a power loss: nothing ran to remove them): `.NAME.partial-PID` and
/// `.NAME.tmp-PID` beside it whose process is not running on this machine and which
/// nobody has written for [`STALE_AFTER`]. Younger ones are left, with a warning, and so
/// is everything where /proc cannot tell which processes run. Best effort: what cannot
/// be read or removed is logged, never an error.
pub fn remove_stale_temporaries(out: &Path) {
    let Some(name) = out.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    if !Path::new("/proc/self").exists() {
        return;
    }
    let dir = directory_of(out);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file.to_str().and_then(|f| temporary_pid(f, name)) else {
            continue;
        };
        if pid == me || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let path = entry.path();
        let age = std::fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        match age {
            Some(age) if age >= STALE_AFTER => match std::fs::remove_file(&path) {
                Ok(()) => log::info!(
                    "removed '{}', left unfinished by process {pid} (no longer running)",
                    path.display()
                ),
                Err(e) => log::warn!(
                    "'{}' was left unfinished by process {pid}, and removing it failed ({e}); remove it",
                    path.display()
                ),
            },
            _ => log::warn!(
                "'{}' is an unfinished output of process {pid}, not running here: if no other \
                 machine is writing '{}', remove it (a later run does, once it is {} s old)",
                path.display(),
                out.display(),
                STALE_AFTER.as_secs()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_followed_and_special_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert_eq!(replace_target(&d.join("new.h5")).unwrap(), d.join("new.h5"));
        std::fs::write(d.join("real.bin"), b"x").unwrap();
        std::os::unix::fs::symlink("real.bin", d.join("link.bin")).unwrap();
        std::os::unix::fs::symlink("link.bin", d.join("link2.bin")).unwrap();
        assert_eq!(
            replace_target(&d.join("link2.bin")).unwrap(),
            d.join("real.bin")
        );
        // A dangling link: its target is created.
        std::os::unix::fs::symlink("later.bin", d.join("dangling")).unwrap();
        assert_eq!(
            replace_target(&d.join("dangling")).unwrap(),
            d.join("later.bin")
        );
        assert!(matches!(replace_target(d), Err(OutputError::Directory(_))));
        let e = replace_target(Path::new("/dev/null"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        std::os::unix::fs::symlink("/dev/null", d.join("null")).unwrap();
        assert!(replace_target(&d.join("null")).is_err());
        std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
        assert!(matches!(
            replace_target(&d.join("loop")),
            Err(OutputError::TooManyLinks(_))
        ));
    }

    #[test]
    fn outputs_are_checked_before_any_work() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let e = check_output(&d.join("nodir/x.st"), false).unwrap_err();
        assert!(matches!(e, OutputError::NoDirectory(_)), "{e}");
        assert!(
            e.to_string()
                .ends_with("nodir' does not exist; create it first"),
            "{e}"
        );
        std::fs::write(d.join("file"), b"x").unwrap();
        let e = check_output(&d.join("file/x.st"), true).unwrap_err();
        assert!(matches!(e, OutputError::NotADirectory(_)), "{e}");
        let e = check_output(&d.join("file"), false).unwrap_err();
        assert!(matches!(e, OutputError::Exists(_)), "{e}");
        assert_eq!(check_output(&d.join("file"), true).unwrap(), d.join("file"));
        assert_eq!(
            check_output(Path::new("bare-name-here"), false).unwrap(),
            Path::new("bare-name-here")
        );
    }

    /// The no-replace placement refuses a file that appeared, keeps it, and leaves the
    /// temporary for the caller; write_whole then removes it.
    #[test]
    fn a_new_output_never_replaces_one_that_appeared() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let out = d.join("out.bin");
        let e = write_whole(&out, false, |tmp| {
            std::fs::write(tmp, b"mine").unwrap();
            // Another process wins the race.
            std::fs::write(&out, b"theirs").unwrap();
            Ok::<_, OutputError>(())
        })
        .unwrap_err();
        assert!(matches!(e, OutputError::Appeared(_)), "{e}");
        assert!(e.to_string().contains("exists; not overwriting it"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"theirs");
        assert_eq!(entry_names(d).unwrap(), ["out.bin"]);
        // A fresh name: placed, nothing else left.
        let out2 = d.join("new.bin");
        write_whole(&out2, false, |tmp| {
            std::fs::write(tmp, b"new").map_err(|source| OutputError::Io {
                path: tmp.to_path_buf(),
                source,
            })
        })
        .unwrap();
        assert_eq!(std::fs::read(&out2).unwrap(), b"new");
        assert_eq!(entry_names(d).unwrap(), ["new.bin", "out.bin"]);
    }

    #[test]
    fn tracked_temporaries_are_taken_once_and_untracked_on_drop() {
        let mut seen = Vec::new();
        let collect = |seen: &mut Vec<String>| {
            take_tracked(|p| {
                // SAFETY: take_tracked hands NUL-terminated paths it no longer tracks.
                let s = unsafe { std::ffi::CStr::from_ptr(p) };
                seen.push(s.to_string_lossy().into_owned());
            })
        };
        let t = track_temporary(Path::new("/tmp/.x.partial-1"));
        drop(t);
        collect(&mut seen);
        assert!(!seen.iter().any(|s| s == "/tmp/.x.partial-1"), "{seen:?}");
        let t = track_temporary(Path::new("/tmp/.y.partial-1"));
        collect(&mut seen);
        assert!(seen.iter().any(|s| s == "/tmp/.y.partial-1"), "{seen:?}");
        // Taken: the drop leaves it alone, and it is not handed out again.
        drop(t);
        seen.clear();
        collect(&mut seen);
        assert!(!seen.iter().any(|s| s == "/tmp/.y.partial-1"), "{seen:?}");
    }

    #[test]
    fn stale_temporaries_of_gone_processes_are_removed() {
        assert_eq!(temporary_pid(".a.bin.tmp-12", "a.bin"), Some(12));
        assert_eq!(temporary_pid(".a.bin.partial-7", "a.bin"), Some(7));
        assert_eq!(temporary_pid(".a.bin.tmp-", "a.bin"), None);
        assert_eq!(temporary_pid(".a.bin.tmp-1x", "a.bin"), None);
        assert_eq!(temporary_pid(".b.bin.tmp-12", "a.bin"), None);
        assert_eq!(temporary_pid("a.bin", "a.bin"), None);
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let out = d.join("a.bin");
        // A process id that no process has (above Linux's pid_max bound of 2^22).
        let gone = (1u32 << 22) + 5;
        let old = d.join(format!(".a.bin.tmp-{gone}"));
        let young = d.join(format!(".a.bin.partial-{gone}"));
        let alive = d.join(format!(".a.bin.partial-{}", std::process::id()));
        let other = d.join(format!(".b.bin.tmp-{gone}"));
        for p in [&old, &young, &alive, &other] {
            std::fs::write(p, b"x").unwrap();
        }
        let past = std::time::SystemTime::now() - STALE_AFTER - Duration::from_secs(5);
        for p in [&old, &alive, &other] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(past)
                .unwrap();
        }
        remove_stale_temporaries(&out);
        let mut want: Vec<String> = [&young, &alive, &other]
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        want.sort();
        assert_eq!(entry_names(d).unwrap(), want);
    }
}
