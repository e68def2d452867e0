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
    import torchelmo.spacy_component  # noqa: F401  (registers the factory; the entry point does it too)
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
    nlp = _nlp(allennlp_dir, set_vectors=True)
    doc = nlp(TEXTS[0])
    np.testing.assert_allclose(doc[1].vector, doc[1]._.elmo)
    np.testing.assert_allclose(doc.vector, doc._.elmo.mean(0), atol=1e-6)
    a, b = doc[1]._.elmo, doc[5]._.elmo
    assert doc[1].similarity(doc[5]) == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-5)


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
        "import sys, torchelmo, torchelmo.cli, torchelmo.allennlp\n"
        "assert 'spacy' not in sys.modules\n"
        "import spacy\n"
        "nlp = spacy.blank('en')\n"
        f"nlp.add_pipe('elmo', config={{'model': {str(allennlp_dir)!r}, 'device': 'cpu'}})\n"
        "print(nlp('a b c')._.elmo.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(3, 32)"
