//! Processes joined by TCP: the world of a launch without MPI.
//!
//! Some clusters start tasks with `srun` but without PMI/PMIx (`srun --mpi=none`, or
//! `MpiDefault=none` and no PMIx plugin), and zero-bench's carried GPU build links no MPI at
//! all. Then every process knows its rank and the world's size from the launcher
//! (`ZERO_RANK`, `ZERO_WORLD_SIZE`, else mpirun's, PMI's or Slurm's: [`RANK_VARS`]), and
//! one address
//! where rank 0 can be found ([`Rendezvous`], `ZERO_RENDEZVOUS`). [`SocketComm`] connects
//! them: every rank holds one TCP connection to rank 0, a star.
//!
//! What it is for: the control plane of such a job (agreeing on the configuration, the
//! NCCL unique id, barriers, checkpoint votes), and the gradients of a small CPU job. Its
//! semantics are those of the thread ranks ([`crate::LocalComm`]), so a run gives the same
//! bits as thread ranks on the same inputs:
//!
//! - **Deterministic reductions.** Rank 0 receives every rank's input and reduces in rank
//!   order, `((x0 + x1) + x2) + ...` (the rules of `reduce.rs`: f32/f64 in their own type,
//!   halves per [`HalfSum`], wrapping integers, first maximum), then sends each rank its
//!   output.
//! - **The consistency check is always on.** Every input travels with its call's
//!   fingerprint (sequence number, collective, reduction, count, dtype, root, half mode);
//!   rank 0 compares them before reducing and every rank returns [`CommError::Mismatch`]
//!   naming rank 0 and the lowest differing rank. The group stays usable.
//! - **No rank waits forever.** Rank 0 waits for its peers at most
//!   [`CommConfig::timeout`] (`ZERO_COMM_TIMEOUT`, 30 minutes unless set) and then fails
//!   with [`CommError::Timeout`] naming the ranks that never arrived; the others wait a
//!   little longer, for rank 0's verdict. A process that ends closes its connection:
//!   rank 0 notices at once (it polls every connection), and every rank's collective
//!   fails with [`CommError::Link`] (the rank whose connection broke) or
//!   [`CommError::Poisoned`] (told by rank 0). After such a failure the group is unusable
//!   and every later collective returns `Poisoned` at once.
//! - **Non-blocking collectives complete at start**, as with thread ranks.
//! - **Host memory only.** Device buffers are [`CommError::Location`]; wrap the
//!   communicator in a [`crate::StagedComm`] to move them through host staging.
//!
//! Cost: rank 0 receives `N - 1` inputs and sends `N - 1` outputs, so an all-reduce of
//! `S` bytes moves `2 (N - 1) S` bytes through rank 0's link (a ring moves `2 (N - 1) S /
//! N` through each). The accounting ([`Communicator::stats`]) is nevertheless the ring
//! algorithm's, as for every backend, so the ledgers compare with the ZeRO formulas; the
//! star is for control traffic and small worlds, and NCCL carries the GPU data.
//!
//! The wire format (little-endian `u64` words). Joining: a rank's hello is `[magic
//! "ZERO-TCP", version, rank, size, token bytes]` and the token; rank 0 answers, once all
//! have joined, `[0, 0]`, or `[1, bytes]` and why it refused. Then per collective: a rank's input is `[fingerprint (7 words),
//! payload bytes]` and the payload; rank 0's answer is `[status, payload bytes]` and the
//! payload (status 0: the output; 1: a mismatch, the payload `rank_b`, `call_a`, `call_b`
//! as lines; 2: the group failed, the payload the failing rank and the reason as lines).

use crate::buffer::Location;
use crate::communicator::{Communicator, Done, InFlight, RawCall, ReduceOp};
use crate::config::{CommConfig, HalfSum};
use crate::error::{CommError, Result};
use crate::fingerprint::{describe, fingerprint, FIELDS};
use crate::nodes::NodeGroups;
use crate::reduce::{self, fold_into, layout, scratch_as, Elem, Half};
use crate::stats::{ring_bytes, CollectiveKind, CommStats, Counters};
use crate::DType;
use half::{bf16, f16};
use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The backend's name in messages.
pub const NAME: &str = "tcp";
/// The world communicator's name in messages.
const WORLD: &str = "world";
/// First word of a hello: "ZERO-TCP".
const MAGIC: u64 = u64::from_le_bytes(*b"ZERO-TCP");
/// Version of the wire format above.
const VERSION: u64 = 1;
/// The longest token or message accepted in a hello or a failure answer.
const MAX_TEXT: u64 = 64 * 1024;
/// How long rank 0 waits for a connected stranger's hello before dropping it.
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// How much longer than rank 0 the other ranks wait, so rank 0's verdict comes first.
const VERDICT_SLACK: Duration = Duration::from_secs(10);
/// The rendezvous's default patience (`ZERO_RENDEZVOUS_TIMEOUT`): ranks of one srun step
/// start within seconds, but a busy shared file system or a slow node may lag.
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(300);

/// Where rank 0 is found (`ZERO_RENDEZVOUS`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// `tcp:HOST:PORT` (or `HOST:PORT`): rank 0 listens on PORT of every interface, the
    /// others connect to HOST:PORT. HOST must be rank 0's host.
    Tcp {
        /// What the others connect to.
        host: String,
        /// The port.
        port: u16,
    },
    /// `file:PATH` (or a path with a `/`): rank 0 listens on a free port and writes where
    /// it may be reached (`host:port`, then `ip:port` for each of its IPv4 addresses) and
    /// the job's token into a file beside PATH ([`rendezvous_file`]), on a file system
    /// every rank sees; the others wait for that file and try each address. Rank 0
    /// removes it once everyone has connected.
    File(PathBuf),
}

impl Address {
    /// Parse `ZERO_RENDEZVOUS`'s value.
    pub fn parse(text: &str) -> std::result::Result<Address, String> {
        let text = text.trim();
        let tcp = |hp: &str| -> std::result::Result<Address, String> {
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| format!("'{hp}' has no ':PORT'"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| format!("'{port}' in '{hp}' is not a port number (1-65535)"))?;
            if host.is_empty() || port == 0 {
                return Err(format!("'{hp}' needs a host and a port above 0"));
            }
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Ok(Address::Tcp {
                host: host.to_string(),
                port,
            })
        };
        if let Some(path) = text.strip_prefix("file:") {
            if path.is_empty() {
                return Err("file: needs a path".into());
            }
            Ok(Address::File(PathBuf::from(path)))
        } else if let Some(hp) = text.strip_prefix("tcp:") {
            tcp(hp)
        } else if text.contains('/') {
            Ok(Address::File(PathBuf::from(text)))
        } else if text.contains(':') {
            tcp(text)
        } else {
            Err(format!(
                "'{text}' is neither tcp:HOST:PORT nor file:PATH (a file on a file system every rank sees)"
            ))
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
            Address::File(p) => write!(f, "file:{}", p.display()),
        }
    }
}

/// How this process joins a TCP world: its rank, the world's size, where rank 0 is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// This process's rank.
    pub rank: usize,
    /// Processes in the world.
    pub size: usize,
    /// Where rank 0 listens.
    pub address: Address,
    /// Names this launch, so that a rank never joins another launch's rank 0 (through a
    /// stale or shared file, or a reused port): `ZERO_RENDEZVOUS_TOKEN`, else the
    /// per-launch ids of the launcher that started this process ([`launch_token`]), else
    /// empty.
    pub token: String,
    /// How long to wait for every rank to join.
    pub timeout: Duration,
}

/// The environment variable naming the rendezvous address.
pub const RENDEZVOUS_VAR: &str = "ZERO_RENDEZVOUS";

/// The most ranks a TCP world may have: far more than a star through one rank 0 serves,
/// and few enough that a mistyped size cannot make rank 0 allocate without bound.
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Where a process finds its rank, in the order believed: ours; then the launcher that
/// started the process (Open MPI's mpirun sets `OMPI_COMM_WORLD_*` for its children;
/// MPICH's hydra and `srun --mpi=pmi2` set `PMI_*`, PMIx launchers `PMIX_RANK`); Slurm's
/// last, because an mpirun inside an sbatch allocation inherits the allocation's
/// `SLURM_*` (`mpirun -n 4` in `sbatch -n 8` would wait for 8 ranks). srun sets its
/// `SLURM_*` and the PMI ones alike, so for srun the order changes nothing.
pub const RANK_VARS: &[&str] = &[
    "ZERO_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
];

/// Where a process finds the world's size, in [`RANK_VARS`]'s order (PMIx exports no size).
pub const SIZE_VARS: &[&str] = &[
    "ZERO_WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
];

/// The first of `names` that `var` has, as (name, value, the value as a number).
fn first_number(
    var: &impl Fn(&str) -> Option<String>,
    names: &[&'static str],
) -> Option<(&'static str, String, Option<usize>)> {
    names.iter().find_map(|&name| {
        let v = var(name)?;
        let n = v.trim().parse().ok();
        Some((name, v, n))
    })
}

/// The launchers' variables that disagree with the rank and size taken from `rank_from`
/// and `size_from` (`NAME=value` each), in a sentence saying what to do; `None` when all
/// agree. Several launchers' variables in one environment are normal (srun sets Slurm's
/// and PMI's); different values mean one of them describes another launch (the
/// enclosing allocation).
fn launcher_disagreement(
    var: &impl Fn(&str) -> Option<String>,
    (rank_from, rank): (&str, usize),
    (size_from, size): (&str, usize),
) -> Option<String> {
    let differ = |names: &[&str], used: &str, value: usize| -> Vec<String> {
        names
            .iter()
            .filter(|&&n| n != used)
            .filter_map(|&n| var(n).map(|v| (n, v)))
            .filter(|(_, v)| v.trim().parse::<usize>().ok() != Some(value))
            .map(|(n, v)| format!("{n}={v}"))
            .collect()
    };
    let mut others = differ(RANK_VARS, rank_from, rank);
    others.extend(differ(SIZE_VARS, size_from, size));
    if others.is_empty() {
        return None;
    }
    Some(format!(
        "the launchers' variables disagree: this process took rank {rank} from {rank_from} and the size {size} from {size_from}, but {} say otherwise; if the wrong launcher's are believed (e.g. Slurm's of an enclosing allocation), set ZERO_RANK and ZERO_WORLD_SIZE for every process",
        others.join(", ")
    ))
}

/// This launch's token (see [`Rendezvous::token`]): `ZERO_RENDEZVOUS_TOKEN`, else the ids
/// of the one launch that started this process, which are the same on all its ranks and
/// differ between two launches: Open MPI's (`PMIX_NAMESPACE`, `OMPI_MCA_ess_base_jobid`)
/// under mpirun, `PMI_JOBID` under a PMI launcher, `PMIX_NAMESPACE` under a PMIx one,
/// else Slurm's job, step and restart count (srun). Only that launcher's: an mpirun inside
/// an sbatch allocation sees the batch step's `SLURM_STEP_ID` on one node and the step of
/// the daemons it started with srun on the others. Empty when nothing names the launch
/// (e.g. MPICH's hydra): launches that share a `file:` path then need their own paths
/// or tokens, and [`SocketComm::connect`] refuses to take over a live one's file.
pub fn launch_token(var: &impl Fn(&str) -> Option<String>) -> String {
    if let Some(t) = var("ZERO_RENDEZVOUS_TOKEN") {
        return t;
    }
    let ids = |family: &str, names: &[&str]| -> String {
        let found: Vec<String> = names
            .iter()
            .filter_map(|&n| var(n))
            .filter(|v| !v.trim().is_empty())
            .collect();
        match found.is_empty() {
            true => String::new(),
            false => format!("{family}:{}", found.join(".")),
        }
    };
    let has = |n: &str| var(n).is_some();
    if has("OMPI_COMM_WORLD_RANK") {
        ids("ompi", &["PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"])
    } else if has("PMI_RANK") {
        ids("pmi", &["PMI_JOBID"])
    } else if has("PMIX_RANK") {
        ids("pmix", &["PMIX_NAMESPACE"])
    } else if let Some(job) = var("SLURM_JOB_ID") {
        format!(
            "slurm:{job}.{}.{}",
            var("SLURM_STEP_ID").unwrap_or_default(),
            var("SLURM_RESTART_COUNT").unwrap_or_else(|| "0".into())
        )
    } else {
        String::new()
    }
}

/// When the launchers' variables of this process's environment disagree about the rank
/// and size `rv` holds, why a rendezvous may wait in vain (appended to its timeouts);
/// empty otherwise, and for a rendezvous not taken from the environment.
fn environment_note(rv: &Rendezvous) -> String {
    let var = |name: &str| std::env::var(name).ok();
    let (Some((rank_from, _, Some(rank))), Some((size_from, _, Some(size)))) =
        (first_number(&var, RANK_VARS), first_number(&var, SIZE_VARS))
    else {
        return String::new();
    };
    if (rank, size) != (rv.rank, rv.size) {
        return String::new();
    }
    launcher_disagreement(&var, (rank_from, rank), (size_from, size))
        .map(|d| format!("; note: {d}"))
        .unwrap_or_default()
}

impl Rendezvous {
    /// From the environment: `None` when `ZERO_RENDEZVOUS` is not set. The rank comes from
    /// the first of [`RANK_VARS`] set (`ZERO_RANK`, then the launcher's), the size from
    /// the first of [`SIZE_VARS`]; the token from [`launch_token`]; the patience from
    /// `ZERO_RENDEZVOUS_TIMEOUT` (seconds).
    pub fn from_env() -> std::result::Result<Option<Rendezvous>, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Rendezvous::from_env`], reading variables through `var`.
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<Option<Rendezvous>, String> {
        let Some(at) = var(RENDEZVOUS_VAR).filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        let address = Address::parse(&at).map_err(|e| format!("{RENDEZVOUS_VAR}={at}: {e}"))?;
        type Found = std::result::Result<(&'static str, usize), String>;
        let number = |names: &[&'static str], what: &str| -> Found {
            match first_number(&var, names) {
                Some((name, _, Some(n))) => Ok((name, n)),
                Some((name, v, None)) => {
                    Err(format!("{name}={v} is not a whole number (the {what})"))
                }
                None => Err(format!(
                    "{RENDEZVOUS_VAR} is set, so this process joins a TCP world, but none of {} gives its {what}: launch with srun or mpirun, or set ZERO_RANK and ZERO_WORLD_SIZE for every process",
                    names.join(", ")
                )),
            }
        };
        let (rank_from, rank) = number(RANK_VARS, "rank")?;
        let (size_from, size) = number(SIZE_VARS, "world size")?;
        if size > MAX_WORLD_SIZE {
            return Err(format!(
                "{size_from}={size}: a TCP world has at most {MAX_WORLD_SIZE} ranks; give the number of processes launched"
            ));
        }
        if size == 0 || rank >= size {
            return Err(format!(
                "rank {rank} of a world of {size} ({rank_from}, {size_from}): the rank must be below the size"
            ));
        }
        let note = launcher_disagreement(&var, (rank_from, rank), (size_from, size));
        log::debug!(
            "rank {rank} of {size}: from {rank_from} and {size_from}{}",
            note.map(|n| format!(" ({n})")).unwrap_or_default()
        );
        let token = launch_token(&var);
        let timeout = match var("ZERO_RENDEZVOUS_TIMEOUT") {
            None => DEFAULT_RENDEZVOUS_TIMEOUT,
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    format!("ZERO_RENDEZVOUS_TIMEOUT={v}: give seconds, above 0 and at most a day")
                })?,
        };
        Ok(Some(Rendezvous {
            rank,
            size,
            address,
            token,
            timeout,
        }))
    }
}

/// One rank of a TCP world; see the [module documentation](self).
///
/// `Send` but not `Sync` (one thread uses it). Dropping it closes its connections.
pub struct SocketComm {
    rank: usize,
    size: usize,
    /// Rank in the world this group belongs to, and the group's name (messages).
    world_rank: usize,
    name: String,
    /// Rank 0: the connection of rank `r` at index `r - 1`; the others: the one to rank 0.
    links: Vec<TcpStream>,
    seq: Cell<u64>,
    counters: Counters,
    half_sum: Cell<HalfSum>,
    timeout: Option<Duration>,
    /// How long joining a group may take (the world's `ZERO_RENDEZVOUS_TIMEOUT`).
    join_timeout: Duration,
    /// Set when a collective failed part-way: `(rank that failed, why)`.
    broken: RefCell<Option<(usize, String)>>,
    /// Rank 0: the peers' inputs, and the reduced result (u64 words: aligned for every
    /// dtype), kept between calls.
    inputs: RefCell<Vec<Vec<u64>>>,
    result: Cell<Vec<u64>>,
}

impl std::fmt::Debug for SocketComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Who a communicator is in its group (for [`SocketComm::from_links`]).
struct Group {
    rank: usize,
    size: usize,
    world_rank: usize,
    name: String,
    join_timeout: Duration,
}

/// What a failed read or write of a link means.
enum Fault {
    /// The peer closed the connection or it broke.
    Broken(String),
    /// Nothing came for the whole wait.
    Silent,
}

fn fault(e: io::Error) -> Fault {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Fault::Silent,
        io::ErrorKind::UnexpectedEof => {
            Fault::Broken("the connection was closed (that process ended)".into())
        }
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe => Fault::Broken(format!(
            "{e} (that process ended, or the network dropped the connection)"
        )),
        _ => Fault::Broken(e.to_string()),
    }
}

fn words(buf: &[u8]) -> impl Iterator<Item = u64> + '_ {
    buf.chunks_exact(8).map(|c| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        u64::from_le_bytes(w)
    })
}

fn to_bytes(ws: &[u64]) -> Vec<u8> {
    ws.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn read_words<const N: usize>(mut s: impl Read) -> std::result::Result<[u64; N], Fault> {
    let mut buf = vec![0u8; 8 * N];
    s.read_exact(&mut buf).map_err(fault)?;
    let mut out = [0u64; N];
    for (o, w) in out.iter_mut().zip(words(&buf)) {
        *o = w;
    }
    Ok(out)
}

fn read_text(mut s: impl Read, len: u64) -> std::result::Result<String, Fault> {
    if len > MAX_TEXT {
        return Err(Fault::Broken(format!(
            "a message of {len} bytes (at most {MAX_TEXT}): not this protocol"
        )));
    }
    let mut buf = vec![0u8; len as usize];
    s.read_exact(&mut buf).map_err(fault)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// This host's name (the kernel's): what tells the ranks of one node apart from the
/// others' (node groups, and zero-bench's choice of GPU).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// This host's IPv4 addresses other than loopback (`getifaddrs`).
fn interface_ipv4s() -> Vec<std::net::Ipv4Addr> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: on success getifaddrs points `head` at a list that we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut node = head;
    while !node.is_null() {
        // SAFETY: `node` is a live entry of that list (freed only after the loop).
        let ifa = unsafe { &*node };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points at a sockaddr of its family.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && !ip.is_unspecified() {
                    out.push(ip);
                }
            }
        }
        node = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// How the others should reach rank 0 through its rendezvous file: its host name, or
/// `ZERO_RENDEZVOUS_HOST` where that does not resolve on the other nodes.
fn advertised_host() -> String {
    match std::env::var("ZERO_RENDEZVOUS_HOST") {
        Ok(h) if !h.trim().is_empty() => h.trim().to_string(),
        _ => host_name(),
    }
}

impl SocketComm {
    /// Join the world `rv` describes (collective over the processes of the launch): rank
    /// 0 listens and waits for all the others; the others connect. A world of one opens
    /// nothing.
    pub fn connect(rv: &Rendezvous, config: &CommConfig) -> Result<SocketComm> {
        let err = |detail: String| CommError::Rendezvous {
            rank: rv.rank,
            at: rv.address.to_string(),
            detail,
        };
        if rv.size == 0 || rv.rank >= rv.size {
            return Err(err(format!(
                "rank {} of a world of {}: the rank must be below the size",
                rv.rank, rv.size
            )));
        }
        if rv.size > MAX_WORLD_SIZE {
            return Err(err(format!(
                "a world of {} ranks: a TCP world has at most {MAX_WORLD_SIZE}; give the number of processes launched (ZERO_WORLD_SIZE)",
                rv.size
            )));
        }
        // Said with a timeout: launchers that disagree about the size are a likely cause.
        let note = environment_note(rv);
        let links = if rv.size == 1 {
            Vec::new()
        } else if rv.rank == 0 {
            let listener = listen(&rv.address).map_err(err)?;
            Self::gather_peers(listener, rv, &note).map_err(err)?
        } else {
            vec![Self::join_any(rv, &[], &note).map_err(err)?]
        };
        if rv.size > 1 {
            // Messages and aborts name the rank, as under MPI (`exit.rs`).
            crate::exit::WORLD_RANK.store(rv.rank, std::sync::atomic::Ordering::Relaxed);
        }
        let group = Group {
            rank: rv.rank,
            size: rv.size,
            world_rank: rv.rank,
            name: WORLD.into(),
            join_timeout: rv.timeout,
        };
        Self::from_links(group, links, config).map_err(err)
    }

    /// A communicator over joined links (rank 0: one per peer; the others: one to 0).
    fn from_links(
        group: Group,
        links: Vec<TcpStream>,
        config: &CommConfig,
    ) -> std::result::Result<SocketComm, String> {
        let Group {
            rank,
            size,
            world_rank,
            name,
            join_timeout,
        } = group;
        for l in &links {
            l.set_nodelay(true)
                .map_err(|e| format!("setting TCP_NODELAY: {e}"))?;
            // A write to a stopped peer blocks once the socket buffers are full: bound it
            // as reads are, or a stopped rank could hold its peer forever.
            l.set_write_timeout(config.timeout)
                .map_err(|e| format!("setting the write timeout: {e}"))?;
        }
        Ok(SocketComm {
            rank,
            size,
            world_rank,
            name,
            join_timeout,
            links,
            seq: Cell::new(0),
            counters: Counters::default(),
            half_sum: Cell::new(config.half_sum),
            timeout: config.timeout,
            broken: RefCell::new(None),
            inputs: RefCell::new(Vec::new()),
            result: Cell::new(Vec::new()),
        })
    }

    /// Rank 0: listen, publish the address (file mode), accept every other rank's hello,
    /// then answer all of them at once. `note` is appended to a timeout's message.
    fn gather_peers(
        listener: TcpListener,
        rv: &Rendezvous,
        note: &str,
    ) -> std::result::Result<Vec<TcpStream>, String> {
        let mut published = None;
        if let Address::File(path) = &rv.address {
            let port = listener
                .local_addr()
                .map_err(|e| format!("the listening port: {e}"))?
                .port();
            // Its name first, then its IPv4 addresses, for a name that does not resolve
            // on the other nodes (the others try each in turn).
            let mut candidates = vec![advertised_host()];
            candidates.extend(interface_ipv4s().iter().map(|ip| ip.to_string()));
            candidates.dedup();
            let addr = candidates
                .iter()
                .map(|c| format!("{c}:{port}"))
                .collect::<Vec<_>>()
                .join(",");
            let file = rendezvous_file(path, &rv.token);
            publish(&file, &addr, port, &rv.token)?;
            log::debug!(
                "rank 0: TCP world listening on {addr} (written to {})",
                file.display()
            );
            published = Some((file, addr));
        }
        let joined = Self::accept_all(&listener, rv, note);
        if let Some((file, addr)) = published {
            // Once everyone is in (or the wait failed), a later run must not find it;
            // only ours (a launch without a token may share the path).
            if read_published(&file, &rv.token).as_deref() == Some(addr.as_str()) {
                let _ = std::fs::remove_file(file);
            }
        }
        let mut links = joined?;
        for s in &mut links {
            s.set_write_timeout(Some(HELLO_WAIT))
                .and_then(|()| s.write_all(&to_bytes(&[0, 0])))
                .map_err(|e| format!("answering a joined rank: {e}"))?;
        }
        Ok(links)
    }

    fn accept_all(
        listener: &TcpListener,
        rv: &Rendezvous,
        note: &str,
    ) -> std::result::Result<Vec<TcpStream>, String> {
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("listening: {e}"))?;
        let deadline = Instant::now() + rv.timeout;
        let mut slots: Vec<Option<TcpStream>> = (1..rv.size).map(|_| None).collect();
        let refuse = |slots: &mut Vec<Option<TcpStream>>, why: &str| {
            for s in slots.iter_mut().flatten() {
                let _ = s.write_all(&to_bytes(&[1, why.len() as u64]));
                let _ = s.write_all(why.as_bytes());
            }
            why.to_string()
        };
        while slots.iter().any(Option::is_none) {
            let (mut stream, from) = match listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(i, _)| (i + 1).to_string())
                            .collect();
                        let why = format!(
                            "rank(s) {} did not join within {:.0} s (ZERO_RENDEZVOUS_TIMEOUT); were they started, with the same ZERO_RENDEZVOUS, and can they reach this host?{note}",
                            missing.join(", "),
                            rv.timeout.as_secs_f64()
                        );
                        return Err(refuse(&mut slots, &why));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(refuse(&mut slots, &format!("accepting: {e}"))),
            };
            let hello = (|| -> std::result::Result<(usize, usize, String), String> {
                stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                stream
                    .set_write_timeout(Some(HELLO_WAIT))
                    .map_err(|e| e.to_string())?;
                stream
                    .set_read_timeout(Some(HELLO_WAIT))
                    .map_err(|e| e.to_string())?;
                let [magic, version, rank, size, len] =
                    read_words::<5>(&mut stream).map_err(|_| "no hello".to_string())?;
                if magic != MAGIC || version != VERSION {
                    return Err("not a zero-rs rank of this version".into());
                }
                let token = read_text(&mut stream, len).map_err(|_| "no token".to_string())?;
                Ok((rank as usize, size as usize, token))
            })();
            let (rank, size, token) = match hello {
                Ok(h) => h,
                Err(why) => {
                    log::warn!("rank 0: TCP world: dropped a connection from {from}: {why}");
                    continue;
                }
            };
            if token != rv.token {
                log::warn!(
                    "rank 0: TCP world: dropped a connection from {from}: another job's (token '{token}', ours '{}')",
                    rv.token
                );
                let why = "rank 0 there belongs to another job (a different token)";
                let _ = stream.write_all(&to_bytes(&[1, why.len() as u64]));
                let _ = stream.write_all(why.as_bytes());
                continue;
            }
            if size != rv.size || rank == 0 || rank >= rv.size || slots[rank - 1].is_some() {
                let why = if size != rv.size {
                    format!("rank {rank} (at {from}) says the world has {size} ranks, rank 0 says {}: give every process the same size", rv.size)
                } else {
                    format!("a second process (at {from}) claims rank {rank}: every process needs its own rank below {}", rv.size)
                };
                let _ = stream.write_all(&to_bytes(&[1, why.len() as u64]));
                let _ = stream.write_all(why.as_bytes());
                return Err(refuse(&mut slots, &why));
            }
            let _ = stream.set_read_timeout(None);
            slots[rank - 1] = Some(stream);
        }
        Ok(slots.into_iter().flatten().collect())
    }

    /// Ranks above 0: find rank 0 (wait for the file; or try each of `targets`,
    /// `host:port`, in turn instead of `rv`'s address when any are given), connect
    /// (retrying while it is not listening yet), say hello, and wait for everyone to have
    /// joined. `note` is appended to a timeout's message.
    fn join_any(
        rv: &Rendezvous,
        targets: &[String],
        note: &str,
    ) -> std::result::Result<TcpStream, String> {
        let deadline = Instant::now() + rv.timeout;
        let late = |what: &str| {
            format!(
                "{what} within {:.0} s (ZERO_RENDEZVOUS_TIMEOUT); is rank 0 running, with the same ZERO_RENDEZVOUS?{note}",
                rv.timeout.as_secs_f64()
            )
        };
        let mut last = String::new();
        let mut stream = loop {
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} (last: {last})",
                    late("rank 0 could not be reached")
                ));
            }
            let target = match &rv.address {
                _ if !targets.is_empty() => Some(targets.join(",")),
                Address::Tcp { host, port } if host.contains(':') => {
                    Some(format!("[{host}]:{port}"))
                }
                Address::Tcp { host, port } => Some(format!("{host}:{port}")),
                Address::File(path) => read_published(&rendezvous_file(path, &rv.token), &rv.token),
            };
            let Some(target) = target else {
                if let Address::File(path) = &rv.address {
                    last = format!(
                        "rank 0's file {} is not there yet",
                        rendezvous_file(path, &rv.token).display()
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let mut addrs: Vec<SocketAddr> = Vec::new();
            for t in target.split(',') {
                match t.to_socket_addrs() {
                    Ok(a) => addrs.extend(a),
                    Err(e) => last = format!("resolving {t}: {e}"),
                }
            }
            if addrs.is_empty() {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
            let connected = addrs.iter().find_map(|a| {
                TcpStream::connect_timeout(a, Duration::from_secs(5))
                    .map_err(|e| last = format!("connecting to {a}: {e}"))
                    .ok()
            });
            match connected {
                Some(s) => break s,
                None => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        let mut hello = to_bytes(&[
            MAGIC,
            VERSION,
            rv.rank as u64,
            rv.size as u64,
            rv.token.len() as u64,
        ]);
        hello.extend_from_slice(rv.token.as_bytes());
        stream
            .set_write_timeout(Some(HELLO_WAIT))
            .and_then(|()| stream.write_all(&hello))
            .map_err(|e| format!("saying hello to rank 0: {e}"))?;
        let left = deadline.saturating_duration_since(Instant::now()) + VERDICT_SLACK;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| e.to_string())?;
        let answer = read_words::<2>(&mut stream).map_err(|f| match f {
            Fault::Silent => late("not every rank joined"),
            Fault::Broken(why) => format!("rank 0 hung up before everyone joined: {why}"),
        })?;
        match answer {
            [0, _] => {
                stream.set_read_timeout(None).map_err(|e| e.to_string())?;
                Ok(stream)
            }
            [_, len] => Err(format!(
                "rank 0 refused: {}",
                read_text(&mut stream, len).unwrap_or_else(|_| "(no reason given)".into())
            )),
        }
    }

    /// The node and cross-node groups of this world (collective; see `nodes.rs`): nodes
    /// of `ranks_per_node` consecutive ranks, or (`None`) the ranks that share a host
    /// name. Each group is a star of its own, its lowest rank the hub, joined through
    /// this world (the hub listens on a free port and its address is all-gathered here).
    pub fn node_groups(&self, ranks_per_node: Option<usize>) -> Result<NodeGroups<SocketComm>> {
        let n = self.size;
        let nodes_err = |detail: String| CommError::Nodes {
            rank: self.world_rank,
            comm: self.name.clone(),
            detail,
        };
        // Every rank must divide the same way, or their splits would wait on each other.
        let asked = ranks_per_node.map_or(-1, |l| l as i64);
        let mut all_asked = vec![0i64; n];
        self.all_gather(&[asked][..], &mut all_asked[..])?;
        if let Some(r) = all_asked.iter().position(|&a| a != asked) {
            let says = |a: i64| {
                if a < 0 {
                    "host names".to_string()
                } else {
                    format!("{a} ranks per node")
                }
            };
            return Err(nodes_err(format!(
                "this rank divides by {} but rank {r} by {}: give every rank the same ranks per node",
                says(asked),
                says(all_asked[r])
            )));
        }
        let node_of: Vec<i64> = match ranks_per_node {
            Some(l) => {
                if l == 0 || !n.is_multiple_of(l) {
                    return Err(nodes_err(format!(
                        "{l} ranks per node does not divide the {n} ranks into equal nodes; give a positive divisor of {n}, or none to find the nodes"
                    )));
                }
                (0..n).map(|r| (r / l) as i64).collect()
            }
            None => {
                let names = self.all_host_names()?;
                names
                    .iter()
                    .map(|h| names.iter().position(|x| x == h).unwrap_or(0) as i64)
                    .collect()
            }
        };
        let l = crate::nodes::ranks_per_node(&node_of).map_err(|e| {
            nodes_err(if ranks_per_node.is_some() {
                e
            } else {
                format!("nodes by host name: {e}")
            })
        })?;
        let (m, j) = (self.rank / l, self.rank % l);
        let node = self.split(format!("node[{m}]"), m * l, j, l)?;
        let cross = self.split(format!("cross[{j}]"), j, m, n / l)?;
        Ok(NodeGroups { node, cross })
    }

    /// Where this host may be reached from the others, best first: the address of the
    /// world's connection (unless loopback), this host's other IPv4 addresses, its name.
    fn reachable_candidates(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |c: String| {
            if !out.contains(&c) {
                out.push(c);
            }
        };
        if let Some(Ok(a)) = self.links.first().map(TcpStream::local_addr) {
            if let std::net::IpAddr::V4(ip) = a.ip() {
                if !ip.is_loopback() && !ip.is_unspecified() {
                    add(ip.to_string());
                }
            }
        }
        for ip in interface_ipv4s() {
            add(ip.to_string());
        }
        add(host_name());
        out
    }

    /// (this rank's rank among the ranks on its host, how many there are), from every
    /// rank's host name (collective).
    pub fn host_local(&self) -> Result<(usize, usize)> {
        let names = self.all_host_names()?;
        let mine = &names[self.rank];
        let local = names[..self.rank].iter().filter(|n| *n == mine).count();
        let count = names.iter().filter(|n| *n == mine).count();
        Ok((local, count))
    }

    /// Every rank's host name, in rank order (collective).
    fn all_host_names(&self) -> Result<Vec<Vec<u8>>> {
        const NAME_BYTES: usize = 256;
        let mut mine = [0u8; NAME_BYTES];
        let host = host_name();
        let k = host.len().min(NAME_BYTES);
        mine[..k].copy_from_slice(&host.as_bytes()[..k]);
        let mut all = vec![0u8; NAME_BYTES * self.size];
        self.all_gather(&mine[..], &mut all[..])?;
        Ok(all.chunks(NAME_BYTES).map(<[u8]>::to_vec).collect())
    }

    /// This rank's group `name`, of `size` ranks whose hub is world rank `hub` and in
    /// which this rank is `rank` (collective over this whole communicator: every rank
    /// calls it once for its own group).
    fn split(&self, name: String, hub: usize, rank: usize, size: usize) -> Result<SocketComm> {
        const ADDR_BYTES: usize = 512;
        let fail = |detail: String| CommError::Rendezvous {
            rank: self.world_rank,
            at: name.clone(),
            detail,
        };
        // The hubs listen and publish where they may be reached; the others' slots stay
        // empty. A hub's failure is reported after the all-gather, which every rank must
        // reach (its members then find its slot empty).
        let listener: Option<std::result::Result<(TcpListener, u16), String>> =
            (rank == 0 && size > 1).then(|| {
                let l = listen(&Address::Tcp {
                    host: String::new(),
                    port: 0,
                })?;
                let port = l
                    .local_addr()
                    .map_err(|e| format!("the listening port: {e}"))?
                    .port();
                Ok((l, port))
            });
        let mut mine = [0u8; ADDR_BYTES];
        if let Some(Ok((_, port))) = &listener {
            // Candidates, best first: the address the world's connection uses, this
            // host's other addresses, its name. (A name may resolve to a loopback address
            // on its own host, and an address on one network may not route from another.)
            let mut text = String::new();
            for c in self.reachable_candidates() {
                let item = format!("{c}:{port}");
                if text.len() + item.len() + 1 > ADDR_BYTES {
                    break;
                }
                if !text.is_empty() {
                    text.push(',');
                }
                text.push_str(&item);
            }
            mine[..text.len()].copy_from_slice(text.as_bytes());
        }
        let mut all = vec![0u8; ADDR_BYTES * self.size];
        let seq = self.seq.get();
        self.all_gather(&mine[..], &mut all[..])?;
        let config = CommConfig {
            timeout: self.timeout,
            half_sum: self.half_sum.get(),
            ..CommConfig::default()
        };
        let links = if size == 1 {
            Vec::new()
        } else {
            if let Some(Err(e)) = &listener {
                return Err(fail(e.clone()));
            }
            let text = &all[hub * ADDR_BYTES..(hub + 1) * ADDR_BYTES];
            let text = String::from_utf8_lossy(text)
                .trim_end_matches('\0')
                .to_string();
            let targets: Vec<String> = text
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect();
            if targets.is_empty() {
                return Err(fail(format!(
                    "world rank {hub}, its hub, could not listen (its error says why)"
                )));
            }
            let rv = Rendezvous {
                rank,
                size,
                // (Only the port and the messages use this: the targets are tried.)
                address: Address::Tcp {
                    host: targets[0].clone(),
                    port: 0,
                },
                // One group of one split of this world: never another's.
                token: format!("{name}@{}#{seq}", self.name),
                timeout: self.join_timeout,
            };
            match listener {
                Some(Ok((l, _))) => Self::gather_peers(l, &rv, "").map_err(&fail)?,
                Some(Err(e)) => return Err(fail(e)),
                None => vec![Self::join_any(&rv, &targets, "").map_err(&fail)?],
            }
        };
        let group = Group {
            rank,
            size,
            world_rank: self.world_rank,
            name: name.clone(),
            join_timeout: self.join_timeout,
        };
        Self::from_links(group, links, &config).map_err(fail)
    }

    /// Number of collectives issued so far on this communicator.
    pub fn sequence(&self) -> u64 {
        self.seq.get()
    }

    fn poisoned(&self, seq: u64, op: &'static str) -> Option<CommError> {
        self.broken
            .borrow()
            .as_ref()
            .map(|(by, reason)| CommError::Poisoned {
                rank: self.world_rank,
                comm: self.name.clone(),
                seq,
                op,
                by: *by,
                reason: reason.clone(),
            })
    }

    fn link_error(&self, seq: u64, op: &'static str, peer: usize, f: Fault) -> CommError {
        self.links_error(seq, op, &[peer], f)
    }

    /// As [`SocketComm::link_error`], naming every peer that stayed silent.
    fn links_error(&self, seq: u64, op: &'static str, peers: &[usize], f: Fault) -> CommError {
        let peer = peers.first().copied().unwrap_or(0);
        // Ranks above 0 wait for rank 0 longer than the timeout (for its verdict).
        let slack = if self.rank == 0 {
            Duration::ZERO
        } else {
            VERDICT_SLACK
        };
        let err = match f {
            Fault::Broken(cause) => CommError::Link {
                rank: self.world_rank,
                comm: self.name.clone(),
                seq,
                op,
                peer,
                cause,
            },
            Fault::Silent => CommError::Timeout {
                rank: self.world_rank,
                comm: self.name.clone(),
                seq,
                op,
                waited_s: self.timeout.map_or(0.0, |t| (t + slack).as_secs_f64()),
                missing: peers.to_vec(),
            },
        };
        *self.broken.borrow_mut() = Some((self.rank, err.to_string()));
        err
    }

    /// What this rank's call sends to rank 0 (rank 0: its own input): `(address, bytes)`.
    fn input_of(&self, call: &RawCall) -> (*const u8, usize) {
        let es = call.dtype.size_bytes();
        match call.kind {
            CollectiveKind::Barrier => (std::ptr::null(), 0),
            CollectiveKind::Broadcast if call.root != self.rank => (std::ptr::null(), 0),
            CollectiveKind::AllGather if call.send.is_none() => {
                let block = call.recv.len / self.size;
                let off = self.rank * block * es;
                (call.recv.ptr.wrapping_add(off) as *const u8, block * es)
            }
            _ => {
                let b = call.send.unwrap_or(call.recv);
                (b.ptr as *const u8, b.len * es)
            }
        }
    }

    /// The bytes rank `r` receives as its output (what rank 0 sends it).
    fn output_bytes(&self, call: &RawCall, r: usize) -> usize {
        let es = call.dtype.size_bytes();
        match call.kind {
            CollectiveKind::Barrier => 0,
            CollectiveKind::Broadcast if call.root == r => 0,
            _ => call.recv.len * es,
        }
    }

    /// Ranks above 0: send the input, receive the output.
    ///
    /// # Safety
    /// As [`Communicator::execute`].
    unsafe fn exchange_with_root(&self, call: &RawCall, fp: &[i64; FIELDS]) -> Result<()> {
        let seq = fp[0] as u64;
        let op = call.kind.name();
        let mut link: &TcpStream = &self.links[0];
        let (ptr, len) = self.input_of(call);
        let mut header: Vec<u64> = fp.iter().map(|&x| x as u64).collect();
        header.push(len as u64);
        let sent = (|| -> io::Result<()> {
            link.write_all(&to_bytes(&header))?;
            if len > 0 {
                // SAFETY: the input is valid for `len` bytes (execute's contract).
                link.write_all(std::slice::from_raw_parts(ptr, len))?;
            }
            Ok(())
        })();
        if let Err(e) = sent {
            // Rank 0 may have failed this call and hung up after saying why: prefer that.
            return Err(self
                .pending_verdict(seq, op)
                .unwrap_or_else(|| self.link_error(seq, op, 0, fault(e))));
        }
        // Rank 0 gives up on a silent peer after the timeout; we wait a little longer,
        // for its verdict.
        let _ = link.set_read_timeout(self.timeout.map(|t| t + VERDICT_SLACK));
        let read = |link: &mut &TcpStream, buf: &mut [u8]| link.read_exact(buf).map_err(fault);
        let mut answer = [0u8; 16];
        read(&mut link, &mut answer).map_err(|f| self.link_error(seq, op, 0, f))?;
        let [status, bytes]: [u64; 2] = {
            let mut w = words(&answer);
            [w.next().unwrap_or(0), w.next().unwrap_or(0)]
        };
        if status != 0 {
            let text = read_text(link, bytes).map_err(|f| self.link_error(seq, op, 0, f))?;
            return Err(self.verdict(seq, op, status, &text));
        }
        let want = self.output_bytes(call, self.rank);
        if bytes as usize != want {
            return Err(self.link_error(
                seq,
                op,
                0,
                Fault::Broken(format!(
                    "rank 0 sent {bytes} bytes where this rank expects {want}"
                )),
            ));
        }
        if want > 0 {
            // SAFETY: `recv` is writable for its length (contract); `want` is its bytes.
            let out = std::slice::from_raw_parts_mut(call.recv.ptr, want);
            read(&mut link, out).map_err(|f| self.link_error(seq, op, 0, f))?;
        }
        Ok(())
    }

    /// Ranks above 0, after a write to rank 0 failed: rank 0's failure answer, when it
    /// sent one before it hung up (read within a short wait).
    fn pending_verdict(&self, seq: u64, op: &'static str) -> Option<CommError> {
        let link: &TcpStream = self.links.first()?;
        link.set_read_timeout(Some(Duration::from_millis(200)))
            .ok()?;
        let [status, bytes] = read_words::<2>(link).ok()?;
        if status == 0 {
            return None;
        }
        let text = read_text(link, bytes).ok()?;
        Some(self.verdict(seq, op, status, &text))
    }

    /// Ranks above 0: the error of rank 0's failure answer (`status` 1: a mismatch,
    /// `rank_b`, `call_a`, `call_b` as lines; else the group failed: the failing rank and
    /// the reason), remembering a failure so that later calls are refused.
    fn verdict(&self, seq: u64, op: &'static str, status: u64, text: &str) -> CommError {
        let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
        if status == 1 {
            let (call_a, call_b) = rest.split_once('\n').unwrap_or((rest, ""));
            return CommError::Mismatch {
                rank: self.world_rank,
                comm: self.name.clone(),
                seq,
                rank_a: 0,
                call_a: call_a.to_string(),
                rank_b: first.parse().unwrap_or(0),
                call_b: call_b.to_string(),
            };
        }
        let by = first.parse().unwrap_or(0);
        let reason = rest.trim_end().to_string();
        *self.broken.borrow_mut() = Some((by, reason.clone()));
        CommError::Poisoned {
            rank: self.world_rank,
            comm: self.name.clone(),
            seq,
            op,
            by,
            reason,
        }
    }

    /// Rank 0: wait until every peer has something to read (or hung up), at most the
    /// timeout; the first peer that is silent for the whole wait is `Err`.
    fn wait_readable(&self) -> std::result::Result<(), (Vec<usize>, Fault)> {
        let deadline = self.timeout.map(|t| Instant::now() + t);
        let mut pending: Vec<usize> = (1..self.size).collect();
        while !pending.is_empty() {
            let mut fds: Vec<libc::pollfd> = pending
                .iter()
                .map(|&r| libc::pollfd {
                    fd: self.links[r - 1].as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            let slice = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if slice.is_zero() {
                return Err((pending, Fault::Silent));
            }
            let ms = slice.as_millis().clamp(1, 1000) as libc::c_int;
            // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err((vec![pending[0]], Fault::Broken(format!("poll: {e}"))));
            }
            let ready: Vec<bool> = fds.iter().map(|f| f.revents != 0).collect();
            let mut i = 0;
            pending.retain(|_| {
                let keep = !ready[i];
                i += 1;
                keep
            });
        }
        Ok(())
    }

    /// Rank 0: tell every peer the collective failed (best effort), and remember it.
    fn fail_all(&self, status: u64, text: &str) {
        let mut msg = to_bytes(&[status, text.len() as u64]);
        msg.extend_from_slice(text.as_bytes());
        for mut l in &self.links {
            let _ = l.write_all(&msg);
        }
    }

    /// Rank 0: gather, check, combine, answer.
    ///
    /// # Safety
    /// As [`Communicator::execute`].
    unsafe fn serve(&self, call: &RawCall, fp: &[i64; FIELDS], upcast: bool) -> Result<()> {
        let seq = fp[0] as u64;
        let op = call.kind.name();
        let mut inputs = self.inputs.borrow_mut();
        inputs.resize_with(self.size - 1, Vec::new);
        let mut fps = Vec::with_capacity(self.size - 1);
        let mut lens = Vec::with_capacity(self.size - 1);
        let gathered = (|| -> std::result::Result<(), (Vec<usize>, Fault)> {
            self.wait_readable()?;
            for r in 1..self.size {
                let mut link = &self.links[r - 1];
                let _ = link.set_read_timeout(self.timeout);
                let mut header = vec![0u8; 8 * (FIELDS + 1)];
                link.read_exact(&mut header)
                    .map_err(|e| (vec![r], fault(e)))?;
                let w: Vec<u64> = words(&header).collect();
                let len = w[FIELDS] as usize;
                // Reused between calls: only growth is zero-filled (the read overwrites).
                let buf = &mut inputs[r - 1];
                buf.resize(len.div_ceil(8), 0);
                let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(buf)[..len];
                link.read_exact(bytes).map_err(|e| (vec![r], fault(e)))?;
                fps.push(w[..FIELDS].iter().map(|&x| x as i64).collect::<Vec<i64>>());
                lens.push(len);
            }
            Ok(())
        })();
        if let Err((peers, f)) = gathered {
            let e = self.links_error(seq, op, &peers, f);
            self.fail_all(2, &format!("0\n{e}"));
            return Err(e);
        }
        // The check: the same call everywhere (the input lengths follow from it, except
        // for the block of an in-place all-gather, compared too).
        let (_, mine) = self.input_of(call);
        // (A broadcast's inputs are the root's buffer and nothing from the others.)
        let mismatch = fps.iter().zip(&lens).enumerate().find(|(_, (f, &len))| {
            f.as_slice() != fp.as_slice() || (len != mine && call.kind != CollectiveKind::Broadcast)
        });
        if let Some((i, (f, &len))) = mismatch {
            let (mut a, mut b) = (describe(fp), describe(f));
            if f.as_slice() == fp.as_slice() {
                a.push_str(&format!(" with a {mine}-byte input"));
                b.push_str(&format!(" with a {len}-byte input"));
            }
            self.fail_all(1, &format!("{}\n{a}\n{b}", i + 1));
            return Err(CommError::Mismatch {
                rank: self.world_rank,
                comm: self.name.clone(),
                seq,
                rank_a: 0,
                call_a: a,
                rank_b: i + 1,
                call_b: b,
            });
        }
        let (my_ptr, _) = self.input_of(call);
        let all: Vec<&[u8]> = std::iter::once(if mine == 0 {
            &[][..]
        } else {
            // SAFETY: our input is valid for `mine` bytes (contract), and nothing writes
            // our buffers until the combined result is computed.
            std::slice::from_raw_parts(my_ptr, mine)
        })
        .chain(
            inputs
                .iter()
                .zip(&lens)
                .map(|(b, &l)| &bytemuck::cast_slice::<u64, u8>(b)[..l]),
        )
        .collect();
        let answered = self.combine_and_answer(call, &all, upcast);
        if let Err((peer, f)) = answered {
            let e = self.link_error(seq, op, peer, f);
            self.fail_all(2, &format!("0\n{e}"));
            return Err(e);
        }
        Ok(())
    }

    /// Rank 0: compute every rank's output from `all` (the inputs in rank order, as bytes)
    /// and send it; write our own. An error names the peer whose link failed.
    ///
    /// # Safety
    /// As [`Communicator::execute`]; `all[0]` may alias our own `recv` (in place).
    unsafe fn combine_and_answer(
        &self,
        call: &RawCall,
        all: &[&[u8]],
        upcast: bool,
    ) -> std::result::Result<(), (usize, Fault)> {
        let es = call.dtype.size_bytes();
        let n = self.size;
        let recv_bytes = call.recv.len * es;
        let send = |r: usize, parts: &[&[u8]]| -> std::result::Result<(), (usize, Fault)> {
            let total: usize = parts.iter().map(|p| p.len()).sum();
            let mut link = &self.links[r - 1];
            (|| -> io::Result<()> {
                link.write_all(&to_bytes(&[0, total as u64]))?;
                for p in parts {
                    link.write_all(p)?;
                }
                Ok(())
            })()
            .map_err(|e| (r, fault(e)))
        };
        // SAFETY (for `own`): `recv` is writable for its length (contract); taken only
        // after every read of `all[0]` that it may alias.
        let own = || -> &mut [u8] {
            if recv_bytes == 0 {
                &mut []
            } else {
                std::slice::from_raw_parts_mut(call.recv.ptr, recv_bytes)
            }
        };
        match call.kind {
            CollectiveKind::Barrier => {
                for r in 1..n {
                    send(r, &[])?;
                }
            }
            CollectiveKind::Broadcast => {
                let data = all[call.root];
                for r in 1..n {
                    // The root has the data: it is told only that the call is done.
                    let parts: &[&[u8]] = if r == call.root { &[] } else { &[data] };
                    send(r, parts)?;
                }
                if call.root != 0 && recv_bytes > 0 {
                    own().copy_from_slice(data);
                }
            }
            CollectiveKind::AllGather => {
                for r in 1..n {
                    send(r, all)?;
                }
                let block = recv_bytes / n;
                for (q, part) in all.iter().enumerate() {
                    if (q > 0 || call.send.is_some()) && block > 0 {
                        // SAFETY: block q of `recv` is in bounds (`recv` is n blocks) and
                        // overlaps no input we read here: in place, our input is block 0,
                        // skipped; the peers' inputs are our own buffers.
                        std::ptr::copy_nonoverlapping(
                            part.as_ptr(),
                            call.recv.ptr.add(q * block),
                            block,
                        );
                    }
                }
            }
            CollectiveKind::AllToAll => {
                let block = recv_bytes / n;
                for r in 1..n {
                    let parts: Vec<&[u8]> =
                        all.iter().map(|p| &p[r * block..(r + 1) * block]).collect();
                    send(r, &parts)?;
                }
                let out = own();
                for (q, part) in all.iter().enumerate() {
                    out[q * block..(q + 1) * block].copy_from_slice(&part[..block]);
                }
            }
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
                let full = all[0].len();
                let mut result = self.result.take();
                let reduced = reduce_bytes(call, all, upcast, &mut result, full);
                let outcome = (|| {
                    let reduced = match reduced {
                        Ok(r) => r,
                        Err(why) => {
                            return Err((0, Fault::Broken(why)));
                        }
                    };
                    if call.kind == CollectiveKind::AllReduce {
                        for r in 1..n {
                            send(r, &[reduced])?;
                        }
                        if recv_bytes > 0 {
                            own().copy_from_slice(reduced);
                        }
                    } else {
                        for r in 1..n {
                            send(r, &[&reduced[r * recv_bytes..(r + 1) * recv_bytes]])?;
                        }
                        if recv_bytes > 0 {
                            own().copy_from_slice(&reduced[..recv_bytes]);
                        }
                    }
                    Ok(())
                })();
                self.result.set(result);
                outcome?;
            }
        }
        Ok(())
    }
}

/// `b` as elements of `T` (an empty input may sit at any address).
fn cast<T: bytemuck::Pod>(b: &[u8]) -> std::result::Result<&[T], String> {
    if b.is_empty() {
        return Ok(&[]);
    }
    bytemuck::try_cast_slice::<u8, T>(b).map_err(|e| format!("input layout: {e}"))
}

/// The rank-order reduction of `all` (bytes of `full` each) into `scratch`, as bytes.
fn reduce_bytes<'a>(
    call: &RawCall,
    all: &[&[u8]],
    upcast: bool,
    scratch: &'a mut Vec<u64>,
    full: usize,
) -> std::result::Result<&'a [u8], String> {
    let op = call.op.unwrap_or(ReduceOp::Sum);
    fn typed<T: Elem>(
        all: &[&[u8]],
        op: ReduceOp,
        scratch: &mut Vec<u64>,
        full: usize,
    ) -> std::result::Result<(), String> {
        let ins: Vec<&[T]> = all
            .iter()
            .map(|b| cast::<T>(b))
            .collect::<std::result::Result<_, _>>()?;
        let n = full / std::mem::size_of::<T>();
        fold_into(&ins, scratch_as::<T>(scratch, n), op);
        Ok(())
    }
    fn halves<H: Half>(
        all: &[&[u8]],
        scratch: &mut Vec<u64>,
        full: usize,
    ) -> std::result::Result<(), String> {
        let ins: Vec<&[H]> = all
            .iter()
            .map(|b| cast::<H>(b))
            .collect::<std::result::Result<_, _>>()?;
        let n = full / std::mem::size_of::<H>();
        let mut acc = vec![0f32; n];
        reduce::fold_upcast(&ins, &mut acc);
        reduce::narrow(&acc, scratch_as::<H>(scratch, n));
        Ok(())
    }
    match call.dtype {
        DType::F32 => typed::<f32>(all, op, scratch, full),
        DType::F64 => typed::<f64>(all, op, scratch, full),
        DType::BF16 if upcast => halves::<bf16>(all, scratch, full),
        DType::BF16 => typed::<bf16>(all, op, scratch, full),
        DType::F16 if upcast => halves::<f16>(all, scratch, full),
        DType::F16 => typed::<f16>(all, op, scratch, full),
        DType::U8 => typed::<u8>(all, op, scratch, full),
        DType::U32 => typed::<u32>(all, op, scratch, full),
        DType::I32 => typed::<i32>(all, op, scratch, full),
        DType::I64 => typed::<i64>(all, op, scratch, full),
    }?;
    Ok(&bytemuck::cast_slice::<u64, u8>(scratch)[..full])
}

/// Rank 0's listening socket for `address`: its port on every interface (of the family
/// the others use), or a free port for a file.
fn listen(address: &Address) -> std::result::Result<TcpListener, String> {
    let port = match address {
        Address::Tcp { port, .. } => *port,
        Address::File(_) => 0,
    };
    let any = match address {
        Address::Tcp { host, .. } if host.parse::<std::net::Ipv6Addr>().is_ok() => "::",
        _ => "0.0.0.0",
    };
    TcpListener::bind((any, port)).map_err(|e| {
        format!(
            "rank 0 cannot listen on port {port}: {e}{}",
            if port > 0 {
                " (give another port, or file:PATH to let rank 0 pick a free one)"
            } else {
                ""
            }
        )
    })
}

/// The file of a `file:PATH` rendezvous: PATH itself without a token, else PATH with the
/// token appended (`PATH.slurm-77.0.0`), so that concurrent launches sharing PATH (srun
/// steps of one job, a requeued job) never meet in one file.
pub fn rendezvous_file(path: &Path, token: &str) -> PathBuf {
    if token.is_empty() {
        return path.to_path_buf();
    }
    let tag: String = token
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_os_string());
    name.push(format!(".{tag}"));
    path.with_file_name(name)
}

/// Rank 0 (file mode): write `addr` (`host:port,...`, all on `port`) and the token into
/// `path`, atomically, but never over the file of a rank 0 that still waits there: two
/// launches with one path and one token (nothing names their launches) would otherwise
/// take each other's ranks. A file whose rank 0 no longer answers (a launch that died) is
/// replaced.
fn publish(path: &Path, addr: &str, port: u16, token: &str) -> std::result::Result<(), String> {
    let tmp = path.with_file_name(format!(
        ".{}.{}",
        path.file_name()
            .map_or("zero-rendezvous".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    let failed = |e: io::Error| {
        format!(
            "rank 0 cannot write the rendezvous file {}: {e} (give a path in a writable directory that every rank sees)",
            path.display()
        )
    };
    if let Err(e) = std::fs::write(&tmp, format!("{addr}\n{token}\n")) {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(e));
    }
    // A hard link creates `path` only where there is none, in one step (a check, then a
    // rename, would let two rank 0s both find it free).
    let placed = match std::fs::hard_link(&tmp, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match live_rank_0(path, port) {
            Some((at, theirs)) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(format!(
                    "the rendezvous file {} is in use: a rank 0 listening at {at} (token '{theirs}') still waits for its ranks there; give each launch its own {RENDEZVOUS_VAR} path or ZERO_RENDEZVOUS_TOKEN (or, if no such launch runs, remove the file)",
                    path.display()
                ));
            }
            None => {
                log::warn!(
                    "rank 0: replacing the rendezvous file {}: its rank 0 no longer answers (a launch that ended)",
                    path.display()
                );
                std::fs::rename(&tmp, path)
            }
        },
        // A file system without hard links: replace, as before.
        Err(_) => std::fs::rename(&tmp, path),
    };
    // (After a link both names remain; after a rename this finds nothing.)
    let _ = std::fs::remove_file(&tmp);
    placed.map_err(failed)
}

/// Whether the rank 0 that wrote the rendezvous file `path` still listens: (the address
/// that answered, the token in the file). Addresses on `our_port` are not tried: a dead
/// launch's port may be this rank 0's now, and it would answer itself.
fn live_rank_0(path: &Path, our_port: u16) -> Option<(String, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let theirs = lines.next()?.trim().to_string();
    let token = lines.next().unwrap_or("").to_string();
    let port_of = |t: &str| t.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
    theirs
        .split(',')
        .filter(|t| !t.is_empty() && port_of(t) != Some(our_port))
        .find(|t| {
            t.to_socket_addrs().is_ok_and(|mut addrs| {
                // Connecting and closing at once: its rank 0 drops a connection without a
                // hello and goes on waiting.
                addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_secs(1)).is_ok())
            })
        })
        .map(|t| (t.to_string(), token))
}

/// Ranks above 0 (file mode): rank 0's address, once the file names this job's token.
fn read_published(path: &Path, token: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let addr = lines.next()?.trim().to_string();
    (lines.next().unwrap_or("") == token && !addr.is_empty()).then_some(addr)
}

impl Communicator for SocketComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn world_rank(&self) -> usize {
        self.world_rank
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn stats(&self) -> CommStats {
        self.counters.snapshot()
    }
    fn reset_stats(&self) {
        self.counters.reset()
    }
    fn half_sum(&self) -> HalfSum {
        self.half_sum.get()
    }
    fn set_half_sum(&self, mode: HalfSum) {
        self.half_sum.set(mode)
    }

    unsafe fn execute(&self, call: &RawCall) -> Result<()> {
        let op = call.kind.name();
        for b in call.send.iter().chain(std::iter::once(&call.recv)) {
            if b.location != Location::Host {
                return Err(CommError::Location {
                    rank: self.world_rank,
                    op,
                    location: b.location,
                    backend: NAME,
                });
            }
            let (_, align) = layout(call.dtype);
            if b.len > 0 && (b.ptr.is_null() || !(b.ptr as usize).is_multiple_of(align)) {
                return Err(CommError::Size {
                    rank: self.world_rank,
                    op,
                    comm: self.name.clone(),
                    detail: format!("buffer at {:p} is not aligned for {}", b.ptr, call.dtype),
                });
            }
        }
        if call.kind == CollectiveKind::Broadcast && call.root >= self.size {
            return Err(CommError::Root {
                rank: self.world_rank,
                op,
                comm: self.name.clone(),
                root: call.root,
                size: self.size,
            });
        }
        let seq = self.seq.get();
        if let Some(e) = self.poisoned(seq, op) {
            return Err(e);
        }
        self.seq.set(seq + 1);
        let upcast = call.dtype.is_half()
            && call.op == Some(ReduceOp::Sum)
            && self.half_sum.get() == HalfSum::Upcast;
        let fp = fingerprint(seq, call, upcast);
        if self.rank == 0 {
            // (A world of one runs this too, for the copies of `_into` calls.)
            self.serve(call, &fp, upcast)?;
        } else {
            self.exchange_with_root(call, &fp)?;
        }
        let elem = if upcast { 4 } else { call.dtype.size_bytes() } as u64;
        let basis = match call.kind {
            CollectiveKind::ReduceScatter => call.send.map_or(0, |s| s.len),
            _ => call.recv.len,
        } as u64;
        let (sent, received) = ring_bytes(call.kind, self.size, self.rank, basis * elem, call.root);
        self.counters.record(call.kind, sent, received);
        Ok(())
    }

    unsafe fn start(&self, call: &RawCall) -> Result<Box<dyn InFlight>> {
        // Completes at start; see the module documentation.
        self.execute(call)?;
        Ok(Box::new(Done))
    }
}

impl Drop for SocketComm {
    fn drop(&mut self) {
        for l in &self.links {
            let _ = l.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[cfg(test)]
mod tests;
