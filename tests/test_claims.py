"""The layer claims by source and a run's verdicts on them (torchelmo.probe.claims), on hand-set
results: each verdict follows its interval (or every probe seed), never the point estimate."""

import json

import pytest

from torchelmo.probe.claims import CLAIMS, Claim, judge, verdict

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


def _section(e2_minus_e1, ci, seed_weights=None, **paired):
    e2 = 0.9 + e2_minus_e1
    s = {"E1": 0.9, "E2": e2, "intervals": {"E1": [0.89, 0.91], "E2": [e2 - 0.01, e2 + 0.01]},
         "paired": {"E2-E1": {"diff": e2_minus_e1, "ci": ci}, **paired}}
    if seed_weights is not None:
        s["mix_weights"] = [sum(w[k] for w in seed_weights) / len(seed_weights) for k in range(3)]
        s["details"] = {"trained": {"mix": {"seed_weights": seed_weights}}}
    return s


def test_an_ordering_claim_follows_the_paired_interval():
    e1_first = Claim("paper", "pos_wsj", "order", "E1", "E2", "Table 6")
    assert verdict(e1_first, _section(-0.004, [-0.0075, -0.0003]))["verdict"] == "shown"
    assert verdict(e1_first, _section(-0.004, [-0.0075, +0.0003]))["verdict"] == "not shown"
    got = verdict(e1_first, _section(+0.04, [+0.03, +0.05]))
    assert got == {"verdict": "reversed", "evidence": "E2 - E1 +4.00 [+3.00, +5.00]"}
    e2_first = Claim("textbook", "coref", "order", "E2", "E1", "semantics high")
    assert verdict(e2_first, _section(+0.04, [+0.03, +0.05]))["verdict"] == "shown"
    assert verdict(e2_first, None) == {"verdict": "not tested", "evidence": "task not run"}


def test_wsd_is_judged_on_the_papers_evaluation_set():
    claim = Claim("paper", "wsd", "order", "E2", "E1", "Table 5")
    s = {"paired": {"E2-E1 all": {"diff": 0.02, "ci": [0.01, 0.03]},
                    "E2-E1 all_minus_dev": {"diff": 0.01, "ci": [-0.001, 0.02]}}}
    assert verdict(claim, s) == {"verdict": "not shown", "evidence": "E2 - E1 +1.00 [-0.10, +2.00]"}
    del s["paired"]["E2-E1 all_minus_dev"]      # older results: ALL only
    assert verdict(claim, s)["verdict"] == "shown"


def test_a_mix_weight_claim_needs_every_seed():
    claim = Claim("paper", "coref", "weight", "E1", "E2", "section 5.5")
    every = _section(0, [-1, 1], [[0.3, 0.5, 0.2], [0.2, 0.6, 0.2], [0.3, 0.4, 0.3]])
    assert verdict(claim, every) == {"verdict": "shown",
                                     "evidence": "E1 0.50 vs E2 0.23, E1 ahead in 3 of 3 seeds"}
    # one seed the other way: the mean still leans on E1, but not every seed does
    split = _section(0, [-1, 1], [[0.3, 0.5, 0.2], [0.2, 0.6, 0.2], [0.3, 0.3, 0.4]])
    assert verdict(claim, split)["verdict"] == "not shown"
    none = _section(0, [-1, 1], [[0.3, 0.2, 0.5], [0.2, 0.3, 0.5], [0.2, 0.1, 0.7]])
    assert verdict(claim, none)["verdict"] == "reversed"
    # fewer seeds than MIN_SEEDS: the weights are described, not judged
    one = verdict(claim, _section(0, [-1, 1], [[0.2, 0.6, 0.2]]))
    assert one == {"verdict": "not shown", "evidence": "E1 0.60 vs E2 0.20, E1 ahead in 1 of 1 seeds "
                                                       "(fewer than 3: no verdict)"}
    assert verdict(claim, {"paired": {}})["verdict"] == "not tested"


def test_the_downstream_claim_reads_the_taggers_mix_minus_top():
    claim = Claim("paper", "ner", "pair", "mix", "top", "Table 2")
    ner = {"paired": {"mix-top": {"diff": 0.03, "ci": [0.01, 0.05]}, "mix-E0": {"diff": 0.1, "ci": [0.05, 0.15]}}}
    assert verdict(claim, ner) == {"verdict": "shown", "evidence": "mix - top +3.00 [+1.00, +5.00]"}
    ner["paired"]["mix-top"]["ci"] = [-0.05, -0.01]
    assert verdict(claim, ner)["verdict"] == "reversed"
    assert verdict(claim, {"paired": {"mix-E0": ner["paired"]["mix-E0"]}})["verdict"] == "not tested"


def test_judge_covers_each_source_of_the_tasks_a_run_has():
    results = {"coref": _section(-0.02, [-0.03, -0.01], [[0.3, 0.5, 0.2]] * 3),
               "deps": {"uas": _section(0.04, [0.03, 0.05]), "labels": _section(0, [-0.01, 0.01])}}
    rows = judge(results)
    assert {r["task"] for r in rows} == {"coref", "deps_uas", "deps_labels"}
    by = {(r["source"], r["task"]): r["verdict"] for r in rows}
    # the paper's coreference claim (the mix leans on E1) holds; the textbook's (E2 > E1) is reversed
    assert by[("paper", "coref")] == "shown" and by[("textbook", "coref")] == "reversed"
    assert by[("literature", "deps_uas")] == "reversed" and by[("textbook", "deps_labels")] == "not shown"
    assert ("paper", "deps_uas") not in by      # the paper makes no dependency claim
    assert len(rows) == sum(c.task in ("coref", "deps_uas", "deps_labels") for c in CLAIMS)


def test_compare_and_report_give_the_verdicts_by_source(tmp_path):
    from torchelmo.cli import main
    from torchelmo.probe.report import render, write_results
    for name, d, ci in (("early", 0.0, [-0.01, 0.01]), ("late", 0.03, [0.02, 0.04])):
        (tmp_path / name).mkdir()
        write_results(tmp_path / name / "results.json", {"coref": _section(d, ci, [[0.2, 0.5, 0.3]] * 3)})
    out = tmp_path / "cmp"
    assert main(["probe", "compare", f"early@10={tmp_path / 'early'}", f"late@20={tmp_path / 'late'}",
                 "--out", str(out)]) == 0
    claims = {(c["source"], c["claim"]): c for c in json.loads((out / "comparison.json").read_text())["claims"]}
    assert claims[("textbook", "E2 > E1")]["runs"]["early"]["verdict"] == "not shown"
    assert claims[("textbook", "E2 > E1")]["runs"]["late"]["verdict"] == "shown"
    md = (out / "comparison.md").read_text()
    assert ("| Peters et al. 2018 (section 5.5) | Coreference (LitBank) | the mix leans on E1 over E2 | "
            "**shown** E1 0.50 vs E2 0.30, E1 ahead in 3 of 3 seeds |") in md
    report = render({"coref": _section(0.03, [0.02, 0.04], [[0.2, 0.5, 0.3]])}, tmp_path / "one").read_text()
    assert ("| later literature (Peters et al. 2018b) | Coreference (LitBank) | E2 > E1 | **shown** | "
            "E2 - E1 +3.00 [+2.00, +4.00] |") in report


def test_the_wsd_report_sets_the_paper_beside_its_own_evaluation_set(tmp_path):
    # The paper's WSD numbers are on Raganato's test sets without SemEval-2007 (first sense 65.9
    # there): the report puts them beside that set's scores and baselines, not beside ALL.
    from torchelmo.probe.report import render

    def part(all_, amd):
        return {"f1": all_, "ci": [all_ - 0.01, all_ + 0.01],
                "all_minus_dev": {"f1": amd, "ci": [amd - 0.012, amd + 0.011]}}

    trained = {"layers": {"E0": part(0.49, 0.50), "E1": part(0.605, 0.615), "E2": part(0.629, 0.639)},
               "first_sense": part(0.652, 0.6586), "semcor_mfs": part(0.654, 0.660)}
    wsd = {k: trained["layers"][k]["f1"] for k in ("E0", "E1", "E2")}
    wsd.update(intervals={k: trained["layers"][k]["ci"] for k in ("E0", "E1", "E2")},
               all_minus_dev={k: trained["layers"][k]["all_minus_dev"]["f1"] for k in ("E0", "E1", "E2")},
               baseline={"first_sense": 0.652, "semcor_mfs": 0.654}, details={"trained": trained})
    report = render({"wsd": wsd}, tmp_path).read_text()
    main, paper_set = report.split("On the paper's evaluation set")
    assert "| E2 | 62.9 [61.9, 63.9] | - | - |" in main          # ALL: no paper column
    assert "| E1 | 61.5 [60.3, 62.6] | 67.4 |" in paper_set
    assert "| E2 | 63.9 [62.7, 65.0] | 69.0 |" in paper_set
    assert "| baseline: first sense | 65.9 [64.7, 67.0] | 65.9 |" in paper_set
