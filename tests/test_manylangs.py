"""ELMoForManyLangs model directories on torchelmo: ``torchelmo.integrations.manylangs.Embedder`` gives what
``elmoformanylangs.Embedder`` gives. The models are small random ones that ELMoForManyLangs' own
classes build, saved as its training code saves them (no download)."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from torchelmo import ElmoConfig, ElmoError
from torchelmo.integrations.manylangs import Embedder, ManyLangsBiLM
from torchelmo.model.manylangs.files import BUNDLED_CONFIGS

elmoformanylangs = pytest.importorskip("elmoformanylangs", reason="ELMoForManyLangs (pip install elmoformanylangs) "
                                                                  "gives the reference outputs")
from elmoformanylangs.elmo import create_one_batch, read_list
from elmoformanylangs.frontend import Model
from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

pytestmark = pytest.mark.usefixtures("one_thread")
logging.getLogger("elmoformanylangs").setLevel(logging.WARNING)   # it logs every batch at INFO

MAX_CHARS = 12
P = 16
# Different lengths, more sentences than a batch of 3; "dog", "Z", "é" are unknown, "x\u3000y"
# has the character their .dic reader special-cases, the 16-character token is cut to
# "abcdefghij" (a known word: the cut token is what the word lexicon sees), and "<eos>" inside a
# sentence is their special token.
SENTS = [["the", "cat", "sat", "."], ["abcdefghijklmnop", "dog"], ["x\u3000y", "Zé"], ["the"],
         ["a", "b", "c", "d", "e", "f", "g"], ["sat", "<eos>", "cat"], ["the", "cat"], ["b", "a"]]
CHARS = list("abcdefghijklmnopqrstuvwxyz.\u3000")
WORDS = ["the", "cat", "sat", ".", "abcdefghij", "a", "b"]


def write_model(d: Path, word_dim: int, activation: str = "relu", legacy: bool = False, seed: int = 0) -> Path:
    """A random model built by ELMoForManyLangs' Model and saved as its biLM.py saves one."""
    d.mkdir(parents=True)
    config = {"encoder": {"name": "elmo", "projection_dim": P, "cell_clip": 1.0, "proj_clip": 0.5, "dim": 32,
                          "n_layers": 2},
              "token_embedder": {"name": "cnn", "activation": activation, "filters": [[1, 4], [2, 8], [3, 8]],
                                 "n_highway": 2, "word_dim": word_dim, "char_dim": 6,
                                 "max_characters_per_token": MAX_CHARS},
              "classifier": {"name": "sampled_softmax", "n_samples": 8}, "dropout": 0.1}
    (d / "cnn_small.json").write_text(json.dumps(config), encoding="utf-8")
    # Its lexicons in its order: characters then specials, special words then words.
    chars = {ch: i for i, ch in enumerate(CHARS + ["<bos>", "<eos>", "<oov>", "<pad>", "<bow>", "<eow>"])}
    words = {w: i for i, w in enumerate(["<oov>", "<bos>", "<eos>", "<pad>"] + WORDS)}
    for name, lexicon in (("char.dic", chars), ("word.dic", words)):
        with open(d / name, "w", encoding="utf-8") as f:
            for token, i in lexicon.items():
                print(f"{token}\t{i}", file=f)
    with open(d / "config.json", "w", encoding="utf-8") as f:
        json.dump({"config_path": "cnn_small.json", "model": str(d), "batch_size": 32, "seed": 1}, f)
    torch.manual_seed(seed)
    word_layer = EmbeddingLayer(word_dim, words, fix_emb=False) if word_dim else None
    model = Model(config, word_layer, EmbeddingLayer(6, chars, fix_emb=False), False)
    with torch.no_grad():   # off its initialisation (zero LSTM biases but the forget gate's)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    kw = {"_use_new_zipfile_serialization": False} if legacy else {}   # the published models' format
    torch.save(model.token_embedder.state_dict(), d / "token_embedder.pkl", **kw)
    torch.save(model.encoder.state_dict(), d / "encoder.pkl", **kw)
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("manylangs")
    return {"words": write_model(root / "words", 8), "chars": write_model(root / "chars", 0, "tanh", legacy=True)}


@pytest.fixture(autouse=True)
def keep_random_state():
    state = random.getstate()
    yield
    random.setstate(state)


def theirs(model_dir: Path, batch_size: int = 3):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "is_available", lambda: False)   # its Embedder takes a GPU when it sees one
        return elmoformanylangs.Embedder(str(model_dir), batch_size=batch_size)


def assert_same(want: list[np.ndarray], got: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for w, g in zip(want, got):
        assert g.dtype == np.float32 and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["words", "chars"])
def test_sents2elmo_gives_their_numbers(models, kind):
    ref, ours = theirs(models[kind]), Embedder(models[kind], batch_size=3)
    results = []
    # Both carry the LSTM state from batch to batch and call to call, so every call is made on
    # both, in the same order, with the batch order drawn from the same seed.
    for seed, layer in [(1, -2), (2, -2), (3, -1), (4, 0), (5, 1), (6, 2), (7, -2)]:
        random.seed(seed)
        want = ref.sents2elmo(SENTS, output_layer=layer)
        random.seed(seed)
        got = ours.sents2elmo(SENTS, output_layer=layer)
        assert_same(want, got)
        results.append(got)
    first, second = results[0], results[1]
    assert [a.shape for a in first] == [(3, len(s), 2 * P) for s in SENTS]
    assert [a.shape for a in results[2]] == [(len(s), 2 * P) for s in SENTS]
    # The second call starts from the first call's state: other numbers (the state is exercised).
    assert max(float(np.abs(a - b).max()) for a, b in zip(first, second)) > 1e-2
    # Layer 0 is the token embedding, duplicated, and carries no state.
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a[0, :, :P], a[0, :, P:])
        np.testing.assert_allclose(a[0], b[0], atol=1e-6)


def test_batch_order_comes_from_the_generator(models):
    """``rng`` draws the batch order as their global ``random`` does; another order, through the
    carried state, gives other numbers."""
    ref = theirs(models["words"])
    random.seed(5)
    ref.sents2elmo(SENTS, -2)
    random.seed(5)
    want = ref.sents2elmo(SENTS, -2)
    seeded = Embedder(models["words"], batch_size=3, rng=random.Random(5))
    seeded.sents2elmo(SENTS, -2)
    seeded.rng = random.Random(5)
    assert_same(want, seeded.sents2elmo(SENTS, -2))
    other = Embedder(models["words"], batch_size=3, rng=random.Random(6))
    other.sents2elmo(SENTS, -2)
    got = other.sents2elmo(SENTS, -2)
    assert max(float(np.abs(a - b).max()) for a, b in zip(want, got)) > 1e-3


def test_token_ids_are_theirs(models):
    """Lexicons as their loader reads them, and the ids of their read_list + create_one_batch
    (the cut token, <eow> first and <bow> last, <oov>, <pad>, <bos>/<eos>)."""
    ref = theirs(models["words"])
    vocab = ManyLangsBiLM.from_dir(models["words"]).vocab
    assert vocab.chars == ref.char_lexicon and vocab.words == ref.word_lexicon
    assert "\u3000" in vocab.chars
    data, _ = read_list(SENTS, MAX_CHARS)
    data.sort(key=len, reverse=True)          # their create_batches sorts before create_one_batch
    want_w, want_c, want_lens, _ = create_one_batch(data, ref.word_lexicon, ref.char_lexicon, ref.config)
    words, chars, lengths = vocab.batch([vocab.sentence(s) for s in sorted(SENTS, key=len, reverse=True)])
    assert torch.equal(words, want_w) and torch.equal(chars, want_c) and lengths.tolist() == want_lens
    assert chars[0, 0, 0] == vocab.chars["<eow>"] and chars[0, 0, 2] == vocab.chars["<bow>"]


def test_empty_sentence_and_stateless(models):
    ref, ours = theirs(models["chars"]), Embedder(models["chars"], batch_size=3)
    sents = [[], ["the", "cat"]]
    random.seed(0)
    want = ref.sents2elmo(sents, -2)
    random.seed(0)
    assert_same(want, ours.sents2elmo(sents, -2))
    assert ours.sents2elmo(sents)[0].shape == (0, 2 * P)   # theirs: a ZeroDivisionError in np.average
    stateless = Embedder(models["chars"], batch_size=3, stateful=False)
    a, b = stateless.sents2elmo(SENTS, -2), stateless.sents2elmo(SENTS, -2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# -- refusals -----------------------------------------------------------------------------------------
def _copy(models, tmp_path, kind="words") -> Path:
    return Path(shutil.copytree(models[kind], tmp_path / kind))


def _refused(path: Path, *words: str) -> str:
    with pytest.raises(ElmoError) as e:
        Embedder(path)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


@pytest.mark.parametrize("name", ["config.json", "cnn_small.json", "char.dic", "word.dic", "encoder.pkl",
                                  "token_embedder.pkl"])
def test_missing_file(models, tmp_path, name):
    d = _copy(models, tmp_path)
    (d / name).unlink()
    _refused(d, name)


def test_word_dic_unused_without_word_embeddings(models, tmp_path):
    d = _copy(models, tmp_path, "chars")
    (d / "word.dic").unlink()                  # their Embedder does not read it either
    assert Embedder(d).sents2elmo([["the"]])[0].shape == (1, 2 * P)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_pkl(models, tmp_path, damage):
    d = _copy(models, tmp_path)
    f = d / "encoder.pkl"
    data = f.read_bytes()
    f.write_bytes({"garbage": b"not a torch file\n" * 4, "truncated": data[:len(data) // 2], "empty": b""}[damage])
    _refused(d, "encoder.pkl", "not a readable PyTorch file")


class _RunsCode:
    """Unpickling calls open(marker, "w"): a file appears if the pickle is run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("legacy", [False, True])
def test_pickled_code_is_not_run(models, tmp_path, legacy):
    d = _copy(models, tmp_path)
    marker = tmp_path / "ran"
    state = torch.load(d / "token_embedder.pkl", weights_only=True)
    state["projection.bias"] = _RunsCode(marker)
    torch.save(state, d / "token_embedder.pkl", _use_new_zipfile_serialization=not legacy)
    _refused(d, "token_embedder.pkl", "refused", "open")
    assert not marker.exists()
    # The payload is real: loaded unrestricted, it runs.
    torch.load(d / "token_embedder.pkl", weights_only=False)["projection.bias"].close()
    assert marker.exists()


@pytest.mark.parametrize("change, words", [
    (("token_embedder", "activation", "sigmoid"), ["token_embedder.activation", "sigmoid"]),
    (("encoder", "name", "lstm"), ["encoder.name", "'lstm'"]),
    (("token_embedder", "name", "lstm"), ["token_embedder.name"]),
    (("token_embedder", "char_dim", 0), ["token_embedder.char_dim"]),
    (("encoder", "n_layers", 2.5), ["encoder.n_layers", "integer"]),
    (("token_embedder", "filters", [[13, 4]]), ["token_embedder.filters"]),
    (("encoder", "projection_dim", 8), ["token_embedder.pkl", "projection.weight", "shape"]),
])
def test_bad_model_config(models, tmp_path, change, words):
    d = _copy(models, tmp_path)
    config = json.loads((d / "cnn_small.json").read_text())
    section, key, value = change
    config[section][key] = value
    (d / "cnn_small.json").write_text(json.dumps(config))
    _refused(d, *words)


def test_bad_files(models, tmp_path):
    d = _copy(models, tmp_path)
    (d / "config.json").write_text(json.dumps({"config_path": "elsewhere/nothing.json"}))
    _refused(d, "config.json", "nothing.json")
    d = _copy(models, tmp_path / "2")
    with open(d / "char.dic", "a", encoding="utf-8") as f:
        f.write("0\t33\n")                     # one character more than the embedding has rows
    _refused(d, "token_embedder.pkl", "char_emb_layer.embedding.weight", "(34, 6)")
    d = _copy(models, tmp_path / "3")
    with open(d / "word.dic", "a", encoding="utf-8") as f:
        f.write("x\ty\t3\n")
    _refused(d, "word.dic", "line 12")
    d = _copy(models, tmp_path / "4")
    state = torch.load(d / "encoder.pkl", weights_only=True)
    state["forward_layer_2.state_projection.weight"] = torch.zeros(P, 32)
    torch.save(state, d / "encoder.pkl")
    _refused(d, "encoder.pkl", "unexpected parameter", "forward_layer_2")
    _refused(tmp_path / "absent", "not a directory")


def test_bad_calls(models):
    e = Embedder(models["words"])
    for layer in (3, -3, 1.0):
        with pytest.raises(ElmoError, match="output_layer"):
            e.sents2elmo([["the"]], output_layer=layer)
    for bad in (["the cat"], "the cat", [["the", 1]]):
        with pytest.raises(ElmoError, match="str"):
            e.sents2elmo(bad)
    assert e.sents2elmo([]) == []
    with pytest.raises(ElmoError, match="ELMoForManyLangs"):
        e.model.export_published("out")


def test_bundled_configs_are_the_packages():
    """The configs the published models name without shipping them are the package's own."""
    configs = Path(elmoformanylangs.__file__).parent / "configs"
    for name, config in BUNDLED_CONFIGS.items():
        assert json.loads((configs / name).read_text()) == config


def test_published_configs_unaffected():
    """torchelmo's own models still take the published character ids and token width only."""
    with pytest.raises(ElmoError, match="n_characters"):
        ElmoConfig(n_characters=40)
    with pytest.raises(ElmoError, match="max_characters_per_token"):
        ElmoConfig(max_characters_per_token=12)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(models, tmp_path, bad):
    # As native models: NaN or inf in a tensor is refused by name, not turned into NaN vectors.
    d = _copy(models, tmp_path)
    state = torch.load(d / "encoder.pkl", weights_only=True)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name].view(-1)[3] = bad
    torch.save(state, d / "encoder.pkl")
    _refused(d, "encoder.pkl", name, "non-finite")


def test_a_config_path_no_file_can_have_is_one_line(models, tmp_path):
    d = _copy(models, tmp_path)
    (d / "config.json").write_text(json.dumps({"config_path": "x" * 300 + ".json"}))
    _refused(d, "config_path", "255")


@pytest.mark.parametrize("how", ["torch.save", "torch.save legacy", "pickle protocol 2", "pickle protocol 4"])
def test_pickle_payloads_are_named_as_refused(models, tmp_path, how):
    # However the payload was pickled, the message says refused (nothing run), not "damaged".
    import pickle
    d = _copy(models, tmp_path)
    marker = tmp_path / "ran"
    state = torch.load(d / "encoder.pkl", weights_only=True)
    state["x"] = _RunsCode(marker)
    if how.startswith("torch.save"):
        torch.save(state, d / "encoder.pkl", _use_new_zipfile_serialization=how == "torch.save")
    else:
        with open(d / "encoder.pkl", "wb") as f:
            pickle.dump(state, f, protocol=int(how[-1]))
    msg = _refused(d, "encoder.pkl", "refused", "nothing in it was run")
    assert "damaged" not in msg and not marker.exists()


# -- the same folder wherever a model is named ---------------------------------------------------
def first_call(model_dir: Path, sents=SENTS) -> list[np.ndarray]:
    """Their Embedder's first call with every sentence in one batch: the zero state, as a
    stateless model runs each batch: ``(L, n, 2P)`` per sentence."""
    return theirs(model_dir, batch_size=len(sents)).sents2elmo(sents, output_layer=-2)


@pytest.mark.parametrize("kind", ["words", "chars"])
def test_from_pretrained_and_elmo_take_the_folder(models, kind):
    from torchelmo import BiLM, Elmo
    from torchelmo.embed.engine import embed_sentences
    want = first_call(models[kind])
    bilm = BiLM.from_pretrained(models[kind])
    assert isinstance(bilm, ManyLangsBiLM) and not bilm.stateful   # stateless, as every from_pretrained
    with torch.no_grad():
        out = bilm.embed_sentences(SENTS)
    assert out.mask.tolist() == [[j < len(s) for j in range(7)] for s in SENTS]
    got = [torch.stack(out.layers)[:, i, :len(s)].numpy() for i, s in enumerate(SENTS)]
    assert_same(want, got)
    # The embedding engine's batching (sorted, split) gives the same: no state between batches.
    assert_same(want, embed_sentences(bilm, SENTS, "all", batch_size=3))
    # Elmo: token lists in; a fresh mix is the mean of the layers.
    elmo = Elmo.from_pretrained(models[kind], num_output_representations=1, dropout=0.0)
    with torch.no_grad():
        res = elmo(SENTS)
    for i, s in enumerate(SENTS):
        np.testing.assert_allclose(res["elmo_representations"][0][i, :len(s)].numpy(), want[i].mean(0),
                                   rtol=0, atol=1e-5)
        assert not res["elmo_representations"][0][i, len(s):].any()
    with pytest.raises(ElmoError, match="give lists of tokens"):
        elmo(torch.zeros(1, 2, 50, dtype=torch.long))


def test_elmo_commands_take_the_folder(models, tmp_path, capsys):
    import h5py

    from torchelmo.cli import main
    sents = [s for s in SENTS if "\u3000" not in "".join(s)]   # a line splits at U+3000 too
    want = first_call(models["words"], sents)
    text = tmp_path / "in.txt"
    text.write_text("".join(" ".join(s) + "\n" for s in sents), encoding="utf-8")
    assert main(["embed", str(text), str(tmp_path / "out.h5"), "--all", "--model", str(models["words"]), "-q"]) == 0
    with h5py.File(tmp_path / "out.h5") as f:
        assert_same(want, [f[str(i)][()] for i in range(len(sents))])
    capsys.readouterr()
    assert main(["info", str(models["words"])]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["layout"] == "ELMoForManyLangs" and info["output_dim"] == 2 * P


@pytest.mark.parametrize("kind", ["words", "chars"])
@pytest.mark.parametrize("suffix", [".onnx", ".pt"])
def test_export_takes_the_folder(models, kind, suffix, tmp_path, capsys):
    # The exported graph takes this model's ids (its lexicons; <bos>/<eos> included) and gives
    # what the stateless model gives, padding and sentence boundaries included.
    pytest.importorskip("onnxruntime") if suffix == ".onnx" else None
    from torchelmo.cli import main
    from torchelmo.integrations.onnx import inputs_for, run_exported
    out = tmp_path / f"m{suffix}"
    assert main(["export", str(models[kind]), str(out)]) == 0
    assert "matches the eager model" in capsys.readouterr().out
    bilm = ManyLangsBiLM.from_dir(models[kind], stateful=False)
    inputs = inputs_for(bilm, SENTS)
    assert list(inputs) == ["word_ids", "char_ids", "lengths"]
    layers, mask = run_exported(out, inputs)
    with torch.no_grad():
        want = bilm(inputs["word_ids"] if kind == "words" else None, inputs["char_ids"], inputs["lengths"])
    assert torch.equal(mask, want.mask)
    assert (layers - torch.stack(want.layers)).abs().max() < 1e-5
    # Each sentence's own vectors sit between <bos> and <eos>: the ones their Embedder gives.
    assert_same(first_call(models[kind]), [layers[:, i, 1:len(s) + 1].numpy() for i, s in enumerate(SENTS)])


@pytest.mark.parametrize("kind", ["words", "chars"])
def test_save_pretrained_writes_a_folder_their_embedder_reads(models, kind, tmp_path):
    want = first_call(models[kind])
    ManyLangsBiLM.from_dir(models[kind]).save_pretrained(tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == sorted(
        ["config.json", "cnn_small.json", "char.dic", "token_embedder.pkl", "encoder.pkl"]
        + (["word.dic"] if kind == "words" else []))
    assert_same(want, first_call(tmp_path / "copy"))
    # Not a copy of the files: written from the model (their lexicons are read back the same).
    for name in ("char.dic", "word.dic") if kind == "words" else ("char.dic",):
        from torchelmo.model.manylangs import read_lexicon
        assert read_lexicon(tmp_path / "copy" / name) == read_lexicon(models[kind] / name)


def test_a_spacy_pipeline_carries_the_folder(models, tmp_path, monkeypatch):
    spacy = pytest.importorskip("spacy", reason="the spacy extra (CI installs it through the test extra)")
    import torchelmo.integrations.spacy  # noqa: F401  (registers the factory)
    model = tmp_path / "work" / "zz.model"
    shutil.copytree(models["words"], model)
    monkeypatch.chdir(tmp_path / "work")
    nlp = spacy.blank("en")
    nlp.add_pipe("elmo", config={"model": "zz.model", "device": "cpu"})
    doc = nlp("the cat sat .")
    np.testing.assert_allclose(doc._.elmo, first_call(model, [["the", "cat", "sat", "."]])[0].mean(0),
                               rtol=0, atol=1e-5)
    nlp.to_disk(tmp_path / "pipe")
    shutil.rmtree(model)                     # the pipeline holds its own copy
    monkeypatch.chdir(tmp_path)
    loaded = spacy.load(tmp_path / "pipe")
    np.testing.assert_allclose(loaded("the cat sat .")._.elmo, doc._.elmo, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["words", "chars"])
def test_flair_embeddings_take_the_folder_and_save_with_the_model(models, kind, tmp_path):
    # flair's SequenceTagger with the folder as its embeddings: the model's own vectors, and the
    # saved tagger loads (its lexicons and config in the file, the weights in its state dict)
    # with the folder gone, giving the same vectors.
    pytest.importorskip("flair")
    from flair.data import Dictionary, Sentence
    from flair.models import SequenceTagger

    from torchelmo.integrations.flair import ELMoEmbeddings
    folder = shutil.copytree(models[kind], tmp_path / "model")
    embeddings = ELMoEmbeddings(str(folder), embedding_mode="all")
    tags = Dictionary(add_unk=True)
    for t in ("N", "V"):
        tags.add_item(t)
    tagger = SequenceTagger(hidden_size=4, embeddings=embeddings, tag_dictionary=tags, tag_type="pos",
                            use_crf=False, use_rnn=False, reproject_embeddings=False)

    def vectors(emb, words):
        s = Sentence(list(words))
        emb.embed(s)
        return torch.stack([t.get_embedding().cpu() for t in s])

    with torch.no_grad():
        layers = ManyLangsBiLM.from_dir(folder, stateful=False).embed_sentences([SENTS[0]]).layers
    want = torch.cat(layers, dim=-1)[0]
    torch.testing.assert_close(vectors(embeddings, SENTS[0]), want, atol=0, rtol=0)
    tagger.save(tmp_path / "tagger.pt")
    shutil.rmtree(folder)
    loaded = SequenceTagger.load(tmp_path / "tagger.pt")
    assert isinstance(loaded.embeddings.bilm, ManyLangsBiLM)
    torch.testing.assert_close(vectors(loaded.embeddings, SENTS[0]), want, atol=0, rtol=0)
