"""Statuses and the exception hierarchy of the kvarn package.

Every failing C call raises a subclass of :class:`Error` chosen by its status (the numbers are the
pinned ``kvarn_status_t`` values). Checks the package makes before calling the library (dtype,
shape, layout, device) raise subclasses of :class:`InvalidArgumentError` with status
``INVALID_ARGUMENT``, as the library would for a bad argument.
"""

from __future__ import annotations

import enum

from . import capi


class Status(enum.IntEnum):
    """``kvarn_status_t`` (values are pinned and stable)."""

    OK = capi.OK
    INVALID_ARGUMENT = capi.ERR_INVALID_ARGUMENT
    UNSUPPORTED = capi.ERR_UNSUPPORTED
    OUT_OF_MEMORY = capi.ERR_OUT_OF_MEMORY
    BACKEND_UNAVAILABLE = capi.ERR_BACKEND_UNAVAILABLE
    NON_FINITE = capi.ERR_NON_FINITE
    OVERFLOW = capi.ERR_OVERFLOW
    CAPACITY = capi.ERR_CAPACITY
    NOT_FOUND = capi.ERR_NOT_FOUND
    ALREADY_EXISTS = capi.ERR_ALREADY_EXISTS
    CORRUPT_DATA = capi.ERR_CORRUPT_DATA
    BUFFER_TOO_SMALL = capi.ERR_BUFFER_TOO_SMALL
    INVALID_STATE = capi.ERR_INVALID_STATE
    DEVICE = capi.ERR_DEVICE
    INTERNAL = capi.ERR_INTERNAL


class Error(Exception):
    """A libkvarn failure. ``status`` is the :class:`Status`, ``detail`` the library's message
    (``kvarn_last_error()``)."""

    status: Status = Status.INTERNAL

    def __init__(self, detail: str = "", status: "Status | int | None" = None) -> None:
        if status is not None:
            try:
                self.status = Status(status)
            except ValueError:  # a status newer than this package: keep the number
                self.status = status  # type: ignore[assignment]
        self.detail = detail
        super().__init__(detail)

    @property
    def status_string(self) -> str:
        """The library's description of the status (``kvarn_status_string``)."""
        return capi.status_string(int(self.status))

    def __str__(self) -> str:
        name = self.status.name if isinstance(self.status, Status) else str(int(self.status))
        if self.detail:
            return f"{name}: {self.detail}"
        return f"{name}: {self.status_string}"


class InvalidArgumentError(Error, ValueError):
    """NULL pointer, bad size, bad value (``KVARN_ERR_INVALID_ARGUMENT``)."""

    status = Status.INVALID_ARGUMENT


class DTypeError(InvalidArgumentError, TypeError):
    """An array of a dtype the call does not take (checked by the package)."""


class ShapeError(InvalidArgumentError):
    """An array of the wrong shape (checked by the package)."""


class LayoutError(InvalidArgumentError):
    """A non-contiguous or read-only array where the call needs a dense (writable) one."""


class DeviceMismatchError(InvalidArgumentError):
    """An array on another device than the context's (a CPU array on a CUDA context, ...)."""


class UnsupportedError(Error):
    """Valid but unsupported shape, dtype, bits or backend operation."""

    status = Status.UNSUPPORTED


class OutOfMemoryError(Error, MemoryError):
    """An allocation failed."""

    status = Status.OUT_OF_MEMORY


class BackendUnavailableError(Error):
    """The backend is not built or no device is present."""

    status = Status.BACKEND_UNAVAILABLE


class NonFiniteError(Error, ValueError):
    """NaN or Inf in an input."""

    status = Status.NON_FINITE


class Fp16OverflowError(Error, ValueError):
    """A value or scale does not fit fp16 (``KVARN_ERR_OVERFLOW``)."""

    status = Status.OVERFLOW


class CapacityError(Error):
    """A managed cache limit would be exceeded."""

    status = Status.CAPACITY


class NotFoundError(Error, LookupError):
    """Unknown sequence id, preset name or index."""

    status = Status.NOT_FOUND


class AlreadyExistsError(Error):
    """The sequence id is already in use."""

    status = Status.ALREADY_EXISTS


class CorruptDataError(Error):
    """A blob is truncated, bit-flipped or of another version."""

    status = Status.CORRUPT_DATA


class BufferTooSmallError(Error):
    """An output or workspace buffer is too small."""

    status = Status.BUFFER_TOO_SMALL


class InvalidStateError(Error):
    """The operation is not allowed in the current state."""

    status = Status.INVALID_STATE


class DeviceError(Error):
    """A device (CUDA/HIP) call failed."""

    status = Status.DEVICE


class InternalError(Error):
    """A bug in libkvarn: please report it."""

    status = Status.INTERNAL


class SelftestError(Error):
    """:func:`kvarn.selftest` found a failing check; ``report`` holds every row."""

    status = Status.INTERNAL

    def __init__(self, detail: str, report: object) -> None:
        super().__init__(detail)
        self.report = report


ERROR_CLASSES: "dict[Status, type[Error]]" = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.BACKEND_UNAVAILABLE: BackendUnavailableError,
    Status.NON_FINITE: NonFiniteError,
    Status.OVERFLOW: Fp16OverflowError,
    Status.CAPACITY: CapacityError,
    Status.NOT_FOUND: NotFoundError,
    Status.ALREADY_EXISTS: AlreadyExistsError,
    Status.CORRUPT_DATA: CorruptDataError,
    Status.BUFFER_TOO_SMALL: BufferTooSmallError,
    Status.INVALID_STATE: InvalidStateError,
    Status.DEVICE: DeviceError,
    Status.INTERNAL: InternalError,
}


def error_for_status(status: int, detail: str) -> Error:
    """The exception instance for a failing status (the factory the C module calls)."""
    try:
        cls = ERROR_CLASSES.get(Status(status), Error)
    except ValueError:
        cls = Error
    return cls(detail, status)


capi._set_error_factory(error_for_status)
