//! Text to tokens, for `zero-bench data tokenize` (zero-bench/src/data.rs).
//!
//! - [`Tokenizer::Byte`]: each byte of UTF-8 text is one token (V = 256), so any text file
//!   becomes a corpus with no vocabulary file.
//! - [`Tokenizer::Gpt2`]: GPT-2's byte-level BPE (V = 50257), the ids GPT-2 checkpoints and
//!   llm.c's GPT-2 data files use ([`gpt2`]).
//! - [`encode_stream`]: a file of any size, read and encoded chunk by chunk (in parallel,
//!   order kept), with the same tokens as encoding the whole text at once ([`stream`]).
//!
//! Input must be valid UTF-8: a binary file given by mistake is an error naming the byte
//! offset, not a corpus.

mod gpt2;
mod stream;

pub use gpt2::{Gpt2, GPT2_EOT, GPT2_VOCAB};
pub use stream::{
    encode_stream, last_safe_split, StreamOptions, StreamStats, MAX_THREADS as TOKENIZE_MAX_THREADS,
};

use super::DataError;
use std::path::Path;

/// Vocabulary of byte-level tokens.
pub const BYTE_VOCAB: usize = 256;

/// Tokens of UTF-8 text: its bytes. `path` names the source in errors.
pub fn tokenize_utf8(path: &Path, text: &[u8]) -> Result<Vec<u16>, DataError> {
    std::str::from_utf8(text).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        at: e.valid_up_to() as u64,
    })?;
    Ok(text.iter().map(|&b| b as u16).collect())
}

/// A tokenizer of UTF-8 text into u16 ids.
pub enum Tokenizer {
    /// One token per byte (V = 256).
    Byte,
    /// GPT-2's BPE (V = 50257); boxed, it holds the ranks' tables.
    Gpt2(Box<Gpt2>),
}

impl Tokenizer {
    /// GPT-2's BPE; with `allow_special`, the text `<|endoftext|>` is the token 50256.
    pub fn gpt2(allow_special: bool) -> Result<Self, DataError> {
        Ok(Tokenizer::Gpt2(Box::new(Gpt2::new(allow_special)?)))
    }

    /// Vocabulary size V: every id is below it.
    pub fn vocab(&self) -> usize {
        match self {
            Tokenizer::Byte => BYTE_VOCAB,
            Tokenizer::Gpt2(_) => GPT2_VOCAB,
        }
    }

    /// Short name for messages ("byte", "gpt2").
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Byte => "byte",
            Tokenizer::Gpt2(_) => "gpt2",
        }
    }

    /// Tokens written before the text of a file: GPT-2's `<|endoftext|>`, as llm.c's GPT-2
    /// data files start each document with it; nothing for bytes.
    pub fn file_prefix(&self) -> &'static [u16] {
        match self {
            Tokenizer::Byte => &[],
            Tokenizer::Gpt2(_) => &[GPT2_EOT],
        }
    }

    /// An independent copy: the same encoding, sharing no state with `self`. GPT-2's
    /// pre-tokenizer regex keeps match caches that clones share and that are fast only for
    /// the first thread using them, so each worker thread encodes with its own copy.
    pub fn fork(&self) -> Result<Tokenizer, DataError> {
        Ok(match self {
            Tokenizer::Byte => Tokenizer::Byte,
            Tokenizer::Gpt2(g) => Tokenizer::gpt2(g.allow_special())?,
        })
    }

    /// Append the tokens of `text` to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u16>) {
        match self {
            Tokenizer::Byte => out.extend(text.bytes().map(u16::from)),
            Tokenizer::Gpt2(g) => g.encode_into(text, out),
        }
    }

    /// The tokens of `text`.
    pub fn encode(&self, text: &str) -> Vec<u16> {
        let mut out = Vec::new();
        self.encode_into(text, &mut out);
        out
    }

    /// The text of `tokens`; an id outside the vocabulary or bytes that are not UTF-8
    /// (a sequence cut inside a character) are an error.
    pub fn decode(&self, tokens: &[u16]) -> Result<String, DataError> {
        let bytes = match self {
            Tokenizer::Byte => match tokens.iter().find(|&&t| t as usize >= BYTE_VOCAB) {
                Some(&t) => {
                    return Err(DataError::Invalid(format!(
                        "token {t} is not a byte (V = {BYTE_VOCAB})"
                    )))
                }
                None => tokens.iter().map(|&t| t as u8).collect(),
            },
            Tokenizer::Gpt2(g) => g.decode_bytes(tokens)?,
        };
        String::from_utf8(bytes).map_err(|e| {
            DataError::Invalid(format!(
                "the decoded tokens are not UTF-8 at byte {}",
                e.utf8_error().valid_up_to()
            ))
        })
    }
}
