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

/// Run `words` (a launcher command line) to its end, stdout and stderr into `log_path`,
/// in a process group of its own, stopped after `timeout` ([`stop`]); Ok when it exited
/// 0. `what` names the job in errors.
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
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        // Its own process group, for `stop` to signal.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting '{program}' for {what}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for {what}"))?
        {
            break status;
        }
        if start.elapsed() > timeout {
            stop(&mut child);
            bail!(
                "{what}: stopped after {:?} (timeout {}s); output in {}",
                start.elapsed(),
                timeout.as_secs(),
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        bail!(
            "{what}: the job failed ({status}) after {:.1} s; output in {}",
            start.elapsed().as_secs_f64(),
            log_path.display()
        );
    }
    Ok(())
}

/// How long a launcher has after SIGTERM to end its ranks before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Stop a launcher past its timeout, with every rank it started. SIGTERM first: mpirun
/// ends its ranks (SIGTERM, then SIGKILL), and srun signals the ranks of its Slurm step. Whatever is left after [`STOP_GRACE`] (a rank that ignores SIGTERM,
/// or is stopped) gets SIGKILL: the launcher's process group and every process that was
/// below it, since Open MPI starts each local rank in a process group of its own. (Ranks
/// of an srun step on other nodes are not below it: killing srun leaves them to Slurm,
/// which ends the step when srun is gone.)
fn stop(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // Read before the launcher ends: after, its orphaned ranks belong to init.
    let below = processes_below(pid);
    // A pid is still the process read before when its start time is unchanged.
    let alive =
        |&(p, started): &(libc::pid_t, u64)| proc_stat(p).is_some_and(|(_, s)| s == started);
    // SAFETY: kill(2) on the process group we created; no memory involved.
    unsafe {
        libc::kill(-pid, libc::SIGTERM);
    }
    let start = Instant::now();
    let mut exited = false;
    while start.elapsed() < STOP_GRACE {
        exited = exited || matches!(child.try_wait(), Ok(Some(_)));
        if exited && !below.iter().any(alive) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
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
        words.push("--json".into());
        words.push(self.result_path(point).display().to_string());
        Ok(words)
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
        // A stale result from an earlier sweep must not pass for this run's.
        if result.exists() {
            std::fs::remove_file(&result)
                .with_context(|| format!("removing the old {}", result.display()))?;
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
    fn the_command_line_is_launcher_program_train_args_point_and_json() {
        let args = vec!["--config".to_string(), "c.toml".into()];
        let job = Job {
            launcher: "srun --mpi=pmix -n {n}",
            program: Path::new("/bin/zb"),
            train_args: &args,
            dir: Path::new("/out"),
            timeout: Duration::from_secs(1),
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
        };
        assert_eq!(
            job.command_line(&p).unwrap().join(" "),
            "srun --mpi=pmix -n 4 /bin/zb train --config c.toml --model tiny --grad-accum 2 \
             --json /out/n4_tiny_bf16_a2.json"
        );
        assert!(launcher_words("mpirun -n 4", 4).is_err());
        assert_eq!(
            launcher_words("mpirun -n {N}", 3).unwrap(),
            ["mpirun", "-n", "3"]
        );
    }
}
