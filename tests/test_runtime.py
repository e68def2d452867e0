"""One device/threads story for every command, quiet levels, bar-safe messages, help everywhere."""

import argparse
import io
import logging
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch

from torchelmo import ElmoError
from torchelmo.cli import build_parser, main
from torchelmo.runtime import bar_safe_output, resolve_device, set_threads

# The commands that run the model, each with the arguments it needs to get as far as the device.
MODEL_COMMANDS = ["embed", "perplexity", "train", "probe pos", "probe wsd", "probe ner", "probe all",
                  "export"]


def _subparsers(parser):
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _walk(parser, path=()):
    """(command path, parser) for the root and every subcommand, at any depth."""
    yield path, parser
    for action in _subparsers(parser):
        for name, sub in action.choices.items():
            yield from _walk(sub, path + (name,))


def _parser_of(command):
    return dict((" ".join(p), q) for p, q in _walk(build_parser()))[command]


@pytest.mark.core
def test_every_subcommand_and_option_has_help():
    missing = []
    for path, parser in _walk(build_parser()):
        for action in _subparsers(parser):
            helped = {a.dest for a in action._choices_actions if a.help}
            missing += [" ".join(path + (n,)) for n in action.choices if n not in helped]
        for a in parser._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if not a.help or a.help == argparse.SUPPRESS:
                missing.append(f"elmo {' '.join(path)} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, "no help text: " + ", ".join(missing)


@pytest.mark.core
@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_model_commands_take_device_and_threads(command):
    p = _parser_of(command)
    opts = {s: a for a in p._actions for s in a.option_strings}
    assert "--device" in opts and "--threads" in opts
    if command != "train":       # train's defaults come from its config (TrainConfig.device = "auto")
        assert opts["--device"].default == "auto" and opts["--threads"].default is None


@pytest.mark.core
def test_resolve_device(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device(None) == torch.device("cpu")
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ElmoError, match=r"^--device cuda: this torch is a CPU-only build .*install a CUDA build"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.8")    # a CUDA build on a machine without a GPU
    with pytest.raises(ElmoError, match=r"^--device cuda: no CUDA GPU is usable on this machine \(torch is built "
                                        r"for CUDA 12.8.*use --device cpu$"):
        resolve_device("cuda")
    with pytest.raises(ElmoError, match=r"^--device: unknown device 'foo'"):
        resolve_device("foo")
    with pytest.raises(ElmoError, match=r"^--device: unsupported device 'meta'"):
        resolve_device("meta")
    # With GPUs: auto is CUDA, a bare "cuda" is this rank's GPU, a missing index is an error.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", local_rank=3) == torch.device("cuda", 1)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ElmoError, match=r"^--device cuda:2: there are only 2 CUDA device"):
        resolve_device("cuda:2")


@pytest.mark.core
def test_set_threads():
    n = torch.get_num_threads()
    try:
        set_threads(1)
        assert torch.get_num_threads() == 1
        set_threads(None)
        assert torch.get_num_threads() == 1
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ElmoError, match=r"^--threads must be a positive integer"):
                set_threads(bad)
    finally:
        torch.set_num_threads(n)


def _argv(command, tmp, corpus):
    data, vocab = corpus
    return {
        "embed": ["embed", str(data), str(tmp / "o.hdf5"), "--top"],
        "perplexity": ["perplexity", str(tmp / "lm"), str(data)],
        "train": ["train", "--train", str(data), "--vocab", str(vocab), "--out", str(tmp / "run"),
                  "--model", "tiny", "--max-steps", "1"],
        "probe pos": ["probe", "pos", "--model", "default", "--out", str(tmp / "p"), "--train", "x",
                      "--dev", "x", "--test", "x"],
        "export": ["export", "default", str(tmp / "run" / "m.onnx")],
    }[command]


@pytest.mark.parametrize("command", ["embed", "perplexity", "train", "probe pos", "export"])
@pytest.mark.parametrize("flags, message", [
    (["--device", "foo"], "--device: unknown device 'foo'"),
    (["--device", "cuda"], "--device cuda: this torch is a CPU-only build"),
    (["--threads", "0"], "--threads must be a positive integer, got 0"),
    (["--threads", "-1"], "--threads must be a positive integer, got -1"),
])
def test_bad_device_or_threads_is_one_line(command, flags, message, tmp_path, fixture_corpus,
                                           monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)   # the CPU build's message, on either build
    n = torch.get_num_threads()
    try:
        assert main(_argv(command, tmp_path, fixture_corpus) + flags) == 1
    finally:
        torch.set_num_threads(n)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()      # stopped before any work


def _bar_and_message(emit):
    """Stderr of a live tqdm bar while ``emit()`` prints a message inside bar_safe_output."""
    from tqdm import tqdm
    err = io.StringIO()
    old = sys.stderr
    sys.stderr = err
    try:
        with bar_safe_output("elmo test"):
            bar = tqdm(total=10, file=sys.stderr, mininterval=0, ascii=True)
            bar.update(3)
            emit()
            bar.update(3)
            bar.close()
    finally:
        sys.stderr = old
    return err.getvalue()


@pytest.mark.core
@pytest.mark.parametrize("kind", ["warning", "logging"])
def test_messages_never_share_the_bar_line(kind):
    def emit():
        if kind == "warning":
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.warn("disk nearly full", UserWarning, stacklevel=1)
        else:
            logging.getLogger("torchelmo.somewhere").warning("disk nearly full")

    out = _bar_and_message(emit)
    lines = [line.split("\r")[-1] for line in out.split("\n")]
    hits = [line for line in lines if "disk nearly full" in line]
    # The message is a line of its own: nothing of the bar before it on the terminal line.
    assert hits == (["elmo test: warning: disk nearly full"] if kind == "warning" else ["disk nearly full"])
    assert "30%" in out and "60%" in out


@pytest.mark.core
def test_plain_print_would_share_the_bar_line():
    # The check above can fail: a plain print lands after the bar's text on its line.
    out = _bar_and_message(lambda: print("disk nearly full", file=sys.stderr))
    line = [s for s in out.split("\n") if "disk nearly full" in s][0].split("\r")[-1]
    assert line != "disk nearly full" and "%" in line


def _embed(tmp_path, model_args, *flags):
    src = tmp_path / "in.txt"
    src.write_text("a b c\nd e\n", encoding="utf-8")
    return main(["embed", str(src), str(tmp_path / "out.hdf5"), "--top", *model_args, *flags])


@pytest.fixture
def model_args(allennlp_dir):
    return ["--options-file", str(allennlp_dir / "options.json"),
            "--weight-file", str(allennlp_dir / "lm_weights.hdf5")]


@pytest.mark.parametrize("flags, summary", [(["-q"], True), (["--quiet"], True), (["-qq"], False),
                                            (["--quiet", "--quiet"], False), (["--silent"], False)])
def test_embed_quiet_levels(flags, summary, tmp_path, model_args, capsys):
    assert _embed(tmp_path, model_args, *flags, "--threads", "1") == 0
    err = capsys.readouterr().err
    if summary:
        assert err.count("\n") == 1 and err.startswith("elmo embed: 2 lines"), err
    else:
        assert err == ""


def test_embed_bar_by_default(tmp_path, model_args, capsys):
    assert _embed(tmp_path, model_args, "--threads", "1") == 0
    err = capsys.readouterr().err
    assert " sent" in err and "elmo embed: 2 lines" in err


@pytest.mark.parametrize("flags, lines", [(["-q"], 1), (["--silent"], 0)])
def test_train_quiet_levels(flags, lines, tmp_path, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    n = torch.get_num_threads()
    try:
        assert main(["train", "--train", str(data), "--vocab", str(vocab), "--out", str(tmp_path / "run"),
                     "--model", "tiny", "--batch-size", "4", "--unroll", "5", "--max-steps", "2",
                     "--threads", "1", *flags]) == 0
    finally:
        torch.set_num_threads(n)
    err = capsys.readouterr().err
    assert err.count("\n") == lines, err
    if lines:
        assert err.startswith("elmo train: 2 steps,") and str(tmp_path / "run") in err


@pytest.mark.core
def test_a_signal_after_the_output_is_complete_changes_nothing(tmp_path, monkeypatch, capsys):
    import os
    import signal

    import torchelmo.commands.embed as embed_cli
    real = embed_cli.mark_done

    def done_then_signal():
        real()
        os.kill(os.getpid(), signal.SIGTERM)   # arrives once OUTPUT is in place
    monkeypatch.setattr(embed_cli, "mark_done", done_then_signal)
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    assert main(["embed", str(src), str(tmp_path / "o.hdf5"), "--top", "--threads", "1"]) == 0
    assert (tmp_path / "o.hdf5").is_file() and "interrupted" not in capsys.readouterr().err
    monkeypatch.undo()
    # Before that point the same signal interrupts: status 130 and no OUTPUT.
    monkeypatch.setattr(embed_cli, "embed_file", lambda *a, **k: os.kill(os.getpid(), signal.SIGTERM) or 1 / 0)
    assert main(["embed", str(src), str(tmp_path / "p.hdf5"), "--top", "--threads", "1"]) == 130
    assert not (tmp_path / "p.hdf5").exists()


@pytest.mark.core
def test_sigterm_while_embed_loads_its_model_is_one_line(tmp_path, monkeypatch, capsys):
    import os
    import signal

    import torchelmo.commands.embed as embed_cli
    real = embed_cli.load_model

    def load_then_signal(*a, **k):
        model = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)   # arrives while the model loads
        return model
    monkeypatch.setattr(embed_cli, "load_model", load_then_signal)
    src = tmp_path / "in.txt"
    src.write_text("a b\n")
    assert main(["embed", str(src), str(tmp_path / "o.hdf5"), "--top", "--threads", "1"]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["elmo embed: interrupted"]
    assert not (tmp_path / "o.hdf5").exists()


HEAP_PROBE = """
import ctypes, sys, torch
from torchelmo import runtime
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
def mapped():
    return libc.mallinfo2().hblkhd   # bytes glibc holds in blocks of their own mapping
policy = sys.argv[1]
if policy != "default":
    assert getattr(runtime, policy)()
torch.empty(2**20, dtype=torch.uint8).fill_(1)   # first use: torch maps what it needs once
for mb in (2, 8, 64):
    before = mapped()
    block = torch.empty(mb * 2**20, dtype=torch.uint8).fill_(1)
    print(mb, mapped() - before >= mb * 2**20)
    del block
"""


@pytest.mark.core
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc parameters: Linux")
@pytest.mark.parametrize("policy,mapped", [("default", {2: True, 8: True, 64: True}),
                                           ("bounded_heap", {2: False, 8: True, 64: True}),
                                           ("keep_heap", {2: False, 8: False, 64: False})])
def test_heap_policies_decide_which_blocks_are_fresh_mappings(policy, mapped):
    # A fresh mapping faults its pages in on first touch, every time it is allocated: training
    # takes every block from the heap; streaming inference the ones up to 4 MB (memory stays flat).
    # glibc's own count of mapped bytes, not /proc/self/maps: the kernel can merge a new mapping
    # with its neighbour (it does on a one-CPU affinity), so counting mappings can miss it.
    import subprocess
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE, policy], capture_output=True, text=True, check=True)
    got = {int(mb): flag == "True" for mb, flag in (line.split() for line in out.stdout.splitlines())}
    assert got == mapped


@pytest.mark.core
def test_default_threads_follow_affinity_and_the_cgroup_quota(tmp_path, monkeypatch):
    from torchelmo import runtime
    (tmp_path / "cg").write_text("0::/job\n")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "cpu.max").write_text("150000 100000\n")
    assert runtime.cpu_quota(str(tmp_path), str(tmp_path / "cg")) == 1.5
    (tmp_path / "job" / "cpu.max").write_text("max 100000\n")
    assert runtime.cpu_quota(str(tmp_path), str(tmp_path / "cg")) is None
    (tmp_path / "cg1").write_text("3:cpu,cpuacct:/j\n")
    (tmp_path / "cpu,cpuacct" / "j").mkdir(parents=True)
    (tmp_path / "cpu,cpuacct" / "j" / "cpu.cfs_quota_us").write_text("200000\n")
    (tmp_path / "cpu,cpuacct" / "j" / "cpu.cfs_period_us").write_text("100000\n")
    assert runtime.cpu_quota(str(tmp_path), str(tmp_path / "cg1")) == 2.0
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(8)
        monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
        monkeypatch.setattr(runtime, "cpu_quota", lambda: None)
        assert runtime.default_threads() == 4                  # the CPUs this process may run on
        monkeypatch.setattr(runtime, "cpu_quota", lambda: 1.5)
        assert runtime.default_threads() == 1                  # a container's quota of 1.5 CPUs
        runtime.set_threads(None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(n)


@pytest.mark.core
def test_the_command_line_lets_idle_threads_sleep(tmp_path):
    # OMP_WAIT_POLICY=PASSIVE unless the user set it: spinning threads cost several times the run
    # on cores that other jobs share (benchmarks/threads_shared.py measures it).
    import subprocess
    code = ("import os, sys\nfrom torchelmo.cli import main\n"
            "main(['info', '--list'])\nprint(os.environ['OMP_WAIT_POLICY'], file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.stderr.strip().splitlines()[-1] == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.stderr.strip().splitlines()[-1] == "ACTIVE"
