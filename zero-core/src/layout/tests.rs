//! Layout properties over odd world sizes, worlds larger than a unit, and alignments.

use super::*;
use crate::testutil::{chain, tied_spec};

fn specs() -> Vec<ModelSpec> {
    vec![
        tied_spec(65, 16, 2, 8),
        tied_spec(50257, 1024, 1, 24),
        chain(&[1, 3, 1000, 7]),
    ]
}

#[test]
fn shards_tile_the_padded_buffer_aligned() {
    for spec in specs() {
        for world in [1, 2, 3, 4, 7, 64, 5000] {
            for align in [1, 8, DEFAULT_ALIGN] {
                let l = PartitionLayout::new(&spec, world, align).unwrap();
                assert_eq!(l.numel(), spec.numel());
                let mut shard_total = 0;
                for (i, u) in l.units.iter().enumerate() {
                    assert_eq!(u.padded_len % (world * align), 0);
                    assert!(u.padded_len >= u.numel && u.padded_len - u.numel < world * align);
                    assert_eq!(u.shard_offset, shard_total);
                    shard_total += u.shard_len;
                    let mut at = 0;
                    for r in 0..world {
                        let s = l.shard_range(i, r).unwrap();
                        assert_eq!(s.start, at, "shards are contiguous");
                        assert_eq!(s.start % align, 0, "shard start aligned");
                        at = s.end;
                    }
                    assert_eq!(at, u.padded_len, "shards tile the padded buffer");
                }
                assert_eq!(l.shard_numel() * world, l.padded_numel());
                let pad: usize = (0..world).map(|r| l.padding_in_shard(r).unwrap()).sum();
                assert_eq!(pad, l.padding_in_full());
            }
        }
    }
}

#[test]
fn pieces_cover_every_parameter_exactly_once() {
    for spec in specs() {
        for world in [1, 3, 4, 7, 5000] {
            let l = PartitionLayout::new(&spec, world, 4).unwrap();
            let mut covered: Vec<Vec<bool>> =
                l.params.iter().map(|p| vec![false; p.numel]).collect();
            for (i, u) in l.units.iter().enumerate() {
                for r in 0..world {
                    let mut in_shard = 0;
                    for p in l.shard_pieces(i, r).unwrap() {
                        assert_eq!(p.in_param.len(), p.in_range.len());
                        assert!(p.in_range.end <= u.shard_len);
                        assert_eq!(l.params[p.param].unit, i);
                        // The flat position of the piece equals its parameter position.
                        let flat = r * u.shard_len + p.in_range.start;
                        assert_eq!(flat, l.params[p.param].offset + p.in_param.start);
                        for e in p.in_param.clone() {
                            assert!(!covered[p.param][e], "element covered twice");
                            covered[p.param][e] = true;
                        }
                        in_shard += p.in_range.len();
                    }
                    // What pieces leave uncovered is exactly this shard's padding.
                    let shard = r * u.shard_len..(r + 1) * u.shard_len;
                    let pad = intersect(&shard, &(u.numel..u.padded_len)).len();
                    assert_eq!(in_shard + pad, u.shard_len);
                }
            }
            assert!(
                covered.iter().flatten().all(|&c| c),
                "every element covered"
            );
        }
    }
}

#[test]
fn segments_follow_weight_decay_and_cover_the_shard() {
    let spec = tied_spec(65, 16, 2, 8);
    for world in [1, 2, 3, 5] {
        let l = PartitionLayout::new(&spec, world, 8).unwrap();
        for r in 0..world {
            let segs = l.shard_segments(r).unwrap();
            assert_eq!(segs.first().unwrap().range.start, 0);
            assert_eq!(segs.last().unwrap().range.end, l.shard_numel());
            for w in segs.windows(2) {
                assert_eq!(w[0].range.end, w[1].range.start);
                assert_ne!(w[0].weight_decay, w[1].weight_decay, "runs are merged");
            }
            // Count decayed elements through pieces: equals the segment total.
            let mut decayed = 0;
            for i in 0..l.units.len() {
                for p in l.shard_pieces(i, r).unwrap() {
                    if l.params[p.param].weight_decay {
                        decayed += p.in_range.len();
                    }
                }
            }
            let seg_decayed: usize = segs
                .iter()
                .filter(|s| s.weight_decay)
                .map(|s| s.range.len())
                .sum();
            assert_eq!(decayed, seg_decayed);
        }
        let full = l.full_segments();
        assert_eq!(full.last().unwrap().range.end, l.padded_numel());
        let wd: usize = l
            .params
            .iter()
            .filter(|p| p.weight_decay)
            .map(|p| p.numel)
            .sum();
        let seg_wd: usize = full
            .iter()
            .filter(|s| s.weight_decay)
            .map(|s| s.range.len())
            .sum();
        assert_eq!(wd, seg_wd);
    }
}

#[test]
fn reshard_moves_every_element_to_its_new_owner() {
    let spec = tied_spec(65, 16, 2, 8);
    for (n, m) in [(4, 3), (3, 4), (1, 5), (7, 2), (2, 2)] {
        let old = PartitionLayout::new(&spec, n, 4).unwrap();
        let new = PartitionLayout::new(&spec, m, 8).unwrap();
        for (i, u) in new.units.iter().enumerate() {
            let mut got = vec![usize::MAX; u.numel];
            for r in 0..m {
                for c in new.reshard_from(&old, r).unwrap() {
                    if c.unit != i {
                        continue;
                    }
                    assert_eq!(c.from.len(), c.to.len());
                    let ou = &old.units[i];
                    for k in 0..c.to.len() {
                        // Element index in the unit, seen from old and new shards.
                        let from_flat = c.from_rank * ou.shard_len + c.from.start + k;
                        let to_flat = r * u.shard_len + c.to.start + k;
                        assert_eq!(from_flat, to_flat);
                        assert_eq!(got[to_flat], usize::MAX, "element copied twice");
                        got[to_flat] = from_flat;
                    }
                }
            }
            assert!(got.iter().all(|&g| g != usize::MAX), "every element copied");
        }
    }
}

#[test]
fn layout_round_trips_through_serde_and_refuses_other_models() {
    let spec = tied_spec(65, 16, 2, 8);
    let l = PartitionLayout::new(&spec, 3, DEFAULT_ALIGN).unwrap();
    let text = toml::to_string(&l).unwrap();
    let back: PartitionLayout = toml::from_str(&text).unwrap();
    assert_eq!(back, l);
    let other = PartitionLayout::new(&tied_spec(65, 16, 3, 8), 3, DEFAULT_ALIGN).unwrap();
    assert!(matches!(
        l.reshard_from(&other, 0),
        Err(LayoutError::Incompatible(_))
    ));
}

#[test]
fn bad_arguments_are_errors() {
    let spec = chain(&[10]);
    assert_eq!(
        PartitionLayout::new(&spec, 0, 1).unwrap_err(),
        LayoutError::ZeroWorld
    );
    assert_eq!(
        PartitionLayout::new(&spec, 1, 0).unwrap_err(),
        LayoutError::ZeroAlign
    );
    // Sizes a checkpoint could not be read back with, or whose product overflows.
    for (world, align) in [(2, MAX_ALIGN + 1), (MAX_WORLD + 1, 1), (4, 1 << 62)] {
        assert_eq!(
            PartitionLayout::new(&spec, world, align).unwrap_err(),
            LayoutError::TooLarge { world, align }
        );
    }
    let largest = PartitionLayout::new(&spec, 2, MAX_ALIGN).unwrap();
    largest.check_consistent().unwrap();
    // A layout not made by `new` (deserialised, unchecked) with empty shards: an error.
    let mut empty = PartitionLayout::new(&spec, 2, 1).unwrap();
    empty.units[0].shard_len = 0;
    let to = PartitionLayout::new(&spec, 1, 1).unwrap();
    assert!(matches!(
        to.reshard_from(&empty, 0),
        Err(LayoutError::Inconsistent(_))
    ));
    let l = PartitionLayout::new(&spec, 2, 1).unwrap();
    assert_eq!(
        l.shard_range(0, 2).unwrap_err(),
        LayoutError::BadRank { rank: 2, world: 2 }
    );
    assert!(l.shard_range(1, 0).is_err());
    assert!(l.pieces(0, 0..11).is_err());
    let msg = l.shard_range(0, 2).unwrap_err().to_string();
    assert!(
        msg.contains("rank 2") && msg.contains("world size 2"),
        "{msg}"
    );
}

#[test]
fn n_larger_than_a_unit_leaves_ranks_with_padding_only() {
    let l = PartitionLayout::new(&chain(&[3]), 8, 1).unwrap();
    assert_eq!(l.units[0].padded_len, 8);
    assert_eq!(l.units[0].shard_len, 1);
    assert_eq!(l.shard_pieces(0, 2).unwrap().len(), 1);
    assert!(l.shard_pieces(0, 3).unwrap().is_empty());
    assert_eq!(l.padding_in_shard(0).unwrap(), 0);
    assert_eq!(l.padding_in_shard(7).unwrap(), 1);
}
