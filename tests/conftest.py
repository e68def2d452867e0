import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ELMO_SHARED", ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures"
DATA = SHARED / "data"

torch.set_num_threads(min(2, torch.get_num_threads()))

# Without a GPU the fused kernels run under Triton's interpreter, which Triton decides when it is
# first imported: set here, before any test module (flair's imports reach Triton) is collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def shared_path(*parts: str) -> Path:
    """A path under ../shared; a missing one is a failure (CI always has it), never a skip."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.fail(f"{p} is missing: tests need ../shared beside the checkout (or ELMO_SHARED)")
    return p


@pytest.fixture(scope="session")
def allennlp_dir() -> Path:
    return shared_path("fixtures", "allennlp-elmo")


@pytest.fixture(scope="session")
def bilmtf_dir() -> Path:
    return shared_path("fixtures", "bilm-tf", "model")


@pytest.fixture(scope="session")
def fixture_model(allennlp_dir):
    from torchelmo import BiLM
    return BiLM.from_published(allennlp_dir / "options.json", allennlp_dir / "lm_weights.hdf5")


@pytest.fixture(scope="module")
def one_thread():
    """Modules of many small ops (tiny models, probes) run on one thread: a second one only adds
    wake-up latency, and on a loaded machine makes them far slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def fixture_corpus():
    """The bilm-tf training fixture: (data.txt, vocab.txt)."""
    d = shared_path("fixtures", "bilm-tf", "train")
    return d / "data.txt", d / "vocab.txt"


def base_config(tmp_path, data, vocab, **kw):
    """A TrainConfig of a few steps of the tiny model (fields in ``kw`` override)."""
    from torchelmo.train import TrainConfig
    cfg = dict(train=[str(data)], vocab=str(vocab), out_dir=str(tmp_path / "run"), model="tiny",
               batch_size=4, unroll=5, max_steps=6, log_every=2, eval_every=1000, checkpoint_every=1000,
               threads=1, progress=False)
    cfg.update(kw)
    return TrainConfig(**cfg)


def check_stateful_fixture(model_dir, sentences_file, device="cpu", atol=1e-6, batches=10):
    """The stateful model's top layer against a published fixture's, sentence by sentence, over
    the first ``batches`` of its 10 batches of 3."""
    import json

    import h5py
    import numpy as np

    from torchelmo import BiLM, batch_to_ids

    model = BiLM.from_pretrained(model_dir, stateful=True).to(device)
    sentences = json.loads((model_dir / sentences_file).read_text())
    expected = [h5py.File(model_dir / f"lm_embeddings_{k}.hdf5", "r") for k in range(3)]
    P = model.config.projection_dim
    n_checked = 0
    with torch.no_grad():
        for i in range(batches):
            batch = [sentences[k][i].split() for k in range(3)]
            top = model(batch_to_ids(batch).to(device)).layers[-1].cpu()
            for k, toks in enumerate(batch):
                got = top[k, : len(toks)]
                got = torch.stack([got[:, :P], got[:, P:]]).numpy()
                want = expected[k][str(i)][...]
                assert want.shape == got.shape
                np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5,
                                           err_msg=f"sentence {k}/{i}")
                n_checked += 1
    assert n_checked == 3 * batches


# -- the `core` marker ---------------------------------------------------------------------------
# Core tests need neither ../shared nor an optional extra: `pytest -m core` runs them in a bare
# clone. Each test module declares its own (`pytestmark = pytest.mark.core`, or the mark on each
# such test); a core test that asks for a fixture reading ../shared is refused at collection.
SHARED_FIXTURES = {"allennlp_dir", "bilmtf_dir", "fixture_model", "fixture_corpus", "ptb_slice", "tiny_run",
                   "sentences", "model_args", "default_model"}
EXTRAS = ("onnx", "onnxruntime", "spacy", "triton", "huggingface_hub", "matplotlib", "nltk", "flair",
          "elmoformanylangs")


def pytest_collection_modifyitems(config, items):
    for item in items:
        shared = SHARED_FIXTURES & set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("core") and shared:
            raise pytest.UsageError(f"{item.nodeid} is marked core but reads ../shared through {sorted(shared)}")


def _imports_an_extra(source: str) -> bool:
    return any(f"import {x}" in source or f"importorskip(\"{x}" in source for x in EXTRAS)


def pytest_ignore_collect(collection_path, config):
    # Under -m core, a module that imports an optional extra holds no core test: not even
    # imported, so that a bare install can collect the rest.
    if "core" in (config.getoption("markexpr") or "") and collection_path.suffix == ".py" \
            and collection_path.name.startswith("test_"):
        return _imports_an_extra(collection_path.read_text(encoding="utf-8")) or None
    return None


# -- fixtures of the reliability tests ----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, fixture_corpus):
    """A finished three-step run of the tiny model, with validation."""
    data, vocab = fixture_corpus
    tmp = tmp_path_factory.mktemp("run")
    from torchelmo.train import train
    cfg = base_config(tmp, data, vocab, max_steps=3, valid=[str(data)], eval_every=3, checkpoint_every=3)
    train(cfg, log=lambda s: None)
    return tmp / "run"


# Writing: a full disk, a read-only or wrong place, temp files of killed runs.
@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (mounting needs root; elsewhere the test is skipped, saying so)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a full disk is simulated with a small tmpfs, which only root can mount")
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)

