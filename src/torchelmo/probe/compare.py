"""``elmo probe compare``: several models' probing runs side by side, and how each layer ordering
moves with training.

Each input is the folder of one ``elmo probe`` run (its ``results.json``), labelled
``LABEL=FOLDER`` (or by the folder's name). Optional ``tokens`` per label (``LABEL@TOKENS``: how
many tokens that model had read) order the runs of one model along its training. The output
folder gets ``comparison.json`` (the headline numbers of every run, and the verdicts) and
``comparison.md``: per task, each model's per-layer scores with intervals and its mix weights; the
paired E2 - E1 difference of every run; and what is shown and what is not, for the orderings the
paper reports and the protocol expects, and each source's claims with every run's verdict
(:mod:`torchelmo.probe.claims`; ``docs/science.md``). With matplotlib, ``gaps.png``
draws every run's E2 - E1 per task, so a gap's movement along training shows at a glance.

``--decide CANDIDATE:INCUMBENT`` adds the rule for replacing a default model
(:func:`default_decision`): the candidate must be better on the majority of the tasks both runs
probed and worse beyond overlapping intervals on none.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ElmoError
from ..io.fileio import atomic_path
from .claims import SOURCES, judge
from .deps import NO_RESIDUAL
from .report import (
    EXPECTED,
    PAPER,
    _inputs,
    _sections,
    _title,
    load_results,
    ordering,
    paired_e2_e1,
    plots_available,
    write_results,
)


def parse_run(spec: str) -> tuple[str, Path, int | None]:
    """``[LABEL[@TOKENS]=]FOLDER`` -> (label, folder, tokens)."""
    label, sep, folder = spec.partition("=")
    if not sep:
        label, folder = Path(spec).name, spec
    label, at, tokens = label.partition("@")
    if at and not tokens.isdigit():
        raise ElmoError(f"{spec}: TOKENS after @ must be a whole number")
    path = Path(folder)
    if not (path / "results.json").is_file():
        raise ElmoError(f"{path}: no results.json (the folder of an elmo probe run)")
    return label or path.name, path, int(tokens) if at else None


def expected_ordering(task: str) -> tuple[str, str] | None:
    """(better, worse) by the paper's numbers, else by the protocol; None if neither says."""
    if task in PAPER:
        better, worse = sorted(PAPER[task], key=PAPER[task].get, reverse=True)
        return better, worse
    return EXPECTED.get(task)


def compare(runs: list[tuple[str, Path, int | None]], decide: str | None = None) -> dict:
    """Headline numbers and verdicts of every run, per task; with ``decide``
    (``CANDIDATE:INCUMBENT``), the default decision between two of them."""
    if len({label for label, _, _ in runs}) != len(runs):
        raise ElmoError("probe compare: two runs have the same label; name them LABEL=FOLDER")
    decision = parse_decision(decide, [label for label, _, _ in runs]) if decide else None
    out: dict = {"runs": [{"label": label, "folder": str(path), "tokens": tokens} for label, path, tokens in runs],
                 "tasks": {}, "claims": []}
    claims: dict[tuple, dict] = {}
    for label, path, tokens in runs:
        results = load_results(path / "results.json")
        for c in judge(results):
            row = claims.setdefault((c["source"], c["task"], c["claim"]), {
                k: c[k] for k in ("source", "task", "claim", "cite")} | {"runs": {}})
            row["runs"][label] = {"verdict": c["verdict"], "evidence": c["evidence"]}
        for task, s in _sections(results):
            t = out["tasks"].setdefault(task, {"title": _title(task), "expected": expected_ordering(task),
                                               "runs": {}})
            pair = paired_e2_e1(s)
            verdict = None
            if t["expected"] and pair is not None:
                winner = ordering("E1", "E2", pair)
                verdict = "not shown" if winner is None else ("shown" if winner == t["expected"][0] else "reversed")
            t["runs"][label] = {
                "tokens": tokens,
                "scores": {k: s[k] for k in _inputs(s)},
                "intervals": {k: s.get("intervals", {}).get(k) for k in _inputs(s)},
                "mix_weights": s.get("mix_weights"), "paired_E2_E1": pair, "verdict": verdict}
    out["claims"] = list(claims.values())
    if decision:
        folders = {label: path for label, path, _ in runs}
        out["decision"] = default_decision(*((label, load_results(folders[label] / "results.json")) for label in decision))
    return out


def task_scores(results: dict) -> dict[str, dict]:
    """Each task's score as a user of the model meets it: the learned mix of the layers where the
    task trained one (NER's tagger always does), else its best single layer; with its interval:
    ``{task: {"input", "score", "ci"}}``."""
    sections = _sections(results) + ([("ner", results["ner"])] if "ner" in results else [])
    out = {}
    for task, s in sections:
        layers = [k for k in _inputs(s) if k != NO_RESIDUAL] if "mix" not in s else ["mix"]
        if layers:
            best = max(layers, key=lambda k: s[k])
            out[task] = {"input": best, "score": s[best], "ci": s.get("intervals", {}).get(best)}
    return out


def default_decision(candidate: tuple[str, dict], incumbent: tuple[str, dict]) -> dict:
    """Whether ``candidate`` (label, results) should replace ``incumbent`` as the default: better
    (by the point estimate) on the majority of the tasks that both probed, and worse beyond
    overlapping intervals (its upper end below the incumbent's lower end) on none. Both models'
    task scores, per task, and ``replace``."""
    (c_label, c), (i_label, i) = candidate, incumbent
    cs, is_ = task_scores(c), task_scores(i)
    rows = []
    for task in [t for t in cs if t in is_]:
        a, b = cs[task], is_[task]
        beyond = a["ci"] is not None and b["ci"] is not None and a["ci"][1] < b["ci"][0]
        rows.append({"task": task, "candidate": a, "incumbent": b, "better": a["score"] > b["score"],
                     "worse_beyond_intervals": beyond})
    better = sum(r["better"] for r in rows)
    blocked = [r["task"] for r in rows if r["worse_beyond_intervals"]]
    return {"candidate": c_label, "incumbent": i_label, "tasks": rows, "better_on": better,
            "replace": bool(rows) and better * 2 > len(rows) and not blocked, "worse_beyond_intervals": blocked}


def parse_decision(spec: str, labels: list[str]) -> tuple[str, str]:
    """``CANDIDATE:INCUMBENT`` -> the two labels, each one of the compared runs'."""
    cand, sep, inc = spec.partition(":")
    if not sep or not cand or not inc:
        raise ElmoError(f"--decide {spec}: expected CANDIDATE:INCUMBENT, two of the runs' labels")
    for label in (cand, inc):
        if label not in labels:
            raise ElmoError(f"--decide {spec}: no run labelled {label!r} (runs: {', '.join(labels)})")
    return cand, inc


def _pct(v, ci=None) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.1f}" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def gaps_plot(summary: dict, path: Path) -> bool:
    """One panel per task with an expected ordering: each run's paired E2 - E1 (points) with its
    interval, runs in the given order (a model's runs along its training), the expected side
    shaded. False when no run has a paired difference."""
    tasks = [t for t in summary["tasks"].values()
             if t["expected"] and any(r["paired_E2_E1"] for r in t["runs"].values())]
    if not tasks:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [r["label"] for r in summary["runs"]]
    fig, axes = plt.subplots(1, len(tasks), figsize=(2.2 + 2.2 * len(tasks), 3.2), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        xs, ys, err = [], [], [[], []]
        for i, label in enumerate(labels):
            p = t["runs"].get(label, {}).get("paired_E2_E1")
            if p:
                xs.append(i)
                ys.append(100 * p["diff"])
                err[0].append(100 * (p["diff"] - p["ci"][0]))
                err[1].append(100 * (p["ci"][1] - p["diff"]))
        ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=3)
        ax.axhline(0, color="grey", lw=0.8)
        lo, hi = ax.get_ylim()
        expected_side = (0, hi) if t["expected"][0] == "E2" else (lo, 0)
        ax.axhspan(*expected_side, color="tab:green", alpha=0.08)
        ax.set_ylim(lo, hi)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"{t['title']}\nexpected {t['expected'][0]} > {t['expected'][1]}", fontsize=8)
    axes[0][0].set_ylabel("E2 - E1, points (paired 95%)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return True


def render(summary: dict, figure: bool = False) -> str:
    labels = [r["label"] for r in summary["runs"]]
    lines = ["# Probing: the models side by side", "",
             "Each task's probes as `elmo probe` ran them (docs/probing.md; the protocol in docs/science.md), "
             "per model: test score (%) with its 95% bootstrap interval; the mix's learned layer weights "
             "softmax(s); the paired E2 - E1 difference (points) with its interval.", ""]
    tokens = {r["label"]: r["tokens"] for r in summary["runs"]}
    if any(v is not None for v in tokens.values()):
        lines += ["Training tokens read: " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in tokens.items() if v), ""]
    verdicts = []
    for t in summary["tasks"].values():
        here = [label for label in labels if label in t["runs"]]
        lines += [f"## {t['title']}", "", "| input | " + " | ".join(here) + " |",
                  "|---|" + "---|" * len(here)]
        names = list(dict.fromkeys(k for label in here for k in t["runs"][label]["scores"]))
        for n in names:
            cells = [_pct(t["runs"][label]["scores"].get(n), t["runs"][label]["intervals"].get(n)) for label in here]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        w = ["-" if t["runs"][label]["mix_weights"] is None else
             " / ".join(f"{x:.2f}" for x in t["runs"][label]["mix_weights"]) for label in here]
        lines.append("| mix weights E0 / E1 / E2 | " + " | ".join(w) + " |")
        d = []
        for label in here:
            p = t["runs"][label]["paired_E2_E1"]
            d.append("-" if p is None else f"{100 * p['diff']:+.2f} [{100 * p['ci'][0]:+.2f}, {100 * p['ci'][1]:+.2f}]")
        lines += ["| E2 - E1 (paired) | " + " | ".join(d) + " |", ""]
        if t["expected"]:
            better, worse = t["expected"]
            for label in here:
                v = t["runs"][label]["verdict"]
                verdicts.append(f"- {t['title']}, {label}: {better} > {worse} "
                                f"**{v or 'not tested'}**" + (" (the paired interval excludes zero the other way)"
                                                              if v == "reversed" else ""))
    if summary.get("claims"):
        lines += ["## The claims by source", "",
                  "Each source's claim and every run's verdict on it, with its evidence: the paired "
                  "difference (points) and its 95% interval, or the mix weights over the probe seeds. "
                  "*shown* only when the interval (or every seed) agrees; *reversed* when it excludes "
                  "the claim the other way.", "",
                  "| source | task | claim | " + " | ".join(labels) + " |", "|---|---|---|" + "---|" * len(labels)]
        for row in summary["claims"]:
            cells = [f"**{r['verdict']}** {r['evidence']}" if (r := row["runs"].get(label)) else "-" for label in labels]
            lines.append(f"| {SOURCES[row['source']]} ({row['cite']}) | {_title(row['task'])} | {row['claim']} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    if verdicts:
        lines += ["## What is shown and what is not (round one's orderings: the paper's, else the textbook's)", "",
                  "An ordering is *shown* only when the paired interval of E2 - E1 excludes zero in the "
                  "expected direction; *not shown* when it includes zero, whatever the point estimates.", "",
                  *verdicts, ""]
    if summary.get("decision"):
        lines += _decision_lines(summary["decision"])
    if figure:
        lines += ["![E2 - E1 per task and model; the expected side shaded](gaps.png)", ""]
    return "\n".join(lines) + "\n"


def _decision_lines(d: dict) -> list[str]:
    c, i = d["candidate"], d["incumbent"]
    lines = [f"## Should {c} replace {i} as the default?", "",
             f"The rule: {c} better on the majority of the tasks both were probed on, and worse beyond "
             "overlapping intervals (its interval's upper end below the other's lower end) on none. Each "
             "task's score is the one a user meets: the learned mix of the layers, else the best single "
             "layer (test, %, 95% interval).", "",
             f"| task | input | {c} | {i} | {c} better | worse beyond the intervals |", "|---|---|---|---|---|---|"]
    for r in d["tasks"]:
        a, b = r["candidate"], r["incumbent"]
        inputs = a["input"] if a["input"] == b["input"] else f"{a['input']} / {b['input']}"
        lines.append(f"| {_title(r['task'])} | {inputs} | {_pct(a['score'], a['ci'])} | {_pct(b['score'], b['ci'])} | "
                     f"{'yes' if r['better'] else 'no'} | {'**yes**' if r['worse_beyond_intervals'] else 'no'} |")
    n = len(d["tasks"])
    verdict = "**replace**" if d["replace"] else "**keep**"
    why = (f"better on {d['better_on']} of {n} tasks" +
           (f"; worse beyond the intervals on {', '.join(_title(t) for t in d['worse_beyond_intervals'])}"
            if d["worse_beyond_intervals"] else "; worse beyond the intervals on none"))
    return lines + ["", f"Verdict: {verdict} ({why}).", ""]


def write(summary: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(out_dir / "comparison.json", summary)
    figure = plots_available() and gaps_plot(summary, out_dir / "gaps.png")
    path = out_dir / "comparison.md"
    with atomic_path(path) as tmp:
        tmp.write_text(render(summary, figure))
    return path
