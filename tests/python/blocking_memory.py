# SPDX-License-Identifier: Apache-2.0
"""Memory whose first read blocks until the test releases it: anonymous pages registered with
Linux's userfaultfd for missing-page faults, user-mode faults only (UFFD_USER_MODE_ONLY, so no
privilege is needed), with nobody serving the faults. A deferred save's copy from such an array
waits inside memcpy on ckpt's thread, which holds SaveHandle.wait_staged() for as long as a
test needs. release() closes the userfaultfd: the waiting reads go on and see zeros.

    mem = BlockingMemory(1 << 20)   # or pytest.skip(BlockingMemory.unavailable())
    h = c.save(0, 1, {"w": mem.array}, deferred=True)
    ...                             # h.wait_staged() blocks here
    mem.release()
"""

import ctypes
import os
import platform

import numpy as np

_SYS_USERFAULTFD = {"x86_64": 323, "aarch64": 282}
_UFFD_USER_MODE_ONLY = 1
_UFFD_API = 0xAA
# _IOWR(0xAA, nr, size): (3 << 30) | (size << 16) | (0xAA << 8) | nr
_UFFDIO_API = (3 << 30) | (24 << 16) | (0xAA << 8) | 0x3F
_UFFDIO_REGISTER = (3 << 30) | (32 << 16) | (0xAA << 8) | 0x00
_UFFDIO_REGISTER_MODE_MISSING = 1
_PROT_READ_WRITE = 3
_MAP_PRIVATE_ANONYMOUS = 0x02 | 0x20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]


class _Api(ctypes.Structure):
    _fields_ = [("api", ctypes.c_uint64), ("features", ctypes.c_uint64), ("ioctls", ctypes.c_uint64)]


class _Register(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("len", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("ioctls", ctypes.c_uint64)]


class BlockingMemory:
    def __init__(self, nbytes):
        nbytes = (nbytes + 4095) // 4096 * 4096
        nr = _SYS_USERFAULTFD.get(platform.machine())
        if nr is None:
            raise OSError(f"no userfaultfd syscall number for {platform.machine()}")
        self._fd = _libc.syscall(nr, os.O_CLOEXEC | _UFFD_USER_MODE_ONLY)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "userfaultfd: " + os.strerror(ctypes.get_errno()))
        api = _Api(_UFFD_API, 0, 0)
        if _libc.ioctl(self._fd, _UFFDIO_API, ctypes.byref(api)) != 0:
            self.release()
            raise OSError(ctypes.get_errno(), "UFFDIO_API: " + os.strerror(ctypes.get_errno()))
        addr = _libc.mmap(None, nbytes, _PROT_READ_WRITE, _MAP_PRIVATE_ANONYMOUS, -1, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            self.release()
            raise OSError(ctypes.get_errno(), "mmap")
        reg = _Register(addr, nbytes, _UFFDIO_REGISTER_MODE_MISSING, 0)
        if _libc.ioctl(self._fd, _UFFDIO_REGISTER, ctypes.byref(reg)) != 0:
            self.release()
            raise OSError(ctypes.get_errno(), "UFFDIO_REGISTER: " + os.strerror(ctypes.get_errno()))
        # A view of the pages; making it reads nothing (the mapping stays for the process's life).
        self.array = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))

    def release(self):
        """Lets every read waiting on the memory go on (it reads zeros). Idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @staticmethod
    def unavailable():
        """None if BlockingMemory works here, else why not (for a skip message)."""
        try:
            BlockingMemory(4096).release()
            return None
        except OSError as e:
            return f"userfaultfd unavailable here ({e}): a read that blocks cannot be made"
