# SPDX-License-Identifier: Apache-2.0
"""The arguments of the API, checked before ckpt._core sees them: what the binding would refuse
with a TypeError listing its signatures (a float step, a step past 2**64, a str with a lone
surrogate) is a ckpt.InvalidArgument naming the argument, with the expected and actual value.

JSON arguments (metadata, training, sharding) travel as text. JSON has no NaN or infinity:
such a float is sent as {"__float__": S}, which the manifest keeps (docs/format.md, "Free-form
metadata") and which comes back as the float, bit for bit: S is "inf", "-inf", "nan" (the
default quiet NaN, bits 0x7ff8000000000000) or "nan:0x" and the 16 hex digits of any other
NaN's bits (sign and payload). The C++ side (format/manifest.hpp, tag_non_finite) writes and
reads the same spelling, so C++ readers see the double.
"""

import datetime
import json
import math
import numbers
import operator
import os
import struct

from .errors import _invalid

_DEFAULT_NAN = 0x7FF8000000000000


def integer(v, name, lo, hi):
    """v as an int in lo..hi: an int or anything with __index__ (numpy integers), not a float
    (even 3.0: a float step is a bug upstream, never truncated here)."""
    try:
        i = operator.index(v)
    except TypeError:
        raise _invalid(name, f"an integer in {lo}..{hi}", f"{v!r} ({type(v).__name__})") from None
    if not lo <= i <= hi:
        raise _invalid(name, f"an integer in {lo}..{hi}", str(i))
    return i


def text(v, name):
    """A str the binding can pass as UTF-8 (no lone surrogate)."""
    if not isinstance(v, str):
        raise _invalid(name, "a str", f"{v!r} ({type(v).__name__})")
    _utf8(v, name, "text encodable as UTF-8 (no lone surrogate)", lambda e: f"{v!r} (a lone surrogate at index {e.start})")
    return v


def _utf8(s, name, expected, actual):
    """InvalidArgument naming `name` if `s` has a lone surrogate (actual(the error) says where)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _invalid(name, expected, actual(e)) from None


def path(v, name):
    """A root path (str or os.PathLike) as a str the binding can pass."""
    try:
        p = os.fspath(v)
    except TypeError:
        raise _invalid(name, "a path (str or os.PathLike)", f"{v!r} ({type(v).__name__})") from None
    if isinstance(p, bytes):
        raise _invalid(name, "a path given as str", repr(p))
    return text(p, name)


def timeout(t, name="timeout"):
    """Seconds (a real number or a datetime.timedelta, finite and >= 0) or None."""
    if t is None:
        return None
    if isinstance(t, datetime.timedelta):
        t = t.total_seconds()
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise _invalid(name, "seconds (a number >= 0) or None", f"{t!r} ({type(t).__name__})")
    t = float(t)
    if not (math.isfinite(t) and t >= 0):
        raise _invalid(name, "seconds (a number >= 0) or None", repr(t))
    return t


def _float_spelling(x):
    if x == math.inf:
        return "inf"
    if x == -math.inf:
        return "-inf"
    bits = struct.unpack("<Q", struct.pack("<d", x))[0]
    return "nan" if bits == _DEFAULT_NAN else f"nan:0x{bits:016x}"


def _tag_non_finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return {"__float__": _float_spelling(v)}
    if isinstance(v, dict):
        return {k: _tag_non_finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_tag_non_finite(x) for x in v]
    return v


def _untag(d):
    if len(d) != 1 or not isinstance(d.get("__float__"), str):
        return d
    s = d["__float__"]
    if s in ("inf", "-inf"):
        return float(s)
    if s == "nan":
        bits = _DEFAULT_NAN
    elif len(s) == 22 and s.startswith("nan:0x"):
        try:
            bits = int(s[6:], 16)
        except ValueError:
            return d
    else:
        return d
    x = struct.unpack("<d", struct.pack("<Q", bits))[0]
    return x if math.isnan(x) else d


def to_json(obj, name):
    """JSON text of `obj` (None: ""), non-finite floats tagged. TypeError for what JSON cannot
    hold (json.dumps's); InvalidArgument naming `name` for a str with a lone surrogate."""
    if obj is None:
        return ""
    try:
        out = json.dumps(obj, allow_nan=False, ensure_ascii=False)
    except ValueError as e:
        if "Out of range float" not in str(e):
            raise
        out = json.dumps(_tag_non_finite(obj), allow_nan=False, ensure_ascii=False)
    _utf8(out, name, "JSON whose strings and keys are encodable as UTF-8 (no lone surrogate)",
          lambda e: f"a lone surrogate {out[e.start:e.end]!r} in {out[max(0, e.start - 20):e.end + 20]!r}")
    return out


def from_json(text):
    """What to_json (or the C++ side) wrote, tags turned back into floats."""
    return json.loads(text, object_hook=_untag)
