//! Self-test: every collective (all-to-all included) on every dtype against a serially computed answer, on
//! whatever communicator it is given (any size, odd sizes, zero-length buffers, sizes not
//! divisible by the rank count where the collective allows it), blocking and non-blocking,
//! halves in both sum modes. Used by `zero-bench micro comm --self-test` and the
//! multi-rank tests.
//!
//! Inputs are small integers (rank r, element i: (7r + 3i + 1) mod 11), so every partial
//! sum of up to 16 ranks (< 176) is exact in every type, bf16 (8-bit significand) included;
//! the expected results are therefore exact, and compared bitwise, whatever order MPI
//! reduces in.

use crate::communicator::{Communicator, ReduceOp};
use crate::config::HalfSum;
use crate::error::Result;
use crate::{DType, Element};
use half::{bf16, f16};

/// The outcome of one case on this rank.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// e.g. `all_reduce(sum) bf16 n=7 [upcast]`.
    pub name: String,
    /// Whether this rank's output matched.
    pub ok: bool,
    /// First difference, when not ok.
    pub detail: String,
}

/// Element types the self-test can fill with small integers.
pub trait TestElem: Element {
    /// The value `v` (0..=255) in this type.
    fn from_small(v: i64) -> Self;
}

macro_rules! test_elem {
    ($($t:ty => $e:expr),* $(,)?) => {$(
        impl TestElem for $t {
            fn from_small(v: i64) -> Self {
                let f: fn(i64) -> $t = $e;
                f(v)
            }
        }
    )*};
}

test_elem!(
    f32 => |v| v as f32,
    f64 => |v| v as f64,
    bf16 => |v| bf16::from_f32(v as f32),
    f16 => |v| f16::from_f32(v as f32),
    u8 => |v| v as u8,
    u32 => |v| v as u32,
    i32 => |v| v as i32,
    i64 => |v| v,
);

/// Input element `i` of rank `r`.
pub fn input_value(r: usize, i: usize) -> i64 {
    ((7 * r + 3 * i + 1) % 11) as i64
}

fn input<T: TestElem>(r: usize, n: usize, offset: usize) -> Vec<T> {
    (0..n)
        .map(|i| T::from_small(input_value(r, offset + i)))
        .collect()
}

fn reduce(op: ReduceOp, size: usize, i: usize) -> i64 {
    let vals = (0..size).map(|r| input_value(r, i));
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Max => vals.max().unwrap_or(0),
    }
}

fn compare<T: TestElem>(name: String, got: &[T], want: &[T]) -> CaseResult {
    let detail = if got.len() != want.len() {
        format!("length {} != expected {}", got.len(), want.len())
    } else if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        format!("element {i}: got {:?}, expected {:?}", got[i], want[i])
    } else {
        String::new()
    };
    CaseResult {
        ok: detail.is_empty(),
        name,
        detail,
    }
}

fn cases_for<T: TestElem, C: Communicator>(
    c: &C,
    tag: &str,
    out: &mut Vec<CaseResult>,
) -> Result<()> {
    let (n_ranks, me) = (c.size(), c.rank());
    let d = T::DTYPE;
    let ops = [ReduceOp::Sum, ReduceOp::Max];
    // All-reduce: any length.
    for n in [0, 1, 7, 3 * n_ranks + 1, 1001] {
        for op in ops {
            let want: Vec<T> = (0..n)
                .map(|i| T::from_small(reduce(op, n_ranks, i)))
                .collect();
            let mut buf = input::<T>(me, n, 0);
            c.all_reduce(&mut buf[..], op)?;
            out.push(compare(
                format!("all_reduce({}) {d} n={n}{tag}", op.name()),
                &buf,
                &want,
            ));
            let send = input::<T>(me, n, 0);
            let mut recv = vec![T::default(); n];
            c.all_reduce_into(&send[..], &mut recv[..], op)?;
            out.push(compare(
                format!("all_reduce_into({}) {d} n={n}{tag}", op.name()),
                &recv,
                &want,
            ));
        }
    }
    // Reduce-scatter and all-gather: equal blocks.
    for block in [0, 1, 5, 129] {
        for op in ops {
            let send = input::<T>(me, block * n_ranks, 0);
            let mut recv = vec![T::default(); block];
            c.reduce_scatter(&send[..], &mut recv[..], op)?;
            let want: Vec<T> = (0..block)
                .map(|i| T::from_small(reduce(op, n_ranks, me * block + i)))
                .collect();
            out.push(compare(
                format!("reduce_scatter({}) {d} block={block}{tag}", op.name()),
                &recv,
                &want,
            ));
        }
        let want: Vec<T> = (0..n_ranks).flat_map(|r| input::<T>(r, block, 0)).collect();
        let send = input::<T>(me, block, 0);
        let mut recv = vec![T::default(); block * n_ranks];
        c.all_gather(&send[..], &mut recv[..])?;
        out.push(compare(
            format!("all_gather {d} block={block}{tag}"),
            &recv,
            &want,
        ));
        let mut full = vec![T::default(); block * n_ranks];
        full[me * block..(me + 1) * block].copy_from_slice(&send);
        c.all_gather_in_place(&mut full[..])?;
        out.push(compare(
            format!("all_gather_in_place {d} block={block}{tag}"),
            &full,
            &want,
        ));
    }
    // All-to-all: rank r's send is its input over size x block; block q of ours is
    // block `me` of rank q's.
    for block in [0, 1, 5, 129] {
        let send = input::<T>(me, block * n_ranks, 0);
        let mut recv = vec![T::default(); block * n_ranks];
        c.all_to_all(&send[..], &mut recv[..])?;
        let want: Vec<T> = (0..n_ranks)
            .flat_map(|q| input::<T>(q, block, me * block))
            .collect();
        out.push(compare(
            format!("all_to_all {d} block={block}{tag}"),
            &recv,
            &want,
        ));
    }
    // Broadcast: any length, first and last root.
    for n in [0, 7, 1001] {
        for root in [0, n_ranks - 1] {
            let want = input::<T>(root, n, 0);
            let mut buf = if me == root {
                want.clone()
            } else {
                vec![T::default(); n]
            };
            c.broadcast(&mut buf[..], root)?;
            out.push(compare(
                format!("broadcast {d} n={n} root={root}{tag}"),
                &buf,
                &want,
            ));
        }
    }
    // Non-blocking: seven collectives outstanding at once, waited in reverse order.
    let n = 2 * n_ranks + 3;
    let mut ar = input::<T>(me, n, 0);
    let rs_send = input::<T>(me, 3 * n_ranks, 0);
    let mut rs = vec![T::default(); 3];
    let ag_send = input::<T>(me, 4, 0);
    let mut ag = vec![T::default(); 4 * n_ranks];
    let a2a_send = input::<T>(me, 2 * n_ranks, 0);
    let mut a2a = vec![T::default(); 2 * n_ranks];
    // Two sums in flight together (the MPI backend runs them as rings of messages, which
    // must not take each other's; past 2 ranks only blocks of 16Ki elements and more).
    let big = (1 << 14) + 27;
    let sums_send = [
        input::<T>(me, big * n_ranks, 0),
        input::<T>(me, 129 * n_ranks, 1),
    ];
    let mut sums = [vec![T::default(); big], vec![T::default(); 129]];
    let mut bc = if me == 0 {
        input::<T>(0, n, 5)
    } else {
        vec![T::default(); n]
    };
    c.scope(|s| -> Result<()> {
        let h_ar = s.all_reduce(&mut ar[..], ReduceOp::Sum)?;
        let h_rs = s.reduce_scatter(&rs_send[..], &mut rs[..], ReduceOp::Max)?;
        let [sum_a, sum_b] = &mut sums;
        let h_sum_a = s.reduce_scatter(&sums_send[0][..], &mut sum_a[..], ReduceOp::Sum)?;
        let h_sum_b = s.reduce_scatter(&sums_send[1][..], &mut sum_b[..], ReduceOp::Sum)?;
        let h_ag = s.all_gather(&ag_send[..], &mut ag[..])?;
        let h_bc = s.broadcast(&mut bc[..], 0)?;
        let h_a2a = s.all_to_all(&a2a_send[..], &mut a2a[..])?;
        let h_b = s.barrier()?;
        s.progress()?;
        h_b.wait()?;
        h_a2a.wait()?;
        h_bc.wait()?;
        h_ag.wait()?;
        h_sum_b.wait()?;
        h_sum_a.wait()?;
        h_rs.wait()?;
        h_ar.wait()?;
        Ok(())
    })?;
    for (sum, (block, offset)) in sums.iter().zip([(big, 0), (129, 1)]) {
        let want: Vec<T> = (0..block)
            .map(|i| T::from_small(reduce(ReduceOp::Sum, n_ranks, offset + me * block + i)))
            .collect();
        out.push(compare(
            format!("nonblocking reduce_scatter(sum) {d} block={block}, two in flight{tag}"),
            sum,
            &want,
        ));
    }
    let want_ar: Vec<T> = (0..n)
        .map(|i| T::from_small(reduce(ReduceOp::Sum, n_ranks, i)))
        .collect();
    out.push(compare(
        format!("nonblocking all_reduce(sum) {d} n={n}{tag}"),
        &ar,
        &want_ar,
    ));
    let want_rs: Vec<T> = (0..3)
        .map(|i| T::from_small(reduce(ReduceOp::Max, n_ranks, me * 3 + i)))
        .collect();
    out.push(compare(
        format!("nonblocking reduce_scatter(max) {d} block=3{tag}"),
        &rs,
        &want_rs,
    ));
    let want_ag: Vec<T> = (0..n_ranks).flat_map(|r| input::<T>(r, 4, 0)).collect();
    out.push(compare(
        format!("nonblocking all_gather {d} block=4{tag}"),
        &ag,
        &want_ag,
    ));
    let want_a2a: Vec<T> = (0..n_ranks)
        .flat_map(|q| input::<T>(q, 2, me * 2))
        .collect();
    out.push(compare(
        format!("nonblocking all_to_all {d} block=2{tag}"),
        &a2a,
        &want_a2a,
    ));
    out.push(compare(
        format!("nonblocking broadcast {d} n={n}{tag}"),
        &bc,
        &input::<T>(0, n, 5),
    ));
    Ok(())
}

/// Run every case on `comm` (a collective call: every rank of `comm` must call it).
/// Returns this rank's results; halves run in both [`HalfSum`] modes, and the
/// communicator's mode is restored afterwards.
pub fn run<C: Communicator>(comm: &C) -> Result<Vec<CaseResult>> {
    let mut out = Vec::new();
    comm.barrier()?;
    let mode = comm.half_sum();
    for d in DType::ALL {
        match d {
            DType::F32 => cases_for::<f32, C>(comm, "", &mut out)?,
            DType::F64 => cases_for::<f64, C>(comm, "", &mut out)?,
            DType::U8 => cases_for::<u8, C>(comm, "", &mut out)?,
            DType::U32 => cases_for::<u32, C>(comm, "", &mut out)?,
            DType::I32 => cases_for::<i32, C>(comm, "", &mut out)?,
            DType::I64 => cases_for::<i64, C>(comm, "", &mut out)?,
            DType::BF16 | DType::F16 => {
                for (m, tag) in [(HalfSum::Op, " [op]"), (HalfSum::Upcast, " [upcast]")] {
                    comm.set_half_sum(m);
                    let r = if d == DType::BF16 {
                        cases_for::<bf16, C>(comm, tag, &mut out)
                    } else {
                        cases_for::<f16, C>(comm, tag, &mut out)
                    };
                    comm.set_half_sum(mode);
                    r?;
                }
            }
        }
    }
    Ok(out)
}

/// Number of failed cases summed over every rank of `comm` (collective).
pub fn failures_everywhere<C: Communicator>(comm: &C, results: &[CaseResult]) -> Result<u64> {
    let mut n = [results.iter().filter(|r| !r.ok).count() as i64];
    comm.all_reduce(&mut n[..], ReduceOp::Sum)?;
    Ok(n[0] as u64)
}
