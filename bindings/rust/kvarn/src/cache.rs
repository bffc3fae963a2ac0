//! The managed cache (`kvarn_cache_t`, layer 3).

use std::ptr::{self, NonNull};

use kvarn_sys as sys;

use crate::config::Config;
use crate::context::Context;
use crate::dtype::Element;
use crate::error::{check, Error, Result};
use crate::{exact_rows, mul, positive};

/// Options of [`Cache::new`] (`kvarn_cache_options_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOptions {
    /// The quantization config (default `Config::default()`).
    pub config: Config,
    /// Layers, >= 1 (default 1).
    pub num_layers: i32,
    /// KV heads Hk, >= 1 (default 8).
    pub num_kv_heads: i32,
    /// Capacity in tokens over all sequences (default 65536).
    pub max_tokens: i64,
    /// Sequences at most (default 256).
    pub max_sequences: i32,
}

impl Default for CacheOptions {
    fn default() -> CacheOptions {
        // SAFETY: plain old data filled by the defaults function.
        let raw = unsafe {
            let mut raw = std::mem::zeroed::<sys::kvarn_cache_options_t>();
            sys::kvarn_cache_options_defaults(&mut raw);
            raw
        };
        CacheOptions {
            config: Config::from_raw(&raw.config),
            num_layers: raw.num_layers,
            num_kv_heads: raw.num_kv_heads,
            max_tokens: raw.max_tokens,
            max_sequences: raw.max_sequences,
        }
    }
}

impl CacheOptions {
    /// Options for a config, a layer count and a KV head count; capacity fields at defaults.
    pub fn new(config: Config, num_layers: i32, num_kv_heads: i32) -> CacheOptions {
        CacheOptions {
            config,
            num_layers,
            num_kv_heads,
            ..CacheOptions::default()
        }
    }
}

/// Which cached keys a query sees (`kvarn_attention_mode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionMode {
    /// The queries are the last tokens of the cache: query i of n sits at N - n + i.
    Causal,
    /// The queries follow the cache (not appended): query i of n sits at N + i and sees every
    /// cached key; for merging with an engine's own attention over the new tokens by lse.
    Prefix,
}

/// Attention parameters (`kvarn_attention_params_t`): decode (one query token per sequence) or
/// extend (`q_indptr`: `[n_seqs + 1]` offsets of each sequence's query tokens, causal, aligned to
/// the sequence end), and the model variants (docs/API.md "Model variants").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams<'a> {
    /// Hq, a multiple of Hk; query head h reads KV head h / (Hq/Hk).
    pub num_q_heads: i32,
    /// Softmax scale; 0 = 1/sqrt(D).
    pub scale: f32,
    /// Split-K partitions per (sequence, KV head); 0 = automatic.
    pub num_splits: i32,
    /// `None` = decode; `Some(indptr)` = extend.
    pub q_indptr: Option<&'a [i32]>,
    /// Learned sink logits, one per query head (gpt-oss), or `None`.
    pub sinks: Option<&'a [f32]>,
    /// 0 = full attention; W > 0: a query sees the W most recent keys, itself included.
    pub sliding_window: i32,
    /// 0 = off; c > 0: scores become c * tanh(s / c) (Gemma 2).
    pub logit_softcap: f32,
    /// Causal (default) or prefix.
    pub mode: AttentionMode,
}

impl<'a> AttentionParams<'a> {
    /// Decode: one query token per sequence.
    pub fn decode(num_q_heads: i32) -> AttentionParams<'static> {
        AttentionParams {
            num_q_heads,
            scale: 0.0,
            num_splits: 0,
            q_indptr: None,
            sinks: None,
            sliding_window: 0,
            logit_softcap: 0.0,
            mode: AttentionMode::Causal,
        }
    }

    /// Extend: sequence b has the query tokens `q_indptr[b]..q_indptr[b+1]`.
    pub fn extend(num_q_heads: i32, q_indptr: &'a [i32]) -> AttentionParams<'a> {
        AttentionParams {
            num_q_heads,
            scale: 0.0,
            num_splits: 0,
            q_indptr: Some(q_indptr),
            sinks: None,
            sliding_window: 0,
            logit_softcap: 0.0,
            mode: AttentionMode::Causal,
        }
    }
}

/// Tokens in one layer of a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequenceLength {
    /// Committed + speculative.
    pub tokens: i64,
    /// Committed.
    pub committed: i64,
}

/// Statistics of a cache (`kvarn_cache_stats_t`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheStats {
    /// Sequences.
    pub sequences: i64,
    /// Tokens, summed over sequences and layers.
    pub tokens: i64,
    /// Committed tokens, summed over sequences and layers.
    pub committed_tokens: i64,
    /// Distinct records in use (one per tile per KV head per layer).
    pub records: i64,
    /// fp16 pages in use.
    pub pages: i64,
    /// Record + page bytes in use.
    pub bytes_used: i64,
    /// Bytes reserved by the pools.
    pub bytes_capacity: i64,
    /// Bytes the same tokens take as an fp16 K/V cache.
    pub fp16_bytes: i64,
    /// fp16_bytes / bytes_used (0 when empty).
    pub compression_ratio: f64,
}

/// A managed KV cache on a context: per layer, a record pool and fp16 page pools; sequences
/// named by caller-chosen `i64` ids; append (committed or speculative), commit, truncate, fork
/// with shared records, attention, statistics, export/import. Destroyed on drop; it borrows its
/// context, which therefore outlives it.
///
/// Every failing call leaves the cache exactly as before. Slices are host memory, so the data
/// calls need a CPU context. `k`, `v`: `[n_tokens][Hk][D]`, unrotated; `q`, `out`:
/// `[q_tokens][Hq][D]`; `lse`: `[q_tokens][Hq]`. A slice whose length does not fit the shapes
/// gives [`Status::InvalidArgument`](crate::Status::InvalidArgument).
///
/// Not `Send` and not `Sync`: it borrows a [`Context`], which may be used from one thread at a
/// time only. To use a cache on another thread, create (or move) the context there.
///
/// ```
/// # fn main() -> kvarn::Result<()> {
/// use kvarn::{AttentionParams, Cache, CacheOptions, Config, Context};
/// let ctx = Context::cpu()?;
/// let config = Config::from_preset("k4v2_g64", 64)?;
/// let mut cache = Cache::new(&ctx, &CacheOptions::new(config, 1, 2))?; // 1 layer, Hk = 2
/// cache.add_sequence(7)?;
/// let token = 2 * 64; // Hk * D values per token
/// let k: Vec<f32> = (0..200 * token).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
/// let v: Vec<f32> = (0..200 * token).map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0).collect();
/// cache.append(7, 0, &k, &v)?; // 200 tokens: tile 0 is the fp16 sink, tiles 1-2 become records
/// let q = vec![0.1f32; 4 * 64]; // one decode token, Hq = 4
/// let mut out = vec![0f32; 4 * 64];
/// cache.attention(0, &[7], &AttentionParams::decode(4), &q, &mut out, None)?;
/// assert_eq!(cache.sequence_length(7, 0)?.tokens, 200);
/// assert!(cache.stats()?.compression_ratio > 1.0);
/// # Ok(()) }
/// ```
///
/// The context outlives its caches: dropping or moving it while a cache borrows it does not
/// compile (so no order of drops can free a context under a live cache).
///
/// ```compile_fail,E0505
/// let ctx = kvarn::Context::cpu()?;
/// let config = kvarn::Config::from_preset("k4v2_g64", 64)?;
/// let cache = kvarn::Cache::new(&ctx, &kvarn::CacheOptions::new(config, 1, 1))?;
/// drop(ctx); // E0505: the cache still borrows it
/// cache.stats()?;
/// # Ok::<(), kvarn::Error>(())
/// ```
///
/// ```compile_fail,E0277
/// fn sendable<T: Send>() {}
/// sendable::<kvarn::Cache<'static>>(); // not Send
/// ```
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<kvarn::Cache<'static>>(); // not Sync
/// ```
#[derive(Debug)]
pub struct Cache<'ctx> {
    raw: NonNull<sys::kvarn_cache_t>,
    ctx: &'ctx Context,
    config: Config,
    num_layers: i32,
    num_kv_heads: i32,
}

impl<'ctx> Cache<'ctx> {
    /// Creates a cache on the context's backend and device.
    pub fn new(ctx: &'ctx Context, options: &CacheOptions) -> Result<Cache<'ctx>> {
        // SAFETY: plain old data filled by the defaults function; pointers to locals; the
        // context is live for 'ctx.
        unsafe {
            let mut raw = std::mem::zeroed::<sys::kvarn_cache_options_t>();
            sys::kvarn_cache_options_defaults(&mut raw);
            raw.config = options.config.raw();
            raw.num_layers = options.num_layers;
            raw.num_kv_heads = options.num_kv_heads;
            raw.max_tokens = options.max_tokens;
            raw.max_sequences = options.max_sequences;
            let mut out: *mut sys::kvarn_cache_t = ptr::null_mut();
            check(sys::kvarn_cache_create(ctx.as_ptr(), &raw, &mut out))?;
            let raw_cache = NonNull::new(out)
                .ok_or_else(|| Error::new(crate::Status::Internal, "cache_create gave NULL"))?;
            Ok(Cache {
                raw: raw_cache,
                ctx,
                config: options.config,
                num_layers: options.num_layers,
                num_kv_heads: options.num_kv_heads,
            })
        }
    }

    fn ptr(&self) -> *mut sys::kvarn_cache_t {
        self.raw.as_ptr()
    }

    /// The context the cache runs on.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
    }

    /// The quantization config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Layers.
    pub fn num_layers(&self) -> i32 {
        self.num_layers
    }

    /// KV heads Hk.
    pub fn num_kv_heads(&self) -> i32 {
        self.num_kv_heads
    }

    /// Values per token in `k`/`v` slices: Hk * D.
    pub fn token_values(&self) -> usize {
        (self.num_kv_heads.max(0) as usize) * (self.config.head_dim.max(0) as usize)
    }

    /// Adds an empty sequence ([`Status::AlreadyExists`](crate::Status::AlreadyExists) if the id
    /// is in use).
    pub fn add_sequence(&mut self, seq_id: i64) -> Result<()> {
        // SAFETY: a live cache.
        check(unsafe { sys::kvarn_cache_add_sequence(self.ptr(), seq_id) })
    }

    /// Removes a sequence and frees what only it used.
    pub fn remove_sequence(&mut self, seq_id: i64) -> Result<()> {
        // SAFETY: a live cache.
        check(unsafe { sys::kvarn_cache_remove_sequence(self.ptr(), seq_id) })
    }

    /// A new sequence `dst_id` holding the first `n_tokens` committed tokens of `src_id` in every
    /// layer (`None` = all committed tokens). Records of the shared prefix are shared, not
    /// copied. Cutting a record tile is [`Status::InvalidState`](crate::Status::InvalidState).
    pub fn fork(&mut self, src_id: i64, dst_id: i64, n_tokens: Option<i64>) -> Result<()> {
        let n = n_tokens.unwrap_or(-1);
        if n < -1 {
            return Err(Error::invalid(format!("fork: n_tokens {n} is negative")));
        }
        // SAFETY: a live cache.
        check(unsafe { sys::kvarn_cache_fork(self.ptr(), src_id, dst_id, n) })
    }

    /// Drops the tokens beyond `n_tokens` in every layer (committed or speculative); `n_tokens`
    /// must not fall strictly inside a record tile.
    pub fn truncate(&mut self, seq_id: i64, n_tokens: i64) -> Result<()> {
        // SAFETY: a live cache.
        check(unsafe { sys::kvarn_cache_truncate(self.ptr(), seq_id, n_tokens) })
    }

    /// Appends committed tokens to one layer: `k`, `v`: `[n_tokens][Hk][D]`, unrotated. Tiles
    /// that become complete (and are not sink tiles) are quantized. Not allowed while the layer
    /// holds speculative tokens ([`Status::InvalidState`](crate::Status::InvalidState)).
    pub fn append<T: Element>(&mut self, seq_id: i64, layer: i32, k: &[T], v: &[T]) -> Result<()> {
        self.append_flags(seq_id, layer, k, v, sys::KVARN_APPEND_DEFAULT)
    }

    /// Appends speculative tokens: attention sees them, but they stay uncommitted (and their
    /// tiles unquantized) until [`commit`](Cache::commit); [`truncate`](Cache::truncate) drops
    /// them without a trace.
    pub fn append_speculative<T: Element>(
        &mut self,
        seq_id: i64,
        layer: i32,
        k: &[T],
        v: &[T],
    ) -> Result<()> {
        self.append_flags(seq_id, layer, k, v, sys::KVARN_APPEND_SPECULATIVE)
    }

    fn append_flags<T: Element>(
        &mut self,
        seq_id: i64,
        layer: i32,
        k: &[T],
        v: &[T],
        flags: u32,
    ) -> Result<()> {
        self.ctx.need_host()?;
        let n_tokens = exact_rows(k.len(), self.token_values(), "append k")?;
        if v.len() != k.len() {
            return Err(Error::invalid(format!(
                "append: v has {} elements, k {}",
                v.len(),
                k.len()
            )));
        }
        // SAFETY: k and v hold n_tokens * Hk * D elements of T (Hk, D as the cache was created
        // with); host memory on a CPU context.
        check(unsafe {
            sys::kvarn_cache_append(
                self.ptr(),
                seq_id,
                layer,
                n_tokens,
                T::DTYPE.raw(),
                k.as_ptr().cast(),
                v.as_ptr().cast(),
                flags,
            )
        })
    }

    /// Commits the first `n_tokens` tokens of the sequence in every layer (each layer must hold
    /// them); completed tiles are quantized.
    pub fn commit(&mut self, seq_id: i64, n_tokens: i64) -> Result<()> {
        // SAFETY: a live cache.
        check(unsafe { sys::kvarn_cache_commit(self.ptr(), seq_id, n_tokens) })
    }

    /// Tokens in one layer of a sequence.
    pub fn sequence_length(&self, seq_id: i64, layer: i32) -> Result<SequenceLength> {
        let (mut tokens, mut committed) = (0i64, 0i64);
        // SAFETY: a live cache, pointers to locals.
        check(unsafe {
            sys::kvarn_cache_sequence_length(self.ptr(), seq_id, layer, &mut tokens, &mut committed)
        })?;
        Ok(SequenceLength { tokens, committed })
    }

    /// Attention of `q` over one layer of the sequences `seq_ids`, written to `out` (and the
    /// log-sum-exp of the scaled scores to `lse` when given). Decode: `q` holds one token per
    /// sequence; extend: `q_indptr[n_seqs]` tokens. The query is unrotated, the output too.
    pub fn attention<Q: Element, O: Element>(
        &self,
        layer: i32,
        seq_ids: &[i64],
        params: &AttentionParams<'_>,
        q: &[Q],
        out: &mut [O],
        lse: Option<&mut [f32]>,
    ) -> Result<()> {
        self.ctx.need_host()?;
        let hq = positive(params.num_q_heads, "num_q_heads")?;
        let hk = positive(self.num_kv_heads, "num_kv_heads")?;
        if hq % hk != 0 {
            return Err(Error::invalid(format!(
                "num_q_heads {hq} is not a multiple of num_kv_heads {hk}"
            )));
        }
        let d = positive(self.config.head_dim, "head_dim")?;
        if let Some(s) = params.sinks {
            if s.len() != hq {
                return Err(Error::invalid(format!(
                    "sinks has {} entries, num_q_heads {} needs one per query head",
                    s.len(),
                    hq
                )));
            }
        }
        let total = match params.q_indptr {
            None => seq_ids.len(),
            Some(indptr) => {
                if indptr.len() != seq_ids.len() + 1 {
                    return Err(Error::invalid(format!(
                        "q_indptr has {} entries, {} sequences need {}",
                        indptr.len(),
                        seq_ids.len(),
                        seq_ids.len() + 1
                    )));
                }
                if indptr[0] != 0 || indptr.windows(2).any(|w| w[1] < w[0]) {
                    return Err(Error::invalid(
                        "q_indptr must start at 0 and be non-decreasing",
                    ));
                }
                indptr[seq_ids.len()] as usize
            }
        };
        let per_token = mul(hq, d)?;
        let need = mul(total, per_token)?;
        if q.len() != need || out.len() != need {
            return Err(Error::invalid(format!(
                "attention: q has {} elements and out {}, {} query tokens x Hq {} x D {} need {}",
                q.len(),
                out.len(),
                total,
                hq,
                d,
                need
            )));
        }
        let lse_ptr = match lse {
            Some(l) => {
                if l.len() != mul(total, hq)? {
                    return Err(Error::invalid(format!(
                        "attention: lse has {} elements, {} query tokens x Hq {} need {}",
                        l.len(),
                        total,
                        hq,
                        total * hq
                    )));
                }
                l.as_mut_ptr()
            }
            None => ptr::null_mut(),
        };
        // SAFETY: plain old data filled by the defaults function.
        let mut p = unsafe {
            let mut p = std::mem::zeroed::<sys::kvarn_attention_params_t>();
            sys::kvarn_attention_params_defaults(&mut p);
            p
        };
        p.num_q_heads = params.num_q_heads;
        p.scale = params.scale;
        p.num_splits = params.num_splits;
        p.q_indptr = params.q_indptr.map_or(ptr::null(), |s| s.as_ptr());
        p.sinks = params.sinks.map_or(ptr::null(), |s| s.as_ptr());
        p.sliding_window = params.sliding_window;
        p.logit_softcap = params.logit_softcap;
        p.mode = match params.mode {
            AttentionMode::Causal => sys::KVARN_ATTENTION_CAUSAL,
            AttentionMode::Prefix => sys::KVARN_ATTENTION_PREFIX,
        };
        p.q_dtype = Q::DTYPE.raw();
        p.out_dtype = O::DTYPE.raw();
        // SAFETY: q, out and lse have the lengths the shapes need (checked above, with D and Hk
        // of this cache and a validated q_indptr); seq_ids holds n_seqs ids; host memory on a
        // CPU context.
        check(unsafe {
            sys::kvarn_cache_attention(
                self.ptr(),
                layer,
                seq_ids.len(),
                seq_ids.as_ptr(),
                &p,
                q.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                lse_ptr,
            )
        })
    }

    /// Statistics: tokens, records, pages, bytes and the compression ratio.
    pub fn stats(&self) -> Result<CacheStats> {
        // SAFETY: plain old data with `size` set; a live cache.
        let s = unsafe {
            let mut s = std::mem::zeroed::<sys::kvarn_cache_stats_t>();
            s.size = std::mem::size_of::<sys::kvarn_cache_stats_t>();
            check(sys::kvarn_cache_get_stats(self.ptr(), &mut s))?;
            s
        };
        Ok(CacheStats {
            sequences: s.sequences,
            tokens: s.tokens,
            committed_tokens: s.committed_tokens,
            records: s.records,
            pages: s.pages,
            bytes_used: s.bytes_used,
            bytes_capacity: s.bytes_capacity,
            fp16_bytes: s.fp16_bytes,
            compression_ratio: s.compression_ratio,
        })
    }

    /// Serializes one sequence (all layers, committed and speculative state) as a versioned,
    /// checksummed blob, for [`import_sequence`](Cache::import_sequence) on a cache of the same
    /// config, layers and KV heads.
    pub fn export_sequence(&self, seq_id: i64) -> Result<Vec<u8>> {
        let mut bytes = 0usize;
        // SAFETY: buffer NULL asks for the size only.
        check(unsafe {
            sys::kvarn_cache_export_sequence(self.ptr(), seq_id, ptr::null_mut(), 0, &mut bytes)
        })?;
        let mut blob = vec![0u8; bytes];
        let mut written = 0usize;
        // SAFETY: blob holds `bytes` bytes.
        check(unsafe {
            sys::kvarn_cache_export_sequence(
                self.ptr(),
                seq_id,
                blob.as_mut_ptr().cast(),
                blob.len(),
                &mut written,
            )
        })?;
        blob.truncate(written);
        Ok(blob)
    }

    /// Adds sequence `seq_id` from an exported blob. Truncated, corrupted or foreign blobs give
    /// [`Status::CorruptData`](crate::Status::CorruptData) and change nothing.
    pub fn import_sequence(&mut self, seq_id: i64, blob: &[u8]) -> Result<()> {
        // SAFETY: blob is host memory of blob.len() bytes.
        check(unsafe {
            sys::kvarn_cache_import_sequence(self.ptr(), seq_id, blob.as_ptr().cast(), blob.len())
        })
    }
}

impl Drop for Cache<'_> {
    fn drop(&mut self) {
        // SAFETY: a live, owned handle; its context outlives it ('ctx).
        unsafe { sys::kvarn_cache_destroy(self.raw.as_ptr()) }
    }
}
