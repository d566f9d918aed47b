//! One rank's HDF5 shard file: `/unit<u>/{master,adam_m,adam_v}`, 1-D fp32 datasets of
//! the unit's `shard_len` elements (the rank's block of the unit's padded flat buffer).
//!
//! Writes stream from the engine's live buffers, one dataset at a time, and return the
//! CRC32 of every block of [`BLOCK_ELEMS`] elements. Reads take a hyperslab, widened to
//! whole blocks so that every element handed out has been checked against the saved
//! CRC (at most two extra blocks read per range).

use std::collections::hash_map::{Entry, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::meta::Meta;
use super::CheckpointError;

/// Elements per checksummed block (256 KiB of fp32).
pub const BLOCK_ELEMS: usize = 1 << 16;

/// The datasets of every unit, in the order of the checksums in the metadata.
pub const KINDS: [&str; 3] = ["master", "adam_m", "adam_v"];

/// Dataset path of `kind` (index in [`KINDS`]) of unit `unit`; an error for a `kind`
/// past [`KINDS`].
pub fn dataset_name(unit: usize, kind: usize) -> Result<String, CheckpointError> {
    let Some(name) = KINDS.get(kind) else {
        return Err(CheckpointError::Invalid(format!(
            "dataset kind {kind} of unit {unit}: a unit has {} datasets, kinds 0..{} ({})",
            KINDS.len(),
            KINDS.len(),
            KINDS.join(", ")
        )));
    };
    Ok(format!("unit{unit:04}/{name}"))
}

/// CRC32 of each block of `data`.
pub fn block_crcs(data: &[f32], block: usize) -> Vec<u32> {
    data.chunks(block)
        .map(|c| crc32fast::hash(bytemuck::cast_slice(c)))
        .collect()
}

/// A shard file being written.
pub struct ShardWriter {
    path: PathBuf,
    file: hdf5::File,
    block: usize,
}

impl ShardWriter {
    /// Create (fail if it exists) the file at `path`, with the rank and step as attributes;
    /// checksums will cover blocks of `block` elements.
    pub fn create(
        path: &Path,
        rank: usize,
        world: usize,
        step: u64,
        block: usize,
    ) -> Result<Self, CheckpointError> {
        if block == 0 {
            return Err(CheckpointError::Invalid(
                "checksum block of 0 elements".into(),
            ));
        }
        let file = hdf5::File::create_excl(path).map_err(CheckpointError::h5(path, "(file)"))?;
        for (name, value) in [
            ("rank", rank as u64),
            ("world", world as u64),
            ("step", step),
        ] {
            file.new_attr::<u64>()
                .create(name)
                .and_then(|a| a.write_scalar(&value))
                .map_err(CheckpointError::h5(path, format!("attribute {name}")))?;
        }
        Ok(ShardWriter {
            path: path.to_path_buf(),
            file,
            block,
        })
    }

    /// Write the three datasets of unit `unit`; returns their block CRCs in [`KINDS`] order.
    pub fn write_unit(
        &mut self,
        unit: usize,
        data: [&[f32]; 3],
    ) -> Result<Vec<Vec<u32>>, CheckpointError> {
        let group = format!("unit{unit:04}");
        let g = self
            .file
            .create_group(&group)
            .map_err(CheckpointError::h5(&self.path, &group))?;
        let mut crcs = Vec::with_capacity(KINDS.len());
        for (kind, (values, short)) in data.iter().zip(KINDS).enumerate() {
            let name = dataset_name(unit, kind)?;
            g.new_dataset::<f32>()
                .shape(values.len())
                .create(short)
                .and_then(|ds| ds.write_raw(*values))
                .map_err(CheckpointError::h5(&self.path, &name))?;
            crcs.push(block_crcs(values, self.block));
        }
        Ok(crcs)
    }

    /// Flush, close and fsync the file: after this returns its bytes are on disk.
    pub fn finish(self) -> Result<(), CheckpointError> {
        self.file
            .flush()
            .map_err(CheckpointError::h5(&self.path, "(file)"))?;
        let ShardWriter { path, file, .. } = self;
        file.close().map_err(CheckpointError::h5(&path, "(file)"))?;
        let f = std::fs::File::open(&path).map_err(CheckpointError::io("open", &path))?;
        f.sync_all().map_err(CheckpointError::io("fsync", &path))
    }
}

/// A shard file open for checked reads.
pub struct ShardReader {
    path: PathBuf,
    file: hdf5::File,
}

impl ShardReader {
    /// Open `path` read-only.
    pub fn open(path: &Path) -> Result<Self, CheckpointError> {
        if !path.exists() {
            return Err(CheckpointError::Io {
                what: "open shard file",
                path: path.to_path_buf(),
                cause: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        }
        let file = hdf5::File::open(path).map_err(CheckpointError::h5(path, "(file)"))?;
        Ok(ShardReader {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Check the file is rank `rank`'s shard of the `world`-rank checkpoint of step `step`
    /// (its attributes, written by [`ShardWriter::create`]): a shard copied in from another
    /// step or run, or a `meta.json` edited or damaged, is refused instead of loaded.
    pub fn check_identity(
        &self,
        rank: usize,
        world: usize,
        step: u64,
        meta: &Path,
    ) -> Result<(), CheckpointError> {
        for (name, want) in [
            ("rank", rank as u64),
            ("world", world as u64),
            ("step", step),
        ] {
            let have: u64 = self
                .file
                .attr(name)
                .and_then(|a| a.read_scalar())
                .map_err(CheckpointError::h5(&self.path, format!("attribute {name}")))?;
            if have != want {
                return Err(CheckpointError::Meta {
                    path: meta.to_path_buf(),
                    reason: format!(
                        "it describes {name} {want}, but the shard file {} says {name} {have}: the file belongs to another checkpoint (copied in from another step or run?), or the metadata was changed; resume from an intact checkpoint",
                        self.path.display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Byte offset of dataset `kind` of unit `unit` in the file (contiguous storage), for
    /// low-level inspection.
    pub fn dataset_offset(&self, unit: usize, kind: usize) -> Result<Option<u64>, CheckpointError> {
        let name = dataset_name(unit, kind)?;
        let ds = self
            .file
            .dataset(&name)
            .map_err(CheckpointError::h5(&self.path, &name))?;
        Ok(ds.offset())
    }

    /// Elements `range` of dataset `kind` of unit `unit`, which must hold `len` elements,
    /// each covering block checked against `crcs` (blocks of `block` elements).
    pub fn read_checked(
        &self,
        unit: usize,
        kind: usize,
        range: Range<usize>,
        len: usize,
        crcs: &[u32],
        block: usize,
    ) -> Result<Vec<f32>, CheckpointError> {
        // The dataset's real size first: a corrupt metadata file must not make us
        // allocate what it claims.
        let ds = self.dataset_of(unit, kind, len)?;
        self.check_read(unit, kind, &range, len, range.len(), block)?;
        let mut out = vec![0.0f32; range.len()];
        self.read_dataset_into(&ds, unit, kind, range, len, crcs, block, &mut out)?;
        Ok(out)
    }

    /// Dataset `kind` of unit `unit`, checked to be 1-D of `len` elements.
    fn dataset_of(
        &self,
        unit: usize,
        kind: usize,
        len: usize,
    ) -> Result<hdf5::Dataset, CheckpointError> {
        let name = dataset_name(unit, kind)?;
        let ds = self
            .file
            .dataset(&name)
            .map_err(CheckpointError::h5(&self.path, &name))?;
        if ds.size() != len || ds.ndim() != 1 {
            return Err(CheckpointError::Shape {
                path: self.path.clone(),
                dataset: name,
                found: ds.shape(),
                expected: len,
            });
        }
        Ok(ds)
    }

    /// [`Self::read_checked`] into `out` (`range.len()` elements). A whole dataset is
    /// read straight into `out` (no staging copy): the common case of a load on the same
    /// world size.
    #[allow(clippy::too_many_arguments)]
    pub fn read_checked_into(
        &self,
        unit: usize,
        kind: usize,
        range: Range<usize>,
        len: usize,
        crcs: &[u32],
        block: usize,
        out: &mut [f32],
    ) -> Result<(), CheckpointError> {
        let ds = self.dataset_of(unit, kind, len)?;
        self.check_read(unit, kind, &range, len, out.len(), block)?;
        self.read_dataset_into(&ds, unit, kind, range, len, crcs, block, out)
    }

    /// A read of `range` into `out_len` elements from a dataset of `len` elements, in
    /// checksum blocks of `block`, must fit.
    fn check_read(
        &self,
        unit: usize,
        kind: usize,
        range: &Range<usize>,
        len: usize,
        out_len: usize,
        block: usize,
    ) -> Result<(), CheckpointError> {
        if range.end > len || range.start > range.end || out_len != range.len() || block == 0 {
            return Err(CheckpointError::Invalid(format!(
                "read of {}..{} into {out_len} elements from '{}' of {len} elements in '{}' (checksum block {block})",
                range.start,
                range.end,
                dataset_name(unit, kind)?,
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Elements `range` of the opened dataset `ds` (already checked) into `out`, each
    /// covering block checked against `crcs`.
    #[allow(clippy::too_many_arguments)]
    fn read_dataset_into(
        &self,
        ds: &hdf5::Dataset,
        unit: usize,
        kind: usize,
        range: Range<usize>,
        len: usize,
        crcs: &[u32],
        block: usize,
        out: &mut [f32],
    ) -> Result<(), CheckpointError> {
        let name = dataset_name(unit, kind)?;
        if range.is_empty() {
            return Ok(());
        }
        let h5 = CheckpointError::h5(&self.path, &name);
        if range == (0..len) {
            ds.read_into_raw(out).map_err(h5)?;
            return self.check_blocks(&name, out, 0, crcs, block);
        }
        // Widen to whole blocks so that every element returned is covered by a CRC.
        let (b0, b1) = (range.start / block, range.end.div_ceil(block));
        let wide = b0 * block..(b1 * block).min(len);
        let data = ds.read_slice_1d::<f32, _>(wide.clone()).map_err(h5)?;
        let data = data.as_slice().ok_or_else(|| {
            CheckpointError::Invalid(format!("'{name}': HDF5 returned a strided array"))
        })?;
        self.check_blocks(&name, data, b0, crcs, block)?;
        let skip = range.start - wide.start;
        out.copy_from_slice(&data[skip..skip + range.len()]);
        Ok(())
    }

    /// Check `data`, which starts at block `b0` of dataset `name`, block by block.
    fn check_blocks(
        &self,
        name: &str,
        data: &[f32],
        b0: usize,
        crcs: &[u32],
        block: usize,
    ) -> Result<(), CheckpointError> {
        for (i, chunk) in data.chunks(block).enumerate() {
            let b = b0 + i;
            let found = crc32fast::hash(bytemuck::cast_slice(chunk));
            let saved = crcs.get(b).copied().ok_or_else(|| {
                CheckpointError::Invalid(format!("no checksum for block {b} of '{name}'"))
            })?;
            if found != saved {
                return Err(CheckpointError::Checksum {
                    path: self.path.clone(),
                    dataset: name.to_string(),
                    start: b * block,
                    end: b * block + chunk.len(),
                    found,
                    saved,
                });
            }
        }
        Ok(())
    }
}

/// The most shard files a load, or an offline tool reading tensors, keeps open at once.
/// A checkpoint of N ranks has N files and a stage-0 load reads all of them: kept open
/// until the end, a few thousand ranks would pass the usual `ulimit -n` of 1024 (EMFILE).
pub const MAX_OPEN_SHARDS: usize = 16;

/// Rank `rank`'s reader of the checkpoint in `dir`, from `files` (a cache by rank) or
/// opened and checked to be that rank's shard of this checkpoint
/// ([`ShardReader::check_identity`]) on every open. `files` never holds more than
/// [`MAX_OPEN_SHARDS`] readers: to open another, the one of the highest rank is closed
/// (reads sweep the ranks upwards unit after unit, so the low ranks kept open are hit
/// again on the next sweep, where dropping the oldest would miss every time).
pub(crate) fn cached_reader<'a>(
    files: &'a mut HashMap<usize, ShardReader>,
    dir: &Path,
    meta: &Meta,
    rank: usize,
) -> Result<&'a ShardReader, CheckpointError> {
    if !files.contains_key(&rank) {
        // Down to one below the bound (a caller may have filled the map itself).
        while files.len() >= MAX_OPEN_SHARDS {
            let Some(&highest) = files.keys().max() else {
                break;
            };
            files.remove(&highest);
        }
    }
    Ok(match files.entry(rank) {
        Entry::Occupied(o) => o.into_mut(),
        Entry::Vacant(v) => {
            let reader = ShardReader::open(&dir.join(super::rank_file(rank)))?;
            reader.check_identity(rank, meta.world, meta.step, &dir.join(super::META_FILE))?;
            v.insert(reader)
        }
    })
}
