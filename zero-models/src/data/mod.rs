//! Token data: files users already have (nanoGPT's and llm.c's `.bin`, read as needed),
//! the one deterministic batch order ([`Sequential`]), a built-in synthetic corpus with
//! a known entropy floor ([`MarkovSource`]), and tokenisation of text (bytes or GPT-2's
//! BPE, streamed: [`Tokenizer`], [`encode_stream`], [`TokenWriter`]).

mod file;
mod markov;
mod order;
mod tokenize;

pub use file::{
    write_llmc, write_nanogpt, TokenFormat, TokenWriter, Tokens, LLMC_MAGIC, LLMC_VERSION,
};
pub use markov::MarkovSource;
pub use order::{Origin, Sequential};
pub use tokenize::{
    encode_stream, last_safe_split, tokenize_utf8, Gpt2, StreamOptions, StreamStats, Tokenizer,
    BYTE_VOCAB, GPT2_EOT, GPT2_VOCAB, TOKENIZE_MAX_THREADS,
};

use std::path::PathBuf;

/// Errors reading or writing token data; each names the file and the numbers involved.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An I/O error on a file (the cause is the error's source).
    #[error("I/O error on {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// An llm.c file (or a file with a header shaped like llm.c's) whose header does
    /// not start with the token-file magic number.
    #[error("{path}: not an llm.c token file: its header magic is {found}, llm.c token files have {LLMC_MAGIC} (version {LLMC_VERSION}, uint16 tokens); re-export the tokens with llm.c's data scripts or `zero-bench data tokenize`")]
    WrongMagic {
        /// The file.
        path: PathBuf,
        /// The first int32 found.
        found: i32,
    },
    /// An llm.c file of an unsupported version.
    #[error("{path}: llm.c token file version {found}, only version {LLMC_VERSION} (uint16 tokens) is supported")]
    WrongVersion {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: i32,
    },
    /// A file shorter than its header or its token size says.
    #[error("{path}: truncated: {detail}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// What was expected and what was found.
        detail: String,
    },
    /// An llm.c file with more token bytes than its header announces.
    #[error("{path}: header says {header} tokens but the file holds {found}")]
    LengthMismatch {
        /// The file.
        path: PathBuf,
        /// Tokens announced by the header.
        header: u64,
        /// Tokens present.
        found: u64,
    },
    /// A token id outside the model's vocabulary.
    #[error("{source_name}: token {token} at position {position} is outside the vocabulary (V = {vocab})")]
    TokenOutOfVocab {
        /// The file or corpus.
        source_name: String,
        /// Index of the token.
        position: u64,
        /// Its value.
        token: u16,
        /// The vocabulary size.
        vocab: usize,
    },
    /// Too few tokens for one sequence.
    #[error("{source_name}: {len} tokens, need at least seq_len + 1 = {need}")]
    TooShort {
        /// The file or corpus.
        source_name: String,
        /// Tokens present.
        len: usize,
        /// Tokens needed.
        need: usize,
    },
    /// Input text that is not UTF-8.
    #[error("{path}: not valid UTF-8 at byte {at}")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Byte offset in the file of the first invalid sequence.
        at: u64,
    },
    /// Invalid parameters of an order or a corpus.
    #[error("{0}")]
    Invalid(String),
}
