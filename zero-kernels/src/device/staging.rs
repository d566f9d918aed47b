//! Host memory that device copies go through ([`Device::alloc_staging`]): the regions a
//! host-staged collective downloads into, hands to MPI, and uploads from
//! (zero-comm's `staged.rs`).
//!
//! Why a type of its own: a copy from ordinary (pageable) host memory is synchronous on a
//! GPU (the driver bounces it through a pinned buffer of its own before returning), while
//! a copy from page-locked memory is a DMA the stream runs later, at full PCIe speed. A
//! CUDA device hands out page-locked memory here (`cuMemHostAlloc`); the CPU devices hand
//! out plain memory, as nothing is copied over a bus there. [`Device::upload_from_staging`]
//! reads a region when its stream reaches the copy, not when it is queued, which is what
//! lets the collective that fills the region still be running when the copy is queued.
//!
//! [`Device::alloc_staging`]: super::Device::alloc_staging
//! [`Device::upload_from_staging`]: super::Device::upload_from_staging

use std::any::Any;
use std::fmt;

/// A host region of whole 8-byte words (every element type fits its alignment), zeroed
/// when made, freed by whatever allocated it when dropped.
pub struct StagingMemory {
    ptr: *mut u64,
    words: usize,
    pinned: bool,
    /// Owns the allocation (a `Vec<u64>`, or a device's page-locked block whose `Drop`
    /// frees it); only held, never read.
    _owner: Box<dyn Any>,
}

impl fmt::Debug for StagingMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StagingMemory")
            .field("bytes", &self.bytes())
            .field("pinned", &self.pinned)
            .finish()
    }
}

impl StagingMemory {
    /// Ordinary host memory for at least `bytes` (the CPU devices' staging).
    pub fn plain(bytes: usize) -> Self {
        let mut words = vec![0u64; bytes.div_ceil(8)];
        let ptr = words.as_mut_ptr();
        let len = words.len();
        StagingMemory {
            ptr,
            words: len,
            pinned: false,
            // The Vec's heap block does not move when the Vec is boxed.
            _owner: Box::new(words),
        }
    }

    /// A region a device allocated: `words` zeroed 8-byte words at `ptr`, kept allocated
    /// by `owner` (whose `Drop` frees it).
    ///
    /// # Safety
    /// `ptr` is 8-byte aligned, valid for reads and writes of `words` words, zeroed, and
    /// stays so until `owner` is dropped; nothing else uses it.
    pub unsafe fn from_device(
        ptr: *mut u64,
        words: usize,
        pinned: bool,
        owner: Box<dyn Any>,
    ) -> Self {
        StagingMemory {
            ptr,
            words,
            pinned,
            _owner: owner,
        }
    }

    /// Bytes it holds (whole words).
    pub fn bytes(&self) -> usize {
        self.words * 8
    }

    /// Whether the memory is page-locked for a device's asynchronous copies.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// The first byte. Who reads or writes through it keeps to the region's size, and
    /// orders the access against the copies and transfers that use the region (zero-comm's
    /// staging does, through stream order and each slot's last event).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
}
