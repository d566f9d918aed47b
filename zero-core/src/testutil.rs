//! Model specs for unit tests: a GPT-2-shaped spec (tied embedding used by the first and
//! last layer) and one-unit-per-layer synthetic specs of any size (no allocation).

use crate::spec::{LayerSpec, ModelSpec, ParamSpec, UnitSpec};

/// GPT-2-shaped spec: units `embed` (wte, wpe), `h.i`, `ln_f`; layers `embed`, `h.i`,
/// `head` (reads `ln_f` and the tied `embed`).
pub fn gpt_like(vocab: usize, context: usize, layers: usize, c: usize) -> ModelSpec {
    let mut units = vec![UnitSpec {
        name: "embed".into(),
        params: vec![
            ParamSpec::new("wte", &[vocab, c]),
            ParamSpec::new("wpe", &[context, c]),
        ],
    }];
    for i in 0..layers {
        let p = |s: &str, shape: &[usize]| ParamSpec::new(format!("h.{i}.{s}"), shape);
        units.push(UnitSpec {
            name: format!("h.{i}"),
            params: vec![
                p("ln_1.weight", &[c]),
                p("ln_1.bias", &[c]),
                p("attn.c_attn.weight", &[3 * c, c]),
                p("attn.c_attn.bias", &[3 * c]),
                p("attn.c_proj.weight", &[c, c]),
                p("attn.c_proj.bias", &[c]),
                p("ln_2.weight", &[c]),
                p("ln_2.bias", &[c]),
                p("mlp.c_fc.weight", &[4 * c, c]),
                p("mlp.c_fc.bias", &[4 * c]),
                p("mlp.c_proj.weight", &[c, 4 * c]),
                p("mlp.c_proj.bias", &[c]),
            ],
        });
    }
    units.push(UnitSpec {
        name: "ln_f".into(),
        params: vec![
            ParamSpec::new("ln_f.weight", &[c]),
            ParamSpec::new("ln_f.bias", &[c]),
        ],
    });
    let mut lspecs = vec![LayerSpec {
        name: "embed".into(),
        units: vec![0],
    }];
    for i in 0..layers {
        lspecs.push(LayerSpec {
            name: format!("h.{i}"),
            units: vec![i + 1],
        });
    }
    lspecs.push(LayerSpec {
        name: "head".into(),
        units: vec![layers + 1, 0],
    });
    ModelSpec {
        units,
        layers: lspecs,
    }
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
        .map(|i| LayerSpec {
            name: format!("l{i}"),
            units: vec![i],
        })
        .collect();
    ModelSpec { units, layers }
}
