//! GPT-2's tokenizer: byte-level BPE over 50257 ids (50000 merges + 256 bytes + the one
//! special token `<|endoftext|>` = 50256), through tiktoken-rs's `r50k_base` (the same
//! ranks and pre-tokenizer regex as GPT-2; the ranks are compiled into that crate, so
//! nothing is downloaded). Every id is below 2^16, so u16 holds it (llm.c's and nanoGPT's
//! token files).
//!
//! Special tokens: by default the literal text `<|endoftext|>` is ordinary text (7 tokens,
//! `<`, `|`, `end`, `of`, `text`, `|`, `>`), as llm.c's data scripts encode documents
//! (tiktoken's `encode_ordinary`), so a corpus that quotes the string cannot forge document
//! boundaries. [`Gpt2::new`]`(true)` turns each occurrence into the token 50256 instead.

use super::super::DataError;
use tiktoken_rs::CoreBPE;

/// GPT-2's vocabulary size V.
pub const GPT2_VOCAB: usize = 50257;
/// GPT-2's `<|endoftext|>` id, which separates documents in its training data.
pub const GPT2_EOT: u16 = 50256;

/// GPT-2's BPE encoder and decoder.
pub struct Gpt2 {
    bpe: CoreBPE,
    allow_special: bool,
}

impl Gpt2 {
    /// Build the encoder from the compiled-in ranks (about 0.1 s). With `allow_special`, the
    /// text `<|endoftext|>` becomes the token [`GPT2_EOT`]; without, it is ordinary text.
    pub fn new(allow_special: bool) -> Result<Self, DataError> {
        let bpe = tiktoken_rs::r50k_base().map_err(|e| {
            DataError::Invalid(format!("building GPT-2's tokenizer (r50k_base): {e:#}"))
        })?;
        Ok(Gpt2 { bpe, allow_special })
    }

    /// Whether `<|endoftext|>` in the text is the special token.
    pub fn allow_special(&self) -> bool {
        self.allow_special
    }

    /// Append the ids of `text` to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u16>) {
        let ids = if self.allow_special {
            self.bpe.encode_with_special_tokens(text)
        } else {
            self.bpe.encode_ordinary(text)
        };
        // Ranks are < GPT2_VOCAB (r50k_base's largest is the EOT, 50256), so u16 holds them.
        debug_assert!(ids.iter().all(|&id| (id as usize) < GPT2_VOCAB));
        out.extend(ids.into_iter().map(|id| id as u16));
    }

    /// The bytes of `ids` (a sequence cut inside a character is not UTF-8).
    pub fn decode_bytes(&self, ids: &[u16]) -> Result<Vec<u8>, DataError> {
        let ranks: Vec<u32> = ids.iter().map(|&t| u32::from(t)).collect();
        self.bpe.decode_bytes(&ranks).map_err(|e| {
            DataError::Invalid(format!(
                "token {} is not in GPT-2's vocabulary (V = {GPT2_VOCAB})",
                e.token
            ))
        })
    }
}
