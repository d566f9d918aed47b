//! `sweep run`'s jobs: one launcher command per point, each running every listed stage
//! through `zero-bench train --stages ... --json <dir>/<point file>`, one after another.
//!
//! The launcher is a template with `{n}` (or `{N}`) for the world size (`scripts/mpirun.sh {n}`,
//! `srun --mpi=pmix -n {n}`), split at whitespace; the program and its arguments follow
//! it. Each job's output goes to `<point file stem>.log` beside its result, and a job
//! that outlives `--timeout` is stopped with every rank it started ([`stop`]).

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use super::point::Point;

/// What every job of a sweep shares.
pub struct Job<'a> {
    /// The launcher template (`{n}` = world size).
    pub launcher: &'a str,
    /// The zero-bench binary the ranks run.
    pub program: &'a Path,
    /// `train` arguments common to every point (config, stages, steps, --set ...).
    pub train_args: &'a [String],
    /// Where results and logs go.
    pub dir: &'a Path,
    /// Kill a job that runs longer than this.
    pub timeout: Duration,
    /// Give each job a metrics file of its own beside its result ([`Job::metrics_path`]),
    /// over the configuration's `train.metrics_file` (which every job would otherwise
    /// overwrite in turn).
    pub own_metrics: bool,
}

/// The launcher's words for world size `n`.
pub fn launcher_words(template: &str, n: usize) -> anyhow::Result<Vec<String>> {
    if !template.contains("{n}") && !template.contains("{N}") {
        bail!(
            "--launcher '{template}' has no {{n}} for the world size (e.g. \
             \"scripts/mpirun.sh {{n}}\" or \"srun --mpi=pmix -n {{n}}\")"
        );
    }
    let words: Vec<String> = template
        .split_whitespace()
        .map(|w| {
            w.replace("{n}", &n.to_string())
                .replace("{N}", &n.to_string())
        })
        .collect();
    if words.is_empty() {
        bail!("--launcher is empty");
    }
    Ok(words)
}

/// This process received SIGINT, SIGTERM, SIGHUP or SIGQUIT while a job ran: the job
/// was stopped (or had just finished by itself), and the caller stops too (a sweep or
/// tune does not go on to its next job).
#[derive(Debug)]
pub struct Interrupted {
    /// The job (a sweep point, a tune candidate).
    pub what: String,
    /// "SIGINT", "SIGTERM", "SIGHUP" or "SIGQUIT".
    pub signal: &'static str,
    /// The signal's number (the command's exit status is 128 + it).
    pub signo: libc::c_int,
    /// The job had ended by itself, successfully, when the signal came.
    pub finished: bool,
    /// The job's log.
    pub log: PathBuf,
}

impl Interrupted {
    /// The exit status of a command a signal ended: 128 + its number (130 for SIGINT).
    pub fn exit_code(&self) -> i32 {
        128 + self.signo
    }
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, signal, log) = (&self.what, self.signal, self.log.display());
        if self.finished {
            write!(
                f,
                "{what}: finished, then interrupted by {signal}; its output is in {log}"
            )
        } else {
            write!(
                f,
                "{what}: interrupted by {signal}; the job and its ranks were stopped; its partial output is in {log}"
            )
        }
    }
}

impl std::error::Error for Interrupted {}

/// Run `words` (a launcher command line) to its end, stdout and stderr into `log_path`,
/// in a process group of its own, stopped after `timeout` ([`stop`]); Ok when it exited
/// 0. `what` names the job in errors. A SIGINT, SIGTERM, SIGHUP or SIGQUIT to this
/// process meanwhile is passed on to the launcher's group (which a terminal's Ctrl-C,
/// `Ctrl-\` and hang-up do not reach) and ends in [`Interrupted`] once the job is gone;
/// should this process die without that (SIGKILL, the OOM killer), the launcher gets
/// SIGTERM from the kernel (and ends its ranks) rather than run on as an orphan.
pub fn run_logged(
    words: &[String],
    log_path: &Path,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let log = File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .with_context(|| format!("duplicating {}", log_path.display()))?;
    let (program, args) = words
        .split_first()
        .with_context(|| format!("{what}: empty command line"))?;
    // Before the spawn: a signal from here on is caught, never left to kill this process
    // with the job still running (the child gets the default handlers back at exec).
    let signals = Forwarding::install()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Its own process group, for `stop` to signal.
        .process_group(0);
    // SIGTERM to the launcher when the thread that spawned it is gone (sweep and tune
    // spawn from their main thread, so: when this process is); the launcher then ends
    // its ranks.
    die_with_parent(&mut command, libc::SIGTERM);
    let mut child = command
        .spawn()
        .with_context(|| {
            // The default launcher is the repository's scripts/mpirun.sh, relative.
            let hint = if Path::new(program).is_relative() && program.contains('/') {
                format!(
                    " (a path relative to the current directory, {}: run from the repository's root, or give --launcher, e.g. \"mpirun -n {{n}}\" or \"srun -n {{n}}\")",
                    std::env::current_dir().map_or("?".into(), |d| d.display().to_string())
                )
            } else {
                String::new()
            };
            format!("starting '{program}' for {what}{hint}")
        })?;
    let start = Instant::now();
    let interrupted = |sig: libc::c_int, finished: bool| -> anyhow::Error {
        Interrupted {
            what: what.to_string(),
            signal: signal_name(sig),
            signo: sig,
            finished,
            log: log_path.to_path_buf(),
        }
        .into()
    };
    let status = loop {
        if let Some(sig) = signals.received() {
            let name = signal_name(sig);
            eprintln!(
                "[{name}] stopping {what} (up to {} s; {name} again kills it now)",
                INTERRUPT_GRACE.as_secs()
            );
            let seen = signals.count();
            // SIGTERM whatever came: srun takes a single SIGINT as a request for its
            // tasks' status (it aborts on two within a second), and both it and mpirun
            // end their ranks on SIGTERM.
            stop(&mut child, libc::SIGTERM, INTERRUPT_GRACE, &|| {
                signals.count() > seen
            });
            return Err(interrupted(sig, false));
        }
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for {what}"))?
        {
            break status;
        }
        if start.elapsed() > timeout {
            // An interrupt meanwhile hurries the stop and is what the caller hears of.
            let seen = signals.count();
            stop(&mut child, libc::SIGTERM, STOP_GRACE, &|| {
                signals.count() > seen
            });
            if let Some(sig) = signals.received() {
                return Err(interrupted(sig, false));
            }
            bail!(
                "{what}: stopped after {:?} (timeout {}s); output in {}",
                start.elapsed(),
                timeout.as_secs(),
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // A signal as the job ended on its own still stops the caller.
    if let Some(sig) = signals.received() {
        return Err(interrupted(sig, status.success()));
    }
    if !status.success() {
        let errors = error_lines(log_path);
        let why = if errors.is_empty() {
            String::new()
        } else {
            format!(": {}", errors.join(" | "))
        };
        bail!(
            "{what}: the job failed ({status}) after {:.1} s{why}; output in {}",
            start.elapsed().as_secs_f64(),
            log_path.display()
        );
    }
    Ok(())
}

/// Have `cmd`'s process sent `signal` when the thread that spawns it ends (this process
/// killed, even by SIGKILL or the OOM killer), so that no job or rank runs on as an
/// orphan; if that thread's process is gone by the time the child runs, at once.
pub(crate) fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
    // Taken before the fork: a parent that dies between the fork and the prctl sends no
    // signal, but the child then has another parent.
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure calls prctl(2), getppid(2), signal(2),
    // raise(3) and _exit(2) only ([`end_if_orphaned`]), which are async-signal-safe, and
    // touches no memory of the parent. The parent's handlers are still installed in the
    // child at this point; exec resets them.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            end_if_orphaned(parent, signal);
            Ok(())
        });
    }
}

/// In a child between fork and exec: end it with `signal`, as the parent-death signal
/// would have, when its parent is no longer `parent` (it died before the child's
/// PR_SET_PDEATHSIG, which then never fires). A parent's handler of `signal` is still
/// installed here (sweep's only records it), so the default action is restored first
/// (a no-op for SIGKILL); should the raise return all the same, `_exit` ends the child.
///
/// # Safety
/// Only in a forked child before exec (it may end the process); async-signal-safe calls
/// only.
unsafe fn end_if_orphaned(parent: libc::pid_t, signal: libc::c_int) {
    if libc::getppid() != parent {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
        libc::_exit(128 + signal);
    }
}

/// Error lines shown of a failed job's log, at most.
const ERROR_LINES: usize = 3;
/// Characters kept of one error line (with its continuation lines).
const ERROR_LINE_CHARS: usize = 500;
/// Bytes read from the end of a log for its error lines (a long run's log is large;
/// what ended it is at the end).
const LOG_TAIL_BYTES: u64 = 256 * 1024;

/// The last few distinct lines of the log at `path` that say `error:` (any case), oldest
/// first (slurmstepd's before the ranks', [`errors_in`]), each cut to [`ERROR_LINE_CHARS`]: why the job failed, in its own words (every
/// rank may print the same line; it is shown once). Empty when there are none or the log
/// cannot be read.
pub fn error_lines(path: &Path) -> Vec<String> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > LOG_TAIL_BYTES && f.seek(SeekFrom::Start(len - LOG_TAIL_BYTES)).is_err() {
        return Vec::new();
    }
    let mut bytes = Vec::new();
    if f.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    errors_in(&String::from_utf8_lossy(&bytes))
}

/// Whether an error line is a launcher's per-rank boilerplate, which says that a rank
/// failed, not why: srun's one line per node (`srun: error: n3: task 2: Exited with exit
/// code 1`, `srun: error: n1: tasks 0-1: Killed`) and mpirun's (or prterun's) lines.
/// slurmstepd's lines are not: they state causes only Slurm sees (an OOM kill, the time
/// limit).
fn launchers_line(line: &str) -> bool {
    if line.starts_with("mpirun") || line.starts_with("prterun") {
        return true;
    }
    let Some(rest) = line.strip_prefix("srun: error: ") else {
        return false;
    };
    // "<node>: task 2: Exited with exit code 1" or "<node>: tasks 0-1,3: Killed"; a
    // task's "Out Of Memory" says why, and stays.
    let mut parts = rest.splitn(3, ": ");
    let _node = parts.next();
    let tasks = parts.next().unwrap_or("");
    let what = parts.next().unwrap_or("");
    (tasks.starts_with("task ") || tasks.starts_with("tasks "))
        && (what.starts_with("Exited with exit code") || what == "Killed" || what == "Terminated")
}

/// Whether an error line is slurmstepd's, which states a cause the ranks may never
/// print: `slurmstepd: error: Detected 1 oom_kill event in StepId=7.0`, `... CANCELLED AT
/// ... DUE TO TIME LIMIT ***`.
fn slurmstepd_line(line: &str) -> bool {
    line.starts_with("slurmstepd")
}

/// [`error_lines`] of a log's text. An error line takes its indented continuation lines
/// with it (train's "invalid configuration:" lists the problems below it). The job's own
/// lines are shown, slurmstepd's first (the cause Slurm saw, which a secondary rank
/// error would otherwise hide); a launcher's per-rank boilerplate only where there is
/// nothing else.
fn errors_in(text: &str) -> Vec<String> {
    let all = error_entries(text);
    let own: Vec<String> = all.iter().filter(|e| !launchers_line(e)).cloned().collect();
    if own.is_empty() {
        return last_distinct(all, ERROR_LINES);
    }
    let (slurm, job): (Vec<String>, Vec<String>) =
        own.into_iter().partition(|e| slurmstepd_line(e));
    // At least one of the job's own lines where it has any.
    let slurm_room = if job.is_empty() {
        ERROR_LINES
    } else {
        ERROR_LINES - 1
    };
    let mut shown = last_distinct(slurm, slurm_room);
    let room = ERROR_LINES - shown.len();
    shown.extend(last_distinct(job, room));
    shown
}

/// Every error line of `text` with its continuation lines, in order.
fn error_entries(text: &str) -> Vec<String> {
    let mut entries: Vec<String> = Vec::new();
    let mut open = false;
    for line in text.lines() {
        if line.to_ascii_lowercase().contains("error:") {
            entries.push(line.trim().to_string());
            open = true;
        } else if open && line.starts_with([' ', '\t']) && !line.trim().is_empty() {
            if let Some(last) = entries.last_mut() {
                last.push(' ');
                last.push_str(line.trim());
            }
        } else {
            open = false;
        }
    }
    entries
}

/// The last `count` distinct `entries`, oldest first, each cut to [`ERROR_LINE_CHARS`].
fn last_distinct(entries: Vec<String>, count: usize) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    if count == 0 {
        return found;
    }
    for entry in entries.iter().rev() {
        let cut: String = match entry.char_indices().nth(ERROR_LINE_CHARS) {
            Some((at, _)) => format!("{}...", &entry[..at]),
            None => entry.clone(),
        };
        if !found.contains(&cut) {
            found.push(cut);
            if found.len() == count {
                break;
            }
        }
    }
    found.reverse();
    found
}

/// How long a launcher has after SIGTERM to end its ranks before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How long a launcher has to end its ranks after an interrupt passed on to it.
const INTERRUPT_GRACE: Duration = Duration::from_secs(30);

/// The signals passed on to a running job: a terminal's Ctrl-C, `Ctrl-\` and hang-up
/// (an ssh session that drops) and a scheduler's or kill's SIGTERM. Left to their
/// default action, they would end this process and leave the job running.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The last forwarded signal received (0: none), and how many were.
static RECEIVED: AtomicI32 = AtomicI32::new(0);
static RECEIVED_COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: atomic stores only.
    RECEIVED.store(sig, Ordering::SeqCst);
    RECEIVED_COUNT.fetch_add(1, Ordering::SeqCst);
}

/// The [`FORWARDED`] signals caught (recorded, for the job's loop to act on) while a job runs;
/// the previous handlers come back on drop, so between jobs (and in tune's own
/// measurements) the signals act as before. A signal this process was started ignoring
/// (a shell's background job ignores SIGINT) stays ignored.
struct Forwarding {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Forwarding {
    fn install() -> anyhow::Result<Forwarding> {
        RECEIVED.store(0, Ordering::SeqCst);
        RECEIVED_COUNT.store(0, Ordering::SeqCst);
        let mut guard = Forwarding {
            previous: Vec::new(),
        };
        for sig in FORWARDED {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the
            // handler only does atomic stores; `old` is written by sigaction.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    return Err(std::io::Error::last_os_error())
                        .with_context(|| format!("reading the handler of {}", signal_name(sig)));
                }
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                if libc::sigaction(sig, &action, std::ptr::null_mut()) != 0 {
                    return Err(std::io::Error::last_os_error()).with_context(|| {
                        format!("installing the handler of {}", signal_name(sig))
                    });
                }
                guard.previous.push((sig, old));
            }
        }
        Ok(guard)
    }

    /// The last signal received since [`Forwarding::install`].
    fn received(&self) -> Option<libc::c_int> {
        Some(RECEIVED.load(Ordering::SeqCst)).filter(|&s| s != 0)
    }

    /// How many were.
    fn count(&self) -> usize {
        RECEIVED_COUNT.load(Ordering::SeqCst)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores the action read in `install`.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}

/// "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT" or "a signal".
fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        _ => "a signal",
    }
}

/// Stop a launcher with every rank it started: `sig` to its process group first (SIGTERM
/// past a timeout, or the interrupt this process received): mpirun ends its ranks
/// (SIGTERM, then SIGKILL), and srun signals the ranks of its Slurm step. Whatever is
/// left after `grace` (a rank that ignores the signal, or is stopped), or as soon as
/// `hurry` says so, gets SIGKILL: the launcher's process group and every process that
/// was below it, since Open MPI starts each local rank in a process group of its own.
/// (Ranks of an srun step on other nodes are not below it: killing srun leaves them to
/// Slurm, which ends the step when srun is gone.)
fn stop(child: &mut Child, sig: libc::c_int, grace: Duration, hurry: &dyn Fn() -> bool) {
    let pid = child.id() as libc::pid_t;
    // Read before the launcher ends: after, its orphaned ranks belong to init.
    let below = processes_below(pid);
    // A pid is still the process read before when its start time is unchanged.
    let alive =
        |&(p, started): &(libc::pid_t, u64)| proc_stat(p).is_some_and(|(_, s)| s == started);
    // SAFETY: kill(2) on the process group we created; no memory involved.
    unsafe {
        libc::kill(-pid, sig);
    }
    let start = Instant::now();
    let mut exited = false;
    while start.elapsed() < grace && !hurry() {
        exited = exited || matches!(child.try_wait(), Ok(Some(_)));
        if exited && !below.iter().any(alive) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    exited = exited || matches!(child.try_wait(), Ok(Some(_)));
    for p in below.iter().filter(|p| alive(p)) {
        // SAFETY: as above, on a process checked a moment ago to be the one read before.
        unsafe {
            libc::kill(p.0, libc::SIGKILL);
        }
    }
    if !exited {
        // SAFETY: as above (not reaped yet: the group is still the one we created).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.wait();
}

/// A live process's parent and start time (in clock ticks since boot), from
/// `/proc/<pid>/stat`; `None` for a zombie (it has exited, only its parent may reap it).
fn proc_stat(pid: libc::pid_t) -> Option<(libc::pid_t, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ... starttime ...": comm may hold spaces and parentheses;
    // after it come the state, ppid (2nd) and starttime (20th), as proc(5) numbers them.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// Every process below `pid` (children, their children, ...) with its start time.
fn processes_below(pid: libc::pid_t) -> Vec<(libc::pid_t, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let all: Vec<(libc::pid_t, libc::pid_t, u64)> = dir
        .flatten()
        .filter_map(|e| {
            let p = e.file_name().to_str()?.parse().ok()?;
            let (ppid, started) = proc_stat(p)?;
            Some((p, ppid, started))
        })
        .collect();
    let mut tree = vec![(pid, 0)];
    let mut next = 0;
    while next < tree.len() {
        let parent = tree[next].0;
        tree.extend(
            all.iter()
                .filter(|(_, pp, _)| *pp == parent)
                .map(|&(p, _, s)| (p, s)),
        );
        next += 1;
    }
    tree.split_off(1)
}

impl Job<'_> {
    /// The full command line of `point`'s job.
    pub fn command_line(&self, point: &Point) -> anyhow::Result<Vec<String>> {
        let mut words = launcher_words(self.launcher, point.n)?;
        words.push(self.program.display().to_string());
        words.push("train".into());
        words.extend(self.train_args.iter().cloned());
        words.extend(point.train_flags());
        if self.own_metrics {
            // train's --metrics comes after (and so over) every --set and the file.
            words.push("--metrics".into());
            words.push(self.metrics_path(point).display().to_string());
        }
        words.push("--json".into());
        words.push(self.result_path(point).display().to_string());
        Ok(words)
    }

    /// Where `point`'s job writes its step metrics ([`Job::own_metrics`]):
    /// `<point>.metrics.jsonl` beside its result (`sweep collect` reads `.json` only).
    pub fn metrics_path(&self, point: &Point) -> PathBuf {
        self.result_path(point).with_extension("metrics.jsonl")
    }

    /// Where `point`'s result goes.
    pub fn result_path(&self, point: &Point) -> PathBuf {
        self.dir.join(point.file_name())
    }

    /// Run `point`'s job to its end (or its timeout); Ok when it exited 0 and left its
    /// result file.
    pub fn run(&self, point: &Point) -> anyhow::Result<()> {
        let words = self.command_line(point)?;
        let result = self.result_path(point);
        // A stale result from an earlier sweep must not pass for this run's, nor its
        // step metrics sit beside this run's log (a job that fails before train opens
        // its metrics file writes none).
        for old in [result.clone(), self.metrics_path(point)] {
            if old.exists() {
                std::fs::remove_file(&old)
                    .with_context(|| format!("removing the old {}", old.display()))?;
            }
        }
        let log_path = result.with_extension("log");
        log::info!("{point}: {}", words.join(" "));
        let start = Instant::now();
        run_logged(&words, &log_path, self.timeout, &point.to_string())?;
        if !result.is_file() {
            bail!(
                "{point}: the job succeeded but wrote no {}; output in {}",
                result.display(),
                log_path.display()
            );
        }
        log::info!("{point}: done in {:.1} s", start.elapsed().as_secs_f64());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signal handlers belong to the process: tests that run jobs (and so install and
    /// restore them) take turns, or one's restore would undo another's handler just
    /// before a test interrupt arrives.
    static JOBS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        JOBS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[test]
    fn a_child_and_its_child_are_below_this_process_with_their_start_times() {
        // sh starts sleep as its child (two commands: sh does not exec the last one).
        let mut sh = Command::new("sh")
            .args(["-c", "sleep 30; true"])
            .spawn()
            .expect("sh runs");
        let me = std::process::id() as libc::pid_t;
        let sh_pid = sh.id() as libc::pid_t;
        let child_of_sh = |below: &[(libc::pid_t, u64)]| {
            below
                .iter()
                .copied()
                .find(|&(p, _)| proc_stat(p).is_some_and(|(pp, _)| pp == sh_pid))
        };
        let mut below = processes_below(me);
        for _ in 0..250 {
            if child_of_sh(&below).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            below = processes_below(me);
        }
        let sleep = child_of_sh(&below);
        let _ = sh.kill();
        let _ = sh.wait();
        if let Some((p, _)) = sleep {
            // SAFETY: kill(2) of the sleep just found below sh; no memory involved.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
        // Start times (clock ticks since boot): not before this process's, so the field
        // read is the start time, not a neighbour (field 21 is always 0, 23 the size).
        let (parent, my_start) = proc_stat(me).expect("this process's stat");
        assert_eq!(parent, std::os::unix::process::parent_id() as libc::pid_t);
        assert!(
            below
                .iter()
                .any(|&(p, started)| p == sh_pid && started >= my_start),
            "sh {sh_pid} not below {me} (started {my_start}): {below:?}"
        );
        assert!(
            sleep.is_some_and(|(_, started)| started >= my_start),
            "{below:?}"
        );
    }

    #[test]
    fn a_failed_job_shows_its_last_distinct_error_lines() {
        let _turn = one_job_at_a_time();
        let log = "\
INFO starting
error: first problem
rank 1: error: model.preset = \"x\" is not a preset
error: model.preset = \"x\" is not a preset
error: model.preset = \"x\" is not a preset
Error: the last one
  - with a reason below it
mpirun detected that one or more processes exited with non-zero status
  Process name: [[1,1],0]
mpirun detected that one or more processes exited with non-zero status
";
        assert_eq!(
            errors_in(log),
            [
                "rank 1: error: model.preset = \"x\" is not a preset",
                "error: model.preset = \"x\" is not a preset",
                "Error: the last one - with a reason below it"
            ]
        );
        assert!(errors_in("all fine\n").is_empty());
        // srun's per-node lines say that ranks failed; the rank's own line says why.
        let srun = "\
error: rank 2: out of memory allocating 3.1 GB
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
srun: error: n3: task 2: Exited with exit code 1
srun: error: n1: tasks 0-1: Killed
srun: error: n2: task 3: Killed
";
        assert_eq!(
            errors_in(srun),
            ["error: rank 2: out of memory allocating 3.1 GB"]
        );
        // slurmstepd says what the ranks cannot (an OOM kill, the time limit): kept, and
        // first, before the secondary error of the rank that lost its peer (srun's
        // per-task "Out Of Memory" is a reason, not boilerplate; "Exited with exit code"
        // is).
        let oom = "\
error: rank 0: peer 1 closed the connection
srun: error: n2: task 1: Out Of Memory
slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks have been OOM Killed.
srun: error: n1: task 0: Exited with exit code 1
";
        assert_eq!(
            errors_in(oom),
            [
                "slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks have been OOM Killed.",
                "error: rank 0: peer 1 closed the connection",
                "srun: error: n2: task 1: Out Of Memory"
            ]
        );
        let limit = "\
error: rank 1: interrupted
slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***
slurmstepd: error: *** STEP 7.0 ON n2 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***
slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***
";
        let shown = errors_in(limit);
        assert_eq!(shown.len(), ERROR_LINES, "{shown:?}");
        assert!(shown[0].starts_with("slurmstepd: ") && shown[1].starts_with("slurmstepd: "));
        assert_eq!(shown[2], "error: rank 1: interrupted");
        // Where the launcher's lines are all there is, they are shown.
        assert_eq!(
            errors_in("srun: error: Unable to create step for job 7: Invalid\n"),
            ["srun: error: Unable to create step for job 7: Invalid"]
        );
        let long = format!("error: {}", "é".repeat(600));
        let cut = &errors_in(&long)[0];
        assert!(cut.ends_with("...") && cut.chars().count() == ERROR_LINE_CHARS + 3);

        let dir = tempfile::tempdir().unwrap();
        let log_path = dir.path().join("job.log");
        let words: Vec<String> = [
            "sh",
            "-c",
            "echo working; echo 'error: no such file' >&2; exit 3",
        ]
        .map(String::from)
        .into();
        let e = run_logged(&words, &log_path, Duration::from_secs(30), "N=2 x")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("N=2 x: the job failed (exit status: 3)")
                && e.contains(": error: no such file; output in "),
            "{e}"
        );
    }

    #[test]
    fn a_launcher_whose_parent_is_gone_before_exec_ends_by_sigterm() {
        let _turn = one_job_at_a_time();
        // As in run_logged: this process's handler records SIGTERM, and the forked child
        // still has it before exec; the child must end all the same.
        let signals = Forwarding::install().expect("handlers installed");
        let mut command = Command::new("sh");
        command.args(["-c", "exit 0"]).stdin(Stdio::null());
        // SAFETY: end_if_orphaned makes async-signal-safe calls only; -1 is never a
        // parent's pid, so the child takes its parent for gone.
        unsafe {
            command.pre_exec(|| {
                end_if_orphaned(-1, libc::SIGTERM);
                Ok(())
            });
        }
        let status = command.status().expect("the child was forked");
        drop(signals);
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
    }

    #[test]
    fn an_interrupt_stops_the_job_and_a_second_one_kills_what_ignores_it() {
        let _turn = one_job_at_a_time();
        // A test run in a shell's background starts with SIGINT ignored, which
        // run_logged would respect: this test is about the handler, so start from the
        // default.
        // SAFETY: sets the default action of SIGINT; no handler code involved.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
        }
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // The job ignores the SIGTERM the first interrupt sends it (the shell and its
        // background sleep), so only the second interrupt's SIGKILL ends it.
        let script = format!(
            "trap '' INT TERM; sleep 60 & echo $! > {}; wait",
            pid_file.display()
        );
        let words = vec!["sh".to_string(), "-c".into(), script];
        let sender = std::thread::spawn(move || {
            let start = Instant::now();
            while !pid_file.exists() && start.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(200));
            let sleep_pid: libc::pid_t = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            for _ in 0..2 {
                // SAFETY: kill(2) of this test process; the handler run_logged installed
                // catches it.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGINT);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            sleep_pid
        });
        let start = Instant::now();
        let e = run_logged(
            &words,
            &dir.path().join("job.log"),
            Duration::from_secs(60),
            "N=4 y",
        )
        .unwrap_err();
        let sleep_pid = sender.join().unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        let i = e.downcast_ref::<Interrupted>().expect("an Interrupted");
        assert_eq!((i.what.as_str(), i.signal), ("N=4 y", "SIGINT"));
        assert!(!i.finished && i.exit_code() == 130);
        assert!(e.to_string().contains("partial output is in"), "{e}");
        assert!(sleep_pid > 0);
        assert!(
            proc_stat(sleep_pid).is_none(),
            "sleep {sleep_pid} still runs"
        );
        // The previous (default) handler is back.
        // SAFETY: reads the current action only.
        let now = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old);
            old.sa_sigaction
        };
        assert_eq!(now, libc::SIG_DFL);
    }

    #[test]
    fn the_command_line_is_launcher_program_train_args_point_and_json() {
        let args = vec!["--config".to_string(), "c.toml".into()];
        let job = Job {
            launcher: "srun --mpi=pmix -n {n}",
            program: Path::new("/bin/zb"),
            train_args: &args,
            dir: Path::new("/out"),
            timeout: Duration::from_secs(1),
            own_metrics: false,
        };
        let p = Point {
            n: 4,
            model: "tiny".into(),
            precision: "bf16".into(),
            grad_accum: Some(2),
            from_config: crate::sweep::point::FromConfig {
                precision: true,
                ..Default::default()
            },
            preset: None,
        };
        assert_eq!(
            job.command_line(&p).unwrap().join(" "),
            "srun --mpi=pmix -n 4 /bin/zb train --config c.toml --model tiny --grad-accum 2 \
             --json /out/n4_tiny_bf16_a2.json"
        );
        // A configuration with a metrics file: each point writes its own beside its result.
        let own = Job {
            own_metrics: true,
            ..job
        };
        assert_eq!(
            own.command_line(&p).unwrap().join(" "),
            "srun --mpi=pmix -n 4 /bin/zb train --config c.toml --model tiny --grad-accum 2 \
             --metrics /out/n4_tiny_bf16_a2.metrics.jsonl --json /out/n4_tiny_bf16_a2.json"
        );
        assert!(launcher_words("mpirun -n 4", 4).is_err());
        assert_eq!(
            launcher_words("mpirun -n {N}", 3).unwrap(),
            ["mpirun", "-n", "3"]
        );
    }
}
