# SPDX-License-Identifier: Apache-2.0
"""Flattening nested training state into named tensors plus JSON, and back.

    tensors, skeleton = ckpt.state_dict_to_tensors({"model": model.state_dict(),
                                                    "optim": opt.state_dict(),
                                                    "sched": sched.state_dict(),
                                                    "rng": ckpt.rng_state()})
    c.save(rank, step, tensors, metadata={"state": skeleton})
    ...
    r = ckpt.open_latest(root)
    state = ckpt.tensors_to_state_dict(r.read_all(rank), r.metadata(rank)["state"])
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"]); ...

A tensor (torch or numpy) at path a -> b -> 3 -> c is named "a.b.3.c" (so an optimizer's
moment is "optim.state.3.exp_avg"); the skeleton is the same structure with each tensor
replaced by {"__tensor__": name, ...} and every other leaf kept as JSON: floats as
float.hex() (bit-exact; NaN and infinities in the manifest's own spelling, which keeps a
NaN's sign and payload), tuples, dicts with non-string keys (an optimizer's parameter ids),
bytes, integers beyond 64 bits, sets and frozensets, torch dtypes and devices tagged so they
come back as they were. A dict carrying a `_metadata` attribute (model.state_dict()'s
module versions) comes back as an OrderedDict with it, so load_state_dict sees it.
"""

import collections
import math
import random as _random

import numpy as np

from . import _args
from ._tensors import TORCH_DTYPE, describe, is_torch_tensor

_TAGS = ("__tensor__", "__tuple__", "__dict__", "__float__", "__bytes__", "__int__", "__set__", "__frozenset__",
         "__torch_dtype__", "__torch_device__", "__state_dict__")


def state_dict_to_tensors(obj):
    """(tensors, skeleton): the tensors of nested dicts / lists / tuples `obj` by dotted path,
    and a JSON-serialisable skeleton that tensors_to_state_dict rebuilds `obj` from. TypeError
    naming the path for a leaf that is neither a tensor nor JSON-representable; ValueError if
    two tensors would get the same name."""
    tensors = {}
    skeleton = _encode(obj, [], tensors)
    return tensors, skeleton


def tensors_to_state_dict(flat, template):
    """Rebuilds the object state_dict_to_tensors flattened: `template` its skeleton (e.g.
    from Reader.metadata(rank)), `flat` name -> tensor or array (Reader.read_all, or the
    tensors load_into filled). Tensors saved from torch come back as torch tensors (a copy of
    a numpy array, bf16 restored), numpy arrays as writable numpy copies; a value in `flat`
    that is already a torch tensor is used as it is. KeyError naming a missing tensor."""
    return _decode(template, flat, ())


def skeleton_tensors(template):
    """{name: (kind, dtype)} of every tensor a skeleton names ("torch", "numpy" or
    "numpy_scalar"; ckpt's dtype name)."""
    out = {}
    _walk_skeleton(template, out)
    return out


def live_tensors(obj):
    """{name: tensor} of the torch tensors and writable numpy arrays of `obj`, named as
    state_dict_to_tensors names them; other leaves (of any type) are passed over."""
    out = {}
    _walk_live(obj, [], out)
    return out


def load_state_into(state_dict, template, flat, loaded):
    """Replaces the leaves of `state_dict` in place by the object tensors_to_state_dict
    rebuilds from `template` and `flat`: the tensors named in `loaded` (already filled in place)
    stay the very objects they are, dicts and lists of `state_dict` are updated rather than
    replaced (a model's OrderedDict keeps its identity and gets the saved `_metadata`), every
    other leaf is the saved one."""
    _merge(state_dict, _decode(template, flat, loaded))


def rng_state():
    """The RNG states of Python's random, numpy's global RandomState and (if importable)
    torch's CPU generator, as one dict for state_dict_to_tensors."""
    st = {"random": _random.getstate(), "numpy": np.random.get_state()}
    torch = _torch(optional=True)
    if torch is not None:
        st["torch"] = torch.get_rng_state()
    return st


def set_rng_state(st):
    """Restores what rng_state() returned (after tensors_to_state_dict)."""
    _random.setstate(st["random"])
    np.random.set_state(st["numpy"])
    if "torch" in st:
        torch = _torch()
        t = st["torch"]
        if not is_torch_tensor(t):
            t = torch.from_numpy(np.array(t))
        torch.set_rng_state(t)


def _torch(optional=False):
    try:
        import torch
        return torch
    except ImportError:
        if optional:
            return None
        raise


def _where(path):
    return ".".join(path) or "<root>"


def _merge(dst, src):
    if isinstance(dst, dict) and isinstance(src, dict):
        for k, x in src.items():
            dst[k] = _merge(dst[k], x) if k in dst else x
        if hasattr(src, "_metadata"):
            try:
                dst._metadata = src._metadata
            except AttributeError:  # a plain dict takes no attribute
                pass
        return dst
    if isinstance(dst, list) and isinstance(src, list) and len(dst) == len(src):
        for i, x in enumerate(src):
            dst[i] = _merge(dst[i], x)
        return dst
    return src


def _walk_skeleton(s, out):
    if isinstance(s, list):
        for x in s:
            _walk_skeleton(x, out)
    elif isinstance(s, dict):
        if "__tensor__" in s:
            out[s["__tensor__"]] = (s.get("kind", "numpy"), s.get("dtype"))
        else:
            for x in s.values():
                _walk_skeleton(x, out)


def _walk_live(v, path, out):
    if is_torch_tensor(v) or (isinstance(v, np.ndarray) and v.flags["WRITEABLE"]):
        if path:
            out[".".join(path)] = v
    elif isinstance(v, dict):
        for k, x in v.items():
            _walk_live(x, path + [str(k)], out)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _walk_live(x, path + [str(i)], out)


def _is_torch(v, name):
    t = type(v)
    return t.__module__ == "torch" and t.__name__ == name


def _encode(v, path, tensors):
    if is_torch_tensor(v) or isinstance(v, np.ndarray) or isinstance(v, np.generic):
        name = ".".join(path)
        if not name:
            raise TypeError("state_dict_to_tensors: a tensor needs a path (put it in a dict)")
        if name in tensors:
            raise ValueError(f"state_dict_to_tensors: two tensors are named {name!r}")
        kind = "torch" if is_torch_tensor(v) else "numpy"
        if isinstance(v, np.generic):
            v, kind = np.asarray(v), "numpy_scalar"
        (_, dtype, _, _, _), _ = describe(name, v)
        tensors[name] = v
        return {"__tensor__": name, "kind": kind, "dtype": dtype}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v if -(1 << 63) <= v < (1 << 64) else {"__int__": str(v)}
    if isinstance(v, float):
        # Non-finite: the manifest's spelling (_args), which keeps a NaN's sign and payload.
        return {"__float__": v.hex() if math.isfinite(v) else _args._float_spelling(v)}
    if isinstance(v, (bytes, bytearray)):
        return {"__bytes__": bytes(v).hex()}
    if isinstance(v, dict):
        meta = getattr(v, "_metadata", None)
        if meta is not None:  # model.state_dict(): module versions, read by load_state_dict
            inner = dict(v)
            return {"__state_dict__": _encode(inner, path, tensors), "_metadata": _encode_plain(meta, path + ["_metadata"])}
        if all(isinstance(k, str) and not k.startswith("__") for k in v):
            return {k: _encode(x, path + [k], tensors) for k, x in v.items()}
        return {"__dict__": [[_encode_key(k, path), _encode(x, path + [str(k)], tensors)] for k, x in v.items()]}
    if isinstance(v, list):
        return [_encode(x, path + [str(i)], tensors) for i, x in enumerate(v)]
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x, path + [str(i)], tensors) for i, x in enumerate(v)]}
    if isinstance(v, (set, frozenset)):
        tag = "__frozenset__" if isinstance(v, frozenset) else "__set__"
        return {tag: [_encode_key(x, path, "an element") for x in v]}
    if _is_torch(v, "dtype"):
        return {"__torch_dtype__": str(v)[len("torch."):]}
    if _is_torch(v, "device"):
        return {"__torch_device__": str(v)}
    raise TypeError(f"state_dict_to_tensors: {_where(path)} is a {type(v).__name__} ({_short_repr(v)}), neither a tensor "
                    "nor a value a checkpoint holds (None, bool, int, float, str, bytes, list, tuple, dict, set, "
                    "torch.dtype, torch.device): leave it out of the state_dict and rebuild it on load "
                    "(docs/python.md, \"What cannot be saved\")")


def _short_repr(v):
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _encode_plain(v, path):
    """A value that must hold no tensor (a key, a set's element, _metadata)."""
    found = {}
    out = _encode(v, path, found)
    if found:
        raise TypeError(f"state_dict_to_tensors: {_where(path)} holds a tensor ({next(iter(found))!r}), which only "
                        "a value of a dict or list may")
    return out


def _encode_key(k, path, what="a key"):
    if k is None or isinstance(k, (bool, int, float, str, tuple, bytes, frozenset)) or _is_torch(k, "dtype") \
            or _is_torch(k, "device"):
        return _encode_plain(k, path + ["<key>"])
    raise TypeError(f"state_dict_to_tensors: {what} of {_where(path)} is a {type(k).__name__} ({_short_repr(k)})")


def _decode(s, flat, keep):
    if isinstance(s, list):
        return [_decode(x, flat, keep) for x in s]
    if not isinstance(s, dict):
        return s
    if "__tensor__" in s:
        name = s["__tensor__"]
        if name not in flat:
            raise KeyError(f"tensors_to_state_dict: tensor {name!r} is not among the {len(flat)} given")
        if name in keep:
            return flat[name]
        return _tensor(flat[name], s.get("kind", "numpy"), s.get("dtype"))
    if "__float__" in s:
        x = s["__float__"]
        untagged = _args._untag(s)
        return untagged if isinstance(untagged, float) else float.fromhex(x)
    if "__tuple__" in s:
        return tuple(_decode(x, flat, keep) for x in s["__tuple__"])
    if "__dict__" in s:
        return {_hashable(_decode(k, flat, keep)): _decode(x, flat, keep) for k, x in s["__dict__"]}
    if "__bytes__" in s:
        return bytes.fromhex(s["__bytes__"])
    if "__int__" in s:
        return int(s["__int__"])
    if "__set__" in s:
        return {_hashable(_decode(x, flat, keep)) for x in s["__set__"]}
    if "__frozenset__" in s:
        return frozenset(_hashable(_decode(x, flat, keep)) for x in s["__frozenset__"])
    if "__torch_dtype__" in s:
        return getattr(_torch(), s["__torch_dtype__"])
    if "__torch_device__" in s:
        return _torch().device(s["__torch_device__"])
    if "__state_dict__" in s:
        out = collections.OrderedDict(_decode(s["__state_dict__"], flat, keep))
        out._metadata = _ordered(_decode(s["_metadata"], flat, keep))
        return out
    return {k: _decode(x, flat, keep) for k, x in s.items()}


def _ordered(v):
    """torch keeps _metadata as an OrderedDict of dicts."""
    return collections.OrderedDict(v) if isinstance(v, dict) else v


def _hashable(k):
    return tuple(_hashable(x) for x in k) if isinstance(k, (list, tuple)) else k


def _tensor(v, kind, dtype):
    if kind == "torch":
        if is_torch_tensor(v):
            return v
        torch = _torch()
        a = np.array(v)
        if dtype == "BF16":  # numpy holds bf16 as uint16 bits; torch has int16, not uint16
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        t = torch.from_numpy(a)
        if dtype in TORCH_DTYPE and str(t.dtype) != "torch." + TORCH_DTYPE[dtype]:
            t = t.view(getattr(torch, TORCH_DTYPE[dtype]))
        return t
    a = v.numpy() if is_torch_tensor(v) else np.array(v)
    if is_torch_tensor(v):
        a = a.copy()
    return a[()] if kind == "numpy_scalar" else a
