use super::*;
use crate::{run_local, selftest};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh rendezvous file path of this test process (rank 0 removes the file).
fn scratch_path() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "zero-socket-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ))
}

fn rendezvous(rank: usize, size: usize, file: &Path) -> Rendezvous {
    Rendezvous {
        rank,
        size,
        address: Address::File(file.to_path_buf()),
        token: "test".into(),
        timeout: Duration::from_secs(30),
    }
}

/// Run `f` on `size` ranks, each a thread with its own TCP connection(s).
fn run_tcp<T: Send + 'static>(
    size: usize,
    config: CommConfig,
    f: impl Fn(SocketComm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let file = scratch_path();
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (f, file, config) = (f.clone(), file.clone(), config.clone());
            std::thread::spawn(move || {
                let comm = SocketComm::connect(&rendezvous(rank, size, &file), &config)
                    .unwrap_or_else(|e| panic!("rank {rank} could not join: {e}"));
                f(comm)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("no rank panicked"))
        .collect()
}

#[test]
fn socket_comm_is_send() {
    fn send<T: Send>() {}
    send::<SocketComm>();
}

#[test]
fn the_self_test_passes_on_one_to_four_ranks() {
    for size in 1..=4 {
        for (rank, cases) in run_tcp(size, CommConfig::default(), |c| selftest::run(&c))
            .into_iter()
            .enumerate()
        {
            let cases = cases.unwrap_or_else(|e| panic!("{size} ranks, rank {rank}: {e}"));
            assert!(!cases.is_empty());
            for case in cases {
                assert!(
                    case.ok,
                    "{size} ranks, rank {rank}: {}: {}",
                    case.name, case.detail
                );
            }
        }
    }
}

/// The collectives of one step, on values whose sums round: the bits must be those of
/// the thread ranks (the same rank-order reduction).
fn step<C: Communicator>(c: &C) -> Vec<u32> {
    let me = c.rank() as f32;
    let x: Vec<f32> = (0..24)
        .map(|i| (i as f32 * 0.37 + me).sin() / 3.0)
        .collect();
    let mut ar = x.clone();
    c.all_reduce(&mut ar[..], ReduceOp::Sum)
        .expect("all-reduce");
    let mut mx = vec![0f32; 24];
    c.all_reduce_into(&x[..], &mut mx[..], ReduceOp::Max)
        .expect("all-reduce max");
    let mut rs = vec![0f32; 24 / c.size()];
    c.reduce_scatter(&x[..], &mut rs[..], ReduceOp::Sum)
        .expect("reduce-scatter");
    let h: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut hs = h.clone();
    c.all_reduce(&mut hs[..], ReduceOp::Sum).expect("bf16 sum");
    c.set_half_sum(HalfSum::Upcast);
    let mut hu = h.clone();
    c.all_reduce(&mut hu[..], ReduceOp::Sum)
        .expect("bf16 upcast sum");
    c.set_half_sum(HalfSum::Op);
    let mut ag = vec![0f32; 24];
    let block = 24 / c.size();
    ag[c.rank() * block..(c.rank() + 1) * block].copy_from_slice(&x[..block]);
    c.all_gather_in_place(&mut ag[..]).expect("all-gather");
    let mut a2a = vec![0f32; 24];
    c.all_to_all(&x[..], &mut a2a[..]).expect("all-to-all");
    let mut b = x.clone();
    c.broadcast(&mut b[..], c.size() - 1).expect("broadcast");
    c.barrier().expect("barrier");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
    let mut out = bits(&ar);
    out.extend(bits(&mx));
    out.extend(bits(&rs));
    out.extend(hs.iter().chain(&hu).map(|h| u32::from(h.to_bits())));
    out.extend(bits(&ag));
    out.extend(bits(&a2a));
    out.extend(bits(&b));
    out
}

#[test]
fn results_and_ledger_are_those_of_thread_ranks() {
    let size = 3;
    let tcp = run_tcp(size, CommConfig::default(), |c| (step(&c), c.stats()));
    let local = run_local(size, CommConfig::default(), |c| (step(&c), c.stats()));
    for (rank, ((bits, stats), l)) in tcp.into_iter().zip(local).enumerate() {
        let (lbits, lstats) = l.expect("no thread rank panicked");
        assert_eq!(
            bits, lbits,
            "rank {rank}: the bits differ from the thread ranks'"
        );
        assert_eq!(stats, lstats, "rank {rank}: the ledger differs");
    }
}

#[test]
fn a_mismatch_names_both_calls_and_leaves_the_group_usable() {
    let out = run_tcp(3, CommConfig::default(), |c| {
        let n = if c.rank() == 2 { 5 } else { 4 };
        let mut x = vec![1.0f32; n];
        let first = c.all_reduce(&mut x[..], ReduceOp::Sum);
        let mut y = vec![c.rank() as i32; 3];
        let second = c.all_reduce(&mut y[..], ReduceOp::Sum).map(|()| y);
        (first, second)
    });
    for (rank, (first, second)) in out.into_iter().enumerate() {
        match first {
            Err(CommError::Mismatch {
                rank_a: 0,
                rank_b: 2,
                call_a,
                call_b,
                ..
            }) => {
                assert!(call_a.contains("4 x f32"), "rank {rank}: {call_a}");
                assert!(call_b.contains("5 x f32"), "rank {rank}: {call_b}");
            }
            other => panic!("rank {rank}: expected a mismatch, got {other:?}"),
        }
        assert_eq!(second.expect("the group is usable after"), vec![3, 3, 3]);
    }
}

#[test]
fn a_rank_that_ends_fails_everyone_at_once() {
    let t0 = Instant::now();
    let out = run_tcp(3, CommConfig::default(), |c| {
        if c.rank() == 2 {
            drop(c);
            return (None, None);
        }
        let mut x = [1.0f32; 8];
        let first = c.all_reduce(&mut x[..], ReduceOp::Sum).err();
        let later = c.barrier().err();
        (first, later)
    });
    // The default timeout is 30 minutes: only noticing the closed connection ends it.
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    match &out[0].0 {
        Some(CommError::Link { peer: 2, .. }) => {}
        other => panic!("rank 0: expected the broken link to rank 2, got {other:?}"),
    }
    match &out[1].0 {
        Some(CommError::Poisoned { by: 0, reason, .. }) => {
            assert!(reason.contains("rank 2"), "{reason}")
        }
        other => panic!("rank 1: expected rank 0's verdict, got {other:?}"),
    }
    for (rank, (_, later)) in out.iter().take(2).enumerate() {
        assert!(
            matches!(later, Some(CommError::Poisoned { .. })),
            "rank {rank}: later calls are refused: {later:?}"
        );
    }
}

#[test]
fn a_silent_rank_times_out_naming_it() {
    // Rank 1 sleeps well past the timeout; rank 2 arrives at once (the timeout leaves a
    // loaded machine seconds to schedule it).
    let config = CommConfig {
        timeout: Some(Duration::from_secs(2)),
        ..CommConfig::default()
    };
    let out = run_tcp(3, config, |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_secs(6));
            return None;
        }
        c.barrier().err()
    });
    match &out[0] {
        Some(CommError::Timeout { missing, .. }) => assert_eq!(missing, &vec![1]),
        other => panic!("rank 0: expected a timeout naming rank 1, got {other:?}"),
    }
    assert!(
        matches!(&out[2], Some(CommError::Poisoned { by: 0, .. })),
        "rank 2: {:?}",
        out[2]
    );
}

#[test]
fn device_buffers_are_refused() {
    let out = run_tcp(1, CommConfig::default(), |c| {
        let mut x = [0f32; 4];
        let call = RawCall {
            kind: CollectiveKind::AllReduce,
            op: Some(ReduceOp::Sum),
            dtype: DType::F32,
            send: None,
            recv: crate::communicator::RawBuf {
                ptr: x.as_mut_ptr() as *mut u8,
                len: 4,
                location: Location::Cuda(0),
            },
            root: 0,
        };
        // SAFETY: the buffer is valid host memory; it is refused before use.
        unsafe { c.execute(&call) }.err()
    });
    assert!(
        matches!(out[0], Some(CommError::Location { .. })),
        "{:?}",
        out[0]
    );
}

#[test]
fn another_jobs_rank_is_turned_away_and_a_duplicate_rank_fails_the_rendezvous() {
    // A stranger (another token) knocks first; the world still forms. (A stranger that
    // waits for the file never connects: the file names our token.)
    let file = scratch_path();
    let root = {
        let file = file.clone();
        std::thread::spawn(move || {
            SocketComm::connect(&rendezvous(0, 2, &file), &CommConfig::default())
        })
    };
    // The stranger knows the address (not through the file, which names our token).
    let give_up = Instant::now() + Duration::from_secs(60);
    let published = loop {
        if let Some(addr) = std::fs::read_to_string(rendezvous_file(&file, "test"))
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
        {
            break addr;
        }
        assert!(
            Instant::now() < give_up && !root.is_finished(),
            "rank 0 never published the rendezvous file"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // (The file lists rank 0's name first, then its IPv4 addresses.)
    let first = published.split(',').next().expect("an address");
    let (host, port) = first.rsplit_once(':').expect("host:port");
    let stranger = {
        let mut rv = rendezvous(1, 2, &file);
        rv.address = Address::Tcp {
            host: host.into(),
            port: port.parse().expect("a port"),
        };
        rv.token = "another job".into();
        rv.timeout = Duration::from_secs(5);
        SocketComm::connect(&rv, &CommConfig::default())
    };
    match stranger {
        Err(CommError::Rendezvous { detail, .. }) => {
            assert!(detail.contains("another job"), "{detail}")
        }
        other => panic!("the stranger should be refused: {other:?}"),
    }
    // Now the real rank 1.
    let one = SocketComm::connect(&rendezvous(1, 2, &file), &CommConfig::default())
        .expect("rank 1 joins");
    let zero = root
        .join()
        .expect("rank 0 ran")
        .expect("rank 0 formed the world");
    assert!(
        !rendezvous_file(&file, "test").exists(),
        "rank 0 removes the rendezvous file once all joined"
    );
    drop((zero, one));

    // Two processes that both say rank 1: rank 0 refuses the world.
    let file = scratch_path();
    let handles: Vec<_> = [0, 1, 1]
        .into_iter()
        .map(|rank| {
            let file = file.clone();
            std::thread::spawn(move || {
                SocketComm::connect(&rendezvous(rank, 3, &file), &CommConfig::default()).err()
            })
        })
        .collect();
    let errors: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    match &errors[0] {
        Some(CommError::Rendezvous { detail, .. }) => {
            assert!(detail.contains("claims rank 1"), "{detail}")
        }
        other => panic!("rank 0: {other:?}"),
    }
    for e in &errors[1..] {
        assert!(matches!(e, Some(CommError::Rendezvous { .. })), "{e:?}");
    }
}

#[test]
fn rank_zero_reports_who_never_joined() {
    let file = scratch_path();
    let mut rv = rendezvous(0, 3, &file);
    rv.timeout = Duration::from_millis(300);
    match SocketComm::connect(&rv, &CommConfig::default()) {
        Err(CommError::Rendezvous { detail, .. }) => {
            assert!(detail.contains("rank(s) 1, 2 did not join"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !rendezvous_file(&file, "test").exists(),
        "the file of a failed rendezvous is removed"
    );
}

#[test]
fn the_environment_names_rank_size_and_address() {
    let vars = |list: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(Rendezvous::from_vars(vars(&[])), Ok(None));
    let rv = Rendezvous::from_vars(vars(&[
        ("ZERO_RENDEZVOUS", "file:/shared/run/rv"),
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
    ]))
    .expect("valid")
    .expect("set");
    assert_eq!((rv.rank, rv.size), (3, 4));
    assert_eq!(rv.address, Address::File("/shared/run/rv".into()));
    assert_eq!(rv.token, "slurm:77.0.0");
    assert_eq!(rv.timeout, DEFAULT_RENDEZVOUS_TIMEOUT);
    let rv = Rendezvous::from_vars(vars(&[
        ("ZERO_RENDEZVOUS", "node17:29500"),
        ("ZERO_RANK", "0"),
        ("ZERO_WORLD_SIZE", "2"),
        ("SLURM_PROCID", "5"),
        ("ZERO_RENDEZVOUS_TIMEOUT", "2.5"),
    ]))
    .expect("valid")
    .expect("set");
    assert_eq!(rv.rank, 0, "ZERO_RANK wins over SLURM_PROCID");
    assert_eq!(
        rv.address,
        Address::Tcp {
            host: "node17".into(),
            port: 29500
        }
    );
    assert_eq!(rv.timeout, Duration::from_millis(2500));
    for (list, says) in [
        (
            &[("ZERO_RENDEZVOUS", "node17")][..],
            "neither tcp:HOST:PORT nor file:PATH",
        ),
        (&[("ZERO_RENDEZVOUS", "tcp:node17:0")][..], "port above 0"),
        (
            &[("ZERO_RENDEZVOUS", "file:/x")][..],
            "none of ZERO_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID",
        ),
        (
            // A size that would have rank 0 allocate without bound.
            &[
                ("ZERO_RENDEZVOUS", "file:/x"),
                ("ZERO_RANK", "0"),
                ("ZERO_WORLD_SIZE", "20000000000"),
            ][..],
            "ZERO_WORLD_SIZE=20000000000: a TCP world has at most 1048576 ranks",
        ),
        (
            &[
                ("ZERO_RENDEZVOUS", "file:/x"),
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "4000000"),
            ][..],
            "OMPI_COMM_WORLD_SIZE=4000000: a TCP world has at most",
        ),
        (
            &[
                ("ZERO_RENDEZVOUS", "file:/x"),
                ("ZERO_RANK", "2"),
                ("ZERO_WORLD_SIZE", "2"),
            ][..],
            "below the size",
        ),
        (
            &[
                ("ZERO_RENDEZVOUS", "file:/x"),
                ("ZERO_RANK", "one"),
                ("ZERO_WORLD_SIZE", "2"),
            ][..],
            "ZERO_RANK=one is not a whole number",
        ),
        (
            &[
                ("ZERO_RENDEZVOUS", "file:/x"),
                ("ZERO_RANK", "0"),
                ("ZERO_WORLD_SIZE", "2"),
                ("ZERO_RENDEZVOUS_TIMEOUT", "-1"),
            ][..],
            "ZERO_RENDEZVOUS_TIMEOUT=-1",
        ),
    ] {
        let list: &'static [(&'static str, &'static str)] =
            Box::leak(list.to_vec().into_boxed_slice());
        let e = Rendezvous::from_vars(vars(list)).expect_err("refused");
        assert!(e.contains(says), "{list:?}: {e}");
    }
}

#[test]
fn the_launcher_that_started_the_process_gives_rank_size_and_token() {
    let vars = |list: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    };
    let rv = |list: &'static [(&'static str, &'static str)]| {
        Rendezvous::from_vars(vars(list))
            .expect("valid")
            .expect("set")
    };
    // `mpirun -n 4` inside `sbatch -n 8`: the batch step's SLURM_* are inherited, but
    // mpirun's own variables describe this launch.
    const MPIRUN_IN_SBATCH: &[(&str, &str)] = &[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "8"),
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("PMIX_RANK", "2"),
        ("PMIX_NAMESPACE", "prterun-node1-4242@1"),
    ];
    let a = rv(MPIRUN_IN_SBATCH);
    assert_eq!((a.rank, a.size), (2, 4), "mpirun's, not the allocation's");
    assert_eq!(a.token, "ompi:prterun-node1-4242@1");
    // The same rank on another node of the allocation, whose daemon srun started in a
    // step of its own: the same token (no SLURM_STEP_ID in it).
    let b = rv(&[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "3"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "1"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("PMIX_RANK", "3"),
        ("PMIX_NAMESPACE", "prterun-node1-4242@1"),
    ]);
    assert_eq!((b.rank, b.size, &b.token), (3, 4, &a.token));
    // A second mpirun in the same allocation: another token, so another file.
    let c = rv(&[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "8"),
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_MCA_ess_base_jobid", "5190"),
        ("PMIX_NAMESPACE", "prterun-node1-4243@1"),
    ]);
    assert_ne!(c.token, a.token);
    assert_ne!(
        rendezvous_file(Path::new("/shared/rv"), &c.token),
        rendezvous_file(Path::new("/shared/rv"), &a.token)
    );
    // The disagreement is said (it is what a rendezvous timeout then shows).
    let note = launcher_disagreement(
        &vars(MPIRUN_IN_SBATCH),
        ("OMPI_COMM_WORLD_RANK", 2),
        ("OMPI_COMM_WORLD_SIZE", 4),
    )
    .expect("they disagree");
    assert!(
        note.contains("SLURM_PROCID=0, SLURM_NTASKS=8") && note.contains("ZERO_WORLD_SIZE"),
        "{note}"
    );
    // srun --mpi=pmix: Slurm's and PMIx's variables agree; the token is the step's.
    const SRUN_PMIX: &[(&str, &str)] = &[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "4"),
        ("PMIX_RANK", "3"),
        ("PMIX_NAMESPACE", "slurm.pmix.77.0"),
    ];
    let d = rv(SRUN_PMIX);
    assert_eq!((d.rank, d.size), (3, 4));
    assert_eq!(d.token, "pmix:slurm.pmix.77.0");
    let agree = launcher_disagreement(&vars(SRUN_PMIX), ("PMIX_RANK", 3), ("SLURM_NTASKS", 4));
    assert_eq!(agree, None);
    // srun --mpi=pmi2.
    let e = rv(&[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("PMI_JOBID", "77.1"),
    ]);
    assert_eq!((e.rank, e.size, e.token.as_str()), (1, 2, "pmi:77.1"));
    // MPICH's hydra inside `sbatch -n 8`: PMI's size, and no id names the launch.
    let f = rv(&[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("SLURM_JOB_ID", "77"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "8"),
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
    ]);
    assert_eq!((f.rank, f.size, f.token.as_str()), (1, 2, ""));
    // Ours win over every launcher's, and ZERO_RENDEZVOUS_TOKEN over every id.
    let g = rv(&[
        ("ZERO_RENDEZVOUS", "file:/shared/rv"),
        ("ZERO_RANK", "1"),
        ("ZERO_WORLD_SIZE", "2"),
        ("ZERO_RENDEZVOUS_TOKEN", "mine"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("PMIX_NAMESPACE", "prterun-node1-4242@1"),
    ]);
    assert_eq!((g.rank, g.size, g.token.as_str()), (1, 2, "mine"));
}

#[test]
fn a_timeout_says_when_the_launchers_disagree() {
    // (The note comes from the environment in `connect`; here it is handed in.)
    let file = scratch_path();
    let mut rv = rendezvous(0, 3, &file);
    rv.timeout = Duration::from_millis(200);
    let listener = listen(&rv.address).expect("listens");
    let e = SocketComm::gather_peers(listener, &rv, "; note: SLURM_NTASKS=8 says otherwise")
        .expect_err("nobody came");
    assert!(
        e.contains("rank(s) 1, 2 did not join") && e.contains("note: SLURM_NTASKS=8"),
        "{e}"
    );
    let mut rv = rendezvous(1, 3, &file);
    rv.timeout = Duration::from_millis(200);
    let e = SocketComm::join_any(&rv, &[], "; note: SLURM_NTASKS=8 says otherwise")
        .expect_err("no rank 0");
    assert!(e.contains("note: SLURM_NTASKS=8"), "{e}");
}

#[test]
fn a_second_launch_never_takes_over_a_live_launchs_file() {
    // Another launch's rank 0 waits at this path with the same token (nothing named the
    // launches apart): ours refuses rather than overwrite its file and take its ranks.
    let file = scratch_path();
    let theirs = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let port = theirs.local_addr().expect("an address").port();
    let shared = rendezvous_file(&file, "test");
    std::fs::write(&shared, format!("127.0.0.1:{port}\ntest\n")).expect("writes");
    match SocketComm::connect(&rendezvous(0, 2, &file), &CommConfig::default()) {
        Err(CommError::Rendezvous { detail, .. }) => {
            assert!(
                detail.contains("is in use") && detail.contains(&format!("127.0.0.1:{port}")),
                "{detail}"
            );
            assert!(
                detail.contains("ZERO_RENDEZVOUS_TOKEN"),
                "says what to do: {detail}"
            );
        }
        other => panic!("rank 0 should refuse: {other:?}"),
    }
    assert_eq!(
        std::fs::read_to_string(&shared).expect("still there"),
        format!("127.0.0.1:{port}\ntest\n"),
        "their file is left alone"
    );
    // That launch ends: its file is stale, and ours replaces it and forms.
    drop(theirs);
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let file = file.clone();
            std::thread::spawn(move || {
                SocketComm::connect(&rendezvous(rank, 2, &file), &CommConfig::default())
                    .map(|c| c.size())
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("no panic"), Ok(2));
    }
    assert!(!shared.exists(), "removed once all joined");
}

#[test]
fn a_world_too_large_is_refused_before_anything_is_allocated() {
    let mut rv = rendezvous(0, 20_000_000_000, &scratch_path());
    rv.timeout = Duration::from_millis(100);
    match SocketComm::connect(&rv, &CommConfig::default()) {
        Err(CommError::Rendezvous { detail, .. }) => {
            assert!(detail.contains("at most 1048576"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn launches_sharing_a_path_meet_in_files_of_their_own() {
    let p = Path::new("/shared/run/rv");
    assert_eq!(rendezvous_file(p, ""), p);
    assert_eq!(
        rendezvous_file(p, "slurm:77.0.0"),
        Path::new("/shared/run/rv.slurm-77.0.0")
    );
    // Two worlds of two, one path, different tokens (two srun steps of one job): each
    // forms on its own.
    let file = scratch_path();
    let handles: Vec<_> = [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
        .into_iter()
        .map(|(token, rank)| {
            let file = file.clone();
            std::thread::spawn(move || {
                let mut rv = rendezvous(rank, 2, &file);
                rv.token = token.into();
                let c = SocketComm::connect(&rv, &CommConfig::default()).expect("joins");
                // Each world sums its own ranks' tags: a = 1 + 2, b = 10 + 20.
                let tag = if token == "a" {
                    1 + rank as i32
                } else {
                    10 * (1 + rank as i32)
                };
                let mut x = [tag];
                c.all_reduce(&mut x[..], ReduceOp::Sum).expect("all-reduce");
                (token, x[0])
            })
        })
        .collect();
    for h in handles {
        let (token, sum) = h.join().expect("no panic");
        assert_eq!(sum, if token == "a" { 3 } else { 30 }, "world {token}");
    }
}

#[test]
fn a_stopped_peer_cannot_hold_rank_0_in_a_write() {
    // Rank 1 is a stand-in that sends its input and then never reads (a process stopped
    // with SIGSTOP): rank 0's answer, larger than the socket buffers, must time out.
    const N: usize = 8 << 20;
    let file = scratch_path();
    let config = CommConfig {
        timeout: Some(Duration::from_millis(500)),
        ..CommConfig::default()
    };
    let root = {
        let file = file.clone();
        std::thread::spawn(move || {
            let c = SocketComm::connect(&rendezvous(0, 2, &file), &config).expect("rank 0");
            let mut x = vec![1.0f32; N];
            let t0 = Instant::now();
            let e = c.all_reduce(&mut x[..], ReduceOp::Sum).err();
            (e, t0.elapsed())
        })
    };
    let addr = loop {
        if let Some(a) = read_published(&rendezvous_file(&file, "test"), "test") {
            break a;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let first = addr.split(',').next().expect("an address").to_string();
    let mut s = TcpStream::connect(first).expect("connect to rank 0");
    let mut hello = to_bytes(&[MAGIC, VERSION, 1, 2, 4]);
    hello.extend_from_slice(b"test");
    s.write_all(&hello).expect("hello");
    let answer = read_words::<2>(&mut s).ok().expect("joined");
    assert_eq!(answer, [0, 0]);
    let mut buf = vec![1.0f32; N];
    let call = RawCall {
        kind: CollectiveKind::AllReduce,
        op: Some(ReduceOp::Sum),
        dtype: DType::F32,
        send: None,
        recv: crate::communicator::RawBuf {
            ptr: buf.as_mut_ptr() as *mut u8,
            len: N,
            location: Location::Host,
        },
        root: 0,
    };
    let mut header: Vec<u64> = fingerprint(0, &call, false)
        .iter()
        .map(|&x| x as u64)
        .collect();
    header.push((N * 4) as u64);
    s.write_all(&to_bytes(&header)).expect("header");
    s.write_all(bytemuck::cast_slice(&buf)).expect("input");
    // ... and never read the answer.
    let (e, took) = root.join().expect("rank 0 ran");
    assert!(
        matches!(&e, Some(CommError::Timeout { missing, .. }) if missing == &vec![1]),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    drop(s);
}

#[test]
fn node_groups_are_stars_of_their_own() {
    // 6 ranks as 3 nodes of 2: node = consecutive pairs, cross = one per node.
    let out = run_tcp(6, CommConfig::default(), |c| {
        let g = c.node_groups(Some(2)).expect("node groups");
        let me = c.rank() as i64;
        let mut on_node = [me];
        g.node
            .all_reduce(&mut on_node[..], ReduceOp::Sum)
            .expect("node sum");
        let mut across = [me];
        g.cross
            .all_reduce(&mut across[..], ReduceOp::Sum)
            .expect("cross sum");
        let mut gathered = [0i64; 3];
        g.cross
            .all_gather(&[me][..], &mut gathered[..])
            .expect("cross gather");
        // The world is still usable after the splits.
        let mut all = [1i64];
        c.all_reduce(&mut all[..], ReduceOp::Sum)
            .expect("world sum");
        (
            (g.node.rank(), g.node.size(), g.node.name().to_string()),
            (g.cross.rank(), g.cross.size(), g.cross.name().to_string()),
            on_node[0],
            across[0],
            gathered,
            all[0],
        )
    });
    for (r, (node, cross, on_node, across, gathered, all)) in out.into_iter().enumerate() {
        let (m, j) = (r / 2, r % 2);
        assert_eq!(node, (j, 2, format!("node[{m}]")), "rank {r}");
        assert_eq!(cross, (m, 3, format!("cross[{j}]")), "rank {r}");
        assert_eq!(
            on_node,
            (2 * m + 2 * m + 1) as i64,
            "rank {r}: its node's ranks"
        );
        assert_eq!(across, (j + (2 + j) + (4 + j)) as i64, "rank {r}");
        assert_eq!(gathered, [j as i64, 2 + j as i64, 4 + j as i64], "rank {r}");
        assert_eq!(all, 6);
    }
    // By host name: every thread rank is on this host, one node of 3.
    let out = run_tcp(3, CommConfig::default(), |c| {
        let g = c.node_groups(None).expect("node groups");
        (g.node.size(), g.cross.size())
    });
    assert!(out.iter().all(|&s| s == (3, 1)), "{out:?}");
    // A ranks-per-node that does not divide the world is refused on every rank.
    let out = run_tcp(3, CommConfig::default(), |c| c.node_groups(Some(2)).err());
    for e in out {
        assert!(
            matches!(&e, Some(CommError::Nodes { detail, .. }) if detail.contains("does not divide")),
            "{e:?}"
        );
    }
}

#[test]
fn a_hub_publishes_no_loopback_address_and_its_name_last() {
    let out = run_tcp(2, CommConfig::default(), |c| c.reachable_candidates());
    for (rank, candidates) in out.into_iter().enumerate() {
        assert_eq!(
            candidates.last(),
            Some(&host_name()),
            "rank {rank}: {candidates:?}"
        );
        for c in &candidates[..candidates.len() - 1] {
            let ip: std::net::Ipv4Addr = c.parse().expect("an IPv4 address");
            assert!(!ip.is_loopback(), "rank {rank}: {candidates:?}");
        }
    }
}
