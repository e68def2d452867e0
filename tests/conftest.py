import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ELMO_SHARED", ROOT.parent / "shared"))
FIXTURES = SHARED / "fixtures"
DATA = SHARED / "data"

torch.set_num_threads(min(2, torch.get_num_threads()))


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
