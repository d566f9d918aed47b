//! `zero-bench data tokenize` and `data info` as users run them (plain process, no MPI):
//!
//! - `--tokenizer gpt2` on a multi-line text with unicode: the llm.c file holds one
//!   `<|endoftext|>` and then GPT-2's ids (the published ones for "Hello world"), the same
//!   with 1 thread and 64-byte chunks as with the defaults; `data info` reads it back; a
//!   2-rank `train` with `model.vocab_size=50257` trains on it, and the default V = 64 is
//!   refused by name.
//! - `--format nanogpt --allow-special`: the text `<|endoftext|>` becomes the token 50256.
//! - Non-UTF-8 input: exit 1 naming the byte offset, and no output file (nor a temporary).
//! - A missing input and an unwritable output: exit 1 naming the path.
//! - An existing output is refused by `tokenize` and `corpus` (and `ckpt consolidate` and
//!   `export`) and kept as it was; `--force` replaces it whole.
//! - An output in a directory that does not exist is refused before any work, in the same
//!   words by `data tokenize`, `data corpus`, `ckpt consolidate` and `ckpt export`.
//! - A text of fewer than 2 tokens writes nothing (exit 1); `data info` on a file of 0 or
//!   1 tokens says it is too few to train on (exit 1).
//! - An llm.c "llama-3" file (uint32, ids past 65535) written by hand: `data info` names
//!   it; a 2-rank llama-tiny `train` with V = 70016 reads it, V = 70015 is refused by name.
//! - `data corpus` streams: what it writes across chunk boundaries is exactly the
//!   built-in corpus training reads.
//! - SIGTERM (and Ctrl-C's SIGINT) during `tokenize` removes the unfinished temporary
//!   file, and the process ends by that signal.
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use zero_tests::cli::{ok, read_lines, repo, s, train};
use zero_tests::zero_bench_bin as zero_bench;

/// A fresh, empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("data-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test's scratch directory");
    dir
}

fn data(args: &[&str]) -> Output {
    zero_tests::cli::command("data", args)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The tokens of an llm.c file, checking its header.
fn llmc_tokens(path: &Path) -> Vec<u16> {
    let bytes = std::fs::read(path).expect("read the token file");
    let int = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    assert_eq!((int(0), int(1)), (20240520, 1), "llm.c magic and version");
    let toks: Vec<u16> = bytes[1024..]
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(int(2) as usize, toks.len(), "header count");
    toks
}

fn no_temporaries(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .expect("list the scratch directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

#[test]
fn gpt2_tokens_read_back_and_train() {
    let dir = scratch("gpt2");
    let txt = dir.join("in.txt");
    // ~30 KB, so that 64-byte chunks are many.
    let para = "Hello world\nIt's a naïve café — 日本語 🙂, they'd said.\n\n\tAnd then  some.\n";
    std::fs::write(&txt, para.repeat(400)).expect("write the text");
    let bin = dir.join("out.bin");
    let out = data(&["tokenize", &s(&txt), &s(&bin), "--tokenizer", "gpt2"]);
    assert!(out.status.success(), "{}", text(&out));
    let toks = llmc_tokens(&bin);
    assert!(
        text(&out).contains(&format!("{} tokens (gpt2, V=50257)", toks.len())),
        "{}",
        text(&out)
    );
    assert_eq!(toks[..3], [50256, 15496, 995], "EOT, then \"Hello world\"");
    assert_eq!(toks.iter().filter(|&&t| t == 50256).count(), 1);

    let small = dir.join("small.bin");
    let out = data(&[
        "tokenize",
        &s(&txt),
        &s(&small),
        "--tokenizer",
        "gpt2",
        "--threads",
        "1",
        "--chunk-bytes",
        "64",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(llmc_tokens(&small), toks, "chunking changes nothing");

    let out = data(&["info", &s(&bin)]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains(&format!("llm.c (header + uint16), {} tokens", toks.len()))
            && t.contains("largest token 50256 (needs V >= 50257")
            && t.contains("1 x <|endoftext|>"),
        "{t}"
    );

    // It trains with GPT-2's vocabulary (the loss starts near ln V and falls) ...
    let metrics = dir.join("metrics.jsonl");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a = vec![
            "--config".to_string(),
            repo("configs/tiny.toml"),
            "--set".to_string(),
            format!("data.path={:?}", s(&bin)),
            "--steps".to_string(),
            "6".to_string(),
        ];
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let run = train(
        2,
        &args(&["--set", "model.vocab_size=50257", "--metrics", &s(&metrics)]),
    );
    ok(&run);
    let losses: Vec<f64> = read_lines(&metrics)
        .iter()
        .map(|l| l["loss"].as_f64().expect("loss"))
        .collect();
    assert_eq!(losses.len(), 6, "{losses:?}");
    assert!((losses[0] - 50257f64.ln()).abs() < 0.5, "{losses:?}");
    assert!(losses[5] < losses[0], "{losses:?}");
    // ... and the config's V = 64 is refused by name.
    let run = train(2, &args(&[]));
    run.assert_failed_by_itself();
    assert!(
        run.all_text()
            .contains("token 50256 at position 0 is outside the vocabulary (V = 64)"),
        "{}",
        run.all_text()
    );
}

#[test]
fn allow_special_and_nanogpt() {
    let dir = scratch("special");
    let txt = dir.join("docs.txt");
    std::fs::write(&txt, "Hello world<|endoftext|> the").expect("write");
    let bin = dir.join("docs.bin");
    let out = data(&[
        "tokenize",
        &s(&txt),
        &s(&bin),
        "--tokenizer",
        "gpt2",
        "--allow-special",
        "--format",
        "nanogpt",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&bin).expect("read");
    let toks: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(toks, [50256, 15496, 995, 50256, 262]);
    // Without the flag the same text is ordinary text: 7 tokens for "<|endoftext|>"
    // (written over the first file: --force).
    let out = data(&[
        "tokenize",
        &s(&txt),
        &s(&bin),
        "--tokenizer",
        "gpt2",
        "--format",
        "nanogpt",
        "--force",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read(&bin).expect("read").len(),
        2 * (1 + 2 + 7 + 1)
    );
    // Byte tokens have no special tokens.
    let out = data(&["tokenize", &s(&txt), &s(&bin), "--allow-special"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
}

#[test]
fn bad_input_and_output_exit_1_and_leave_no_file() {
    let dir = scratch("errors");
    let txt = dir.join("bad.txt");
    let mut bytes = "fine text\n".repeat(50).into_bytes(); // 500 bytes
    bytes.extend_from_slice(b"ok \xff\xfe more");
    std::fs::write(&txt, &bytes).expect("write");
    let bin = dir.join("bad.bin");
    for tokenizer in ["byte", "gpt2"] {
        for chunk in ["64", "4194304"] {
            let out = data(&[
                "tokenize",
                &s(&txt),
                &s(&bin),
                "--tokenizer",
                tokenizer,
                "--chunk-bytes",
                chunk,
            ]);
            assert_eq!(out.status.code(), Some(1), "{}", text(&out));
            assert!(
                text(&out).contains("bad.txt: not valid UTF-8 at byte 503"),
                "{}",
                text(&out)
            );
            assert!(!bin.exists(), "a partial output was left");
            no_temporaries(&dir);
        }
    }

    let out = data(&["tokenize", &s(&dir.join("missing.txt")), &s(&bin)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("missing.txt"), "{}", text(&out));

    // Sizes past their bounds are refused before the output is created (an existing one
    // is left as it was), not met as an allocation abort or a refused thread's panic.
    std::fs::write(&bin, b"earlier tokens").expect("write");
    for (flag, value, says) in [
        (
            "--chunk-bytes",
            "18446744073709551615",
            "chunk size 18446744073709551615 bytes",
        ),
        ("--chunk-bytes", "0", "chunk size 0 bytes"),
        ("--threads", "100000", "100000 threads: give 1 to 1024"),
    ] {
        let out = data(&["tokenize", &s(&txt), &s(&bin), flag, value]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(
            text(&out).contains("--chunk-bytes and --threads") && text(&out).contains(says),
            "{}",
            text(&out)
        );
        assert!(!text(&out).contains("panicked"), "{}", text(&out));
        assert_eq!(std::fs::read(&bin).expect("read"), b"earlier tokens");
    }
    std::fs::remove_file(&bin).expect("remove");

    let good = dir.join("good.txt");
    std::fs::write(&good, "Hello world").expect("write");
    let out = data(&["tokenize", &s(&good), &s(&dir.join("no/such/dir/out.bin"))]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("cannot write the output")
            && text(&out).contains("no/such/dir/out.bin"),
        "{}",
        text(&out)
    );
    for bad in ["panicked", "stack backtrace"] {
        assert!(!text(&out).contains(bad), "{}", text(&out));
    }

    // A corpus too short to hold one input and its target is refused by the command
    // (exit 1), a negative count by clap's parse of the number (exit 2); neither writes
    // a file. Two tokens are enough.
    let corpus = dir.join("corpus.bin");
    for (tokens, code, says) in [
        ("0", 1, "needs at least 2 tokens"),
        ("1", 1, "needs at least 2 tokens"),
        ("-3", 2, "invalid value '-3' for '--tokens"),
    ] {
        let out = data(&["corpus", "--tokens", tokens, &s(&corpus)]);
        assert_eq!(out.status.code(), Some(code), "{}", text(&out));
        assert!(text(&out).contains(says), "{}", text(&out));
        assert!(
            !corpus.exists(),
            "--tokens {tokens} wrote {}",
            corpus.display()
        );
    }
    let out = data(&["corpus", "--tokens", "2", &s(&corpus)]);
    assert!(out.status.success() && corpus.exists(), "{}", text(&out));
}

/// `data corpus` streams the built-in corpus in chunks: a count that spans two chunks
/// (2^20 tokens each) and ends inside the second writes exactly the tokens training
/// reads (`MarkovSource::default_corpus`), in either format.
#[test]
fn corpus_streams_the_tokens_training_reads() {
    use zero_models::data::{MarkovSource, DEFAULT_CORPUS_SEED};
    let dir = scratch("corpus-stream");
    let count = (1 << 20) + 4099;
    let want = MarkovSource::default_source().generate(count, DEFAULT_CORPUS_SEED);
    let llmc = dir.join("llmc.bin");
    let out = data(&["corpus", "--tokens", &count.to_string(), &s(&llmc)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("{count} tokens")),
        "{}",
        text(&out)
    );
    assert!(llmc_tokens(&llmc) == want, "the llm.c corpus differs");
    let raw = dir.join("nanogpt.bin");
    let out = data(&[
        "corpus",
        "--tokens",
        &count.to_string(),
        "--format",
        "nanogpt",
        &s(&raw),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let bytes = std::fs::read(&raw).expect("read the nanoGPT corpus");
    let got: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    assert!(got == want, "the nanoGPT corpus differs");
    no_temporaries(&dir);
}

fn ckpt(args: &[&str]) -> Output {
    zero_tests::cli::command("ckpt", args)
}

/// Exit status 1, a message that contains every one of `says`, no panic.
fn failed_saying(out: &Output, says: &[&str]) {
    let t = text(out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    for said in says {
        assert!(t.contains(said), "missing {said:?} in: {t}");
    }
    for bad in ["panicked", "stack backtrace", "Custom {", "kind:"] {
        assert!(!t.contains(bad), "{t}");
    }
}

#[test]
fn an_existing_output_is_kept_unless_force() {
    let dir = scratch("exists");
    let txt = dir.join("in.txt");
    std::fs::write(&txt, "Hello world").expect("write");
    let bin = dir.join("out.bin");
    std::fs::write(&bin, b"the user's file").expect("write");
    let refused = [
        vec!["tokenize".to_string(), s(&txt), s(&bin)],
        vec![
            "corpus".to_string(),
            s(&bin),
            "--tokens".into(),
            "100".into(),
        ],
    ];
    for args in &refused {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = data(&args);
        failed_saying(&out, &["out.bin' exists; not overwriting it", "--force"]);
        assert_eq!(
            std::fs::read(&bin).expect("read"),
            b"the user's file",
            "{args:?}"
        );
        no_temporaries(&dir);
    }
    // A symbolic link to an existing file is that file: refused too.
    let link = dir.join("link.bin");
    std::os::unix::fs::symlink("out.bin", &link).expect("symlink");
    let out = data(&["corpus", &s(&link), "--tokens", "100"]);
    failed_saying(&out, &["exists; not overwriting it"]);
    assert_eq!(std::fs::read(&bin).expect("read"), b"the user's file");

    // --force replaces it whole (through the link, which stays a link).
    let out = data(&["tokenize", &s(&txt), &s(&bin), "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(llmc_tokens(&bin), b"Hello world".map(u16::from));
    let out = data(&["corpus", &s(&link), "--tokens", "100", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(llmc_tokens(&bin).len(), 100);
    assert!(std::fs::symlink_metadata(&link)
        .expect("link")
        .file_type()
        .is_symlink());
    no_temporaries(&dir);

    // The ckpt tools refuse an existing output the same way, before reading the
    // checkpoint (here there is none).
    for args in [
        &["consolidate", "no-checkpoint", &s(&bin)][..],
        &["export", "--safetensors", "no-checkpoint", &s(&bin)][..],
    ] {
        let out = ckpt(args);
        failed_saying(&out, &["out.bin' exists; not overwriting it"]);
        assert!(!text(&out).contains("no-checkpoint'"), "{}", text(&out));
        assert_eq!(llmc_tokens(&bin).len(), 100);
    }
}

#[test]
fn a_missing_directory_is_said_before_any_work() {
    let dir = scratch("nodir");
    let txt = dir.join("in.txt");
    std::fs::write(&txt, "Hello world").expect("write");
    let nodir = dir.join("nodir");
    let missing = format!("directory '{}' does not exist; create it first", s(&nodir));
    let out = data(&["tokenize", &s(&txt), &s(&nodir.join("x.bin"))]);
    failed_saying(&out, &["cannot write the output", &missing]);
    let out = data(&["corpus", &s(&nodir.join("x.bin")), "--tokens", "100"]);
    failed_saying(&out, &["cannot write the output", &missing]);
    // The ckpt tools say it first, whatever the checkpoint (none here), in the same
    // words, not in HDF5's or as a Rust debug dump naming the temporary file.
    let out = ckpt(&["consolidate", "no-checkpoint", &s(&nodir.join("x.h5"))]);
    failed_saying(&out, &["consolidating no-checkpoint into", &missing]);
    let out = ckpt(&[
        "export",
        "--safetensors",
        "no-checkpoint",
        &s(&nodir.join("x.st")),
    ]);
    failed_saying(&out, &["exporting no-checkpoint to", &missing]);
    assert!(!text(&out).contains(".partial-"), "{}", text(&out));
    // A file where the directory should be.
    let out = data(&["corpus", &s(&txt.join("x.bin")), "--tokens", "100"]);
    failed_saying(&out, &["in.txt"]);
    assert_eq!(std::fs::read_to_string(&txt).expect("read"), "Hello world");
    assert!(!nodir.exists());
}

#[test]
fn too_few_tokens_write_nothing_and_info_says_so() {
    let dir = scratch("few");
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, "").expect("write");
    let one = dir.join("one.txt");
    std::fs::write(&one, "a").expect("write");
    for (txt, tokenizer, tokens) in [
        (&empty, "byte", "0 tokens"),
        (&one, "byte", "1 token from 1 bytes"),
        // gpt2 starts with <|endoftext|>: one token of an empty text.
        (&empty, "gpt2", "1 token from 0 bytes"),
    ] {
        let bin = dir.join("e.bin");
        let out = data(&["tokenize", &s(txt), &s(&bin), "--tokenizer", tokenizer]);
        failed_saying(
            &out,
            &[tokens, "needs at least 2 tokens", "nothing was written"],
        );
        assert!(!bin.exists(), "{tokenizer}: {}", text(&out));
        no_temporaries(&dir);
    }
    // Two tokens make a file; info reads it.
    let two = dir.join("two.txt");
    std::fs::write(&two, "ab").expect("write");
    let bin = dir.join("two.bin");
    let out = data(&["tokenize", &s(&two), &s(&bin), "--format", "nanogpt"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = data(&["info", &s(&bin)]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("2 tokens, largest token 98"),
        "{}",
        text(&out)
    );
    // Files of 0 and 1 tokens (written by something else): too few to train on, exit 1.
    let bytes = std::fs::read(&bin).expect("read");
    for (n, said) in [
        (0, "0 tokens: too few to train on"),
        (1, "1 token: too few"),
    ] {
        let short = dir.join(format!("short-{n}.bin"));
        std::fs::write(&short, &bytes[..2 * n]).expect("write");
        let out = data(&["info", &s(&short)]);
        failed_saying(&out, &[said]);
        assert!(!text(&out).contains("needs V >= 1 "), "{}", text(&out));
    }
}

/// SIGTERM and SIGINT while `tokenize` writes: the temporary file is removed, no output
/// appears, and the process ends by the signal (a shell's 143 and 130).
#[test]
fn a_signal_removes_the_unfinished_output() {
    let dir = scratch("signal");
    let txt = dir.join("big.txt");
    // ~40 MB: a few seconds of GPT-2 BPE on one thread, long after the temporary appears.
    let line = "The quick brown fox jumps over the lazy dog, they'd said. ".repeat(100) + "\n";
    std::fs::write(&txt, line.repeat(7000)).expect("write");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let bin = dir.join(format!("out-{sig}.bin"));
        let tmp_prefix = format!(".out-{sig}.bin.tmp-");
        let mut child = Command::new(zero_bench());
        child
            .args(["data", "tokenize", &s(&txt), &s(&bin)])
            .args(["--tokenizer", "gpt2", "--threads", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: signal(2) only, between fork and exec: SIGINT as a terminal gives it,
        // even where this test runs with it ignored (a script's background job).
        unsafe {
            child.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                Ok(())
            });
        }
        let mut child = child.spawn().expect("zero-bench starts");
        let start = Instant::now();
        let has_tmp = || {
            std::fs::read_dir(&dir)
                .expect("list")
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with(&tmp_prefix))
        };
        while !has_tmp() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no temporary file appeared"
            );
            assert!(
                child.try_wait().expect("wait").is_none(),
                "it ended before writing"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: kill(2) of our own child, still running (not yet waited for).
        assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(sig), "{status:?}");
        assert!(!bin.exists(), "an output appeared after signal {sig}");
        no_temporaries(&dir);
    }
}

/// llm.c's "llama-3" token format (data_common.py: magic 20240801, version 7, then
/// uint32 tokens), written here byte by byte: `data info` names it and its width and sees
/// ids past 65535 whole; a 2-rank llama-tiny `train` with V = 70016 reads them (the loss
/// starts near ln V), and V = 70015 is refused naming the largest id (audit 35, item 4).
#[test]
fn llama3_token_files_with_ids_past_65535_read_and_train() {
    let dir = scratch("llama3");
    const V: u32 = 70_016;
    // Ids in 69990..70016 with period 26, and 5 and 65536 among them.
    let mut ids: Vec<u32> = (0..4096u32).map(|i| V - 26 + i % 26).collect();
    ids[0] = 5;
    ids[1] = 65_536;
    let mut bytes = Vec::new();
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[20240801, 7, ids.len() as i32]);
    header
        .iter()
        .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
    ids.iter()
        .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
    let bin = dir.join("llama3.bin");
    std::fs::write(&bin, bytes).expect("write the llama-3 token file");

    let out = data(&["info", &s(&bin)]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("llm.c llama-3 (header + uint32), 4096 tokens")
            && t.contains(&format!("largest token {} (needs V >= {V}", V - 1))
            && t.contains("too large for GPT-2"),
        "{t}"
    );

    let metrics = dir.join("metrics.jsonl");
    let args = |vocab: u32| -> Vec<String> {
        [
            "--config".to_string(),
            repo("configs/llama-tiny.toml"),
            "--set".to_string(),
            format!("data.path={:?}", s(&bin)),
            "--set".to_string(),
            format!("model.vocab_size={vocab}"),
            "--steps".to_string(),
            "3".to_string(),
            "--metrics".to_string(),
            s(&metrics),
        ]
        .to_vec()
    };
    let run = train(2, &args(V));
    ok(&run);
    let losses: Vec<f64> = read_lines(&metrics)
        .iter()
        .map(|l| l["loss"].as_f64().expect("loss"))
        .collect();
    assert_eq!(losses.len(), 3, "{losses:?}");
    assert!(
        losses.iter().all(|l| l.is_finite()) && (losses[0] - f64::from(V).ln()).abs() < 0.5,
        "{losses:?}"
    );
    // One short of the largest id: refused by name before any step.
    let run = train(2, &args(V - 1));
    run.assert_failed_by_itself();
    assert!(
        run.all_text().contains(&format!(
            "token {} at position 25 is outside the vocabulary (V = {})",
            V - 1,
            V - 1
        )),
        "{}",
        run.all_text()
    );
}
