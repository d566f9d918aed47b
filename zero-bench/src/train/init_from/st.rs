//! safetensors model files for `--init-from`: one file, or Hugging Face's sharded layout
//! (an index `model.safetensors.index.json` whose `weight_map` names the shard of each
//! tensor, beside the shards).
//!
//! The format: an 8-byte little-endian header length n, n bytes of JSON (each tensor's
//! `dtype`, `shape` and `data_offsets` [begin, end) into the data section), then the data,
//! row-major, little-endian. Every file is memory-mapped and only its header is parsed
//! when opened (the `safetensors` crate checks it); elements are read, and widened to f32,
//! when a rank asks for them, so a rank touches only the pages of what it keeps.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use memmap2::Mmap;
use safetensors::tensor::{Metadata, SafeTensors, TensorInfo};
use safetensors::Dtype;

use super::{Elem, Entry};

/// One mapped file.
struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Offset of the data section: 8 + the header's length.
    data_start: usize,
    meta: Metadata,
}

impl Shard {
    fn open(path: &Path) -> anyhow::Result<Shard> {
        let file = std::fs::File::open(path)
            .with_context(|| format!("opening the model file {} (safetensors)", path.display()))?;
        // SAFETY: the map is read-only; a file truncated under us by another process would
        // fault (the standard caveat of memory-mapped input, as the safetensors Python
        // loader's own mmap).
        let map =
            unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
            anyhow::anyhow!(
                "{} is not a valid safetensors file: {e:?} (header, offsets and size must agree)",
                path.display()
            )
        })?;
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            data_start: 8 + n,
            meta,
        })
    }
}

/// Where an entry's data is.
struct At {
    shard: usize,
    /// Byte offset of its first element in the shard's map.
    begin: usize,
    dtype: Dtype,
}

/// One or several mapped safetensors files and their tensors.
pub struct StFile {
    shards: Vec<Shard>,
    entries: Vec<Entry>,
    at: Vec<At>,
    sharded: bool,
}

fn elem(dtype: Dtype) -> Result<Elem, String> {
    match dtype {
        Dtype::F32 => Ok(Elem::F32),
        Dtype::F16 => Ok(Elem::F16),
        Dtype::BF16 => Ok(Elem::Bf16),
        other => Err(format!(
            "{other:?}, which --init-from does not read (F32, F16 and BF16 it does; convert \
             the tensor, e.g. with torch: t.float())"
        )),
    }
}

/// Entry `name` of shard `s` (`shard`), and where its data is.
fn entry(s: usize, shard: &Shard, name: &str, info: &TensorInfo) -> (Entry, At) {
    (
        Entry {
            name: name.to_string(),
            shape: info.shape.clone(),
            elem: elem(info.dtype),
        },
        At {
            shard: s,
            begin: shard.data_start + info.data_offsets.0,
            dtype: info.dtype,
        },
    )
}

impl StFile {
    /// One safetensors file.
    pub fn open(path: &Path) -> anyhow::Result<StFile> {
        let shard = Shard::open(path)?;
        let mut tensors: Vec<(String, &TensorInfo)> = shard.meta.tensors().into_iter().collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let (entries, at) = tensors
            .iter()
            .map(|(name, info)| entry(0, &shard, name, info))
            .unzip();
        Ok(StFile {
            shards: vec![shard],
            entries,
            at,
            sharded: false,
        })
    }

    /// The shards an index names, with the tensors of its `weight_map`.
    pub fn open_index(index: &Path) -> anyhow::Result<StFile> {
        let text = std::fs::read_to_string(index)
            .with_context(|| format!("reading the safetensors index {}", index.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", index.display()))?;
        let Some(map) = json.get("weight_map").and_then(|m| m.as_object()) else {
            bail!(
                "{} has no \"weight_map\" object (tensor name -> shard file), as Hugging Face \
                 writes in model.safetensors.index.json",
                index.display()
            );
        };
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut st = StFile {
            shards: Vec::new(),
            entries: Vec::new(),
            at: Vec::new(),
            sharded: true,
        };
        let mut shard_of: HashMap<&str, usize> = HashMap::new();
        let mut absent = Vec::new();
        let mut names: Vec<(&String, &serde_json::Value)> = map.iter().collect();
        names.sort_by(|a, b| a.0.cmp(b.0));
        for (name, file) in names {
            let Some(file) = file.as_str() else {
                bail!(
                    "{}: weight_map[\"{name}\"] is {file}, not a file name",
                    index.display()
                );
            };
            let s = match shard_of.get(file) {
                Some(&s) => s,
                None => {
                    st.shards
                        .push(Shard::open(&dir.join(file)).with_context(|| {
                            format!("{}: opening the shard of '{name}'", index.display())
                        })?);
                    shard_of.insert(file, st.shards.len() - 1);
                    st.shards.len() - 1
                }
            };
            let shard = &st.shards[s];
            match shard.meta.info(name) {
                Some(info) => {
                    let (e, at) = entry(s, shard, name, info);
                    st.entries.push(e);
                    st.at.push(at);
                }
                None => absent.push(format!("{name} (in {file})")),
            }
        }
        if !absent.is_empty() {
            bail!(
                "{}: {} tensor(s) of the weight_map are not in the shard it names: {}",
                index.display(),
                absent.len(),
                absent.join(", ")
            );
        }
        Ok(st)
    }

    /// "safetensors" or "sharded safetensors".
    pub fn kind(&self) -> &'static str {
        if self.sharded {
            "sharded safetensors"
        } else {
            "safetensors"
        }
    }

    /// The tensors of every file.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Elements `range` (flat, row-major) of entry `entry`, widened to f32, into `out`.
    pub fn read(&self, entry: usize, range: Range<usize>, out: &mut [f32]) -> anyhow::Result<()> {
        let at = &self.at[entry];
        let shard = &self.shards[at.shard];
        let size = at.dtype.size();
        let bytes = shard
            .map
            .get(at.begin + range.start * size..at.begin + range.end * size)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "{}: elements {}..{} of '{}' lie past the end of the file",
                    shard.path.display(),
                    range.start,
                    range.end,
                    self.entries[entry].name
                )
            })?;
        let e = self.entries[entry]
            .elem
            .as_ref()
            .map_err(|what| anyhow::anyhow!("'{}' is {what}", self.entries[entry].name))?;
        // Little-endian elements at any byte alignment (the header's length need not be
        // a multiple of 4), so each is assembled from its bytes.
        match e {
            Elem::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Elem::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
            Elem::Bf16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A safetensors file of (name, dtype, shape, little-endian bytes), by hand (also
    /// mod.rs's tests).
    pub(in super::super) fn write(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
            );
            data.extend_from_slice(bytes);
        }
        // An odd header length: elements are not 4-byte aligned in the file.
        let mut h = serde_json::Value::Object(header).to_string();
        if (8 + h.len()).is_multiple_of(2) {
            h.push(' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(&data);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn reads_f32_f16_bf16_ranges_at_any_alignment() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        let x = [1.5f32, -2.25, 3.0e-3, 7.0];
        let f32s: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16s: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        let bf16s: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect();
        write(
            &p,
            &[
                ("a", "F32", vec![2, 2], f32s),
                ("b", "F16", vec![4], f16s),
                ("c", "BF16", vec![4], bf16s),
                ("d", "I64", vec![1], vec![0; 8]),
            ],
        );
        let st = StFile::open(&p).unwrap();
        let names: Vec<&str> = st.entries().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        assert!(st.entries()[3]
            .elem
            .as_ref()
            .unwrap_err()
            .starts_with("I64"));
        let mut out = [0.0f32; 3];
        st.read(0, 1..4, &mut out).unwrap();
        assert_eq!(out, [x[1], x[2], x[3]]);
        st.read(1, 0..3, &mut out).unwrap();
        let want: Vec<f32> = x[..3]
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect();
        assert_eq!(out.to_vec(), want);
        st.read(2, 1..4, &mut out).unwrap();
        let want: Vec<f32> = x[1..]
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(out.to_vec(), want);
        assert!(st.read(3, 0..1, &mut out[..1]).is_err());
    }

    #[test]
    fn an_index_names_the_shard_of_each_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let bytes = |v: f32| v.to_le_bytes().to_vec();
        write(
            &d.join("one.safetensors"),
            &[("a", "F32", vec![1], bytes(1.0))],
        );
        write(
            &d.join("two.safetensors"),
            &[("b", "F32", vec![1], bytes(2.0))],
        );
        let index = d.join("model.safetensors.index.json");
        std::fs::write(
            &index,
            r#"{"metadata": {}, "weight_map": {"b": "two.safetensors", "a": "one.safetensors"}}"#,
        )
        .unwrap();
        let st = StFile::open_index(&index).unwrap();
        let mut out = [0.0f32];
        st.read(1, 0..1, &mut out).unwrap();
        assert_eq!((st.entries()[1].name.as_str(), out[0]), ("b", 2.0));
        std::fs::write(&index, r#"{"weight_map": {"b": "one.safetensors"}}"#).unwrap();
        let e = StFile::open_index(&index).err().unwrap();
        assert!(format!("{e:#}").contains("b (in one.safetensors)"), "{e:#}");
    }
}
