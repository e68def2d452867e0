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
    from elmo import BiLM
    return BiLM.from_published(allennlp_dir / "options.json", allennlp_dir / "lm_weights.hdf5")


@pytest.fixture(scope="module")
def one_thread():
    """Modules of many small ops (tiny models, probes) run on one thread: a second one only adds
    wake-up latency, and on a loaded machine makes them far slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
