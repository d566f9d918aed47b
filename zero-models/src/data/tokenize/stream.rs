//! Encoding a file of any size chunk by chunk, with exactly the tokens of encoding the
//! whole text at once.
//!
//! Byte tokens are the bytes of the text wherever it is cut, so their chunks end at the
//! last character boundary within `chunk_bytes` (a character is never cut, so that each
//! chunk is UTF-8 checked alone). GPT-2's chunks end where a whitespace run starts: at a
//! byte offset `p` where the character before is not whitespace and the character at `p`
//! is ([`last_safe_split`]). This is where its pre-tokenizer, the regex of
//! tiktoken-rs's r50k_base (equivalent to GPT-2's original one),
//!
//! ```text
//! '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s
//! ```
//!
//! ends a piece in the whole text, and the pieces on either side are the ones each chunk
//! alone gives; BPE then runs on each piece alone, so the tokens agree:
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
//! A GPT-2 chunk with no such offset (no whitespace, or only whitespace) is read further,
//! doubling, until one appears or the file ends, up to [`MAX_CHUNK_BYTES`] (1 GiB): text
//! with no such offset in 1 GiB is an error ([`DataError::NoSplit`]) rather than a chunk
//! as large as the file (a minified JSON or a DNA file of many GB would need several times
//! its size in memory, and GPT-2's BPE of a single piece that long would not end in any
//! useful time anyway). With several threads, this thread reads chunks and writes tokens
//! in file order while the workers encode up to 2 x threads chunks ahead.

use super::super::DataError;
use super::Tokenizer;
use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{mpsc, Mutex};

/// How [`encode_stream`] reads and encodes.
#[derive(Clone, Copy, Debug)]
pub struct StreamOptions {
    /// Bytes read per chunk, 1 to 2^30 (1 GiB). A chunk of byte tokens ends at the last
    /// character boundary within it (so it is never larger); a GPT-2 chunk at the last safe
    /// split ([`last_safe_split`]) within it, or, where there is none, at the first one
    /// after, read doubling up to `MAX_CHUNK_BYTES` (1 GiB): none in that much text is
    /// [`DataError::NoSplit`].
    pub chunk_bytes: usize,
    /// Chunks encoded in parallel; 1 to 1024.
    pub threads: usize,
}

/// The largest chunk (1 GiB), given or grown to (GPT-2 text without whitespace): up to
/// three chunks per thread are held at once.
pub const MAX_CHUNK_BYTES: usize = 1 << 30;

/// The most encoding threads (more than any node's cores).
pub const MAX_THREADS: usize = 1024;

impl StreamOptions {
    /// An error naming the value out of range, if one is ([`encode_stream`] checks; a
    /// caller that creates its output first can check before).
    pub fn check(&self) -> Result<(), DataError> {
        if !(1..=MAX_CHUNK_BYTES).contains(&self.chunk_bytes) {
            return Err(DataError::Invalid(format!(
                "chunk size {} bytes: give 1 to {MAX_CHUNK_BYTES} (1 GiB; the default is 4 MiB)",
                self.chunk_bytes
            )));
        }
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(DataError::Invalid(format!(
                "{} threads: give 1 to {MAX_THREADS} (one per core is enough)",
                self.threads
            )));
        }
        Ok(())
    }
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
    /// Whether a chunk may end at any character boundary (byte tokens), else only at a
    /// safe split (GPT-2).
    any_boundary: bool,
    /// The most bytes a chunk grows to when it has no safe split ([`MAX_CHUNK_BYTES`]).
    max_chunk: usize,
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
            } else if self.any_boundary {
                // Empty only when `want` < 4 bytes cut the first character.
                (valid > 0).then_some(valid)
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
                // Byte tokens: `want` < 4 bytes cut the first character; one more byte
                // at a time completes it (at most 4 bytes).
                None if self.any_boundary => want += 1,
                // GPT-2, no safe split yet: read on (doubling, so a long run costs linear
                // time), up to the largest chunk. (Not at the end of the file, so `fill`
                // filled `want`.)
                None if want >= self.max_chunk => {
                    return Err(DataError::NoSplit {
                        path: self.path.to_path_buf(),
                        at: self.offset,
                        cap: self.max_chunk,
                    })
                }
                None => want = (2 * self.buf.len()).max(want).min(self.max_chunk),
            }
        }
    }
}

/// Every remaining chunk encoded on the calling thread, in order, into `sink`.
fn encode_on_this_thread<R: Read>(
    tok: &Tokenizer,
    chunker: &mut Chunker<'_, R>,
    sink: &mut impl FnMut(&[u16]) -> Result<(), DataError>,
    progress: &mut impl FnMut(u64),
    stats: &mut StreamStats,
) -> Result<(), DataError> {
    let mut ids = Vec::new();
    while let Some(text) = chunker.next_chunk()? {
        ids.clear();
        tok.encode_into(&text, &mut ids);
        sink(&ids)?;
        stats.tokens += ids.len() as u64;
        stats.bytes = chunker.offset;
        progress(stats.bytes);
    }
    Ok(())
}

/// Encode the UTF-8 text of `input` (named `path` in errors) with `tok`, handing the
/// tokens to `sink` in order: first [`Tokenizer::file_prefix`], then the text's. The
/// tokens are those of `tok.encode(whole text)` for any chunk size and thread count (see
/// the file head). `progress` is called with the bytes of text whose tokens have reached
/// `sink`, after each chunk. Text that is not UTF-8 is [`DataError::NotUtf8`] with its byte
/// offset in the input (tokens of the text before it may have reached `sink`).
pub fn encode_stream<R: Read>(
    tok: &Tokenizer,
    input: R,
    path: &Path,
    opts: StreamOptions,
    mut sink: impl FnMut(&[u16]) -> Result<(), DataError>,
    mut progress: impl FnMut(u64),
) -> Result<StreamStats, DataError> {
    opts.check()?;
    let mut chunker = Chunker {
        input,
        path,
        chunk_bytes: opts.chunk_bytes,
        any_boundary: matches!(tok, Tokenizer::Byte),
        max_chunk: MAX_CHUNK_BYTES,
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
    if opts.threads == 1 {
        encode_on_this_thread(tok, &mut chunker, &mut sink, &mut progress, &mut stats)?;
        return Ok(stats);
    }
    // Workers live for the whole stream, each with its own tokenizer: GPT-2's regex keeps
    // match caches that are fast only for the first thread to use them (see
    // Tokenizer::fork); sharing one, or a fresh thread per chunk, was slower than one thread.
    // Worker 0 encodes with `tok` (this thread never has), the others with copies of it.
    let forks = (0..opts.threads)
        .map(|w| (w > 0).then(|| tok.fork()).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    let (job_tx, job_rx) = mpsc::sync_channel::<(u64, String)>(opts.threads);
    let job_rx = Mutex::new(job_rx);
    std::thread::scope(|s| {
        // Owned by this closure, so that any return (an error too) closes the job channel
        // and the workers end before the scope joins them.
        let job_tx = job_tx;
        let (out_tx, out_rx) = mpsc::channel::<(u64, Option<Vec<u16>>)>();
        let mut started = 0;
        for own in &forks {
            let tok = own.as_ref().unwrap_or(tok);
            let (job_rx, out_tx) = (&job_rx, out_tx.clone());
            let worker = std::thread::Builder::new().spawn_scoped(s, move || loop {
                // The lock is held only while waiting for the next job.
                let job = match job_rx.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => break,
                };
                let Ok((seq, text)) = job else { break };
                // A panic in the tokenizer (a bug) becomes an error, not a hang.
                let ids = std::panic::catch_unwind(AssertUnwindSafe(|| tok.encode(&text))).ok();
                if out_tx.send((seq, ids)).is_err() {
                    break;
                }
            });
            // A thread limit reached: fewer workers take the same queue, or, with none,
            // this thread encodes alone (as with one thread asked for).
            match worker {
                Ok(_) => started += 1,
                Err(e) if started > 0 => {
                    log::warn!("tokenizing on {started} threads: the OS refused more ({e})");
                    break;
                }
                Err(e) => {
                    log::warn!("tokenizing on one thread: the OS refused worker threads ({e})");
                    encode_on_this_thread(tok, &mut chunker, &mut sink, &mut progress, &mut stats)?;
                    return Ok(stats);
                }
            }
        }
        drop(out_tx);
        // Chunks sent and written; the file offset where each unwritten chunk ends.
        let (mut sent, mut written) = (0u64, 0u64);
        let mut ends = VecDeque::new();
        let mut done: BTreeMap<u64, Vec<u16>> = BTreeMap::new();
        let mut eof = false;
        loop {
            while !eof && sent - written < 2 * opts.threads as u64 {
                match chunker.next_chunk()? {
                    Some(text) => {
                        ends.push_back(chunker.offset);
                        if job_tx.send((sent, text)).is_err() {
                            break;
                        }
                        sent += 1;
                    }
                    None => eof = true,
                }
            }
            if written == sent {
                return Ok(stats);
            }
            let (seq, ids) = out_rx.recv().map_err(|_| {
                DataError::Invalid("the tokenizer's worker threads ended early".into())
            })?;
            let ids = ids.ok_or_else(|| {
                DataError::Invalid(format!(
                    "the tokenizer panicked on chunk {seq} of {}",
                    path.display()
                ))
            })?;
            done.insert(seq, ids);
            while let Some(ids) = done.remove(&written) {
                sink(&ids)?;
                stats.tokens += ids.len() as u64;
                stats.bytes = ends.pop_front().unwrap_or(stats.bytes);
                written += 1;
                progress(stats.bytes);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunker(
        text: &[u8],
        chunk_bytes: usize,
        any_boundary: bool,
        max_chunk: usize,
    ) -> Chunker<'static, &[u8]> {
        Chunker {
            input: text,
            path: Path::new("in.txt"),
            chunk_bytes,
            any_boundary,
            max_chunk,
            buf: Vec::new(),
            offset: 0,
            eof: false,
        }
    }

    /// Byte tokens cut anywhere between characters: text with no whitespace comes in
    /// chunks of at most `chunk_bytes` (or one character, if longer), never the whole
    /// file, and the chunks are the text (audit 35, item 2).
    #[test]
    fn byte_chunks_stay_bounded_without_whitespace() {
        let ascii = "a".repeat(10_000);
        let wide = "é日🙂x".repeat(1000);
        for text in [ascii.as_str(), wide.as_str()] {
            for chunk_bytes in [1, 2, 3, 4, 5, 7, 64, 1000] {
                let mut c = chunker(text.as_bytes(), chunk_bytes, true, MAX_CHUNK_BYTES);
                let mut back = String::new();
                while let Some(chunk) = c.next_chunk().unwrap() {
                    assert!(
                        chunk.len() <= chunk_bytes.max(4),
                        "a chunk of {} bytes with chunk_bytes {chunk_bytes}",
                        chunk.len()
                    );
                    assert!(c.buf.capacity() <= 2 * chunk_bytes.max(4));
                    back.push_str(&chunk);
                }
                assert!(back == text, "chunk_bytes {chunk_bytes}");
            }
        }
        // And the ids are those of the whole text, for any chunk size and thread count.
        let tok = Tokenizer::Byte;
        for chunk_bytes in [1, 3, 5, 64] {
            for threads in [1, 3] {
                let mut ids = Vec::new();
                let opts = StreamOptions {
                    chunk_bytes,
                    threads,
                };
                encode_stream(
                    &tok,
                    wide.as_bytes(),
                    Path::new("in.txt"),
                    opts,
                    |part| {
                        ids.extend_from_slice(part);
                        Ok(())
                    },
                    |_| {},
                )
                .unwrap();
                assert!(ids == tok.encode(&wide), "{chunk_bytes} {threads}");
            }
        }
    }

    /// GPT-2 chunks end only at a safe split: text without one grows the chunk (doubling)
    /// up to the largest chunk and then is an error naming where the chunk started and the
    /// bound, not a chunk as large as the file (audit 35, item 2).
    #[test]
    fn gpt2_chunks_without_a_split_stop_at_the_largest_chunk() {
        // A run shorter than the bound is one chunk, as before.
        let tail = format!(" b{}", "c".repeat(100));
        let text = format!("{}{tail}", "a".repeat(200));
        let mut c = chunker(text.as_bytes(), 16, false, 256);
        assert_eq!(c.next_chunk().unwrap(), Some("a".repeat(200)));
        assert_eq!(c.next_chunk().unwrap(), Some(tail));
        assert_eq!(c.next_chunk().unwrap(), None);
        // A longer one is an error at the bound, naming the chunk's offset.
        let text = format!("ab cd{}", "x".repeat(1000));
        let mut c = chunker(text.as_bytes(), 4, false, 64);
        assert_eq!(c.next_chunk().unwrap().as_deref(), Some("ab"));
        let e = c.next_chunk().unwrap_err();
        assert!(
            matches!(e, DataError::NoSplit { at: 2, cap: 64, .. }),
            "{e}"
        );
        let m = e.to_string();
        assert!(
            m.contains("in.txt") && m.contains("64 bytes from byte 2") && m.contains("byte"),
            "{m}"
        );
        assert!(c.buf.len() <= 64 + 4, "{} bytes held", c.buf.len());
        // At the end of the file any remainder is a chunk, however it ends.
        let text = "x".repeat(50);
        let mut c = chunker(text.as_bytes(), 4, false, 64);
        assert_eq!(c.next_chunk().unwrap().as_deref(), Some(text.as_str()));
    }
}
