//! The watchdog's side channel: when a collective times out, the ranks waiting in it ask
//! every other rank, over plain TCP and not over MPI (which is stuck), what it last
//! completed and what it is in now, and the report names the ranks behind: those that
//! never entered the collective, with their host, and those that do not answer at all
//! (stopped, or hung with their threads blocked).
//!
//! Each rank runs a small server thread on an ephemeral port; the addresses (host name,
//! port) are exchanged once at start-up with one MPI_Allgather on MPI_COMM_WORLD. A
//! question is a connection; the answer is a few text lines, then the connection closes:
//!
//! ```text
//! zero-comm heartbeat 1 rank 3 pid 4242 host n2
//! in all_reduce 1469 world          (a collective this rank is waiting in)
//! done all_gather 1468 world        (the last collective it completed, per communicator)
//! end
//! ```

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crate::stats::CollectiveKind;

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Answer {
    pub pid: u32,
    pub host: String,
    /// Collectives it is waiting in.
    pub waiting: Vec<Call>,
    /// The last collective it completed, per communicator.
    pub done: Vec<Call>,
}

/// Collectives as (kind, sequence number, communicator name).
pub(crate) type Calls = Vec<(CollectiveKind, u64, String)>;

/// What a rank's server reports: a snapshot taken when asked.
pub(crate) trait State: Send + Sync + 'static {
    /// (kind, seq, comm) of the collectives this rank waits in, and of the last one it
    /// completed on each communicator.
    fn snapshot(&self) -> (Calls, Calls);
}

/// This machine's host name (`gethostname`), or "unknown".
pub(crate) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its length; gethostname NUL-terminates within it
    // or truncates, and we stop at the first NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

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
                for (kind, seq, comm) in waiting {
                    text.push_str(&format!("in {} {seq} {comm}\n", kind.name()));
                }
                for (kind, seq, comm) in done {
                    text.push_str(&format!("done {} {seq} {comm}\n", kind.name()));
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

/// Ask one rank; `None` when it does not answer in time.
pub(crate) fn ask(peer: &Peer) -> Option<Answer> {
    // The host name first; this machine's loopback when the name does not resolve here.
    let addrs: Vec<_> = (peer.host.as_str(), peer.port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    let fallback = ("127.0.0.1", peer.port)
        .to_socket_addrs()
        .ok()?
        .collect::<Vec<_>>();
    let mut stream = addrs
        .iter()
        .chain(if peer.host == host_name() {
            &fallback[..]
        } else {
            &[]
        })
        .find_map(|a| TcpStream::connect_timeout(a, ANSWER_TIMEOUT).ok())?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT)).ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    parse(&text)
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
        let f: Vec<&str> = line.splitn(4, ' ').collect();
        match f.as_slice() {
            ["end"] => return Some(a),
            [which, kind, seq, comm] => {
                let call = Call {
                    kind: kind.to_string(),
                    seq: seq.parse().ok()?,
                    comm: comm.to_string(),
                };
                match *which {
                    "in" => a.waiting.push(call),
                    "done" => a.done.push(call),
                    _ => return None,
                }
            }
            _ => return None,
        }
    }
    None // no "end": cut off
}

/// Ask every peer but `me` at once (one thread each, at most 64 at a time): (rank, its
/// answer or None), in rank order.
pub(crate) fn ask_all(peers: &[Peer], me: usize) -> Vec<(usize, Option<Answer>)> {
    let others: Vec<&Peer> = peers.iter().filter(|p| p.rank != me).collect();
    let mut out = Vec::with_capacity(others.len());
    for batch in others.chunks(64) {
        std::thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|p| (p.rank, s.spawn(move || ask(p))))
                .collect();
            for (rank, h) in handles {
                out.push((rank, h.join().ok().flatten()));
            }
        });
    }
    out
}

/// The report of a collective (`kind` #`seq` on `comm`) this rank waits in, from the other
/// ranks' answers: which ranks are behind and where, which did not answer. `None` when a
/// lower rank waits in the same collective (it reports instead).
pub(crate) fn report(
    me: usize,
    stuck: &Call,
    answers: &[(usize, Option<Answer>)],
    peers: &[Peer],
) -> Option<String> {
    let same = |a: &Answer| a.waiting.iter().any(|c| c == stuck);
    if answers
        .iter()
        .any(|(r, a)| *r < me && a.as_ref().is_some_and(same))
    {
        return None;
    }
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
            None => behind.push(format!(
                "rank {rank} on {}: no answer within {} s (stopped, or hung with its threads blocked)",
                host_of(*rank),
                ANSWER_TIMEOUT.as_secs()
            )),
            Some(a) if same(a) => waiting += 1,
            Some(a) => {
                let last = a
                    .done
                    .iter()
                    .find(|c| c.comm == stuck.comm)
                    .map_or("nothing yet".to_string(), |c| format!("{} #{}", c.kind, c.seq));
                if a.done.iter().any(|c| c.comm == stuck.comm && c.seq >= stuck.seq) {
                    continue; // it has completed this collective: not behind
                }
                let now = match a.waiting.first() {
                    Some(c) => format!("now waiting in {} #{} on '{}'", c.kind, c.seq, c.comm),
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
    let scope = if stuck.comm == "world" {
        String::new()
    } else {
        format!(
            " (on a communicator other than 'world', ranks outside '{}' are listed too)",
            stuck.comm
        )
    };
    Some(if behind.is_empty() {
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
    })
}

/// Per communicator, the last completed collective (kept by the watchdog).
pub(crate) type Completed = HashMap<String, (u64, CollectiveKind)>;

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl State for Fixed {
        fn snapshot(&self) -> (Calls, Calls) {
            (
                vec![(CollectiveKind::AllReduce, 7, "world".into())],
                vec![(CollectiveKind::AllGather, 6, "world".into())],
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
        assert_eq!(a.waiting, vec![call("all_reduce", 7)]);
        assert_eq!(a.done, vec![call("all_gather", 6)]);
        // Nobody listens on a closed port: no answer, not a hang.
        let dead = TcpListener::bind(("127.0.0.1", 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let none = ask(&Peer {
            rank: 9,
            host: "127.0.0.1".into(),
            port: dead,
        });
        assert!(none.is_none());
    }

    #[test]
    fn the_report_names_the_ranks_behind_and_the_silent_ones() {
        let stuck = call("all_reduce", 7);
        let peers: Vec<Peer> = (0..4)
            .map(|rank| Peer {
                rank,
                host: format!("n{}", rank / 2),
                port: 1,
            })
            .collect();
        let waiting = Answer {
            pid: 1,
            host: "n0".into(),
            waiting: vec![stuck.clone()],
            done: vec![call("all_gather", 6)],
        };
        let computing = Answer {
            pid: 2,
            host: "n1".into(),
            waiting: vec![],
            done: vec![call("all_gather", 6)],
        };
        let answers = vec![(1, Some(waiting.clone())), (2, Some(computing)), (3, None)];
        let text = report(0, &stuck, &answers, &peers).expect("rank 0 reports");
        assert!(
            text.contains("2 of 4 ranks wait in all_reduce #7 on 'world'"),
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
        // Rank 1 leaves the report to rank 0, which waits in the same collective.
        let answers = vec![(0, Some(waiting)), (2, None), (3, None)];
        assert!(report(1, &stuck, &answers, &peers).is_none());
    }
}
