//! Statuses and the error type.

use std::ffi::CStr;
use std::fmt;

use kvarn_sys as sys;

/// A failing status of the C API (`kvarn_status_t` without `KVARN_OK`); the values are pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// `KVARN_ERR_INVALID_ARGUMENT`: a bad size, value or slice length (also raised by this crate
    /// before calling the library, when a slice does not have the length the shapes need).
    InvalidArgument,
    /// `KVARN_ERR_UNSUPPORTED`: valid but unsupported (shape, dtype, bits, backend operation).
    Unsupported,
    /// `KVARN_ERR_OUT_OF_MEMORY`.
    OutOfMemory,
    /// `KVARN_ERR_BACKEND_UNAVAILABLE`: backend not built or no device present.
    BackendUnavailable,
    /// `KVARN_ERR_NON_FINITE`: NaN or Inf in an input.
    NonFinite,
    /// `KVARN_ERR_OVERFLOW`: a value or scale does not fit fp16.
    Overflow,
    /// `KVARN_ERR_CAPACITY`: a managed cache limit would be exceeded.
    Capacity,
    /// `KVARN_ERR_NOT_FOUND`: unknown sequence id, preset name or index.
    NotFound,
    /// `KVARN_ERR_ALREADY_EXISTS`: sequence id already in use.
    AlreadyExists,
    /// `KVARN_ERR_CORRUPT_DATA`: blob truncated, bit-flipped or of another version.
    CorruptData,
    /// `KVARN_ERR_BUFFER_TOO_SMALL`.
    BufferTooSmall,
    /// `KVARN_ERR_INVALID_STATE`: operation not allowed in the current state.
    InvalidState,
    /// `KVARN_ERR_DEVICE`: a device (CUDA/HIP) call failed.
    Device,
    /// `KVARN_ERR_INTERNAL`: a bug in libkvarn.
    Internal,
    /// A status this crate does not know (a newer library).
    Unknown(u32),
}

impl Status {
    pub(crate) fn from_raw(raw: sys::kvarn_status_t) -> Status {
        match raw {
            sys::KVARN_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::KVARN_ERR_UNSUPPORTED => Status::Unsupported,
            sys::KVARN_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::KVARN_ERR_BACKEND_UNAVAILABLE => Status::BackendUnavailable,
            sys::KVARN_ERR_NON_FINITE => Status::NonFinite,
            sys::KVARN_ERR_OVERFLOW => Status::Overflow,
            sys::KVARN_ERR_CAPACITY => Status::Capacity,
            sys::KVARN_ERR_NOT_FOUND => Status::NotFound,
            sys::KVARN_ERR_ALREADY_EXISTS => Status::AlreadyExists,
            sys::KVARN_ERR_CORRUPT_DATA => Status::CorruptData,
            sys::KVARN_ERR_BUFFER_TOO_SMALL => Status::BufferTooSmall,
            sys::KVARN_ERR_INVALID_STATE => Status::InvalidState,
            sys::KVARN_ERR_DEVICE => Status::Device,
            sys::KVARN_ERR_INTERNAL => Status::Internal,
            other => Status::Unknown(other as u32),
        }
    }

    /// The pinned numeric value of the status (`KVARN_ERR_*`).
    pub fn code(self) -> u32 {
        (match self {
            Status::InvalidArgument => sys::KVARN_ERR_INVALID_ARGUMENT,
            Status::Unsupported => sys::KVARN_ERR_UNSUPPORTED,
            Status::OutOfMemory => sys::KVARN_ERR_OUT_OF_MEMORY,
            Status::BackendUnavailable => sys::KVARN_ERR_BACKEND_UNAVAILABLE,
            Status::NonFinite => sys::KVARN_ERR_NON_FINITE,
            Status::Overflow => sys::KVARN_ERR_OVERFLOW,
            Status::Capacity => sys::KVARN_ERR_CAPACITY,
            Status::NotFound => sys::KVARN_ERR_NOT_FOUND,
            Status::AlreadyExists => sys::KVARN_ERR_ALREADY_EXISTS,
            Status::CorruptData => sys::KVARN_ERR_CORRUPT_DATA,
            Status::BufferTooSmall => sys::KVARN_ERR_BUFFER_TOO_SMALL,
            Status::InvalidState => sys::KVARN_ERR_INVALID_STATE,
            Status::Device => sys::KVARN_ERR_DEVICE,
            Status::Internal => sys::KVARN_ERR_INTERNAL,
            Status::Unknown(code) => return code,
        }) as u32
    }

    /// The library's English description of the status (`kvarn_status_string`).
    pub fn description(self) -> &'static str {
        // SAFETY: kvarn_status_string never returns NULL and points to static storage; any
        // value is accepted ("unknown status").
        let s = unsafe { CStr::from_ptr(sys::kvarn_status_string(self.code() as _)) };
        s.to_str().unwrap_or("unknown status")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// The error of every fallible call: the status and the detail message the library left in
/// `kvarn_last_error()` (or the message of this crate's own argument check).
///
/// ```
/// let err = kvarn::Config::from_preset("k3v3_g128", 128).unwrap_err();
/// assert_eq!(err.status(), kvarn::Status::NotFound);
/// assert!(!err.message().is_empty());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error with a given status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    /// The error of a failed C call: reads `kvarn_last_error()` of this thread, which must be
    /// called right after the failing call.
    pub(crate) fn last(raw: sys::kvarn_status_t) -> Error {
        // SAFETY: never NULL, NUL-terminated, valid until the next fallible call on this thread;
        // copied at once.
        let msg = unsafe { CStr::from_ptr(sys::kvarn_last_error()) };
        Error {
            status: Status::from_raw(raw),
            message: msg.to_string_lossy().into_owned(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    /// The status.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The detail message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "kvarn: {}", self.status)
        } else {
            write!(f, "kvarn: {}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// `Result<T, kvarn::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// Ok for `KVARN_OK`, else the error with this thread's last message.
pub(crate) fn check(raw: sys::kvarn_status_t) -> Result<()> {
    if raw == sys::KVARN_OK {
        Ok(())
    } else {
        Err(Error::last(raw))
    }
}
