"""flair's ELMoEmbeddings, unmodified, on the drop-in registered as ``allennlp``
(torchelmo.integrations.allennlp.register_as_allennlp), against torchelmo's own numbers."""

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_path
from torchelmo import ElmoError
from torchelmo.integrations.allennlp import ElmoEmbedder, register_as_allennlp
from torchelmo.integrations.allennlp.alias import is_registered
from torchelmo.io.download import cached_path, seed_cache
from torchelmo.model.registry import ALIASES, REGISTRY
from torchelmo.probe.conll import read_conllu

pytest.importorskip("flair", reason="flair (CI installs it through the test extra)")

WORDS = ["The", "grass", "is", "green", "."]


@pytest.fixture(scope="module")
def alias():
    assert register_as_allennlp() and register_as_allennlp() and is_registered()
    yield
    for name in [n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")]:
        del sys.modules[name]


@pytest.fixture
def files(allennlp_dir):
    return {"options_file": str(allennlp_dir / "options.json"),
            "weight_file": str(allennlp_dir / "lm_weights.hdf5")}


def _flair_vectors(embedding, words=WORDS) -> torch.Tensor:
    from flair.data import Sentence
    sentence = Sentence(list(words))
    embedding.embed(sentence)
    return torch.stack([t.get_embedding().cpu() for t in sentence])


def _reference(files) -> np.ndarray:
    """What flair should see: AllenNLP's ElmoEmbedder carries the state from flair's dummy sentence."""
    ee = ElmoEmbedder(**files)
    ee.embed_sentence(["hello"])
    return ee.embed_sentence(WORDS)                    # (3, n, 2P)


def test_the_alias_holds_allennlps_names(alias):
    import allennlp.commands.elmo
    import allennlp.data.token_indexers.elmo_indexer
    import allennlp.modules.elmo
    import allennlp.modules.scalar_mix
    from allennlp.modules.token_embedders import ElmoTokenEmbedder

    from torchelmo.integrations import allennlp as drop_in
    assert allennlp.commands.elmo.ElmoEmbedder is drop_in.ElmoEmbedder
    assert allennlp.commands.elmo.DEFAULT_OPTIONS_FILE == REGISTRY[ALIASES["original"]]["options"]
    assert allennlp.commands.elmo.DEFAULT_WEIGHT_FILE.endswith("elmo_2x4096_512_2048cnn_2xhighway_weights.hdf5")
    assert allennlp.modules.elmo._ElmoBiLm is drop_in._ElmoBiLm and allennlp.modules.elmo.Elmo is drop_in.Elmo
    assert allennlp.modules.scalar_mix.ScalarMix is drop_in.ScalarMix
    assert ElmoTokenEmbedder is drop_in.ElmoTokenEmbedder
    assert allennlp.data.token_indexers.elmo_indexer.ELMoTokenCharactersIndexer is drop_in.ELMoTokenCharactersIndexer


def test_not_registered_on_import_and_never_over_the_real_allennlp(tmp_path):
    (tmp_path / "allennlp").mkdir()
    (tmp_path / "allennlp" / "__init__.py").write_text("REAL = True\n")
    code = ("import sys, torchelmo, torchelmo.integrations.allennlp, torchelmo.cli\n"
            "assert 'allennlp' not in sys.modules\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "assert torchelmo.integrations.allennlp.register_as_allennlp() is False\n"
            "import allennlp\n"
            "assert allennlp.REAL and not hasattr(allennlp, 'commands')\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("mode", ["all", "top", "average"])
def test_flair_embeddings_in_every_mode(alias, files, mode):
    from flair.embeddings import ELMoEmbeddings
    embedding = ELMoEmbeddings(embedding_mode=mode, **files)
    got = _flair_vectors(embedding)
    layers = torch.from_numpy(_reference(files))       # (3, n, 32)
    want = {"all": torch.cat(list(layers), -1), "top": layers[-1], "average": layers.mean(0)}[mode]
    assert embedding.embedding_length == want.shape[-1] == (96 if mode == "all" else 32)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_flair_model_pickles_and_keeps_its_state(alias, files):
    from flair.data import Dictionary
    from flair.embeddings import ELMoEmbeddings
    from flair.models import SequenceTagger
    embedding = ELMoEmbeddings(**files)
    tags = Dictionary(add_unk=False)
    for t in ("DET", "NOUN", "VERB"):
        tags.add_item(t)
    tagger = SequenceTagger(hidden_size=8, embeddings=embedding, tag_dictionary=tags, tag_type="pos",
                            use_crf=False)
    buf = io.BytesIO()
    torch.save(tagger, buf)                            # flair pickles its models whole
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)       # __setstate__ moves the carried state
    # Both carry the same state from here: the same sentence gives the same vectors.
    torch.testing.assert_close(_flair_vectors(loaded.embeddings), _flair_vectors(tagger.embeddings),
                               atol=1e-6, rtol=1e-6)
    states = loaded.embeddings.ee.elmo_bilm._elmo_lstm._states
    assert states[0].shape == (2, 1, 32) and states[1].shape[:2] == (2, 1)


def test_flair_named_model_from_a_seeded_cache(alias, allennlp_dir, tmp_path, monkeypatch):
    # flair names its models by the published URLs; without network they come from the cache.
    from flair.embeddings import ELMoEmbeddings
    monkeypatch.setenv("ELMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ELMO_OFFLINE", "1")
    small = REGISTRY[ALIASES["small"]]
    with pytest.raises(ElmoError, match="not in the cache"):
        ELMoEmbeddings("small")
    seed_cache(small["options"], allennlp_dir / "options.json", kind="json")
    seed_cache(small["weights"], allennlp_dir / "lm_weights.hdf5", kind="hdf5")
    embedding = ELMoEmbeddings("small", embedding_mode="top")
    files = {"options_file": str(allennlp_dir / "options.json"),
             "weight_file": str(allennlp_dir / "lm_weights.hdf5")}
    torch.testing.assert_close(_flair_vectors(embedding), torch.from_numpy(_reference(files)[-1]),
                               atol=1e-5, rtol=1e-5)


def test_seed_cache_checks_what_it_caches(allennlp_dir, tmp_path):
    url = "https://example.invalid/m/elmo_weights.hdf5"
    with pytest.raises(ElmoError, match="not an HDF5 file|cannot read|HDF5"):
        seed_cache(url, allennlp_dir / "options.json", cache=tmp_path, kind="hdf5")
    with pytest.raises(ElmoError, match="checksum mismatch"):
        seed_cache(url, allennlp_dir / "lm_weights.hdf5", sha256="0" * 64, cache=tmp_path)
    assert not list(tmp_path.iterdir())
    entry = seed_cache(url, allennlp_dir / "lm_weights.hdf5", cache=tmp_path)
    assert cached_path(url, cache=tmp_path, offline=True) == entry
    assert entry.read_bytes() == (allennlp_dir / "lm_weights.hdf5").read_bytes()


# -- torchelmo.integrations.flair: embeddings that flair's own trainer can save -----------------

def _ud_column_files(root, counts=(60, 20, 20)):
    """The first sentences of UD English EWT's train, dev and test as flair column files (word, UPOS)."""
    root.mkdir()
    for split, n in zip(("train", "dev", "test"), counts):
        sents = read_conllu(shared_path("data", "pos", "ud-english-ewt", f"en_ewt-ud-{split}.conllu"), limit=n)
        (root / f"{split}.txt").write_text(
            "".join("".join(f"{w} {t}\n" for w, t in zip(s.tokens, s.tags)) + "\n" for s in sents), encoding="utf-8")
    return root


@pytest.mark.parametrize("mode", ["all", "top", "average"])
def test_savable_embeddings_equal_flairs_own(alias, files, mode):
    # stateful=True carries the state as AllenNLP's ElmoEmbedder did under flair's class (from the
    # dummy sentence it embeds first): the same vectors; stateless (the default) are the biLM's own.
    from flair.embeddings import ELMoEmbeddings as FlairELMo

    from torchelmo.integrations.flair import ELMoEmbeddings
    ours = ELMoEmbeddings(embedding_mode=mode, stateful=True, **files)
    theirs = FlairELMo(embedding_mode=mode, **files)
    assert ours.embedding_length == theirs.embedding_length
    torch.testing.assert_close(_flair_vectors(ours), _flair_vectors(theirs), atol=1e-5, rtol=1e-5)
    plain = ELMoEmbeddings(embedding_mode=mode, **files)
    layers = plain.bilm.embed_sentences([WORDS]).layers
    want = {"all": torch.cat(layers, -1), "top": layers[-1], "average": torch.stack(layers).mean(0)}[mode][0]
    torch.testing.assert_close(_flair_vectors(plain), want, atol=0, rtol=0)


def test_bad_arguments_get_one_line(files):
    from torchelmo.integrations.flair import ELMoEmbeddings
    for kw, what in ((dict(embedding_mode="mean"), "embedding_mode must be one of all, top, average"),
                     (dict(batch_size=0), "batch_size must be a positive integer"),
                     (dict(options_file=files["options_file"]), "options_file and weight_file go together")):
        with pytest.raises(ElmoError, match=what) as e:
            ELMoEmbeddings(**kw)
        assert "\n" not in str(e.value)


def test_flair_trainer_saves_and_another_process_loads(files, tmp_path):
    # flair's own loop, unmodified: two epochs with a dev set (best-model.pt on improvement) and
    # final-model.pt; a fresh process that imports the integration loads both without the
    # original files (removed) and tags the test sentences as the trained model does.
    from flair.data import Sentence
    from flair.datasets import ColumnCorpus
    from flair.models import SequenceTagger
    from flair.trainers import ModelTrainer

    from torchelmo.integrations.flair import ELMoEmbeddings
    model_files = {k: shutil.copy(v, tmp_path) for k, v in files.items()}
    corpus = ColumnCorpus(_ud_column_files(tmp_path / "ud"), {0: "text", 1: "upos"},
                          train_file="train.txt", dev_file="dev.txt", test_file="test.txt")
    tags = corpus.make_label_dictionary("upos", add_unk=True)     # dev and test have tags train lacks
    torch.manual_seed(0)
    tagger = SequenceTagger(hidden_size=16, embeddings=ELMoEmbeddings(**model_files), tag_dictionary=tags,
                            tag_type="upos", use_crf=False, use_rnn=False, reproject_embeddings=False)
    ModelTrainer(tagger, corpus).train(tmp_path / "out", max_epochs=2, mini_batch_size=8, learning_rate=0.1)
    assert (tmp_path / "out" / "best-model.pt").exists() and (tmp_path / "out" / "final-model.pt").exists()
    for path in model_files.values():
        Path(path).unlink()                                 # the saved models must not need them
    text = [" ".join(t.text for t in s) for s in corpus.test]
    final = SequenceTagger.load(tmp_path / "out" / "final-model.pt")
    want = []
    for t in text:
        s = Sentence(t.split())
        final.predict(s)
        want.append([tok.get_label("upos").value for tok in s])
    script = (
        "import json, sys\n"
        "import torchelmo.integrations.flair\n"
        "from flair.data import Sentence\n"
        "from flair.models import SequenceTagger\n"
        "out = {}\n"
        "for name in ('best-model.pt', 'final-model.pt'):\n"
        "    tagger = SequenceTagger.load(sys.argv[1] + '/' + name)\n"
        "    tags = []\n"
        "    for t in json.loads(sys.argv[2]):\n"
        "        s = Sentence(t.split())\n"
        "        tagger.predict(s)\n"
        "        tags.append([tok.get_label('upos').value for tok in s])\n"
        "    out[name] = tags\n"
        "print(json.dumps(out))\n")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "out"), json.dumps(text)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["final-model.pt"] == want
    assert len(got["best-model.pt"]) == len(text) and all(len(a) == len(b) for a, b in zip(got["best-model.pt"], want))
    accuracy = np.mean([a == b for s, g in zip(corpus.test, want) for a, b in zip([t.get_label("upos").value for t in s], g)])
    assert accuracy > 0.3            # it learned something in two epochs (the majority tag is about 0.17)
