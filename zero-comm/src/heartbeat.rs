//! The watchdog's side channel: when a collective times out, the ranks waiting in it ask
//! the others, over plain TCP and not over MPI (which is stuck), what they last
//! completed and what they are in now, and one report names the ranks behind: those that
//! never entered the collective, with their host, those that do not answer (stopped, or
//! hung with their threads blocked), and those that cannot be reached.
//!
//! Each rank runs a small server thread on an ephemeral port; the addresses (host name,
//! port; port 0 for a rank without a server) are exchanged once at start-up with one
//! MPI_Allgather on MPI_COMM_WORLD. A question is a connection; the answer is a few text
//! lines, then the connection closes:
//!
//! ```text
//! zero-comm heartbeat 1 rank 3 pid 4242 host n2
//! in all_reduce 1469 31200 world    (a collective it waits in: kind, number, ms waited, communicator)
//! done all_gather 1468 world        (the last collective it completed, per communicator)
//! end
//! ```
//!
//! Who reports: a rank that times out asks the lower ranks, lowest first and a few at a
//! time, and leaves the report to the first one that waits in the same collective and
//! times out within a slack of it (`report_slack`: ranks enter a collective at different
//! moments); a rank that finds none asks everyone and reports. A rank that left the
//! report to another waits while that one still waits in the collective (it may itself
//! have left the report to a lower rank), so it aborts the job only after the report, or
//! reports itself when that rank stops answering. Normally one rank reports; ranks
//! whose timeouts fall more than the slack apart may each report.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

/// How long a question waits for a connection and for its answer.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes per rank of the address exchange ("host port", zero-padded).
pub(crate) const ADDRESS_BYTES: usize = 256;

/// How to reach one rank's heartbeat server.
#[derive(Clone, Debug)]
pub(crate) struct Peer {
    pub rank: usize,
    pub host: String,
    pub port: u16,
}

/// One collective in a rank's answer: kind, sequence number, communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub kind: String,
    pub seq: u64,
    pub comm: String,
}

/// What a rank answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Answer {
    pub pid: u32,
    pub host: String,
    /// Collectives it is waiting in, with the seconds it has waited.
    pub waiting: Vec<(Call, f64)>,
    /// The last collective it completed, per communicator.
    pub done: Vec<Call>,
}

impl Answer {
    /// Whether it waits in `call`, and for how long.
    fn waits_in(&self, call: &Call) -> Option<f64> {
        self.waiting
            .iter()
            .find(|(c, _)| c == call)
            .map(|(_, s)| *s)
    }
}

/// Why a rank gave no answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum NoAnswer {
    /// It has no heartbeat server (its watchdog is off, or its port did not bind).
    NoServer,
    /// The connection failed (the host name does not resolve here, a firewall, a dead
    /// node): the reason.
    Unreachable(String),
    /// It accepted but did not answer in time (its process is stopped, or hung with its
    /// threads blocked).
    Silent,
}

/// Collectives as (kind, sequence number, communicator name); the kind is a collective's
/// name (`all_reduce`) or, for a watched set-up call, MPI's (`MPI_Comm_split`): one word.
pub(crate) type Calls = Vec<(&'static str, u64, String)>;

/// What a rank's server reports: a snapshot taken when asked.
pub(crate) trait State: Send + Sync + 'static {
    /// (kind, seq, comm, seconds waited) of the collectives this rank waits in, and
    /// (kind, seq, comm) of the last one it completed on each communicator.
    fn snapshot(&self) -> (Vec<(&'static str, u64, String, f64)>, Calls);
}

pub(crate) use crate::exit::host_name;

/// Start the server thread for rank `rank`; returns its port.
pub(crate) fn serve(rank: usize, state: Arc<dyn State>) -> std::io::Result<u16> {
    let listener = TcpListener::bind(("0.0.0.0", 0))?;
    let port = listener.local_addr()?.port();
    let host = host_name();
    let pid = std::process::id();
    std::thread::Builder::new()
        .name("zero-comm-heartbeat".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let (waiting, done) = state.snapshot();
                let mut text = format!("zero-comm heartbeat 1 rank {rank} pid {pid} host {host}\n");
                for (kind, seq, comm, waited) in waiting {
                    let ms = (waited * 1e3) as u64;
                    text.push_str(&format!("in {kind} {seq} {ms} {comm}\n"));
                }
                for (kind, seq, comm) in done {
                    text.push_str(&format!("done {kind} {seq} {comm}\n"));
                }
                text.push_str("end\n");
                let _ = stream.set_write_timeout(Some(ANSWER_TIMEOUT));
                let _ = stream.write_all(text.as_bytes());
            }
        })?;
    Ok(port)
}

/// This rank's address for the exchange.
pub(crate) fn encode_address(port: u16) -> [u8; ADDRESS_BYTES] {
    let mut out = [0u8; ADDRESS_BYTES];
    let text = format!("{} {port}", host_name());
    let n = text.len().min(ADDRESS_BYTES - 1);
    out[..n].copy_from_slice(&text.as_bytes()[..n]);
    out
}

/// Every rank's address from the gathered blocks (rank order).
pub(crate) fn decode_addresses(all: &[u8]) -> Vec<Peer> {
    all.chunks_exact(ADDRESS_BYTES)
        .enumerate()
        .filter_map(|(rank, b)| {
            let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
            let text = String::from_utf8_lossy(&b[..end]);
            let (host, port) = text.rsplit_once(' ')?;
            Some(Peer {
                rank,
                host: host.to_string(),
                port: port.parse().ok()?,
            })
        })
        .collect()
}

/// Ask one rank.
pub(crate) fn ask(peer: &Peer) -> Result<Answer, NoAnswer> {
    if peer.port == 0 {
        return Err(NoAnswer::NoServer);
    }
    // The host name first; this machine's loopback when it is this host's own name.
    let mut addrs: Vec<_> = (peer.host.as_str(), peer.port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    if peer.host == host_name() {
        addrs.extend(
            ("127.0.0.1", peer.port)
                .to_socket_addrs()
                .into_iter()
                .flatten(),
        );
    }
    if addrs.is_empty() {
        return Err(NoAnswer::Unreachable(format!(
            "its host name '{}' does not resolve here",
            peer.host
        )));
    }
    let mut last = String::new();
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, ANSWER_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("connecting to {a}: {e}"),
        }
    }
    let mut stream = stream.ok_or(NoAnswer::Unreachable(last))?;
    stream
        .set_read_timeout(Some(ANSWER_TIMEOUT))
        .map_err(|e| NoAnswer::Unreachable(e.to_string()))?;
    let mut text = String::new();
    // A stopped process's kernel accepts the connection; nothing answers.
    match stream.read_to_string(&mut text) {
        Ok(_) => parse(&text).ok_or(NoAnswer::Silent),
        Err(_) => Err(NoAnswer::Silent),
    }
}

fn parse(text: &str) -> Option<Answer> {
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next()?.split_whitespace().collect();
    let (pid, host) = match head.as_slice() {
        ["zero-comm", "heartbeat", "1", "rank", _, "pid", pid, "host", host] => {
            (pid.parse().ok()?, host.to_string())
        }
        _ => return None,
    };
    let mut a = Answer {
        pid,
        host,
        ..Default::default()
    };
    for line in lines {
        let f: Vec<&str> = line.splitn(5, ' ').collect();
        let call = |kind: &str, seq: &str, comm: &str| -> Option<Call> {
            Some(Call {
                kind: kind.to_string(),
                seq: seq.parse().ok()?,
                comm: comm.to_string(),
            })
        };
        match f.as_slice() {
            ["end"] => return Some(a),
            ["in", kind, seq, ms, comm] => {
                let waited = ms.parse::<f64>().ok()? / 1e3;
                a.waiting.push((call(kind, seq, comm)?, waited));
            }
            ["done", kind, seq, rest @ ..] => {
                // The communicator name is the rest of the line.
                a.done.push(call(kind, seq, &rest.join(" "))?);
            }
            _ => return None,
        }
    }
    None // no "end": cut off
}

/// Ask `peers` at once (one thread each, at most 64 at a time): (rank, its answer), in
/// the order given.
pub(crate) fn ask_all(peers: &[&Peer]) -> Vec<(usize, Result<Answer, NoAnswer>)> {
    let mut out = Vec::with_capacity(peers.len());
    for batch in peers.chunks(64) {
        std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|p| (p.rank, s.spawn(move || ask(p))))
                .collect();
            for (rank, h) in handles {
                let answer = h.join().unwrap_or_else(|_| {
                    Err(NoAnswer::Unreachable("the asking thread failed".into()))
                });
                out.push((rank, answer));
            }
        });
    }
    out
}

/// What a rank that timed out does after asking the lower ranks.
#[derive(Debug)]
pub(crate) enum Reporter {
    /// A lower rank waits in the same collective and times out within `in_s` seconds:
    /// it reports.
    LowerRank { rank: usize, in_s: f64 },
    /// This rank reports: every other rank's answer.
    Me(Vec<(usize, Result<Answer, NoAnswer>)>),
}

/// How much later than the asking rank a lower rank waiting in the same collective may
/// time out and still be left the report: ranks enter a collective at different moments
/// (hundreds of milliseconds apart on a loaded node), so the lowest waiting rank is not
/// always the first to time out. A tenth of the timeout, at least 1 s, at most the
/// timeout.
pub(crate) fn report_slack(timeout: Duration) -> Duration {
    (timeout / 10).max(Duration::from_secs(1)).min(timeout)
}

/// Lower ranks asked at once while looking for the reporter: the lowest first, so that
/// the usual case (rank 0 waits too) costs each rank a few connections, not one per rank,
/// and a few stopped ranks cost one [`ANSWER_TIMEOUT`] round, not one each.
const LOWER_BATCH: usize = 8;

/// The rank `me`, timed out in `stuck` after `timeout`: the lowest lower rank that waits
/// in the same collective and times out within [`report_slack`] reports; else this rank
/// does, from every other rank's answer.
pub(crate) fn gather(me: usize, stuck: &Call, timeout: Duration, peers: &[Peer]) -> Reporter {
    let slack = report_slack(timeout).as_secs_f64();
    let lower: Vec<&Peer> = peers.iter().filter(|p| p.rank < me).collect();
    for batch in lower.chunks(LOWER_BATCH) {
        for (rank, answer) in ask_all(batch) {
            let Some(waited) = answer.ok().and_then(|a| a.waits_in(stuck)) else {
                continue;
            };
            let in_s = (timeout.as_secs_f64() - waited).max(0.0);
            if in_s <= slack {
                return Reporter::LowerRank { rank, in_s };
            }
        }
    }
    let others: Vec<&Peer> = peers.iter().filter(|p| p.rank != me).collect();
    Reporter::Me(ask_all(&others))
}

/// Whether `peer` still waits in `stuck` (it answers, and the collective is among those
/// it waits in).
pub(crate) fn still_waits(peer: &Peer, stuck: &Call) -> bool {
    ask(peer).is_ok_and(|a| a.waits_in(stuck).is_some())
}

/// The report of a collective (`kind` #`seq` on `comm`) this rank waits in, from the other
/// ranks' answers: which ranks are behind and where, which cannot be asked.
pub(crate) fn report(
    me: usize,
    stuck: &Call,
    answers: &[(usize, Result<Answer, NoAnswer>)],
    peers: &[Peer],
) -> String {
    let host_of = |r: usize| {
        peers
            .iter()
            .find(|p| p.rank == r)
            .map_or("unknown host".to_string(), |p| p.host.clone())
    };
    let mut behind = Vec::new();
    let mut waiting = 1; // this rank
    for (rank, answer) in answers {
        match answer {
            Err(NoAnswer::Silent) => behind.push(format!(
                "rank {rank} on {}: no answer within {} s (stopped, or hung with its threads blocked)",
                host_of(*rank),
                ANSWER_TIMEOUT.as_secs()
            )),
            Err(NoAnswer::NoServer) => behind.push(format!(
                "rank {rank} on {}: cannot be asked (no heartbeat server there: is ZERO_COMM_TIMEOUT set on every node? mpirun -x ZERO_COMM_TIMEOUT)",
                host_of(*rank)
            )),
            Err(NoAnswer::Unreachable(why)) => behind.push(format!(
                "rank {rank} on {}: unreachable from here ({why})",
                host_of(*rank)
            )),
            Ok(a) if a.waits_in(stuck).is_some() => waiting += 1,
            Ok(a) => {
                if a.done.iter().any(|c| c.comm == stuck.comm && c.seq >= stuck.seq) {
                    continue; // it has completed this collective: not behind
                }
                let last = a
                    .done
                    .iter()
                    .find(|c| c.comm == stuck.comm)
                    .map_or("nothing yet".to_string(), |c| format!("{} #{}", c.kind, c.seq));
                let now = match a.waiting.first() {
                    Some((c, s)) => format!(
                        "now waiting in {} #{} on '{}' for {s:.1} s",
                        c.kind, c.seq, c.comm
                    ),
                    None => "now outside any collective (computing, or stuck there)".into(),
                };
                behind.push(format!(
                    "rank {rank} on {} (pid {}): last completed {last} on '{}', {now}",
                    a.host, a.pid, stuck.comm
                ));
            }
        }
    }
    let total = answers.len() + 1;
    // The world's own calls, ours or MPI_COMM_WORLD's at set-up ("world (set-up)").
    let on_world = ["world", "MPI_COMM_WORLD"]
        .iter()
        .any(|w| stuck.comm == *w || stuck.comm.starts_with(&format!("{w} (")));
    let scope = if on_world {
        String::new()
    } else {
        format!(
            " (on a communicator other than 'world', ranks outside '{}' are listed too)",
            stuck.comm
        )
    };
    if behind.is_empty() {
        format!(
            "rank {me}: watchdog: every rank answered and none is behind {} #{} on '{}' ({waiting} of {total} waiting in it)",
            stuck.kind, stuck.seq, stuck.comm
        )
    } else {
        format!(
            "rank {me}: watchdog: {waiting} of {total} ranks wait in {} #{} on '{}'; behind{scope}:\n  {}",
            stuck.kind,
            stuck.seq,
            stuck.comm,
            behind.join("\n  ")
        )
    }
}

/// Per communicator, the last completed collective (kept by the watchdog).
pub(crate) type Completed = HashMap<String, (u64, &'static str)>;

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl State for Fixed {
        fn snapshot(&self) -> (Vec<(&'static str, u64, String, f64)>, Calls) {
            (
                vec![("all_reduce", 7, "world".into(), 31.25)],
                vec![("all_gather", 6, "world".into())],
            )
        }
    }

    fn call(kind: &str, seq: u64) -> Call {
        Call {
            kind: kind.into(),
            seq,
            comm: "world".into(),
        }
    }

    #[test]
    fn a_server_answers_what_its_rank_waits_in_and_last_completed() {
        let port = serve(5, Arc::new(Fixed)).unwrap();
        let peers = decode_addresses(&encode_address(port));
        assert_eq!(peers.len(), 1);
        assert_eq!(peers[0].port, port);
        let a = ask(&Peer {
            rank: 5,
            ..peers[0].clone()
        })
        .expect("an answer");
        assert_eq!(a.pid, std::process::id());
        assert_eq!(a.host, host_name());
        assert_eq!(a.waiting, vec![(call("all_reduce", 7), 31.25)]);
        assert_eq!(a.done, vec![call("all_gather", 6)]);
        // Nobody listens on a closed port: unreachable, not a hang; port 0: no server.
        let dead = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let unreachable = ask(&Peer {
            rank: 9,
            host: "127.0.0.1".into(),
            port: dead,
        });
        assert!(
            matches!(unreachable, Err(NoAnswer::Unreachable(_))),
            "{unreachable:?}"
        );
        let none = ask(&Peer {
            rank: 9,
            host: "x".into(),
            port: 0,
        });
        assert_eq!(none, Err(NoAnswer::NoServer));
    }

    #[test]
    fn a_lower_rank_that_times_out_within_the_slack_reports() {
        // The Fixed rank waits in all_reduce #7 since 31.25 s.
        let port = serve(0, Arc::new(Fixed)).unwrap();
        let waiting = Peer {
            rank: 0,
            host: host_name(),
            port,
        };
        let lower = vec![waiting.clone()];
        let stuck = call("all_reduce", 7);
        let secs = Duration::from_secs_f64;
        assert_eq!(report_slack(secs(2.0)), secs(1.0));
        assert_eq!(report_slack(secs(0.5)), secs(0.5));
        assert_eq!(report_slack(secs(600.0)), secs(60.0));
        // Timeout 32 s: it times out in 0.75 s, within the 3.2 s slack.
        match gather(1, &stuck, secs(32.0), &lower) {
            Reporter::LowerRank { rank, in_s } => {
                assert_eq!(rank, 0);
                assert!((in_s - 0.75).abs() < 1e-9, "{in_s}");
            }
            other => panic!("{other:?}"),
        }
        // Past its own timeout already: it reports now.
        assert!(matches!(
            gather(1, &stuck, secs(30.0), &lower),
            Reporter::LowerRank { in_s, .. } if in_s == 0.0
        ));
        // Timeout 34 s: 2.75 s to go, within the 3.4 s slack; 35 s: 3.75 s to go, past
        // the 3.5 s slack, so this rank reports (the answers of all but itself).
        assert!(matches!(
            gather(1, &stuck, secs(34.0), &lower),
            Reporter::LowerRank { rank: 0, .. }
        ));
        assert!(matches!(gather(1, &stuck, secs(35.0), &lower), Reporter::Me(a) if a.len() == 1));
        // Another collective, or a higher rank: not the reporter either.
        assert!(matches!(
            gather(1, &call("all_reduce", 8), secs(32.0), &lower),
            Reporter::Me(_)
        ));
        assert!(matches!(gather(0, &stuck, secs(32.0), &lower), Reporter::Me(a) if a.is_empty()));
        // A lower rank that cannot be asked is passed over for the next.
        let dead = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let two = vec![
            Peer {
                rank: 0,
                host: "127.0.0.1".into(),
                port: dead,
            },
            Peer {
                rank: 1,
                ..waiting.clone()
            },
        ];
        assert!(matches!(
            gather(2, &stuck, secs(32.0), &two),
            Reporter::LowerRank { rank: 1, .. }
        ));
        // What a rank that left the report asks while it waits.
        assert!(still_waits(&waiting, &stuck));
        assert!(!still_waits(&waiting, &call("all_reduce", 8)));
        assert!(!still_waits(&two[0], &stuck));
    }

    #[test]
    fn the_report_names_the_ranks_behind_and_why_they_cannot_be_asked() {
        let stuck = call("all_reduce", 7);
        let peers: Vec<Peer> = (0..5)
            .map(|rank| Peer {
                rank,
                host: format!("n{}", rank / 2),
                port: 1,
            })
            .collect();
        let waiting = Answer {
            pid: 1,
            host: "n0".into(),
            waiting: vec![(stuck.clone(), 30.0)],
            done: vec![call("all_gather", 6)],
        };
        let computing = Answer {
            pid: 2,
            host: "n1".into(),
            waiting: vec![],
            done: vec![call("all_gather", 6)],
        };
        let answers = vec![
            (1, Ok(waiting)),
            (2, Ok(computing)),
            (3, Err(NoAnswer::Silent)),
            (4, Err(NoAnswer::Unreachable("connection refused".into()))),
        ];
        let text = report(0, &stuck, &answers, &peers);
        assert!(
            text.contains("2 of 5 ranks wait in all_reduce #7 on 'world'"),
            "{text}"
        );
        assert!(
            text.contains("rank 2 on n1 (pid 2): last completed all_gather #6 on 'world', now outside any collective"),
            "{text}"
        );
        assert!(
            text.contains("rank 3 on n1: no answer within 2 s"),
            "{text}"
        );
        assert!(
            text.contains("rank 4 on n2: unreachable from here (connection refused)"),
            "{text}"
        );
    }
}
