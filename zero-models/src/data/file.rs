//! Token files: nanoGPT's `.bin` (raw little-endian uint16, nothing else) and llm.c's
//! `.bin` (a header of 256 little-endian int32: [0] = magic 20240520, [1] = version 1,
//! [2] = token count; then that many little-endian uint16). Tokens are read where asked
//! (positioned reads, one per sequence), decoded on read (no alignment or endianness
//! assumption) and checked against the vocabulary there, so opening a 20 GB file costs
//! nothing. The file is not memory-mapped: a file truncated under a running job (nanoGPT's
//! `prepare.py` writing it again) then gives an error naming it, where a mapping dies of
//! SIGBUS without a word of which file.

use super::DataError;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// llm.c's header magic for token files.
pub const LLMC_MAGIC: i32 = 20240520;
/// llm.c's token-file version with uint16 tokens.
pub const LLMC_VERSION: i32 = 1;
/// Bytes of the llm.c header (256 int32).
const LLMC_HEADER_BYTES: usize = 256 * 4;

/// How a token file is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenFormat {
    /// nanoGPT: raw little-endian uint16.
    NanoGpt,
    /// llm.c: 1024-byte header, then uint16.
    LlmC,
    /// llm.c if the file starts with its magic, else nanoGPT. (The magic read as two
    /// uint16 tokens is 54472, 308: outside GPT-2's 50257, so no GPT-2 nanoGPT file is
    /// taken for llm.c.)
    Auto,
}

enum Storage {
    /// A token file and the byte offset of its first token.
    File(File, u64),
    Owned(Vec<u16>),
}

/// A read-only sequence of tokens with a known vocabulary bound.
pub struct Tokens {
    storage: Storage,
    len: usize,
    vocab: usize,
    name: String,
}

fn io_err(path: &Path, source: std::io::Error) -> DataError {
    DataError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Int32 `i` of the header bytes `head` (the caller checked `head` holds it).
fn header_i32(head: &[u8], i: usize) -> i32 {
    i32::from_le_bytes([
        head[4 * i],
        head[4 * i + 1],
        head[4 * i + 2],
        head[4 * i + 3],
    ])
}

/// Whether the file starts with what llm.c writes, whatever its magic: a small version
/// ([1]), a token count ([2]) that the file's length matches for 2- or 4-byte tokens, and
/// zeros in the rest of the 256 int32. (Raw tokens do that by chance with odds of about
/// 2^-8000.)
fn looks_like_llmc_header(head: &[u8], file_len: u64) -> bool {
    if head.len() < LLMC_HEADER_BYTES {
        return false;
    }
    let (version, count) = (header_i32(head, 1), header_i32(head, 2));
    let body = file_len - LLMC_HEADER_BYTES as u64;
    (1..=16).contains(&version)
        && count > 0
        && (body == 2 * count as u64 || body == 4 * count as u64)
        && (3..256).all(|i| header_i32(head, i) == 0)
}

impl Tokens {
    /// Open a token file; tokens are checked against `vocab` as they are read.
    pub fn open(path: &Path, format: TokenFormat, vocab: usize) -> Result<Self, DataError> {
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        let file_len = file.metadata().map_err(|e| io_err(path, e))?.len();
        // The header (llm.c's, or the first tokens): what the format is told by.
        let mut head = vec![0u8; file_len.min(LLMC_HEADER_BYTES as u64) as usize];
        file.read_exact_at(&mut head, 0)
            .map_err(|e| io_err(path, e))?;
        let p = PathBuf::from(path);
        let is_llmc = head.len() >= 4 && header_i32(&head, 0) == LLMC_MAGIC;
        // A header shaped like llm.c's but with another magic is a wrong file (or another
        // llm.c format), not raw tokens that happen to start oddly.
        let format = match format {
            TokenFormat::Auto if is_llmc || looks_like_llmc_header(&head, file_len) => {
                TokenFormat::LlmC
            }
            TokenFormat::Auto => TokenFormat::NanoGpt,
            f => f,
        };
        let offset = match format {
            TokenFormat::LlmC => {
                if head.len() < LLMC_HEADER_BYTES {
                    return Err(DataError::Truncated {
                        path: p,
                        detail: format!(
                            "{file_len} bytes, shorter than the {LLMC_HEADER_BYTES}-byte llm.c header"
                        ),
                    });
                }
                let magic = header_i32(&head, 0);
                if magic != LLMC_MAGIC {
                    return Err(DataError::WrongMagic {
                        path: p,
                        found: magic,
                    });
                }
                let version = header_i32(&head, 1);
                if version != LLMC_VERSION {
                    return Err(DataError::WrongVersion {
                        path: p,
                        found: version,
                    });
                }
                let header = header_i32(&head, 2) as u32 as u64;
                let body = file_len - LLMC_HEADER_BYTES as u64;
                if body < 2 * header {
                    return Err(DataError::Truncated {
                        path: p,
                        detail: format!(
                            "header says {header} tokens ({} bytes), the file holds {body} bytes after the header",
                            2 * header
                        ),
                    });
                }
                if body > 2 * header {
                    return Err(DataError::LengthMismatch {
                        path: p,
                        header,
                        found: body / 2,
                    });
                }
                LLMC_HEADER_BYTES
            }
            _ => {
                if file_len % 2 != 0 {
                    return Err(DataError::Truncated {
                        path: p,
                        detail: format!("{file_len} bytes is not a whole number of uint16 tokens"),
                    });
                }
                0
            }
        };
        let len = usize::try_from((file_len - offset as u64) / 2).map_err(|_| {
            DataError::Invalid(format!("{}: too many tokens for this host", path.display()))
        })?;
        log::debug!("opened {} ({format:?}): {len} tokens", path.display());
        Ok(Tokens {
            storage: Storage::File(file, offset as u64),
            len,
            vocab,
            name: path.display().to_string(),
        })
    }

    /// Tokens `start..start + out.len()` (within `len`) into `out`, unchecked.
    fn read_raw(&self, start: usize, out: &mut [u16]) -> Result<(), DataError> {
        let end = start.saturating_add(out.len());
        if end > self.len {
            return Err(DataError::Invalid(format!(
                "{}: tokens {start}..{end} asked of {}",
                self.name, self.len
            )));
        }
        match &self.storage {
            Storage::Owned(v) => out.copy_from_slice(&v[start..end]),
            Storage::File(file, offset) => {
                // Read straight into `out` (no buffer per sequence), then from little-endian.
                // SAFETY: the bytes of `out`'s u16s, u8 has no alignment, and every bit
                // pattern is a valid u16.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 2 * out.len())
                };
                let at = offset + 2 * start as u64;
                file.read_exact_at(bytes, at).map_err(|e| {
                    let path = PathBuf::from(&self.name);
                    match e.kind() {
                        std::io::ErrorKind::UnexpectedEof => DataError::Truncated {
                            path,
                            detail: format!(
                                "it held {} tokens when opened, and reading tokens {start}..{end} \
                                 found its end: the file was changed while this run reads it; \
                                 write a new token file under another name, not over data.path \
                                 of a running job",
                                self.len
                            ),
                        },
                        _ => io_err(&path, e),
                    }
                })?;
                for t in out.iter_mut() {
                    *t = u16::from_le(*t);
                }
            }
        }
        Ok(())
    }

    /// Tokens `start, start + 1, ...` into `out`, wrapping around past the last token
    /// (`start < len`), each checked against the vocabulary: one sequence of a batch.
    pub fn read_wrapping(&self, start: usize, out: &mut [u16]) -> Result<(), DataError> {
        if start >= self.len && !out.is_empty() {
            return Err(DataError::Invalid(format!(
                "{}: a sequence from token {start} of {}",
                self.name, self.len
            )));
        }
        let mut filled = 0;
        let mut at = start;
        while filled < out.len() {
            let n = (out.len() - filled).min(self.len - at);
            self.read_raw(at, &mut out[filled..filled + n])?;
            if let Some(i) = out[filled..filled + n]
                .iter()
                .position(|&t| t as usize >= self.vocab)
            {
                return Err(DataError::TokenOutOfVocab {
                    source_name: self.name.clone(),
                    position: (at + i) as u64,
                    token: out[filled + i],
                    vocab: self.vocab,
                });
            }
            filled += n;
            at = 0;
        }
        Ok(())
    }

    /// Tokens held in memory (a generated corpus), checked against `vocab` now.
    pub fn from_vec(name: &str, tokens: Vec<u16>, vocab: usize) -> Result<Self, DataError> {
        if let Some(i) = tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(DataError::TokenOutOfVocab {
                source_name: name.to_string(),
                position: i as u64,
                token: tokens[i],
                vocab,
            });
        }
        Ok(Tokens {
            len: tokens.len(),
            storage: Storage::Owned(tokens),
            vocab,
            name: name.to_string(),
        })
    }

    /// Read the tokens of `range` (clipped to the tokens there are) in order, unchecked,
    /// in chunks of 2^24 (32 MiB): `visit(start, chunk)` for each, until it returns false.
    /// What a whole-file pass (the vocabulary check, `data info`) reads with.
    pub fn scan(
        &self,
        range: std::ops::Range<usize>,
        mut visit: impl FnMut(usize, &[u16]) -> bool,
    ) -> Result<(), DataError> {
        const CHUNK: usize = 1 << 24;
        let range = range.start.min(self.len)..range.end.min(self.len);
        let mut chunk = vec![0u16; range.len().min(CHUNK)];
        let mut at = range.start;
        while at < range.end {
            let end = (at + CHUNK).min(range.end);
            let part = &mut chunk[..end - at];
            self.read_raw(at, part)?;
            if !visit(at, part) {
                break;
            }
            at = end;
        }
        Ok(())
    }

    /// The first token in `range` outside the vocabulary, as (position, token), reading
    /// the tokens without checking them one by one; `progress(done)` is called every
    /// 2^24 tokens with the tokens read so far. Scanning a 10 GB file this way takes
    /// seconds; split the range across ranks to share it.
    pub fn first_out_of_vocab(
        &self,
        range: std::ops::Range<usize>,
        mut progress: impl FnMut(usize),
    ) -> Result<Option<(usize, u16)>, DataError> {
        let vocab = self.vocab.min(1 << 16) as u32;
        let first = range.start.min(self.len);
        let mut found = None;
        self.scan(range, |at, part| {
            found = (part.iter().position(|&t| t as u32 >= vocab)).map(|i| (at + i, part[i]));
            if found.is_none() {
                progress(at + part.len() - first);
            }
            found.is_none()
        })?;
        Ok(found)
    }

    /// A fingerprint of the tokens for telling copies apart: the CRC32 of 256 windows of
    /// 16 tokens spread evenly over the file (read unchecked), the same in every process
    /// and build; compare it with the count. Equal copies agree; a stale or other file
    /// almost surely differs, at the cost of 256 reads.
    pub fn fingerprint(&self) -> Result<u32, DataError> {
        let mut h = crc32fast::Hasher::new();
        const WINDOWS: usize = 256;
        const WIDTH: usize = 16;
        let mut window = [0u16; WIDTH];
        for w in 0..WINDOWS {
            let start = (self.len.saturating_sub(WIDTH) as u128 * w as u128 / (WINDOWS - 1) as u128)
                as usize;
            let window = &mut window[..WIDTH.min(self.len - start)];
            self.read_raw(start, window)?;
            for t in window.iter() {
                h.update(&t.to_le_bytes());
            }
        }
        Ok(h.finalize())
    }

    /// The size in bytes of what the tokens are read from now: the open file's length
    /// (taken from the open handle, so a file replaced by a rename, which this run does not
    /// read, does not count), or two bytes per token held in memory. Compared with the size
    /// at the start, it tells a file written again in place under a running job.
    pub fn bytes_now(&self) -> Result<u64, DataError> {
        match &self.storage {
            Storage::Owned(v) => Ok(2 * v.len() as u64),
            Storage::File(file, _) => file
                .metadata()
                .map(|m| m.len())
                .map_err(|e| io_err(Path::new(&self.name), e)),
        }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The vocabulary bound tokens are checked against.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// File path or corpus name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Token `i` (< len), checked against the vocabulary.
    pub fn get(&self, i: usize) -> Result<u16, DataError> {
        let mut one = [0u16];
        self.read_raw(i, &mut one)?;
        let t = one[0];
        if t as usize >= self.vocab {
            return Err(DataError::TokenOutOfVocab {
                source_name: self.name.clone(),
                position: i as u64,
                token: t,
                vocab: self.vocab,
            });
        }
        Ok(t)
    }
}

/// A token file written as tokens come (llm.c's or nanoGPT's layout), under a temporary
/// name beside `path` that becomes `path` only in [`TokenWriter::finish`]: an error or a
/// drop before that removes it, so no partial file is ever left under the final name.
/// [`TokenWriter::create`] replaces an existing file; [`TokenWriter::create_new`] refuses
/// one, and puts its file in place without replacing one that another process wrote
/// meanwhile (`zero_core::files::place_new`). The temporary name is tracked while it
/// exists (`zero_core::files::track_temporary`), so that a signal handler can remove it.
pub struct TokenWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<BufWriter<File>>,
    llmc: bool,
    overwrite: bool,
    count: u64,
    /// The little-endian bytes of at most [`WRITE_CHUNK`] tokens: bounded whatever the
    /// length of the slices written.
    bytes: Vec<u8>,
    /// Set once `tmp` has its final name; until then a drop removes `tmp`. (`file` cannot
    /// tell: `finish` takes it before its last writes, which may fail.)
    done: bool,
    /// Declared last: dropped after `Drop::drop` removed `tmp`.
    _tracked: zero_core::files::TrackedTemporary,
}

/// Tokens converted to bytes at a time by [`TokenWriter::write`] (128 KiB of bytes).
const WRITE_CHUNK: usize = 1 << 16;

/// An output that cannot be written at `path`: an I/O error where the file system said
/// no (a directory missing on the way...), else what is wrong with the path.
fn output_err(path: &Path, e: zero_core::files::OutputError) -> DataError {
    use zero_core::files::OutputError as O;
    match e {
        O::NoDirectory(_) | O::NotADirectory(_) => DataError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, e.to_string()),
        },
        O::Io { source, .. } | O::Place { source, .. } => io_err(path, source),
        e => DataError::Invalid(e.to_string()),
    }
}

impl TokenWriter {
    /// Start writing `path` in `format` (`LlmC` or `NanoGpt`; `Auto` is an error),
    /// replacing an existing file when finished.
    pub fn create(path: &Path, format: TokenFormat) -> Result<Self, DataError> {
        Self::open(path, format, true)
    }

    /// Start writing `path` in `format`, which must not exist: an existing file is an
    /// error now, and one that appears meanwhile is an error of [`TokenWriter::finish`]
    /// (and is kept).
    pub fn create_new(path: &Path, format: TokenFormat) -> Result<Self, DataError> {
        Self::open(path, format, false)
    }

    fn open(path: &Path, format: TokenFormat, overwrite: bool) -> Result<Self, DataError> {
        let llmc = match format {
            TokenFormat::LlmC => true,
            TokenFormat::NanoGpt => false,
            TokenFormat::Auto => {
                return Err(DataError::Invalid(format!(
                    "{}: say which format to write (llm.c or nanoGPT), not Auto",
                    path.display()
                )))
            }
        };
        // Through a symbolic link to its target; never over a device, FIFO or socket; in
        // a directory that exists; not over an existing file unless `overwrite`.
        let path =
            &zero_core::files::check_output(path, overwrite).map_err(|e| output_err(path, e))?;
        let name = path
            .file_name()
            .ok_or_else(|| DataError::Invalid(format!("{}: not a file name", path.display())))?;
        zero_core::files::remove_stale_temporaries(path);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp-{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        let tracked = zero_core::files::track_temporary(&tmp);
        let file = File::create(&tmp).map_err(|e| io_err(path, e))?;
        let mut w = TokenWriter {
            path: path.to_path_buf(),
            tmp,
            file: Some(BufWriter::with_capacity(1 << 20, file)),
            llmc,
            overwrite,
            count: 0,
            bytes: Vec::new(),
            done: false,
            _tracked: tracked,
        };
        if llmc {
            // The count is filled in by finish().
            let mut header = [0u8; LLMC_HEADER_BYTES];
            header[0..4].copy_from_slice(&LLMC_MAGIC.to_le_bytes());
            header[4..8].copy_from_slice(&LLMC_VERSION.to_le_bytes());
            w.write_bytes(&header)?;
        }
        Ok(w)
    }

    fn write_bytes(&mut self, bytes: &[u8]) -> Result<(), DataError> {
        match self.file.as_mut() {
            Some(f) => f.write_all(bytes).map_err(|e| io_err(&self.path, e)),
            None => Err(DataError::Invalid(format!(
                "{}: written after finish",
                self.path.display()
            ))),
        }
    }

    /// Append tokens. An llm.c file holds at most i32::MAX tokens (its header's count).
    /// The tokens are converted 64 Ki at a time (`WRITE_CHUNK`), so writing a long slice
    /// takes no memory in proportion to it.
    pub fn write(&mut self, tokens: &[u16]) -> Result<(), DataError> {
        let count = self.count + tokens.len() as u64;
        if self.llmc && count > LLMC_MAX_TOKENS {
            return Err(DataError::Invalid(format!(
                "{}: {count} tokens do not fit the llm.c header's int32 count (at most \
                 {LLMC_MAX_TOKENS}); write nanoGPT's format or split the text",
                self.path.display(),
            )));
        }
        let mut bytes = std::mem::take(&mut self.bytes);
        let mut written = Ok(());
        for part in tokens.chunks(WRITE_CHUNK) {
            bytes.clear();
            part.iter()
                .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
            written = self.write_bytes(&bytes);
            if written.is_err() {
                break;
            }
        }
        self.bytes = bytes;
        written?;
        self.count = count;
        Ok(())
    }

    /// Tokens written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Write the llm.c count, flush to disk and move the file to its name; the count.
    /// On an error (a full disk at the last flush, or, from [`TokenWriter::create_new`],
    /// a file that appeared under the name meanwhile) the temporary file is removed.
    pub fn finish(mut self) -> Result<u64, DataError> {
        let Some(w) = self.file.take() else {
            return Err(DataError::Invalid(format!(
                "{}: finished twice",
                self.path.display()
            )));
        };
        let mut f = w
            .into_inner()
            .map_err(|e| io_err(&self.path, e.into_error()))?;
        if self.llmc {
            // write() kept count <= i32::MAX.
            let count = self.count as i32;
            f.seek(SeekFrom::Start(8))
                .and_then(|_| f.write_all(&count.to_le_bytes()))
                .map_err(|e| io_err(&self.path, e))?;
        }
        f.sync_all().map_err(|e| io_err(&self.path, e))?;
        drop(f);
        if self.overwrite {
            std::fs::rename(&self.tmp, &self.path).map_err(|e| io_err(&self.path, e))?;
        } else {
            zero_core::files::place_new(&self.tmp, &self.path)
                .map_err(|e| output_err(&self.path, e))?;
        }
        self.done = true;
        // The new name durable too: else a crash soon after can lose it. The file is
        // whole under its name already, so a failure here is a warning, not lost work.
        zero_core::files::sync_directory_of(&self.path);
        Ok(self.count)
    }
}

/// The most tokens an llm.c file holds: its header's count is an int32.
const LLMC_MAX_TOKENS: u64 = i32::MAX as u64;

impl Drop for TokenWriter {
    fn drop(&mut self) {
        // Not finished (an error on the way, in `finish` too): leave nothing behind.
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

fn write_file(path: &Path, format: TokenFormat, tokens: &[u16]) -> Result<(), DataError> {
    let mut w = TokenWriter::create(path, format)?;
    w.write(tokens)?;
    w.finish().map(|_| ())
}

/// Write tokens as an llm.c `.bin` (header with magic, version 1, count; then uint16),
/// atomically (a temporary file renamed, as [`TokenWriter`]).
pub fn write_llmc(path: &Path, tokens: &[u16]) -> Result<(), DataError> {
    write_file(path, TokenFormat::LlmC, tokens)
}

/// Write tokens as a nanoGPT `.bin` (raw little-endian uint16), atomically.
pub fn write_nanogpt(path: &Path, tokens: &[u16]) -> Result<(), DataError> {
    write_file(path, TokenFormat::NanoGpt, tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zero_core::files::entry_names;

    #[test]
    fn a_failed_finish_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("tokens.bin");
        for format in [TokenFormat::LlmC, TokenFormat::NanoGpt] {
            let mut w = TokenWriter::create(&path, format).unwrap();
            w.write(&[1, 2, 3]).unwrap();
            // A directory took the name meanwhile: the final rename fails.
            std::fs::create_dir(&path).unwrap();
            let err = w.finish().unwrap_err();
            assert!(err.to_string().contains("tokens.bin"), "{err}");
            assert_eq!(
                entry_names(tmp.path()).unwrap(),
                ["tokens.bin"],
                "{format:?}"
            );
            std::fs::remove_dir(&path).unwrap();
        }
    }

    /// A long slice is converted a chunk at a time: the writer's buffer stays bounded,
    /// and the file holds every token in order.
    #[test]
    fn long_writes_are_converted_in_bounded_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("long.bin");
        let n = 3 * WRITE_CHUNK + 5;
        let tokens: Vec<u16> = (0..n).map(|i| (i % 50_000) as u16).collect();
        let mut w = TokenWriter::create_new(&path, TokenFormat::NanoGpt).unwrap();
        w.write(&tokens).unwrap();
        w.write(&tokens[..7]).unwrap();
        assert!(
            w.bytes.capacity() <= 2 * WRITE_CHUNK,
            "{} bytes buffered",
            w.bytes.capacity()
        );
        assert_eq!(w.finish().unwrap(), (n + 7) as u64);
        let t = Tokens::open(&path, TokenFormat::NanoGpt, 65536).unwrap();
        let mut back = vec![0u16; t.len()];
        t.read_wrapping(0, &mut back).unwrap();
        assert_eq!(back[..n], tokens[..]);
        assert_eq!(back[n..], tokens[..7]);
    }

    /// create_new refuses an existing file at once, and at finish one that appeared
    /// meanwhile, keeping it and leaving no temporary file.
    #[test]
    fn create_new_never_replaces_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t.bin");
        std::fs::write(&path, b"mine").unwrap();
        let e = TokenWriter::create_new(&path, TokenFormat::LlmC)
            .err()
            .unwrap();
        assert!(e.to_string().contains("exists; not overwriting it"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let mut w = TokenWriter::create_new(&path, TokenFormat::LlmC).unwrap();
        w.write(&[1, 2]).unwrap();
        std::fs::write(&path, b"theirs").unwrap();
        let e = w.finish().unwrap_err();
        assert!(e.to_string().contains("exists; not overwriting it"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"theirs");
        assert_eq!(entry_names(tmp.path()).unwrap(), ["t.bin"]);
        let e = TokenWriter::create_new(&tmp.path().join("nodir/t.bin"), TokenFormat::LlmC)
            .err()
            .unwrap();
        let why = std::error::Error::source(&e).map(|c| c.to_string());
        assert!(
            matches!(e, DataError::Io { .. })
                && why.is_some_and(|w| w.ends_with("nodir' does not exist; create it first")),
            "{e}"
        );
    }

    #[test]
    fn a_dropped_writer_leaves_nothing_and_a_finished_one_its_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("t.bin");
        let mut w = TokenWriter::create(&path, TokenFormat::NanoGpt).unwrap();
        w.write(&[7]).unwrap();
        drop(w);
        assert!(entry_names(tmp.path()).unwrap().is_empty());
        let mut w = TokenWriter::create(&path, TokenFormat::LlmC).unwrap();
        w.write(&[7, 8]).unwrap();
        assert_eq!(w.finish().unwrap(), 2);
        assert_eq!(entry_names(tmp.path()).unwrap(), ["t.bin"]);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            (LLMC_HEADER_BYTES + 4) as u64
        );
    }
}
