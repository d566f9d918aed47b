//! Encoding a file of any size chunk by chunk, with exactly the tokens of encoding the
//! whole text at once.
//!
//! Chunks end where a whitespace run starts: at a byte offset `p` where the character
//! before is not whitespace and the character at `p` is ([`last_safe_split`]). For bytes
//! any offset would do. For GPT-2 this is where its pre-tokenizer (the regex in
//! tiktoken-rs's r50k_base, `'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|
//! \s++$|\s+(?!\S)|\s`) ends a piece in the whole text, and the pieces on either side are
//! the ones each chunk alone gives; BPE then runs on each piece alone, so the tokens agree:
//!
//! - `p` is a piece boundary: a piece holds whitespace only as an optional leading ' ' or
//!   as a whole whitespace run, so the piece holding the non-whitespace character at p-1
//!   cannot reach over p.
//! - Left chunk: every piece before p is decided by characters before p and by whether
//!   text\[p\] is whitespace. Letter, digit and symbol runs stop at whitespace as they stop at
//!   the end of the input; the lookahead `(?!\S)` and `$` only follow whitespace runs, and
//!   every whitespace run of the left chunk is followed by a non-whitespace character inside
//!   it (the chunk ends with one).
//! - Right chunk: the pattern has no look-behind and no `^`, and `$` is the end of the whole
//!   text in both, so matching from p alone finds what matching on from p in the whole text
//!   finds.
//!
//! `\s` is Unicode White_Space, the set [`char::is_whitespace`] tests. With special tokens
//! allowed, `<|endoftext|>` holds no whitespace, so no split falls inside it, and the text
//! around it is encoded in pieces that end there in both cases.
//!
//! A chunk with no such offset (no whitespace, or only whitespace) is read further until
//! one appears or the file ends. Chunks are encoded `threads` at a time and written in file
//! order.

use super::super::DataError;
use super::Tokenizer;
use std::io::Read;
use std::path::Path;

/// How [`encode_stream`] reads and encodes.
#[derive(Clone, Copy, Debug)]
pub struct StreamOptions {
    /// Bytes read per chunk (a chunk ends at the last safe split before this, or later if
    /// there is none); at least 1.
    pub chunk_bytes: usize,
    /// Chunks encoded in parallel; at least 1.
    pub threads: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            chunk_bytes: 4 << 20,
            threads: 1,
        }
    }
}

/// What [`encode_stream`] read and produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Bytes of text read.
    pub bytes: u64,
    /// Tokens produced, the file prefix included.
    pub tokens: u64,
}

/// The last byte offset in `text` where a chunk may end: the character before it is not
/// whitespace and the one at it is (see the file head for why GPT-2's pre-tokenizer splits
/// there). `None` if there is none (offset 0 never counts).
pub fn last_safe_split(text: &str) -> Option<usize> {
    let mut after_is_ws = false;
    for (i, c) in text.char_indices().rev() {
        let ws = c.is_whitespace();
        if !ws && after_is_ws {
            return Some(i + c.len_utf8());
        }
        after_is_ws = ws;
    }
    None
}

/// Reads `input` into chunks of text that end at safe splits.
struct Chunker<'a, R> {
    input: R,
    path: &'a Path,
    chunk_bytes: usize,
    /// Read but not yet handed out.
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    offset: u64,
    eof: bool,
}

impl<R: Read> Chunker<'_, R> {
    /// Read until `buf` holds `want` bytes or the input ends.
    fn fill(&mut self, want: usize) -> Result<(), DataError> {
        while self.buf.len() < want && !self.eof {
            let old = self.buf.len();
            self.buf.resize(want, 0);
            let read = loop {
                match self.input.read(&mut self.buf[old..]) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    r => break r,
                }
            };
            let n = match read {
                Ok(n) => n,
                Err(source) => {
                    return Err(DataError::Io {
                        path: self.path.to_path_buf(),
                        source,
                    })
                }
            };
            self.buf.truncate(old + n);
            self.eof = n == 0;
        }
        Ok(())
    }

    /// The next chunk, or `None` at the end of the input.
    fn next_chunk(&mut self) -> Result<Option<String>, DataError> {
        let mut want = self.chunk_bytes;
        loop {
            self.fill(want)?;
            // A character cut by the end of the buffer is completed by the next read; any
            // other invalid byte (or a cut one at the end of the file) is an error.
            let valid = match std::str::from_utf8(&self.buf) {
                Ok(_) => self.buf.len(),
                Err(e) if e.error_len().is_none() && !self.eof => e.valid_up_to(),
                Err(e) => {
                    return Err(DataError::NotUtf8 {
                        path: self.path.to_path_buf(),
                        at: self.offset + e.valid_up_to() as u64,
                    })
                }
            };
            let end = if self.eof {
                Some(valid)
            } else {
                std::str::from_utf8(&self.buf[..valid])
                    .ok()
                    .and_then(last_safe_split)
            };
            match end {
                Some(0) => return Ok(None),
                Some(p) => {
                    let rest = self.buf.split_off(p);
                    let chunk = std::mem::replace(&mut self.buf, rest);
                    self.offset += p as u64;
                    // Validated above: from_utf8 cannot fail here.
                    let text = String::from_utf8(chunk).map_err(|e| DataError::NotUtf8 {
                        path: self.path.to_path_buf(),
                        at: self.offset + e.utf8_error().valid_up_to() as u64,
                    })?;
                    return Ok(Some(text));
                }
                // No safe split yet: read on (doubling, so a long run costs linear time).
                None => want = (2 * self.buf.len()).max(want),
            }
        }
    }
}

/// Encode the UTF-8 text of `input` (named `path` in errors) with `tok`, handing the
/// tokens to `sink` in order: first [`Tokenizer::file_prefix`], then the text's. The
/// tokens are those of `tok.encode(whole text)` for any chunk size (see the file head).
/// `progress` is called with the bytes read so far after each group of chunks. Text that
/// is not UTF-8 is [`DataError::NotUtf8`] with its byte offset in the input (tokens of the
/// text before it may have reached `sink`).
pub fn encode_stream<R: Read>(
    tok: &Tokenizer,
    input: R,
    path: &Path,
    opts: StreamOptions,
    mut sink: impl FnMut(&[u16]) -> Result<(), DataError>,
    mut progress: impl FnMut(u64),
) -> Result<StreamStats, DataError> {
    if opts.chunk_bytes == 0 || opts.threads == 0 {
        return Err(DataError::Invalid(format!(
            "chunk_bytes ({}) and threads ({}) must be at least 1",
            opts.chunk_bytes, opts.threads
        )));
    }
    let mut chunker = Chunker {
        input,
        path,
        chunk_bytes: opts.chunk_bytes,
        buf: Vec::new(),
        offset: 0,
        eof: false,
    };
    let prefix = tok.file_prefix();
    sink(prefix)?;
    let mut stats = StreamStats {
        bytes: 0,
        tokens: prefix.len() as u64,
    };
    let mut outs: Vec<Vec<u16>> = vec![Vec::new(); opts.threads];
    loop {
        let mut chunks = Vec::with_capacity(opts.threads);
        while chunks.len() < opts.threads {
            match chunker.next_chunk()? {
                Some(c) => chunks.push(c),
                None => break,
            }
        }
        if chunks.is_empty() {
            return Ok(stats);
        }
        for out in outs.iter_mut() {
            out.clear();
        }
        if chunks.len() == 1 {
            tok.encode_into(&chunks[0], &mut outs[0]);
        } else {
            std::thread::scope(|s| {
                for (chunk, out) in chunks.iter().zip(outs.iter_mut()) {
                    s.spawn(move || tok.encode_into(chunk, out));
                }
            });
        }
        for out in &outs[..chunks.len()] {
            sink(out)?;
            stats.tokens += out.len() as u64;
        }
        stats.bytes = chunker.offset;
        progress(stats.bytes);
    }
}
