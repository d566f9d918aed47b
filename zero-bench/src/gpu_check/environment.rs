//! What the header says about the machine: the NVIDIA driver, the CUDA version its
//! driver API reports, cuBLASLt's and NCCL's versions, glibc's, and the script's timeout:
//! a failure is read against these. Each is asked of the library itself (loaded here the
//! way cudarc loads it), and left out where it cannot be found.

use std::ffi::{c_int, CString};

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
        put("cuda_driver_api", cuda_driver_api());
        put("cublaslt", cublaslt());
        put("nccl", nccl());
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

/// A library opened by the first of `names` that loads; closed on drop.
struct Library(*mut libc::c_void);

impl Library {
    fn open(names: &[&str]) -> Option<Library> {
        names.iter().find_map(|name| {
            let c = CString::new(*name).ok()?;
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

/// `cuDriverGetVersion`: the CUDA version the driver supports.
fn cuda_driver_api() -> Option<String> {
    let lib = Library::open(&["libcuda.so.1", "libcuda.so"])?;
    let f = lib.symbol("cuDriverGetVersion")?;
    // SAFETY: CUresult cuDriverGetVersion(int*), the driver API's signature.
    let f: extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
    let mut v: c_int = 0;
    (f(&mut v) == 0).then(|| thousands(v))
}

/// `cublasLtGetVersion`: major * 10000 + minor * 100 + patch.
fn cublaslt() -> Option<String> {
    let lib = Library::open(&["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"])?;
    let f = lib.symbol("cublasLtGetVersion")?;
    // SAFETY: size_t cublasLtGetVersion(void), cuBLASLt's signature.
    let f: extern "C" fn() -> usize = unsafe { std::mem::transmute(f) };
    let v = f();
    Some(format!(
        "{}.{}.{} ({v})",
        v / 10000,
        v % 10000 / 100,
        v % 100
    ))
}

/// `ncclGetVersion`: major * 10000 + minor * 100 + patch (NCCL >= 2.9).
fn nccl() -> Option<String> {
    let lib = Library::open(&["libnccl.so", "libnccl.so.2"])?;
    let f = lib.symbol("ncclGetVersion")?;
    // SAFETY: ncclResult_t ncclGetVersion(int*), NCCL's signature.
    let f: extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(f) };
    let mut v: c_int = 0;
    (f(&mut v) == 0).then(|| format!("{}.{}.{} ({v})", v / 10000, v % 10000 / 100, v % 100))
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn glibc() -> Option<String> {
    use std::ffi::{c_char, CStr};
    // SAFETY: returns a static NUL-terminated string.
    let p: *const c_char = unsafe { libc::gnu_get_libc_version() };
    // SAFETY: non-null and NUL-terminated (above).
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn glibc() -> Option<String> {
    None
}
