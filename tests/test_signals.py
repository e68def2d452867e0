"""Signals: Ctrl-C and SIGTERM end every command in one line ("interrupted") at any moment, leave
no partial output, and are never lost inside a library call (docs/reliability.md)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import ENV, ROOT, write_lines

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


# Signals: real ones, at moments spread over an embed's writing.
def test_ctrl_c_during_start_up_ends_interrupted(tmp_path):
    # While torch and the model load, before any output exists.
    inp = write_lines(tmp_path / "in.txt", 50)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    interrupted = 0
    for delay in (0.3, 0.7, 1.2):
        out = tmp_path / f"o-{delay}.h5"
        proc = subprocess.Popen([sys.executable, "-m", "torchelmo.cli", "embed", str(inp), str(out), "--top",
                                 "--quiet"], env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
        if proc.returncode == 0:   # this machine started and finished faster than the delay
            continue
        assert proc.returncode == 130, (delay, proc.returncode, err)
        assert err.strip().splitlines() == ["elmo embed: interrupted"], err
        assert not out.exists()
        interrupted += 1
    assert interrupted >= 2


def test_sigterm_during_trainings_set_up_ends_in_one_line(tmp_path):
    # Between the start and the training loop (here: building the vocabulary of a large file),
    # SIGTERM ends as Ctrl-C does, in one line; it used to end the process without a word.
    data = write_lines(tmp_path / "train.txt", 400_000)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "torchelmo.cli", "train", "--train", str(data), "--out", str(run),
                             "--model", "tiny", "--max-steps", "5", "--no-progress", "--threads", "1"],
                            env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (run / "train.lock").exists():           # the run is held: set-up has begun
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == ["elmo train: interrupted"], err
    assert not (run / "checkpoint.pt").exists()


def test_ctrl_c_and_sigterm_in_embed_always_end_interrupted(tmp_path):
    inp = write_lines(tmp_path / "in.txt", 6000)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cases = [(signal.SIGINT, 0.0), (signal.SIGINT, 0.15), (signal.SIGINT, 0.4), (signal.SIGTERM, 0.25)]
    for sig, delay in cases:
        out = tmp_path / f"out-{sig}-{delay}.h5"
        proc = subprocess.Popen([sys.executable, "-m", "torchelmo.cli", "embed", str(inp), str(out), "--all",
                                 "--quiet", "--threads", "1", "--batch-size", "16"],
                                env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(f".{out.name}.") for p in tmp_path.iterdir()):   # writing began
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        assert proc.returncode == 130, (sig, delay, proc.returncode, err)
        assert err.strip().splitlines()[-1] == "elmo embed: interrupted", err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("argv, statuses", [(["info", "--list"], [141]), (["info"], [141]),
                                            (["--help"], [0, 141])])   # argparse may drop it itself
def test_output_to_a_closed_pipe_ends_quietly(argv, statuses):
    # The reader is gone before the first write (`| head -1` that has its line), so every
    # write fails: deterministic, where a real `head` races the writer.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "torchelmo.cli", *argv]
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode in statuses and err == "", (proc.returncode, err)
    # stderr into the same closed pipe (`2>&1 | head`): nothing is left over to fail at exit.
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=w, stderr=w)
    finally:
        os.close(w)
    assert proc.wait(timeout=120) in statuses


# A signal that arrives while h5py is inside its C code, calling back into Python to write: the
# moment a KeyboardInterrupt would be swallowed ("Exception ignored") and the run would finish as
# if nothing happened. Sent from inside that callback, so the moment is hit every time.
SIGNAL_INSIDE_H5PY = """
import os, signal, sys
import h5py
from torchelmo.io import fileio
from torchelmo.cli import entry
sig, phase, at = getattr(signal, sys.argv[1]), sys.argv[2], int(sys.argv[3])
state = {"armed": phase == "writing", "calls": 0}
write, close = fileio.GuardedWriter.write, h5py.File.close
def write_and_signal(self, data):
    if state["armed"]:
        state["calls"] += 1
        if state["calls"] == at:
            os.kill(os.getpid(), sig)
    return write(self, data)
def arm_then_close(self):
    state["armed"] = True             # the close flushes HDF5's metadata through write()
    return close(self)
fileio.GuardedWriter.write = write_and_signal
h5py.File.close = arm_then_close
sys.argv = ["elmo"] + sys.argv[4:]
entry()
"""


@pytest.mark.parametrize("sig, phase, at", [("SIGINT", "writing", 1), ("SIGINT", "writing", 40),
                                            ("SIGINT", "closing", 1), ("SIGINT", "closing", 20),
                                            ("SIGTERM", "closing", 5)])
def test_a_signal_inside_h5pys_own_writes_is_never_lost(tmp_path, sig, phase, at):
    inp = write_lines(tmp_path / "in.txt", 300)
    out = tmp_path / "out.h5"
    script = tmp_path / "run.py"
    script.write_text(SIGNAL_INSIDE_H5PY, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), sig, phase, str(at), "embed", str(inp), str(out),
                           "--all", "--quiet", "--batch-size", "16"], env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 130, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines()[-1] == "elmo embed: interrupted", proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "run.py"]   # no output, no temporary


# Signals while the interpreter shuts down.
# The installed `elmo` (torchelmo.cli:entry) runs a real command, then the interpreter exits; a
# handler registered with atexit runs during that shutdown and sends the signal there, every time.
SIGNAL_AT_EXIT = """
import atexit, os, signal, sys
from torchelmo.cli import entry
sig = getattr(signal, sys.argv[1])
atexit.register(lambda: os.kill(os.getpid(), sig))
sys.argv = ["elmo", "info", "--list"]
entry()
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_interpreter_shuts_down_changes_no_status(sig):
    # signals-not-ignored-at-exit. Once the command has returned its status, a Ctrl-C or SIGTERM
    # can no longer change it: no death by signal, no traceback from an exit handler.
    proc = subprocess.run([sys.executable, "-c", SIGNAL_AT_EXIT, sig], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert proc.stderr == "" and "small" in proc.stdout

