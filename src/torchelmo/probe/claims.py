"""The layer claims, by the source that makes them, and a probing run's verdict on each.

ELMo's layer story reaches readers from three kinds of source, which do not say the same thing
(``docs/science.md``, "Expectations by source"):

- ``paper``: Peters et al. (2018) itself: WSD in E2 (Table 5), POS in E1 (Table 6), the
  coreference model's learned mix favouring the first biLSTM layer (section 5.5), and a task's mix
  of all layers beating the top layer alone (Table 2);
- ``textbook``: the summary this project started from: syntax (POS, dependencies) low, semantics
  (word sense, coreference) high;
- ``literature``: later probing work: Liu et al. (2019) and Hewitt & Manning (2019) find ELMo's
  first layer best for POS and dependencies; Peters et al. (2018b) find coreference high in deeper
  biLMs.

A claim is one of three kinds, each judged only where an interval (or every probe seed) agrees:

- ``order``: ``better`` beats ``worse`` among E1/E2, by the paired bootstrap interval of E2 - E1;
- ``weight``: the task's learned mix puts more weight on ``better`` than on ``worse`` in every
  probe seed, of at least :data:`MIN_SEEDS` (the weights have no bootstrap interval; the seeds
  are the evidence);
- ``pair``: the NER tagger on ``better`` beats it on ``worse``, by the paired interval of their
  difference.

Verdicts: ``shown``, ``reversed`` (the evidence excludes the claim the other way), ``not shown``
(it does not exclude either), ``not tested`` (the run lacks what the claim needs).
"""

from __future__ import annotations

from dataclasses import dataclass

from .common import task_sections

# Probe seeds a mix-weight verdict needs: one seed's weights could be any optimisation's accident.
MIN_SEEDS = 3
SOURCES = {"paper": "Peters et al. 2018", "textbook": "textbook summary",
           "literature": "later literature"}


@dataclass(frozen=True)
class Claim:
    source: str     # a key of SOURCES
    task: str       # a section of the results: pos, pos_xpos, pos_wsj, deps_uas, deps_labels, deps_uuas, wsd, coref, ner
    kind: str       # order | weight | pair
    better: str
    worse: str
    cite: str

    @property
    def text(self) -> str:
        if self.kind == "weight":
            return f"the mix leans on {self.better} over {self.worse}"
        return f"{self.better} > {self.worse}"


_POS = ("pos", "pos_xpos", "pos_wsj")
_DEPS = ("deps_uas", "deps_labels", "deps_uuas", "deps_uuas_hm")
CLAIMS: tuple[Claim, ...] = (
    Claim("paper", "wsd", "order", "E2", "E1", "Table 5"),
    *(Claim("paper", t, "order", "E1", "E2", "Table 6") for t in _POS),
    Claim("paper", "coref", "weight", "E1", "E2", "section 5.5"),
    Claim("paper", "ner", "pair", "mix", "top", "Table 2"),
    Claim("textbook", "wsd", "order", "E2", "E1", "semantics high"),
    *(Claim("textbook", t, "order", "E1", "E2", "syntax low") for t in _POS + _DEPS),
    Claim("textbook", "coref", "order", "E2", "E1", "semantics high"),
    *(Claim("literature", t, "order", "E1", "E2", "Liu et al. 2019") for t in _POS),
    *(Claim("literature", t, "order", "E1", "E2", "Liu et al. 2019; Hewitt & Manning 2019") for t in _DEPS),
    Claim("literature", "coref", "order", "E2", "E1", "Peters et al. 2018b"),
)


def _paired(section: dict, name: str) -> dict | None:
    """``name`` (``"E2-E1"``, ``"mix-top"``) from a section's paired intervals; WSD's on the
    paper's evaluation set (Raganato's test sets without SemEval-2007), else on ALL."""
    paired = section.get("paired", {})
    return paired.get(name, paired.get(f"{name} all_minus_dev", paired.get(f"{name} all")))


def verdict(claim: Claim, section: dict | None) -> dict:
    """``{"verdict", "evidence"}`` of one run's ``section`` (its summary of ``claim.task``, as
    results.json holds it; None when the run lacks the task)."""
    if section is None:
        return {"verdict": "not tested", "evidence": "task not run"}
    if claim.kind == "weight":
        seeds = section.get("details", {}).get("trained", {}).get("mix", {}).get("seed_weights")
        if seeds is None and section.get("mix_weights") is not None:
            seeds = [section["mix_weights"]]
        if not seeds:
            return {"verdict": "not tested", "evidence": "no mix"}
        b, w = int(claim.better[1:]), int(claim.worse[1:])
        ahead = sum(s[b] > s[w] for s in seeds)
        v = "shown" if ahead == len(seeds) else "reversed" if ahead == 0 else "not shown"
        if len(seeds) < MIN_SEEDS:
            v = "not shown"
        mean = [sum(s[k] for s in seeds) / len(seeds) for k in (b, w)]
        return {"verdict": v, "evidence": f"{claim.better} {mean[0]:.2f} vs {claim.worse} {mean[1]:.2f}, "
                                          f"{claim.better} ahead in {ahead} of {len(seeds)} seeds"
                                          + (f" (fewer than {MIN_SEEDS}: no verdict)" if len(seeds) < MIN_SEEDS else "")}
    lo_hi = ("E1", "E2") if claim.kind == "order" else (claim.worse, claim.better)
    name = f"{lo_hi[1]}-{lo_hi[0]}"
    p = _paired(section, name)
    if p is None:
        return {"verdict": "not tested", "evidence": f"no paired {name.replace('-', ' - ')}"}
    lo, hi = p["ci"]
    winner = lo_hi[1] if lo > 0 else lo_hi[0] if hi < 0 else None
    v = "not shown" if winner is None else "shown" if winner == claim.better else "reversed"
    return {"verdict": v, "evidence": f"{name.replace('-', ' - ')} {100 * p['diff']:+.2f} "
                                      f"[{100 * lo:+.2f}, {100 * hi:+.2f}]"}


def sections(results: dict) -> dict[str, dict]:
    """The per-layer sections of ``results`` (:func:`~.common.task_sections`, ``deps`` split into
    its three probes) and NER's."""
    return dict(task_sections(results)) | ({"ner": results["ner"]} if "ner" in results else {})


def judge(results: dict) -> list[dict]:
    """Every claim whose task ``results`` ran, with its verdict."""
    have = sections(results)
    return [{"source": c.source, "task": c.task, "claim": c.text, "cite": c.cite, **verdict(c, have[c.task])}
            for c in CLAIMS if c.task in have]
