"""``elmo probe pos|wsd|ner|all|report``: layer probes of a frozen biLM, with controls.

Every task is run on the model and, unless ``--no-control``, on the control: the same architecture
with random weights (``--control-seed``). E0 (the context-free layer) is probed in every task, so
"E0 only" is always there too. Results accumulate in ``OUT/results.json`` (one key per task) and
``OUT/report.md`` + PNGs are rewritten after each task. ``--out`` has no default: the committed
report of this repository lives in ``results/probe``, and a run must not overwrite it by accident.
Features are cached in ``--cache`` (default ``$ELMO_PROBE_CACHE``, else ``~/.cache/elmo/probe``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..errors import ElmoError
from ..precision import CHOICES as PRECISION_CHOICES, PRECISION_HELP
from ..runtime import add_device_args, add_quiet_args, apply_device_args, show_progress, show_summary

DATA_LAYOUT = {  # relative to --data (the layout of ../shared/data)
    "pos": ["pos/ud-english-ewt/en_ewt-ud-train.conllu", "pos/ud-english-ewt/en_ewt-ud-dev.conllu",
            "pos/ud-english-ewt/en_ewt-ud-test.conllu"],
    "semcor": ["wsd/semcor/semcor.data.xml.gz", "wsd/semcor/semcor.gold.key.txt.gz"],
    "wsd_eval": "wsd/raganato-eval/Evaluation_Datasets/ALL/ALL.data.xml",
    "sense_index": "wsd/wordnet-sense-index/index.sense",
    "ner": ["ner/wnut17/wnut17train.conll", "ner/wnut17/emerging.dev.conll",
            "ner/wnut17/emerging.test.annotated"],
}


def add_subcommand(sub) -> None:
    p = sub.add_parser("probe", help="probe what each biLM layer knows (POS, WSD, NER) with controls",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)

    def common(q):
        q.add_argument("--model", required=True, help="model directory or published name")
        q.add_argument("--out", type=Path, required=True,
                       help="output folder for results.json, report.md and the plots (required: "
                            "there is no default, so no run overwrites a committed report)")
        q.add_argument("--cache", type=Path, help="feature cache folder (default $ELMO_PROBE_CACHE, "
                                                  "else ~/.cache/elmo/probe)")
        q.add_argument("--no-control", action="store_true", help="skip the random-weights control")
        q.add_argument("--control-seed", type=int, default=0,
                       help="seed of the random-weights control model (default 0)")
        q.add_argument("--seed", type=int, default=0, help="seed of the probes' training (default 0)")
        add_device_args(q)
        q.add_argument("--precision", choices=PRECISION_CHOICES, default="fp32", help=PRECISION_HELP)
        q.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per biLM batch")
        q.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples")
        add_quiet_args(q)

    def pos_args(q, required):
        q.add_argument("--train", type=Path, required=required, help="CoNLL-U training file")
        q.add_argument("--dev", type=Path, required=required, help="CoNLL-U development file")
        q.add_argument("--test", type=Path, required=required, help="CoNLL-U test file")
        q.add_argument("--tagset", choices=["upos", "xpos"], default="upos",
                       help="which tag column to predict (default upos)")
        q.add_argument("--limit", type=int, help="use the first N training sentences (and N/4 dev/test)")
        q.add_argument("--max-epochs", type=int, default=40,
                       help="probe training epochs at most (default 40)")

    def wsd_args(q, required):
        q.add_argument("--semcor", type=Path, required=required, help="SemCor *.data.xml[.gz]")
        q.add_argument("--semcor-key", type=Path, help="its gold keys (default: beside it)")
        q.add_argument("--eval", type=Path, required=required, help="Raganato ALL.data.xml (keys beside)")
        q.add_argument("--sense-index", type=Path, required=required, help="WordNet 3.0 index.sense")
        q.add_argument("--dev-prefix", default="semeval2007.", help="ids of the dev part of --eval")
        q.add_argument("--limit-semcor", type=int, help="use the first N SemCor sentences")
        q.add_argument("--mix-epochs", type=int, default=4,
                       help="epochs of learning the scalar mix of the layers (default 4)")

    def ner_args(q, required):
        q.add_argument("--ner-train", type=Path, required=required, help="WNUT-17 training CoNLL")
        q.add_argument("--ner-dev", type=Path, required=required, help="WNUT-17 development CoNLL")
        q.add_argument("--ner-test", type=Path, required=required, help="WNUT-17 test CoNLL")
        q.add_argument("--corpus", nargs="+", type=Path,
                       help="text the biLM was trained on (one sentence per line), for the static "
                            "SVD-PPMI embeddings; without it the static baseline is skipped")
        q.add_argument("--static-dim", type=int, default=300,
                       help="dimension of the static SVD-PPMI embeddings (default 300)")
        q.add_argument("--ner-limit", type=int, help="first N training sentences (and N/3 dev/test)")
        q.add_argument("--ner-epochs", type=int, default=30,
                       help="tagger training epochs at most (default 30)")

    q = tasks.add_parser("pos", help="linear POS probes per layer + mix (CoNLL-U)")
    common(q), pos_args(q, True)
    q.set_defaults(func=lambda a: _run(a, ["pos"]))
    q = tasks.add_parser("wsd", help="1-NN WSD with SemCor sense vectors, per layer + mix")
    common(q), wsd_args(q, True)
    q.set_defaults(func=lambda a: _run(a, ["wsd"]))
    q = tasks.add_parser("ner", help="WNUT-17 BiLSTM tagger: mix vs E0 vs static embeddings")
    common(q), ner_args(q, True)
    q.set_defaults(func=lambda a: _run(a, ["ner"]))
    q = tasks.add_parser("all", help="pos, wsd and ner on the data sets under --data")
    common(q), pos_args(q, False), wsd_args(q, False), ner_args(q, False)
    q.add_argument("--data", type=Path, required=True,
                   help="folder in the layout of ../shared/data (pos/, wsd/, ner/)")
    q.add_argument("--tasks", default="pos,wsd,ner", help="comma-separated subset")
    q.set_defaults(func=_run_all)
    q = tasks.add_parser("report", help="rewrite report.md and the plots from OUT/results.json")
    q.add_argument("--out", type=Path, required=True, help="folder holding results.json")
    q.set_defaults(func=_report_only)


def default_cache_dir() -> Path:
    """``$ELMO_PROBE_CACHE`` if set and not empty, else ``~/.cache/elmo/probe``: one cache shared
    by every run, since features depend only on the model's weights and the data."""
    env = os.environ.get("ELMO_PROBE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "elmo" / "probe"


def _report_only(args) -> int:
    from .report import load_results, render
    results = load_results(args.out / "results.json")
    if not results:
        raise ElmoError(f"{args.out / 'results.json'}: no results to report")
    print(render(results, args.out))
    return 0


def _run_all(args) -> int:
    d = args.data
    if not d.is_dir():
        raise ElmoError(f"{d}: no such data folder")
    args.train = args.train or d / DATA_LAYOUT["pos"][0]
    args.dev = args.dev or d / DATA_LAYOUT["pos"][1]
    args.test = args.test or d / DATA_LAYOUT["pos"][2]
    args.semcor = args.semcor or d / DATA_LAYOUT["semcor"][0]
    if args.semcor_key is None and args.semcor == d / DATA_LAYOUT["semcor"][0]:
        args.semcor_key = d / DATA_LAYOUT["semcor"][1]
    args.eval = args.eval or d / DATA_LAYOUT["wsd_eval"]
    args.sense_index = args.sense_index or d / DATA_LAYOUT["sense_index"]
    args.ner_train = args.ner_train or d / DATA_LAYOUT["ner"][0]
    args.ner_dev = args.ner_dev or d / DATA_LAYOUT["ner"][1]
    args.ner_test = args.ner_test or d / DATA_LAYOUT["ner"][2]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in ("pos", "wsd", "ner")]
    if bad or not tasks:
        raise ElmoError(f"--tasks: unknown task(s) {', '.join(bad) or '(none)'}; choose from pos, wsd, ner")
    return _run(args, tasks)


def _run(args, tasks: list[str]) -> int:
    from ..bilm import BiLM
    from .features import model_fingerprint, random_like
    from .report import load_results, render, write_results

    device = apply_device_args(args)
    cache = args.cache or default_cache_dir()
    model = BiLM.from_pretrained(args.model, precision=args.precision).to(device).eval()
    models = {"trained": model}
    if not args.no_control:
        models["control_random"] = random_like(model, args.control_seed)
    results_path = args.out / "results.json"
    results = load_results(results_path)
    results["model"] = {"path": str(args.model), "fingerprint": model_fingerprint(model),
                        "parameters": sum(p.numel() for p in model.parameters()),
                        "options": model.config.to_options(), "control_seed": args.control_seed,
                        "precision": model.resolved_precision().name}
    for task in tasks:
        t0 = time.time()
        results[task] = {"pos": _pos, "wsd": _wsd, "ner": _ner}[task](args, models, cache)
        results[task]["seconds"] = round(time.time() - t0, 1)
        write_results(results_path, results)
        render(results, args.out)
        if show_summary(args):
            print(f"probe {task}: done in {time.time() - t0:.0f} s -> {results_path}")
    return 0


def _pos(args, models, cache) -> dict:
    from .conll import read_conllu
    from .features import extract
    from .pos import ProbeConfig, run_pos
    from .report import summarize_pos
    lim = args.limit
    sets = [read_conllu(p, args.tagset, limit=n) for p, n in
            ((args.train, lim), (args.dev, lim and max(1, lim // 4)), (args.test, lim and max(1, lim // 4)))]
    cfg = ProbeConfig(max_epochs=args.max_epochs, seed=args.seed, n_boot=args.n_boot)
    out = {}
    for name, m in models.items():
        if show_progress(args):
            print(f"pos: {name} model")
        feats = [extract(m, [s.tokens for s in ss], cache, name=f"pos-{split}", max_tokens=args.max_tokens,
                         progress=show_progress(args)) for ss, split in zip(sets, ("train", "dev", "test"))]
        out[name] = run_pos(*feats, tuple([s.tags for s in ss] for ss in sets), cfg)
    res = summarize_pos(out["trained"], out.get("control_random"))
    res["data"] = {"train": str(args.train), "dev": str(args.dev), "test": str(args.test),
                   "tagset": args.tagset, "limit": lim}
    return res


def _wsd(args, models, cache) -> dict:
    from .features import extract
    from .report import summarize_wsd
    from .wsd import read_raganato, read_sense_index, run_wsd
    semcor = read_raganato(args.semcor, args.semcor_key, limit=args.limit_semcor)
    test = read_raganato(args.eval)
    first = read_sense_index(args.sense_index)
    out = {}
    for name, m in models.items():
        if show_progress(args):
            print(f"wsd: {name} model")
        f_tr = extract(m, semcor.sentences, cache, spans=semcor.spans, name="wsd-semcor",
                       max_tokens=args.max_tokens, progress=show_progress(args))
        f_te = extract(m, test.sentences, cache, spans=test.spans, name="wsd-eval",
                       max_tokens=args.max_tokens, progress=show_progress(args))
        out[name] = run_wsd(semcor, f_tr, test, f_te, first, dev_prefix=args.dev_prefix,
                            n_boot=args.n_boot, seed=args.seed, mix_epochs=args.mix_epochs)
    res = summarize_wsd(out["trained"], out.get("control_random"))
    res["data"] = {"semcor": str(args.semcor), "eval": str(args.eval), "sense_index": str(args.sense_index),
                   "dev_prefix": args.dev_prefix, "limit_semcor": args.limit_semcor}
    return res


def _ner(args, models, cache) -> dict:
    from .conll import read_conll
    from .features import extract
    from .ner import TaggerConfig, run_ner, train_static_embeddings
    from .report import summarize_ner
    lim = args.ner_limit
    sets = [read_conll(p, limit=n) for p, n in
            ((args.ner_train, lim), (args.ner_dev, lim and max(1, lim // 3)),
             (args.ner_test, lim and max(1, lim // 3)))]
    sents = [[s.tokens for s in ss] for ss in sets]
    inputs, offsets = {}, None
    for name, m in models.items():
        feats = [extract(m, ss, cache, name=f"ner-{split}", max_tokens=args.max_tokens,
                         progress=show_progress(args)) for ss, split in zip(sents, ("train", "dev", "test"))]
        offsets = tuple(f.offsets for f in feats)
        layers = tuple(f.all_layers() for f in feats)
        if name == "trained":
            inputs["mix"] = layers
            inputs["E0"] = tuple(x[:1] for x in layers)
        else:
            inputs[f"{name}_mix"] = layers
    static_info = None
    if args.corpus:
        emb = train_static_embeddings(args.corpus, dim=args.static_dim, cache_dir=cache, seed=args.seed)
        looked = [emb.lookup(ss) for ss in sents]
        inputs["static"] = tuple(v[None] for v, _ in looked)
        static_info = {"corpus": [str(c) for c in args.corpus], "vocabulary": len(emb.words),
                       "dim": int(emb.vectors.shape[1]), "oov_rate": [o for _, o in looked]}
    elif show_summary(args):
        print("ner: no --corpus given: the static-embedding baseline is skipped")
    cfg = TaggerConfig(max_epochs=args.ner_epochs, seed=args.seed, n_boot=args.n_boot)
    res = summarize_ner(run_ner(inputs, offsets, tuple([s.tags for s in ss] for ss in sets), cfg))
    res["static_embeddings"] = static_info
    res["data"] = {"train": str(args.ner_train), "dev": str(args.ner_dev), "test": str(args.ner_test),
                   "limit": lim}
    return res
