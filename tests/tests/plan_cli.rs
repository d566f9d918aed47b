//! `zero-bench plan` as users run it: the built binary, as a plain process (no MPI).
//!
//! - The ZeRO paper's worked example (Rajbhandari et al., SC'20, section 5.1 / figure 1):
//!   Ψ = 7.5e9 on N = 64 needs 120, 31.4, 16.6 and 1.9 GB per GPU at stages 0-3; the
//!   formula column must give exactly 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N, and the plan must
//!   equal the formula plus the explained differences.
//! - 70e9 on 512 GPUs of 80 GiB: which stages fit, consistent with the numbers.
//! - Bad inputs exit non-zero with a message naming the input, and no backtrace.
//! - `--json` is valid JSON carrying the same numbers (checked with the small parser at
//!   the end of this file: zero-tests has no JSON dependency).
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::process::{Command, Output};

use zero_tests::zero_bench_bin as zero_bench;

fn run(args: &[&str]) -> Output {
    Command::new(zero_bench())
        .arg("plan")
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("zero-bench starts")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Run with `--json` into a temporary file and return the parsed document and stdout.
fn run_json(args: &[&str], tag: &str) -> (Json, String) {
    let path = std::env::temp_dir().join(format!("plan_cli_{tag}_{}.json", std::process::id()));
    let p = path.to_string_lossy().into_owned();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--json", &p]);
    let out = run(&all);
    assert!(
        out.status.success(),
        "zero-bench plan {all:?} failed:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
    let text = std::fs::read_to_string(&path).expect("--json wrote the file");
    let _ = std::fs::remove_file(&path);
    let doc =
        Json::parse(&text).unwrap_or_else(|e| panic!("--json is not valid JSON: {e}\n{text}"));
    (doc, stdout(&out))
}

#[test]
fn paper_worked_example_7_5b_on_64_gpus() {
    let (doc, text) = run_json(
        &["--params", "7.5e9", "--gpus", "64", "--precision", "bf16"],
        "paper",
    );
    let psi = 7.5e9;
    let n = 64.0;
    assert_eq!(doc.get("params").num(), psi);
    let points = doc.get("points").arr();
    assert_eq!(points.len(), 4, "all four stages by default");
    // The paper's figure 1, in GB (1e9 bytes), to its one decimal.
    let paper_gb = [120.0, 31.4, 16.6, 1.9];
    let exact = [
        16.0 * psi,
        4.0 * psi + 12.0 * psi / n,
        2.0 * psi + 14.0 * psi / n,
        16.0 * psi / n,
    ];
    for (s, p) in points.iter().enumerate() {
        assert_eq!(p.get("stage").num(), s as f64);
        assert_eq!(p.get("world").num(), 64.0);
        let f = p.get("formula_bytes").num();
        assert_eq!(f, exact[s], "stage {s}: formula bytes");
        assert_eq!(
            (f / 1e9 * 10.0).round() / 10.0,
            paper_gb[s],
            "stage {s}: the paper's GB"
        );
        // Plan = formula + the explained differences (to f64 rounding of the fractions).
        let plan = p.get("plan_bytes").num();
        let explained: f64 = p
            .get("differences")
            .arr()
            .iter()
            .map(|d| d.get("bytes").num())
            .sum();
        assert!(
            (plan - f - explained).abs() <= 1.0,
            "stage {s}: plan {plan} != formula {f} + explained {explained}"
        );
        // The categories partition the plan.
        let cats: f64 = p
            .get("categories")
            .arr()
            .iter()
            .map(|c| c.get("bytes").num())
            .sum();
        assert_eq!(cats, plan, "stage {s}: categories sum to the plan");
        // bf16 keeps the formula's model states, so the plan only adds buffers (and the
        // padding of the partition), never less than the formula.
        assert!(plan >= f, "stage {s}: plan {plan} < formula {f}");
        // Every difference says why.
        for d in p.get("differences").arr() {
            assert!(!d.get("reason").str().is_empty());
        }
        // Stages 0-2 move 2Ψ(N-1)/N elements of bf16, stage 3 3Ψ(N-1)/N (A = 1) less the
        // last of the 34 equal units, gathered once for its forward and backward, plus
        // the padding of the units; the ledger's own count is within 0.01%.
        let k = if s == 3 { 3.0 - 1.0 / 34.0 } else { 2.0 };
        let paper = k * psi * (n - 1.0) / n * 2.0;
        let sent = p.get("comm_sent_bytes").num();
        assert!(
            sent >= paper && sent <= paper * 1.0001,
            "stage {s}: sent {sent} vs paper {paper}"
        );
        assert!(p.get("est_comm_seconds").num() > 0.0);
    }
    // The summary table shows the formula values as the paper's GB.
    for gb in ["120.00 GB", "31.41 GB", "16.64 GB", "1.88 GB"] {
        assert!(text.contains(gb), "summary shows {gb}:\n{text}");
    }
}

#[test]
fn seventy_b_on_512_gpus_says_which_stages_fit() {
    let (doc, text) = run_json(
        &["--params", "70e9", "--gpus", "512", "--gpu-mem", "80GiB"],
        "70b",
    );
    let usable = doc.get("usable_bytes").num();
    assert_eq!(doc.get("gpu_mem_bytes").num(), (80u64 << 30) as f64);
    assert!(usable < (80u64 << 30) as f64, "a headroom is kept");
    let points = doc.get("points").arr();
    let fits: Vec<bool> = points.iter().map(|p| p.get("fits").bool()).collect();
    for p in points {
        assert_eq!(p.get("fits").bool(), p.get("plan_bytes").num() <= usable);
    }
    // 16Ψ = 1.12 TB, 4Ψ = 280 GB, 2Ψ = 140 GB cannot fit in 80 GiB; 16Ψ/N = 2.2 GB can.
    assert_eq!(fits, [false, false, false, true], "\n{text}");
    assert!(text.contains("N = 512: fits with ZeRO-3"), "\n{text}");
    assert!(
        text.contains("recommend ZeRO-3: the lowest stage that fits (ZeRO-0 needs"),
        "\n{text}"
    );
}

/// fp32 is planned against the fp32 formula (no master copy: stage 1 = 4Ψ + 4Ψ + 8Ψ/N),
/// with the paper's mixed-precision formula beside it.
#[test]
fn fp32_plans_use_the_fp32_formula_with_the_papers_beside_it() {
    let (doc, text) = run_json(
        &["--params", "7.5e9", "--gpus", "64", "--precision", "fp32"],
        "fp32",
    );
    let psi = 7.5e9;
    let points = doc.get("points").arr();
    let f = |i: usize, key: &str| points[i].get(key).num();
    assert_eq!(f(1, "formula_bytes"), 8.0 * psi + 8.0 * psi / 64.0);
    assert_eq!(f(1, "paper_formula_bytes"), 4.0 * psi + 12.0 * psi / 64.0);
    assert_eq!(points[1].get("formula").str(), "4Ψ + 4Ψ + 8Ψ/N");
    assert!(text.contains("4Ψ + 4Ψ + 8Ψ/N = 60.94 GB"), "\n{text}");
    assert!(text.contains("2Ψ + 2Ψ + 12Ψ/N = 31.41 GB"), "\n{text}");
}

#[test]
fn table_over_n_and_verbose_details() {
    let out = run(&[
        "--model",
        "gpt2-124m",
        "--gpus",
        "1,8,64",
        "--stage",
        "3",
        "--verbose",
    ]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    for n in ["N = 1, ZeRO-3", "N = 8, ZeRO-3", "N = 64, ZeRO-3"] {
        assert!(text.contains(n), "verbose section {n}:\n{text}");
    }
    for needle in [
        "activations",
        "gather_forward",
        "alpha-beta",
        "total difference",
        "formula for bf16 16Ψ/N",
    ] {
        assert!(
            text.contains(needle),
            "verbose output has {needle}:\n{text}"
        );
    }
}

#[test]
fn bad_inputs_fail_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["--params", "7.5e9", "--gpus", "0"], "at least 1"),
        (&["--params", "-1", "--gpus", "8"], "-1"),
        (&["--model", "gpt5", "--gpus", "8"], "gpt5"),
        (
            &["--params", "7.5e9", "--gpus", "8", "--gpu-mem", "eighty"],
            "eighty",
        ),
        (
            &[
                "--params",
                "7.5e9",
                "--gpus",
                "8",
                "--gpu-mem",
                "80 parsecs",
            ],
            "parsecs",
        ),
        (&["--params", "7.5e9"], "--gpus"),
        (
            &["--params", "7.5e9", "--gpus", "8", "--stage", "4"],
            "stage",
        ),
        (
            &["--model", "gpt2-124m", "--gpus", "8", "--seq-len", "4096"],
            "4096",
        ),
        (
            &["--params", "7.5e9", "--gpus", "64", "--ranks-per-node", "7"],
            "--ranks-per-node 7",
        ),
        (
            &["--params", "7.5e9", "--gpus", "64", "--inter-gbps", "100"],
            "--ranks-per-node",
        ),
        // Far above any model: refused at once, not planned for minutes (or aborted).
        (&["--params", "1e16", "--gpus", "8"], "at most 1e15"),
        (
            &["--params", "1e18", "--gpus", "1", "--units", "1"],
            "at most 1e15",
        ),
        (
            &["--params", "1e15", "--gpus", "8", "--units", "1e6"],
            "--units 1e6: at most 100000",
        ),
        // --model only: a bare parameter count has no blocks to checkpoint (it was
        // accepted and ignored).
        (
            &[
                "--params",
                "7.5e9",
                "--gpus",
                "8",
                "--checkpoint-every",
                "2",
            ],
            "'--checkpoint-every <CHECKPOINT_EVERY>'",
        ),
    ];
    for (args, needle) in cases {
        let out = run(args);
        let err = stderr(&out);
        assert!(
            !out.status.success(),
            "{args:?} should fail:\n{}",
            stdout(&out)
        );
        assert!(
            err.contains(needle),
            "{args:?}: message names '{needle}':\n{err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("stack backtrace"),
            "{args:?}: no panic:\n{err}"
        );
    }
}

/// `plan` allocates nothing: the largest plans it takes (1e15 parameters in one unit,
/// buckets of one element per rank, 1e5 units on 2^18 GPUs with every ZeRO++ switch) run
/// in a process limited to 512 MiB of address space. (Its chunk counts were once built
/// as ranges only to be counted: 3.8 GB for 1e15 in one unit, 1e18 aborted.)
#[test]
fn the_largest_plans_fit_in_512_mib() {
    use std::os::unix::process::CommandExt;
    let cases: &[&[&str]] = &[
        &["--params", "1e15", "--gpus", "1", "--units", "1"],
        &[
            "--params",
            "1e15",
            "--gpus",
            "1",
            "--units",
            "1",
            "--quantize-grads",
        ],
        &[
            "--params",
            "1e15",
            "--gpus",
            "8",
            "--bucket-elems",
            "8",
            "--reduce-f32",
        ],
        &[
            "--params",
            "1e15",
            "--gpus",
            "262144",
            "--units",
            "100000",
            "--ranks-per-node",
            "8",
            "--quantize-grads",
            "--quantize-weights",
            "--hierarchical-weights",
        ],
    ];
    for args in cases {
        let mut cmd = Command::new(zero_bench());
        cmd.arg("plan").args(*args).env("RUST_BACKTRACE", "1");
        // SAFETY: setrlimit only, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 512 << 20,
                    rlim_max: 512 << 20,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().expect("zero-bench starts");
        assert!(
            out.status.success(),
            "plan {args:?} in 512 MiB:\n{}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(stdout(&out).contains("stage"), "{}", stdout(&out));
    }
}

/// `--json` that cannot be written (a directory, a missing directory) is refused before
/// the plan is printed, not after it.
#[test]
fn an_unwritable_json_is_refused_before_the_report() {
    let dir = std::env::temp_dir().join(format!("plan_cli_json_dir_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_string_lossy().into_owned();
    let missing = dir.join("absent").join("plan.json");
    let m = missing.to_string_lossy().into_owned();
    for (path, needle) in [(&d, "is a directory"), (&m, "cannot write a file in")] {
        let out = run(&["--params", "7.5e9", "--gpus", "8", "--json", path]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("--json") && err.contains(needle), "{err}");
        assert!(
            stdout(&out).is_empty(),
            "no report first:\n{}",
            stdout(&out)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// ZeRO++ on 8 nodes of 8 GPUs: with --ranks-per-node the traffic is split by group
/// (hpZ's backward gathers on the node, qgZ's second exchange across nodes), the bytes
/// leaving each node fall with the three switches at stage 3 from (N-1)/N (2 + 2 + 4)Ψ
/// (bf16 weights, f32 reductions) to about (N-1)/N Ψ + (M-1)/M Ψ: 4.14x here (>= 3.5x);
/// with bf16 reductions from (6 - 2/34)Ψ (N-1)/N (the backward does not gather the last
/// of the 34 units again): 3.10x with int8 gradient codes, 4.03x with int4 (as the paper
/// counts). The estimate charges the slow inter-node link and drops with them.
#[test]
fn zeropp_switches_split_the_traffic_by_node() {
    let base = [
        "--params",
        "7.5e9",
        "--gpus",
        "64",
        "--stage",
        "3",
        "--ranks-per-node",
        "8",
        "--intra-gbps",
        "2400",
        "--inter-gbps",
        "100",
        "--reduce-f32",
    ];
    let (flat, _) = run_json(&base, "flat");
    let mut all = base.to_vec();
    all.extend([
        "--quantize-weights",
        "--hierarchical-weights",
        "--quantize-grads",
    ]);
    let (zpp, text) = run_json(&all, "zeropp");
    let point = |doc: &Json| doc.get("points").arr()[0].clone();
    let (f, z) = (point(&flat), point(&zpp));
    assert_eq!(z.get("ranks_per_node").num(), 8.0);
    let (fe, ze) = (
        f.get("node_egress_bytes").num(),
        z.get("node_egress_bytes").num(),
    );
    assert!(fe / ze >= 3.5, "{fe} vs {ze}\n{text}");
    let bf16 = |extra: &[&str], tag| {
        let mut args: Vec<&str> = base
            .iter()
            .copied()
            .filter(|a| *a != "--reduce-f32")
            .collect();
        args.extend(extra);
        point(&run_json(&args, tag).0)
            .get("node_egress_bytes")
            .num()
    };
    let cut = bf16(&[], "flat16")
        / bf16(
            &[
                "--quantize-weights",
                "--hierarchical-weights",
                "--quantize-grads",
            ],
            "zpp16",
        );
    assert!((cut - 3.10).abs() < 0.01, "bf16 reductions: {cut:.3}x");
    // int4 gradient codes, as the paper counts: >= 4x with bf16 reductions too.
    let cut4 = bf16(&[], "flat16b")
        / bf16(
            &[
                "--quantize-weights",
                "--hierarchical-weights",
                "--quantize-grads",
                "--grad-quant-bits",
                "4",
            ],
            "zpp16int4",
        );
    assert!(cut4 >= 4.0, "bf16 reductions, int4 codes: {cut4:.3}x");
    let groups: Vec<(String, String)> = z
        .get("comm")
        .arr()
        .iter()
        .map(|l| {
            (
                l.get("purpose").str().to_string(),
                l.get("group").str().to_string(),
            )
        })
        .collect();
    assert!(
        groups.contains(&("gather_backward".into(), "node".into())),
        "{groups:?}"
    );
    assert!(
        groups.contains(&("grads".into(), "cross".into())),
        "{groups:?}"
    );
    assert!(
        !groups.contains(&("gather_backward".into(), "world".into())),
        "{groups:?}"
    );
    assert!(text.contains("8 nodes of 8: per step ZeRO-3"), "{text}");
    // Every line's seconds add up to the estimate.
    let sum: f64 = z
        .get("comm")
        .arr()
        .iter()
        .map(|l| l.get("seconds").num())
        .sum();
    let est = z.get("est_comm_seconds").num();
    assert!((sum - est).abs() <= 1e-9 * est, "{sum} vs {est}");
    assert!(est < f.get("est_comm_seconds").num(), "{text}");
}

/// A JSON value: enough of RFC 8259 to check `--json` is valid and read numbers.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn parse(s: &str) -> Result<Json, String> {
        let mut p = Parser {
            b: s.as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.b.len() {
            return Err(format!("trailing characters at byte {}", p.i));
        }
        Ok(v)
    }

    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(kv) => kv
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("no key '{key}'")),
            other => panic!("'{key}' looked up in a non-object {other:?}"),
        }
    }

    fn num(&self) -> f64 {
        match self {
            Json::Num(x) => *x,
            other => panic!("not a number: {other:?}"),
        }
    }

    fn bool(&self) -> bool {
        match self {
            Json::Bool(x) => *x,
            other => panic!("not a bool: {other:?}"),
        }
    }

    fn str(&self) -> &str {
        match self {
            Json::Str(x) => x,
            other => panic!("not a string: {other:?}"),
        }
    }

    fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(x) => x,
            other => panic!("not an array: {other:?}"),
        }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\n' | b'\r' | b'\t') {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.b.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut kv = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(kv));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.eat(b':')?;
                    kv.push((k, self.value()?));
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(kv));
                        }
                        _ => return Err(format!("expected ',' or '}}' at byte {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(v));
                }
                loop {
                    v.push(self.value()?);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(v));
                        }
                        _ => return Err(format!("expected ',' or ']' at byte {}", self.i)),
                    }
                }
            }
            Some(b'"') => self.string().map(Json::Str),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'n') => self.word("null", Json::Null),
            Some(_) => self.number(),
            None => Err("unexpected end".into()),
        }
    }

    fn word(&mut self, w: &str, v: Json) -> Result<Json, String> {
        if self.b[self.i..].starts_with(w.as_bytes()) {
            self.i += w.len();
            Ok(v)
        } else {
            Err(format!("bad literal at byte {}", self.i))
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.i;
        while self.i < self.b.len()
            && matches!(
                self.b[self.i],
                b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
            )
        {
            self.i += 1;
        }
        let t = std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?;
        // JSON numbers: no leading '+', no leading zeros, digits around '.'.
        let body = t.strip_prefix('-').unwrap_or(t).as_bytes();
        let leading_zero = body.len() > 1 && body[0] == b'0' && body[1].is_ascii_digit();
        let ok = body.first().is_some_and(u8::is_ascii_digit) && !t.ends_with('.') && !leading_zero;
        match t.parse::<f64>() {
            Ok(x) if ok => Ok(Json::Num(x)),
            _ => Err(format!("bad number '{t}' at byte {start}")),
        }
    }

    fn string(&mut self) -> Result<String, String> {
        if self.b.get(self.i) != Some(&b'"') {
            return Err(format!("expected a string at byte {}", self.i));
        }
        self.i += 1;
        let mut out = Vec::new();
        loop {
            match self.b.get(self.i) {
                None => return Err("unterminated string".into()),
                Some(b'"') => {
                    self.i += 1;
                    return String::from_utf8(out).map_err(|e| e.to_string());
                }
                Some(b'\\') => {
                    let esc = *self.b.get(self.i + 1).ok_or("dangling escape")?;
                    self.i += 2;
                    let c = match esc {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hex = self.b.get(self.i..self.i + 4).ok_or("short \\u escape")?;
                            let code = u32::from_str_radix(
                                std::str::from_utf8(hex).map_err(|e| e.to_string())?,
                                16,
                            )
                            .map_err(|e| e.to_string())?;
                            self.i += 4;
                            char::from_u32(code).unwrap_or('\u{fffd}')
                        }
                        other => return Err(format!("bad escape '\\{}'", other as char)),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                Some(&c) if c < 0x20 => {
                    return Err(format!("control character in a string at byte {}", self.i))
                }
                Some(&c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }
}

#[test]
fn the_json_checker_refuses_invalid_json() {
    assert!(Json::parse(r#"{"a": [1, 2.5e3, -0.5, true, null, "x\"y"]}"#).is_ok());
    for bad in [
        r#"{"a": 1,}"#,
        r#"{"a" 1}"#,
        "[01]",
        "[1.]",
        r#"{"a": NaN}"#,
        "[1] x",
        r#""unterminated"#,
    ] {
        assert!(Json::parse(bad).is_err(), "'{bad}' refused");
    }
}
