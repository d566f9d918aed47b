//! `zero-bench data ...`: make and inspect token files.
//!
//! - `data tokenize IN.txt OUT.bin`: UTF-8 text to byte tokens (V = 256), llm.c format
//!   (or nanoGPT's with `--format nanogpt`).
//! - `data corpus OUT.bin`: write the built-in synthetic corpus and print its entropy
//!   floor (the loss no model can beat on it).
//! - `data info FILE.bin`: format, token count, largest token.

use anyhow::Context;
use std::path::{Path, PathBuf};
use zero_models::data::{
    tokenize_utf8, write_llmc, write_nanogpt, MarkovSource, TokenFormat, Tokens, BYTE_VOCAB,
};

/// Output format of written token files.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OutFormat {
    /// llm.c: 256 x int32 header (magic 20240520, version 1, count), then uint16.
    Llmc,
    /// nanoGPT: raw little-endian uint16.
    Nanogpt,
}

/// The data tools.
#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Tokenise a UTF-8 text file into byte tokens (V = 256).
    Tokenize {
        /// Input text file (UTF-8).
        input: PathBuf,
        /// Output token file.
        output: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "llmc")]
        format: OutFormat,
    },
    /// Write the built-in Markov corpus (V = 64 symbols, order 2) and print its entropy floor.
    Corpus {
        /// Output token file.
        output: PathBuf,
        /// Tokens to generate.
        #[arg(long, default_value_t = 1 << 20)]
        tokens: usize,
        /// Output format.
        #[arg(long, value_enum, default_value = "llmc")]
        format: OutFormat,
    },
    /// Describe a token file (format detected from the llm.c magic).
    Info {
        /// The token file.
        file: PathBuf,
    },
}

fn write(path: &Path, tokens: &[u16], format: OutFormat) -> anyhow::Result<()> {
    match format {
        OutFormat::Llmc => write_llmc(path, tokens),
        OutFormat::Nanogpt => write_nanogpt(path, tokens),
    }
    .with_context(|| format!("writing {}", path.display()))
}

/// Run a data tool.
pub fn run(cmd: DataCommand) -> anyhow::Result<()> {
    crate::logging::init(None);
    match cmd {
        DataCommand::Tokenize {
            input,
            output,
            format,
        } => {
            let text =
                std::fs::read(&input).with_context(|| format!("reading {}", input.display()))?;
            let tokens = tokenize_utf8(&input, &text).context("tokenising")?;
            write(&output, &tokens, format)?;
            println!(
                "{} tokens (bytes, V={BYTE_VOCAB}) written to {} ({format:?})",
                tokens.len(),
                output.display()
            );
        }
        DataCommand::Corpus {
            output,
            tokens,
            format,
        } => {
            let src = MarkovSource::default_source();
            let corpus = MarkovSource::default_corpus(tokens, src.vocab()).context("generating")?;
            let toks: Vec<u16> = (0..corpus.len())
                .map(|i| corpus.get(i))
                .collect::<Result<_, _>>()
                .context("reading the corpus back")?;
            write(&output, &toks, format)?;
            println!(
                "{} tokens of the built-in corpus (V={} symbols, order {}) written to {}; \
                 entropy floor {:.4} nats/token (ln V = {:.4})",
                toks.len(),
                src.vocab(),
                src.order(),
                output.display(),
                src.entropy_rate(),
                (src.vocab() as f64).ln()
            );
        }
        DataCommand::Info { file } => {
            let t = Tokens::open(&file, TokenFormat::Auto, 65536)
                .with_context(|| format!("opening {}", file.display()))?;
            let mut max = 0u16;
            for i in 0..t.len() {
                max = max.max(t.get(i)?);
            }
            let bytes = std::fs::metadata(&file)
                .with_context(|| format!("reading the size of {}", file.display()))?
                .len();
            let format = if bytes == 2 * t.len() as u64 {
                "nanoGPT (raw uint16)"
            } else {
                "llm.c (header + uint16)"
            };
            println!(
                "{}: {format}, {} tokens, largest token {max} (needs V >= {})",
                file.display(),
                t.len(),
                max as usize + 1
            );
        }
    }
    Ok(())
}
