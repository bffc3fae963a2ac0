//! Safe Rust API of libkvarn: KV-cache quantization with KVarN (Hadamard rotation, Sinkhorn-like
//! tile normalization, round-to-nearest codes) and attention over the quantized cache.
//!
//! Built on the raw FFI crate `kvarn-sys` (the C header `kvarn/kvarn.h` only). Handles are RAII
//! ([`Context`], [`Cache`]), every fallible call returns [`Result<T>`](Result) with an [`Error`]
//! carrying the library's [`Status`] and message, data passes as slices of `f32`, [`F16`] or
//! [`Bf16`] whose lengths are checked against the shapes (a mismatch is an `Err`, never a panic or
//! an out-of-bounds access), and no `unsafe` is needed by the user.
//!
//! ```
//! # fn main() -> kvarn::Result<()> {
//! use kvarn::{AttentionParams, Cache, CacheOptions, Config, Context};
//!
//! let ctx = Context::cpu()?;
//! let config = Config::from_preset("k4v2_g128", 128)?;
//! let mut cache = Cache::new(&ctx, &CacheOptions::new(config, 2, 8))?; // 2 layers, Hk = 8
//! cache.add_sequence(42)?;
//! let k = vec![0.25f32; 3 * 8 * 128]; // [n_tokens = 3][Hk][D], unrotated
//! let v = vec![-0.5f32; 3 * 8 * 128];
//! for layer in 0..2 {
//!     cache.append(42, layer, &k, &v)?;
//! }
//! let q = vec![0.1f32; 32 * 128]; // decode: [1 token][Hq = 32][D]
//! let mut out = vec![0f32; 32 * 128];
//! cache.attention(1, &[42], &AttentionParams::decode(32), &q, &mut out, None)?;
//! assert!(out.iter().all(|x| (x + 0.5).abs() < 1e-2)); // every value row is -0.5
//! # Ok(()) }
//! ```
//!
//! Thread safety follows docs/API.md: a [`Context`] may be used from one thread at a time, so it
//! is `Send` but not `Sync`; a [`Cache`] borrows its context and is neither.
//!
//! Linking: `kvarn-sys` finds `libkvarn.so` through `KVARN_LIB_DIR` or `pkg-config kvarn`; the
//! loader must find `libkvarn.so.0` at run time (`LD_LIBRARY_PATH` or the system path).

#![deny(missing_docs)]
// The C enums are `c_uint` here but `c_int` on other ABIs: the casts to u32 are deliberate.
#![allow(clippy::unnecessary_cast)]

use std::ffi::CStr;

use kvarn_sys as sys;

mod cache;
mod config;
mod context;
mod dtype;
mod error;

pub use cache::{AttentionMode, AttentionParams, Cache, CacheOptions, CacheStats, SequenceLength};
pub use config::{presets, Config, RecordField};
pub use context::{Context, ContextOptions, Frame};
pub use dtype::{Bf16, Dtype, Element, F16};
pub use error::{Error, Result, Status};

/// Backends (`kvarn_backend_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// A GPU when one is present, else the CPU (only as a request).
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA.
    Cuda,
    /// ROCm.
    Rocm,
    /// A value this crate does not know (a newer library).
    Other(u32),
}

impl Backend {
    pub(crate) fn raw(self) -> sys::kvarn_backend_t {
        match self {
            Backend::Auto => sys::KVARN_BACKEND_AUTO,
            Backend::Cpu => sys::KVARN_BACKEND_CPU,
            Backend::Cuda => sys::KVARN_BACKEND_CUDA,
            Backend::Rocm => sys::KVARN_BACKEND_ROCM,
            Backend::Other(v) => v as sys::kvarn_backend_t,
        }
    }

    pub(crate) fn from_raw(raw: sys::kvarn_backend_t) -> Backend {
        match raw {
            sys::KVARN_BACKEND_AUTO => Backend::Auto,
            sys::KVARN_BACKEND_CPU => Backend::Cpu,
            sys::KVARN_BACKEND_CUDA => Backend::Cuda,
            sys::KVARN_BACKEND_ROCM => Backend::Rocm,
            other => Backend::Other(other as u32),
        }
    }

    /// Short name: "auto", "cpu", "cuda", "rocm".
    pub fn name(self) -> &'static str {
        // SAFETY: never NULL, static storage, any value accepted.
        static_str(unsafe { sys::kvarn_backend_name(self.raw()) })
    }
}

/// CPU instruction sets (`kvarn_cpu_isa_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CpuIsa {
    /// The scalar reference kernels.
    Scalar,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512.
    Avx512,
    /// NEON (aarch64).
    Neon,
    /// The context does not run on the CPU.
    None,
    /// A value this crate does not know.
    Other(u32),
}

impl CpuIsa {
    pub(crate) fn raw(self) -> sys::kvarn_cpu_isa_t {
        match self {
            CpuIsa::Scalar => sys::KVARN_CPU_ISA_SCALAR,
            CpuIsa::Avx2 => sys::KVARN_CPU_ISA_AVX2,
            CpuIsa::Avx512 => sys::KVARN_CPU_ISA_AVX512,
            CpuIsa::Neon => sys::KVARN_CPU_ISA_NEON,
            CpuIsa::None => sys::KVARN_CPU_ISA_NONE,
            CpuIsa::Other(v) => v as sys::kvarn_cpu_isa_t,
        }
    }

    pub(crate) fn from_raw(raw: sys::kvarn_cpu_isa_t) -> CpuIsa {
        match raw {
            sys::KVARN_CPU_ISA_SCALAR => CpuIsa::Scalar,
            sys::KVARN_CPU_ISA_AVX2 => CpuIsa::Avx2,
            sys::KVARN_CPU_ISA_AVX512 => CpuIsa::Avx512,
            sys::KVARN_CPU_ISA_NEON => CpuIsa::Neon,
            sys::KVARN_CPU_ISA_NONE => CpuIsa::None,
            other => CpuIsa::Other(other as u32),
        }
    }

    /// Name: "scalar", "avx2", "avx512", "neon", "none".
    pub fn name(self) -> &'static str {
        // SAFETY: never NULL, static storage.
        static_str(unsafe { sys::kvarn_cpu_isa_name(self.raw()) })
    }

    /// The best ISA this CPU supports that libkvarn was built with.
    pub fn best() -> CpuIsa {
        // SAFETY: no arguments.
        CpuIsa::from_raw(unsafe { sys::kvarn_cpu_isa_best() })
    }

    /// Caps the ISA of CPU contexts created afterwards (process-wide).
    pub fn set_max(isa: CpuIsa) -> Result<()> {
        // SAFETY: any value is checked by the library.
        error::check(unsafe { sys::kvarn_set_max_cpu_isa(isa.raw()) })
    }
}

/// What libkvarn knows of one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendInfo {
    /// The backend.
    pub backend: Backend,
    /// "cpu", "cuda", "rocm".
    pub name: String,
    /// Whether contexts can be created on it.
    pub available: bool,
    /// Devices found (1 for the CPU).
    pub device_count: i32,
    /// Why it is not available ("" when it is).
    pub reason: String,
}

/// Every backend libkvarn knows, built or not, with whether it is available and why not.
///
/// ```
/// # fn main() -> kvarn::Result<()> {
/// let cpu = kvarn::backends()?.into_iter().find(|b| b.backend == kvarn::Backend::Cpu).unwrap();
/// assert!(cpu.available && cpu.device_count == 1 && cpu.reason.is_empty());
/// # Ok(()) }
/// ```
pub fn backends() -> Result<Vec<BackendInfo>> {
    // SAFETY: no arguments.
    let n = unsafe { sys::kvarn_backend_count() };
    let mut list = Vec::new();
    for i in 0..n {
        // SAFETY: plain old data with `size` set; a pointer to a local.
        let info = unsafe {
            let mut info = std::mem::zeroed::<sys::kvarn_backend_info_t>();
            info.size = std::mem::size_of::<sys::kvarn_backend_info_t>();
            error::check(sys::kvarn_backend_get_info(i, &mut info))?;
            info
        };
        list.push(BackendInfo {
            backend: Backend::from_raw(info.backend),
            name: static_str(info.name).to_string(),
            available: info.available != 0,
            device_count: info.device_count,
            reason: static_str(info.reason).to_string(),
        });
    }
    Ok(list)
}

/// The loaded library's version, "MAJOR.MINOR.PATCH".
///
/// ```
/// assert_eq!(kvarn::version(), format!("{}.{}.{}", kvarn::VERSION_MAJOR, kvarn::VERSION_MINOR,
///                                      kvarn::VERSION_PATCH));
/// assert_eq!(kvarn::abi_version(), kvarn::ABI_VERSION);
/// ```
pub fn version() -> &'static str {
    // SAFETY: never NULL, static storage.
    static_str(unsafe { sys::kvarn_version_string() })
}

/// The loaded library's version as major * 10000 + minor * 100 + patch.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::kvarn_version_number() }
}

/// The ABI major of the loaded library (the SONAME is `libkvarn.so.<abi>`).
pub fn abi_version() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::kvarn_abi_version() }
}

/// The header version this crate was generated from.
pub const VERSION_MAJOR: u32 = sys::KVARN_VERSION_MAJOR;
/// The header version this crate was generated from.
pub const VERSION_MINOR: u32 = sys::KVARN_VERSION_MINOR;
/// The header version this crate was generated from.
pub const VERSION_PATCH: u32 = sys::KVARN_VERSION_PATCH;
/// The ABI major of the header this crate was generated from.
pub const ABI_VERSION: u32 = sys::KVARN_ABI_VERSION;

/// The detected CPU features, space separated ("sse4.2 avx2 fma avx512f ...").
pub fn cpu_features() -> Result<String> {
    let mut size = 256usize;
    loop {
        let mut buf = vec![0u8; size];
        // SAFETY: buf holds `size` bytes; the library NUL-terminates within it.
        let st = unsafe { sys::kvarn_cpu_features(buf.as_mut_ptr().cast(), buf.len()) };
        if st == sys::KVARN_ERR_BUFFER_TOO_SMALL && size < (1 << 20) {
            size *= 4;
            continue;
        }
        error::check(st)?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        return Ok(String::from_utf8_lossy(&buf[..end]).into_owned());
    }
}

/// Baseline quantizers for accuracy studies (`kvarn_baseline_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Baseline {
    /// Asymmetric min/max round-to-nearest of each row, fp16 scale and zero per row.
    PerTokenRtn,
    /// fp8 e4m3 with an fp16 per-row scale absmax / 448 (`bits` ignored).
    Fp8E4m3,
}

/// Quantizes and reconstructs each row of `cols` floats with a baseline method: `input` and
/// `out` are `[rows][cols]`, the same length. NaN/Inf give `NonFinite`, |x| > 65504 `Overflow`.
///
/// ```
/// # fn main() -> kvarn::Result<()> {
/// let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.1).cos()).collect();
/// let mut y = vec![0f32; 256];
/// kvarn::baseline_roundtrip(kvarn::Baseline::PerTokenRtn, 8, 128, &x, &mut y)?;
/// assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 0.01));
/// # Ok(()) }
/// ```
pub fn baseline_roundtrip(
    method: Baseline,
    bits: i32,
    cols: usize,
    input: &[f32],
    out: &mut [f32],
) -> Result<()> {
    let cols_i32 = i32::try_from(cols)
        .map_err(|_| Error::invalid(format!("cols {cols} does not fit int32")))?;
    let rows = exact_rows(input.len(), cols, "baseline input")?;
    if out.len() != input.len() {
        return Err(Error::invalid(format!(
            "baseline: out has {} elements, input {}",
            out.len(),
            input.len()
        )));
    }
    let m = match method {
        Baseline::PerTokenRtn => sys::KVARN_BASELINE_PER_TOKEN_RTN,
        Baseline::Fp8E4m3 => sys::KVARN_BASELINE_FP8_E4M3,
    };
    // SAFETY: input and out hold rows * cols floats of host memory.
    error::check(unsafe {
        sys::kvarn_baseline_roundtrip(m, bits, rows, cols_i32, input.as_ptr(), out.as_mut_ptr())
    })
}

// ---- helpers shared by the modules ------------------------------------------------------------

fn static_str(p: *const std::os::raw::c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: the library's names and reasons are NUL-terminated static storage.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// A positive i32 as usize, else InvalidArgument.
pub(crate) fn positive(x: i32, what: &str) -> Result<usize> {
    if x > 0 {
        Ok(x as usize)
    } else {
        Err(Error::invalid(format!("{what} is {x}, not positive")))
    }
}

/// len / per_row when it divides exactly, else InvalidArgument.
pub(crate) fn exact_rows(len: usize, per_row: usize, what: &str) -> Result<usize> {
    if per_row == 0 || len % per_row != 0 {
        Err(Error::invalid(format!(
            "{what}: {len} elements is not a multiple of {per_row}"
        )))
    } else {
        Ok(len / per_row)
    }
}

/// a * b, or InvalidArgument on overflow.
pub(crate) fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(format!("size {a} x {b} overflows usize")))
}
