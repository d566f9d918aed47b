//! Typed device buffers and the views kernels take.
//!
//! A buffer is owned by its user (the engine, a model); a device op reads a [`View`] and
//! writes a [`ViewMut`], each a range of one buffer. Views borrow the buffer handle, so
//! safe code cannot hand a kernel a read and a write view that overlap: a write view
//! comes from `&mut` of the buffer (or from [`Buffer::split_mut`], which checks the
//! pieces are disjoint), a read view from `&`. Work on a device may run after the call
//! that queued it returns; ordering that work across streams is the device's business
//! (streams and events, see [`super::Device`]), not the borrow checker's.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::Range;

use crate::dtype::Element;
use crate::error::KernelError;

/// Where the bytes of a buffer live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Ordinary host memory.
    Host,
    /// Memory of a CUDA device (ordinal).
    Cuda(usize),
}

/// A typed buffer of a device. Zeroed when allocated.
pub trait Buffer: Debug {
    /// Element type.
    type Elem: Element;
    /// Elements held.
    fn len(&self) -> usize;
    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The name it was allocated under (for messages: "grads", "bucket 1", ...).
    fn name(&self) -> &str;
    /// An identity unique among the buffers of one device (hazard tracking, messages).
    fn id(&self) -> u64;
    /// Where the elements live.
    fn location(&self) -> Location;
    /// Bytes the allocation holds.
    fn allocated_bytes(&self) -> u64 {
        (self.len() * <Self::Elem as Element>::DTYPE.size_bytes()) as u64
    }
    /// Address of element 0: a host address for host memory, the device address for GPU
    /// memory. For collectives that take raw buffers; dereference only what
    /// [`Buffer::location`] says is reachable.
    fn raw_ptr(&self) -> *mut Self::Elem;
    /// A handle that keeps the allocation alive while work holding [`Buffer::raw_ptr`]
    /// is in flight ([`super::Device::host_task_started`]); `None` where the device
    /// waits for such work before returning, so nothing needs keeping.
    fn retain(&self) -> Option<super::Retained> {
        None
    }

    /// The whole buffer, to read.
    fn view(&self) -> View<'_, Self>
    where
        Self: Sized,
    {
        View::new(self, 0..self.len())
    }

    /// Elements `range`, to read.
    ///
    /// # Panics
    /// When `range` is not inside the buffer (a bug in the caller, as slice indexing).
    fn slice(&self, range: Range<usize>) -> View<'_, Self>
    where
        Self: Sized,
    {
        check_range(self.name(), &range, self.len());
        View::new(self, range)
    }

    /// The whole buffer, to write.
    fn view_mut(&mut self) -> ViewMut<'_, Self>
    where
        Self: Sized,
    {
        let n = self.len();
        ViewMut::new(self, 0..n)
    }

    /// Elements `range`, to write.
    ///
    /// # Panics
    /// When `range` is not inside the buffer.
    fn slice_mut(&mut self, range: Range<usize>) -> ViewMut<'_, Self>
    where
        Self: Sized,
    {
        check_range(self.name(), &range, self.len());
        ViewMut::new(self, range)
    }

    /// Disjoint write views at `ranges` (any order), returned in the order given; an
    /// error when two overlap or one is not inside the buffer.
    fn split_mut(&mut self, ranges: &[Range<usize>]) -> Result<Vec<ViewMut<'_, Self>>, KernelError>
    where
        Self: Sized,
    {
        let len = self.len();
        let mut order: Vec<usize> = (0..ranges.len()).collect();
        order.sort_by_key(|&i| (ranges[i].start, ranges[i].end));
        let mut at = 0;
        for &i in &order {
            let r = &ranges[i];
            if r.start > r.end || r.end > len || r.start < at {
                return Err(KernelError::BadViews(format!(
                    "split of buffer '{}' ({len} elements) into {ranges:?}: ranges overlap or run past the end",
                    self.name()
                )));
            }
            // Empty ranges never overlap anything.
            if r.end > r.start {
                at = r.end;
            }
        }
        let this: &Self = self;
        Ok(ranges
            .iter()
            .map(|r| ViewMut::new_shared(this, r.clone()))
            .collect())
    }
}

fn check_range(name: &str, range: &Range<usize>, len: usize) {
    assert!(
        range.start <= range.end && range.end <= len,
        "range {range:?} is not inside buffer '{name}' of {len} elements"
    );
}

/// The sum of `lens` when it fits in a view of `len` elements. Checked: in release builds
/// (no overflow checks) a plain sum wraps, e.g. `[usize::MAX, 2]` to 1, and would pass
/// the bounds check while the first piece spans `usize::MAX` elements.
fn carve_total(name: &str, lens: &[usize], len: usize) -> Result<usize, KernelError> {
    lens.iter()
        .try_fold(0usize, |a, &n| a.checked_add(n))
        .filter(|&total| total <= len)
        .ok_or_else(|| {
            KernelError::BadViews(format!(
                "carving pieces of {lens:?} elements from a view of {len} elements of buffer '{name}': they add up to more than the view"
            ))
        })
}

/// Elements of one buffer an op reads or writes, for hazard tracking.
#[derive(Clone, Debug)]
pub struct Access<'a> {
    /// [`Buffer::id`].
    pub id: u64,
    /// [`Buffer::name`].
    pub name: &'a str,
    /// Elements touched.
    pub range: Range<usize>,
}

/// A range of a buffer, to read.
#[derive(Debug)]
pub struct View<'a, B: Buffer> {
    buf: &'a B,
    range: Range<usize>,
}

impl<B: Buffer> Clone for View<'_, B> {
    fn clone(&self) -> Self {
        View {
            buf: self.buf,
            range: self.range.clone(),
        }
    }
}

impl<'a, B: Buffer> View<'a, B> {
    fn new(buf: &'a B, range: Range<usize>) -> Self {
        View { buf, range }
    }

    /// The buffer viewed.
    pub fn buffer(&self) -> &'a B {
        self.buf
    }

    /// Elements of the buffer viewed.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Elements viewed.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when no element is viewed.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The sub-range `r` of this view (relative to its start).
    ///
    /// # Panics
    /// When `r` is not inside the view.
    pub fn slice(&self, r: Range<usize>) -> View<'a, B> {
        check_range(self.buf.name(), &r, self.len());
        View::new(
            self.buf,
            self.range.start + r.start..self.range.start + r.end,
        )
    }

    /// The first `n` elements.
    ///
    /// # Panics
    /// When `n` exceeds the view.
    pub fn head(&self, n: usize) -> View<'a, B> {
        self.slice(0..n)
    }

    /// What an op reading this view touches.
    pub fn access(&self) -> Access<'a> {
        Access {
            id: self.buf.id(),
            name: self.buf.name(),
            range: self.range.clone(),
        }
    }
}

/// A range of a buffer, to write (and read). Made from `&mut` of the buffer, or by
/// splitting such a view, so no other view of these elements exists while it lives.
#[derive(Debug)]
pub struct ViewMut<'a, B: Buffer> {
    buf: &'a B,
    range: Range<usize>,
    _exclusive: PhantomData<&'a mut B>,
}

impl<'a, B: Buffer> ViewMut<'a, B> {
    fn new(buf: &'a mut B, range: Range<usize>) -> Self {
        ViewMut::new_shared(buf, range)
    }

    /// Only from a `&mut B` the caller holds, for ranges it checked are disjoint.
    fn new_shared(buf: &'a B, range: Range<usize>) -> Self {
        ViewMut {
            buf,
            range,
            _exclusive: PhantomData,
        }
    }

    /// The buffer viewed.
    pub fn buffer(&self) -> &'a B {
        self.buf
    }

    /// Elements of the buffer viewed.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Elements viewed.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when no element is viewed.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The same elements, to read, for as long as this borrow lasts.
    pub fn as_view(&self) -> View<'_, B> {
        View::new(self.buf, self.range.clone())
    }

    /// A shorter-lived write view of the same elements (to pass to an op and keep this one).
    pub fn reborrow(&mut self) -> ViewMut<'_, B> {
        ViewMut::new_shared(self.buf, self.range.clone())
    }

    /// The sub-range `r` (relative to the view's start), consuming the view.
    ///
    /// # Panics
    /// When `r` is not inside the view.
    pub fn slice_mut(self, r: Range<usize>) -> ViewMut<'a, B> {
        check_range(self.buf.name(), &r, self.len());
        let start = self.range.start;
        ViewMut::new_shared(self.buf, start + r.start..start + r.end)
    }

    /// The first `n` elements, consuming the view.
    ///
    /// # Panics
    /// When `n` exceeds the view.
    pub fn head(self, n: usize) -> ViewMut<'a, B> {
        self.slice_mut(0..n)
    }

    /// `[0, mid)` and `[mid, len)`.
    ///
    /// # Panics
    /// When `mid` exceeds the view.
    pub fn split_at(self, mid: usize) -> (ViewMut<'a, B>, ViewMut<'a, B>) {
        check_range(self.buf.name(), &(0..mid), self.len());
        let s = self.range.start;
        (
            ViewMut::new_shared(self.buf, s..s + mid),
            ViewMut::new_shared(self.buf, s + mid..self.range.end),
        )
    }

    /// Consecutive pieces of the given lengths from the start (the rest is dropped).
    ///
    /// # Panics
    /// When the lengths add up to more than the view (see [`ViewMut::try_carve`]).
    pub fn carve<const N: usize>(self, lens: [usize; N]) -> [ViewMut<'a, B>; N] {
        self.try_carve(lens).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ViewMut::carve`], with a [`KernelError::BadViews`] instead of a panic when the
    /// lengths add up to more than the view (or overflow `usize`).
    pub fn try_carve<const N: usize>(
        self,
        lens: [usize; N],
    ) -> Result<[ViewMut<'a, B>; N], KernelError> {
        carve_total(self.buf.name(), &lens, self.len())?;
        // `start + total <= buffer len`, so `at + n` below cannot overflow.
        let mut at = self.range.start;
        Ok(lens.map(|n| {
            let v = ViewMut::new_shared(self.buf, at..at + n);
            at += n;
            v
        }))
    }

    /// What an op writing this view touches.
    pub fn access(&self) -> Access<'a> {
        Access {
            id: self.buf.id(),
            name: self.buf.name(),
            range: self.range.clone(),
        }
    }
}

impl<'a, B: Buffer> View<'a, B> {
    /// Consecutive pieces of the given lengths from the start (the rest is dropped).
    ///
    /// # Panics
    /// When the lengths add up to more than the view (see [`View::try_carve`]).
    pub fn carve<const N: usize>(&self, lens: [usize; N]) -> [View<'a, B>; N] {
        self.try_carve(lens).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`View::carve`], with a [`KernelError::BadViews`] instead of a panic when the
    /// lengths add up to more than the view (or overflow `usize`).
    pub fn try_carve<const N: usize>(
        &self,
        lens: [usize; N],
    ) -> Result<[View<'a, B>; N], KernelError> {
        carve_total(self.buf.name(), &lens, self.len())?;
        // `start + total <= buffer len`, so `at + n` below cannot overflow.
        let mut at = self.range.start;
        Ok(lens.map(|n| {
            let v = View::new(self.buf, at..at + n);
            at += n;
            v
        }))
    }
}

#[cfg(test)]
impl<'a, B: Buffer> View<'a, B> {
    /// A view with no bounds check, to test that the devices refuse one outside its
    /// buffer (their backstop behind the checked constructors).
    pub(crate) fn unchecked_for_tests(buf: &'a B, range: Range<usize>) -> Self {
        View::new(buf, range)
    }
}

#[cfg(test)]
impl<'a, B: Buffer> ViewMut<'a, B> {
    /// As [`View::unchecked_for_tests`].
    pub(crate) fn unchecked_for_tests(buf: &'a mut B, range: Range<usize>) -> Self {
        ViewMut::new(buf, range)
    }
}
