//! What a collective reads from and writes into: any contiguous typed buffer that can say
//! where it lives. Host slices implement it today; a CUDA device buffer implements the same
//! two traits later (with `Location::Cuda`), and the collectives' signatures do not change.
//! A backend that cannot reach a location returns `CommError::Location`; it copies between
//! locations only where its documentation says so (NcclComm stages host buffers through
//! device scratch, for zero-core's control collectives: nccl.rs).

use crate::Element;

/// Where the bytes of a buffer live (the device layer's notion, shared).
pub use zero_kernels::device::Location;

/// A contiguous buffer of `len()` elements of type `Elem` that a collective may read.
///
/// # Safety
/// `as_ptr()` must point to `len()` initialised elements valid for reads, in the memory
/// `location()` names, for as long as the buffer is borrowed.
pub unsafe trait CommBuf {
    /// Element type.
    type Elem: Element;
    /// Number of elements.
    fn len(&self) -> usize;
    /// True when the buffer has no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Where the elements live.
    fn location(&self) -> Location;
    /// Address of the first element.
    fn as_ptr(&self) -> *const Self::Elem;
}

/// A [`CommBuf`] a collective may also write.
///
/// # Safety
/// As for [`CommBuf`], and `as_mut_ptr()` must be valid for writes of `len()` elements.
pub unsafe trait CommBufMut: CommBuf {
    /// Address of the first element, for writing.
    fn as_mut_ptr(&mut self) -> *mut Self::Elem;
}

// SAFETY: a slice is `len` initialised host elements for as long as it is borrowed.
unsafe impl<T: Element> CommBuf for [T] {
    type Elem = T;
    fn len(&self) -> usize {
        <[T]>::len(self)
    }
    fn location(&self) -> Location {
        Location::Host
    }
    fn as_ptr(&self) -> *const T {
        <[T]>::as_ptr(self)
    }
}

// SAFETY: a mutable slice is writable for its whole length while borrowed.
unsafe impl<T: Element> CommBufMut for [T] {
    fn as_mut_ptr(&mut self) -> *mut T {
        <[T]>::as_mut_ptr(self)
    }
}

// SAFETY: forwards to the slice.
unsafe impl<T: Element> CommBuf for Vec<T> {
    type Elem = T;
    fn len(&self) -> usize {
        self.as_slice().len()
    }
    fn location(&self) -> Location {
        Location::Host
    }
    fn as_ptr(&self) -> *const T {
        self.as_slice().as_ptr()
    }
}

// SAFETY: forwards to the slice.
unsafe impl<T: Element> CommBufMut for Vec<T> {
    fn as_mut_ptr(&mut self) -> *mut T {
        self.as_mut_slice().as_mut_ptr()
    }
}
