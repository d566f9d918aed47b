//! What the header says about the machine: the NVIDIA driver, the CUDA version its
//! driver API reports, cuBLASLt's and NCCL's versions, glibc's, and the script's timeout:
//! a failure is read against these. Each is asked of the library itself (loaded here by
//! the names cudarc tries, in its order: the one it loads), and left out where it cannot
//! be found; the file each came from goes into the JSON too.

use std::ffi::{c_int, CStr, CString};

use serde_json::{Map, Value};

/// The versions found, as `name: text`; `cuda`: whether to look for the CUDA libraries.
pub fn describe(cuda: bool, budget_s: f64) -> Value {
    let mut m = Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            m.insert(k.to_string(), Value::from(v));
        }
    };
    if cuda {
        put("driver", nvidia_driver());
        for (key, found) in [
            ("cuda_driver_api", cuda_driver_api()),
            ("cublaslt", cublaslt()),
            ("nccl", nccl()),
        ] {
            let (version, file) = found.unzip();
            put(key, version.flatten());
            put(&format!("{key}_file"), file.flatten());
        }
    }
    put("glibc", glibc());
    put("budget_s", Some(format!("{budget_s:.0}")));
    // The script's kill limit (scripts/gpu-check.sh exports it).
    put("timeout_s", std::env::var("GPU_CHECK_TIMEOUT").ok());
    Value::Object(m)
}

/// The header's one line of it: `driver 575.57, CUDA 12.9, ...`.
pub fn line(env: &Value) -> String {
    let Some(m) = env.as_object() else {
        return String::new();
    };
    let part = |k: &str, label: &str| {
        m.get(k)
            .and_then(Value::as_str)
            .map(|v| format!("{label} {v}"))
    };
    [
        part("driver", "driver"),
        part("cuda_driver_api", "CUDA"),
        part("cublaslt", "cuBLASLt"),
        part("nccl", "NCCL"),
        part("glibc", "glibc"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ")
}

/// The kernel module's version (`/proc/driver/nvidia/version`: "NVRM version: NVIDIA
/// UNIX x86_64 Kernel Module  575.57.08  ...").
fn nvidia_driver() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    let line = text.lines().find(|l| l.contains("NVRM version"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "Module")?;
    words.get(at + 1).map(|v| v.to_string())
}

/// The names cudarc (0.19, `get_lib_name_candidates`) tries for library `name`, in its
/// order, as built here: 64-bit, CUDA 13.0 (the workspace Cargo.toml's `cuda-13000`).
/// The first that loads is the one cudarc uses: `libX.so` before `libX.so.13` and
/// `libX.so.12`, and no `libnccl.so.2` (scripts/gpu-check.sh links `libnccl.so` to it).
fn cudarc_names(name: &str) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX as P, DLL_SUFFIX as S};
    let (major, minor) = (13, 0);
    [
        format!("{P}{name}{S}"),
        format!("{P}{name}64{S}"),
        format!("{P}{name}64_{major}{S}"),
        format!("{P}{name}64_{major}{minor}{S}"),
        format!("{P}{name}64_{major}{minor}_0{S}"),
        format!("{P}{name}64_{major}0_{minor}{S}"),
        format!("{P}{name}64_10{S}"),
        format!("{P}{name}64_11{S}"),
        format!("{P}{name}64_12{S}"),
        format!("{P}{name}64_{major}0_0{S}"),
        format!("{P}{name}64_9{S}"),
        format!("{P}{name}{S}.{major}"),
        format!("{P}{name}{S}.12"),
        format!("{P}{name}{S}.11"),
        format!("{P}{name}{S}.10"),
        format!("{P}{name}{S}.9"),
        format!("{P}{name}{S}.1"),
    ]
    .into()
}

/// A library opened by the first of `names` that loads; closed on drop.
struct Library(*mut libc::c_void);

impl Library {
    fn open(names: &[String]) -> Option<Library> {
        names.iter().find_map(|name| {
            let c = CString::new(name.as_str()).ok()?;
            // SAFETY: a NUL-terminated name; dlopen runs the library's initialisers,
            // which the CUDA libraries' loading (cudarc's) runs anyway.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            (!h.is_null()).then_some(Library(h))
        })
    }

    /// The address of `symbol`, if the library has it.
    fn symbol(&self, symbol: &str) -> Option<*mut libc::c_void> {
        let c = CString::new(symbol).ok()?;
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        (!p.is_null()).then_some(p)
    }
}

/// The file the library holding `symbol` was loaded from.
fn file_of(symbol: *mut libc::c_void) -> Option<String> {
    // SAFETY: Dl_info is plain data (pointers), filled in by dladdr.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: an address dlsym gave, of a library still open.
    let found = unsafe { libc::dladdr(symbol, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, owned by the loader while the library is open.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

impl Drop for Library {
    fn drop(&mut self) {
        // SAFETY: a handle dlopen gave, closed once; nothing of it is used after.
        unsafe { libc::dlclose(self.0) };
    }
}

/// `major.minor` of a version number `major * 1000 + minor * 10`.
fn thousands(v: c_int) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

/// What a version look-up found: the version (if the call answered) and the file.
type Found = Option<(Option<String>, Option<String>)>;

/// `cuDriverGetVersion`: the CUDA version the driver supports.
fn cuda_driver_api() -> Found {
    let lib = Library::open(&cudarc_names("cuda"))?;
    let f = lib.symbol("cuDriverGetVersion")?;
    let file = file_of(f);
    // SAFETY: CUresult cuDriverGetVersion(int*), the driver API's signature.
    let f: extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
    let mut v: c_int = 0;
    Some(((f(&mut v) == 0).then(|| thousands(v)), file))
}

/// `cublasLtGetVersion`: major * 10000 + minor * 100 + patch.
fn cublaslt() -> Found {
    let lib = Library::open(&cudarc_names("cublasLt"))?;
    let f = lib.symbol("cublasLtGetVersion")?;
    let file = file_of(f);
    // SAFETY: size_t cublasLtGetVersion(void), cuBLASLt's signature.
    let f: extern "C" fn() -> usize = unsafe { std::mem::transmute(f) };
    let v = f();
    let version = format!("{}.{}.{} ({v})", v / 10000, v % 10000 / 100, v % 100);
    Some((Some(version), file))
}

/// `ncclGetVersion`: major * 10000 + minor * 100 + patch (NCCL >= 2.9).
fn nccl() -> Found {
    let lib = Library::open(&cudarc_names("nccl"))?;
    let f = lib.symbol("ncclGetVersion")?;
    let file = file_of(f);
    // SAFETY: ncclResult_t ncclGetVersion(int*), NCCL's signature.
    let f: extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
    let mut v: c_int = 0;
    let version =
        (f(&mut v) == 0).then(|| format!("{}.{}.{} ({v})", v / 10000, v % 10000 / 100, v % 100));
    Some((version, file))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc() -> Option<String> {
    use std::ffi::c_char;
    // SAFETY: returns a static NUL-terminated string.
    let p: *const c_char = unsafe { libc::gnu_get_libc_version() };
    // SAFETY: non-null and NUL-terminated (above).
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc() -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cudarc's order: the unversioned name first, then the CUDA 13 one before 12's.
    #[test]
    fn library_names_in_cudarcs_order() {
        let names = cudarc_names("cublasLt");
        let at = |n: &str| names.iter().position(|x| x == n).unwrap();
        assert_eq!(names[0], "libcublasLt.so");
        assert!(at("libcublasLt.so.13") < at("libcublasLt.so.12"));
        assert!(!cudarc_names("nccl").iter().any(|n| n == "libnccl.so.2"));
        assert!(cudarc_names("cuda").iter().any(|n| n == "libcuda.so.1"));
    }
}
