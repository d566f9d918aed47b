//! Token data: files users already have (nanoGPT's `.bin`, uint16; llm.c's, uint16 in its
//! "gpt-2" format or uint32 in its "llama-3" one; read as needed, as u32 ids),
//! the one deterministic batch order ([`Sequential`]), a built-in synthetic corpus with
//! a known entropy floor ([`MarkovSource`]), and tokenisation of text (bytes or GPT-2's
//! BPE, streamed: [`Tokenizer`], [`encode_stream`], [`TokenWriter`]).

mod file;
mod markov;
mod order;
mod tokenize;

pub use file::{
    write_llmc, write_llmc_llama3, write_nanogpt, TokenFormat, TokenWidth, TokenWriter, Tokens,
    LLMC_LLAMA3_MAGIC, LLMC_LLAMA3_VERSION, LLMC_MAGIC, LLMC_VERSION,
};
pub use markov::{MarkovSource, Sampler, DEFAULT_CORPUS_SEED};
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
    /// not start with a token-file magic number, or with the magic of one format and the
    /// version of the other.
    #[error("{path}: not an llm.c token file: its header magic is {found} (version {version}); llm.c token files have magic {LLMC_MAGIC} with version {LLMC_VERSION} (its \"gpt-2\" format, uint16 tokens) or magic {LLMC_LLAMA3_MAGIC} with version {LLMC_LLAMA3_VERSION} (\"llama-3\", uint32 tokens); re-export the tokens with llm.c's data scripts or `zero-bench data tokenize`")]
    WrongMagic {
        /// The file.
        path: PathBuf,
        /// The first int32 found.
        found: i32,
        /// The second int32 (the version) found.
        version: i32,
    },
    /// An llm.c file with a known magic and a version of neither format.
    #[error("{path}: llm.c token file (magic {magic}) of version {found}; the formats read are magic {LLMC_MAGIC} with version {LLMC_VERSION} (\"gpt-2\", uint16 tokens) and magic {LLMC_LLAMA3_MAGIC} with version {LLMC_LLAMA3_VERSION} (\"llama-3\", uint32 tokens)")]
    WrongVersion {
        /// The file.
        path: PathBuf,
        /// The magic found.
        magic: i32,
        /// The version found.
        found: i32,
    },
    /// An llm.c header that no writer of the format writes (a negative token count).
    #[error("{path}: corrupt llm.c header: {detail}")]
    CorruptHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the value found.
        detail: String,
    },
    /// An id written to a uint16 token file (nanoGPT's, llm.c's "gpt-2") that needs more
    /// than 16 bits.
    #[error("{path}: token {token} at position {position} does not fit this file's uint16 tokens; write llm.c's \"llama-3\" format (uint32 tokens) for ids past 65535")]
    TokenTooWide {
        /// The file being written.
        path: PathBuf,
        /// Index of the token in the file.
        position: u64,
        /// Its value.
        token: u32,
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
        token: u32,
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
    /// GPT-2 text with no place to end a chunk (a whitespace run after other text) in
    /// the largest chunk.
    #[error("{path}: no whitespace after other text in the {cap} bytes from byte {at}: GPT-2's chunks end only where a whitespace run starts (where its pre-tokenizer splits anyway), and a chunk holds at most {cap} bytes; break the text into lines, or tokenize it with byte tokens (`--tokenizer byte`), which end chunks anywhere")]
    NoSplit {
        /// The file.
        path: PathBuf,
        /// Byte offset in the file of the chunk's start.
        at: u64,
        /// The largest chunk, in bytes.
        cap: usize,
    },
    /// Invalid parameters of an order or a corpus.
    #[error("{0}")]
    Invalid(String),
}
