//! Node groups of thread ranks ([`LocalComm::world_on_nodes`], [`run_local_on_nodes`]):
//! sizes and ranks as `nodes.rs` specifies, the two-level all-gather against the world's,
//! world ranks in messages, bad layouts refused, and a panicking rank hanging no group.

use super::*;

fn cfg() -> CommConfig {
    CommConfig::default()
}

/// On `n` ranks, `l` to a node: each rank's (node rank, node size, cross rank, cross
/// size, world ranks named by node and cross), and whether the two-level all-gather of
/// 3 values per rank equals the world's.
fn layout_and_gathers(n: usize, l: usize) {
    let out = run_local_on_nodes(n, l, cfg(), |world, g| -> Result<_> {
        let me = world.rank();
        let mine: Vec<f32> = (0..3).map(|i| (10 * me + i) as f32).collect();
        let mut flat = vec![0f32; 3 * n];
        world.all_gather(&mine[..], &mut flat[..])?;
        let mut on_node = vec![0f32; 3 * g.ranks_per_node()];
        g.node.all_gather(&mine[..], &mut on_node[..])?;
        let mut two_level = vec![0f32; 3 * n];
        g.cross.all_gather(&on_node[..], &mut two_level[..])?;
        Ok((
            (g.node.rank(), g.node.size(), g.cross.rank(), g.cross.size()),
            (
                g.node.world_rank(),
                g.cross.world_rank(),
                g.node.name().to_string(),
                g.cross.name().to_string(),
            ),
            (g.ranks_per_node(), g.nodes()),
            flat == two_level,
        ))
    })
    .unwrap_or_else(|e| panic!("n={n} l={l}: {e}"));
    assert_eq!(out.len(), n);
    let m = n / l;
    for (r, o) in out.into_iter().enumerate() {
        let o = o.unwrap_or_else(|p| panic!("{p}"));
        let (sizes, names, counts, same) = o.unwrap_or_else(|e| panic!("n={n} rank {r}: {e}"));
        assert_eq!(sizes, (r % l, l, r / l, m), "n={n} l={l} rank {r}");
        assert_eq!(
            names,
            (r, r, "node".into(), "cross".into()),
            "n={n} l={l} rank {r}"
        );
        assert_eq!(counts, (l, m));
        assert!(
            same,
            "n={n} l={l} rank {r}: node-then-cross gather != world gather"
        );
    }
}

#[test]
fn node_groups_of_4_as_2x2_and_6_as_3x2_and_2x3() {
    layout_and_gathers(4, 2);
    layout_and_gathers(6, 2);
    layout_and_gathers(6, 3);
    // The degenerate ends: one node, and one rank per node.
    layout_and_gathers(4, 4);
    layout_and_gathers(3, 1);
}

#[test]
fn ranks_per_node_must_divide_the_world() {
    for (n, l) in [(4, 3), (4, 0), (0, 2)] {
        let e = LocalComm::world_on_nodes(n, l, cfg()).expect_err("refused");
        assert!(
            e.to_string().contains(&format!(
                "{l} ranks per node does not divide the world's {n} ranks"
            )),
            "{e}"
        );
        // No thread started, nothing to hang.
        assert!(matches!(
            run_local_on_nodes(n, l, cfg(), |_, _| ()),
            Err(CommError::Nodes { .. })
        ));
    }
}

#[test]
fn a_sub_group_error_names_the_world_rank_and_group() {
    let out = run_local_on_nodes(4, 2, cfg(), |_, g| {
        let mut r = [0f32; 3];
        g.cross.all_to_all(&[0f32; 3][..], &mut r[..])
    })
    .expect("4 = 2 x 2");
    for (r, o) in out.into_iter().enumerate() {
        let e = o.expect("no panic").expect_err("3 elements on 2 ranks");
        assert_eq!(
            e.to_string(),
            format!("rank {r}: all_to_all on 'cross': buffer of 3 elements is not divisible into 2 equal blocks")
        );
    }
}

#[test]
fn a_panicking_rank_hangs_none_of_its_groups() {
    // World rank 3 (node 1, local 1) panics; the others each wait in one of its groups:
    // rank 1 shares only its cross group, rank 2 its node group, rank 0 the world. No
    // timeout is set: a group that missed the panic would wait forever.
    let out = run_local_on_nodes(4, 2, cfg(), |world, g| -> Result<()> {
        let mut x = [1f32; 2];
        match world.rank() {
            3 => panic!("rank 3 fails on purpose"),
            2 => g.node.all_reduce(&mut x[..], ReduceOp::Sum),
            1 => g.cross.all_reduce(&mut x[..], ReduceOp::Sum),
            _ => world.all_reduce(&mut x[..], ReduceOp::Sum),
        }
    })
    .expect("4 = 2 x 2");
    assert!(out[3].is_err(), "rank 3 panicked");
    // In the world, ranks 1 and 2 may leave (after their own error) before rank 3 does:
    // rank 0 is told whichever left first. In rank 3's node and cross groups it is
    // rank 1 of each.
    for (r, comm, peers) in [
        (0, "local", &[1, 2, 3][..]),
        (1, "cross", &[1]),
        (2, "node", &[1]),
    ] {
        match &out[r] {
            Ok(Err(e @ CommError::PeerGone { peer, .. })) if peers.contains(peer) => {
                let s = e.to_string();
                assert!(
                    s.starts_with(&format!("rank {r}: all_reduce #0 on '{comm}'")),
                    "{s}"
                );
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}
