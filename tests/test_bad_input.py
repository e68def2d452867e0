"""Bad arguments and input: one line naming the option, path or value, before any work is done
or any memory allocated (docs/reliability.md)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import h5py
import pytest
import torch

from helpers import ROOT, one_line_error, tiny_published, write_lines
from torchelmo.cli import main as cli_main
from torchelmo.errors import ElmoError


def test_python_api_rejects_bad_input(fixture_model):
    from torchelmo import Elmo, batch_to_ids
    from torchelmo.embed import embed_sentences
    with pytest.raises(ElmoError, match="sentences must be an iterable"):
        embed_sentences(fixture_model, None)
    with pytest.raises(ElmoError, match="sentence 1 is NoneType"):
        embed_sentences(fixture_model, [["a"], None])
    ids = batch_to_ids([["a", "b"]])
    with pytest.raises(ElmoError, match="must be integers"):
        fixture_model(ids.float())
    for bad in (ids + 1000, -ids):
        with pytest.raises(ElmoError, match=r"char ids must be in 0\.\.261"):
            fixture_model(bad)
    with pytest.raises(ElmoError, match=r"dropout must be in \[0, 1\)"):
        Elmo(fixture_model, dropout=2.0)
    with pytest.raises(ElmoError, match="initial scalars must be finite"):
        Elmo(fixture_model, scalar_mix_parameters=[0.0, float("nan"), 0.0])


def test_train_config_types_and_paths(tmp_path, fixture_corpus, capsys):
    data, vocab = fixture_corpus
    base = ["train", "--train", data, "--vocab", vocab, "--model", "tiny", "--max-steps", "1", "--no-progress"]
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    one_line_error(capsys, base + ["--out", tmp_path / "r", "--config", listed], str(listed), "must be a JSON object, got an array")
    for field, value, msg in (("max_steps", "10", "max_steps must be an integer"),
                              ("dropout", True, "dropout must be a finite number"),
                              ("variational_dropout", "false", "variational_dropout must be true or false"),
                              ("valid", [1], "valid must be a list of strings")):
        cfg = tmp_path / f"{field}.json"
        cfg.write_text(json.dumps({field: value}))
        one_line_error(capsys, ["train", "--train", data, "--vocab", vocab, "--out", tmp_path / "r",
                                "--config", cfg], msg)
    afile = tmp_path / "afile"
    afile.write_text("x")
    one_line_error(capsys, base + ["--out", afile], "is a file")
    one_line_error(capsys, ["average", ROOT / "src" / "torchelmo" / "default_model", "-o", afile], "is a file")
    assert afile.read_text() == "x"


@pytest.mark.core
def test_read_only_place_and_directory_output_fail_before_any_work(tmp_path, small_disk, capsys, monkeypatch):
    import torchelmo.embed.engine as engine
    inp = write_lines(tmp_path / "in.txt", 5)
    monkeypatch.setattr(engine, "start_batch", lambda *a, **k: pytest.fail("embedded before checking OUTPUT"))
    one_line_error(capsys, ["embed", inp, tmp_path, "--top", "--quiet"], str(tmp_path), "is a directory")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    one_line_error(capsys, ["embed", inp, small_disk / "o.h5", "--top", "--quiet"], "Read-only file system")


# Tracebacks that were left: each is now one line naming the thing.
LONG = "a" * 300   # one path component over the 255 bytes a file name can have


def _model_commands(name: str, tmp: Path) -> list[list]:
    inp = write_lines(tmp / "in.txt", 2)
    vocab = tmp / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\nthe\nquick\n")
    return [["info", name], ["embed", inp, tmp / "o.h5", "--top", "--quiet", "--model", name],
            ["export", name, tmp / "o.pt"], ["perplexity", name, inp], ["average", name, "-o", tmp / "avg"],
            ["probe", "tag", inp, inp, "--column", "0", "--model", name, "--out", tmp / "probe"],
            ["train", "--init-from", name, "--train", inp, "--vocab", vocab, "--out", tmp / "run",
             "--max-steps", "1", "--no-progress"]]


@pytest.mark.core
@pytest.mark.parametrize("name, says", [(LONG, "a path component of 300 bytes, longer than the 255"),
                                        ("x/" + "b" * 256, "a path component of 256 bytes"),
                                        ("my\nmodel", "my\\nmodel: no such")])
def test_a_model_name_no_file_can_have_is_one_line_in_every_command(tmp_path, capsys, name, says):
    for argv in _model_commands(name, tmp_path):
        one_line_error(capsys, argv, says)
    assert not (tmp_path / "run").exists() and not (tmp_path / "avg").exists()


@pytest.mark.core
def test_other_paths_no_file_can_have_are_one_line(tmp_path, capsys):
    inp = write_lines(tmp_path / "in.txt", 2)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<S>\n</S>\n<UNK>\nthe\n")
    for argv in (["embed", tmp_path / LONG, tmp_path / "o.h5", "--top", "--quiet"],
                 ["embed", inp, tmp_path / LONG, "--top", "--quiet"],
                 ["vocab", tmp_path / LONG, "-o", tmp_path / "v.txt"], ["vocab", inp, "-o", tmp_path / LONG],
                 ["train", "--train", inp, "--vocab", vocab, "--out", tmp_path / LONG, "--max-steps", "1", "--no-progress"],
                 ["train", "--train", tmp_path / LONG, "--vocab", vocab, "--out", tmp_path / "r", "--max-steps", "1",
                  "--no-progress"],
                 ["average", "default", "-o", tmp_path / LONG]):
        line = one_line_error(capsys, argv, "aaaaaaaaaa")
        assert "a path component of 300 bytes" in line or "(File name too long)" in line, line
    with pytest.raises(ElmoError, match="holds a NUL character"):
        from torchelmo import BiLM
        BiLM.from_pretrained("de\0fault")


@pytest.mark.core
def test_average_and_perplexity_check_their_destination_before_any_work(tmp_path, capsys, monkeypatch):
    import torchelmo.lm.model as lm
    import torchelmo.train.average as average
    monkeypatch.setattr(average, "load_lm", lambda *a: pytest.fail("loaded a model before checking -o"))
    monkeypatch.setattr(lm.LanguageModel, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("loaded the LM before checking --json")))
    afile = tmp_path / "afile"
    afile.write_text("x")
    inp = write_lines(tmp_path / "in.txt", 2)
    one_line_error(capsys, ["average", "m1", "m2", "-o", afile / "out"], str(afile / "out"), "cannot write",
                   "is not a directory")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", afile / "r.json"], str(afile / "r.json"),
                   "cannot write", "is not a directory")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", tmp_path], str(tmp_path), "is a directory")
    # A forbidden place (root may write anywhere: the refusal is simulated) and a read-only one.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: Path(p) != tmp_path and real_access(p, mode, **k))
    one_line_error(capsys, ["average", "m1", "-o", tmp_path / "avg"], str(tmp_path / "avg"), "Permission denied")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", tmp_path / "r.json"], "Permission denied")
    monkeypatch.setattr(os, "access", real_access)
    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, p):
            self.f_flag = real_statvfs(p).f_flag | os.ST_RDONLY

    monkeypatch.setattr(os, "statvfs", ReadOnly)
    one_line_error(capsys, ["average", "m1", "-o", tmp_path / "avg"], "Read-only file system")
    one_line_error(capsys, ["perplexity", "m1", inp, "--json", tmp_path / "r.json"], "Read-only file system")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "in.txt"]


def test_a_missing_weights_file_is_found_before_the_model_is_allocated(tmp_path, capsys, monkeypatch):

    from torchelmo import BiLM
    from torchelmo.lm.model import LanguageModel
    from torchelmo.model.registry import default_model_dir
    # A config within the size bounds that would take gigabytes, with no weights beside it.
    big = tmp_path / "big"
    big.mkdir()
    cfg = json_load(default_model_dir() / "config.json")
    cfg["lstm"]["dim"], cfg["lstm"]["projection_dim"] = 8192, 1024   # 0.3e9 parameters: 1.2 GB
    (big / "config.json").write_text(json_dump(cfg))
    lm_dir = tmp_path / "lm"
    shutil.copytree(big, lm_dir)
    from torchelmo.lm.model import LM_FORMAT
    (lm_dir / "training.json").write_text(json_dump({"format": LM_FORMAT, "softmax": {"kind": "full"}}))
    (lm_dir / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n")
    monkeypatch.setattr(BiLM, "__init__", lambda *a, **k: pytest.fail("allocated before finding the weights"))
    with pytest.raises(ElmoError, match=r"big/model.safetensors: missing"):
        BiLM.from_pretrained(big)
    one_line_error(capsys, ["info", big], "model.safetensors: missing")
    one_line_error(capsys, ["embed", write_lines(tmp_path / "in.txt", 2), tmp_path / "o.h5", "--top", "--quiet",
                            "--model", big], "model.safetensors: missing")
    monkeypatch.setattr(LanguageModel, "__init__", lambda *a, **k: pytest.fail("allocated the LM first"))
    with pytest.raises(ElmoError, match=r"lm/model.safetensors: missing"):
        LanguageModel.from_pretrained(lm_dir)
    with pytest.raises(ElmoError, match=r"nope.hdf5: file not found"):
        BiLM.from_published(big / "config.json", tmp_path / "nope.hdf5")


def json_load(path: Path):
    import json
    return json.loads(Path(path).read_text())


def json_dump(obj) -> str:
    import json
    return json.dumps(obj, indent=2)


def test_python_api_rejects_none_and_empty_batches_in_one_line(tmp_path):
    from torchelmo import BiLM, batch_to_ids
    from torchelmo.integrations.allennlp import Elmo, ElmoEmbedder
    with pytest.raises(ElmoError, match="batch_to_ids: sentence 1 is NoneType, expected a list of tokens"):
        batch_to_ids([["a"], None])
    bilm = BiLM.from_pretrained("default")
    emb = ElmoEmbedder(model="default")
    with pytest.raises(ElmoError, match="ElmoEmbedder: sentence 0 is NoneType"):
        emb.embed_sentence(None)
    with pytest.raises(ElmoError, match="embed_sentences: expected an iterable of sentences"):
        list(emb.embed_sentences(None))
    with pytest.raises(ElmoError, match="ElmoEmbedder: sentence 1 is NoneType"):
        list(emb.embed_sentences([["a"], None]))
    elmo = Elmo(None, None, 2, module=bilm, dropout=0.0)
    out = elmo(batch_to_ids([[]]))   # a batch of one empty sentence, as BiLM alone takes it
    assert [tuple(r.shape) for r in out["elmo_representations"]] == [(1, 0, bilm.output_dim)] * 2
    assert tuple(out["mask"].shape) == (1, 0)
    out = elmo(batch_to_ids([["a", "b"], []]))
    assert tuple(out["elmo_representations"][0].shape) == (2, 2, bilm.output_dim)
    opts, weights = tiny_published(tmp_path)
    for n in (1.5, -1, True):   # 0 is allowed (no mixes), as in AllenNLP
        with pytest.raises(ElmoError, match=f"num_output_representations must be a non-negative integer, got {n!r}"):
            Elmo(opts, weights, n)
        with pytest.raises(ElmoError, match="num_output_representations must be a non-negative integer"):
            Elmo(None, None, n, module=bilm)


@pytest.mark.core
def test_embed_file_of_a_stream_is_one_line_on_bad_utf8_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import io
    import tempfile

    from torchelmo.integrations.allennlp import ElmoEmbedder
    tmpdir = tmp_path / "system-tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    emb = ElmoEmbedder(model="default")
    emb.embed_file(io.StringIO("a b\nc d\n"), tmp_path / "ok.h5")
    with h5py.File(tmp_path / "ok.h5", "r") as f:
        assert f["1"].shape[1] == 2
    for stream in (io.BytesIO(b"a b\n\xff\xfe c\n"),
                   io.TextIOWrapper(io.BytesIO(b"a b\n\xff\xfe c\n"), encoding="utf-8")):
        with pytest.raises(ElmoError, match=r"input_file: not UTF-8 text near line \d \(invalid start byte\)"):
            emb.embed_file(stream, tmp_path / "bad.h5")
    with pytest.raises(ElmoError, match="is a directory"):
        emb.embed_file(io.StringIO("a b\n"), tmp_path)
    assert list(tmpdir.iterdir()) == [] and not (tmp_path / "bad.h5").exists()


@pytest.mark.core
def test_a_model_larger_than_the_memory_left_is_refused_before_allocation(tmp_path, monkeypatch, capsys):
    from torchelmo import BiLM, runtime
    from torchelmo.model.config import ElmoConfig
    model = BiLM.from_pretrained("default")
    model.save_pretrained(tmp_path / "m")
    need = 4 * model.config.num_parameters()
    free = runtime.available_memory()
    assert free is None or free > need
    monkeypatch.setattr(runtime, "available_memory", lambda: need - 1)
    message = f"a biLM of {need // 4:,} parameters needs 0.0 GiB for its parameters, more than the 0.0 GiB"
    allocated = []
    with monkeypatch.context() as m:
        m.setattr(torch.nn.Embedding, "__init__", lambda *a, **k: allocated.append(1))
        for load in (lambda: BiLM.from_pretrained(tmp_path / "m"),
                     lambda: BiLM(ElmoConfig.from_json_file(tmp_path / "m" / "config.json"))):
            with pytest.raises(ElmoError, match=message):
                load()
    assert allocated == []
    one_line_error(capsys, ["embed", write_lines(tmp_path / "in.txt", 3), tmp_path / "out.h5", "--all",
                            "--model", tmp_path / "m"], message)
    monkeypatch.setattr(runtime, "available_memory", lambda: need)
    assert BiLM.from_pretrained(tmp_path / "m").config == model.config



@pytest.mark.core
def test_small_cli_mistakes_get_their_own_line(tmp_path, capsys):
    # '-' as OUTPUT (stdin's name as INPUT) is refused, not written as a file named '-'; a flag
    # given 0 is named as the flag; an error the library prefixes with the command's name says
    # it once.
    inp = write_lines(tmp_path / "in.txt", 2)
    one_line_error(capsys, ["embed", inp, "-", "--top"], "OUTPUT -", "standard output")
    assert not (tmp_path / "-").exists() and not os.path.exists("-")
    with pytest.raises(SystemExit):
        cli_main(["embed", str(inp), str(tmp_path / "o.h5"), "--batch-size", "0"])
    err = capsys.readouterr().err
    assert "--batch-size: expected a positive integer, got '0'" in err and "batch_size" not in err
    line = one_line_error(capsys, ["export", "default", tmp_path / "m.bin"], "cannot tell the format")
    assert line.startswith("elmo export: error: ") and "error: export:" not in line


@pytest.mark.core
def test_an_empty_input_file_is_said_to_be_empty(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    assert cli_main(["embed", str(tmp_path / "empty.txt"), str(tmp_path / "o.h5"), "--top"]) == 0
    err = capsys.readouterr().err
    assert "empty.txt: no lines to embed" in err and "holds no sentences" in err


@pytest.mark.core
def test_the_memory_check_counts_every_limit_the_kernel_enforces(tmp_path, monkeypatch):
    # The least of the machine's available memory, the cgroup's room and the resource limits,
    # named in the refusal; the cgroup read from v2's and v1's files.
    from torchelmo import runtime
    (tmp_path / "cg").write_text("0::/job\n")
    (tmp_path / "sys" / "job").mkdir(parents=True)
    (tmp_path / "sys" / "job" / "memory.max").write_text("2147483648\n")
    (tmp_path / "sys" / "job" / "memory.current").write_text("536870912\n")
    assert runtime._cgroup_room(str(tmp_path / "cg"), str(tmp_path / "sys")) == 1536 * 2**20
    (tmp_path / "sys" / "job" / "memory.max").write_text("max\n")
    assert runtime._cgroup_room(str(tmp_path / "cg"), str(tmp_path / "sys")) is None
    (tmp_path / "cg1").write_text("12:cpu,cpuacct:/x\n4:memory:/job1\n")
    (tmp_path / "sys" / "memory" / "job1").mkdir(parents=True)
    (tmp_path / "sys" / "memory" / "job1" / "memory.limit_in_bytes").write_text(str(3 * 2**30))
    (tmp_path / "sys" / "memory" / "job1" / "memory.usage_in_bytes").write_text(str(2**30))
    assert runtime._cgroup_room(str(tmp_path / "cg1"), str(tmp_path / "sys")) == 2 * 2**30
    monkeypatch.setattr(runtime, "available_memory", lambda: 8 * 2**30)
    monkeypatch.setattr(runtime, "_cgroup_room", lambda: 2 * 2**30)
    monkeypatch.setattr(runtime, "_rlimit_room", lambda which, field: 3 * 2**30 if which == "RLIMIT_AS" else None)
    assert runtime.memory_room() == (2 * 2**30, "left under this process's memory cgroup limit")
    with pytest.raises(ElmoError, match=r"needs 2.5 GiB for its parameters, more than the 2.0 GiB left under "
                                        r"this process's memory cgroup limit"):
        runtime.check_allocation(int(2.5 * 2**30), "a model")


@pytest.mark.core
def test_a_model_over_the_address_space_limit_is_refused_before_allocating(tmp_path):
    # A real limit (ulimit -v) set 1 GiB above what the process maps: a 4.8 GB model is refused in
    # one line naming the limit, where it used to die in the allocator with a 42-line traceback.
    import sys
    script = (
        "import resource, sys\n"
        "import torch\n"
        "from torchelmo import BiLM, ElmoConfig, ElmoError, preset\n"
        "used = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmSize:'))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + 2**30, resource.RLIM_INFINITY))\n"
        "import dataclasses\n"
        "cfg = dataclasses.replace(preset('tiny'), lstm_dim=16384, projection_dim=2048)\n"
        "try:\n"
        "    BiLM(cfg)\n"
        "except ElmoError as e:\n"
        "    print(e); sys.exit(3)\n")
    from helpers import ENV
    run = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr[-2000:]
    assert "left under the address-space limit (ulimit -v)" in run.stdout and run.stdout.count("\n") == 1


def _own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory, if it can hold a child the test may limit (a
    writable cgroup v1 memory hierarchy or cgroup v2 with the memory controller; root)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        elif hierarchy == "0" and controllers == "":
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
            if not (base / "cgroup.controllers").is_file() or "memory" not in (base / "cgroup.controllers").read_text():
                continue
        else:
            continue
        if base.is_dir() and os.access(base, os.W_OK):
            return base
    return None


def test_a_model_over_a_real_memory_cgroup_limit_is_refused_before_allocating(tmp_path):
    # A 2 GiB cgroup limit, as a container or systemd sets one: a 4.5 GiB model is refused in one
    # line naming the cgroup, where the kernel used to kill the process (exit 137, no message).
    import sys
    base = _own_memory_cgroup()
    if base is None:
        pytest.skip("needs a memory cgroup this process may create a child of (root on Linux)")
    child = base / f"torchelmo-test-{os.getpid()}"
    child.mkdir()
    try:
        v1 = (child / "memory.limit_in_bytes").exists()
        (child / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(2 * 2**30))
        script = (
            "import dataclasses, os, sys\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "from torchelmo import BiLM, ElmoError, preset\n"
            "try:\n"
            "    BiLM(dataclasses.replace(preset('tiny'), lstm_dim=16384, projection_dim=2048))\n"
            "except ElmoError as e:\n"
            "    print(e); sys.exit(3)\n")
        from helpers import ENV
        run = subprocess.run([sys.executable, "-c", script, str(child / "cgroup.procs")], env=ENV,
                             capture_output=True, text=True, timeout=120)
    finally:
        child.rmdir()      # its one process has ended
    assert run.returncode == 3, (run.returncode, run.stderr[-2000:])
    assert "left under this process's memory cgroup limit" in run.stdout and run.stdout.count("\n") == 1


@pytest.mark.core
def test_a_language_model_counts_its_softmax_before_allocating(monkeypatch):
    # 1M words by a 4096-wide projection: 16 GB of softmax rows, refused before any is made.
    import dataclasses

    from torchelmo import preset, runtime
    from torchelmo.lm.model import LanguageModel
    from torchelmo.lm.vocab import SPECIAL_TOKENS, Vocabulary
    vocab = Vocabulary([*SPECIAL_TOKENS, *(f"w{i}" for i in range(1_000_000))])
    monkeypatch.setattr(runtime, "memory_room", lambda: (6 * 2**30, "left under the address-space limit (ulimit -v)"))
    cfg = dataclasses.replace(preset("tiny"), projection_dim=4096)
    made = []
    monkeypatch.setattr(torch.nn.Embedding, "__init__", lambda *a, **k: made.append(1))
    with pytest.raises(ElmoError, match=r"a language model over 1,000,003 words .* GiB left under the "
                                        r"address-space limit"):
        LanguageModel(cfg, vocab, softmax="full")
    assert made == []


def test_api_warnings_point_at_the_callers_line(tmp_path):
    # However deep in the library a warning is raised, it names the user's file and line.
    import warnings

    import torch

    from torchelmo import BiLM, Elmo
    from torchelmo.embed.hdf5 import embed_file
    src = tmp_path / "in.txt"
    src.write_text("a b\n\nc\n")
    model = BiLM.from_pretrained("default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        embed_file(model, src, tmp_path / "out.h5", "all")
        Elmo(model, 1, dropout=0.0)(torch.zeros(1, 2, 50, dtype=torch.long), word_inputs=torch.zeros(1, 2, dtype=torch.long))
    mine = [w for w in caught if "blank" in str(w.message) or "word_inputs" in str(w.message)]
    assert len(mine) == 2, [str(w.message) for w in caught]
    assert all(w.filename == __file__ for w in mine), [(w.filename, w.lineno) for w in mine]
