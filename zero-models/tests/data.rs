//! Token files (nanoGPT and llm.c formats, and their errors), the sequential order's
//! formula and its N x A invariance, the built-in corpus's entropy floor, tokenisation.

use std::path::PathBuf;
use zero_models::data::{
    tokenize_utf8, write_llmc, write_nanogpt, DataError, MarkovSource, Sequential, TokenFormat,
    Tokens, LLMC_MAGIC,
};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zero-models-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn all(t: &Tokens) -> Vec<u16> {
    (0..t.len())
        .map(|i| u16::try_from(t.get(i).expect("in vocab")).expect("a uint16 id"))
        .collect()
}

#[test]
fn both_formats_round_trip_and_auto_detects() {
    let toks: Vec<u16> = (0..1000u16).map(|i| i * 37 % 500).collect();
    let (a, b) = (tmp("a.bin"), tmp("b.bin"));
    write_llmc(&a, &toks).expect("write");
    write_nanogpt(&b, &toks).expect("write");
    assert_eq!(std::fs::metadata(&a).expect("exists").len(), 1024 + 2000);
    for (path, fmt) in [
        (&a, TokenFormat::LlmC),
        (&a, TokenFormat::Auto),
        (&b, TokenFormat::NanoGpt),
        (&b, TokenFormat::Auto),
    ] {
        let t = Tokens::open(path, fmt, 500).expect("opens");
        assert_eq!(all(&t), toks, "{path:?} {fmt:?}");
    }
    for p in [a, b] {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn llmc_errors_name_the_problem() {
    let toks: Vec<u16> = vec![1, 2, 3, 4];
    let p = tmp("bad.bin");
    write_llmc(&p, &toks).expect("write");
    let mut bytes = std::fs::read(&p).expect("read");

    let mut wrong = bytes.clone();
    wrong[0..4].copy_from_slice(&1234i32.to_le_bytes());
    std::fs::write(&p, &wrong).expect("write");
    let e = Tokens::open(&p, TokenFormat::LlmC, 10)
        .err()
        .expect("wrong magic");
    assert!(
        matches!(e, DataError::WrongMagic { found: 1234, .. }),
        "{e}"
    );
    assert!(e.to_string().contains(&LLMC_MAGIC.to_string()));

    bytes.truncate(bytes.len() - 3);
    std::fs::write(&p, &bytes).expect("write");
    let e = Tokens::open(&p, TokenFormat::LlmC, 10)
        .err()
        .expect("truncated");
    assert!(
        matches!(e, DataError::Truncated { .. }) && e.to_string().contains("4 tokens"),
        "{e}"
    );

    std::fs::write(&p, [0u8; 100]).expect("write");
    let e = Tokens::open(&p, TokenFormat::LlmC, 10)
        .err()
        .expect("short header");
    assert!(matches!(e, DataError::Truncated { .. }), "{e}");

    std::fs::write(&p, [0u8; 7]).expect("write");
    let e = Tokens::open(&p, TokenFormat::NanoGpt, 10)
        .err()
        .expect("odd byte count");
    assert!(matches!(e, DataError::Truncated { .. }), "{e}");
    let _ = std::fs::remove_file(p);
}

#[test]
fn token_outside_vocab_is_reported_with_its_position() {
    let p = tmp("vocab.bin");
    write_nanogpt(&p, &[1, 2, 300, 4]).expect("write");
    let t = Tokens::open(&p, TokenFormat::NanoGpt, 256).expect("opens");
    let e = t.get(2).expect_err("300 >= 256");
    assert!(
        matches!(
            e,
            DataError::TokenOutOfVocab {
                position: 2,
                token: 300,
                vocab: 256,
                ..
            }
        ),
        "{e}"
    );
    let order = Sequential::new(1, 3, 1, 1, 0).expect("valid");
    let (mut x, mut y) = (Vec::new(), Vec::new());
    assert!(order.fill(&t, 0, 0, &mut x, &mut y).is_err());
    assert!(Tokens::from_vec("mem", vec![0, 9], 5).is_err());
    // The up-front scan finds the first one, in any range, on either storage.
    assert_eq!(
        t.first_out_of_vocab(0..4, |_| {}).expect("reads"),
        Some((2, 300))
    );
    assert_eq!(t.first_out_of_vocab(3..4, |_| {}).expect("reads"), None);
    assert_eq!(
        t.first_out_of_vocab(0..100, |_| {}).expect("reads"),
        Some((2, 300)),
        "range clipped"
    );
    let _ = std::fs::remove_file(p);
    // Past the scan's chunk of 2^24 tokens, with progress reported per chunk.
    let mut big = vec![7u16; (1 << 24) + 10];
    big[(1 << 24) + 3] = 999;
    let p = tmp("vocab-big.bin");
    write_llmc(&p, &big).expect("write");
    let t = Tokens::open(&p, TokenFormat::Auto, 500).expect("opens");
    let mut calls = Vec::new();
    let found = t
        .first_out_of_vocab(0..t.len(), |done| calls.push(done))
        .expect("reads");
    assert_eq!(found, Some(((1 << 24) + 3, 999)));
    assert_eq!(calls, vec![1 << 24]);
    let mem = Tokens::from_vec("mem", vec![1, 2, 3], 4).expect("valid");
    assert_eq!(mem.first_out_of_vocab(0..3, |_| {}).expect("reads"), None);
    let _ = std::fs::remove_file(p);
}

/// A token file truncated while a run reads it (written again in place) is an error that
/// names it and says what happened, not a SIGBUS: the file is read, not mapped.
#[test]
fn a_token_file_truncated_under_the_run_is_an_error_naming_it() {
    let p = tmp("truncated-under.bin");
    write_nanogpt(&p, &(0..1000u16).collect::<Vec<_>>()).expect("write");
    let t = Tokens::open(&p, TokenFormat::Auto, 1000).expect("opens");
    let order = Sequential::new(2, 8, 1, 1, 0).expect("valid");
    let (mut x, mut y) = (Vec::new(), Vec::new());
    order.fill(&t, 0, 0, &mut x, &mut y).expect("reads");
    assert_eq!(x[..3], [0, 1, 2]);
    assert_eq!(y[..3], [1, 2, 3]);
    // A sequence that wraps past the end starts again at token 0.
    let mut window = [0u32; 4];
    t.read_wrapping(998, &mut window).expect("reads");
    assert_eq!(window, [998, 999, 0, 1]);
    std::fs::File::options()
        .write(true)
        .open(&p)
        .and_then(|f| f.set_len(100))
        .expect("truncate");
    let e = t
        .read_wrapping(500, &mut window)
        .expect_err("the tokens are gone");
    let msg = e.to_string();
    assert!(
        msg.contains("truncated-under.bin") && msg.contains("changed while this run reads it"),
        "{msg}"
    );
    assert!(t.fingerprint().is_err());
    assert!(t.first_out_of_vocab(0..t.len(), |_| {}).is_err());
    let _ = std::fs::remove_file(p);
}

/// What the open handle reads now: a file written again in place changes its size or its
/// fingerprint as this handle sees them; one replaced by a rename changes neither (the
/// handle reads the file it opened).
#[test]
fn the_size_and_fingerprint_are_those_of_the_file_as_read_now() {
    let p = tmp("rewritten-under.bin");
    let tokens: Vec<u16> = (0..4000u16).map(|t| t % 1000).collect();
    write_nanogpt(&p, &tokens).expect("write");
    let t = Tokens::open(&p, TokenFormat::Auto, 1000).expect("opens");
    let (bytes, fingerprint) = (
        t.bytes_now().expect("size"),
        t.fingerprint().expect("reads"),
    );
    assert_eq!(bytes, 8000);
    // Replaced by a rename: this run still reads what it opened.
    let other = tmp("rewritten-under-new.bin");
    write_nanogpt(&other, &tokens.iter().rev().copied().collect::<Vec<_>>()).expect("write");
    std::fs::rename(&other, &p).expect("rename");
    assert_eq!(t.bytes_now().expect("size"), bytes);
    assert_eq!(t.fingerprint().expect("reads"), fingerprint);
    // Written again in place (as nanoGPT's prepare.py does), same length: same size,
    // another fingerprint. (write_nanogpt writes a new file and renames it.)
    let in_place = |tokens: &[u16]| {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&p, bytes).expect("write in place");
    };
    let t = Tokens::open(&p, TokenFormat::Auto, 1000).expect("opens");
    let fingerprint = t.fingerprint().expect("reads");
    in_place(&tokens);
    assert_eq!(t.bytes_now().expect("size"), bytes);
    assert_ne!(t.fingerprint().expect("reads"), fingerprint);
    // Grown in place: another size.
    in_place(&[tokens.clone(), tokens].concat());
    assert_eq!(t.bytes_now().expect("size"), 2 * bytes);
    let mem = Tokens::from_vec("mem", vec![1, 2, 3], 4).expect("valid");
    assert_eq!(mem.bytes_now().expect("size"), 6);
    let _ = std::fs::remove_file(p);
}

/// A header shaped like llm.c's (version, token count matching the length, zeros after)
/// with another magic, or another version, is an error when the format is detected,
/// never read as raw tokens.
#[test]
fn an_llmc_looking_header_with_a_wrong_magic_or_version_is_refused() {
    let p = tmp("llmc-like.bin");
    write_llmc(&p, &[1, 2, 3, 4, 5]).expect("write");
    let good = std::fs::read(&p).expect("read");
    let mut wrong = good.clone();
    wrong[0..4].copy_from_slice(&20240801i32.to_le_bytes());
    std::fs::write(&p, &wrong).expect("write");
    let e = Tokens::open(&p, TokenFormat::Auto, 10)
        .err()
        .expect("wrong magic");
    assert!(
        matches!(
            e,
            DataError::WrongMagic {
                found: 20240801,
                ..
            }
        ),
        "{e}"
    );
    let mut v2 = good.clone();
    v2[4..8].copy_from_slice(&2i32.to_le_bytes());
    std::fs::write(&p, &v2).expect("write");
    let e = Tokens::open(&p, TokenFormat::Auto, 10)
        .err()
        .expect("wrong version");
    assert!(matches!(e, DataError::WrongVersion { found: 2, .. }), "{e}");
    // Raw tokens that merely start with a large number stay raw tokens.
    write_nanogpt(&p, &[54000, 300, 7, 9]).expect("write");
    let t = Tokens::open(&p, TokenFormat::Auto, 60000).expect("raw tokens");
    assert_eq!(t.len(), 4);
    let _ = std::fs::remove_file(p);
}

#[test]
fn sequential_reads_the_documented_window_and_wraps() {
    let n = 1000usize;
    let t = Tokens::from_vec("ramp", (0..n as u16).collect(), 1000).expect("valid");
    let (bsz, tl, a, world, rank) = (3, 16, 2, 4, 1);
    let order = Sequential::new(bsz, tl, a, world, rank).expect("valid");
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for (s, m) in [(0u64, 0usize), (0, 1), (7, 1), (123_456_789_012, 0)] {
        order.fill(&t, s, m, &mut x, &mut y).expect("fills");
        for b in 0..bsz {
            let start = ((((s as u128 * a as u128 + m as u128) * world as u128 + rank as u128)
                * bsz as u128
                + b as u128)
                * tl as u128) as usize
                % n;
            for i in 0..tl {
                assert_eq!(
                    x[b * tl + i] as usize,
                    (start + i) % n,
                    "s={s} m={m} b={b} i={i}"
                );
                assert_eq!(y[b * tl + i] as usize, (start + i + 1) % n);
            }
        }
    }
}

#[test]
fn the_global_batch_depends_only_on_n_times_a() {
    let t = Tokens::from_vec("ramp", (0..5000u16).map(|i| i % 777).collect(), 777).expect("valid");
    let (bsz, tl) = (2, 8);
    // Every (rank, micro) micro-batch of step s, concatenated in (micro, rank) order.
    let global = |world: usize, a: usize, s: u64| {
        let mut out = Vec::new();
        for m in 0..a {
            for r in 0..world {
                let (mut x, mut y) = (Vec::new(), Vec::new());
                Sequential::new(bsz, tl, a, world, r)
                    .expect("valid")
                    .fill(&t, s, m, &mut x, &mut y)
                    .expect("fills");
                out.extend(x.into_iter().zip(y));
            }
        }
        out
    };
    for s in [0, 3, 500] {
        let one = global(1, 4, s);
        assert_eq!(one, global(4, 1, s));
        assert_eq!(one, global(2, 2, s));
    }
}

#[test]
fn markov_corpus_entropy_floor_is_exact() {
    let src = MarkovSource::default_source();
    let h = src.entropy_rate();
    let seq = src.generate(1 << 20, 0xC0_4B05);
    let emp = src.mean_neg_log_prob(&seq);
    // The per-token -ln p has std ~0.7 nats, and the chain mixes in a few steps, so the
    // mean over 2^20 tokens lies within ~0.003 of H; 0.02 is a safe bound.
    assert!((emp - h).abs() < 0.02, "entropy rate {h}, empirical {emp}");
    assert!(
        h > 0.3 && h < (4.0f64).ln(),
        "fan-out 4 bounds H below ln 4; got {h}"
    );
    let corpus = MarkovSource::default_corpus(10_000, 256).expect("fits V=256");
    assert_eq!(corpus.len(), 10_000);
    assert!(MarkovSource::new(4, 2, 5, 1).is_err(), "fanout > vocab");
}

#[test]
fn tokenize_is_bytes_and_rejects_non_utf8() {
    let p = PathBuf::from("x.txt");
    assert_eq!(
        tokenize_utf8(&p, "hé".as_bytes()).expect("utf8"),
        vec![104, 0xC3, 0xA9]
    );
    let e = tokenize_utf8(&p, &[b'a', 0xFF]).expect_err("invalid");
    assert!(matches!(e, DataError::NotUtf8 { at: 1, .. }), "{e}");
}
