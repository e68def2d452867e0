"""Exactness against the original TensorFlow biLM's outputs (../shared/fixtures)."""

import json

import h5py
import numpy as np
import pytest
import torch

from conftest import check_stateful_fixture as _check_stateful
from torchelmo import BiLM, batch_to_ids

# On CUDA the fused recurrence runs, in exact fp32: within 2e-6 of the fixtures.
DEVICES = [("cpu", 1e-6)] + ([("cuda", 2e-6)] if torch.cuda.is_available() else [])


@pytest.mark.parametrize(("device", "atol"), DEVICES)
def test_allennlp_fixture_stateful(allennlp_dir, device, atol):
    _check_stateful(allennlp_dir, "sentences.json", device, atol)


@pytest.mark.parametrize(("device", "atol"), DEVICES)
def test_bilmtf_fixture_no_skip_connections(bilmtf_dir, device, atol):
    assert json.loads((bilmtf_dir / "options.json").read_text())["lstm"]["use_skip_connections"] is False
    _check_stateful(bilmtf_dir, "lm_embeddings_sentences.json", device, atol)


def test_stateless_differs_from_fixture(allennlp_dir):
    # The fixture's later batches depend on the carried state: stateless output must not match it,
    # otherwise the stateful tests above would not be testing the carry.
    model = BiLM.from_pretrained(allennlp_dir)
    sentences = json.loads((allennlp_dir / "sentences.json").read_text())
    with h5py.File(allennlp_dir / "lm_embeddings_0.hdf5", "r") as f:
        want = f["5"][...]
    with torch.no_grad():
        top = model(batch_to_ids([sentences[0][5].split()])).layers[-1][0].numpy()
    P = model.config.projection_dim
    assert np.abs(np.stack([top[:, :P], top[:, P:]]) - want).max() > 1e-2


def test_token_embeddings(allennlp_dir, fixture_model):
    vocab = (allennlp_dir / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    with h5py.File(allennlp_dir / "elmo_token_embeddings.hdf5", "r") as f:
        want = f["embedding"][...]
    assert len(vocab) == want.shape[0]
    with torch.no_grad():
        got = fixture_model.encoder(batch_to_ids([vocab]))[0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # E0 is the token embedding duplicated.
    with torch.no_grad():
        e0 = fixture_model(batch_to_ids([vocab[:20]])).layers[0][0].numpy()
    np.testing.assert_allclose(e0, np.concatenate([want[:20], want[:20]], 1), atol=1e-6)


@pytest.mark.parametrize("fixture", ["allennlp_dir", "bilmtf_dir"])
def test_token_cache_matches_uncached(fixture, request):
    model_dir = request.getfixturevalue(fixture)
    model = BiLM.from_pretrained(model_dir)
    vocab = (model_dir / "vocab_test.txt").read_text(encoding="utf-8").split()
    sents = [vocab[i:i + 7] + ["unseen-word", "zzzqqq"] for i in range(0, 70, 7)]
    with torch.no_grad():
        plain = model.embed_sentences(sents).layers
        model.cache_token_embeddings(vocab)
        cached = model.embed_sentences(sents).layers
    for a, b in zip(plain, cached):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert model.encoder._cache is not None
