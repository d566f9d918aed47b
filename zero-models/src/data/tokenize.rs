//! Byte-level tokenisation: each byte of UTF-8 text is one token (V = 256), so any text
//! file becomes a corpus with no vocabulary file. Input must be valid UTF-8 (a binary
//! file given by mistake is an error, not a corpus).

use super::DataError;
use std::path::Path;

/// Vocabulary of byte-level tokens.
pub const BYTE_VOCAB: usize = 256;

/// Tokens of UTF-8 text: its bytes. `path` names the source in errors.
pub fn tokenize_utf8(path: &Path, text: &[u8]) -> Result<Vec<u16>, DataError> {
    std::str::from_utf8(text).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        at: e.valid_up_to(),
    })?;
    Ok(text.iter().map(|&b| b as u16).collect())
}
