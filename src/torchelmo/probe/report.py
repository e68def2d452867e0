"""``results.json``, ``report.md`` and the PNG plots of a probing run.

``results.json`` holds, per task, the headline numbers in a flat shape::

    {"pos": {"E0": acc, "E1": acc, "E2": acc, "mix": acc, "mix_weights": [w0, w1, w2],
             "gamma": g, "intervals": {"E0": [lo, hi], ...}, "baseline": ..., "control_random": {...},
             "details": {...everything the probe measured...}},
     "pos_wsj": {... as pos, on the WSJ sample ...}, "tag" / "tag:NAME": {... as pos ...},
     "deps": {"uas": {... as pos, head accuracy ...}, "labels": {... as pos ...}},
     "wsd": {... the same with F1 on ALL ...}, "coref": {... the same with pairwise F1 on LitBank ...},
     "ner": {...}, "model": {...}}
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from ..io.fileio import atomic_path, read_json
from .claims import SOURCES, judge
from .common import layer_names
from .common import task_sections as _sections
from .deps import NO_RESIDUAL

# Peters et al. (2018), Table 5 (WSD F1 on Raganato's four test sets without SemEval-2007, which
# WSD_PAPER_SET names) and Table 6 (POS accuracy, PTB/WSJ).
PAPER = {"pos": {"E1": 0.973, "E2": 0.968}, "wsd": {"E1": 0.674, "E2": 0.690}}
PAPER["pos_wsj"] = PAPER["pos"]   # the paper's POS numbers are on WSJ
WSD_PAPER_SET = "all_minus_dev"
PAPER_FIRST_SENSE = 0.659         # WordNet's first sense on that set, as the paper quotes it
# Orderings docs/science.md expects where the paper has no numbers (syntax in the lower layer).
EXPECTED = {"deps_uas": ("E1", "E2"), "deps_labels": ("E1", "E2"), "deps_uuas": ("E1", "E2"), "deps_uuas_hm": ("E1", "E2"), "coref": ("E2", "E1"),
            "pos_xpos": ("E1", "E2")}   # the paper's POS claim, on PTB tags of other text
METRIC = {"pos": "accuracy", "pos_xpos": "accuracy", "pos_wsj": "accuracy", "deps_uas": "UAS", "deps_labels": "label accuracy",
          "deps_uuas": "UUAS", "deps_uuas_hm": "UUAS",
          "wsd": "F1 (ALL)", "coref": "pairwise F1", "ner": "entity F1"}
TITLE = {"pos": "UD POS", "pos_xpos": "UD EWT POS, PTB tags (XPOS)", "pos_wsj": "WSJ POS", "deps_uas": "Dependency arcs", "deps_labels": "Dependency labels",
         "deps_uuas": "Dependency tree distances (structural probe)",
         "deps_uuas_hm": "Dependency tree distances (structural probe, Hewitt & Manning's schedule)",
         "coref": "Coreference (LitBank)"}


def summarize_pos(trained: dict, control: dict | None = None) -> dict:
    return _summarize(trained, control, "acc", baseline={"majority": trained["majority"]["acc"]})


def summarize_deps(trained: dict, control: dict | None = None) -> dict:
    """``{"uas": ..., "labels": ..., "uuas": ..., "uuas_hm": ...}``, each in the flat shape of
    :func:`summarize_pos` (results from before the structural probe, or its second schedule,
    lack those)."""
    tasks = [t for t in ("uas", "labels", "uuas", "uuas_hm") if t in trained]
    baselines = {"uas": {k: v["acc"] for k, v in trained["uas"]["baselines"].items()},
                 "labels": {"majority": trained["labels"]["majority"]["acc"]},
                 **{t: {k: v["acc"] for k, v in trained.get(t, {}).get("baselines", {}).items()}
                    for t in ("uuas", "uuas_hm")}}
    out = {t: _summarize(trained[t], control and control[t], "acc", baselines[t]) for t in tasks}
    for t in tasks:
        if "by_distance" in trained[t]:
            out[t]["by_distance"] = trained[t]["by_distance"]
    out["n_test_words"], out["config"] = trained["n_test_words"], trained["config"]
    if "n_test_documents" in trained:
        out["n_test_documents"] = trained["n_test_documents"]
    return out


def summarize_coref(trained: dict, control: dict | None = None) -> dict:
    out = _summarize(trained, control, "f1", baseline={k: v["f1"] for k, v in trained["baselines"].items()})
    out["counts"], out["config"] = trained["counts"], trained["config"]
    return out


def summarize_wsd(trained: dict, control: dict | None = None) -> dict:
    out = _summarize(trained, control, "f1", baseline={"first_sense": trained["first_sense"]["f1"],
                                                       "semcor_mfs": trained["semcor_mfs"]["f1"]})
    if "mix" in trained:
        out["mix_temperature"] = trained["mix"]["temperature"]
        out.pop("gamma", None)  # a cosine classifier is scale-free: there is no gamma
        out["mix_all_minus_dev"] = trained["mix"]["all_minus_dev"]["f1"]
        out["mix_grid"] = trained["mix_grid"]["f1"]
        out["mix_grid_weights"] = trained["mix_grid"]["weights"]
    out["all_minus_dev"] = {k: v["all_minus_dev"]["f1"] for k, v in trained["layers"].items()
                            if "all_minus_dev" in v}
    return out


def _summarize(trained: dict, control: dict | None, key: str, baseline: dict) -> dict:
    out: dict = {}
    intervals = {}
    for name, r in trained["layers"].items():
        out[name] = r[key]
        intervals[name] = r["ci"]
    if "mix" in trained:
        out["mix"] = trained["mix"][key]
        out["mix_weights"] = trained["mix"]["weights"]
        if "gamma" in trained["mix"]:
            out["gamma"] = trained["mix"]["gamma"]
        intervals["mix"] = trained["mix"]["ci"]
    out["intervals"] = intervals
    runs = {**trained["layers"], **({"mix": trained["mix"]} if "mix" in trained else {})}
    n_seeds = max((len(r.get("seeds", ())) for r in runs.values()), default=1)
    if n_seeds > 1:
        out["seeds"], out["sd"] = n_seeds, {name: r["sd"] for name, r in runs.items()}
    if "units" in trained:
        out["resampled"] = trained["units"]["resampled"]
    if "paired" in trained:
        out["paired"] = trained["paired"]  # E2 - E1 with a paired-bootstrap interval
    out["baseline"] = baseline
    if control is not None:
        c = {name: r[key] for name, r in control["layers"].items()}
        ci = {name: r["ci"] for name, r in control["layers"].items()}
        if "mix" in control:
            c["mix"], c["mix_weights"], ci["mix"] = control["mix"][key], control["mix"]["weights"], control["mix"]["ci"]
        c["intervals"] = ci
        if "paired" in control:
            c["paired"] = control["paired"]
        out["control_random"] = c
    out["details"] = {"trained": trained, **({"control_random": control} if control is not None else {})}
    return out


def summarize_ner(res: dict) -> dict:
    out = {name: r["f1"] for name, r in res["inputs"].items()}
    out["intervals"] = {name: r["ci"] for name, r in res["inputs"].items()}
    if "mix" in res["inputs"]:
        out["mix_weights"] = res["inputs"]["mix"]["weights"]
        out["gamma"] = res["inputs"]["mix"]["gamma"]
    if res.get("paired"):
        out["paired"] = res["paired"]       # mix - E0, mix - static, E0 - static
    if res.get("seeds", 1) > 1:
        out["seeds"] = res["seeds"]
        out["sd"] = {name: r["f1_sd"] for name, r in res["inputs"].items()}
    out["details"] = res
    return out


def load_results(path: Path) -> dict:
    return read_json(path, "probe results file") if path.is_file() else {}


UNITS_NAME = "units.json"


def split_units(results: dict, where: str = "") -> tuple[dict, dict]:
    """``results`` without its per-unit counts (every ``"units"`` entry, at any depth), and those
    counts keyed by where they were (``"pos/details/trained"``)."""
    kept, units = {}, {}
    for key, value in results.items():
        here = f"{where}/{key}" if where else str(key)
        if key == "units" and isinstance(value, dict):
            units[where] = value
        elif isinstance(value, dict):
            kept[key], inner = split_units(value, here)
            units.update(inner)
        else:
            kept[key] = value
    return kept, units


def write_results(path: Path, results: dict) -> None:
    """``results.json``, and beside it ``units.json``: the per-unit counts each interval was
    computed from (kept from earlier runs of tasks not rerun)."""
    kept, units = split_units(results)
    side = path.parent / UNITS_NAME
    if units:
        old = read_json(side, "probe units file") if side.is_file() else {}
        tasks = {w.split("/", 1)[0] for w in units}
        merged = {w: u for w, u in old.items() if w.split("/", 1)[0] not in tasks} | units
        with atomic_path(side) as tmp:
            tmp.write_text(json.dumps(merged) + "\n")
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(kept, indent=1) + "\n")


def _inputs(s: dict) -> list[str]:
    """The layers of a task summary (``E0`` .. ``E{L-1}``, any depth) in order, E2 without its
    residual where a dependency probe read it, then ``mix``."""
    n = max((int(k[1:]) + 1 for k in s if k[:1] == "E" and k[1:].isdigit()), default=0)
    return [k for k in layer_names(n) + [NO_RESIDUAL, "mix"] if k in s]


def ordering(a: str, b: str, paired: dict | None) -> str | None:
    """The better of ``a`` and ``b`` by the paired bootstrap interval of ``b - a``
    (``{"diff", "ci"}``); None when there is no interval or it includes zero: then no ordering
    may be claimed, however the point estimates fall."""
    if paired is None:
        return None
    lo, hi = paired["ci"]
    return b if lo > 0 else a if hi < 0 else None


def paired_e2_e1(s: dict) -> dict | None:
    """A task section's paired E2 - E1 (``{"diff", "ci"}``; WSD's on ALL, like its table)."""
    paired = s.get("paired", {})
    return paired.get("E2-E1", paired.get("E2-E1 all"))


def _ordering_line(task: str, s: dict) -> str | None:
    """The verdict on the paper's (or the protocol's) E1/E2 ordering; None for a task without one."""
    if task in PAPER:
        better, worse = sorted(PAPER[task], key=PAPER[task].get, reverse=True)   # the paper's ordering
        name = task.upper() if task in ("pos", "wsd") else _title(task)
        head = f"Paper's ordering {better} > {worse} for {name}"
    elif task in EXPECTED:
        better, worse = EXPECTED[task]
        head = f"Expected ordering {better} > {worse} for {_title(task)}"
    else:
        return None
    r = paired_e2_e1(s)
    if r is None:
        return f"{head}: **not tested** (no paired bootstrap interval of E2 - E1 in the results)."
    ci = f"paired 95% interval of E2 - E1 [{100 * r['ci'][0]:+.2f}, {100 * r['ci'][1]:+.2f}] points"
    winner = ordering("E1", "E2", r)
    if winner is None:
        return (f"{head}: **not shown**: the difference between E1 and E2 is not significant "
                f"({ci} includes zero).")
    loser = "E2" if winner == "E1" else "E1"
    line = (f"{head}: **{'yes' if winner == better else 'no'}**: {winner} beats {loser} "
            f"({ci} excludes zero).")
    cr = paired_e2_e1(s.get("control_random", {}))
    if ordering("E1", "E2", cr) == winner:
        # An ordering a random network has too is a property of the architecture, not of training.
        line += (f" The random-weights control orders them the same way (E2 - E1 "
                 f"[{100 * cr['ci'][0]:+.2f}, {100 * cr['ci'][1]:+.2f}] points).")
    return line


# -- plots ---------------------------------------------------------------------------------------

def _layer_plot(task: str, s: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = _inputs(s)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    series = [("trained biLM", s, "C0", -0.18)]
    if "control_random" in s:
        series.append(("same architecture, random weights", s["control_random"], "C7", 0.18))
    for label, d, color, dx in series:
        xs = [i + dx for i, n in enumerate(names) if n in d]
        ys = [d[n] for n in names if n in d]
        err = [[d[n] - d["intervals"][n][0] for n in names if n in d],
               [d["intervals"][n][1] - d[n] for n in names if n in d]]
        ax.bar(xs, ys, width=0.36, color=color, label=label, yerr=err, capsize=3)
    if task in PAPER:
        px = [i for i, n in enumerate(names) if n in PAPER[task]]
        ax.scatter(px, [PAPER[task][names[i]] for i in px], marker="D", color="C3", zorder=5,
                   label="Peters et al. 2018" + (" (ALL without SemEval-2007)" if task == "wsd" else ""))
    for name, v in s.get("baseline", {}).items():
        ax.axhline(v, ls="--", lw=1, color="k")
        ax.text(len(names) - 0.5, v, name.replace("_", " "), va="bottom", ha="right", fontsize=7)
    vals = [s[n] for n in names] + [s.get("control_random", {}).get(n, 1) for n in names]
    lo = min(vals + list(s.get("baseline", {}).values()))
    ax.set_ylim(max(0.0, lo - 0.1), 1.0)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(METRIC.get(task, "accuracy"))
    ax.set_title(f"{_title(task)}: per-layer probes (95% bootstrap intervals)", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _weights_plot(results: dict, path: Path) -> bool:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = [(_title(t), s["mix_weights"]) for t, s in _sections(results) if "mix_weights" in s]
    tasks += [("NER", results["ner"]["mix_weights"])] if "mix_weights" in results.get("ner", {}) else []
    if not tasks:
        return False
    L = len(tasks[0][1])
    tasks = [(t, w) for t, w in tasks if len(w) == L]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    width = 0.8 / len(tasks)
    for j, (t, w) in enumerate(tasks):
        ax.bar([k + (j - (len(tasks) - 1) / 2) * width for k in range(len(w))], w, width=width, label=t)
    ax.axhline(1 / L, ls="--", lw=1, color="k")
    ax.set_xticks(range(L), layer_names(L))
    ax.set_ylabel("softmax(s)")
    ax.set_title("Learned mix weights per task")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _ner_plot(s: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [k for k in s["intervals"]]
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    err = [[s[n] - s["intervals"][n][0] for n in names], [s["intervals"][n][1] - s[n] for n in names]]
    ax.bar(range(len(names)), [s[n] for n in names], yerr=err, capsize=3, color="C2")
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
    ax.set_ylabel("entity F1 (test)")
    ax.set_title("WNUT-17 NER: BiLSTM tagger on different inputs")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- markdown ------------------------------------------------------------------------------------

def _fmt(v: float, ci=None) -> str:
    return f"{100 * v:.1f}" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def plots_available() -> bool:
    """Whether matplotlib (the ``plots`` extra) is installed; without it the report has no figures."""
    return importlib.util.find_spec("matplotlib") is not None


def _claims_section(results: dict) -> list[str]:
    """Each source's claims on this run's tasks, with the verdict and its evidence."""
    rows = judge(results)
    if not rows:
        return []
    return ["## The claims by source", "",
            "| source | task | claim | verdict | evidence |", "|---|---|---|---|---|",
            *(f"| {SOURCES[r['source']]} ({r['cite']}) | {_title(r['task'])} | {r['claim']} | **{r['verdict']}** | "
              f"{r['evidence']} |" for r in rows), ""]


def render(results: dict, out_dir: Path) -> Path:
    """Write ``report.md`` and, with matplotlib, the plots into ``out_dir``; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plots_available()
    lines = ["# Probing report", ""]
    if not plots:
        lines += ["(No figures: they need matplotlib, `pip install 'torchelmo[plots]'`.)", ""]
    m = results.get("model", {})
    if m:
        lines += [f"Model: `{m.get('path')}` ({m.get('parameters', '?'):,} parameters, fingerprint "
                  f"`{m.get('fingerprint')}`); control: the same architecture with random weights "
                  f"(seed {m.get('control_seed', 0)}).", ""]
    sections = _sections(results)
    for task, s in sections:
        if not task.startswith("tag"):
            lines += _layer_section(task, s, out_dir, plots)
    if "ner" in results:
        s = results["ner"]
        if plots:
            _ner_plot(s, out_dir / "ner.png")
        seeds = s.get("seeds", 1)
        if seeds > 1:
            lines += [f"## NER (WNUT-17 test entity F1, %; mean of {seeds} seeds)", "",
                      "| input | F1 | sd over seeds |", "|---|---|---|"]
            lines += [f"| {n} | {_fmt(s[n], s['intervals'][n])} | {100 * s['sd'][n]:.2f} |" for n in s["intervals"]]
        else:
            lines += ["## NER (WNUT-17 test entity F1, %)", "", "| input | F1 |", "|---|---|"]
            lines += [f"| {n} | {_fmt(s[n], s['intervals'][n])} |" for n in s["intervals"]]
        if s.get("paired"):
            lines.append("")
            lines += [f"Paired bootstrap {name.replace('-', ' - ')}: {100 * r['diff']:+.2f} "
                      f"[{100 * r['ci'][0]:+.2f}, {100 * r['ci'][1]:+.2f}] points." for name, r in s["paired"].items()]
        if "mix_weights" in s:
            lines += ["", f"Mix weights softmax(s) = {[round(w, 3) for w in s['mix_weights']]}, "
                      f"gamma = {s['gamma']:.3f}."]
        lines += ["", "![ner](ner.png)", ""] if plots else [""]
    for task, s in sections:
        if task.startswith("tag"):
            lines += _layer_section(task, s, out_dir, plots)
    lines += _claims_section(results)
    if plots and _weights_plot(results, out_dir / "mix_weights.png"):
        lines += ["## Learned mix weights", "", "![mix weights](mix_weights.png)", ""]
    path = out_dir / "report.md"
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return path


def _title(task: str) -> str:
    if task == "tag" or task.startswith("tag:"):
        return f"Tags `{task}`"
    return TITLE.get(task, task.upper())


def _wsd_paper_set(s: dict) -> list[str]:
    """WSD on the paper's evaluation set (ALL without SemEval-2007, the mix's dev set), each
    input beside the paper's number and both baselines."""
    t = s.get("details", {}).get("trained", {})
    rows = [(k, (t.get("layers", {}).get(k) or {}).get(WSD_PAPER_SET) or {"f1": v})
            for k, v in s["all_minus_dev"].items()]
    if "mix_all_minus_dev" in s:
        rows.append(("mix (weights tuned on SemEval-2007)", (t.get("mix") or {}).get(WSD_PAPER_SET) or {"f1": s["mix_all_minus_dev"]}))
    for name in ("first_sense", "semcor_mfs"):
        if WSD_PAPER_SET in t.get(name, {}):
            rows.append((f"baseline: {name.replace('_', ' ')}", t[name][WSD_PAPER_SET]))
    paper = {**PAPER["wsd"], "baseline: first sense": PAPER_FIRST_SENSE}
    lines = ["", "On the paper's evaluation set, Raganato's four test sets without SemEval-2007 (F1, %):", "",
             "| input | trained | paper |", "|---|---|---|"]
    lines += [f"| {k} | {_fmt(r['f1'], r.get('ci'))} | {_fmt(paper[k]) if k in paper else '-'} |" for k, r in rows]
    if "mix_grid" in s:
        lines += ["", f"Grid-searched mix {[round(w, 2) for w in s['mix_grid_weights']]}: ALL {_fmt(s['mix_grid'])}."]
    return lines


def _layer_section(task: str, s: dict, out_dir: Path, plots: bool = True) -> list[str]:
    """A per-layer task's section: per-layer table, mix, paired differences, plot, the expected ordering."""
    png = f"{task.replace(':', '_')}_layers.png"
    if plots:
        _layer_plot(task, s, out_dir / png)
    lines = [f"## {_title(task)} ({METRIC.get(task, 'accuracy')}, %)", "",
             "| input | trained | random-weights control | paper |", "|---|---|---|---|"]
    for n in _inputs(s):
        c = s.get("control_random", {})
        cc = _fmt(c[n], c["intervals"][n]) if n in c else "-"
        # WSD's table is on ALL; the paper's numbers stand beside its own evaluation set, below.
        p = _fmt(PAPER[task][n]) if n in PAPER.get(task, {}) and task != "wsd" else "-"
        lines.append(f"| {n} | {_fmt(s[n], s['intervals'][n])} | {cc} | {p} |")
    for name, v in s.get("baseline", {}).items():
        lines.append(f"| baseline: {name.replace('_', ' ')} | {_fmt(v)} | | |")
    how = []
    if s.get("seeds", 1) > 1:
        how.append(f"each probe trained with {s['seeds']} seeds, the score their mean (sd over seeds, points: "
                   + ", ".join(f"{n} {100 * v:.2f}" for n, v in s["sd"].items()) + ")")
    if "resampled" in s:
        how.append(f"intervals resample the test {'documents' if s['resampled'] == 'documents' else 'units'}")
    if (s.get("context") or s.get("config", {}).get("context")) == "document":
        how.append("each sentence's features start from the LSTM state its document's previous sentence "
                   "ended with (--context document)")
    if how:
        text = "; ".join(how)
        lines += ["", text[0].upper() + text[1:] + "."]
    if "by_distance" in s:
        d = s["by_distance"]
        probes = [n for n in _inputs(s) if n in d]
        lines += ["", "By the distance to the gold head (words; accuracy %, mean over seeds):", "",
                  "| distance | words | " + " | ".join(probes) + " |", "|---|---|" + "---|" * len(probes)]
        for i, b in enumerate(d["buckets"]):
            vals = ["-" if d[n][i] is None else f"{100 * d[n][i]:.1f}" for n in probes]
            lines.append(f"| {b} | {d['words'][i]} | " + " | ".join(vals) + " |")
    if "mix_weights" in s:
        extra = f", gamma = {s['gamma']:.3f}" if "gamma" in s else ""
        if "mix_temperature" in s:
            extra = f", temperature = {s['mix_temperature']:.4f}"
        lines += ["", f"Mix weights softmax(s) = {[round(w, 3) for w in s['mix_weights']]}{extra}."]
    if task == "wsd" and "all_minus_dev" in s:
        lines += _wsd_paper_set(s)
    for who, d in (("trained", s), ("random-weights control", s.get("control_random", {}))):
        for name, r in d.get("paired", {}).items():
            lines += ["", f"Paired bootstrap {name.replace('E2-E1', 'E2 - E1')} ({who}): "
                      f"{100 * r['diff']:+.2f} [{100 * r['ci'][0]:+.2f}, {100 * r['ci'][1]:+.2f}] points."]
    lines += ["", f"![{task} per layer]({png})", ""] if plots else [""]
    order = _ordering_line(task, s)
    return lines + ([order, ""] if order else [])
