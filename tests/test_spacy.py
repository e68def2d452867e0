"""The spaCy `elmo` pipeline component on spacy.blank("en") (no model download)."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from torchelmo import BiLM, ElmoError, batch_to_ids

spacy = pytest.importorskip("spacy", reason="the spacy extra (CI installs it through the test extra)")

TEXTS = ["The cat sat on the mat.", "Birds fly south in winter, don't they?", "", "Hello   world"]


@pytest.fixture(scope="module")
def bilm(allennlp_dir):
    return BiLM.from_pretrained(allennlp_dir)


def _nlp(allennlp_dir, **config):
    import torchelmo.integrations.spacy  # noqa: F401  (registers the factory; the entry point does it too)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": str(allennlp_dir), "device": "cpu", **config})
    return nlp


def _layers(bilm, tokens):
    with torch.no_grad():
        return torch.stack(bilm(batch_to_ids([tokens])).layers, 0)[:, 0].numpy()   # (3, n, 2P)


def test_token_doc_and_span_vectors(allennlp_dir, bilm):
    nlp = _nlp(allennlp_dir, layers=[1, 2], scalar_mix_parameters=[0.0, 1.0], gamma=2.0)
    doc = nlp(TEXTS[1])
    tokens = [t.text for t in doc]
    want = _layers(bilm, tokens)[[1, 2]]
    w = 2.0 * torch.softmax(torch.tensor([0.0, 1.0], dtype=torch.float64), 0).numpy()
    assert doc._.elmo_layers.shape == (2, len(doc), 32) and doc._.elmo.shape == (len(doc), 32)
    np.testing.assert_allclose(doc._.elmo_layers, want, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(doc._.elmo, w[0] * want[0] + w[1] * want[1], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(doc[3]._.elmo, doc._.elmo[3])
    np.testing.assert_allclose(doc[3]._.elmo_layers, want[:, 3], atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(doc[2:5]._.elmo, doc._.elmo[2:5].mean(0), atol=1e-6)


def test_default_is_the_mean_of_all_layers(allennlp_dir, bilm):
    doc = _nlp(allennlp_dir)(TEXTS[0])
    want = _layers(bilm, [t.text for t in doc])
    np.testing.assert_allclose(doc._.elmo_layers, want, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(doc._.elmo, want.mean(0), atol=1e-5, rtol=1e-5)
    assert doc[0]._.elmo.dtype == np.float32


def test_pipe_batches_and_matches_one_by_one(allennlp_dir):
    nlp = _nlp(allennlp_dir, batch_size=2)
    elmo = nlp.get_pipe("elmo")
    rows = []
    handle = elmo.bilm.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    try:
        docs = list(nlp.pipe(TEXTS * 2))
    finally:
        handle.remove()
    assert sum(rows) == 6 and max(rows) == 2 and len(rows) < len(docs)   # the empty docs need no row
    for doc, text in zip(docs, TEXTS * 2):
        alone = nlp(text)
        assert doc._.elmo.shape == (len(doc), 32)
        np.testing.assert_allclose(doc._.elmo, alone._.elmo, atol=1e-5, rtol=1e-5)
    assert docs[2]._.elmo.shape == (0, 32) and docs[2][0:0]._.elmo is None


def test_set_vectors_and_similarity(allennlp_dir):
    from torchelmo.integrations.spacy import similarity
    nlp = _nlp(allennlp_dir, set_vectors=True)
    doc = nlp(TEXTS[0])
    np.testing.assert_allclose(doc[1].vector, doc[1]._.elmo)
    np.testing.assert_allclose(doc[1:3].vector, doc._.elmo[1:3].mean(0), atol=1e-6)
    np.testing.assert_allclose(doc.vector, doc._.elmo.mean(0), atol=1e-6)
    assert doc[1].has_vector and doc[1:3].has_vector and doc.has_vector
    a, b = doc[1]._.elmo, doc[5]._.elmo
    assert doc[1].similarity(doc[5]) == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-5)
    # Contextual: the same word in two contexts is not identical (spaCy's own similarity says 1.0).
    other = nlp("A mat .")
    assert doc[5].text == other[1].text == "mat"
    s = similarity(doc[5], other[1])
    assert doc[5].similarity(other[1]) == pytest.approx(s) and s < 0.999
    assert similarity(doc, doc) == pytest.approx(1.0) and similarity(doc, nlp("")) == 0.0


# A fresh interpreter per start method: nlp.pipe(n_process=2) must neither hang (fork, after the
# parent has run PyTorch's thread pool) nor fail to pickle (spawn), and must give the same vectors.
N_PROCESS = """
import multiprocessing, sys
import numpy as np
import spacy
from torchelmo.integrations.spacy import similarity
if __name__ == "__main__":
    multiprocessing.set_start_method(sys.argv[1], force=True)
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": sys.argv[2], "device": "cpu", "set_vectors": True})
    texts = [f"Sentence {i} is here , with {'more ' * (i % 7)}words ." for i in range(40)] + ["", "bank bank"]
    alone = [nlp(t) for t in texts]            # runs the parent's thread pool before the fork
    docs = list(nlp.pipe(texts, n_process=2, batch_size=4))
    assert len(docs) == len(texts)
    for d, a in zip(docs, alone):
        assert [t.text for t in d] == [t.text for t in a]
        np.testing.assert_allclose(d._.elmo, a._.elmo, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(d._.elmo_layers, a._.elmo_layers, atol=1e-5, rtol=1e-5)
        if len(d):
            assert d[0].has_vector and d.has_vector
            np.testing.assert_allclose(d[0].vector, a[0]._.elmo, atol=1e-5, rtol=1e-5)
    bank = docs[-1]
    assert similarity(bank[0], bank[1]) < 0.999
    print("ok", len(docs))
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pipe_with_worker_processes(allennlp_dir, tmp_path, method):
    script = tmp_path / "n_process.py"
    script.write_text(N_PROCESS, encoding="utf-8")
    out = subprocess.run([sys.executable, str(script), method, str(allennlp_dir)], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok 42"


def test_saved_pipeline_carries_its_model(allennlp_dir, bilm, tmp_path):
    model = tmp_path / "model-here"
    bilm.save_pretrained(model)
    nlp = _nlp(model, layers=[1, 2], scalar_mix_parameters=[0.5, -0.5], set_vectors=True)
    want = nlp(TEXTS[1])._.elmo
    nlp.to_disk(tmp_path / "pipeline")
    assert (tmp_path / "pipeline" / "elmo" / "model" / "config.json").is_file()
    for f in model.iterdir():          # the pipeline goes to a machine without the model directory
        f.unlink()
    model.rmdir()
    loaded = spacy.load(tmp_path / "pipeline")
    doc = loaded(TEXTS[1])
    np.testing.assert_allclose(doc._.elmo, want, atol=1e-6, rtol=1e-6)
    assert loaded.get_pipe("elmo").layers == [1, 2] and doc[1].has_vector


def test_missing_local_model_is_one_line_at_first_use(tmp_path):
    import torchelmo.integrations.spacy  # noqa: F401
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": str(tmp_path / "gone"), "device": "cpu"})
    with pytest.raises(ElmoError, match=r"gone.*nor was this pipeline loaded from a directory that holds"):
        nlp("a b")
    with pytest.raises(ElmoError, match="no model here"):
        nlp.get_pipe("elmo").from_disk(tmp_path)


@pytest.mark.parametrize("config, message", [
    ({"layers": [3]}, "layers must be indices in 0..2"),
    ({"layers": []}, "layers must be indices"),
    ({"scalar_mix_parameters": [1.0]}, "1 scalar_mix_parameters for 3 layers"),
    ({"batch_size": 0}, "batch_size must be a positive integer"),
    ({"device": "foo"}, "device: unknown device 'foo'"),
])
def test_bad_config_is_one_clear_error(allennlp_dir, config, message):
    with pytest.raises(ElmoError, match=message):
        _nlp(allennlp_dir, **config)


def test_factory_found_through_the_entry_point_and_core_stays_light(allennlp_dir):
    # A fresh interpreter: no import of torchelmo's spaCy module, spaCy finds "elmo" by itself;
    # and importing the library and its command line never imports spaCy.
    code = (
        "import sys, torchelmo, torchelmo.cli, torchelmo.integrations.allennlp\n"
        "assert 'spacy' not in sys.modules\n"
        "import spacy\n"
        "nlp = spacy.blank('en')\n"
        f"nlp.add_pipe('elmo', config={{'model': {str(allennlp_dir)!r}, 'device': 'cpu'}})\n"
        "print(nlp('a b c')._.elmo.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(3, 32)"


@pytest.mark.parametrize("naming", ["relative", "nested", "published pair", "registry name"])
def test_saved_pipeline_loads_from_any_directory_however_its_model_was_named(
        allennlp_dir, bilm, tmp_path, monkeypatch, naming):
    # Made in one working directory with the model named as a user would; loaded from another
    # directory where that name means nothing (the folder not there; the registry name not in
    # an empty offline cache): the same vectors, from the copy the pipeline carries.
    import shutil

    from torchelmo.io.download import seed_cache
    from torchelmo.model.registry import ALIASES, REGISTRY
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("ELMO_OFFLINE", "1")
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "cache"))
    if naming == "relative":
        name = "my-model"
        bilm.save_pretrained(work / name)
    elif naming == "nested":
        name = "models/mine"
        bilm.save_pretrained(work / name)
    elif naming == "published pair":
        name = "published"
        shutil.copytree(allennlp_dir, work / name)
    else:
        name = "small"
        small = REGISTRY[ALIASES["small"]]
        seed_cache(small["options"], allennlp_dir / "options.json", kind="json")
        seed_cache(small["weights"], allennlp_dir / "lm_weights.hdf5", kind="hdf5")
    nlp = _nlp(name, layers=[1, 2])
    want = nlp(TEXTS[0])._.elmo
    nlp.to_disk(work / "pipe")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "empty-cache"))
    loaded = spacy.load(tmp_path / "work" / "pipe")
    np.testing.assert_allclose(loaded(TEXTS[0])._.elmo, want, atol=1e-6, rtol=1e-6)


def test_an_existing_model_folder_that_does_not_load_is_an_error_at_once(tmp_path):
    import torchelmo.integrations.spacy  # noqa: F401
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json", encoding="utf-8")
    nlp = spacy.blank("en")
    with pytest.raises(ElmoError, match="broken"):
        nlp.add_pipe("elmo", config={"model": str(tmp_path / "broken"), "device": "cpu"})


def test_to_disk_replaces_a_link_in_the_pipeline_instead_of_writing_through_it(allennlp_dir, tmp_path):
    nlp = _nlp(allennlp_dir)
    want = nlp(TEXTS[0])._.elmo
    pipe = tmp_path / "pipe"
    nlp.to_disk(pipe)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in ("config.json", "model.safetensors", "README.md"):
        (elsewhere / name).write_text("theirs")
    import shutil
    shutil.rmtree(pipe / "elmo" / "model")
    (pipe / "elmo" / "model").symlink_to(elsewhere, target_is_directory=True)
    nlp.to_disk(pipe)
    assert all((elsewhere / n).read_text() == "theirs" for n in ("config.json", "model.safetensors", "README.md"))
    assert not (pipe / "elmo" / "model").is_symlink() and (pipe / "elmo" / "model" / "model.safetensors").is_file()
    np.testing.assert_allclose(spacy.load(pipe)(TEXTS[0])._.elmo, want, atol=1e-6, rtol=1e-6)
