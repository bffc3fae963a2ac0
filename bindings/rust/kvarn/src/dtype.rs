//! Element types: `f32`, [`F16`] and [`Bf16`], and the sealed [`Element`] trait that maps them
//! to `kvarn_dtype_t`.

use kvarn_sys as sys;

/// The dtypes of tensors (`kvarn_dtype_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

impl Dtype {
    pub(crate) fn raw(self) -> sys::kvarn_dtype_t {
        match self {
            Dtype::F32 => sys::KVARN_DTYPE_F32,
            Dtype::F16 => sys::KVARN_DTYPE_F16,
            Dtype::Bf16 => sys::KVARN_DTYPE_BF16,
        }
    }

    /// Bytes per element (`kvarn_dtype_size`).
    pub fn size(self) -> usize {
        // SAFETY: a pure function of its argument.
        unsafe { sys::kvarn_dtype_size(self.raw()) }
    }
}

/// An IEEE binary16 value, stored as its bits.
///
/// ```
/// use kvarn::F16;
/// assert_eq!(F16::from_f32(1.5).to_f32(), 1.5);
/// assert_eq!(F16::from_f32(1.0 + 1.0 / 4096.0).to_f32(), 1.0); // rounds to nearest even
/// assert_eq!(F16::from_f32(1e6).to_f32(), f32::INFINITY);
/// ```
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct F16(pub u16);

impl F16 {
    /// Rounds to the nearest binary16 (ties to even); beyond 65504 gives infinity.
    pub fn from_f32(x: f32) -> F16 {
        let b = x.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32;
        let man = b & 0x007f_ffff;
        if exp == 0xff {
            let nan = if man != 0 {
                0x0200 | (man >> 13) as u16
            } else {
                0
            };
            return F16(sign | 0x7c00 | nan);
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        if e <= 0 {
            if e < -10 {
                return F16(sign);
            }
            // Subnormal: the value in units of 2^-24.
            let m = man | 0x0080_0000;
            let shift = (14 - e) as u32;
            let mut h = m >> shift;
            let rem = m & ((1u32 << shift) - 1);
            let half = 1u32 << (shift - 1);
            if rem > half || (rem == half && (h & 1) == 1) {
                h += 1;
            }
            return F16(sign | h as u16);
        }
        let mut h = ((e as u32) << 10) | (man >> 13);
        let rem = man & 0x1fff;
        if rem > 0x1000 || (rem == 0x1000 && (h & 1) == 1) {
            h += 1; // a carry into the exponent is right, up to infinity
        }
        F16(sign | h as u16)
    }

    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        let h = self.0 as u32;
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x03ff;
        let bits = if exp == 0 {
            let mag = man as f32 * (1.0 / 16_777_216.0); // man * 2^-24, exact
            return if sign != 0 { -mag } else { mag };
        } else if exp == 0x1f {
            sign | 0x7f80_0000 | (man << 13)
        } else {
            sign | ((exp + 112) << 23) | (man << 13)
        };
        f32::from_bits(bits)
    }
}

/// A bfloat16 value, stored as its bits.
///
/// ```
/// use kvarn::Bf16;
/// assert_eq!(Bf16::from_f32(3.0).to_f32(), 3.0);
/// assert_eq!(Bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0); // rounds to nearest even
/// ```
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// Rounds to the nearest bfloat16 (ties to even).
    pub fn from_f32(x: f32) -> Bf16 {
        let b = x.to_bits();
        if x.is_nan() {
            return Bf16(((b >> 16) as u16) | 0x0040);
        }
        let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1));
        Bf16((rounded >> 16) as u16)
    }

    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::F16 {}
    impl Sealed for super::Bf16 {}
}

/// An element type the library reads and writes: `f32`, [`F16`] or [`Bf16`]. Sealed: the
/// library knows no other.
pub trait Element: Copy + Default + sealed::Sealed + 'static {
    /// The dtype passed to the library for slices of this type.
    const DTYPE: Dtype;
    /// Converts from f32 (rounding to nearest even).
    fn from_f32(x: f32) -> Self;
    /// Converts to f32 (exact).
    fn to_f32(self) -> f32;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Element for F16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f32(x: f32) -> F16 {
        F16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        F16::to_f32(self)
    }
}

impl Element for Bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn from_f32(x: f32) -> Bf16 {
        Bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        Bf16::to_f32(self)
    }
}
