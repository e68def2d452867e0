"""`elmo embed`: HDF5 layout, alignment, atomic output, streaming, sharding, exactness of the fast path."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

import torchelmo.embed as E
from torchelmo import BiLM, ElmoError, batch_to_ids
from torchelmo.cli import main
from torchelmo.embed import (
    ElmoWarning,
    count_lines,
    embed_file,
    embed_sentences,
    iter_embed,
    iter_embed_file,
    merge_shards,
)
from torchelmo.numerics.lstm import lstm_reference

# Same sentence, different batch mates: float32 matmuls round differently for different batch
# sizes, a few ulps of values up to ~4 (layers with skip connections).
TOL = dict(atol=1e-6, rtol=1e-6)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sentences(allennlp_dir):
    s = json.loads((allennlp_dir / "sentences.json").read_text())
    return [x for k in range(3) for x in s[k]]          # 30 real sentences


@pytest.fixture(scope="module")
def model_args(allennlp_dir):
    return ["--options-file", str(allennlp_dir / "options.json"),
            "--weight-file", str(allennlp_dir / "lm_weights.hdf5")]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _alone(model, tokens):
    """All layers of one sentence run on its own: (3, n, 2P)."""
    with torch.no_grad():
        out = model(batch_to_ids([tokens]))
    return torch.stack(out.layers, 1)[0].numpy()


def _no_temp_files(directory):
    return not [p for p in directory.iterdir() if p.name.endswith(".tmp")]


# ------------------------------------------------------------------------------------------------
# Layout.
# ------------------------------------------------------------------------------------------------
def test_hdf5_layout_all_top_average_pool(tmp_path, fixture_model, sentences):
    lines = sentences[:6] + [""] + sentences[6:9] + ["  " + sentences[0] + " "]  # blank, repeat
    src = _write(tmp_path / "in.txt", lines)
    with pytest.warns(ElmoWarning, match=r"line 7 \(dataset '6'\) is blank"):
        for mode in ("all", "top", "average"):
            embed_file(fixture_model, src, tmp_path / f"{mode}.hdf5", mode)
        embed_file(fixture_model, src, tmp_path / "pool_top.hdf5", "top", pool="mean")
        embed_file(fixture_model, src, tmp_path / "pool_all.hdf5", "all", pool="mean")
    F = 2 * fixture_model.config.projection_dim
    with h5py.File(tmp_path / "all.hdf5", "r") as fa, h5py.File(tmp_path / "top.hdf5", "r") as ft, \
            h5py.File(tmp_path / "average.hdf5", "r") as fv, \
            h5py.File(tmp_path / "pool_top.hdf5", "r") as fp, h5py.File(tmp_path / "pool_all.hdf5", "r") as fq:
        for f in (fa, ft, fv, fp, fq):
            assert set(f.keys()) == {str(i) for i in range(len(lines))} | {"sentence_to_index"}
            idx = f["sentence_to_index"]
            assert idx.shape == (1,) and h5py.check_string_dtype(idx.dtype) is not None
            mapping = json.loads(idx[0])
            # AllenNLP's map: stripped line -> str(index); a repeated sentence maps to its last index.
            want = {}
            for i, line in enumerate(lines):
                want[line.strip()] = str(i)
            assert mapping == want and mapping[sentences[0]] == "10"
        for i, line in enumerate(lines):
            toks = line.split()
            a, t, v = fa[str(i)][...], ft[str(i)][...], fv[str(i)][...]
            assert a.dtype == t.dtype == v.dtype == np.float32
            assert a.shape == (3, len(toks), F) and t.shape == v.shape == (len(toks), F)
            if not toks:
                assert fp[str(i)].shape == fq[str(i)].shape == (0,)
                continue
            np.testing.assert_allclose(a, _alone(fixture_model, toks), **TOL)
            np.testing.assert_array_equal(t, a[-1])
            np.testing.assert_allclose(v, a.mean(0), **TOL)
            np.testing.assert_allclose(fp[str(i)][...], a[-1].mean(0), **TOL)
            np.testing.assert_allclose(fq[str(i)][...], a.mean(1), **TOL)
            assert fq[str(i)].shape == (3, F)


def test_blank_lines_keep_alignment_and_are_named(tmp_path, fixture_model, sentences):
    lines = ["", sentences[3], " \t ", sentences[4], sentences[5], ""]
    src = _write(tmp_path / "in.txt", lines)
    with pytest.warns(ElmoWarning) as record:
        got = dict(iter_embed_file(fixture_model, src, "top"))
    named = [str(w.message) for w in record]
    assert any("line 1 " in m for m in named) and any("line 3 " in m for m in named)
    assert any("line 6 " in m for m in named) and len(named) == 3
    assert sorted(got) == list(range(6))
    for i in (0, 2, 5):
        assert got[i].shape == (0, 32)
    for i in (1, 3, 4):
        np.testing.assert_allclose(got[i], _alone(fixture_model, lines[i].split())[-1], **TOL)
    # Many blank lines: the first few are named, then one summary.
    src = _write(tmp_path / "blanks.txt", ["a b"] + [""] * 9)
    with pytest.warns(ElmoWarning) as record:
        list(iter_embed_file(fixture_model, src, "top"))
    assert len(record) == E.BLANK_WARNINGS + 1 and "9 blank lines in all" in str(record[-1].message)


def test_stateful_cli_reproduces_the_original_outputs(tmp_path, allennlp_dir, model_args):
    """The fixture's expected outputs were made with batch i = [s0[i], s1[i], s2[i]] and carried
    state: lines in that order with --stateful --batch-size 3 reproduce them."""
    s = json.loads((allennlp_dir / "sentences.json").read_text())
    src = _write(tmp_path / "in.txt", [s[k][i] for i in range(10) for k in range(3)])
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(src), str(out), "--top", "--stateful", "--batch-size", "3",
                 "--quiet", *model_args]) == 0
    with h5py.File(out, "r") as f:
        for i in range(10):
            for k in range(3):
                want = h5py.File(allennlp_dir / f"lm_embeddings_{k}.hdf5", "r")[str(i)][...]
                np.testing.assert_allclose(f[str(3 * i + k)][...], np.concatenate(want, -1),
                                           atol=1e-6, rtol=1e-5, err_msg=f"sentence {k}/{i}")


# ------------------------------------------------------------------------------------------------
# Failure leaves no output.
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_failed_run_leaves_no_output(tmp_path, fixture_model, sentences, monkeypatch, exc):
    src = _write(tmp_path / "in.txt", sentences)
    out = tmp_path / "out.hdf5"
    out.write_bytes(b"previous result")
    real, calls = E.engine.start_batch, []

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise exc
        return real(*a, **kw)

    monkeypatch.setattr(E.engine, "start_batch", failing)
    with pytest.raises(type(exc)):
        embed_file(fixture_model, src, out, "all", batch_size=2, window_lines=4)
    assert len(calls) == 3
    assert out.read_bytes() == b"previous result"       # untouched, not truncated
    assert _no_temp_files(tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_process_leaves_no_output(tmp_path, sentences, model_args, sig):
    src = _write(tmp_path / "in.txt", sentences * 300)
    out = tmp_path / "out.hdf5"
    proc = subprocess.Popen([sys.executable, "-m", "torchelmo.cli", "embed", str(src), str(out), "--all",
                             "--quiet", "--threads", "1", "--batch-size", "2", *model_args],
                            stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while _no_temp_files(tmp_path) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.5)                                  # mid-run: datasets are being written
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not out.exists()
    if sig == signal.SIGTERM:                            # unwinds: temporary file removed too
        assert rc == 130 and _no_temp_files(tmp_path)
        assert b"interrupted" in proc.stderr.read()


# ------------------------------------------------------------------------------------------------
# Exactness of the fast path.
# ------------------------------------------------------------------------------------------------
def _random_tokens(n, seed, max_len=14):
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "Überall", "北京", "!", "running", "x" * 60,
             "y" * 47, "z" * 48, "<S>", "😀", "q" * 43]
    return [[rng.choice(words) for _ in range(rng.randint(1, max_len))] for _ in range(n)]


def test_embeddings_equal_reference_path(fixture_model):
    """End to end: embed_sentences vs the slow reference LSTM, sentence by sentence."""
    sents = _random_tokens(12, seed=3)
    cfg = fixture_model.config
    got = embed_sentences(fixture_model, sents, "all", batch_size=5)
    ids = batch_to_ids([["<S>", *s, "</S>"] for s in sents])
    with torch.no_grad():
        e = fixture_model.encoder.encode_tokens(ids.view(-1, 50)).view(*ids.shape[:2], -1)
        outs, _ = lstm_reference(list(fixture_model.layers), [e[b, : len(s) + 2] for b, s in enumerate(sents)],
                                 None, cfg.cell_clip, cfg.proj_clip, cfg.use_skip_connections)
    for b, s in enumerate(sents):
        want = np.stack([torch.cat([e[b, 1:len(s) + 1]] * 2, -1).numpy()]
                        + [outs[b][k][1:-1].numpy() for k in range(2)])
        np.testing.assert_allclose(got[b], want, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------
# Batching, order, streaming.
# ------------------------------------------------------------------------------------------------
def test_output_independent_of_batching_and_order(fixture_model, sentences):
    sents = [s.split() for s in sentences] + _random_tokens(10, seed=5)
    base = embed_sentences(fixture_model, sents, "all")
    variants = [dict(batch_size=1), dict(batch_size=7), dict(max_tokens_per_batch=40),
                dict(batch_size=3, max_tokens_per_batch=200)]
    for kw in variants:
        for a, b in zip(base, embed_sentences(fixture_model, sents, "all", **kw)):
            np.testing.assert_allclose(a, b, **TOL, err_msg=str(kw))
    small_windows = [arr for _, arr in iter_embed(fixture_model, sents, "all", window_lines=3)]
    perm = list(range(len(sents)))
    random.Random(0).shuffle(perm)
    shuffled = embed_sentences(fixture_model, [sents[i] for i in perm], "all")
    for j, i in enumerate(perm):
        np.testing.assert_allclose(shuffled[j], base[i], **TOL)
        np.testing.assert_allclose(small_windows[i], base[i], **TOL)


def test_streaming_reads_one_window_at_a_time(fixture_model, sentences):
    consumed = []

    def source():
        for s in sentences:
            consumed.append(s)
            yield s.split()

    it = iter_embed(fixture_model, source(), "top", window_lines=4)
    first = next(it)
    assert first[0] == 0 and len(consumed) == 4                 # only the first window was read
    rest = list(it)
    assert [i for i, _ in rest] == list(range(1, 30)) and len(consumed) == 30


def test_stateful_batches_in_input_order(fixture_model, sentences):
    """Stateful: row r of batch i is sentence i*B + r, so the output equals running those batches
    through a stateful model by hand (and differs from the stateless output)."""
    sents = [s.split() for s in sentences[:10]]
    stateful = BiLM(fixture_model.config, stateful=True)
    stateful.load_state_dict(fixture_model.state_dict())
    stateful.eval()
    got = embed_sentences(stateful, sents, "top", batch_size=4)
    stateful.reset_states()
    with torch.no_grad():
        for i in range(0, 10, 4):
            top = stateful(batch_to_ids(sents[i:i + 4])).layers[-1]
            for r, s in enumerate(sents[i:i + 4]):
                np.testing.assert_allclose(got[i + r], top[r, : len(s)].numpy(), **TOL)
    assert not np.allclose(got[5], embed_sentences(fixture_model, sents, "top")[5], atol=1e-3)
    # Blank sentences keep their rows (a batch may be all blank): the model sees "<S> </S>".
    with_blanks = sents[:3] + [[], []] + sents[3:5]
    got = embed_sentences(stateful, with_blanks, "top", batch_size=2)
    stateful.reset_states()
    with torch.no_grad():
        for i in range(0, len(with_blanks), 2):
            top = stateful(batch_to_ids(with_blanks[i:i + 2])).layers[-1]
            for r, s in enumerate(with_blanks[i:i + 2]):
                assert got[i + r].shape == (len(s), 32)
                np.testing.assert_allclose(got[i + r], top[r, : len(s)].numpy(), **TOL)
    with pytest.raises(ElmoError, match="stateful"):
        embed_sentences(stateful, sents, "top", max_tokens_per_batch=100)


def test_bfloat16_is_close_to_float32(fixture_model, sentences):
    sents = [s.split() for s in sentences[:8]]
    f32 = embed_sentences(fixture_model, sents, "all")
    m16 = BiLM(fixture_model.config)
    m16.load_state_dict(fixture_model.state_dict())
    b16 = embed_sentences(m16.to(torch.bfloat16).eval(), sents, "all")
    err = max(np.abs(a - b).max() for a, b in zip(f32, b16))
    scale = max(np.abs(a).max() for a in f32)
    assert b16[0].dtype == np.float32 and 0 < err < 0.1 * scale


def test_precision_bf16_is_close_to_fp32(fixture_model, sentences, tmp_path, model_args, capsys):
    sents = [s.split() for s in sentences[:8]]
    f32 = embed_sentences(fixture_model, sents, "all")
    fixture_model.precision = "bf16"
    try:
        b16 = embed_sentences(fixture_model, sents, "all")
    finally:
        fixture_model.precision = "fp32"
    err = max(np.abs(a - b).max() for a, b in zip(f32, b16))
    scale = max(np.abs(a).max() for a in f32)
    assert b16[0].dtype == np.float32 and 0 < err < 0.1 * scale
    src = tmp_path / "in.txt"
    src.write_text("a b c\n")
    assert main(["embed", str(src), str(tmp_path / "o.hdf5"), "--top", "--precision", "bf16", *model_args]) == 0
    assert main(["embed", str(src), str(tmp_path / "p.hdf5"), "--top", "--precision", "auto", *model_args]) == 0


# ------------------------------------------------------------------------------------------------
# Bad input.
# ------------------------------------------------------------------------------------------------
def test_invalid_utf8_names_the_line(tmp_path, fixture_model, model_args, capsys):
    src = tmp_path / "in.txt"
    src.write_bytes(b"a good line\nanother one\ncaf\xe9 au lait\nlast\n")
    out = tmp_path / "out.hdf5"
    with pytest.raises(ElmoError, match=r"in.txt: line 3: invalid UTF-8 \(byte 0xe9 at column 4\)"):
        embed_file(fixture_model, src, out, "top")
    assert not out.exists() and _no_temp_files(tmp_path)
    assert main(["embed", str(src), str(out), "--top", "--quiet", *model_args]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("elmo embed: error:") and "line 3" in err
    embed_file(fixture_model, src, out, "top", errors="replace")
    with h5py.File(out, "r") as f:
        assert f["2"].shape == (3, 32)
        assert "caf\ufffd au lait" in json.loads(f["sentence_to_index"][0])


def test_api_rejects_untokenised_input(fixture_model):
    with pytest.raises(ElmoError, match="sentence 1 is a str"):
        embed_sentences(fixture_model, [["a"], "b c"])
    with pytest.raises(ElmoError, match="sentence 0 token 1 is int"):
        embed_sentences(fixture_model, [["a", 3]])
    with pytest.raises(ElmoError, match="layers must be one of"):
        embed_sentences(fixture_model, [["a"]], "middle")


def test_bad_options_are_one_line_errors(tmp_path, model_args, allennlp_dir, capsys, sentences):
    src = _write(tmp_path / "in.txt", sentences[:3])
    out = str(tmp_path / "out.hdf5")
    cases = [
        (["--stateful", "--max-tokens-per-batch", "100"], "stateful"),
        (["--stateful", "--shard", "0/2"], "stateful mode cannot be sharded"),
        (["--shard", "2/2"], "need 0 <= K < N"),
        (["--shard", "x"], "expected K/N"),
    ]   # --batch-size 0: argparse's usage error naming the flag (test_bad_input.py)
    for extra, msg in cases:
        assert main(["embed", str(src), out, "--top", "--quiet", *model_args, *extra]) == 1
        err = capsys.readouterr().err.strip()
        assert msg in err and "\n" not in err, (extra, err)
    assert main(["embed", str(src), out, "--top", "--options-file",
                 str(allennlp_dir / "options.json")]) == 1
    assert "go together" in capsys.readouterr().err
    assert main(["embed", str(tmp_path / "missing.txt"), out, "--top", "--quiet", *model_args]) == 1
    assert "cannot read input" in capsys.readouterr().err
    assert not os.path.exists(out)


# ------------------------------------------------------------------------------------------------
# Shards.
# ------------------------------------------------------------------------------------------------
def _same_file(a, b, exact_values=False):
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert list(fa.keys()) == list(fb.keys())
        assert dict(fa.attrs) == dict(fb.attrs)
        assert fa["sentence_to_index"][0] == fb["sentence_to_index"][0]
        for k in fa:
            if k != "sentence_to_index":
                assert fa[k].shape == fb[k].shape and fa[k].dtype == fb[k].dtype
                np.testing.assert_allclose(fa[k][...], fb[k][...], **(dict(atol=0, rtol=0) if exact_values else TOL))


def test_shards_merge_to_the_unsharded_file(tmp_path, fixture_model, sentences, model_args, monkeypatch):
    lines = sentences[:11] + [""] + sentences[:3] + sentences[20:]   # repeats across shards, a blank
    src = _write(tmp_path / "in.txt", lines)
    whole = tmp_path / "whole.hdf5"
    assert main(["embed", str(src), str(whole), "--all", "--quiet", *model_args]) == 0
    shards = [tmp_path / f"part{k}.hdf5" for k in range(3)]
    for k, p in enumerate(shards):
        with pytest.warns(ElmoWarning) if k == 11 % 3 else _nothing():
            s = embed_file(fixture_model, src, p, "all", shard=(k, 3),
                           model_name=f"{model_args[1]} + {model_args[3]}")   # as the CLI names it
        assert s.sentences == len(range(k, len(lines), 3)) and s.lines == len(lines)
        with h5py.File(p, "r") as f:                         # global dataset names
            assert sorted(int(x) for x in f if x.isdigit()) == list(range(k, len(lines), 3))
    merged = tmp_path / "merged.hdf5"
    assert main(["embed-merge", str(merged), *map(str, reversed(shards))]) == 0
    _same_file(whole, merged)
    # The index flavour: external links, readable from anywhere.
    (tmp_path / "sub").mkdir()
    index = tmp_path / "sub" / "index.hdf5"
    merge_shards(shards, index, link=True)
    assert index.stat().st_size < merged.stat().st_size
    monkeypatch.chdir(tmp_path / "sub")
    _same_file(merged, "index.hdf5", exact_values=True)

    with pytest.raises(ElmoError, match=r"missing \[1\]"):
        merge_shards([shards[0], shards[2]], tmp_path / "bad.hdf5")
    with pytest.raises(ElmoError, match="not an elmo embed shard"):
        merge_shards([whole, *shards], tmp_path / "bad.hdf5")
    other = tmp_path / "other.hdf5"
    embed_file(fixture_model, src, other, "top", shard=(1, 3))
    with pytest.raises(ElmoError, match="different run"):
        merge_shards([shards[0], other, shards[2]], tmp_path / "bad.hdf5")
    assert not (tmp_path / "bad.hdf5").exists()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ------------------------------------------------------------------------------------------------
# CLI and input handling.
# ------------------------------------------------------------------------------------------------
def test_cli_end_to_end_with_model_dir(tmp_path, fixture_model, allennlp_dir, sentences, capsys):
    src = _write(tmp_path / "in.txt", sentences[:7])
    out = tmp_path / "out.hdf5"
    assert main(["embed", str(src), str(out), "--average", "--model", str(allennlp_dir),
                 "--batch-size", "3", "--pool", "mean"]) == 0
    err = capsys.readouterr().err
    assert "7 lines" in err and "tokens/s" in err                 # summary (and the progress bar)
    want = embed_sentences(fixture_model, [s.split() for s in sentences[:7]], "average", pool="mean")
    with h5py.File(out, "r") as f:
        for i in range(7):
            np.testing.assert_allclose(f[str(i)][...], want[i], **TOL)
        assert f.attrs["elmo_layers"] == "average" and f.attrs["elmo_pool"] == "mean"


def test_stdin_input_bom_and_line_count(tmp_path, fixture_model, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xef\xbb\xbfthe cat\r\nsat\n")))
    out = tmp_path / "out.hdf5"
    embed_file(fixture_model, "-", out, "top")
    with h5py.File(out, "r") as f:
        assert f["0"].shape == (2, 32) and f["1"].shape == (1, 32)
        assert json.loads(f["sentence_to_index"][0]) == {"the cat": "0", "sat": "1"}
    p = tmp_path / "n.txt"
    p.write_bytes(b"a\nb\nc")
    assert count_lines(p) == 3 and count_lines("-") is None
    p.write_bytes(b"a\nb\n")
    assert count_lines(p) == 2


def test_no_model_option_uses_the_default_model(tmp_path, fixture_model, monkeypatch, sentences):
    asked = []

    def fake_from_pretrained(name="default", **kw):
        asked.append((name, kw))
        return fixture_model

    monkeypatch.setattr(BiLM, "from_pretrained", staticmethod(fake_from_pretrained))
    src = _write(tmp_path / "in.txt", sentences[:2])
    assert main(["embed", str(src), str(tmp_path / "out.hdf5"), "--top", "--quiet"]) == 0
    assert asked == [("default", {"stateful": False})]
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert f["1"].shape == (len(sentences[1].split()), 32)
