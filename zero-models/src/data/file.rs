//! Token files: nanoGPT's `.bin` (raw little-endian uint16, nothing else; nanoGPT has no
//! wider format) and llm.c's two `.bin` formats (llm.c's dev/data/data_common.py): a
//! header of 256 little-endian int32, [0] = magic, [1] = version, [2] = token count, then
//! that many little-endian tokens:
//!
//! - "gpt-2": magic 20240520, version 1, uint16 tokens ([`LLMC_MAGIC`], [`LLMC_VERSION`]);
//! - "llama-3": magic 20240801, version 7, uint32 tokens ([`LLMC_LLAMA3_MAGIC`],
//!   [`LLMC_LLAMA3_VERSION`]), for vocabularies past 65536 (Llama 3's V = 128256).
//!
//! Tokens are read where asked (positioned reads, one per sequence), decoded on read (no
//! alignment or endianness assumption) into u32 ids whatever the file's width, and checked
//! against the vocabulary there, so opening a 20 GB file costs nothing. A uint16 file is
//! read at its own width and widened in the caller's buffer, so it costs what it did
//! before uint32 files were read. The file is not memory-mapped: a file truncated under a
//! running job (nanoGPT's `prepare.py` writing it again) then gives an error naming it,
//! where a mapping dies of SIGBUS without a word of which file.

use super::DataError;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// llm.c's header magic of its "gpt-2" token files (uint16 tokens).
pub const LLMC_MAGIC: i32 = 20240520;
/// llm.c's version of its "gpt-2" token files (uint16 tokens).
pub const LLMC_VERSION: i32 = 1;
/// llm.c's header magic of its "llama-3" token files (uint32 tokens).
pub const LLMC_LLAMA3_MAGIC: i32 = 20240801;
/// llm.c's version of its "llama-3" token files (uint32 tokens).
pub const LLMC_LLAMA3_VERSION: i32 = 7;
/// Bytes of the llm.c header (256 int32).
const LLMC_HEADER_BYTES: usize = 256 * 4;

/// How a token file is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenFormat {
    /// nanoGPT: raw little-endian uint16 (the only width nanoGPT writes).
    NanoGpt,
    /// llm.c's "gpt-2" format: 1024-byte header (magic 20240520, version 1), then uint16.
    /// Opening a file with it accepts either llm.c format: the header says which.
    LlmC,
    /// llm.c's "llama-3" format: 1024-byte header (magic 20240801, version 7), then uint32.
    /// Opening a file with it accepts either llm.c format, as [`TokenFormat::LlmC`].
    LlmCLlama3,
    /// llm.c if the file starts with one of its magics, else nanoGPT. (Either magic read as
    /// two uint16 tokens is 55432 or 55713, then 308: outside GPT-2's 50257, so no GPT-2
    /// nanoGPT file is taken for llm.c.)
    Auto,
}

/// Bytes per token in a token file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenWidth {
    /// uint16: nanoGPT's files and llm.c's "gpt-2" format (ids below 65536).
    U16,
    /// uint32: llm.c's "llama-3" format.
    U32,
}

impl TokenWidth {
    /// Bytes of one token.
    pub const fn bytes(self) -> usize {
        match self {
            TokenWidth::U16 => 2,
            TokenWidth::U32 => 4,
        }
    }

    /// The type's name for messages ("uint16", "uint32").
    pub const fn name(self) -> &'static str {
        match self {
            TokenWidth::U16 => "uint16",
            TokenWidth::U32 => "uint32",
        }
    }
}

impl TokenFormat {
    /// The width of the tokens a file of this format holds (`Auto`: none until a file is
    /// looked at).
    pub const fn width(self) -> Option<TokenWidth> {
        match self {
            TokenFormat::NanoGpt | TokenFormat::LlmC => Some(TokenWidth::U16),
            TokenFormat::LlmCLlama3 => Some(TokenWidth::U32),
            TokenFormat::Auto => None,
        }
    }
}

enum Storage {
    /// A token file, the byte offset of its first token and its tokens' width.
    File {
        file: File,
        offset: u64,
        width: TokenWidth,
    },
    /// Tokens held in memory (the built-in corpus).
    Owned(Vec<u16>),
    /// Wide tokens held in memory.
    Owned32(Vec<u32>),
}

/// A read-only sequence of tokens with a known vocabulary bound, read as u32 ids.
pub struct Tokens {
    storage: Storage,
    len: usize,
    vocab: usize,
    name: String,
    /// The file's format as found (never `Auto`); `None` in memory.
    format: Option<TokenFormat>,
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

/// The llm.c format of a header's (magic, version), or why it is none. A version that is
/// one of the two formats' with the other magic is a wrong magic (the version says which
/// magic was due); a known magic with a version of neither is a wrong version.
fn llmc_format(path: &Path, magic: i32, version: i32) -> Result<TokenFormat, DataError> {
    match (magic, version) {
        (LLMC_MAGIC, LLMC_VERSION) => Ok(TokenFormat::LlmC),
        (LLMC_LLAMA3_MAGIC, LLMC_LLAMA3_VERSION) => Ok(TokenFormat::LlmCLlama3),
        (LLMC_MAGIC | LLMC_LLAMA3_MAGIC, v) if v != LLMC_VERSION && v != LLMC_LLAMA3_VERSION => {
            Err(DataError::WrongVersion {
                path: path.to_path_buf(),
                magic,
                found: version,
            })
        }
        _ => Err(DataError::WrongMagic {
            path: path.to_path_buf(),
            found: magic,
            version,
        }),
    }
}

/// The bytes of `out`'s u32s, to read a file straight into.
fn bytes_of(out: &mut [u32]) -> &mut [u8] {
    // SAFETY: the bytes of `out`'s u32s, borrowed mutably for as long as `out`; u8 has no
    // alignment, and every bit pattern is a valid u32.
    unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 4 * out.len()) }
}

/// Tokens widened in place: `out` (n u32s) holds n little-endian uint16 in its first 2n
/// bytes; afterwards it holds their values. From the end, in blocks whose source lies
/// wholly below their destination (a block [s, e) of tokens with s >= e/2 reads the
/// uint16s s..e, bytes 2s..2e, and writes the u32s s..e, bytes 4s..4e; 2e <= 4s), so each
/// block is one loop over two slices that the compiler vectorises, and no buffer is needed.
fn widen_u16_in_place(out: &mut [u32]) {
    const BLOCK: usize = 1 << 12;
    let mut e = out.len();
    while e > 1 {
        let s = e.div_ceil(2).max(e.saturating_sub(BLOCK));
        let (lo, hi) = out.split_at_mut(s);
        // SAFETY: the 2s u16s in the bytes of `lo`'s s u32s, borrowed for as long as `lo`:
        // u32's alignment is a multiple of u16's, and every bit pattern is a valid u16.
        let src = unsafe { std::slice::from_raw_parts(lo.as_ptr().cast::<u16>(), 2 * s) };
        hi[..e - s]
            .iter_mut()
            .zip(&src[s..e])
            .for_each(|(d, &c)| *d = u32::from(u16::from_le(c)));
        e = s;
    }
    if e == 1 {
        // SAFETY: as above, the first u16 in the bytes of `out[0]`.
        let t = unsafe { *out.as_ptr().cast::<u16>() };
        out[0] = u32::from(u16::from_le(t));
    }
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
        let is_llmc =
            head.len() >= 4 && matches!(header_i32(&head, 0), LLMC_MAGIC | LLMC_LLAMA3_MAGIC);
        // A header shaped like llm.c's but with another magic is a wrong file (or another
        // llm.c format), not raw tokens that happen to start oddly.
        let format = match format {
            TokenFormat::Auto if is_llmc || looks_like_llmc_header(&head, file_len) => {
                TokenFormat::LlmC
            }
            TokenFormat::Auto => TokenFormat::NanoGpt,
            TokenFormat::LlmCLlama3 => TokenFormat::LlmC,
            f => f,
        };
        let (format, offset) = match format {
            TokenFormat::NanoGpt => {
                if file_len % 2 != 0 {
                    return Err(DataError::Truncated {
                        path: p,
                        detail: format!(
                            "{file_len} bytes is not a whole number of uint16 tokens (a nanoGPT \
                             file is raw uint16; ids past 65535 need llm.c's llama-3 format)"
                        ),
                    });
                }
                (TokenFormat::NanoGpt, 0)
            }
            _ => {
                if head.len() < LLMC_HEADER_BYTES {
                    return Err(DataError::Truncated {
                        path: p,
                        detail: format!(
                            "{file_len} bytes, shorter than the {LLMC_HEADER_BYTES}-byte llm.c header"
                        ),
                    });
                }
                let found = llmc_format(&p, header_i32(&head, 0), header_i32(&head, 1))?;
                let token = found.width().unwrap_or(TokenWidth::U16);
                let width = token.bytes() as u64;
                let count = header_i32(&head, 2);
                let Ok(header) = u64::try_from(count) else {
                    return Err(DataError::CorruptHeader {
                        path: p,
                        detail: format!(
                            "its token count (int32 [2]) is {count}, negative; write the file \
                             again (llm.c's data scripts or `zero-bench data tokenize`)"
                        ),
                    });
                };
                let body = file_len - LLMC_HEADER_BYTES as u64;
                if body < width * header {
                    return Err(DataError::Truncated {
                        path: p,
                        detail: format!(
                            "header says {header} tokens ({} bytes of {}), the file holds {body} bytes after the header",
                            width * header,
                            token.name(),
                        ),
                    });
                }
                if body > width * header {
                    return Err(DataError::LengthMismatch {
                        path: p,
                        header,
                        found: body / width,
                    });
                }
                (found, LLMC_HEADER_BYTES as u64)
            }
        };
        let width = format.width().unwrap_or(TokenWidth::U16);
        let len = usize::try_from((file_len - offset) / width.bytes() as u64).map_err(|_| {
            DataError::Invalid(format!("{}: too many tokens for this host", path.display()))
        })?;
        log::debug!("opened {} ({format:?}): {len} tokens", path.display());
        Ok(Tokens {
            storage: Storage::File {
                file,
                offset,
                width,
            },
            len,
            vocab,
            name: path.display().to_string(),
            format: Some(format),
        })
    }

    /// Tokens `start..start + out.len()` (within `len`) into `out`, unchecked.
    fn read_raw(&self, start: usize, out: &mut [u32]) -> Result<(), DataError> {
        let end = start.saturating_add(out.len());
        if end > self.len {
            return Err(DataError::Invalid(format!(
                "{}: tokens {start}..{end} asked of {}",
                self.name, self.len
            )));
        }
        match &self.storage {
            Storage::Owned(v) => out
                .iter_mut()
                .zip(&v[start..end])
                .for_each(|(o, &t)| *o = u32::from(t)),
            Storage::Owned32(v) => out.copy_from_slice(&v[start..end]),
            Storage::File {
                file,
                offset,
                width,
            } => {
                // Read straight into `out` (no buffer per sequence), then from
                // little-endian: uint16 into the first half of its bytes, widened in place.
                let n = out.len();
                let at = offset + (width.bytes() * start) as u64;
                file.read_exact_at(&mut bytes_of(out)[..width.bytes() * n], at)
                    .map_err(|e| {
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
                match width {
                    TokenWidth::U16 => widen_u16_in_place(out),
                    TokenWidth::U32 => out.iter_mut().for_each(|t| *t = u32::from_le(*t)),
                }
            }
        }
        Ok(())
    }

    /// Tokens `start, start + 1, ...` into `out`, wrapping around past the last token
    /// (`start < len`), each checked against the vocabulary: one sequence of a batch.
    pub fn read_wrapping(&self, start: usize, out: &mut [u32]) -> Result<(), DataError> {
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
                token: u32::from(tokens[i]),
                vocab,
            });
        }
        Ok(Tokens {
            len: tokens.len(),
            storage: Storage::Owned(tokens),
            vocab,
            name: name.to_string(),
            format: None,
        })
    }

    /// Wide tokens held in memory (ids past 65535), checked against `vocab` now.
    pub fn from_vec_u32(name: &str, tokens: Vec<u32>, vocab: usize) -> Result<Self, DataError> {
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
            storage: Storage::Owned32(tokens),
            vocab,
            name: name.to_string(),
            format: None,
        })
    }

    /// Read the tokens of `range` (clipped to the tokens there are) in order, unchecked,
    /// in chunks of 2^18 (1 MiB as u32, whatever the file's width: a uint16 file is read
    /// 512 KiB at a time and widened while the chunk is in cache): `visit(start, chunk)`
    /// for each, until it returns false. What a whole-file pass (the vocabulary check,
    /// `data info`) reads with.
    pub fn scan(
        &self,
        range: std::ops::Range<usize>,
        mut visit: impl FnMut(usize, &[u32]) -> bool,
    ) -> Result<(), DataError> {
        const CHUNK: usize = 1 << 18;
        let range = range.start.min(self.len)..range.end.min(self.len);
        let mut chunk = vec![0u32; range.len().min(CHUNK)];
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
    ) -> Result<Option<(usize, u32)>, DataError> {
        const PROGRESS_EVERY: usize = 1 << 24;
        let vocab = self.vocab;
        let first = range.start.min(self.len);
        let mut found = None;
        let mut reported = 0;
        self.scan(range, |at, part| {
            found = (part.iter().position(|&t| t as usize >= vocab)).map(|i| (at + i, part[i]));
            let done = at + part.len() - first;
            if found.is_none() && done / PROGRESS_EVERY > reported {
                reported = done / PROGRESS_EVERY;
                progress(done);
            }
            found.is_none()
        })?;
        Ok(found)
    }

    /// A fingerprint of the tokens for telling copies apart: the CRC32 of 256 windows of
    /// 16 tokens spread evenly over the file (read unchecked, each token as the file
    /// holds it: 2 or 4 little-endian bytes), the same in every process and build; compare
    /// it with the count. Equal copies agree; a stale or other file almost surely differs,
    /// at the cost of 256 reads.
    pub fn fingerprint(&self) -> Result<u32, DataError> {
        let mut h = crc32fast::Hasher::new();
        const WINDOWS: usize = 256;
        const WIDTH: usize = 16;
        let wide = self.width() == TokenWidth::U32;
        let mut window = [0u32; WIDTH];
        for w in 0..WINDOWS {
            let start = (self.len.saturating_sub(WIDTH) as u128 * w as u128 / (WINDOWS - 1) as u128)
                as usize;
            let window = &mut window[..WIDTH.min(self.len - start)];
            self.read_raw(start, window)?;
            for &t in window.iter() {
                if wide {
                    h.update(&t.to_le_bytes());
                } else {
                    // Below 2^16: read from a uint16 file or corpus.
                    h.update(&(t as u16).to_le_bytes());
                }
            }
        }
        Ok(h.finalize())
    }

    /// The size in bytes of what the tokens are read from now: the open file's length
    /// (taken from the open handle, so a file replaced by a rename, which this run does not
    /// read, does not count), or the bytes of the tokens held in memory. Compared with the
    /// size at the start, it tells a file written again in place under a running job.
    pub fn bytes_now(&self) -> Result<u64, DataError> {
        match &self.storage {
            Storage::Owned(v) => Ok(2 * v.len() as u64),
            Storage::Owned32(v) => Ok(4 * v.len() as u64),
            Storage::File { file, .. } => file
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

    /// The file's format as found when opened (`NanoGpt`, `LlmC` or `LlmCLlama3`; never
    /// `Auto`), or `None` for tokens held in memory.
    pub fn format(&self) -> Option<TokenFormat> {
        self.format
    }

    /// The width of the tokens as stored (in the file, or in memory).
    pub fn width(&self) -> TokenWidth {
        match &self.storage {
            Storage::File { width, .. } => *width,
            Storage::Owned(_) => TokenWidth::U16,
            Storage::Owned32(_) => TokenWidth::U32,
        }
    }

    /// Token `i` (< len), checked against the vocabulary.
    pub fn get(&self, i: usize) -> Result<u32, DataError> {
        let mut one = [0u32];
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

/// A token file written as tokens come (llm.c's "gpt-2" or "llama-3" layout, or
/// nanoGPT's), under a temporary name beside `path` that becomes `path` only in
/// [`TokenWriter::finish`]: an error or a drop before that removes it, so no partial file is
/// ever left under the final name. [`TokenWriter::create`] replaces an existing file;
/// [`TokenWriter::create_new`] refuses one, and puts its file in place without replacing
/// one that another process wrote meanwhile (`zero_core::files::place_new`). The temporary
/// name is tracked while it exists (`zero_core::files::track_temporary`), so that a signal
/// handler can remove it.
pub struct TokenWriter {
    path: PathBuf,
    tmp: PathBuf,
    file: Option<BufWriter<File>>,
    /// `LlmC`, `LlmCLlama3` or `NanoGpt`.
    format: TokenFormat,
    width: TokenWidth,
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

/// Tokens converted to bytes at a time by [`TokenWriter::write`] (128 or 256 KiB of bytes).
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
    /// Start writing `path` in `format` (`LlmC`, `LlmCLlama3` or `NanoGpt`; `Auto` is an
    /// error), replacing an existing file when finished.
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
        let Some(width) = format.width() else {
            return Err(DataError::Invalid(format!(
                "{}: say which format to write (llm.c or nanoGPT), not Auto",
                path.display()
            )));
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
            format,
            width,
            overwrite,
            count: 0,
            bytes: Vec::new(),
            done: false,
            _tracked: tracked,
        };
        let magic_version = match format {
            TokenFormat::LlmC => Some((LLMC_MAGIC, LLMC_VERSION)),
            TokenFormat::LlmCLlama3 => Some((LLMC_LLAMA3_MAGIC, LLMC_LLAMA3_VERSION)),
            _ => None,
        };
        if let Some((magic, version)) = magic_version {
            // The count is filled in by finish().
            let mut header = [0u8; LLMC_HEADER_BYTES];
            header[0..4].copy_from_slice(&magic.to_le_bytes());
            header[4..8].copy_from_slice(&version.to_le_bytes());
            w.write_bytes(&header)?;
        }
        Ok(w)
    }

    fn is_llmc(&self) -> bool {
        self.format != TokenFormat::NanoGpt
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

    /// Append tokens (any format: a uint32 file widens them). An llm.c file holds at most
    /// i32::MAX tokens (its header's count). The tokens are converted 64 Ki at a time
    /// (`WRITE_CHUNK`), so writing a long slice takes no memory in proportion to it.
    pub fn write(&mut self, tokens: &[u16]) -> Result<(), DataError> {
        self.write_ids(tokens, u32::from)
    }

    /// Append wide tokens: to a uint16 format (llm.c's "gpt-2", nanoGPT) only ids below
    /// 65536, else nothing of `tokens` is written and the error names the first id past
    /// it; any id to llm.c's "llama-3" format. Otherwise as [`TokenWriter::write`].
    pub fn write_u32(&mut self, tokens: &[u32]) -> Result<(), DataError> {
        if self.width == TokenWidth::U16 {
            if let Some(i) = tokens.iter().position(|&t| t > u32::from(u16::MAX)) {
                return Err(DataError::TokenTooWide {
                    path: self.path.clone(),
                    position: self.count + i as u64,
                    token: tokens[i],
                });
            }
        }
        self.write_ids(tokens, |t| t)
    }

    fn write_ids<T: Copy>(&mut self, tokens: &[T], id: impl Fn(T) -> u32) -> Result<(), DataError> {
        let count = self.count + tokens.len() as u64;
        if self.is_llmc() && count > LLMC_MAX_TOKENS {
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
            match self.width {
                // The caller checked that every id fits.
                TokenWidth::U16 => part
                    .iter()
                    .for_each(|&t| bytes.extend_from_slice(&(id(t) as u16).to_le_bytes())),
                TokenWidth::U32 => part
                    .iter()
                    .for_each(|&t| bytes.extend_from_slice(&id(t).to_le_bytes())),
            }
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
        if self.is_llmc() {
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

/// Write tokens as an llm.c "gpt-2" `.bin` (header with magic 20240520, version 1, count;
/// then uint16), atomically (a temporary file renamed, as [`TokenWriter`]).
pub fn write_llmc(path: &Path, tokens: &[u16]) -> Result<(), DataError> {
    write_file(path, TokenFormat::LlmC, tokens)
}

/// Write tokens as an llm.c "llama-3" `.bin` (header with magic 20240801, version 7,
/// count; then uint32), atomically.
pub fn write_llmc_llama3(path: &Path, tokens: &[u32]) -> Result<(), DataError> {
    let mut w = TokenWriter::create(path, TokenFormat::LlmCLlama3)?;
    w.write_u32(tokens)?;
    w.finish().map(|_| ())
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
        let mut back = vec![0u32; t.len()];
        t.read_wrapping(0, &mut back).unwrap();
        let want: Vec<u32> = tokens.iter().map(|&x| u32::from(x)).collect();
        assert_eq!(back[..n], want[..]);
        assert_eq!(back[n..], want[..7]);
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

    /// An llm.c header of (magic, version, count) and `body` bytes after it.
    fn llmc_file(path: &Path, magic: i32, version: i32, count: i32, body: &[u8]) {
        let mut bytes = vec![0u8; LLMC_HEADER_BYTES];
        for (i, v) in [magic, version, count].into_iter().enumerate() {
            bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
        }
        bytes.extend_from_slice(body);
        std::fs::write(path, bytes).unwrap();
    }

    fn le32(tokens: &[u32]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    fn le16(tokens: &[u16]) -> Vec<u8> {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    /// Every token of `t`, checked.
    fn all(t: &Tokens) -> Vec<u32> {
        (0..t.len()).map(|i| t.get(i).unwrap()).collect()
    }

    /// llm.c's "llama-3" format (magic 20240801, version 7, uint32) as data_common.py
    /// writes it: the header, the count, ids past 65535 read back exactly, by every format
    /// that opens llm.c files; the writer's bytes are llm.c's.
    #[test]
    fn llama3_files_read_back_ids_past_65535() {
        let tmp = tempfile::tempdir().unwrap();
        let ids: Vec<u32> = vec![128_000, 0, 65_535, 65_536, 128_255, 7, 100_000];
        // By hand, as llm.c writes it.
        let hand = tmp.path().join("hand.bin");
        llmc_file(&hand, 20240801, 7, ids.len() as i32, &le32(&ids));
        // And by the writer: the same bytes.
        let written = tmp.path().join("written.bin");
        write_llmc_llama3(&written, &ids).unwrap();
        assert_eq!(
            std::fs::read(&written).unwrap(),
            std::fs::read(&hand).unwrap()
        );
        for format in [
            TokenFormat::Auto,
            TokenFormat::LlmC,
            TokenFormat::LlmCLlama3,
        ] {
            let t = Tokens::open(&hand, format, 128_256).unwrap();
            assert_eq!(t.len(), ids.len(), "{format:?}");
            assert_eq!(t.format(), Some(TokenFormat::LlmCLlama3));
            assert_eq!(t.width(), TokenWidth::U32);
            assert_eq!(all(&t), ids, "{format:?}");
            assert_eq!(t.first_out_of_vocab(0..t.len(), |_| {}).unwrap(), None);
        }
        // The vocabulary check sees the whole id: 128255 is outside V = 128255, and
        // 65536 outside V = 65536 (not read as 0).
        let t = Tokens::open(&hand, TokenFormat::Auto, 128_255).unwrap();
        assert_eq!(
            t.first_out_of_vocab(0..t.len(), |_| {}).unwrap(),
            Some((4, 128_255))
        );
        let t = Tokens::open(&hand, TokenFormat::Auto, 65_536).unwrap();
        assert_eq!(
            t.first_out_of_vocab(0..t.len(), |_| {}).unwrap(),
            Some((0, 128_000))
        );
        let e = t.get(3).unwrap_err();
        assert!(
            matches!(
                e,
                DataError::TokenOutOfVocab {
                    position: 3,
                    token: 65_536,
                    vocab: 65_536,
                    ..
                }
            ),
            "{e}"
        );
        let mut window = [0u32; 3];
        let e = t.read_wrapping(2, &mut window).unwrap_err();
        assert!(e.to_string().contains("token 65536 at position 3"), "{e}");
        // The size is the file's: header + 4 bytes a token.
        assert_eq!(
            t.bytes_now().unwrap(),
            (LLMC_HEADER_BYTES + 4 * ids.len()) as u64
        );
    }

    /// A window that wraps past the last token starts again at token 0, for both widths
    /// and in memory; a window longer than the file wraps more than once.
    #[test]
    fn read_wrapping_crosses_the_end_in_both_widths() {
        let tmp = tempfile::tempdir().unwrap();
        let narrow: Vec<u16> = (0..1000u16).map(|i| i * 7).collect();
        let wide: Vec<u32> = (0..1000u32).map(|i| 70_000 + i * 7).collect();
        let (p16, p32) = (tmp.path().join("16.bin"), tmp.path().join("32.bin"));
        write_llmc(&p16, &narrow).unwrap();
        write_llmc_llama3(&p32, &wide).unwrap();
        let n16 = tmp.path().join("nano.bin");
        write_nanogpt(&n16, &narrow).unwrap();
        let sources: Vec<(Tokens, Vec<u32>)> = vec![
            (
                Tokens::open(&p16, TokenFormat::Auto, 1 << 20).unwrap(),
                narrow.iter().map(|&x| u32::from(x)).collect(),
            ),
            (
                Tokens::open(&n16, TokenFormat::Auto, 1 << 20).unwrap(),
                narrow.iter().map(|&x| u32::from(x)).collect(),
            ),
            (
                Tokens::open(&p32, TokenFormat::Auto, 1 << 20).unwrap(),
                wide.clone(),
            ),
            (
                Tokens::from_vec("mem16", narrow.clone(), 1 << 20).unwrap(),
                narrow.iter().map(|&x| u32::from(x)).collect(),
            ),
            (
                Tokens::from_vec_u32("mem32", wide.clone(), 1 << 20).unwrap(),
                wide.clone(),
            ),
        ];
        for (t, want) in &sources {
            for (start, len) in [(998, 4), (0, 1000), (999, 1), (500, 2500), (3, 0)] {
                let mut out = vec![u32::MAX; len];
                t.read_wrapping(start, &mut out).unwrap();
                let expect: Vec<u32> = (0..len).map(|i| want[(start + i) % 1000]).collect();
                assert_eq!(out, expect, "{} from {start}, {len}", t.name());
            }
            let mut out = [0u32; 2];
            assert!(t.read_wrapping(1000, &mut out).is_err(), "{}", t.name());
        }
        // The fingerprint of a uint16 file is that of its 2-byte tokens (as before uint32
        // files were read): the same as the same tokens in memory.
        assert_eq!(
            sources[0].0.fingerprint().unwrap(),
            sources[3].0.fingerprint().unwrap()
        );
        assert_eq!(
            sources[2].0.fingerprint().unwrap(),
            sources[4].0.fingerprint().unwrap()
        );
        assert_ne!(
            sources[0].0.fingerprint().unwrap(),
            sources[2].0.fingerprint().unwrap()
        );
    }

    /// Widening uint16s in place gives their values for every length (the blocks and the
    /// last odd token), and `scan` hands out the same across its chunks for both widths.
    #[test]
    fn uint16_tokens_widen_in_place_and_scan_in_chunks() {
        for n in [0usize, 1, 2, 3, 5, 8, 4095, 4096, 4097, 8193, 100_003] {
            let want: Vec<u16> = (0..n)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761) as u16)
                .collect();
            let mut out = vec![0u32; n];
            // The little-endian uint16s in the first 2n bytes, as a read leaves them.
            bytes_of(&mut out)[..2 * n].copy_from_slice(&le16(&want));
            widen_u16_in_place(&mut out);
            let want32: Vec<u32> = want.iter().map(|&x| u32::from(x)).collect();
            assert_eq!(out, want32, "n = {n}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let n = (1 << 18) * 2 + 77;
        let narrow: Vec<u16> = (0..n).map(|i| (i * 31 % 65_521) as u16).collect();
        let wide: Vec<u32> = (0..n).map(|i| (i * 31 % 1_000_003) as u32).collect();
        let (p16, p32) = (tmp.path().join("16.bin"), tmp.path().join("32.bin"));
        write_nanogpt(&p16, &narrow).unwrap();
        write_llmc_llama3(&p32, &wide).unwrap();
        for (path, want) in [
            (
                &p16,
                narrow.iter().map(|&x| u32::from(x)).collect::<Vec<_>>(),
            ),
            (&p32, wide),
        ] {
            let t = Tokens::open(path, TokenFormat::Auto, usize::MAX).unwrap();
            let mut got = Vec::new();
            let mut starts = Vec::new();
            t.scan(5..t.len() + 9, |at, chunk| {
                starts.push(at);
                got.extend_from_slice(chunk);
                true
            })
            .unwrap();
            assert_eq!(starts, [5, 5 + (1 << 18), 5 + (2 << 18)], "{path:?}");
            assert_eq!(got[..], want[5..], "{path:?}");
        }
    }

    /// Header checks for both llm.c formats: a magic or version of neither is refused
    /// naming both accepted formats; a count the body does not match is truncated or
    /// mismatched, in the file's own token width.
    #[test]
    fn llmc_headers_are_checked_for_both_widths() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("h.bin");
        let both = |e: &DataError| {
            let m = e.to_string();
            assert!(
                m.contains("20240520 with version 1")
                    && m.contains("uint16")
                    && m.contains("20240801 with version 7")
                    && m.contains("uint32"),
                "{m}"
            );
        };
        // A magic of neither format (header shaped like llm.c's: Auto detects it).
        llmc_file(&p, 1234, 7, 2, &le32(&[1, 2]));
        let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
        assert!(
            matches!(
                e,
                DataError::WrongMagic {
                    found: 1234,
                    version: 7,
                    ..
                }
            ),
            "{e}"
        );
        both(&e);
        // The llama-3 version with the gpt-2 magic, and the other way round: wrong magic.
        llmc_file(&p, LLMC_MAGIC, 7, 2, &le32(&[1, 2]));
        let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
        assert!(
            matches!(
                e,
                DataError::WrongMagic {
                    found: LLMC_MAGIC,
                    ..
                }
            ),
            "{e}"
        );
        llmc_file(&p, LLMC_LLAMA3_MAGIC, 1, 2, &le16(&[1, 2]));
        let e = Tokens::open(&p, TokenFormat::LlmC, 10).err().unwrap();
        assert!(
            matches!(
                e,
                DataError::WrongMagic {
                    found: LLMC_LLAMA3_MAGIC,
                    version: 1,
                    ..
                }
            ),
            "{e}"
        );
        // Either magic with a version of neither: wrong version.
        for magic in [LLMC_MAGIC, LLMC_LLAMA3_MAGIC] {
            llmc_file(&p, magic, 2, 2, &le32(&[1, 2]));
            let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
            assert!(
                matches!(e, DataError::WrongVersion { found: 2, magic: m, .. } if m == magic),
                "{e}"
            );
            both(&e);
        }
        // Truncated and over-long bodies, counted in the format's width.
        llmc_file(&p, LLMC_LLAMA3_MAGIC, 7, 3, &le32(&[1, 2]));
        let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
        let m = e.to_string();
        assert!(
            matches!(e, DataError::Truncated { .. })
                && m.contains("header says 3 tokens (12 bytes of uint32)")
                && m.contains("holds 8 bytes"),
            "{m}"
        );
        llmc_file(&p, LLMC_LLAMA3_MAGIC, 7, 2, &le32(&[1, 2, 3]));
        let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
        assert!(
            matches!(
                e,
                DataError::LengthMismatch {
                    header: 2,
                    found: 3,
                    ..
                }
            ),
            "{e}"
        );
        // A llama-3 header over uint16 tokens: half the bytes the count needs.
        llmc_file(&p, LLMC_LLAMA3_MAGIC, 7, 4, &le16(&[1, 2, 3, 4]));
        let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
        assert!(matches!(e, DataError::Truncated { .. }), "{e}");
        // And a gpt-2 header over the same bytes as 8 uint16 tokens: 2x the count.
        llmc_file(&p, LLMC_MAGIC, 1, 4, &le32(&[1, 2, 3, 4]));
        let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
        assert!(
            matches!(
                e,
                DataError::LengthMismatch {
                    header: 4,
                    found: 8,
                    ..
                }
            ),
            "{e}"
        );
        // Counts: 0 tokens in either width; the gpt-2 format still reads uint16.
        llmc_file(&p, LLMC_LLAMA3_MAGIC, 7, 0, &[]);
        let t = Tokens::open(&p, TokenFormat::Auto, 10).unwrap();
        assert_eq!((t.len(), t.width()), (0, TokenWidth::U32));
        llmc_file(&p, LLMC_MAGIC, 1, 3, &le16(&[9, 8, 7]));
        let t = Tokens::open(&p, TokenFormat::Auto, 10).unwrap();
        assert_eq!(
            (t.len(), t.width(), t.format()),
            (3, TokenWidth::U16, Some(TokenFormat::LlmC))
        );
        assert_eq!(all(&t), [9, 8, 7]);
        // A nanoGPT file is uint16, and says so when its length is odd.
        std::fs::write(&p, [1u8, 0, 2]).unwrap();
        let e = Tokens::open(&p, TokenFormat::NanoGpt, 10).err().unwrap();
        assert!(e.to_string().contains("raw uint16"), "{e}");
    }

    /// A negative token count in an llm.c header is a corrupt header naming the value,
    /// not a count of about 2^32 (audit 35, item 6).
    #[test]
    fn a_negative_header_count_is_a_corrupt_header() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("neg.bin");
        for (magic, version, body) in [
            (LLMC_MAGIC, 1, le16(&[1, 2, 3, 4])),
            (LLMC_LLAMA3_MAGIC, 7, le32(&[1, 2, 3, 4])),
        ] {
            for count in [-1, i32::MIN] {
                llmc_file(&p, magic, version, count, &body);
                let e = Tokens::open(&p, TokenFormat::Auto, 10).err().unwrap();
                let m = e.to_string();
                assert!(
                    matches!(e, DataError::CorruptHeader { .. })
                        && m.contains(&format!("token count (int32 [2]) is {count}, negative")),
                    "{m}"
                );
                assert!(!m.contains("4294967295"), "{m}");
            }
        }
    }

    /// Wide ids go only to the uint32 format: a uint16 writer refuses an id past 65535
    /// (naming it and its position) and writes nothing of that call; u16 ids go to either.
    #[test]
    fn writers_take_u32_ids_where_they_fit() {
        let tmp = tempfile::tempdir().unwrap();
        for format in [TokenFormat::LlmC, TokenFormat::NanoGpt] {
            let p = tmp.path().join(format!("{format:?}.bin"));
            let mut w = TokenWriter::create(&p, format).unwrap();
            w.write_u32(&[1, 65_535]).unwrap();
            let e = w.write_u32(&[2, 65_536]).unwrap_err();
            assert!(
                matches!(
                    e,
                    DataError::TokenTooWide {
                        position: 3,
                        token: 65_536,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("llama-3"), "{e}");
            w.write(&[3]).unwrap();
            assert_eq!(w.finish().unwrap(), 3);
            let t = Tokens::open(&p, TokenFormat::Auto, 1 << 17).unwrap();
            assert_eq!(all(&t), [1, 65_535, 3], "{format:?}");
        }
        let p = tmp.path().join("wide.bin");
        let mut w = TokenWriter::create_new(&p, TokenFormat::LlmCLlama3).unwrap();
        w.write(&[5, 6]).unwrap();
        w.write_u32(&[u32::MAX, 70_000]).unwrap();
        assert_eq!(w.finish().unwrap(), 4);
        let t = Tokens::open(&p, TokenFormat::Auto, usize::MAX).unwrap();
        assert_eq!(all(&t), [5, 6, u32::MAX, 70_000]);
        assert_eq!(
            std::fs::metadata(&p).unwrap().len(),
            (LLMC_HEADER_BYTES + 16) as u64
        );
        assert!(TokenWriter::create(&p, TokenFormat::Auto).is_err());
    }
}
