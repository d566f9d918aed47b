//! `zero-bench ckpt` as users run it (plain process, no MPI) on a checkpoint that a real
//! 3-rank job saved: inspect (exit 0, then exit 1 naming the dataset after a bit flip),
//! consolidate (h5py reads it with nothing but numpy; refuses to overwrite), export
//! --safetensors (each tensor under its name holds exactly the saved master weights of
//! that name, element by element; hf-gpt2 names hold the Conv1D weights transposed).
//!
//! The binary is `zero-bench` next to this test's `deps/` directory; build it first with
//! `cargo build -p zero-bench --release` (scripts/test.sh does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use zero_tests::safetensors_files::read_st;
use zero_tests::MpiJob;

fn ckpt(args: &[&str]) -> Output {
    zero_tests::cli::command("ckpt", args)
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The JSON header and the data section of a safetensors file.
fn safetensors(path: &Path) -> (String, Vec<u8>) {
    let bytes = std::fs::read(path).expect("read the safetensors file");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8-byte header length")) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).expect("UTF-8 header");
    (header, bytes[8 + n..].to_vec())
}

fn sorted_bits(values: impl Iterator<Item = f32>) -> Vec<u32> {
    let mut v: Vec<u32> = values.map(f32::to_bits).collect();
    v.sort_unstable();
    v
}

/// The block weights HF's GPT-2 stores as Conv1D, [in, out] (zero-models/src/names.rs).
const CONV1D: [&str; 4] = [
    "attn.c_attn.weight",
    "attn.c_proj.weight",
    "mlp.c_fc.weight",
    "mlp.c_proj.weight",
];

/// The scenario's `saved-master-by-name.txt`: per tensor, `name v v ...`, as bit patterns.
fn saved_by_name(path: &Path) -> BTreeMap<String, Vec<u32>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next().expect("a name").to_string();
            let bits = words
                .map(|w| w.parse::<f32>().expect("a float").to_bits())
                .collect();
            (name, bits)
        })
        .collect()
}

/// `got` has exactly `want`'s names, each with its values bit for bit.
fn assert_same_tensors(
    what: &str,
    got: &BTreeMap<String, Vec<u32>>,
    want: &BTreeMap<String, Vec<u32>>,
) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: the tensor names"
    );
    for (name, bits) in want {
        assert!(
            got[name] == *bits,
            "{what}: {name} does not hold the saved master weights of that name"
        );
    }
}

#[test]
fn inspect_consolidate_export_a_saved_checkpoint() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ckpt-cli");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("scratch directory");
    let r = root.join("run");
    let p = r.to_str().expect("UTF-8 path");
    MpiJob::new(3, env!("CARGO_BIN_EXE_ckpt_scenario"))
        .args(["save", p, "2", "2"])
        .timeout(Duration::from_secs(60))
        .run()
        .assert_all_ok();

    let out = ckpt(&["inspect", p]);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("step         3") && t.contains("3 ranks, stage Zero2"),
        "{t}"
    );
    assert!(t.contains("checksums    all hold"), "{t}");

    let h5 = root.join("model.h5");
    let h5s = h5.to_str().expect("UTF-8 path");
    let out = ckpt(&["consolidate", p, h5s]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("wrote 28 tensors"), "{}", text(&out));
    let out = ckpt(&["consolidate", p, h5s]);
    assert!(
        !out.status.success(),
        "overwrote an existing file: {}",
        text(&out)
    );
    assert!(text(&out).contains("model.h5"), "{}", text(&out));

    // h5py, with nothing but numpy, reads the consolidated file as it is: one f32
    // dataset per tensor at the root, named and shaped as docs/ARCHITECTURE.md says, each
    // holding exactly the saved master weights of its name.
    let saved = saved_by_name(&r.join("saved-master-by-name.txt"));
    assert_eq!(saved.len(), 28, "the scenario wrote 28 tensors");
    // The engine-order dump holds the same values (the two files agree on the run).
    let flat: Vec<f32> = std::fs::read_to_string(r.join("saved-master.txt"))
        .expect("the scenario wrote the saved master")
        .lines()
        .map(|l| l.parse().expect("a float"))
        .collect();
    assert_eq!(
        sorted_bits(flat.iter().copied()),
        sorted_bits(saved.values().flatten().map(|&b| f32::from_bits(b))),
        "saved-master.txt and saved-master-by-name.txt"
    );
    let raw = root.join("h5py-values.bin");
    let script = format!(
        "import h5py, numpy as np\n\
         f = h5py.File({h5s:?}, 'r')\n\
         names = sorted(f.keys())\n\
         assert all(f[n].dtype == np.float32 for n in names), [f[n].dtype for n in names]\n\
         print(len(names), f['h.0.attn.c_attn.weight'].shape, f['wte'].shape, f['ln_f.bias'].shape)\n\
         print(' '.join(n + ':' + str(f[n].size) for n in names))\n\
         np.concatenate([f[n][()].ravel() for n in names]).astype('<f4').tofile({raw:?})\n",
        raw = raw.to_str().expect("UTF-8 path")
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3 starts (scripts/setup.sh --python installs h5py)");
    assert!(
        out.status.success(),
        "h5py could not read the consolidated file (run scripts/setup.sh --python for h5py):\n{}",
        text(&out)
    );
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = printed.lines();
    assert_eq!(
        lines.next().map(str::trim),
        Some("28 (96, 32) (64, 32) (32,)"),
        "{}",
        text(&out)
    );
    let sizes: Vec<(String, usize)> = lines
        .next()
        .unwrap_or_else(|| panic!("no name list from h5py: {}", text(&out)))
        .split_whitespace()
        .map(|w| {
            let (name, n) = w.rsplit_once(':').expect("name:size");
            (name.to_string(), n.parse().expect("a size"))
        })
        .collect();
    let read = std::fs::read(&raw).expect("python wrote the values");
    let mut values = read
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    let h5py: BTreeMap<String, Vec<u32>> = sizes
        .into_iter()
        .map(|(name, n)| (name, values.by_ref().take(n).collect()))
        .collect();
    assert_eq!(
        values.next(),
        None,
        "h5py wrote more values than its tensors hold"
    );
    assert_same_tensors("h5py", &h5py, &saved);

    // Export: every tensor under its name holds the saved master weights; under hf-gpt2
    // names the four linear weights of each block are Conv1D's [in, out], the transpose.
    for (names, conv1d) in [("nanogpt", "[96,32]"), ("hf-gpt2", "[32,96]")] {
        let st = root.join(format!("model-{names}.safetensors"));
        let out = ckpt(&[
            "export",
            "--safetensors",
            "--names",
            names,
            p,
            st.to_str().expect("UTF-8"),
        ]);
        assert!(out.status.success(), "{}", text(&out));
        let (header, _) = safetensors(&st);
        let attn = format!("\"h.0.attn.c_attn.weight\":{{\"dtype\":\"F32\",\"shape\":{conv1d}");
        assert!(header.contains(&attn), "{names}: {header}");
        let mut exported = BTreeMap::new();
        for (name, t) in read_st(&st) {
            assert_eq!(t.dtype, "F32", "{names}: {name}");
            let bits: Vec<u32> = t.f32s().iter().map(|x| x.to_bits()).collect();
            let ours = match (names, name.as_str()) {
                ("hf-gpt2", "wte.weight") => "wte".to_string(),
                ("hf-gpt2", "wpe.weight") => "wpe".to_string(),
                _ => name.clone(),
            };
            let conv = names == "hf-gpt2" && CONV1D.iter().any(|w| name.ends_with(w));
            let bits = if conv {
                // [in, out] in the file: element (i, o) is ours (o, i).
                let &[rows_in, cols_out] = t.shape.as_slice() else {
                    panic!("{names}: {name} has shape {:?}", t.shape)
                };
                (0..cols_out)
                    .flat_map(|o| (0..rows_in).map(move |i| (i, o)))
                    .map(|(i, o)| bits[i * cols_out + o])
                    .collect()
            } else {
                bits
            };
            assert!(
                exported.insert(ours, bits).is_none(),
                "{names}: {name} twice"
            );
        }
        assert_same_tensors(names, &exported, &saved);
    }

    // A flipped bit: inspect exits non-zero and names the file and dataset.
    let f = r.join("step-3").join("rank-00002.h5");
    let mut bytes = std::fs::read(&f).expect("read shard");
    // The middle of the file: the three datasets of each unit fill ~90% of it.
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&f, bytes).expect("write shard");
    let out = ckpt(&["inspect", p]);
    assert!(!out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("rank-00002.h5") && t.contains("checksum mismatch"),
        "{t}"
    );
    let out = ckpt(&["inspect", root.join("absent").to_str().expect("UTF-8")]);
    assert!(
        !out.status.success() && text(&out).contains("absent"),
        "{}",
        text(&out)
    );
}
