//! Text tokenisation: GPT-2's ids for fixed strings (the published encoding), decode of
//! encode is the text, streaming in small chunks (with 1 and 3 threads) gives the tokens of
//! the whole text, non-UTF-8 input names its byte offset, and the token writer leaves no
//! partial file.
//!
//! Expected ids were computed with OpenAI's Python tiktoken 0.14 (`get_encoding("r50k_base")`,
//! whose rank file has the SHA-256 tiktoken checks, and which is the file tiktoken-rs embeds).

use std::io::Read;
use std::path::{Path, PathBuf};
use zero_models::data::{
    encode_stream, last_safe_split, DataError, StreamOptions, TokenFormat, TokenWriter, Tokenizer,
    Tokens, GPT2_EOT, GPT2_VOCAB,
};

fn gpt2() -> Tokenizer {
    Tokenizer::gpt2(false).expect("GPT-2 ranks are compiled in")
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-models-tok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// Multi-line text with every kind of piece the pre-tokenizer makes: contractions, runs of
/// spaces, tabs, CRLF, blank lines, digits, punctuation, accents, CJK, emoji (one with a
/// zero-width joiner), a no-break space, and the literal special-token text.
const SAMPLE: &str = "First Citizen:\nBefore we proceed any further, hear me speak.\n\n\
All:\r\nSpeak, speak.  It's 2024 -- we'll see; they'd've said \"no\"!\n\
\t\tindented\tline with  double  spaces   \n\
naïve café — 日本語のテキスト 🙂 👩‍💻 ½ x\u{a0}y\n\
   \n\n<|endoftext|> 12345678 3.14159 ends without newline";

#[test]
fn gpt2_ids_match_the_published_encoding() {
    let t = gpt2();
    assert_eq!(t.vocab(), GPT2_VOCAB);
    assert_eq!(t.encode("Hello world"), [15496, 995]);
    assert_eq!(t.encode("Hello, world!"), [15496, 11, 995, 0]);
    assert_eq!(t.encode(" the"), [262]);
    assert_eq!(t.encode("héllo wörld"), [71, 2634, 18798, 266, 30570, 335]);
    assert_eq!(
        t.encode("naïve café — 日本語 🙂\n"),
        [2616, 38776, 40304, 851, 10545, 245, 98, 17312, 105, 45739, 252, 32485, 198]
    );
    assert_eq!(
        t.encode("it's  a\r\ntest\u{a0}x"),
        [270, 338, 220, 257, 201, 198, 9288, 1849, 87]
    );
    // The special token's text is ordinary text unless asked for.
    assert_eq!(t.encode("<|endoftext|>"), [27, 91, 437, 1659, 5239, 91, 29]);
    let special = Tokenizer::gpt2(true).expect("ranks");
    assert_eq!(special.encode("<|endoftext|>"), [GPT2_EOT]);
    assert_eq!(GPT2_EOT, 50256);
    assert_eq!(
        special.encode("Hello world<|endoftext|> the"),
        [15496, 995, 50256, 262]
    );
    assert_eq!(t.file_prefix(), [GPT2_EOT]);
}

#[test]
fn decode_of_encode_is_the_text() {
    for t in [Tokenizer::Byte, gpt2()] {
        let ids = t.encode(SAMPLE);
        assert!(ids.iter().all(|&id| (id as usize) < t.vocab()));
        assert_eq!(
            t.decode(&ids).expect("whole characters"),
            SAMPLE,
            "{}",
            t.name()
        );
    }
    let special = Tokenizer::gpt2(true).expect("ranks");
    assert_eq!(
        special.decode(&special.encode(SAMPLE)).expect("utf8"),
        SAMPLE
    );
    assert!(gpt2().decode(&[50257]).is_err(), "id outside V");
}

#[test]
fn safe_splits_fall_before_whitespace_runs() {
    assert_eq!(last_safe_split("Hello world"), Some(5));
    assert_eq!(last_safe_split("a b\n\nc  "), Some(6));
    assert_eq!(
        last_safe_split("a\u{a0}é\u{3000}"),
        Some(5),
        "Unicode spaces count"
    );
    assert_eq!(last_safe_split("   word"), None);
    assert_eq!(last_safe_split("nowhitespace"), None);
    assert_eq!(last_safe_split(""), None);
}

/// A reader that hands out at most `step` bytes per read, so that UTF-8 characters are cut
/// by reads too.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn stream(t: &Tokenizer, text: &[u8], chunk_bytes: usize, threads: usize, step: usize) -> Vec<u16> {
    let mut out = Vec::new();
    let mut last_progress = 0;
    let stats = encode_stream(
        t,
        Trickle { data: text, step },
        Path::new("sample.txt"),
        StreamOptions {
            chunk_bytes,
            threads,
        },
        |ids| {
            out.extend_from_slice(ids);
            Ok(())
        },
        |done| last_progress = done,
    )
    .expect("valid UTF-8");
    assert_eq!(stats.bytes, text.len() as u64);
    assert_eq!(last_progress, text.len() as u64);
    assert_eq!(stats.tokens, out.len() as u64);
    out
}

#[test]
fn chunked_streaming_gives_the_whole_text_tokens() {
    // ~40 KB: hundreds of chunks of 64 bytes, a few of 4 KB.
    let text: String = (0..150)
        .map(|i| format!("{i}: {SAMPLE}\n"))
        .collect::<Vec<_>>()
        .concat();
    for t in [
        Tokenizer::Byte,
        gpt2(),
        Tokenizer::gpt2(true).expect("ranks"),
    ] {
        let mut whole = t.file_prefix().to_vec();
        t.encode_into(&text, &mut whole);
        for (chunk, threads, step) in [(64, 1, 7), (64, 3, 1000), (4096, 2, 4096), (1, 1, 3)] {
            assert_eq!(
                stream(&t, text.as_bytes(), chunk, threads, step),
                whole,
                "{} chunk {chunk} threads {threads} read {step}",
                t.name()
            );
        }
    }
    // No whitespace for longer than a chunk, and whitespace-only runs: read on until a split.
    let hard = format!("{}  \n\t {}", "x".repeat(1000), "é".repeat(700));
    let t = gpt2();
    let mut whole = t.file_prefix().to_vec();
    t.encode_into(&hard, &mut whole);
    assert_eq!(stream(&t, hard.as_bytes(), 16, 2, 5), whole);
    assert_eq!(stream(&t, b"", 16, 2, 5), t.file_prefix());
}

#[test]
fn non_utf8_input_names_its_byte_offset() {
    let mut text = "ok line\n".repeat(100).into_bytes();
    text.extend_from_slice(&[b'a', 0xC3, b'(', b'z']); // 0xC3 must start a 2-byte character
    for chunk in [16, 1 << 20] {
        let e = encode_stream(
            &gpt2(),
            Trickle {
                data: &text,
                step: 5,
            },
            Path::new("bad.txt"),
            StreamOptions {
                chunk_bytes: chunk,
                threads: 2,
            },
            |_| Ok(()),
            |_| {},
        )
        .expect_err("invalid UTF-8");
        assert!(matches!(e, DataError::NotUtf8 { at: 801, .. }), "{e}");
        assert!(
            e.to_string()
                .contains("bad.txt: not valid UTF-8 at byte 801"),
            "{e}"
        );
    }
    // A character cut by the end of the file.
    let e = encode_stream(
        &Tokenizer::Byte,
        &[b'a', b' ', 0xE2, 0x82][..],
        Path::new("cut.txt"),
        StreamOptions::default(),
        |_| Ok(()),
        |_| {},
    )
    .expect_err("cut character");
    assert!(matches!(e, DataError::NotUtf8 { at: 2, .. }), "{e}");
}

#[test]
fn token_writer_renames_on_finish_and_leaves_nothing_on_error() {
    let p = tmp("writer.bin");
    let _ = std::fs::remove_file(&p);
    let mut w = TokenWriter::create(&p, TokenFormat::LlmC).expect("create");
    w.write(&[GPT2_EOT, 15496]).expect("write");
    w.write(&[995]).expect("write");
    assert!(!p.exists(), "the final name appears only on finish");
    assert_eq!(w.finish().expect("finish"), 3);
    let t = Tokens::open(&p, TokenFormat::Auto, GPT2_VOCAB).expect("open");
    let ids: Vec<u16> = (0..t.len())
        .map(|i| u16::try_from(t.get(i).expect("in V")).expect("a uint16 id"))
        .collect();
    assert_eq!(ids, [GPT2_EOT, 15496, 995]);

    // Dropped before finish (an error on the way): the old file stays, no temporary is left.
    let mut w = TokenWriter::create(&p, TokenFormat::NanoGpt).expect("create");
    w.write(&[1, 2, 3]).expect("write");
    drop(w);
    let dir = p.parent().expect("dir");
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    assert_eq!(
        Tokens::open(&p, TokenFormat::Auto, GPT2_VOCAB)
            .expect("open")
            .len(),
        3
    );

    let e = TokenWriter::create(&dir.join("no/such/dir/x.bin"), TokenFormat::LlmC)
        .err()
        .expect("unwritable");
    assert!(matches!(e, DataError::Io { .. }), "{e}");
    assert!(
        TokenWriter::create(&p, TokenFormat::Auto).is_err(),
        "Auto is not a format to write"
    );
}
