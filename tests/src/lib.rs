//! Launching real multi-rank jobs from `cargo test`.
//!
//! MPI initialises once per process, so every multi-rank scenario is its own small
//! binary (`tests/src/bin/*.rs`). A `#[test]` starts it under a real `mpirun -n N`
//! through [`MpiJob`], with the flags a root user on a small machine needs handled here
//! (run-as-root, oversubscribe), in its own process group; a timeout kills that group and
//! every process below mpirun ([`kill_job`]: Open MPI gives each rank a process group of
//! its own), so nothing outlives the test.
//!
//! Scenario convention: every rank that finishes its checks prints one line
//! `OK rank=<r>` ([`ok_line`]) as its last act; [`JobOutput::assert_all_ok`] demands
//! exactly N of them plus a zero exit status.

pub mod accounting;
pub mod cli;
pub mod plots;
pub mod safetensors_files;
pub mod scenario;
pub mod slurm;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The line a scenario rank prints when all of its checks passed.
pub fn ok_line(rank: usize) -> String {
    format!("OK rank={rank}")
}

/// A job to launch: `mpirun -n ranks program args...`.
#[derive(Clone, Debug)]
pub struct MpiJob {
    ranks: usize,
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout: Duration,
}

/// What a finished (or killed) job left behind.
#[derive(Debug)]
pub struct JobOutput {
    /// Number of ranks launched.
    pub ranks: usize,
    /// Exit code of mpirun; `None` when killed by a signal (e.g. on our timeout).
    pub code: Option<i32>,
    /// True when the job ran past its timeout and was killed.
    pub timed_out: bool,
    /// How long the job ran.
    pub elapsed: Duration,
    /// Everything the ranks printed on stdout.
    pub stdout: String,
    /// Everything the ranks and mpirun printed on stderr.
    pub stderr: String,
}

impl MpiJob {
    /// A job of `ranks` ranks running `program` (a path, e.g. `env!("CARGO_BIN_EXE_x")`).
    pub fn new(ranks: usize, program: impl AsRef<Path>) -> Self {
        MpiJob {
            ranks,
            program: program.as_ref().display().to_string(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }

    /// Arguments passed to every rank.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable exported to every rank (`mpirun -x`).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Kill the whole job (every rank and mpirun) after this long.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The full mpirun command line (for messages).
    pub fn command_line(&self) -> String {
        let mut parts = vec!["mpirun".to_string()];
        parts.extend(self.mpirun_args());
        parts.join(" ")
    }

    fn mpirun_args(&self) -> Vec<String> {
        let mut a = vec![
            "-n".to_string(),
            self.ranks.to_string(),
            // Tests run 2-4 ranks on 2 cores.
            "--oversubscribe".to_string(),
            // Deterministic, quiet transport on one host: shared memory + self.
            "--mca".to_string(),
            "btl".to_string(),
            "self,vader".to_string(),
        ];
        for (k, v) in &self.env {
            a.push("-x".to_string());
            a.push(format!("{k}={v}"));
        }
        a.push(self.program.clone());
        a.extend(self.args.iter().cloned());
        a
    }

    /// Run the job to completion or until its timeout, whichever comes first.
    ///
    /// Panics (this is test support) only when mpirun itself cannot be started, with a
    /// message that says how to install it.
    pub fn run(&self) -> JobOutput {
        let mut cmd = Command::new("mpirun");
        cmd.args(self.mpirun_args())
            // mpirun refuses root without these; CI runs as root.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env("RUST_BACKTRACE", "0")
            // The ranks log at `info` whatever the caller's RUST_LOG says: tests read the
            // info lines, and assert that some are absent (no " step 1/" before an
            // error), which RUST_LOG=warn would make hold vacuously. A scenario that
            // wants another level passes it with `.env("RUST_LOG", ...)` (mpirun -x
            // overrides this).
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Own process group: a timeout kills mpirun and every rank it started.
            .process_group(0);
        // Descriptors of this test process that are not close-on-exec (the HDF5 library
        // opens its files without O_CLOEXEC) would live on in mpirun, and with them the
        // HDF5 file lock of a file another test thread is writing: that test's job would
        // then fail to open it ("unable to lock file"). Close them all at exec.
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (close_range or fcntl), touching no memory.
        unsafe {
            cmd.pre_exec(|| {
                cloexec_from(3);
                Ok(())
            });
        }
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start mpirun ({e}); install Open MPI with scripts/setup.sh \
                 (apt-get install openmpi-bin libopenmpi-dev)"
            )
        });
        let pid = child.id() as libc::pid_t;
        let mut out_pipe = child.stdout.take().expect("stdout is piped");
        let mut err_pipe = child.stderr.take().expect("stderr is piped");
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out_pipe.read_to_string(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err_pipe.read_to_string(&mut s);
            s
        });
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) => {}
                Err(_) => break None,
            }
            if start.elapsed() > self.timeout {
                timed_out = true;
                kill_job(pid);
                break child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // What is left of mpirun's own group (a reaped mpirun has no processes below it
        // to walk: only a timeout, above, finds its ranks).
        // SAFETY: kill(2) on the process group made for this job; no memory involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        let elapsed = start.elapsed();
        JobOutput {
            ranks: self.ranks,
            code: status.and_then(|s| s.code()),
            timed_out,
            elapsed,
            stdout: out_reader.join().unwrap_or_default(),
            stderr: err_reader.join().unwrap_or_default(),
        }
    }
}

/// SIGKILL to the process group of `pid` (made with `process_group(0)`) and to every
/// process below it: Open MPI starts each local rank in a process group of its own, so
/// the group alone would leave the ranks of a killed mpirun running.
pub fn kill_job(pid: libc::pid_t) {
    let below = processes_below(pid);
    // SAFETY: kill(2) on our child's process group and on pids just read from /proc; it
    // touches no memory of ours.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        for p in below {
            libc::kill(p, libc::SIGKILL);
        }
    }
}

/// Pids of the processes whose command line (`/proc/<pid>/cmdline`: NUL-separated
/// words, each ending in NUL) satisfies `matches`.
pub fn running(matches: impl Fn(&str) -> bool) -> Vec<libc::pid_t> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            matches(&String::from_utf8_lossy(&cmdline)).then_some(pid)
        })
        .collect()
}

/// [`running`], retried for up to 5 s until it finds none: a killed process stays in
/// /proc until its parent (or init) reaps it. Returns what is left.
pub fn wait_until_none_running(matches: impl Fn(&str) -> bool) -> Vec<libc::pid_t> {
    let mut left = running(&matches);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        left = running(&matches);
    }
    left
}

/// Pids of the processes below `pid`: children, grandchildren, ... (from /proc).
pub fn processes_below(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // After the command name's closing parenthesis: state, then the parent's pid.
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|w| w.parse::<libc::pid_t>().ok())
        {
            parents.push((p, ppid));
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(p, _) in parents.iter().filter(|(_, pp)| *pp == parent) {
            found.push(p);
            frontier.push(p);
        }
    }
    found
}

impl JobOutput {
    /// Both streams, for failure messages.
    pub fn transcript(&self) -> String {
        format!(
            "exit code {:?}, timed out: {}, {:.1} s\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.timed_out,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }

    /// Number of `OK rank=r` lines, checking that each rank reported exactly once.
    pub fn ok_ranks(&self) -> Vec<usize> {
        let mut ranks: Vec<usize> = self
            .stdout
            .lines()
            .filter_map(|l| l.trim().strip_prefix("OK rank="))
            .filter_map(|r| r.trim().parse().ok())
            .collect();
        ranks.sort_unstable();
        ranks
    }

    /// Assert a zero exit status, no timeout, and one `OK rank=r` line from every rank.
    pub fn assert_all_ok(&self) {
        assert!(!self.timed_out, "job timed out\n{}", self.transcript());
        assert_eq!(self.code, Some(0), "job failed\n{}", self.transcript());
        let expected: Vec<usize> = (0..self.ranks).collect();
        assert_eq!(
            self.ok_ranks(),
            expected,
            "not every rank reported OK\n{}",
            self.transcript()
        );
    }

    /// Assert the job failed (non-zero exit) without needing our timeout to end it.
    pub fn assert_failed_by_itself(&self) {
        assert!(
            !self.timed_out,
            "job hung until the test's timeout instead of failing by itself\n{}",
            self.transcript()
        );
        assert_ne!(
            self.code,
            Some(0),
            "job should have failed\n{}",
            self.transcript()
        );
    }

    /// stdout and stderr together, for `contains` checks.
    pub fn all_text(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// The variable that lets a test whose prerequisite this machine lacks pass without
/// running: a comma-separated list of the prerequisites to do without, e.g.
/// `ZERO_TESTS_SKIP=tmpfs,numpy`. Unset, such a test fails, saying what is missing, so
/// a machine set up by scripts/setup.sh runs every check or says why not.
pub const SKIP_VAR: &str = "ZERO_TESTS_SKIP";

/// Whether [`SKIP_VAR`] names `what` (one of its comma-separated words).
pub fn skip_allowed(what: &str) -> bool {
    std::env::var(SKIP_VAR).is_ok_and(|v| v.split(',').any(|w| w.trim() == what))
}

/// A missing prerequisite `what` (`why` says what it is and how to get it): panics
/// unless [`SKIP_VAR`] allows the skip, else says on stdout that the test did not run.
/// Call it and return from the test.
pub fn skip_or_fail(what: &str, why: &str) {
    assert!(
        skip_allowed(what),
        "{why}; to skip this test on such a machine instead, set {SKIP_VAR}={what}"
    );
    println!("SKIPPED ({SKIP_VAR}={what}): {why}");
}

/// The built `zero-bench` of this test's profile: `target/<profile>/zero-bench`, found
/// from the test binary's own path (`target/<profile>/deps/<test>-<hash>`). CLI tests run
/// it; build it first with `cargo build -p zero-bench --release` (scripts/test.sh does).
pub fn zero_bench_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its own path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let bin = dir.join("zero-bench");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build -p zero-bench --release` (the same profile as these tests)",
        bin.display()
    );
    bin
}

/// The carried GPU build of `zero-bench` (no MPI, no HDF5): `target-carry/release/zero-bench`,
/// built by scripts/test.sh and scripts/carry-check.sh. The TCP-world tests run it.
/// A relative `CARRY_TARGET_DIR` is the workspace root's, as for those scripts (tests run
/// in tests/).
pub fn carried_bin() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARRY_TARGET_DIR")
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target-carry"));
    let bin = target.join("release").join("zero-bench");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build -p zero-bench --release --no-default-features --features nccl --target-dir target-carry` (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// Mark every descriptor from `first` on close-on-exec (in a forked child, before exec):
/// close_range(2) with CLOSE_RANGE_CLOEXEC (Linux 5.11), else fcntl on each of the first
/// 4096. Async-signal-safe.
fn cloexec_from(first: libc::c_int) {
    // SAFETY: plain system calls on descriptor numbers; a number that is no open
    // descriptor makes fcntl fail with EBADF, which is ignored.
    unsafe {
        let marked = libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if marked != 0 {
            for fd in first..4096 {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
}
