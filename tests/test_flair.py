"""flair's ELMoEmbeddings, unmodified, on the drop-in registered as ``allennlp``
(torchelmo.integrations.allennlp.register_as_allennlp), against torchelmo's own numbers."""

import io
import subprocess
import sys

import numpy as np
import pytest
import torch

from torchelmo import ElmoError
from torchelmo.integrations.allennlp import ElmoEmbedder, register_as_allennlp
from torchelmo.integrations.allennlp.alias import is_registered
from torchelmo.io.download import cached_path, seed_cache
from torchelmo.model.registry import ALIASES, REGISTRY

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
