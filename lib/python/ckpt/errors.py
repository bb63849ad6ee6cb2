# SPDX-License-Identifier: Apache-2.0
"""ckpt's exceptions: one ckpt.Error per failure, a subclass per error code.

Every error the C++ library raises (a ckpt::Error) arrives as an instance of the subclass of
its code, with the fields of the C++ error: ``code`` (e.g. ``"checksum_mismatch"``),
``file``, ``detail``, ``expected``, ``actual`` and ``errno``; ``str(e)`` is the full message.
The errors the Python side raises itself (an argument it refuses before the C++ library sees
it, a wait's timeout) have the same fields and the same wording.
"""


class Error(Exception):
    """Base of every ckpt error. ``code`` names the kind (the C++ ckpt::Errc)."""

    code = "error"

    def __init__(self, message, file="", detail="", expected="", actual="", errno=0):
        super().__init__(message)
        self.message = message
        self.file = file
        self.detail = detail
        self.expected = expected
        self.actual = actual
        self.errno = errno


class WorldSizeMismatch(Error):
    """The checkpoint was written at another world size."""
    code = "world_size_mismatch"


class MissingShard(Error):
    """A shard file the manifest lists does not exist."""
    code = "missing_shard"


class SizeMismatch(Error):
    """A file's size (or a target buffer's) differs from the recorded one."""
    code = "size_mismatch"


class ChecksumMismatch(Error):
    """An XXH3 or SHA-256 of a file or chunk differs from the manifest's."""
    code = "checksum_mismatch"


class MalformedManifest(Error):
    """manifest.json is not valid JSON or violates the schema."""
    code = "malformed_manifest"


class MalformedShard(Error):
    """A shard's safetensors header is invalid."""
    code = "malformed_shard"


class UnsupportedSchema(Error):
    """The manifest's schema_version is one this build cannot read."""
    code = "unsupported_schema"


class UnsafePath(Error):
    """A path in a manifest escapes its directory or names a symlink."""
    code = "unsafe_path"


class IoError(Error):
    """A system call failed (``errno`` says which error)."""
    code = "io_error"


class NoSpace(IoError):
    """ENOSPC / EDQUOT while writing."""
    code = "no_space"


class NotFound(Error):
    """No such checkpoint, tensor or directory."""
    code = "not_found"


class InvalidArgument(Error, ValueError):
    """The caller passed something unusable."""
    code = "invalid_argument"


class Aborted(Error):
    """The operation was cancelled (shutdown, a peer failed)."""
    code = "aborted"


class CommError(Error):
    """A collective or the commit coordination between processes failed."""
    code = "comm_error"


class Busy(Error):
    """Another writer holds the root's lock (the message names its pid)."""
    code = "busy"


class Timeout(Error, TimeoutError):
    """A wait given ``timeout=`` ran out before what it waits for; that goes on (wait again,
    or close the Checkpointer, which drains it). Raised by the Python side only."""
    code = "timeout"


class Conflict(Error):
    """An object store refused a conditional write (HTTP 412): the key exists, or its ETag moved."""
    code = "conflict"


_BY_CODE = {cls.code: cls for cls in (WorldSizeMismatch, MissingShard, SizeMismatch, ChecksumMismatch, MalformedManifest,
                                      MalformedShard, UnsupportedSchema, UnsafePath, IoError, NoSpace, NotFound,
                                      InvalidArgument, Aborted, CommError, Busy, Conflict)}


def _compose(name, file, detail, expected, actual):
    """The message of an error, worded as the C++ library words them (ckpt::Error::what)."""
    m = name
    if file:
        m += ": " + file
    if detail:
        m += ": " + detail
    if expected or actual:
        m += ": expected " + (expected or "-") + ", actual " + (actual or "-")
    return m


def _invalid(detail, expected="", actual=""):
    """An InvalidArgument for an argument the Python side refuses."""
    return InvalidArgument(_compose("invalid argument", "", detail, expected, actual), "", detail, expected, actual)


def _timeout(detail, expected, actual):
    return Timeout(_compose("timeout", "", detail, expected, actual), "", detail, expected, actual)


def _from_core(code, message, file, detail, expected, actual, errno):
    """Called by ckpt._core to turn a ckpt::Error into the exception to raise."""
    cls = _BY_CODE.get(code, Error)
    e = cls(message, file, detail, expected, actual, errno)
    if cls is Error:
        e.code = code
    return e
