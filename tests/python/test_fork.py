# SPDX-License-Identifier: Apache-2.0
# A process forked from one with an open Checkpointer (a data-loader worker, a subprocess
# started by fork) has a copy without its threads: it must end at once and leave the
# parent's checkpoint alone. Runs in a process of its own: the fork happens there.
import os

import ckpt
from conftest import result_of, run_python

FORK = r'''
import fcntl, gc, json, os, sys, time
import numpy as np
import ckpt

root, out = sys.argv[1], {}
c = ckpt.Checkpointer(root, world_size=2)
h = c.save(0, 1, {"w": np.arange(1 << 16, dtype=np.float32)}, deferred=True)  # in flight: rank 1 has not saved
pid = os.fork()
if pid == 0:
    # The child: a save is refused, then it exits normally, its copies of c and h dropped
    # (the explicit close and del, then the interpreter's own teardown).
    try:
        c.save(1, 1, {"w": np.zeros(4)})
        code = 10
    except ckpt.InvalidArgument as e:
        code = 0 if "forked" in str(e) else 11
    c.close()
    del h, c
    gc.collect()
    sys.exit(code)
t0 = time.monotonic()
while True:
    got, status = os.waitpid(pid, os.WNOHANG)
    if got == pid:
        break
    if time.monotonic() - t0 > 20:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = -1
        break
    time.sleep(0.01)
out["child_status"] = status
out["child_seconds"] = time.monotonic() - t0
# The parent: its lock is still held, its temporary still there, and the step still commits.
fd = os.open(os.path.join(root, ".lock"), os.O_RDONLY)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    out["lock_held"] = False
except BlockingIOError:
    out["lock_held"] = True
out["temporaries"] = sorted(n for n in os.listdir(root) if n.startswith(".tmp-"))
c.save(1, 1, {"w": np.ones(4, dtype=np.float32)})
out["step"] = h.wait(timeout=30).step
c.close()
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    out["lock_free_after_close"] = True
except BlockingIOError:
    out["lock_free_after_close"] = False
print(json.dumps(out))
'''


def test_a_forked_child_exits_at_once_and_the_parent_keeps_its_lock_its_temporary_and_its_save(tmp_path):
    root = tmp_path / "root"
    out = result_of(run_python(FORK, str(root)))
    assert out["child_status"] == 0, out  # exit status 0, not killed (-1: hung, killed after 20 s)
    assert out["child_seconds"] < 10
    assert out["lock_held"] is True
    assert len(out["temporaries"]) == 1 and out["temporaries"][0].startswith(".tmp-step-0000000001-"), out
    assert out["step"] == 1 and out["lock_free_after_close"] is True
    r = ckpt.open_latest(root, world_size=2)
    assert r.step == 1 and r.read(1, "w").tolist() == [1, 1, 1, 1]
    assert not [n for n in os.listdir(root) if n.startswith(".tmp-")]
