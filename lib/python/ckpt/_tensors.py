# SPDX-License-Identifier: Apache-2.0
"""How ckpt sees a tensor: (name, dtype, shape, address, nbytes), from a torch tensor, a numpy
array or any object with the buffer protocol / __array_interface__. Nothing here imports
torch: a torch tensor is recognised by its methods (data_ptr, is_contiguous, device)."""

import sys

import numpy as np

from ._args import text

# numpy kind + itemsize -> ckpt's dtype name.
_NUMPY = {("f", 2): "F16", ("f", 4): "F32", ("f", 8): "F64",
          ("i", 1): "I8", ("i", 2): "I16", ("i", 4): "I32", ("i", 8): "I64",
          ("u", 1): "U8", ("u", 2): "U16", ("u", 4): "U32", ("u", 8): "U64",
          ("b", 1): "BOOL"}
# str(torch dtype) -> ckpt's dtype name (bfloat16 is here; numpy has no bfloat16).
_TORCH = {"torch.float16": "F16", "torch.bfloat16": "BF16", "torch.float32": "F32", "torch.float64": "F64",
          "torch.int8": "I8", "torch.int16": "I16", "torch.int32": "I32", "torch.int64": "I64",
          "torch.uint8": "U8", "torch.bool": "BOOL"}
# ckpt's dtype name -> torch dtype attribute name, for rebuilding torch tensors.
TORCH_DTYPE = {v: k[len("torch."):] for k, v in _TORCH.items()}


def is_torch_tensor(v):
    return hasattr(v, "data_ptr") and hasattr(v, "is_contiguous") and hasattr(v, "device")


def describe(name, v, writable=False):
    """(name, dtype, shape, address, nbytes) of `v`; TypeError naming `name` for a tensor ckpt
    cannot take (not on the CPU, not contiguous, an unsupported dtype, not writable when
    `writable`). Returns the tuple and the object that owns the memory."""
    if is_torch_tensor(v):
        if v.device.type != "cpu":
            raise TypeError(f"tensor {name!r} is on {v.device}: ckpt takes CPU tensors (call .cpu() first)")
        if str(v.layout) != "torch.strided":
            raise TypeError(f"tensor {name!r} has layout {v.layout}: ckpt takes dense (strided) tensors")
        if not v.is_contiguous():
            raise TypeError(f"tensor {name!r} is not contiguous (strides {tuple(v.stride())}): "
                            "call .contiguous() first")
        dt = _TORCH.get(str(v.dtype))
        if dt is None:
            raise TypeError(f"tensor {name!r} has dtype {v.dtype}: ckpt takes "
                            + ", ".join(sorted(_TORCH)))
        nbytes = v.numel() * v.element_size()
        return (name, dt, [int(s) for s in v.shape], v.data_ptr() if nbytes else 0, nbytes), v
    if not isinstance(v, np.ndarray):
        if hasattr(v, "__array_interface__") or _has_buffer(v):
            v = np.asarray(v)
        else:
            raise TypeError(f"tensor {name!r} is a {type(v).__name__}: ckpt takes torch tensors, numpy arrays or "
                            "objects with the buffer protocol")
    if not v.flags["C_CONTIGUOUS"]:
        raise TypeError(f"tensor {name!r} is not contiguous (strides {v.strides}): "
                        "use np.ascontiguousarray first")
    if writable and not v.flags["WRITEABLE"]:
        raise TypeError(f"tensor {name!r} is read-only: load_into fills writable arrays")
    order = v.dtype.byteorder
    if order not in ("=", "|") and order != ("<" if sys.byteorder == "little" else ">"):
        raise TypeError(f"tensor {name!r} has non-native byte order ({v.dtype}): ckpt takes native arrays")
    dt = _NUMPY.get((v.dtype.kind, v.dtype.itemsize))
    if dt is None:
        raise TypeError(f"tensor {name!r} has dtype {v.dtype}: ckpt takes float16/32/64, int8..64, uint8..64, bool")
    addr = v.__array_interface__["data"][0] if v.nbytes else 0
    return (name, dt, [int(s) for s in v.shape], addr, int(v.nbytes)), v


def spec(name, v):
    """(name, dtype, shape) of `v`, on any device (what the size of its image depends on);
    TypeError as describe()."""
    if is_torch_tensor(v):
        dt = _TORCH.get(str(v.dtype))
        if dt is None:
            raise TypeError(f"tensor {name!r} has dtype {v.dtype}: ckpt takes " + ", ".join(sorted(_TORCH)))
        return (name, dt, [int(s) for s in v.shape])
    return describe(name, v)[0][:3]


def _has_buffer(v):
    try:
        memoryview(v)
        return True
    except TypeError:
        return False


def describe_all(tensors, writable=False):
    """describe() of every item of a dict name -> tensor; (tuples, owners)."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> tensor, not a {type(tensors).__name__}")
    out, keep = [], []
    for name, v in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__} ({name!r})")
        text(name, "tensor name")
        t, owner = describe(name, v, writable)
        out.append(t)
        keep.append(owner)
    return out, keep
