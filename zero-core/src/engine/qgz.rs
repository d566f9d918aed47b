//! Quantized gradient reduction (ZeRO++'s qgZ, Wang et al. 2023, section 4.3;
//! `zero.quantize_grads`): the reduce-scatter of one bucket chunk, done as two
//! all-to-alls of block-wise int8 codes, first inside the node and then across nodes,
//! with the values read back and summed in f32 after each.
//!
//! On M nodes of L ranks (world rank r = m L + j), a chunk of c elements per rank is N
//! blocks of c, block q destined to rank q. The reducer packs them ordered by (local
//! rank, node): position j M + m' holds the block of rank m' L + j, so the M blocks bound
//! for the ranks of local index j (one on every node) are one run of M c values.
//!
//! ```text
//! inside the node (node group, L ranks):
//!   quantize run j (M c values) for every node peer j -> all-to-all codes and scales
//!   sums = Σ over the L peers i (in order) of dequantized run i   (M c f32)
//!   sums[m'] = Σ over this node's ranks of their block for rank m' L + j
//! across nodes (cross group, M ranks of local index j):
//!   quantize sums[m'] (c values) for node m'                 -> all-to-all codes and scales
//!   piece = Σ over the M nodes (in order) of dequantized block  (c values, rounded to W)
//! ```
//!
//! Codes are int8 or, with `zero.grad_quant_bits = 4`, int4 (two a byte): a run of r
//! values is `grad_code_bytes(r)` bytes of codes.
//!
//! Each exchange quantizes only what crosses a link: with L = 1 (M = 1) the first
//! (second) exchange has no peer and the values are taken as they are. Sums are in a
//! fixed order, so every rank's result is deterministic; a rank's own block is read
//! back from its codes like the others', as qwZ does.

use zero_comm::{on_stream, Communicator, NodeGroups};
use zero_kernels::device::{Buffer, DView, DViewMut, Device};
use zero_kernels::quant::scale_count;
use zero_kernels::Float;

use super::EngineError;
use crate::plan::grad_code_bytes;

/// The staging of quantized gradient reductions, used one chunk at a time on the comm
/// stream (sized by the plan for the largest chunk).
pub(crate) struct GradQuantStaging<D: Device> {
    /// Values per scale.
    pub block: usize,
    /// Bits per code: 8 or 4.
    pub bits: usize,
    /// Codes sent (int8: N c bytes inside the node, M c across).
    pub send_codes: D::Buf<u8>,
    /// Their scales.
    pub send_scales: D::Buf<f32>,
    /// Codes received.
    pub recv_codes: D::Buf<u8>,
    /// Their scales.
    pub recv_scales: D::Buf<f32>,
    /// f32 sums of the M runs.
    pub sums: D::Buf<f32>,
    /// One peer's dequantized values.
    pub peer: D::Buf<f32>,
}

impl<D: Device> GradQuantStaging<D> {
    /// Reduce a packed chunk (`packed`: N blocks of c = `piece.len()`, ordered by
    /// (local rank, node)) into this rank's `piece`, on `stream`.
    pub fn reduce<W: Float, C: Communicator>(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        nodes: &NodeGroups<C>,
        packed: DView<'_, D, W>,
        mut piece: DViewMut<'_, D, W>,
    ) -> Result<(), EngineError> {
        let (l, m, c, b) = (
            nodes.node.size(),
            nodes.cross.size(),
            piece.len(),
            self.block,
        );
        if packed.len() != l * m * c {
            return Err(EngineError::Internal(format!(
                "qgZ chunk of {} values for {l} x {m} ranks of {c}",
                packed.len()
            )));
        }
        // Inside the node: run j of M c values goes to node peer j.
        let run = m * c;
        if l > 1 {
            let ns = scale_count(run, b);
            self.exchange(dev, stream, &nodes.node, packed, run, ns)?;
            self.sum_runs(dev, stream, l, run, ns)?;
        } else {
            dev.cast(stream, packed, self.sums.slice_mut(0..run))?;
        }
        // Across nodes: block m' of the sums goes to node m'.
        if m > 1 {
            let ns = scale_count(c, b);
            let cb = grad_code_bytes(c, self.bits);
            let sums = self.sums.slice(0..run);
            // The sums are read before the exchange writes anything, so the quantized
            // copy may come from the buffer the results are summed into.
            quantize_runs(
                dev,
                stream,
                sums,
                c,
                (b, self.bits),
                self.send_codes.slice_mut(0..m * cb),
                self.send_scales.slice_mut(0..m * ns),
            )?;
            self.all_to_all(dev, stream, &nodes.cross, m * cb, m * ns)?;
            self.sum_runs(dev, stream, m, c, ns)?;
        }
        dev.cast(stream, self.sums.slice(0..c), piece.reborrow())?;
        Ok(())
    }

    /// Quantize `src` as runs of `run` values and all-to-all the codes and scales.
    fn exchange<W: Float, C: Communicator>(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        comm: &C,
        src: DView<'_, D, W>,
        run: usize,
        ns: usize,
    ) -> Result<(), EngineError> {
        let (g, b) = (comm.size(), self.block);
        let cb = grad_code_bytes(run, self.bits);
        quantize_runs(
            dev,
            stream,
            src,
            run,
            (b, self.bits),
            self.send_codes.slice_mut(0..g * cb),
            self.send_scales.slice_mut(0..g * ns),
        )?;
        self.all_to_all(dev, stream, comm, g * cb, g * ns)
    }

    fn all_to_all<C: Communicator>(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        comm: &C,
        codes: usize,
        scales: usize,
    ) -> Result<(), EngineError> {
        on_stream::all_to_all(
            comm,
            dev,
            stream,
            self.send_codes.slice(0..codes),
            self.recv_codes.slice_mut(0..codes),
        )?;
        on_stream::all_to_all(
            comm,
            dev,
            stream,
            self.send_scales.slice(0..scales),
            self.recv_scales.slice_mut(0..scales),
        )?;
        Ok(())
    }

    /// sums[0..run] = Σ over the g received runs (in peer order) of their values.
    fn sum_runs(
        &mut self,
        dev: &D,
        stream: &D::Stream,
        g: usize,
        run: usize,
        ns: usize,
    ) -> Result<(), EngineError> {
        let (b, bits) = (self.block, self.bits);
        let cb = grad_code_bytes(run, bits);
        for i in 0..g {
            let codes = self.recv_codes.slice(i * cb..(i + 1) * cb);
            let scales = self.recv_scales.slice(i * ns..(i + 1) * ns);
            if i == 0 {
                let dst = self.sums.slice_mut(0..run);
                dequantize(dev, stream, codes, scales, (b, bits), dst)?;
            } else {
                let dst = self.peer.slice_mut(0..run);
                dequantize(dev, stream, codes, scales, (b, bits), dst)?;
                dev.accumulate(stream, self.sums.slice_mut(0..run), self.peer.slice(0..run))?;
            }
        }
        Ok(())
    }
}

/// Quantize `src` as consecutive runs of `run` values, each with its own blocks (a block
/// never spans two destinations): run k's codes at `k cb` (cb: the run's code bytes),
/// its scales at `k ns`. `(block, bits)`: values per scale, bits per code.
fn quantize_runs<D: Device, T: Float>(
    dev: &D,
    stream: &D::Stream,
    src: DView<'_, D, T>,
    run: usize,
    (block, bits): (usize, usize),
    mut codes: DViewMut<'_, D, u8>,
    mut scales: DViewMut<'_, D, f32>,
) -> Result<(), EngineError> {
    let (ns, cb) = (scale_count(run, block), grad_code_bytes(run, bits));
    for k in 0..src.len() / run.max(1) {
        let x = src.slice(k * run..(k + 1) * run);
        let q = codes.reborrow().slice_mut(k * cb..(k + 1) * cb);
        let s = scales.reborrow().slice_mut(k * ns..(k + 1) * ns);
        match bits {
            4 => dev.quantize_int4(stream, x, block, q, s)?,
            _ => dev.quantize_int8(stream, x, block, q, s)?,
        }
    }
    Ok(())
}

/// Read codes of `(block, bits)` back into `dst`.
fn dequantize<D: Device>(
    dev: &D,
    stream: &D::Stream,
    codes: DView<'_, D, u8>,
    scales: DView<'_, D, f32>,
    (block, bits): (usize, usize),
    dst: DViewMut<'_, D, f32>,
) -> Result<(), EngineError> {
    match bits {
        4 => dev.dequantize_int4(stream, codes, scales, block, dst)?,
        _ => dev.dequantize_int8(stream, codes, scales, block, dst)?,
    }
    Ok(())
}

/// Where the reducer packs world block `q` of a chunk for qgZ: ordered by (local rank,
/// node), so that each node peer's blocks are one run.
pub(crate) fn packed_position(q: usize, ranks_per_node: usize, nodes: usize) -> usize {
    (q % ranks_per_node) * nodes + q / ranks_per_node
}

#[cfg(test)]
mod tests {
    use super::*;
    use zero_comm::{run_local_on_nodes, CommConfig, ReduceOp};
    use zero_kernels::device::HostDevice;

    /// Every rank's chunk of N blocks of c, by a value function of (rank, element).
    fn chunk(n: usize, c: usize, rank: usize, value: &dyn Fn(usize, usize) -> f32) -> Vec<f32> {
        (0..n * c).map(|i| value(rank, i)).collect()
    }

    /// qgZ's reduction of every rank's chunk with codes of `bits`, and the flat
    /// reduce-scatter of the same chunks, on `n` thread ranks in nodes of `l`: (qgZ,
    /// flat) per rank.
    fn both(
        (n, l, c): (usize, usize, usize),
        (block, bits): (usize, usize),
        value: &(dyn Fn(usize, usize) -> f32 + Sync),
    ) -> Vec<(Vec<f32>, Vec<f32>)> {
        let m = n / l;
        run_local_on_nodes(n, l, CommConfig::default(), |world, nodes| {
            let dev = HostDevice::new();
            let s = dev.stream("comm").unwrap();
            let rank = world.rank();
            let mine = chunk(n, c, rank, value);
            // Pack as the reducer does: world block q at (local rank, node) order.
            let mut packed = vec![0.0f32; n * c];
            for q in 0..n {
                let at = packed_position(q, l, m);
                packed[at * c..(at + 1) * c].copy_from_slice(&mine[q * c..(q + 1) * c]);
            }
            let scales = crate::plan::grad_quant_scales(l, m, c, block);
            let codes = crate::plan::grad_quant_code_bytes(l, m, c, bits);
            let mut staging = GradQuantStaging::<HostDevice> {
                block,
                bits,
                send_codes: dev.alloc::<u8>(codes, "codes").unwrap(),
                send_scales: dev.alloc::<f32>(scales, "scales").unwrap(),
                recv_codes: dev.alloc::<u8>(codes, "codes").unwrap(),
                recv_scales: dev.alloc::<f32>(scales, "scales").unwrap(),
                sums: dev.alloc::<f32>(m * c, "sums").unwrap(),
                peer: dev.alloc::<f32>(m * c, "peer").unwrap(),
            };
            let mut input = dev.alloc::<f32>(n * c, "input").unwrap();
            dev.upload(&s, &packed, input.view_mut()).unwrap();
            let mut piece = dev.alloc::<f32>(c, "piece").unwrap();
            staging
                .reduce(&dev, &s, &nodes, input.view(), piece.view_mut())
                .unwrap();
            let mut got = vec![0.0f32; c];
            dev.download(&s, piece.view(), &mut got).unwrap();
            let mut flat = vec![0.0f32; c];
            world
                .reduce_scatter(&mine[..], &mut flat[..], ReduceOp::Sum)
                .unwrap();
            (got, flat)
        })
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
    }

    /// Values the code grid holds exactly (a weight times integers up to q = 127 for
    /// int8, 7 for int4, each block's amax q times the weight, and node sums likewise)
    /// make the quantized hierarchy exact: it must then equal the flat reduce-scatter bit
    /// for bit, which checks the packing order and both exchanges' routing.
    #[test]
    fn lossless_values_equal_the_flat_reduce_scatter_bitwise() {
        for (bits, q) in [(8, 127usize), (4, 7)] {
            for (n, l) in [(4, 2), (6, 3), (6, 2), (4, 1), (4, 4), (8, 2)] {
                let (c, block) = (24, 8);
                // Rank r sends (r + 1) v(i): its blocks' scale is r + 1 and its codes v;
                // a node's sums are W v with W its ranks' weights, on the grid of scale
                // W. The weights differ by rank and node, so a wrong source or
                // destination shows.
                let v = move |i: usize| {
                    if i.is_multiple_of(block) {
                        q as f32
                    } else {
                        ((i * 37) % (2 * q + 1)) as f32 - q as f32
                    }
                };
                let value = move |rank: usize, i: usize| (rank + 1) as f32 * v(i);
                let runs = both((n, l, c), (block, bits), &value);
                for (r, (got, flat)) in runs.into_iter().enumerate() {
                    let g: Vec<u32> = got.iter().map(|x| x.to_bits()).collect();
                    let f: Vec<u32> = flat.iter().map(|x| x.to_bits()).collect();
                    assert_eq!(g, f, "int{bits} N = {n}, L = {l}, rank {r}");
                }
            }
        }
    }

    /// Any values: the result is within the rounding the two quantizations allow of the
    /// exact (f64) sum: inside the node each of the L values moves by at most its block's
    /// amax / (2q) (q = 127 for int8, 7 for int4), across nodes each of the M node sums
    /// by at most its block's amax / (2q).
    #[test]
    fn any_values_stay_within_the_quantization_bound() {
        for (bits, q) in [(8, 127.0), (4, 7.0)] {
            for (n, l) in [(4, 2), (6, 3), (4, 1), (4, 4)] {
                let (c, block) = (40, 16);
                let m = n / l;
                let value = |rank: usize, i: usize| {
                    let x = ((rank * 7919 + i * 104_729) % 1000) as f32 / 500.0 - 1.0;
                    x * (1.0 + (i % 5) as f32)
                };
                let runs = both((n, l, c), (block, bits), &value);
                for (r, (got, _)) in runs.into_iter().enumerate() {
                    for (k, g) in got.iter().enumerate() {
                        let i = r * c + k;
                        let exact: f64 = (0..n).map(|p| value(p, i) as f64).sum();
                        // Largest |value| anywhere is 5: one quantization inside the node
                        // per value (skipped when L = 1), one across per node sum (each
                        // below 5 L).
                        let half_step = 5.0 / (2.0 * q);
                        let inside = if l > 1 { n as f64 * half_step } else { 0.0 };
                        let across = if m > 1 {
                            (m * l) as f64 * half_step
                        } else {
                            0.0
                        };
                        let bound = inside + across + 1e-5;
                        assert!(
                            (*g as f64 - exact).abs() <= bound,
                            "int{bits} N = {n}, L = {l}, rank {r}, element {k}: {g} vs {exact} (bound {bound})"
                        );
                    }
                }
            }
        }
    }
}
