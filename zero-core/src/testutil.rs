//! Model specs for unit tests: a spec with a table unit used by the first and the last
//! layer (a tied unit, the shape language models have), blocks in between, and a small
//! final unit; the same with the table split into row blocks; and one-unit-per-layer
//! specs of any size (no allocation).

use crate::spec::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};

/// Units `table` (a [rows, width] table and a [positions, width] one), `block.i` (eleven
/// tensors of 1-D and 2-D shapes, 12 width^2 + 13 width elements), `final` (two 1-D);
/// layers `first` (table), `block.i`, `last` (final and the tied table).
pub fn tied_spec(rows: usize, positions: usize, blocks: usize, c: usize) -> ModelSpec {
    let mut units = vec![UnitSpec {
        name: "table".into(),
        params: vec![
            ParamSpec::new("table.rows", &[rows, c]),
            ParamSpec::new("table.positions", &[positions, c]),
        ],
    }];
    for i in 0..blocks {
        let p = |s: &str, shape: &[usize]| ParamSpec::new(format!("block.{i}.{s}"), shape);
        units.push(UnitSpec {
            name: format!("block.{i}"),
            params: vec![
                p("norm1.weight", &[c]),
                p("norm1.bias", &[c]),
                p("mix.weight", &[3 * c, c]),
                p("mix.bias", &[3 * c]),
                p("proj.weight", &[c, c]),
                p("proj.bias", &[c]),
                p("norm2.weight", &[c]),
                p("norm2.bias", &[c]),
                p("up.weight", &[4 * c, c]),
                p("up.bias", &[4 * c]),
                p("down.weight", &[c, 4 * c]),
                p("down.bias", &[c]),
            ],
        });
    }
    units.push(UnitSpec {
        name: "final".into(),
        params: vec![
            ParamSpec::new("final.weight", &[c]),
            ParamSpec::new("final.bias", &[c]),
        ],
    });
    let mut lspecs = vec![LayerSpec::new("first", vec![0])];
    for i in 0..blocks {
        lspecs.push(LayerSpec::new(format!("block.{i}"), vec![i + 1]));
    }
    lspecs.push(LayerSpec::new("last", vec![blocks + 1, 0]));
    ModelSpec {
        units,
        layers: lspecs,
    }
}

/// [`tied_spec`] with the table's rows split into blocks of `block_rows`
/// ([`ParamSpec::split_rows`]): block 0 stays in unit `table` with the positions, each
/// other block is a unit of its own, looked up by a layer of its own before `first` and
/// read by one after `last` (k blocks: k - 1 more units and 2 (k - 1) more layers).
pub fn tied_split_spec(
    rows: usize,
    positions: usize,
    blocks: usize,
    c: usize,
    block_rows: usize,
) -> ModelSpec {
    let mut spec = tied_spec(rows, positions, blocks, c);
    let table = ParamSpec::split_rows("table.rows", &[rows, c], block_rows);
    let more = table.len() - 1;
    let mut table = table.into_iter();
    spec.units[0].params[0] = table.next().expect("at least one block");
    // Units: [table, block 1.., block.i.., final]; every old unit index past 0 shifts.
    let extra: Vec<UnitSpec> = table
        .map(|b| UnitSpec {
            name: b.name.clone(),
            params: vec![b],
        })
        .collect();
    spec.units.splice(1..1, extra);
    for layer in &mut spec.layers {
        layer
            .units
            .iter_mut()
            .filter(|u| **u > 0)
            .for_each(|u| *u += more);
    }
    let lookups = (1..=more).map(|k| LayerSpec::new(format!("first.{k}"), vec![k]));
    spec.layers.splice(0..0, lookups);
    spec.layers
        .extend((1..=more).map(|k| LayerSpec::new(format!("last.{k}"), vec![k])));
    spec
}

/// One unit and one layer per entry of `sizes`, each a single 1-D or 2-D parameter.
pub fn chain(sizes: &[usize]) -> ModelSpec {
    let units = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| UnitSpec {
            name: format!("u{i}"),
            params: vec![ParamSpec::new(format!("u{i}.w"), &[n])],
        })
        .collect();
    let layers = (0..sizes.len())
        .map(|i| LayerSpec::new(format!("l{i}"), vec![i]))
        .collect();
    ModelSpec { units, layers }
}
