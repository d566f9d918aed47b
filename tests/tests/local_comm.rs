//! Thread ranks (LocalComm) account their collectives exactly as the MPI backend does:
//! the same check as the `comm_collectives` MPI scenario, at 1-4 ranks.

#[test]
fn local_comm_accounting_matches_the_ring_formulas() {
    for n in 1..=4 {
        let results = zero_comm::run_local(n, Default::default(), |comm| {
            zero_tests::accounting::check_accounting(&comm)
        });
        for (r, res) in results.into_iter().enumerate() {
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("N={n} rank {r}: {e}"),
                Err(p) => panic!("N={n} rank {r} panicked: {p:?}"),
            }
        }
    }
}
