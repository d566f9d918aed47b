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
//!
//! `tokenize` and `corpus` refuse an existing output unless `--force`, check the
//! output's directory before any work, and put the file in place without replacing one
//! that another process wrote meanwhile (`zero_core::files::place_new`). A signal that
//! ends them (SIGINT, SIGTERM, SIGHUP, SIGABRT) removes the unfinished temporary file
//! first ([`remove_unfinished_output_on_signals`]; the `ckpt` tools use it too), and the
//! process then ends by that signal (a shell reports 128 + its number: 130 for Ctrl-C).

use crate::logging::outln;
use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zero_core::files::OutputError;
use zero_models::data::{
    encode_stream, MarkovSource, StreamOptions, TokenFormat, TokenWriter, Tokenizer, Tokens,
    BYTE_VOCAB, DEFAULT_CORPUS_SEED, GPT2_EOT, GPT2_VOCAB,
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
    /// its name only when complete (an error leaves no file), and never replaces an
    /// existing file unless --force. A text that gives fewer than 2 tokens (empty) is an
    /// error: a token file needs an input and its target.
    ///
    /// On Ctrl-C, SIGTERM or SIGHUP the unfinished output is removed and the command ends
    /// by that signal (exit status 130 for Ctrl-C, 143 for SIGTERM). The temporary file
    /// that a killed process (SIGKILL) leaves, .OUT.tmp-PID, is removed by the next run
    /// writing OUT once it is a minute old.
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
        /// Bytes of text read per chunk. Byte tokens cut at the last character boundary;
        /// gpt2 chunks end before a whitespace run, where GPT-2's pre-tokenizer splits
        /// anyway, and grow (at most to 1 GiB) where there is none, so the tokens are those
        /// of the whole text.
        #[arg(long, default_value_t = 4 << 20)]
        chunk_bytes: usize,
        /// Replace the output if it exists (without it, an existing file is refused and
        /// left as it is). The old file stays until the new one is complete.
        #[arg(long)]
        force: bool,
    },
    /// Write the built-in Markov corpus (V = 64 symbols, order 2) and print its entropy floor.
    ///
    /// The output is never replaced unless --force, and appears only when complete; on
    /// Ctrl-C, SIGTERM or SIGHUP the unfinished output is removed and the command ends by
    /// that signal (exit status 130 for Ctrl-C, 143 for SIGTERM).
    Corpus {
        /// Output token file.
        output: PathBuf,
        /// Tokens to generate (at least 2; at most 2147483647 in llm.c's format), written in
        /// chunks of 2^20 tokens: about 17 MB of memory whatever the count.
        #[arg(long, default_value_t = 1 << 20)]
        tokens: usize,
        /// Output format.
        #[arg(long, value_enum, default_value = "llmc")]
        format: OutFormat,
        /// Replace the output if it exists (without it, an existing file is refused and
        /// left as it is).
        #[arg(long)]
        force: bool,
    },
    /// Describe a token file (format detected from the llm.c magic); exit 1 when it holds
    /// fewer than 2 tokens (nothing to train on).
    Info {
        /// The token file.
        file: PathBuf,
    },
}

impl OutFormat {
    fn token_format(self) -> TokenFormat {
        match self {
            OutFormat::Llmc => TokenFormat::LlmC,
            OutFormat::Nanogpt => TokenFormat::NanoGpt,
        }
    }
}

/// The fewest tokens a token file is written with: one input and its target (a run
/// reads B x T + 1 per row, so it needs more: `train` says how many).
const MIN_TOKENS: u64 = 2;

/// The most tokens an llm.c file holds (its header's count is an int32).
const LLMC_MAX_TOKENS: u64 = i32::MAX as u64;

/// The llm.c header: 256 int32.
const LLMC_HEADER_BYTES: u64 = 256 * 4;

/// Check, before any work, that `output` can be written: its directory exists, and
/// nothing is there unless `force`.
fn check_output(output: &Path, force: bool) -> anyhow::Result<PathBuf> {
    match zero_core::files::check_output(output, force) {
        Ok(target) => Ok(target),
        Err(e @ OutputError::Exists(_)) => Err(anyhow::anyhow!(
            "{e}; give --force to replace it, or another path"
        )),
        Err(e) => Err(e.into()),
    }
    .with_context(|| format!("cannot write the output {}", output.display()))
}

/// Refuse before writing `bytes` to `target` when its file system has less free space
/// (statvfs: the blocks an unprivileged writer may use), so that a long write does not
/// fill the disk and fail at the end; no check where the figure cannot be read.
fn check_free_space(what: &str, target: &Path, bytes: u64) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return Ok(());
    };
    // SAFETY: statvfs is plain data, which the call fills; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Ok(());
    }
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    anyhow::ensure!(
        bytes <= free,
        "{what} needs {} on the file system of {}, which has {} free; give fewer tokens or another directory",
        zero_core::ledger::human_bytes(bytes as f64),
        dir.display(),
        zero_core::ledger::human_bytes(free as f64)
    );
    Ok(())
}

/// Start writing `output`: replacing an existing file with `force`, else never.
fn writer(output: &Path, format: OutFormat, force: bool) -> anyhow::Result<TokenWriter> {
    let format = format.token_format();
    if force {
        TokenWriter::create(output, format)
    } else {
        TokenWriter::create_new(output, format)
    }
    .with_context(|| format!("cannot write the output {}", output.display()))
}

/// Write the first `count` symbols of `symbols` to `writer`, [`CORPUS_CHUNK`] at a time:
/// the memory taken is the chunk's, whatever `count` is.
fn write_streamed(
    symbols: &mut impl Iterator<Item = u16>,
    count: usize,
    writer: &mut TokenWriter,
) -> anyhow::Result<()> {
    let mut progress = Progress::new(
        "corpus",
        count as u64,
        "corpus [{bar:30.cyan/blue}] {human_pos}/{human_len} tokens {per_sec} (eta {eta})",
        "tokens",
    );
    let mut chunk = vec![0u16; CORPUS_CHUNK.min(count)];
    let mut written = 0;
    while written < count {
        let n = (count - written).min(chunk.len());
        for (slot, sym) in chunk[..n].iter_mut().zip(symbols.by_ref()) {
            *slot = sym;
        }
        writer.write(&chunk[..n])?;
        written += n;
        progress.set(written as u64);
    }
    progress.finish();
    Ok(())
}

/// Progress of a long data tool: a bar on a terminal, else a log line every 5 s.
struct Progress {
    bar: Option<ProgressBar>,
    /// The tool, for the log line.
    what: &'static str,
    total: u64,
    /// What the counts count ("bytes", "tokens"), for the log line.
    unit: &'static str,
    last_log: Instant,
}

impl Progress {
    /// `template`: the bar's indicatif template (a constant of this file).
    fn new(what: &'static str, total: u64, template: &str, unit: &'static str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            // The template is a constant: an error here is a bug of this file.
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        });
        Progress {
            bar,
            what,
            total,
            unit,
            last_log: Instant::now(),
        }
    }

    fn set(&mut self, done: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(done),
            None if self.last_log.elapsed() >= Duration::from_secs(5) => {
                self.last_log = Instant::now();
                log::info!(
                    "{}: {done} of {} {} ({:.0}%)",
                    self.what,
                    self.total,
                    self.unit,
                    100.0 * done as f64 / self.total.max(1) as f64
                );
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The signals after which a `data` or `ckpt` tool that writes an output removes its
/// unfinished temporary file before it ends.
const ENDING: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGABRT];

extern "C" fn remove_unfinished_and_end(sig: libc::c_int) {
    // Async-signal-safe only: atomics (take_tracked), unlink(2), write(2), signal(2),
    // raise(3).
    let mut removed = false;
    zero_core::files::take_tracked(|path| {
        // SAFETY: take_tracked hands NUL-terminated paths that stay valid (never freed).
        removed |= unsafe { libc::unlink(path) } == 0;
    });
    let text: &[u8] = b"\ninterrupted: the unfinished output was removed (an existing file of that name is as it was)\n";
    // SAFETY: write(2) of a static buffer to stderr; signal(2) and raise(3) restore the
    // default action and send the signal again, which ends the process once this handler
    // returns (the signal is blocked until then), as if it had not been caught.
    unsafe {
        if removed {
            libc::write(2, text.as_ptr() as *const libc::c_void, text.len());
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// For a command that writes an output whole (`data tokenize`, `data corpus`, `ckpt
/// consolidate`, `ckpt export`): on SIGINT, SIGTERM, SIGHUP or SIGABRT, remove the
/// temporary file being written (`zero_core::files::track_temporary`), then end by that
/// signal, as the default action would (exit status 128 + its number in a shell: 130 for
/// Ctrl-C, 143 for SIGTERM). A signal ignored when the process started (SIGHUP under
/// nohup, SIGINT in a script's background job) stays ignored.
pub(crate) fn remove_unfinished_output_on_signals() -> anyhow::Result<()> {
    for sig in ENDING {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; `old` is
        // written by sigaction(2); the handler only does async-signal-safe calls.
        let rc = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = remove_unfinished_and_end as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("installing the handler of signal {sig}"));
        }
    }
    Ok(())
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
    force: bool,
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
    check_output(output, force)?;
    let size = file
        .metadata()
        .with_context(|| format!("reading the size of {}", input.display()))?
        .len();
    let mut writer = writer(output, format, force)?;
    let mut progress = Progress::new(
        "tokenize",
        size,
        "tokenize [{bar:30.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec} (eta {eta})",
        "bytes",
    );
    let start = Instant::now();
    let stats = encode_stream(
        tok,
        std::io::BufReader::with_capacity(1 << 20, file),
        input,
        options,
        |ids| writer.write(ids),
        |done| progress.set(done),
    )
    .context("tokenising")?;
    progress.finish();
    // Dropped unfinished on this error: no file is left.
    anyhow::ensure!(
        writer.count() >= MIN_TOKENS,
        "{}: {} token{} from {} bytes: a token file needs at least {MIN_TOKENS} tokens (an \
         input and its target); nothing was written to {}. Give a longer text",
        input.display(),
        writer.count(),
        if writer.count() == 1 { "" } else { "s" },
        stats.bytes,
        output.display()
    );
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

/// Tokens `data corpus` generates before it writes them (2 MiB).
const CORPUS_CHUNK: usize = 1 << 20;

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
            force,
        } => {
            remove_unfinished_output_on_signals()?;
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
            tokenize(&input, &output, format, &tok, threads, chunk_bytes, force)?;
        }
        DataCommand::Corpus {
            output,
            tokens,
            format,
            force,
        } => {
            remove_unfinished_output_on_signals()?;
            if (tokens as u64) < MIN_TOKENS {
                anyhow::bail!(
                    "--tokens {tokens}: a token file needs at least {MIN_TOKENS} tokens (an input and its target; a run reads B x T + 1 per row)"
                );
            }
            // Checked before anything is generated: what llm.c's header can count. The
            // memory taken is bounded (a chunk of CORPUS_CHUNK tokens and the writer's
            // buffers), whatever --tokens is.
            if matches!(format, OutFormat::Llmc) && tokens as u64 > LLMC_MAX_TOKENS {
                anyhow::bail!(
                    "--tokens {tokens}: an llm.c token file holds at most {LLMC_MAX_TOKENS} tokens (its header's count is an int32); give --format nanogpt, or fewer tokens"
                );
            }
            let target = check_output(&output, force)?;
            let header = match format {
                OutFormat::Llmc => LLMC_HEADER_BYTES,
                OutFormat::Nanogpt => 0,
            };
            let bytes = (tokens as u64).saturating_mul(2).saturating_add(header);
            check_free_space(&format!("--tokens {tokens}"), &target, bytes)?;
            let src = MarkovSource::default_source();
            let mut w = writer(&output, format, force)?;
            let written = write_streamed(&mut src.sample(DEFAULT_CORPUS_SEED), tokens, &mut w)
                .and_then(|()| Ok(w.finish()?))
                .with_context(|| format!("writing {}", output.display()))?;
            outln!(
                "{} tokens of the built-in corpus (V={} symbols, order {}) written to {}; \
                 entropy floor {:.4} nats/token (ln V = {:.4})",
                written,
                src.vocab(),
                src.order(),
                output.display(),
                src.entropy_rate(),
                (src.vocab() as f64).ln()
            );
        }
        DataCommand::Info { file } => {
            // No vocabulary bound: the scan reads unchecked, and the largest token is said.
            let t = Tokens::open(&file, TokenFormat::Auto, usize::MAX)
                .with_context(|| format!("opening {}", file.display()))?;
            // One pass: the largest token, and how many are GPT-2's <|endoftext|>.
            let (mut max, mut eot) = (0u32, 0usize);
            t.scan(0..t.len(), |_, chunk| {
                max = chunk.iter().fold(max, |m, &x| m.max(x));
                eot += chunk.iter().filter(|&&x| x == u32::from(GPT2_EOT)).count();
                true
            })
            .with_context(|| format!("reading {}", file.display()))?;
            // The format as the header said: llm.c's "gpt-2" (uint16) or "llama-3" (uint32).
            let format = match t.format() {
                Some(TokenFormat::LlmC) => "llm.c (header + uint16)",
                Some(TokenFormat::LlmCLlama3) => "llm.c llama-3 (header + uint32)",
                _ => "nanoGPT (raw uint16)",
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
            if t.is_empty() {
                outln!("{}: {format}, 0 tokens", file.display());
            } else {
                outln!(
                    "{}: {format}, {} token{}, largest token {max} (needs V >= {}; {fits})",
                    file.display(),
                    t.len(),
                    if t.len() == 1 { "" } else { "s" },
                    max as usize + 1
                );
            }
            // What `data tokenize` and `data corpus` refuse to write: nothing to train on.
            anyhow::ensure!(
                t.len() as u64 >= MIN_TOKENS,
                "{}: {} token{}: too few to train on (a token file needs at least {MIN_TOKENS}, \
                 an input and its target; a run needs B x T + 1); make it again from a longer \
                 text",
                file.display(),
                t.len(),
                if t.len() == 1 { "" } else { "s" }
            );
        }
    }
    Ok(())
}
