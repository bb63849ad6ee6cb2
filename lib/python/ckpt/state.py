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
float.hex() (bit-exact, NaN and infinities too), tuples, dicts with non-string keys (an
optimizer's parameter ids), bytes and integers beyond 64 bits tagged so they come back as
they were.
"""

import random as _random

import numpy as np

from ._tensors import TORCH_DTYPE, describe, is_torch_tensor

_TAGS = ("__tensor__", "__tuple__", "__dict__", "__float__", "__bytes__", "__int__")


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
    return _decode(template, flat)


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
        return {"__float__": v.hex()}
    if isinstance(v, (bytes, bytearray)):
        return {"__bytes__": bytes(v).hex()}
    if isinstance(v, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in v):
            return {k: _encode(x, path + [k], tensors) for k, x in v.items()}
        return {"__dict__": [[_encode_key(k, path), _encode(x, path + [str(k)], tensors)] for k, x in v.items()]}
    if isinstance(v, list):
        return [_encode(x, path + [str(i)], tensors) for i, x in enumerate(v)]
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x, path + [str(i)], tensors) for i, x in enumerate(v)]}
    raise TypeError(f"state_dict_to_tensors: {_where(path)} is a {type(v).__name__}, neither a tensor nor JSON "
                    "(None, bool, int, float, str, bytes, list, tuple, dict)")


def _encode_key(k, path):
    if k is None or isinstance(k, (bool, int, float, str, tuple, bytes)):
        return _encode(k, path + ["<key>"], {})
    raise TypeError(f"state_dict_to_tensors: a key of {_where(path)} is a {type(k).__name__}")


def _decode(s, flat):
    if isinstance(s, list):
        return [_decode(x, flat) for x in s]
    if not isinstance(s, dict):
        return s
    if "__tensor__" in s:
        name = s["__tensor__"]
        if name not in flat:
            raise KeyError(f"tensors_to_state_dict: tensor {name!r} is not among the {len(flat)} given")
        return _tensor(flat[name], s.get("kind", "numpy"), s.get("dtype"))
    if "__float__" in s:
        return float.fromhex(s["__float__"])
    if "__tuple__" in s:
        return tuple(_decode(x, flat) for x in s["__tuple__"])
    if "__dict__" in s:
        return {_hashable(_decode(k, flat)): _decode(x, flat) for k, x in s["__dict__"]}
    if "__bytes__" in s:
        return bytes.fromhex(s["__bytes__"])
    if "__int__" in s:
        return int(s["__int__"])
    return {k: _decode(x, flat) for k, x in s.items()}


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
