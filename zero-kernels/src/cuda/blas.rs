//! Matrix products on the GPU through cuBLASLt, with each shape's descriptors and
//! algorithm looked up once and cached (cuBLASLt's heuristic costs tens of microseconds,
//! as much as a small GEMM; cudarc's safe `Matmul` runs it on every call).
//!
//! Our matrices are strided views ([`MatLayout`]): row-major (`cs == 1`, leading
//! dimension `rs`) or column-major (`rs == 1`, leading dimension `cs`), the transpose of a
//! row-major one. cuBLAS is column-major, so a row-major `C = A B` is computed as the
//! column-major `C^T = B^T A^T`: a row-major operand read as column-major *is* its
//! transpose, which then needs no transpose op.
//!
//! Precision: [`MatmulPrecision::F32`] computes in fp32 (`CUBLAS_COMPUTE_32F`);
//! [`MatmulPrecision::Bf16`] rounds the fp32 operands to bf16 inside the tensor cores and
//! accumulates in fp32 (`CUBLAS_COMPUTE_32F_FAST_16BF`), which is bf16 training's matmul.
//!
//! One workspace serves every stream. cuBLASLt must not run two products on one workspace
//! at the same time (a split-K algorithm keeps partial sums there), so a product whose
//! algorithm uses it, queued on a stream other than the last such product's, first makes
//! its stream wait for an event recorded after that product ([`Blas::gemm`]). Products on
//! one stream (the engine queues them all on its compute stream) are ordered by the
//! stream and wait for nothing. (A workspace per stream would let two streams' products
//! overlap, but cost 32 MiB per stream, held until the device closes: nothing here sees a
//! stream end.)

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaEvent, CudaStream};

use super::pool::{Block, Pool, Settle};
use crate::error::KernelError;
use crate::nn::MatLayout;

/// Workspace cuBLASLt may use per call (what its documentation recommends for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// How a GPU matrix product rounds its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum MatmulPrecision {
    /// fp32 operands, fp32 arithmetic.
    #[default]
    F32,
    /// Operands rounded to bf16, products accumulated in fp32 (tensor cores).
    Bf16,
}

/// One cuBLAS call's shape: everything the descriptors and the algorithm depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct GemmKey {
    trans_a: bool,
    trans_b: bool,
    m: u64,
    n: u64,
    k: u64,
    lda: i64,
    ldb: i64,
    ldc: i64,
    precision: MatmulPrecision,
    /// The byte alignment (a power of two, at most 256) of the first operand, the second
    /// and C, over every matrix of a batch: the heuristic is told it, or it assumes 256
    /// (`cudaMalloc`'s) and may pick an algorithm that faults on a view starting
    /// elsewhere in a buffer.
    align: [u32; 3],
    /// Products in the batch (1: a single product).
    batch: u64,
    /// Elements from one matrix of the batch to the next: first operand, second, C.
    strides: [i64; 3],
}

/// A strided batch of products: `count` of them, the k-th reading A at `a + k*strides[0]`
/// elements, B at `b + k*strides[1]` and writing C at `c + k*strides[2]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Batch {
    pub(crate) count: usize,
    pub(crate) strides: [usize; 3],
}

impl Batch {
    /// A single product.
    pub(crate) const ONE: Batch = Batch {
        count: 1,
        strides: [0; 3],
    };
}

/// The alignment cuBLASLt may assume of an address: its largest power of two, at most
/// 256 bytes.
fn alignment(ptr: CUdeviceptr) -> u32 {
    // (0 has 64 trailing zeros: 256 too.)
    1u32 << ptr.trailing_zeros().min(8)
}

/// The alignment of every matrix of a batch of `count` whose first starts at `ptr`, the
/// next ones `stride` f32 elements apart: the address and the stride in bytes share it.
fn batch_alignment(ptr: CUdeviceptr, count: usize, stride: usize) -> u32 {
    if count <= 1 {
        return alignment(ptr);
    }
    alignment(ptr | (stride * std::mem::size_of::<f32>()) as u64)
}

/// The cached descriptors of one shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    /// Bytes of workspace the algorithm needs (0: none; it is then given none).
    workspace: usize,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by this plan and used by no queued call any more (plans live as
        // long as the handle, which is dropped after the device synchronised).
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// One operand as cuBLAS sees it: column-major storage with a leading dimension, and
/// whether the product uses its transpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ColMajor {
    trans: bool,
    ld: usize,
}

/// Read an `r x c` view as a column-major operand: `Some((stored_is_transposed, ld))`.
/// Column-major (`rs == 1`): as is. Row-major (`cs == 1`): its storage is the
/// column-major transpose. Anything else cuBLAS cannot address.
fn as_col_major(l: &MatLayout) -> Option<ColMajor> {
    if l.rs == 1 && (l.cols <= 1 || l.cs >= l.rows.max(1)) {
        Some(ColMajor {
            trans: false,
            ld: l.cs.max(l.rows).max(1),
        })
    } else if l.cs == 1 && (l.rows <= 1 || l.rs >= l.cols.max(1)) {
        Some(ColMajor {
            trans: true,
            ld: l.rs.max(l.cols).max(1),
        })
    } else {
        None
    }
}

/// The last product that used the workspace: its stream (held, so that its address
/// cannot be reused by a new stream while it is compared) and an event recorded after it.
struct WorkspaceUse {
    stream: Arc<CudaStream>,
    done: CudaEvent,
}

/// A cuBLASLt handle, its workspace and its plans (one per [`super::CudaDevice`]).
pub(crate) struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: Block,
    plans: RefCell<HashMap<GemmKey, Plan>>,
    last_use: RefCell<Option<WorkspaceUse>>,
}

impl Blas {
    /// Load cuBLASLt (an error naming the library when it cannot be found).
    /// `settle`: as for [`Block::new`].
    pub(crate) fn new(pool: &Arc<Pool>, settle: Settle<'_>) -> Result<Blas, KernelError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(KernelError::Cuda(
                "cuBLASLt (libcublasLt.so.13 or .so.12) could not be loaded: put the CUDA libraries' folder on LD_LIBRARY_PATH (scripts/gpu-check.sh shows how to find them in a Python environment)".into(),
            ));
        }
        let handle = lt::create_handle().map_err(cublas_err)?;
        // cuBLASLt needs no zeroed workspace.
        let workspace = Block::uninit(pool, WORKSPACE_BYTES, "cuBLASLt workspace", settle)?;
        Ok(Blas {
            handle,
            workspace,
            plans: RefCell::new(HashMap::new()),
            last_use: RefCell::new(None),
        })
    }

    /// Before a product that uses the workspace is queued on `stream`: when the last one
    /// ran on another stream, make `stream` wait for it, and tell `note_wait(waiter,
    /// origin)` (the device's record of which streams may stall behind started host work).
    fn wait_for_workspace(
        &self,
        stream: &Arc<CudaStream>,
        note_wait: &dyn Fn(u64, u64),
    ) -> Result<(), KernelError> {
        if let Some(last) = self.last_use.borrow().as_ref() {
            if !Arc::ptr_eq(&last.stream, stream) {
                stream.wait(&last.done)?;
                note_wait(stream.cu_stream() as u64, last.stream.cu_stream() as u64);
            }
        }
        Ok(())
    }

    /// After a product that uses the workspace was queued on `stream`: it is the last use.
    /// (A re-recorded event leaves the waits already queued on it as they were.)
    fn workspace_used(&self, stream: &Arc<CudaStream>) -> Result<(), KernelError> {
        let mut last = self.last_use.borrow_mut();
        match last.as_mut() {
            Some(u) => {
                u.done.record(stream)?;
                if !Arc::ptr_eq(&u.stream, stream) {
                    u.stream = Arc::clone(stream);
                }
            }
            None => {
                *last = Some(WorkspaceUse {
                    stream: Arc::clone(stream),
                    done: stream.record_event(None)?,
                })
            }
        }
        Ok(())
    }

    /// `C = alpha A B + beta C` in f32 storage, queued on `stream`, once or for each
    /// matrix of a strided `batch`. `a`, `b`, `c` are the device addresses of the (first)
    /// views' first elements; the layouts and batch were checked against the buffers by
    /// the caller. `note_wait(waiter, origin)` hears of a wait this queues on `stream` for
    /// a product on another stream (the workspace's order: see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm(
        &self,
        stream: &Arc<CudaStream>,
        note_wait: &dyn Fn(u64, u64),
        precision: MatmulPrecision,
        alpha: f32,
        beta: f32,
        (a, la): (CUdeviceptr, MatLayout),
        (b, lb): (CUdeviceptr, MatLayout),
        (c, lc): (CUdeviceptr, MatLayout),
        batch: Batch,
    ) -> Result<(), KernelError> {
        let (m, n, k) = (lc.rows, lc.cols, la.cols);
        if m == 0 || n == 0 || batch.count == 0 {
            return Ok(());
        }
        let count = i32::try_from(batch.count).map_err(|_| KernelError::BadShape {
            op: "matmul",
            detail: format!(
                "a batch of {} products is more than cuBLAS takes",
                batch.count
            ),
        })?;
        let unsupported = |what: &str, l: &MatLayout| KernelError::BadShape {
            op: "matmul",
            detail: format!(
                "{what}'s layout {l:?} is neither row- nor column-major: cuBLAS cannot address it"
            ),
        };
        // Strides (so leading dimensions) valid offsets: they are passed as i64, and a
        // caller's check of the spans does not bound a stride of a one-wide dimension.
        for (what, l) in [("A", &la), ("B", &lb), ("C", &lc)] {
            if !l.strides_fit::<f32>() {
                return Err(KernelError::BadShape {
                    op: "matmul",
                    detail: format!("{what}'s layout {l:?} has a stride past isize::MAX bytes"),
                });
            }
        }
        let ca = as_col_major(&la).ok_or_else(|| unsupported("A", &la))?;
        let cb = as_col_major(&lb).ok_or_else(|| unsupported("B", &lb))?;
        let cc = as_col_major(&lc).ok_or_else(|| unsupported("C", &lc))?;
        // Each operand: address, column-major view, stride in the batch.
        let ops_a = (a, ca, batch.strides[0]);
        let ops_b = (b, cb, batch.strides[1]);
        // Column-major C (not transposed): C = op(A) op(B). Row-major C (its storage is
        // C^T): C^T = op(B^T) op(A^T), where a row-major operand's storage is already
        // the transpose and a column-major one needs the T op.
        let (first, second, flip, (rows, cols)) = if cc.trans {
            (ops_b, ops_a, true, (n, m))
        } else {
            (ops_a, ops_b, false, (m, n))
        };
        let one = |(ptr, _, stride): (CUdeviceptr, ColMajor, usize)| {
            batch_alignment(ptr, batch.count, stride)
        };
        let key = GemmKey {
            trans_a: first.1.trans != flip,
            trans_b: second.1.trans != flip,
            m: rows as u64,
            n: cols as u64,
            k: k as u64,
            lda: first.1.ld as i64,
            ldb: second.1.ld as i64,
            ldc: cc.ld as i64,
            precision,
            align: [one(first), one(second), one((c, cc, batch.strides[2]))],
            batch: count as u64,
            strides: [first.2 as i64, second.2 as i64, batch.strides[2] as i64],
        };
        let (first, second) = (first.0, second.0);
        if k == 0 {
            // C = beta C: no model has an empty inner dimension, and cuBLAS versions
            // differ on it, so it is refused rather than special-cased.
            return Err(KernelError::BadShape {
                op: "matmul",
                detail: "inner dimension 0 (C = beta C) is not supported on the GPU".into(),
            });
        }
        let mut plans = self.plans.borrow_mut();
        let plan = match plans.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.plan(&key)?),
        };
        // An algorithm that needs no workspace is given none, so only the others are
        // ordered across streams.
        let (workspace, workspace_bytes) = if plan.workspace > 0 {
            self.wait_for_workspace(stream, note_wait)?;
            (self.workspace.ptr, WORKSPACE_BYTES)
        } else {
            (0, 0)
        };
        // SAFETY: the descriptors describe these addresses (the caller checked every view
        // holds its layout's span); alpha/beta are host scalars (default pointer mode);
        // the workspace is ours, as large as the preference said, and no product on
        // another stream can be using it (waited for above).
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                first as *const c_void,
                plan.a,
                second as *const c_void,
                plan.b,
                c as *const c_void,
                plan.c,
                c as *mut c_void,
                plan.c,
                &plan.algo,
                workspace as *mut c_void,
                workspace_bytes,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(cublas_err)?;
        if workspace_bytes > 0 {
            self.workspace_used(stream)?;
        }
        Ok(())
    }

    /// Descriptors and the heuristic's best algorithm for one shape.
    fn plan(&self, key: &GemmKey) -> Result<Plan, KernelError> {
        let compute = match key.precision {
            MatmulPrecision::F32 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            MatmulPrecision::Bf16 => sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
        };
        let f32t = sys::cudaDataType::CUDA_R_32F;
        let desc = lt::create_matmul_desc(compute, f32t).map_err(cublas_err)?;
        // Stored shapes: op(X) is rows x cols; X itself is cols x rows when transposed.
        let (ar, ac) = if key.trans_a {
            (key.k, key.m)
        } else {
            (key.m, key.k)
        };
        let (br, bc) = if key.trans_b {
            (key.n, key.k)
        } else {
            (key.k, key.n)
        };
        let mut plan = Plan {
            desc,
            a: lt::create_matrix_layout(f32t, ar, ac, key.lda).map_err(cublas_err)?,
            b: lt::create_matrix_layout(f32t, br, bc, key.ldb).map_err(cublas_err)?,
            c: lt::create_matrix_layout(f32t, key.m, key.n, key.ldc).map_err(cublas_err)?,
            // SAFETY: a plain-data struct, filled in by the heuristic below.
            algo: unsafe { std::mem::zeroed() },
            workspace: 0,
        };
        if key.batch > 1 {
            let count = key.batch as i32;
            use sys::cublasLtMatrixLayoutAttribute_t as Layout;
            for (layout, stride) in [
                (plan.a, key.strides[0]),
                (plan.b, key.strides[1]),
                (plan.c, key.strides[2]),
            ] {
                // SAFETY: BATCH_COUNT takes an int32_t, STRIDED_BATCH_OFFSET an int64_t
                // (elements between matrices); the layouts are this plan's.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        layout,
                        Layout::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count) as *const i32 as *const c_void,
                        std::mem::size_of::<i32>(),
                    )
                    .and_then(|_| {
                        lt::set_matrix_layout_attribute(
                            layout,
                            Layout::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            (&stride) as *const i64 as *const c_void,
                            std::mem::size_of::<i64>(),
                        )
                    })
                }
                .map_err(cublas_err)?;
            }
        }
        for (attr, on) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                key.trans_a,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                key.trans_b,
            ),
        ] {
            let op: i32 = on as i32; // CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                                     // SAFETY: the attribute takes a cublasOperation_t (a 32-bit enum).
            unsafe {
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    attr,
                    (&op) as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
            }
            .map_err(cublas_err)?;
        }
        let pref = lt::create_matmul_pref().map_err(cublas_err)?;
        let ws = WORKSPACE_BYTES;
        use sys::cublasLtMatmulPreferenceAttributes_t as Pref;
        let [align_a, align_b, align_c] = key.align;
        let aligns = [
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c),
            (Pref::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c),
        ];
        // SAFETY: the workspace attribute takes a u64/size_t byte count, the alignments
        // a uint32_t each; pref is destroyed below.
        let heuristic = unsafe {
            let mut set = lt::set_matmul_pref_attribute(
                pref,
                Pref::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            );
            for (attr, bytes) in aligns {
                set = set.and_then(|_| {
                    lt::set_matmul_pref_attribute(
                        pref,
                        attr,
                        (&bytes) as *const u32 as *const c_void,
                        std::mem::size_of::<u32>(),
                    )
                });
            }
            let h = set.and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.c,
                    plan.c,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            h
        }
        .map_err(|e| {
            KernelError::Cuda(format!(
                "cuBLASLt has no algorithm for {key:?}: {}",
                cublas_err(e)
            ))
        })?;
        plan.algo = heuristic.algo;
        plan.workspace = heuristic.workspaceSize;
        Ok(plan)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        self.plans.borrow_mut().clear();
        // SAFETY: created in `new`; the owning device synchronises before dropping us.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

fn cublas_err(e: lt::CublasError) -> KernelError {
    KernelError::Cuda(format!("cuBLASLt: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_and_column_major_views_map_to_cublas_operands() {
        // Row-major 3x4 with ld 5: its storage is the column-major 4x3 transpose.
        let rm = MatLayout::rm(3, 4, 5);
        assert_eq!(as_col_major(&rm), Some(ColMajor { trans: true, ld: 5 }));
        // Its transpose (a 4x3 view of the same memory) is column-major with ld 5.
        assert_eq!(
            as_col_major(&rm.t()),
            Some(ColMajor {
                trans: false,
                ld: 5
            })
        );
        // A strided view in both directions is refused.
        let odd = MatLayout {
            rows: 3,
            cols: 4,
            rs: 8,
            cs: 2,
        };
        assert_eq!(as_col_major(&odd), None);
        // One row: any row stride works; ld is at least the column count.
        assert_eq!(
            as_col_major(&MatLayout::rm(1, 7, 7)),
            Some(ColMajor { trans: true, ld: 7 })
        );
    }
}
