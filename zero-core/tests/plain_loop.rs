//! An independent check of stage 0: on one rank, the engine's steps equal, bit for bit, a
//! plain training loop written here without the engine: the model's own layer-by-layer
//! forward and backward on one buffer per unit, the global norm by the kernels' fixed
//! summation order, torch's clipping rule, and the scalar AdamW reference
//! (`zero_kernels::adamw::reference::update`) element by element, weight decay by each
//! parameter's identity.

mod common;

use common::models::char_lm::{CharLm, TokenBatch};
use common::{config, lm_batch, SEQ};
use zero_core::model::{Compute, Model, UnitGrads, UnitParams};
use zero_core::{Engine, Precision, Stage};
use zero_kernels::adamw::{reference, AdamWCoeffs, AdamWHyper};
use zero_kernels::device::{Buffer, Device, HostDevice};
use zero_kernels::{gradstats, Exec, FloatSlice};

const STEPS: u64 = 5;
const ACCUM: usize = 2;

#[test]
fn one_rank_stage_0_is_the_plain_loop_bit_for_bit() {
    let mut c = config(Stage::Zero0, Precision::Fp32, ACCUM);
    c.optim.grad_clip = 0.5; // small enough that clipping happens
                             // The engine.
    let engine_losses = zero_comm::run_local(1, Default::default(), |comm| {
        let dev = HostDevice::new();
        let mut model = CharLm::new(&dev, common::lm_config()).unwrap();
        let mut engine = Engine::new(&c, &comm, &dev, &model).unwrap();
        let mut losses = Vec::new();
        for step in 0..STEPS {
            let io: Vec<_> = (0..ACCUM).map(|m| lm_batch(step, m, 0, 1, ACCUM)).collect();
            let b: Vec<TokenBatch<'_>> = io
                .iter()
                .map(|(x, y)| TokenBatch {
                    inputs: x,
                    targets: y,
                    seq_len: SEQ,
                })
                .collect();
            losses.push(engine.step(&mut model, &b).unwrap().loss);
        }
        (losses, engine.full_master_f32().unwrap())
    });
    let (engine_losses, engine_master) = engine_losses.into_iter().next().unwrap().unwrap();

    // The plain loop.
    let dev = HostDevice::new();
    let stream = dev.stream("compute").unwrap();
    let cx = Compute {
        dev: &dev,
        stream: &stream,
    };
    let mut model = CharLm::new(&dev, common::lm_config()).unwrap();
    let spec = model.spec().clone();
    let mut params: Vec<Vec<f32>> = spec
        .units
        .iter()
        .enumerate()
        .map(|(u, unit)| {
            let mut v = vec![0.0f32; unit.numel()];
            model.init_unit(c.seed, u, &mut v);
            v
        })
        .collect();
    let mut m: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut v = m.clone();
    let mut losses = Vec::new();
    let mut clipped = 0;
    for step in 0..STEPS {
        let pbuf: Vec<_> = params
            .iter()
            .map(|p| {
                let mut b = dev.alloc::<f32>(p.len(), "p").unwrap();
                dev.upload(&stream, p, b.view_mut()).unwrap();
                b
            })
            .collect();
        let mut gbuf: Vec<_> = params
            .iter()
            .map(|p| dev.alloc::<f32>(p.len(), "g").unwrap())
            .collect();
        let mut loss_sum = 0.0f64;
        for micro in 0..ACCUM {
            let (x, y) = lm_batch(step, micro, 0, 1, ACCUM);
            model
                .begin_micro_step(
                    cx,
                    &TokenBatch {
                        inputs: &x,
                        targets: &y,
                        seq_len: SEQ,
                    },
                )
                .unwrap();
            for (l, layer) in spec.layers.iter().enumerate() {
                let p: Vec<_> = layer
                    .units
                    .iter()
                    .map(|&u| UnitParams::new(&spec.units[u], pbuf[u].view()))
                    .collect();
                model.forward_layer(cx, l, &p).unwrap();
            }
            let mut loss = [0.0f32];
            dev.download(&stream, model.loss(), &mut loss).unwrap();
            loss_sum += loss[0] as f64;
            for (l, layer) in spec.layers.iter().enumerate().rev() {
                // As the engine: no parameters for a lookup's backward.
                let p: Vec<_> = layer
                    .backward_units()
                    .iter()
                    .map(|&u| UnitParams::new(&spec.units[u], pbuf[u].view()))
                    .collect();
                // The layer's units are distinct: take their gradient buffers out in order.
                let mut picked: Vec<(usize, _)> = gbuf
                    .iter_mut()
                    .enumerate()
                    .filter(|(u, _)| layer.units.contains(u))
                    .collect();
                picked.sort_by_key(|(u, _)| layer.units.iter().position(|x| x == u));
                let mut g: Vec<_> = picked
                    .into_iter()
                    .map(|(u, b)| UnitGrads::new(&spec.units[u], b.view_mut()))
                    .collect();
                // One rank, A micro-batches: each micro-batch's loss weighs 1/A.
                model
                    .backward_layer(cx, l, &p, &mut g, 1.0 / ACCUM as f32)
                    .unwrap();
            }
        }
        losses.push(loss_sum / ACCUM as f64);
        let grads: Vec<Vec<f32>> = gbuf
            .iter()
            .map(|b| {
                let mut h = vec![0.0f32; b.len()];
                dev.download(&stream, b.view(), &mut h).unwrap();
                h
            })
            .collect();
        // The global norm, unit by unit in the kernels' fixed order; torch's clip rule.
        let exec = Exec::default();
        let sum_squares: f64 = grads
            .iter()
            .map(|g| gradstats::stats(&exec, FloatSlice::F32(g), 1.0).sum_squares)
            .sum();
        let norm = sum_squares.sqrt();
        let clip = c.optim.grad_clip;
        let coef = if norm > clip {
            clip / (norm + 1e-6)
        } else {
            1.0
        };
        clipped += usize::from(norm > clip);
        let o = &c.optim;
        let hyper = AdamWHyper {
            lr: o.lr,
            beta1: o.betas[0],
            beta2: o.betas[1],
            eps: o.eps,
            weight_decay: o.weight_decay,
        };
        for (u, unit) in spec.units.iter().enumerate() {
            let mut at = 0;
            for p in &unit.params {
                let k = AdamWCoeffs::new(&hyper, step + 1, coef as f32, p.weight_decay).unwrap();
                for i in at..at + p.numel() {
                    let (pi, mi, vi) =
                        reference::update(&k, grads[u][i], params[u][i], m[u][i], v[u][i]);
                    params[u][i] = pi;
                    m[u][i] = mi;
                    v[u][i] = vi;
                }
                at += p.numel();
            }
        }
    }
    let flat: Vec<f32> = params.concat();
    assert_eq!(
        losses.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        engine_losses
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        "losses: loop {losses:?} vs engine {engine_losses:?}"
    );
    let fb: Vec<u32> = flat.iter().map(|x| x.to_bits()).collect();
    let eb: Vec<u32> = engine_master.iter().map(|x| x.to_bits()).collect();
    assert_eq!(fb, eb, "weights after {STEPS} steps");
    assert!(
        losses[STEPS as usize - 1] < losses[0],
        "it trains: {losses:?}"
    );
    assert!(clipped > 0, "the clipping path was exercised");
}
