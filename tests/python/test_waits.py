# SPDX-License-Identifier: Apache-2.0
# Every wait can be interrupted (Ctrl-C) and bounded (timeout=): each scenario runs in a
# process of its own, which gets SIGINT from outside while it waits, and must then end
# normally with every handle ended.
import datetime
import math
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ckpt
from blocking_memory import BlockingMemory
from conftest import python_env, result_of, run_python

PRELUDE = r'''
import json, signal, sys, time
import numpy as np
import ckpt
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the parent ignores
root, out = sys.argv[1], {}
'''

# Each prints "waiting" right before the wait SIGINT interrupts, and its findings last.
SCENARIOS = {
    # The save goes on: another rank completes it after the interrupt.
    "wait": r'''
with ckpt.Checkpointer(root, world_size=2) as c:
    h = c.save(0, 1, {"a": np.zeros(4)})
    print("waiting", flush=True)
    try:
        h.wait()
    except KeyboardInterrupt:
        out["interrupted"] = True
    out["done_after_interrupt"] = h.done()
    c.save(1, 1, {"a": np.ones(4)})
    out["step"] = h.wait(timeout=30).step
''',
    # The copy reads memory that blocks until released.
    "wait_staged": r'''
from blocking_memory import BlockingMemory
mem = BlockingMemory(1 << 16)
with ckpt.Checkpointer(root) as c:
    h = c.save(0, 1, {"w": mem.array}, deferred=True)
    print("waiting", flush=True)
    try:
        h.wait_staged()
    except KeyboardInterrupt:
        out["interrupted"] = True
    out["done_after_interrupt"] = h.staged()
    mem.release()
    h.wait_staged(timeout=30)
    out["step"] = h.wait(timeout=30).step
''',
    # The interrupt leaves the with block: close() abandons the step rank 1 never saved.
    **{call: f'''
try:
    with ckpt.Checkpointer(root, world_size=2, durable_root=root + "-durable") as c:
        h = c.save(0, 1, {{"a": np.zeros(4)}})
        print("waiting", flush=True)
        c.{call}()
except KeyboardInterrupt:
    out["interrupted"] = True
out["done_after_interrupt"] = h.done()
try:
    h.wait(timeout=0)
except ckpt.Aborted as e:
    out["error"] = str(e)
''' for call in ("wait_all", "wait_durable")},
    # A preemption handler that closes the Checkpointer while the main thread waits: the wait
    # ends with the abandoned step's error.
    "handler_closes": r'''
with ckpt.Checkpointer(root, world_size=2) as c:
    signal.signal(signal.SIGINT, lambda *_: c.close())
    h = c.save(0, 1, {"a": np.zeros(4)})
    print("waiting", flush=True)
    try:
        h.wait()
    except ckpt.Aborted as e:
        out["interrupted"] = True
        out["error"] = str(e)
    out["done_after_interrupt"] = h.done()
''',
    # save() waiting at the barrier for the previous checkpoint: step 2 never starts.
    "save": r'''
with ckpt.Checkpointer(root, world_size=2) as c:
    h = c.save(0, 1, {"a": np.zeros(4)})
    print("waiting", flush=True)
    try:
        c.save(0, 2, {"a": np.zeros(4)})
    except KeyboardInterrupt:
        out["interrupted"] = True
    out["done_after_interrupt"] = h.done()
    out["saves_started"] = c.stats()["saves_started"]
    c.save(1, 1, {"a": np.ones(4)})
    out["step"] = h.wait(timeout=30).step
''',
}


def interrupt_while_waiting(code, root):
    """Runs `code`, sends it SIGINT 0.3 s after it says "waiting"; its CompletedProcess-like
    (returncode, stdout, stderr)."""
    p = subprocess.Popen([sys.executable, "-c", code, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=python_env())
    try:
        ready, _, _ = select.select([p.stdout], [], [], 30)
        line = p.stdout.readline() if ready else ""
        assert line.strip() == "waiting", f"no 'waiting' line: {line!r}; stderr: {p.stderr.read() if p.poll() is not None else ''}"
        time.sleep(0.3)  # well inside the wait
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, stderr = p.communicate()
        pytest.fail(f"still running 30 s after SIGINT (the wait ignored it); stderr: {stderr[-3000:]}")
    finally:
        if p.poll() is None:
            p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)


@pytest.mark.parametrize("wait", sorted(SCENARIOS))
def test_sigint_interrupts_each_wait_and_the_process_ends_normally_with_every_handle_ended(tmp_path, wait):
    # (handler_closes: the SIGINT handler closes the Checkpointer, as a preemption handler does.)
    if wait == "wait_staged" and BlockingMemory.unavailable():
        pytest.skip(BlockingMemory.unavailable())
    out = result_of(interrupt_while_waiting(PRELUDE + SCENARIOS[wait] + "print(json.dumps(out))\n", str(tmp_path / "root")))
    assert out["interrupted"] is True
    if wait in ("wait_all", "wait_durable", "handler_closes"):
        # Closed (leaving the with block, or by the handler): the step rank 1 never saved is abandoned.
        assert out["done_after_interrupt"] is True
        assert "checkpoint of step 1 abandoned at shutdown: rank(s) 1 never saved it" in out["error"]
        with ckpt.Checkpointer(tmp_path / "root") as again:  # the lock was released
            assert again.stats()["commits"] == 0
    else:
        # The save went on, and ended.
        assert out["done_after_interrupt"] is False
        assert out["step"] == 1
        assert ckpt.open_latest(tmp_path / "root").step == 1
    if wait == "save":
        assert out["saves_started"] == 1  # step 2 never started


TIMEOUTS = PRELUDE + r'''
import datetime
from blocking_memory import BlockingMemory

def timed(name, call):
    t0 = time.monotonic()
    try:
        call()
        out[name] = "returned"
    except ckpt.Timeout as e:
        out[name] = {"seconds": time.monotonic() - t0, "timeout_error": isinstance(e, TimeoutError),
                     "ckpt_error": isinstance(e, ckpt.Error), "code": e.code, "detail": e.detail,
                     "expected": e.expected, "actual": e.actual, "message": str(e)}

with ckpt.Checkpointer(root, world_size=2, durable_root=root + "-durable") as c:
    h = c.save(0, 1, {"a": np.zeros(4)})
    timed("wait", lambda: h.wait(timeout=0.2))
    timed("wait_all", lambda: c.wait_all(timeout=0.2))
    timed("wait_durable", lambda: c.wait_durable(timeout=datetime.timedelta(milliseconds=200)))
    out["done_after_timeouts"] = h.done()
    c.save(1, 1, {"a": np.ones(4)})
    out["step"] = h.wait(timeout=30).step
    c.wait_durable(timeout=30)
    out["durable_copies"] = c.stats()["durable_copies"]
if BlockingMemory.unavailable() is None:
    mem = BlockingMemory(1 << 16)
    with ckpt.Checkpointer(root + "-staged") as c:
        h = c.save(0, 1, {"w": mem.array}, deferred=True)
        timed("wait_staged", lambda: h.wait_staged(timeout=0.2))
        out["staged_after_timeout"] = h.staged()
        mem.release()
        h.wait_staged(timeout=30)
        out["staged_step"] = h.wait(timeout=30).step
print(json.dumps(out))
'''


def test_each_wait_raises_timeout_when_its_timeout_runs_out_and_the_save_goes_on(tmp_path):
    out = result_of(run_python(TIMEOUTS, str(tmp_path / "root")))
    expected = {"wait": ("SaveHandle.wait() of step 1", "done within 0.2 s", "not done (the save goes on)"),
                "wait_all": ("Checkpointer.wait_all()", "no checkpoint in flight within 0.2 s", "one still in flight (it goes on)"),
                "wait_durable": ("Checkpointer.wait_durable()", "the durable tier caught up within 0.2 s",
                                 "a checkpoint or a copy still in flight (it goes on)"),
                "wait_staged": ("SaveHandle.wait_staged() of step 1", "staged within 0.2 s",
                                "not staged (the copy goes on: do not modify the tensors yet)")}
    if "wait_staged" not in out:
        expected.pop("wait_staged")  # no userfaultfd here
    for name, (detail, exp, act) in expected.items():
        t = out[name]
        assert t != "returned", name
        assert t["timeout_error"] and t["ckpt_error"] and t["code"] == "timeout", (name, t)
        assert (t["detail"], t["expected"], t["actual"]) == (detail, exp, act), (name, t)
        assert t["message"] == f"timeout: {detail}: expected {exp}, actual {act}"
        assert 0.2 <= t["seconds"] < 5, (name, t)
    assert out["done_after_timeouts"] is False and out["step"] == 1 and out["durable_copies"] == 1
    if "wait_staged" in out:
        assert out["staged_after_timeout"] is False and out["staged_step"] == 1


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "1", True, [1]])
def test_a_timeout_that_is_not_a_number_of_seconds_is_invalid_argument_naming_it(tmp_path, bad):
    with ckpt.Checkpointer(tmp_path / "root") as c:
        h = c.save(0, 1, {"a": np.zeros(2)})
        for call in (lambda: h.wait(timeout=bad), lambda: h.wait_staged(timeout=bad), lambda: c.wait_all(timeout=bad),
                     lambda: c.wait_durable(timeout=bad)):
            with pytest.raises(ckpt.InvalidArgument) as e:
                call()
            assert e.value.detail == "timeout" and e.value.expected == "seconds (a number >= 0) or None"
            assert repr(bad) in e.value.actual
        assert h.wait(timeout=datetime.timedelta(seconds=30)).step == 1
