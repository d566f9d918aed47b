//! The "Adam-shaped copy": a pass that reads and writes exactly the streams of the fused
//! AdamW step (gradient, master, m, v in; master, m, v and the 16-bit copy out) with
//! trivial math (adds). Its speed is the memory-bandwidth roofline the step is held
//! against, measured in the same process (`zero-bench micro adam`).

use super::{check_param, run_grad, AdamWCoeffs, AdamWState};
use crate::error::KernelError;
use crate::isa::Exec;
use crate::simd::NoSink;
use crate::slices::{FloatSlice, HalfSliceMut};

/// `m += g; v += g; master += g; param = round(master)` over whole slices.
pub fn shaped_copy(
    exec: &Exec,
    grad: FloatSlice<'_>,
    state: AdamWState<'_>,
    param: Option<HalfSliceMut<'_>>,
) -> Result<(), KernelError> {
    let n = grad.len();
    state.check(n)?;
    // The constants are unused by the copy; any valid set will do.
    let c = AdamWCoeffs::new(&Default::default(), 1, 1.0, false)?;
    match param {
        None => run_grad::<_, true>(exec, &c, grad, state, NoSink::ptr()),
        Some(HalfSliceMut::BF16(p)) => {
            check_param(p.len(), n)?;
            run_grad::<_, true>(exec, &c, grad, state, p.as_mut_ptr())
        }
        Some(HalfSliceMut::F16(p)) => {
            check_param(p.len(), n)?;
            run_grad::<_, true>(exec, &c, grad, state, p.as_mut_ptr())
        }
    }
}
