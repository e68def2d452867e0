"""Hugging Face Hub names, offline against a cache in the hub's own layout, for biLMs and whole
LMs, and the directory save_pretrained writes for upload (weights + model card)."""

import hashlib
import json
import os
import subprocess
import sys

import huggingface_hub.constants
import pytest
import torch

from torchelmo import BiLM, ElmoConfig, ElmoError, batch_to_ids
from torchelmo.cli import main
from torchelmo.lm.model import LanguageModel
from torchelmo.lm.vocab import Vocabulary
from torchelmo.model import hub
from torchelmo.model import registry as R

pytestmark = pytest.mark.usefixtures("one_thread")

REV_A, REV_B = "a1" * 20, "b2" * 20
SENTS = [["The", "cat", "sat", "."], ["Hub", "!"]]


def _tiny(seed):
    torch.manual_seed(seed)
    cfg = ElmoConfig(lstm_dim=12, projection_dim=5, char_embed_dim=3, n_highway=1, filters=[[1, 4], [2, 4]])
    return BiLM(cfg).eval()


def _same(a, b):
    with torch.no_grad():
        ids = batch_to_ids(SENTS)
        return all(torch.equal(x, y) for x, y in zip(a(ids).layers, b(ids).layers))


def _put_in_cache(cache, repo_id, rev, model_dir, refs=()):
    """Files laid out as huggingface_hub stores them: blobs named by digest, snapshot/<rev>/ links
    to them, refs/<branch or tag> holding the revision."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for name in [f for f in hub.FILES if (model_dir / f).is_file()]:   # those resolve() fetches
        data = (model_dir / name).read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(rev)


@pytest.fixture()
def hub_cache(tmp_path, monkeypatch):
    """A hub cache with me/tiny: main -> model A, tag v1 -> model B; the Hub itself unreachable."""
    cache = tmp_path / "hf" / "hub"
    models = {"A": _tiny(0), "B": _tiny(1)}
    for (key, model), rev, refs in zip(models.items(), (REV_A, REV_B), (["main"], ["v1"])):
        _put_in_cache(cache, "me/tiny", rev, model.save_pretrained(tmp_path / key), refs)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache, models


def test_from_pretrained_reads_hub_ids_from_the_cache(hub_cache):
    _, models = hub_cache
    assert _same(BiLM.from_pretrained("me/tiny"), models["A"])
    assert _same(BiLM.from_pretrained("me/tiny@v1"), models["B"])
    assert _same(BiLM.from_pretrained(f"me/tiny@{REV_A}"), models["A"])
    assert not _same(models["A"], models["B"])


def test_hub_errors_are_one_line(hub_cache, monkeypatch):
    cache, _ = hub_cache
    for name, match in (("me/other", "not in the Hugging Face Hub cache"),
                        ("me/tiny@v9", "not in the Hugging Face Hub cache")):
        with pytest.raises(ElmoError, match=match) as e:
            BiLM.from_pretrained(name)
        assert "\n" not in str(e.value) and str(e.value).startswith(name)
    # A repository without our format.
    (cache / "models--me--tiny" / "snapshots" / REV_A / "config.json").unlink()
    with pytest.raises(ElmoError, match="holds no config.json"):
        BiLM.from_pretrained("me/tiny")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)   # the optional extra not installed
    with pytest.raises(ElmoError, match=r"pip install 'torchelmo\[hub\]'"):
        BiLM.from_pretrained("me/tiny")


def test_unknown_name_lists_every_accepted_name(capsys):
    with pytest.raises(ElmoError) as e:
        BiLM.from_pretrained("no-such-model")
    msg = str(e.value)
    assert "\n" not in msg and "'default'" in msg and "owner/name" in msg and "directory" in msg
    for name in [*R.REGISTRY, *R.ALIASES]:
        assert name in msg
    assert main(["info", "a/b/c"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "original-5.5b" in err


def test_save_pretrained_writes_a_directory_ready_to_upload(tmp_path):
    model = _tiny(2)
    out = model.save_pretrained(tmp_path / "m", repo_id="me/tiny", license="apache-2.0", language="en")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    card = (out / "README.md").read_text()
    front = card.split("---\n")[1].splitlines()
    assert {"library_name: torchelmo", "license: apache-2.0", "- en"} <= set(front)
    n_params = sum(p.numel() for p in model.parameters())
    assert 'BiLM.from_pretrained("me/tiny")' in card and f"{n_params:,}" in card
    assert json.loads((out / "config.json").read_text())["lstm"]["dim"] == 12
    assert _same(BiLM.from_pretrained(out), model)
    # Saving again refreshes a card torchelmo wrote, and keeps one written by hand.
    model.save_pretrained(out, license="mit")
    assert "license: mit" in (out / "README.md").read_text()
    (out / "README.md").write_text("# my own card\n")
    model.save_pretrained(out)
    assert (out / "README.md").read_text() == "# my own card\n"


@pytest.mark.parametrize("dtype, bound", [("float16", 2.0 ** -11), ("bfloat16", 2.0 ** -8)])
def test_save_pretrained_stores_half_precision_weights_that_load_as_fp32(tmp_path, dtype, bound):
    model = _tiny(4)
    full = model.save_pretrained(tmp_path / "fp32")
    half = model.save_pretrained(tmp_path / dtype, dtype=dtype)
    size = (half / "model.safetensors").stat().st_size
    assert size < 0.55 * (full / "model.safetensors").stat().st_size
    loaded = BiLM.from_pretrained(half)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert b.dtype == torch.float32, name
        assert torch.equal(b, a.to(getattr(torch, dtype)).float()), name       # each weight rounded once
        assert ((b - a).abs() <= bound * a.abs()).all(), name
    ids = batch_to_ids([["Half", "the", "bytes", "."]])
    with torch.no_grad():
        for x, y in zip(model(ids).layers, loaded(ids).layers):
            assert 0 < (x - y).abs().max() < 0.05 * x.abs().max()


def test_save_pretrained_refuses_a_weight_its_dtype_cannot_hold(tmp_path):
    model = _tiny(5)
    with torch.no_grad():
        model.encoder.proj.weight[0, 0] = 1e6                  # past float16's 65,504
    with pytest.raises(ElmoError, match=r"encoder\.proj\.weight.*float16.*non-finite"):
        model.save_pretrained(tmp_path / "m", dtype="float16")
    assert not (tmp_path / "m" / "model.safetensors").exists()
    with pytest.raises(ElmoError, match="dtype must be one of float32, float16, bfloat16, got 'fp8'"):
        model.save_pretrained(tmp_path / "m", dtype="fp8")


def test_cli_loads_a_hub_id_offline_in_a_fresh_process(tmp_path):
    model = _tiny(3)
    _put_in_cache(tmp_path / "hf" / "hub", "me/tiny", REV_A, model.save_pretrained(tmp_path / "m"), ["main"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "torchelmo.cli", "info", "me/tiny"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["options"] == model.config.to_options()


# ------------------------------------------------------------------------------------------------
# Whole LMs (biLM + softmax + vocabulary): elmo perplexity, elmo average, init-from.
# ------------------------------------------------------------------------------------------------
WORDS = ["<S>", "</S>", "<UNK>", "the", "cat", "sat", "."]


def _tiny_lm(seed):
    torch.manual_seed(seed)
    return LanguageModel(_tiny(seed).config, Vocabulary(WORDS), softmax="full").eval()


def _scores(lm):
    return [(s.forward_logprob, s.backward_logprob) for s in lm.score(SENTS)]


@pytest.fixture()
def lm_cache(hub_cache, tmp_path):
    """hub_cache plus me/lm: main -> LM A, tag v1 -> LM B (each with training.json and vocab.txt)."""
    cache, _ = hub_cache
    lms = {"A": _tiny_lm(4), "B": _tiny_lm(5)}
    for (key, lm), rev, refs in zip(lms.items(), (REV_A, REV_B), (["main"], ["v1"])):
        _put_in_cache(cache, "me/lm", rev, lm.save_pretrained(tmp_path / f"lm-{key}"), refs)
    return lms


def test_language_model_reads_hub_ids_from_the_cache(lm_cache, tmp_path, monkeypatch):
    assert _scores(LanguageModel.from_pretrained("me/lm")) == _scores(lm_cache["A"])
    assert _scores(LanguageModel.from_pretrained("me/lm@v1")) == _scores(lm_cache["B"])
    assert _scores(lm_cache["A"]) != _scores(lm_cache["B"])
    # A directory spelled like the Hub id wins.
    monkeypatch.chdir(tmp_path)
    lm_cache["B"].save_pretrained(tmp_path / "me" / "lm")
    assert _scores(LanguageModel.from_pretrained("me/lm")) == _scores(lm_cache["B"])


def test_language_model_names_are_one_line_errors(lm_cache, tmp_path):
    (tmp_path / "a-file").write_text("")
    cases = [("no-such-lm", "no such LM directory, and not a Hugging Face Hub id; accepted: an LM directory"),
             (str(tmp_path / "a-file"), "a file, not an LM directory"),
             ("me/other", "not in the Hugging Face Hub cache"),
             ("me/lm@v9", "not in the Hugging Face Hub cache"),
             ("me/tiny", "a biLM without a softmax layer"),     # a biLM on the Hub
             ("original", "a biLM without a softmax layer")]
    for name, match in cases:
        with pytest.raises(ElmoError, match=match) as e:
            LanguageModel.from_pretrained(name)
        assert "\n" not in str(e.value) and str(e.value).startswith(name), str(e.value)
    with pytest.raises(ElmoError) as e:
        LanguageModel.from_pretrained("no-such-lm")
    assert "owner/name[@revision]" in str(e.value) and "original-5.5b" not in str(e.value)


def test_init_from_a_hub_lm_carries_its_softmax(lm_cache):
    msgs = []
    lm = LanguageModel.init_from("me/lm", Vocabulary(WORDS + ["dog"]), log=msgs.append)
    assert "7 softmax rows carried over, 1 new tokens" in msgs[-1]
    assert torch.equal(lm.softmax.weight[:7], lm_cache["A"].softmax.weight)
    fresh = LanguageModel.init_from("me/tiny", Vocabulary(WORDS), log=msgs.append)   # a Hub biLM
    assert "a new one is initialised" in msgs[-1] and fresh.bilm.config == lm_cache["A"].config


def test_perplexity_and_average_take_hub_ids(lm_cache, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat .\n")
    assert main(["perplexity", "me/lm@v1", str(text), "--threads", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "me/lm@v1"
    assert out["ppl_mean"] == pytest.approx(lm_cache["B"].perplexity([text])["ppl_mean"])
    assert main(["average", "me/lm", "me/lm@v1", "-o", str(tmp_path / "avg")]) == 0
    assert "the mean of 2 model(s)" in capsys.readouterr().err
    avg = LanguageModel.from_pretrained(tmp_path / "avg")
    want = (lm_cache["A"].softmax.weight + lm_cache["B"].softmax.weight) / 2
    assert torch.allclose(avg.softmax.weight, want)
    assert main(["perplexity", "me/other", str(text)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("elmo perplexity: error: me/other: ") and err.count("\n") == 1


def test_a_spacy_pipeline_named_by_a_hub_id_carries_its_model(hub_cache, tmp_path, monkeypatch):
    # Saved with the model named by a Hub id, loaded where the Hub's cache is empty (and the Hub
    # unreachable): the vectors come from the copy the pipeline holds.
    spacy = pytest.importorskip("spacy", reason="the spacy extra (CI installs it through the test extra)")
    import numpy as np

    import torchelmo.integrations.spacy  # noqa: F401  (registers the factory)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": "me/tiny", "device": "cpu"})
    want = nlp("The cat sat .")._.elmo
    nlp.to_disk(tmp_path / "pipe")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(ElmoError):
        BiLM.from_pretrained("me/tiny")        # the name alone no longer resolves here
    loaded = spacy.load(tmp_path / "pipe")
    np.testing.assert_allclose(loaded("The cat sat .")._.elmo, want, rtol=0, atol=1e-6)
