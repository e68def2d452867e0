"""torchelmo.integrations.allennlp: AllenNLP's Elmo and ElmoEmbedder, same numbers as AllenNLP and as the native API."""

import io
import json

import h5py
import numpy as np
import pytest
import torch

import torchelmo.integrations.allennlp as A
from torchelmo import BiLM, ElmoError, batch_to_ids, preset
from torchelmo import Elmo as NativeElmo
from torchelmo.integrations.allennlp import Elmo, ElmoEmbedder

TOP_ONLY = [-9e9, -9e9, 0.0]     # softmax -> exactly [0, 0, 1]: the mix is the top layer


@pytest.fixture(scope="module")
def fixture_files(allennlp_dir):
    return str(allennlp_dir / "options.json"), str(allennlp_dir / "lm_weights.hdf5")


@pytest.fixture(scope="module")
def batches(allennlp_dir):
    """The reference's 10 batches: batch i = [s0[i], s1[i], s2[i]], run in order."""
    s = json.loads((allennlp_dir / "sentences.json").read_text())
    return [[s[k][i].split() for k in range(3)] for i in range(10)]


def _reference(allennlp_dir, k, i):
    with h5py.File(allennlp_dir / f"lm_embeddings_{k}.hdf5", "r") as f:
        return np.concatenate(f[str(i)][...], -1)       # (2, n, P) -> (n, 2P)


def test_elmo_reproduces_allennlp_reference(fixture_files, batches, allennlp_dir):
    # AllenNLP-style call, AllenNLP's numbers: the carried state included.
    elmo = Elmo(*fixture_files, 1, dropout=0.0, scalar_mix_parameters=TOP_ONLY)
    with torch.no_grad():
        for i, batch in enumerate(batches):
            out = elmo(batch_to_ids(batch))
            for k, toks in enumerate(batch):
                assert bool(out["mask"][k, :len(toks)].all()) and not bool(out["mask"][k, len(toks):].any())
                np.testing.assert_allclose(out["elmo_representations"][0][k, :len(toks)].numpy(),
                                           _reference(allennlp_dir, k, i), atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A random tiny biLM written in the published format, and the model itself."""
    torch.manual_seed(0)
    bilm = BiLM(preset("tiny")).eval()
    opts, weights = bilm.export_published(tmp_path_factory.mktemp("published"))
    return str(opts), str(weights), bilm


SENTS = [["The", "cat", "sat", "."], ["A", "dog"], ["Birds", "fly", "south", "in", "winter", "."]]


@pytest.mark.core
@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("stateful", [False, True])
def test_same_numbers_as_native_api(exported, layer_norm, keep, stateful):
    opts, weights, _ = exported
    kw = dict(do_layer_norm=layer_norm, keep_sentence_boundaries=keep, dropout=0.0)
    ours = Elmo(opts, weights, 2, stateful=stateful, **kw)
    native = NativeElmo(BiLM.from_published(opts, weights, stateful=stateful), 2, **kw)
    torch.manual_seed(1)
    for a, b in zip(ours.scalar_mixes, native.scalar_mixes):     # the same learned mixes
        for p, x in zip(a.scalar_parameters, torch.randn(3)):      # AllenNLP's layout: (1,) each
            p.data[0] = x
        with torch.no_grad():
            b.scalar_parameters.copy_(torch.cat(list(a.scalar_parameters)))   # torchelmo's: one (L,)
    with torch.no_grad():
        for _ in range(2):                                         # a second batch: carried state
            x, y = ours(batch_to_ids(SENTS)), native(SENTS)
            assert torch.equal(x["mask"], y["mask"])
            assert x["mask"].shape == (3, 6 + 2 * keep)
            for p, q in zip(x["elmo_representations"], y["elmo_representations"]):
                assert p.shape == (3, 6 + 2 * keep, 2 * 16)
                torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-6)


@pytest.mark.core
def test_layer_norm_statistics_include_the_boundaries(exported):
    # AllenNLP mixes before removing <S> and </S>: the layer-norm mean and variance include them.
    opts, weights, bilm = exported
    elmo = Elmo(opts, weights, 1, do_layer_norm=True, dropout=0.0, stateful=False)
    with torch.no_grad():
        got = elmo(SENTS)["elmo_representations"][0]
        full = bilm(batch_to_ids(SENTS), keep_sentence_boundaries=True)
    normed = []
    for t in full.layers:
        vals = t[full.mask]
        normed.append((t - vals.mean()) / vals.std(unbiased=False))
    want = (sum(normed) / 3)[:, 1:-1]
    for b, s in enumerate(SENTS):
        torch.testing.assert_close(got[b, :len(s)], want[b, :len(s)], atol=1e-5, rtol=1e-5)
        assert bool((got[b, len(s):] == 0).all())
    # Without the boundaries the statistics differ, and so would the output.
    inner = [t[:, 1:-1] for t in full.layers]
    m = full.mask[:, 2:]
    alt = sum((t - t[m].mean()) / t[m].std(unbiased=False) for t in inner) / 3
    assert (alt[0, :4] - got[0, :4]).abs().max() > 1e-3


@pytest.mark.core
def test_vocab_to_cache_takes_word_ids(exported):
    opts, weights, _ = exported
    vocab = ["@@PADDING@@", "The", "cat", "sat", ".", "A", "dog"]
    cached = Elmo(opts, weights, 1, dropout=0.0, vocab_to_cache=vocab, stateful=False)
    plain = Elmo(opts, weights, 1, dropout=0.0, stateful=False)
    words = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    with torch.no_grad():
        by_id = cached(None, word_inputs=words)
        by_chars = plain(SENTS[:2])
        torch.testing.assert_close(by_id["elmo_representations"][0], by_chars["elmo_representations"][0])
        assert torch.equal(by_id["mask"], words > 0)
        # Extra leading dims are kept: (2, 1, T) word ids -> (2, 1, T, 2P).
        nested = cached(None, word_inputs=words.unsqueeze(1))
        assert nested["elmo_representations"][0].shape == (2, 1, 4, 32) and nested["mask"].shape == (2, 1, 4)
        # An id beyond the cache: back to the char ids when given (as AllenNLP), else an error.
        bad = torch.tensor([[1, 99]])
        ids = batch_to_ids([["The", "zebra"]])
        torch.testing.assert_close(cached(ids, word_inputs=bad)["elmo_representations"][0],
                                   plain(ids)["elmo_representations"][0])
    with pytest.raises(ElmoError, match="word id 99 is not in vocab_to_cache"):
        cached(None, word_inputs=bad)
    with pytest.raises(ElmoError, match="word_inputs need vocab_to_cache"):
        plain(None, word_inputs=words)


def test_elmo_arguments(exported, fixture_files):
    opts, weights, bilm = exported
    elmo = Elmo(None, None, 3, module=bilm)
    assert elmo.bilm is bilm and len(elmo.scalar_mixes) == 3 and elmo.get_output_dim() == 32
    assert not any(p.requires_grad for p in bilm.parameters())
    assert all(p.requires_grad for p in Elmo(opts, weights, 1, requires_grad=True).bilm.parameters())
    fixed = Elmo(opts, weights, 1, scalar_mix_parameters=[1.0, 2.0, 3.0])
    assert all(not p.requires_grad for p in fixed.scalar_mixes[0].scalar_parameters)
    with pytest.raises(ElmoError, match="not both"):
        Elmo(opts, weights, 1, module=bilm)
    with pytest.raises(ElmoError, match="are required"):
        Elmo(opts, None, 1)
    with pytest.raises(ElmoError, match="torchelmo.integrations.allennlp.Elmo"):
        NativeElmo(opts, weights, 1)


def test_embedder_reproduces_allennlp_reference(fixture_files, batches, allennlp_dir):
    embedder = ElmoEmbedder(*fixture_files)
    flat = [s for batch in batches for s in batch]
    arrays = list(embedder.embed_sentences(flat, batch_size=3))
    assert len(arrays) == 30
    for n, arr in enumerate(arrays):
        i, k = divmod(n, 3)
        assert arr.shape == (3, len(flat[n]), 32) and arr.dtype == np.float32
        np.testing.assert_allclose(arr[2], _reference(allennlp_dir, k, i), atol=1e-6, rtol=1e-5)


def test_embedder_same_numbers_as_native(exported):
    opts, weights, bilm = exported
    embedder = ElmoEmbedder(opts, weights, stateful=False)
    one = embedder.embed_sentence(SENTS[2])
    batch = embedder.embed_batch(SENTS + [[]])
    assert one.shape == (3, 6, 32) and batch[3].shape == (3, 0, 32)
    with torch.no_grad():
        for s, arr in zip(SENTS, batch):
            want = torch.stack(bilm.embed_sentences([s]).layers, 1)[0].numpy()
            np.testing.assert_allclose(arr, want, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(one, batch[2], atol=1e-6, rtol=1e-6)
    acts, mask = embedder.batch_to_embeddings(SENTS)
    assert acts.shape == (3, 3, 6, 32) and mask.sum(1).tolist() == [4, 2, 6]


def test_embedder_embed_file(exported, tmp_path):
    opts, weights, _ = exported
    lines = [" ".join(s) for s in SENTS]
    text = "".join(line + "\n" for line in lines)
    embedder = ElmoEmbedder(opts, weights)
    expected = list(ElmoEmbedder(opts, weights).embed_sentences(SENTS, batch_size=2))
    stream = io.StringIO(text)
    embedder.embed_file(stream, tmp_path / "all.hdf5", batch_size=2)
    assert stream.closed                                  # as AllenNLP's
    with h5py.File(tmp_path / "all.hdf5", "r") as f:
        assert json.loads(f["sentence_to_index"][0]) == {line: str(i) for i, line in enumerate(lines)}
        for i, want in enumerate(expected):
            np.testing.assert_allclose(f[str(i)][...], want, atol=1e-6, rtol=1e-6)
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    embedder.embed_file(str(src), tmp_path / "avg.hdf5", "average", batch_size=2,
                        use_sentence_keys=True)
    with h5py.File(tmp_path / "avg.hdf5", "r") as f:
        assert sorted(f.keys()) == sorted(lines)
        for line, want in zip(lines, expected):
            np.testing.assert_allclose(f[line][...], want.mean(0), atol=1e-6, rtol=1e-6)
    with open(src, encoding="utf-8") as fh:
        embedder.embed_file(fh, tmp_path / "top.hdf5", "top", batch_size=2, forget_sentences=True)
    with h5py.File(tmp_path / "top.hdf5", "r") as f:
        assert sorted(f.keys()) == ["0", "1", "2"]
        np.testing.assert_allclose(f["1"][...], expected[1][-1], atol=1e-6, rtol=1e-6)
    with pytest.raises(ElmoError, match="output_format"):
        embedder.embed_file(str(src), tmp_path / "x.hdf5", "mean")


def test_embedder_model_choice(monkeypatch, fixture_files):
    loaded = []
    monkeypatch.setattr(BiLM, "from_pretrained",
                        classmethod(lambda cls, name, **kw: loaded.append(name) or BiLM(preset("tiny"))))
    ElmoEmbedder()
    ElmoEmbedder(model="default")
    assert loaded == [A.DEFAULT_MODEL, "default"] and A.DEFAULT_MODEL == "original"
    with pytest.raises(ElmoError, match="go together"):
        ElmoEmbedder(fixture_files[0])
    with pytest.raises(ElmoError, match="not both"):
        ElmoEmbedder(*fixture_files, model="default")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ElmoError, match="^cuda_device cuda:0: this torch is a CPU-only build"):
        ElmoEmbedder(*fixture_files, cuda_device=0)
