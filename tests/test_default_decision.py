"""The rule for replacing the default model (torchelmo.probe.compare.default_decision), on
hand-set results: better on the majority of the tasks, worse beyond overlapping intervals on none."""

import json

import pytest

from torchelmo.probe.compare import default_decision, task_scores

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


def _task(mix=None, ci=None, **layers):
    """A task summary: per-layer scores (each interval +-0.01) and, optionally, a mix."""
    s = {**layers, "intervals": {k: [v - 0.01, v + 0.01] for k, v in layers.items()}}
    if mix is not None:
        s["mix"], s["intervals"]["mix"] = mix, ci or [mix - 0.01, mix + 0.01]
    return s


def _results(pos, wsd, ner, pos_ci=None):
    return {"pos": _task(pos, pos_ci, E0=0.8, E1=0.85, E2=0.84),
            "wsd": _task(E0=0.5, E1=wsd, E2=wsd - 0.01),           # no mix: the best layer counts
            "ner": {"mix": ner, "E0": 0.2, "intervals": {"mix": [ner - 0.03, ner + 0.03], "E0": [0.17, 0.23]}}}


def test_task_scores_read_the_mix_else_the_best_layer_and_ner():
    s = task_scores(_results(0.9, 0.6, 0.3))
    assert s["pos"] == {"input": "mix", "score": 0.9, "ci": [pytest.approx(0.89), pytest.approx(0.91)]}
    assert s["wsd"]["input"] == "E1" and s["wsd"]["score"] == 0.6
    assert s["ner"]["input"] == "mix" and s["ner"]["score"] == 0.3


def test_a_loss_within_overlapping_intervals_does_not_block_a_majority():
    # Better on WSD and NER; worse on POS by 0.015, the intervals (+-0.01) overlapping.
    d = default_decision(("new", _results(0.885, 0.62, 0.35)), ("old", _results(0.9, 0.6, 0.3)))
    assert d["better_on"] == 2 and d["worse_beyond_intervals"] == [] and d["replace"] is True
    assert [r["task"] for r in d["tasks"]] == ["pos", "wsd", "ner"]


def test_a_loss_beyond_the_intervals_blocks_the_replacement():
    d = default_decision(("new", _results(0.87, 0.62, 0.35)), ("old", _results(0.9, 0.6, 0.3)))
    assert d["better_on"] == 2 and d["worse_beyond_intervals"] == ["pos"] and d["replace"] is False


def test_half_the_tasks_is_not_a_majority():
    new, old = _results(0.91, 0.59, 0.3), _results(0.9, 0.6, 0.3)   # better on POS only; NER equal
    d = default_decision(("new", new), ("old", old))
    assert d["better_on"] == 1 and d["replace"] is False
    del new["ner"]                                                     # only the tasks both have count
    d = default_decision(("new", new), ("old", old))
    assert len(d["tasks"]) == 2 and d["better_on"] == 1 and d["replace"] is False


def test_compare_decides_between_two_runs_by_label(tmp_path, capsys):
    from torchelmo.cli import main
    from torchelmo.probe.report import write_results
    for name, r in (("old", _results(0.9, 0.6, 0.3)), ("new", _results(0.885, 0.62, 0.35))):
        (tmp_path / name).mkdir()
        write_results(tmp_path / name / "results.json", r)
    out = tmp_path / "cmp"
    runs = [f"default={tmp_path / 'old'}", f"science@20={tmp_path / 'new'}"]
    assert main(["probe", "compare", *runs, "--out", str(out), "--decide", "science:default"]) == 0
    assert json.loads((out / "comparison.json").read_text())["decision"]["replace"] is True
    md = (out / "comparison.md").read_text()
    assert "| UD POS | mix | 88.5 [87.5, 89.5] | 90.0 [89.0, 91.0] | no | no |" in md
    assert "Verdict: **replace** (better on 2 of 3 tasks; worse beyond the intervals on none)." in md
    capsys.readouterr()
    assert main(["probe", "compare", *runs, "--out", str(out), "--decide", "science:nope"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--decide science:nope" in err[0] and "'nope'" in err[0]
