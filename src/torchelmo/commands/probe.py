"""``elmo probe pos|pos-wsj|deps|tag|wsd|ner|all|report``: layer probes of a frozen biLM, with controls.

Every task is run on the model and, unless ``--no-control``, on the control: the same architecture
with random weights (``--control-seed``). E0 (the context-free layer) is probed in every task, so
"E0 only" is always there too. Results accumulate in ``OUT/results.json`` (one key per task) and
``OUT/report.md`` + PNGs are rewritten after each task. ``--out`` has no default: the committed
report of this repository lives in ``results/probe``, and a run must not overwrite it by accident.
``elmo probe tag TRAIN TEST --column N`` runs the POS probe on any token-per-line file with a tag column.
Features are cached in ``--cache`` (default ``$ELMO_PROBE_CACHE``, else ``~/.cache/elmo/probe``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from ..errors import ElmoError
from ..runtime import apply_device_args, show_progress, show_summary
from . import probe_options as options

DATA_LAYOUT = {  # relative to --data (the layout of ../shared/data)
    "pos": ["pos/ud-english-ewt/en_ewt-ud-train.conllu", "pos/ud-english-ewt/en_ewt-ud-dev.conllu",
            "pos/ud-english-ewt/en_ewt-ud-test.conllu"],   # also the dependency probes' trees
    "treebank": "text/nltk/treebank.zip",
    "semcor": ["wsd/semcor/semcor.data.xml.gz", "wsd/semcor/semcor.gold.key.txt.gz"],
    "wsd_eval": "wsd/raganato-eval/Evaluation_Datasets/ALL/ALL.data.xml",
    "sense_index": "wsd/wordnet-sense-index/index.sense",
    "ner": ["ner/wnut17/wnut17train.conll", "ner/wnut17/emerging.dev.conll",
            "ner/wnut17/emerging.test.annotated"],
    "litbank": "coref/litbank",
}
ALL_TASKS = ("pos", "pos_xpos", "pos_wsj", "deps", "wsd", "coref", "ner")  # `elmo probe all`, in this order


def add_subcommand(sub) -> None:
    p = sub.add_parser("probe", help="probe what each biLM layer knows (POS, syntax, WSD, NER) with controls",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tasks = p.add_subparsers(dest="task", metavar="TASK", required=True)

    q = tasks.add_parser("pos", help="linear POS probes per layer + mix (CoNLL-U)")
    options.common_args(q), options.pos_args(q, True)
    q.set_defaults(func=lambda a: _run(a, ["pos"]))
    q = tasks.add_parser("pos-wsj", help="linear POS probes per layer + mix on the WSJ sample (PTB tags)")
    options.common_args(q), options.wsj_args(q), options.probe_args(q), options.data_arg(q, "--treebank")
    q.set_defaults(func=lambda a: _run(a, ["pos_wsj"]))
    q = tasks.add_parser("deps", help="dependency arc (UAS) and label probes per layer + mix (CoNLL-U)")
    options.common_args(q), options.ud_args(q, False), options.probe_args(q), options.data_arg(q, "--train/--dev/--test (UD EWT)")
    q.set_defaults(func=lambda a: _run(a, ["deps"]))
    q = tasks.add_parser("tag", help="linear tag probes per layer + mix on any token-per-line file")
    options.common_args(q)
    q.add_argument("tag_train", type=Path, metavar="TRAIN", help="training file: one token per line, "
                   "whitespace-separated columns, a blank line between sentences, '#' lines skipped")
    q.add_argument("tag_test", type=Path, metavar="TEST", help="test file, the same columns")
    q.add_argument("--column", type=int, required=True, help="0-based column of the tag to predict")
    q.add_argument("--token-column", type=int, default=0, help="0-based column of the token (default 0)")
    q.add_argument("--dev", dest="tag_dev", type=Path, metavar="FILE",
                   help="development file (default: the last 10%% of TRAIN's sentences)")
    q.add_argument("--name", help="results key tag:NAME (default: tag)")
    options.probe_args(q)
    q.set_defaults(func=lambda a: _run(a, [f"tag:{a.name}" if a.name else "tag"]))
    q = tasks.add_parser("wsd", help="1-NN WSD with SemCor sense vectors, per layer + mix")
    options.common_args(q), options.wsd_args(q, True)
    q.set_defaults(func=lambda a: _run(a, ["wsd"]))
    q = tasks.add_parser("coref", help="LitBank mention-pair coreference probes per layer + mix")
    options.common_args(q), options.coref_args(q), options.data_arg(q, "--litbank")
    q.set_defaults(func=lambda a: _run(a, ["coref"]))
    q = tasks.add_parser("ner", help="WNUT-17 BiLSTM tagger: mix vs E0 vs static embeddings")
    options.common_args(q), options.ner_args(q, True)
    q.set_defaults(func=lambda a: _run(a, ["ner"]))
    q = tasks.add_parser("all", help=f"{', '.join(ALL_TASKS)} on the data sets under --data")
    options.common_args(q), options.pos_args(q, False), options.wsj_args(q), options.wsd_args(q, False), options.coref_args(q), options.ner_args(q, False)
    q.add_argument("--data", type=Path, required=True,
                   help="folder in the layout of ../shared/data (pos/, text/nltk/, wsd/, ner/)")
    q.add_argument("--tasks", default=",".join(ALL_TASKS),
                   help=f"comma-separated subset (default {','.join(ALL_TASKS)}; deps reads --train/--dev/--test)")
    q.set_defaults(func=_run_all)
    q = tasks.add_parser("compare", help="several probing runs side by side, with what each shows")
    q.add_argument("runs", nargs="+", metavar="[LABEL[@TOKENS]=]FOLDER",
                   help="the folder of an elmo probe run (its results.json); LABEL names it in the "
                        "tables, TOKENS (training tokens read) orders one model's runs")
    q.add_argument("--out", type=Path, required=True, help="folder for comparison.md and comparison.json")
    q.add_argument("--decide", metavar="CANDIDATE:INCUMBENT",
                   help="also apply the rule for replacing a default model (better on most tasks, worse "
                        "beyond overlapping intervals on none) to two of the runs, by label")
    q.set_defaults(func=_compare)
    q = tasks.add_parser("report", help="rewrite report.md and the plots from OUT/results.json")
    q.add_argument("--out", type=Path, required=True, help="folder holding results.json")
    q.set_defaults(func=_report_only)


def default_cache_dir() -> Path:
    """``$ELMO_PROBE_CACHE`` if set and not empty, else ``~/.cache/elmo/probe``: one cache shared
    by every run, since features depend only on the model's weights and the data."""
    env = os.environ.get("ELMO_PROBE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "elmo" / "probe"


def _compare(args) -> int:
    from ..probe.compare import compare, parse_run, write
    path = write(compare([parse_run(r) for r in args.runs], args.decide), args.out)
    print(f"wrote {path}")
    return 0


def _report_only(args) -> int:
    from ..probe.report import load_results, render
    results = load_results(args.out / "results.json")
    if not results:
        raise ElmoError(f"{args.out / 'results.json'}: no results to report")
    print(render(results, args.out))
    return 0


def _run_all(args) -> int:
    d = args.data
    if not d.is_dir():
        raise ElmoError(f"{d}: no such data folder")
    _ud_defaults(args, d)
    args.treebank = args.treebank or d / DATA_LAYOUT["treebank"]
    args.semcor = args.semcor or d / DATA_LAYOUT["semcor"][0]
    if args.semcor_key is None and args.semcor == d / DATA_LAYOUT["semcor"][0]:
        args.semcor_key = d / DATA_LAYOUT["semcor"][1]
    args.eval = args.eval or d / DATA_LAYOUT["wsd_eval"]
    args.sense_index = args.sense_index or d / DATA_LAYOUT["sense_index"]
    args.litbank = args.litbank or d / DATA_LAYOUT["litbank"]
    args.ner_train = args.ner_train or d / DATA_LAYOUT["ner"][0]
    args.ner_dev = args.ner_dev or d / DATA_LAYOUT["ner"][1]
    args.ner_test = args.ner_test or d / DATA_LAYOUT["ner"][2]
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in ALL_TASKS]
    if bad or not tasks:
        raise ElmoError(f"--tasks: unknown task(s) {', '.join(bad) or '(none)'}; "
                        f"choose from {', '.join(ALL_TASKS)}")
    # Every input checked before the first task: a missing file should not surface an hour in.
    inputs = {"pos": [args.train, args.dev, args.test], "deps": [args.train, args.dev, args.test],
              "pos_xpos": [args.train, args.dev, args.test],
              "pos_wsj": [args.treebank], "wsd": [args.semcor, args.semcor_key, args.eval, args.sense_index],
              "ner": [args.ner_train, args.ner_dev, args.ner_test, *(args.corpus or [])],
              "coref": [args.litbank]}
    for t in tasks:
        for path in inputs[t]:
            folder = t == "coref"
            if path is not None and not (Path(path).is_dir() if folder else Path(path).is_file()):
                raise ElmoError(f"{path}: no such {'folder' if folder else 'file'} (needed by task {t}; leave it "
                                "out of --tasks or give it)")
    return _run(args, tasks)


def _ud_defaults(args, d: Path | None) -> None:
    """--train/--dev/--test not given: UD EWT under ``d`` (``--data``)."""
    for k, attr in enumerate(("train", "dev", "test")):
        if getattr(args, attr) is None:
            if d is None:
                raise ElmoError(f"--{attr}: give the CoNLL-U file, or --data for the one under it")
            setattr(args, attr, d / DATA_LAYOUT["pos"][k])


def _run(args, tasks: list[str]) -> int:
    from ..model.bilm import BiLM
    from ..probe.features import model_fingerprint, random_like
    from ..probe.report import load_results, render, write_results

    device = apply_device_args(args)
    cache = args.cache or default_cache_dir()
    model = BiLM.from_pretrained(args.model, precision=args.precision).to(device).eval()
    model.long_run = True   # whole data sets: backend auto may compile
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
        run = _tag if task.split(":")[0] == "tag" else RUNNERS[task]
        results[task] = run(args, models, cache)
        results[task]["seconds"] = round(time.time() - t0, 1)
        write_results(results_path, results)
        render(results, args.out)
        if show_summary(args):
            print(f"probe {task}: done in {time.time() - t0:.0f} s -> {results_path}")
    return 0


def _limits(lim: int | None) -> tuple:
    """``--limit N``: N training sentences, N/4 dev and test (None: all)."""
    return lim, lim and max(1, lim // 4), lim and max(1, lim // 4)


def _log(args):
    return print if show_summary(args) else (lambda m: None)


def _documents(sentences, what: str, flag: str) -> list[str]:
    """Each sentence's document (``sentences``: objects with ``.doc``), or one line naming ``flag``."""
    docs = [s.doc for s in sentences]
    missing = sum(1 for d in docs if not d)
    if missing:
        raise ElmoError(f"{what}: {flag}: {missing} of {len(docs)} sentences name no document "
                        "(CoNLL-U: '# newdoc id' or '# sent_id' comments)")
    return docs


def documents(args, test, task: str) -> list[str] | None:
    """Each test sentence's document for ``--resample documents`` (None: units are resampled)."""
    return _documents(test, f"{task} test", "--resample documents") if args.resample == "documents" else None


def context_documents(args, sentences, what: str) -> list[str] | None:
    """Each sentence's document under ``--context document`` (None: every sentence from the zero state)."""
    return _documents(sentences, what, "--context document") if args.context == "document" else None


def _tagging(args, models, cache, sets, task: str, log=print, features: str | None = None) -> dict:
    """The POS probe (:func:`~.pos.run_pos`) of each model on (train, dev, test) tagged sentences;
    features cached as ``{features or task}-{split}``."""
    from ..probe.features import extract
    from ..probe.pos import ProbeConfig, run_pos
    from ..probe.report import summarize_pos
    cfg = ProbeConfig(max_epochs=args.max_epochs, seed=args.seed, n_boot=args.n_boot, seeds=args.probe_seeds)
    groups = documents(args, sets[2], task)
    out = {}
    for name, m in models.items():
        if show_progress(args):
            print(f"{task}: {name} model")
        feats = [extract(m, [s.tokens for s in ss], cache, name=f"{features or task}-{split}",
                         max_tokens=args.max_tokens, progress=show_progress(args),
                         documents=context_documents(args, ss, f"{task} {split}"))
                 for ss, split in zip(sets, ("train", "dev", "test"))]
        out[name] = run_pos(*feats, tuple([s.tags for s in ss] for ss in sets), cfg, log=log, groups=groups,
                            label=f"tag:{args.name}" if task == "tag" and getattr(args, "name", None) else task)
    return {**summarize_pos(out["trained"], out.get("control_random")), "context": args.context}


def _pos(args, models, cache) -> dict:
    from ..probe.conll import read_conllu
    sets = [read_conllu(p, args.tagset, limit=n) for p, n in zip((args.train, args.dev, args.test),
                                                                 _limits(args.limit))]
    res = _tagging(args, models, cache, sets, "pos")
    res["data"] = {"train": str(args.train), "dev": str(args.dev), "test": str(args.test),
                   "tagset": args.tagset, "limit": args.limit}
    return res


def _pos_xpos(args, models, cache) -> dict:
    """UD EWT's PTB tags (XPOS): the paper's tag set on a test set eight times the WSJ sample's;
    the same words as ``pos``, so its features serve."""
    from ..probe.conll import read_conllu
    sets = [read_conllu(p, "xpos", limit=n) for p, n in zip((args.train, args.dev, args.test), _limits(args.limit))]
    res = _tagging(args, models, cache, sets, "pos_xpos", log=_log(args), features="pos")
    res["data"] = {"train": str(args.train), "dev": str(args.dev), "test": str(args.test), "tagset": "xpos",
                   "limit": args.limit}
    return res


def _pos_wsj(args, models, cache) -> dict:
    from ..probe.treebank import SPLITS, read_treebank
    if args.treebank is None:
        if getattr(args, "data", None) is None:
            raise ElmoError("--treebank: give NLTK's treebank.zip, or --data for the one under it")
        args.treebank = args.data / DATA_LAYOUT["treebank"]
    sets = [read_treebank(args.treebank, split, limit=n) for split, n in zip(SPLITS, _limits(args.limit))]
    res = _tagging(args, models, cache, sets, "wsj", log=_log(args))
    res["data"] = {"treebank": str(args.treebank), "limit": args.limit,
                   "splits": {k: f"wsj_{a:04d}-wsj_{b:04d}" for k, (a, b) in SPLITS.items()},
                   "sentences": [len(ss) for ss in sets], "tokens": "PTB codes unescaped (-LRB- -> (, `` -> \")"}
    return res


def _deps(args, models, cache) -> dict:
    from ..probe.conll import read_conllu_trees
    from ..probe.deps import DepsConfig, run_deps
    from ..probe.features import extract
    from ..probe.report import summarize_deps
    _ud_defaults(args, getattr(args, "data", None))
    sets = [read_conllu_trees(p, limit=n) for p, n in zip((args.train, args.dev, args.test), _limits(args.limit))]
    cfg = DepsConfig(max_epochs=args.max_epochs, seed=args.seed, n_boot=args.n_boot, seeds=args.probe_seeds)
    groups = documents(args, sets[2], "deps")
    out = {}
    for name, m in models.items():
        if show_progress(args):
            print(f"deps: {name} model")
        # Named like the POS probe's features: the same words, so one extraction serves both.
        feats = [extract(m, [s.tokens for s in ss], cache, name=f"pos-{split}", max_tokens=args.max_tokens,
                         progress=show_progress(args), documents=context_documents(args, ss, f"deps {split}"))
                 for ss, split in zip(sets, ("train", "dev", "test"))]
        out[name] = run_deps(*feats, tuple(sets), cfg, log=_log(args), groups=groups,
                             residual=bool(getattr(m.config, "use_skip_connections", False)))
    res = summarize_deps(out["trained"], out.get("control_random"))
    res["context"] = args.context
    for t in ("uas", "labels", "uuas", "uuas_hm"):
        res[t]["context"] = args.context
    res["data"] = {"train": str(args.train), "dev": str(args.dev), "test": str(args.test), "limit": args.limit}
    return res


def _coref(args, models, cache) -> dict:
    from ..probe.coref import CorefConfig, probe_coref
    from ..probe.report import summarize_coref
    folder = args.litbank
    if folder is None:
        if getattr(args, "data", None) is None:
            raise ElmoError("--litbank: give LitBank's coreference folder, or --data for the one under it")
        folder = args.data / DATA_LAYOUT["litbank"]
    cfg = CorefConfig(max_epochs=args.coref_epochs, seed=args.seed, n_boot=args.n_boot, seeds=args.probe_seeds,
                      documents=args.resample == "documents", context=args.coref_context or args.context)
    out = {}
    for name, m in models.items():
        if show_progress(args):
            print(f"coref: {name} model")
        out[name] = probe_coref(m, folder, cache, cfg, log=_log(args), progress=show_progress(args),
                                limit_docs=args.limit_docs)
    res = summarize_coref(out["trained"], out.get("control_random"))
    res["data"] = {"litbank": str(folder), "limit_docs": args.limit_docs,
                   "documents": out["trained"].get("documents")}
    return res


def _tag(args, models, cache) -> dict:
    from ..probe.conll import read_columns
    lim_tr, lim_dev, lim_te = _limits(args.limit)

    def read(path, n):
        return read_columns(path, args.column, args.token_column, limit=n)

    train, test = read(args.tag_train, lim_tr), read(args.tag_test, lim_te)
    if args.tag_dev is not None:
        dev, dev_from = read(args.tag_dev, lim_dev), str(args.tag_dev)
    else:
        if len(train) < 2:
            raise ElmoError(f"{args.tag_train}: {len(train)} sentence(s); without --dev the last 10% "
                            "of TRAIN is the dev set, so it needs at least 2")
        n_dev = max(1, round(len(train) / 10))
        train, dev = train[:-n_dev], train[-n_dev:]
        dev_from = f"the last {n_dev} of the {len(train) + n_dev} sentences of {args.tag_train}"
        if show_summary(args):
            print(f"tag: no --dev: {dev_from} are the dev set (training on the first {len(train)})")
    res = _tagging(args, models, cache, [train, dev, test], "tag", log=_log(args))
    res["data"] = {"train": str(args.tag_train), "dev": dev_from, "test": str(args.tag_test),
                   "column": args.column, "token_column": args.token_column, "limit": args.limit,
                   "sentences": [len(train), len(dev), len(test)]}
    return res


def _wsd(args, models, cache) -> dict:
    from ..probe.features import extract
    from ..probe.report import summarize_wsd
    from ..probe.wsd import read_raganato, read_sense_index, run_wsd
    semcor = read_raganato(args.semcor, args.semcor_key, limit=args.limit_semcor)
    test = read_raganato(args.eval)
    first = read_sense_index(args.sense_index)
    out = {}
    for name, m in models.items():
        if show_progress(args):
            print(f"wsd: {name} model")
        f_tr = extract(m, semcor.sentences, cache, spans=semcor.spans, name="wsd-semcor",
                       max_tokens=args.max_tokens, progress=show_progress(args),
                       documents=_wsd_documents(args, semcor))
        f_te = extract(m, test.sentences, cache, spans=test.spans, name="wsd-eval",
                       max_tokens=args.max_tokens, progress=show_progress(args),
                       documents=_wsd_documents(args, test))
        out[name] = run_wsd(semcor, f_tr, test, f_te, first, dev_prefix=args.dev_prefix,
                            n_boot=args.n_boot, seed=args.seed, mix_epochs=args.mix_epochs,
                            documents=args.resample == "documents")
    res = summarize_wsd(out["trained"], out.get("control_random"))
    res["context"] = args.context
    res["data"] = {"semcor": str(args.semcor), "eval": str(args.eval), "sense_index": str(args.sense_index),
                   "dev_prefix": args.dev_prefix, "limit_semcor": args.limit_semcor}
    return res




def _wsd_documents(args, corpus) -> list[str] | None:
    """Each sentence's ``<text>`` under ``--context document``."""
    if args.context != "document":
        return None
    missing = sum(1 for d in corpus.documents if not d)
    if missing or len(corpus.documents) != len(corpus.sentences):
        raise ElmoError(f"{corpus.path}: --context document: {missing or len(corpus.sentences)} sentences "
                        "outside a <text id=...>")
    return corpus.documents


def _ner(args, models, cache) -> dict:
    from ..probe.conll import read_conll
    from ..probe.features import extract
    from ..probe.ner import TaggerConfig, run_ner, train_static_embeddings
    from ..probe.report import summarize_ner
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
            inputs["top"] = tuple(x[-1:] for x in layers)
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
    res = summarize_ner(run_ner(inputs, offsets, tuple([s.tags for s in ss] for ss in sets), cfg,
                                seeds=args.ner_seeds))
    res["static_embeddings"] = static_info
    res["context"] = "sentence"   # WNUT-17 names no documents: per sentence under any --context
    res["data"] = {"train": str(args.ner_train), "dev": str(args.ner_dev), "test": str(args.ner_test),
                   "limit": lim}
    return res


RUNNERS = {"pos": _pos, "pos_xpos": _pos_xpos, "pos_wsj": _pos_wsj, "deps": _deps, "wsd": _wsd, "coref": _coref, "ner": _ner}
