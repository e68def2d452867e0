"""The reliability tests can fail: scripts/mutations.py breaks each promise of docs/reliability.md
in a scratch copy; this keeps its list of mutants in step with the code."""

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


def test_every_mutation_of_the_recorded_run_still_applies():
    # scripts/mutations.py refuses a snippet that is not in the code exactly once; this keeps its
    # list, and so the recorded run, in step with the code between runs.
    import importlib.util
    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("mutations", root / "scripts" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutations"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["mutations"]
    assert len(module.MUTATIONS) >= 40 and len({m.id for m in module.MUTATIONS}) == len(module.MUTATIONS)
    for m in module.MUTATIONS:
        assert (root / m.file).read_text(encoding="utf-8").count(m.find) == 1, m.id
        assert m.selection and all((root / s.split("::")[0]).is_file() for s in m.selection), m.id

