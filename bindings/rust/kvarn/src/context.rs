//! Contexts (`kvarn_context_t`) and the codec (layer 1).

use std::ptr::{self, NonNull};

use kvarn_sys as sys;

use crate::config::Config;
use crate::dtype::Element;
use crate::error::{check, Error, Result};
use crate::{exact_rows, mul, positive, Backend, CpuIsa};

/// How the codec sees tensors (`KVARN_CODEC_*` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Frame {
    /// As the model produces and consumes them: quantize rotates the inputs, dequantize
    /// un-rotates the outputs (`KVARN_CODEC_DEFAULT`).
    #[default]
    Model,
    /// The cache frame: the inputs are already rotated fp16 values, the outputs stay rotated
    /// (`KVARN_CODEC_CACHE_FRAME`).
    Cache,
}

impl Frame {
    fn flags(self) -> u32 {
        match self {
            Frame::Model => sys::KVARN_CODEC_DEFAULT,
            Frame::Cache => sys::KVARN_CODEC_CACHE_FRAME,
        }
    }
}

/// Options of [`Context::with_options`] (`kvarn_context_options_t`, without the stream: the
/// slices of this crate are host memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOptions {
    /// Default [`Backend::Auto`]: a GPU when one is present, else the CPU.
    pub backend: Backend,
    /// Device ordinal for GPU backends (default 0).
    pub device: i32,
    /// CPU worker threads; 0 = hardware concurrency (default).
    pub num_threads: i32,
}

impl Default for ContextOptions {
    fn default() -> ContextOptions {
        ContextOptions {
            backend: Backend::Auto,
            device: 0,
            num_threads: 0,
        }
    }
}

/// A context: a backend, a device and worker threads; every data call runs through one.
/// Destroyed on drop.
///
/// The data calls of this crate take host slices, so they need a CPU context: on another
/// backend they return [`Status::InvalidArgument`](crate::Status::InvalidArgument) (the C API
/// expects device pointers there).
///
/// Thread safety (docs/API.md): "a context may be used from one thread at a time", so a
/// `Context` is `Send` (it may move to another thread) but not `Sync` (it cannot be shared
/// between threads); use one context per thread for concurrency.
///
/// ```
/// # fn main() -> kvarn::Result<()> {
/// let ctx = kvarn::Context::cpu()?;
/// assert_eq!(ctx.backend()?, kvarn::Backend::Cpu);
/// assert!(ctx.num_threads()? >= 1);
/// std::thread::spawn(move || ctx.num_threads()).join().unwrap()?; // Send
/// # Ok(()) }
/// ```
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<kvarn::Context>(); // not Sync
/// ```
#[derive(Debug)]
pub struct Context {
    raw: NonNull<sys::kvarn_context_t>,
    backend: Backend,
}

// SAFETY: docs/API.md: a context may be used from one thread at a time (no thread affinity;
// the only thread-local state, the last error message, is read on the calling thread right
// after each call). Not Sync: concurrent use from two threads is not allowed.
unsafe impl Send for Context {}

impl Context {
    /// A CPU context using every core.
    pub fn cpu() -> Result<Context> {
        Context::new(Backend::Cpu)
    }

    /// A context on `backend` with default options. An explicitly requested backend that is not
    /// available fails with [`Status::BackendUnavailable`](crate::Status::BackendUnavailable).
    pub fn new(backend: Backend) -> Result<Context> {
        Context::with_options(&ContextOptions {
            backend,
            ..ContextOptions::default()
        })
    }

    /// A context from options.
    pub fn with_options(options: &ContextOptions) -> Result<Context> {
        // SAFETY: plain old data filled by the defaults function; the pointers are to locals.
        unsafe {
            let mut opt = std::mem::zeroed::<sys::kvarn_context_options_t>();
            sys::kvarn_context_options_defaults(&mut opt);
            opt.backend = options.backend.raw();
            opt.device = options.device;
            opt.num_threads = options.num_threads;
            let mut out: *mut sys::kvarn_context_t = ptr::null_mut();
            check(sys::kvarn_context_create(&opt, &mut out))?;
            let raw = NonNull::new(out)
                .ok_or_else(|| Error::new(crate::Status::Internal, "context_create gave NULL"))?;
            let mut b: sys::kvarn_backend_t = sys::KVARN_BACKEND_AUTO;
            let ctx_backend =
                if sys::kvarn_context_get_backend(raw.as_ptr(), &mut b) == sys::KVARN_OK {
                    Backend::from_raw(b)
                } else {
                    Backend::Auto
                };
            Ok(Context {
                raw,
                backend: ctx_backend,
            })
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::kvarn_context_t {
        self.raw.as_ptr()
    }

    /// The backend that runs this context's calls (never `Auto`).
    pub fn backend(&self) -> Result<Backend> {
        let mut b: sys::kvarn_backend_t = sys::KVARN_BACKEND_AUTO;
        // SAFETY: a live context and a pointer to a local.
        check(unsafe { sys::kvarn_context_get_backend(self.as_ptr(), &mut b) })?;
        Ok(Backend::from_raw(b))
    }

    /// The CPU ISA of this context ([`CpuIsa::None`] for GPU contexts).
    pub fn cpu_isa(&self) -> Result<CpuIsa> {
        let mut isa: sys::kvarn_cpu_isa_t = sys::KVARN_CPU_ISA_NONE;
        // SAFETY: as above.
        check(unsafe { sys::kvarn_context_get_cpu_isa(self.as_ptr(), &mut isa) })?;
        Ok(CpuIsa::from_raw(isa))
    }

    /// Device ordinal (0 for the CPU).
    pub fn device(&self) -> Result<i32> {
        let mut d = 0i32;
        // SAFETY: as above.
        check(unsafe { sys::kvarn_context_get_device(self.as_ptr(), &mut d) })?;
        Ok(d)
    }

    /// Worker threads (1 for GPU contexts).
    pub fn num_threads(&self) -> Result<i32> {
        let mut n = 0i32;
        // SAFETY: as above.
        check(unsafe { sys::kvarn_context_get_num_threads(self.as_ptr(), &mut n) })?;
        Ok(n)
    }

    /// Host slices are only valid on a CPU context.
    pub(crate) fn need_host(&self) -> Result<()> {
        if self.backend == Backend::Cpu {
            Ok(())
        } else {
            Err(Error::invalid(format!(
                "the Rust binding passes host slices, which need a CPU context (this one runs on {})",
                self.backend.name()
            )))
        }
    }

    /// Rotates rows of `head_dim` channels by the orthonormal Hadamard matrix (its own inverse,
    /// so the same call un-rotates), computed in fp32 and rounded to the output type.
    /// `input` and `out`: `[n_rows][head_dim]`, the same length.
    ///
    /// ```
    /// # fn main() -> kvarn::Result<()> {
    /// let ctx = kvarn::Context::cpu()?;
    /// let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
    /// let mut y = vec![0f32; 128];
    /// ctx.rotate(64, &x, &mut y)?;
    /// let mut back = vec![0f32; 128];
    /// ctx.rotate(64, &y, &mut back)?;
    /// assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 1e-5));
    /// assert!(ctx.rotate(64, &x, &mut y[..64]).is_err()); // lengths differ: Err, not a panic
    /// # Ok(()) }
    /// ```
    pub fn rotate<I: Element, O: Element>(
        &self,
        head_dim: i32,
        input: &[I],
        out: &mut [O],
    ) -> Result<()> {
        self.need_host()?;
        let d = positive(head_dim, "head_dim")?;
        let n_rows = exact_rows(input.len(), d, "rotate input")?;
        if out.len() != input.len() {
            return Err(Error::invalid(format!(
                "rotate: out has {} elements, input {}",
                out.len(),
                input.len()
            )));
        }
        // SAFETY: input and out hold n_rows * head_dim elements of their dtypes; host memory on a
        // CPU context.
        check(unsafe {
            sys::kvarn_rotate(
                self.as_ptr(),
                head_dim,
                n_rows,
                I::DTYPE.raw(),
                input.as_ptr().cast(),
                O::DTYPE.raw(),
                out.as_mut_ptr().cast(),
            )
        })
    }

    /// [`rotate`](Context::rotate) in place.
    pub fn rotate_in_place<T: Element>(&self, head_dim: i32, data: &mut [T]) -> Result<()> {
        self.need_host()?;
        let d = positive(head_dim, "head_dim")?;
        let n_rows = exact_rows(data.len(), d, "rotate data")?;
        let p = data.as_mut_ptr();
        // SAFETY: in == out is allowed when the dtypes are equal (kvarn.h).
        check(unsafe {
            sys::kvarn_rotate(
                self.as_ptr(),
                head_dim,
                n_rows,
                T::DTYPE.raw(),
                p as *const _,
                T::DTYPE.raw(),
                p.cast(),
            )
        })
    }

    /// Quantizes (K, V) tile pairs into packed records. `k`, `v`: `[n_tiles][G][D]`, tokens x
    /// channels, unrotated (as the model produces them); returns `n_tiles` records of
    /// [`Config::record_bytes`] each. NaN/Inf inputs give
    /// [`Status::NonFinite`](crate::Status::NonFinite), values beyond fp16
    /// [`Status::Overflow`](crate::Status::Overflow).
    ///
    /// ```
    /// # fn main() -> kvarn::Result<()> {
    /// let ctx = kvarn::Context::cpu()?;
    /// let config = kvarn::Config::from_preset("k4v2_g64", 64)?;
    /// let n = 2 * 64 * 64; // two tiles of G=64 tokens x D=64 channels
    /// let k: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    /// let v: Vec<f32> = (0..n).map(|i| ((i * 104729) % 1000) as f32 / 500.0 - 1.0).collect();
    /// let records = ctx.quantize(&config, &k, &v)?;
    /// assert_eq!(records.len(), 2 * config.record_bytes()?);
    /// let (k2, v2) = ctx.dequantize(&config, &records)?;
    /// assert_eq!((k2.len(), v2.len()), (n, n));
    /// # Ok(()) }
    /// ```
    pub fn quantize<T: Element>(&self, config: &Config, k: &[T], v: &[T]) -> Result<Vec<u8>> {
        let (d, g) = config.dims()?;
        let n_tiles = exact_rows(k.len(), mul(g, d)?, "quantize k")?;
        let rb = config.record_bytes()?;
        let mut records = vec![0u8; mul(n_tiles, rb)?];
        self.quantize_into(config, k, v, Frame::Model, &mut records, rb)?;
        Ok(records)
    }

    /// Quantizes into caller memory: `n_tiles = k.len() / (G*D)` records, `record_stride` bytes
    /// apart (>= [`Config::record_bytes`]; padding bytes are left untouched). `records` must hold
    /// at least `(n_tiles - 1) * record_stride + record_bytes` bytes. Returns `n_tiles`.
    pub fn quantize_into<T: Element>(
        &self,
        config: &Config,
        k: &[T],
        v: &[T],
        frame: Frame,
        records: &mut [u8],
        record_stride: usize,
    ) -> Result<usize> {
        self.need_host()?;
        let (d, g) = config.dims()?;
        let n_tiles = exact_rows(k.len(), mul(g, d)?, "quantize k")?;
        if v.len() != k.len() {
            return Err(Error::invalid(format!(
                "quantize: v has {} elements, k {}",
                v.len(),
                k.len()
            )));
        }
        let rb = config.record_bytes()?;
        let need = records_span(n_tiles, rb, record_stride)?;
        if records.len() < need {
            return Err(Error::invalid(format!(
                "quantize: records has {} bytes, {} tiles at stride {} need {}",
                records.len(),
                n_tiles,
                record_stride,
                need
            )));
        }
        let raw = config.raw();
        // SAFETY: k, v hold n_tiles*G*D elements of T; records holds the records at the stride
        // (checked above); host memory on a CPU context.
        check(unsafe {
            sys::kvarn_quantize(
                self.as_ptr(),
                &raw,
                n_tiles,
                T::DTYPE.raw(),
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                frame.flags(),
                records.as_mut_ptr().cast(),
                record_stride,
            )
        })?;
        Ok(n_tiles)
    }

    /// Dequantizes packed records (as [`quantize`](Context::quantize) returns them) to f32 K and
    /// V tiles `[n_tiles][G][D]`, un-rotated.
    pub fn dequantize(&self, config: &Config, records: &[u8]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (d, g) = config.dims()?;
        let rb = config.record_bytes()?;
        let n_tiles = exact_rows(records.len(), rb, "dequantize records (bytes)")?;
        let n = mul(mul(n_tiles, g)?, d)?;
        let mut k = vec![0f32; n];
        let mut v = vec![0f32; n];
        self.dequantize_into(
            config,
            records,
            rb,
            Frame::Model,
            Some(&mut k),
            Some(&mut v),
        )?;
        Ok((k, v))
    }

    /// Dequantizes records `record_stride` bytes apart into caller slices of any element type:
    /// `k_out`, `v_out`: `[n_tiles][G][D]` (either may be `None` to skip it; `n_tiles` is taken
    /// from the one given, and both must agree). `records` must hold
    /// `(n_tiles - 1) * record_stride + record_bytes` bytes or more.
    pub fn dequantize_into<T: Element>(
        &self,
        config: &Config,
        records: &[u8],
        record_stride: usize,
        frame: Frame,
        k_out: Option<&mut [T]>,
        v_out: Option<&mut [T]>,
    ) -> Result<()> {
        self.need_host()?;
        let (d, g) = config.dims()?;
        let tile = mul(g, d)?;
        let n_k = match &k_out {
            Some(s) => Some(exact_rows(s.len(), tile, "dequantize k_out")?),
            None => None,
        };
        let n_v = match &v_out {
            Some(s) => Some(exact_rows(s.len(), tile, "dequantize v_out")?),
            None => None,
        };
        let n_tiles = match (n_k, n_v) {
            (Some(a), Some(b)) if a != b => {
                return Err(Error::invalid(format!(
                    "dequantize: k_out holds {a} tiles, v_out {b}"
                )))
            }
            (Some(a), _) => a,
            (None, Some(b)) => b,
            (None, None) => return Err(Error::invalid("dequantize: no output given")),
        };
        let rb = config.record_bytes()?;
        let need = records_span(n_tiles, rb, record_stride)?;
        if records.len() < need {
            return Err(Error::invalid(format!(
                "dequantize: records has {} bytes, {} tiles at stride {} need {}",
                records.len(),
                n_tiles,
                record_stride,
                need
            )));
        }
        let raw = config.raw();
        let kp = k_out.map_or(ptr::null_mut(), |s| s.as_mut_ptr().cast());
        let vp = v_out.map_or(ptr::null_mut(), |s| s.as_mut_ptr().cast());
        // SAFETY: the records span and the outputs' lengths are checked above; NULL outputs are
        // allowed; host memory on a CPU context.
        check(unsafe {
            sys::kvarn_dequantize(
                self.as_ptr(),
                &raw,
                n_tiles,
                records.as_ptr().cast(),
                record_stride,
                frame.flags(),
                T::DTYPE.raw(),
                kp,
                vp,
            )
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the handle is live and owned; caches borrowing it are gone (lifetimes).
        unsafe { sys::kvarn_context_destroy(self.raw.as_ptr()) }
    }
}

/// Bytes spanned by n records of rb bytes at a stride (InvalidArgument if stride < rb).
fn records_span(n: usize, rb: usize, stride: usize) -> Result<usize> {
    if stride < rb {
        return Err(Error::invalid(format!(
            "record_stride {stride} is smaller than the record size {rb}"
        )));
    }
    if n == 0 {
        return Ok(0);
    }
    mul(n - 1, stride)?
        .checked_add(rb)
        .ok_or_else(|| Error::invalid("records span overflows usize"))
}
