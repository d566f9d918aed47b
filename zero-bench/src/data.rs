//! `zero-bench data ...`: make and inspect token files.
//!
//! - `data tokenize IN.txt OUT.bin`: UTF-8 text to byte tokens (V = 256) or, with
//!   `--tokenizer gpt2`, GPT-2's BPE ids (V = 50257, the file starting with one
//!   `<|endoftext|>`); llm.c format (or nanoGPT's with `--format nanogpt`). The text is
//!   streamed in chunks (zero-models/src/data/tokenize/stream.rs) and the output written
//!   under a temporary name, renamed when complete.
//! - `data corpus OUT.bin`: write the built-in synthetic corpus and print its entropy
//!   floor (the loss no model can beat on it).
//! - `data info FILE.bin`: format, token count, largest token.

use crate::logging::outln;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zero_models::data::{
    encode_stream, write_llmc, write_nanogpt, MarkovSource, StreamOptions, TokenFormat,
    TokenWriter, Tokenizer, Tokens, BYTE_VOCAB, GPT2_EOT, GPT2_VOCAB,
};

/// Output format of written token files.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum OutFormat {
    /// llm.c: 256 x int32 header (magic 20240520, version 1, count), then uint16.
    Llmc,
    /// nanoGPT: raw little-endian uint16.
    Nanogpt,
}

/// Which tokenizer `data tokenize` uses.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum TokenizerKind {
    /// Each byte of the UTF-8 text is a token (V = 256).
    Byte,
    /// GPT-2's byte-level BPE (V = 50257), compiled in (tiktoken-rs's r50k_base).
    Gpt2,
}

/// The data tools.
#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Tokenise a UTF-8 text file: byte tokens (V = 256) or GPT-2's BPE (V = 50257).
    ///
    /// gpt2 writes one <|endoftext|> (50256) first, as llm.c's GPT-2 data files start each
    /// document with it, then the ids of the whole text; the text "<|endoftext|>" in the
    /// file is ordinary text (7 tokens) unless --allow-special. The output appears under
    /// its name only when complete (an error leaves no file).
    Tokenize {
        /// Input text file (UTF-8).
        input: PathBuf,
        /// Output token file.
        output: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value = "llmc")]
        format: OutFormat,
        /// Tokenizer.
        #[arg(long, value_enum, default_value = "byte")]
        tokenizer: TokenizerKind,
        /// gpt2 only: encode each literal "<|endoftext|>" in the text as the token 50256
        /// (put it between documents to separate them). Without it, that text is ordinary
        /// text, so quoted text cannot forge a document boundary.
        #[arg(long)]
        allow_special: bool,
        /// Chunks encoded in parallel (file order kept). Default: the available cores.
        #[arg(long)]
        threads: Option<usize>,
        /// Bytes of text read per chunk; a chunk ends before a whitespace run, where GPT-2's
        /// pre-tokenizer splits anyway, so the tokens are those of the whole text.
        #[arg(long, default_value_t = 4 << 20)]
        chunk_bytes: usize,
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

/// `data tokenize`: stream `input` through `tok` into `output`, with a progress bar on a
/// terminal (a log line every 5 s otherwise) and a final line with the throughput.
fn tokenize(
    input: &Path,
    output: &Path,
    format: OutFormat,
    tok: &Tokenizer,
    threads: usize,
    chunk_bytes: usize,
) -> anyhow::Result<()> {
    let options = StreamOptions {
        chunk_bytes,
        threads,
    };
    options
        .check()
        .context("checking --chunk-bytes and --threads")?;
    let file = std::fs::File::open(input)
        .with_context(|| format!("cannot read the input {}", input.display()))?;
    if let (Ok(a), Ok(b)) = (file.metadata(), std::fs::metadata(output)) {
        use std::os::unix::fs::MetadataExt;
        anyhow::ensure!(
            (a.dev(), a.ino()) != (b.dev(), b.ino()),
            "the output {} is the input {}: tokenizing would overwrite the text; give another output path",
            output.display(),
            input.display()
        );
    }
    let size = file
        .metadata()
        .with_context(|| format!("reading the size of {}", input.display()))?
        .len();
    let mut writer = TokenWriter::create(
        output,
        match format {
            OutFormat::Llmc => TokenFormat::LlmC,
            OutFormat::Nanogpt => TokenFormat::NanoGpt,
        },
    )
    .with_context(|| format!("cannot write the output {}", output.display()))?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(size);
        // The template is a constant: an error here is a bug of this file.
        if let Ok(style) = ProgressStyle::with_template(
            "tokenize [{bar:30.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} (eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    });
    let start = Instant::now();
    let mut last_log = start;
    let stats = encode_stream(
        tok,
        std::io::BufReader::with_capacity(1 << 20, file),
        input,
        options,
        |ids| writer.write(ids),
        |done| match &bar {
            Some(bar) => bar.set_position(done),
            None if last_log.elapsed() >= Duration::from_secs(5) => {
                last_log = Instant::now();
                log::info!(
                    "tokenize: {done} of {size} bytes ({:.0}%)",
                    100.0 * done as f64 / size.max(1) as f64
                );
            }
            None => {}
        },
    )
    .context("tokenising")?;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    writer
        .finish()
        .with_context(|| format!("cannot write the output {}", output.display()))?;
    let secs = start.elapsed().as_secs_f64();
    outln!(
        "{} tokens ({}, V={}) from {} bytes in {secs:.2} s ({:.1} MB/s, {threads} thread{}) \
         written to {} ({format:?})",
        stats.tokens,
        tok.name(),
        tok.vocab(),
        stats.bytes,
        stats.bytes as f64 / 1e6 / secs.max(1e-9),
        if threads == 1 { "" } else { "s" },
        output.display()
    );
    Ok(())
}

/// Run a data tool.
pub fn run(cmd: DataCommand) -> anyhow::Result<()> {
    crate::logging::init(None);
    match cmd {
        DataCommand::Tokenize {
            input,
            output,
            format,
            tokenizer,
            allow_special,
            threads,
            chunk_bytes,
        } => {
            let tok = match (tokenizer, allow_special) {
                (TokenizerKind::Byte, true) => anyhow::bail!(
                    "--allow-special needs --tokenizer gpt2 (byte tokens have no special tokens)"
                ),
                (TokenizerKind::Byte, false) => Tokenizer::Byte,
                (TokenizerKind::Gpt2, special) => Tokenizer::gpt2(special)?,
            };
            // By default one per core, within the tokenizer's bound.
            let threads = threads.unwrap_or_else(|| {
                let cores = std::thread::available_parallelism();
                cores.map_or(1, |n| n.get().min(zero_models::data::TOKENIZE_MAX_THREADS))
            });
            tokenize(&input, &output, format, &tok, threads, chunk_bytes)?;
        }
        DataCommand::Corpus {
            output,
            tokens,
            format,
        } => {
            if tokens < 2 {
                anyhow::bail!(
                    "--tokens {tokens}: a token file needs at least 2 tokens (an input and its target; a run reads B x T + 1 per row)"
                );
            }
            let src = MarkovSource::default_source();
            crate::memory::need(
                &format!("--tokens {tokens}"),
                // The corpus and its copy as written, u16 each.
                crate::memory::product(&[tokens as u64, 4]),
            )?;
            let corpus = MarkovSource::default_corpus(tokens, src.vocab()).context("generating")?;
            let toks: Vec<u16> = (0..corpus.len())
                .map(|i| corpus.get(i))
                .collect::<Result<_, _>>()
                .context("reading the corpus back")?;
            write(&output, &toks, format)?;
            outln!(
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
            // One pass: the largest token, and how many are GPT-2's <|endoftext|>.
            let (mut max, mut eot) = (0u16, 0usize);
            t.scan(0..t.len(), |_, chunk| {
                max = chunk.iter().fold(max, |m, &x| m.max(x));
                eot += chunk.iter().filter(|&&x| x == GPT2_EOT).count();
                true
            })
            .with_context(|| format!("reading {}", file.display()))?;
            let bytes = std::fs::metadata(&file)
                .with_context(|| format!("reading the size of {}", file.display()))?
                .len();
            let format = if bytes == 2 * t.len() as u64 {
                "nanoGPT (raw uint16)"
            } else {
                "llm.c (header + uint16)"
            };
            let fits = if (max as usize) < BYTE_VOCAB {
                format!("fits byte tokens (V = {BYTE_VOCAB}) and GPT-2 (V = {GPT2_VOCAB})")
            } else if (max as usize) < GPT2_VOCAB {
                format!(
                    "fits GPT-2 (V = {GPT2_VOCAB}; as GPT-2 ids: {eot} x <|endoftext|> = {GPT2_EOT})"
                )
            } else {
                format!("too large for GPT-2 (V = {GPT2_VOCAB})")
            };
            outln!(
                "{}: {format}, {} tokens, largest token {max} (needs V >= {}; {fits})",
                file.display(),
                t.len(),
                max as usize + 1
            );
        }
    }
    Ok(())
}
