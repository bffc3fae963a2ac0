//! Quantization configurations (`kvarn_config_t`) and presets.

use std::ffi::{CStr, CString};

use kvarn_sys as sys;

use crate::error::{check, Error, Result};

/// A quantization configuration: head dim D, tile tokens G, bit widths, Sinkhorn passes, sink
/// tiles and ablation flags. Start from [`Config::from_preset`] or `Config::default()` (preset
/// `k4v2_g128`, D 128), change fields, and [`validate`](Config::validate) if in doubt (every call
/// that takes a config validates it too).
///
/// ```
/// # fn main() -> kvarn::Result<()> {
/// let mut config = kvarn::Config::from_preset("k4v4_g64", 128)?;
/// assert_eq!((config.head_dim, config.tile_tokens, config.key_bits, config.value_bits), (128, 64, 4, 4));
/// assert_eq!(config.record_bytes()?, 128 * 64 * 8 / 8 + 6 * 128 + 6 * 64);
/// config.key_bits = 3;
/// assert_eq!(config.validate().unwrap_err().status(), kvarn::Status::Unsupported);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// D: 64, 80, 96, 128, 256, 512 (80 and 96: CPU contexts only).
    pub head_dim: i32,
    /// G: 64, 128.
    pub tile_tokens: i32,
    /// bK: 2, 4, 8.
    pub key_bits: i32,
    /// bV: 2, 4, 8.
    pub value_bits: i32,
    /// Sinkhorn passes T: 0..32 (default 8).
    pub iterations: i32,
    /// Leading tiles kept fp16: 0..64 (default 1).
    pub sink_tiles: i32,
    /// Ablation flags for K ([`Config::NO_ROTATION`], [`Config::NO_NORMALIZATION`]).
    pub key_flags: u32,
    /// Ablation flags for V.
    pub value_flags: u32,
}

/// Fields of a record in storage order (`kvarn_record_field_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordField {
    /// D rows x G codes of bK bits.
    KCodes,
    /// a: fp16 `[D]`.
    KScale,
    /// z: fp16 `[D]`.
    KZero,
    /// c: fp16 `[G]`.
    KTokenScale,
    /// G rows x D codes of bV bits.
    VCodes,
    /// c': fp16 `[D]`.
    VChannelScale,
    /// a': fp16 `[G]`.
    VScale,
    /// z': fp16 `[G]`.
    VZero,
}

impl Config {
    /// Ablation: the cache holds unrotated vectors (`KVARN_ABLATE_NO_ROTATION`).
    pub const NO_ROTATION: u32 = sys::KVARN_ABLATE_NO_ROTATION;
    /// Ablation: no Sinkhorn passes, plain per-row RTN (`KVARN_ABLATE_NO_NORMALIZATION`).
    pub const NO_NORMALIZATION: u32 = sys::KVARN_ABLATE_NO_NORMALIZATION;

    /// A preset (`"k4v2_g128"`, ..., any `"k<b>v<b>_g<G>"` with b in {2,4,8}, G in {64,128})
    /// for a head dim; other fields get their defaults. Unknown names give
    /// [`Status::NotFound`](crate::Status::NotFound).
    pub fn from_preset(name: &str, head_dim: i32) -> Result<Config> {
        let cname =
            CString::new(name).map_err(|_| Error::invalid("preset name contains a NUL byte"))?;
        let mut raw = raw_defaults();
        // SAFETY: cname is NUL-terminated, raw is a valid kvarn_config_t.
        check(unsafe { sys::kvarn_config_from_preset(cname.as_ptr(), head_dim, &mut raw) })?;
        Ok(Config::from_raw(&raw))
    }

    /// Checks every field: `Ok` if supported, else `Unsupported` or `InvalidArgument`.
    pub fn validate(&self) -> Result<()> {
        let raw = self.raw();
        // SAFETY: raw is a valid, initialized kvarn_config_t.
        check(unsafe { sys::kvarn_config_validate(&raw) })
    }

    /// Bytes of one record: D*G*(bK+bV)/8 + 6D + 6G.
    pub fn record_bytes(&self) -> Result<usize> {
        let raw = self.raw();
        let mut bytes = 0usize;
        // SAFETY: valid pointers to locals.
        check(unsafe { sys::kvarn_record_bytes(&raw, &mut bytes) })?;
        Ok(bytes)
    }

    /// Byte offset and length of one field inside a record.
    pub fn record_field(&self, field: RecordField) -> Result<(usize, usize)> {
        let raw = self.raw();
        let f = match field {
            RecordField::KCodes => sys::KVARN_FIELD_K_CODES,
            RecordField::KScale => sys::KVARN_FIELD_K_SCALE,
            RecordField::KZero => sys::KVARN_FIELD_K_ZERO,
            RecordField::KTokenScale => sys::KVARN_FIELD_K_TOKEN_SCALE,
            RecordField::VCodes => sys::KVARN_FIELD_V_CODES,
            RecordField::VChannelScale => sys::KVARN_FIELD_V_CHANNEL_SCALE,
            RecordField::VScale => sys::KVARN_FIELD_V_SCALE,
            RecordField::VZero => sys::KVARN_FIELD_V_ZERO,
        };
        let (mut offset, mut bytes) = (0usize, 0usize);
        // SAFETY: valid pointers to locals.
        check(unsafe { sys::kvarn_record_field(&raw, f, &mut offset, &mut bytes) })?;
        Ok((offset, bytes))
    }

    pub(crate) fn raw(&self) -> sys::kvarn_config_t {
        let mut raw = raw_defaults();
        raw.head_dim = self.head_dim;
        raw.tile_tokens = self.tile_tokens;
        raw.key_bits = self.key_bits;
        raw.value_bits = self.value_bits;
        raw.iterations = self.iterations;
        raw.sink_tiles = self.sink_tiles;
        raw.key_flags = self.key_flags;
        raw.value_flags = self.value_flags;
        raw
    }

    pub(crate) fn from_raw(raw: &sys::kvarn_config_t) -> Config {
        Config {
            head_dim: raw.head_dim,
            tile_tokens: raw.tile_tokens,
            key_bits: raw.key_bits,
            value_bits: raw.value_bits,
            iterations: raw.iterations,
            sink_tiles: raw.sink_tiles,
            key_flags: raw.key_flags,
            value_flags: raw.value_flags,
        }
    }

    /// D and G as usize, for slice arithmetic (InvalidArgument when not positive).
    pub(crate) fn dims(&self) -> Result<(usize, usize)> {
        Ok((
            crate::positive(self.head_dim, "config.head_dim")?,
            crate::positive(self.tile_tokens, "config.tile_tokens")?,
        ))
    }
}

impl Default for Config {
    /// Preset `k4v2_g128`, D 128, T 8, one sink tile, no ablation (`kvarn_config_defaults`).
    fn default() -> Config {
        Config::from_raw(&raw_defaults())
    }
}

fn raw_defaults() -> sys::kvarn_config_t {
    // SAFETY: kvarn_config_t is plain old data; the defaults function fills every field.
    unsafe {
        let mut raw = std::mem::zeroed::<sys::kvarn_config_t>();
        sys::kvarn_config_defaults(&mut raw);
        raw
    }
}

/// The names of the named presets (`"k4v2_g128"` first, the default).
///
/// ```
/// assert!(kvarn::presets().contains(&"k4v2_g128"));
/// ```
pub fn presets() -> Vec<&'static str> {
    // SAFETY: a pure function.
    let n = unsafe { sys::kvarn_preset_count() };
    (0..n)
        .filter_map(|i| {
            // SAFETY: static storage or NULL for an index out of range.
            let p = unsafe { sys::kvarn_preset_name(i) };
            if p.is_null() {
                None
            } else {
                // SAFETY: non-NULL, NUL-terminated, static.
                unsafe { CStr::from_ptr(p) }.to_str().ok()
            }
        })
        .collect()
}
