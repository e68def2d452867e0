"""The options of ``elmo probe``'s tasks, one group per kind of input (a task's parser takes the
groups it needs)."""

from __future__ import annotations

from pathlib import Path

from ..numerics.precision import CHOICES as PRECISION_CHOICES
from ..numerics.precision import PRECISION_HELP
from ..runtime import add_device_args, add_quiet_args, positive_int


def common_args(q):
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
    q.add_argument("--probe-seeds", type=positive_int, default=1,
                   help="probes trained per layer, seeds --seed .. --seed + N - 1; each score is their "
                        "mean, with the spread over seeds (default 1; POS, tags, dependencies and coreference)")
    q.add_argument("--resample", choices=["units", "documents"], default="units",
                   help="what the bootstrap draws: the test units (sentences, WSD instances, "
                        "coreference mentions) or the documents that hold them (novels for "
                        "coreference), where the data names them (default units)")
    q.add_argument("--context", choices=["sentence", "document"], default="sentence",
                   help="each sentence's features from the zero state (default), or from the LSTM state "
                        "its document's previous sentence ended with, as AllenNLP's stateful ELMo runs "
                        "(POS, dependencies, WSD, coreference; WNUT-17 names no documents, so NER stays "
                        "per sentence)")
    add_quiet_args(q)


def probe_args(q):
    q.add_argument("--limit", type=int, help="use the first N training sentences (and N/4 dev/test)")
    q.add_argument("--max-epochs", type=int, default=40,
                   help="probe training epochs at most (default 40)")


def ud_args(q, required):
    q.add_argument("--train", type=Path, required=required, help="CoNLL-U training file")
    q.add_argument("--dev", type=Path, required=required, help="CoNLL-U development file")
    q.add_argument("--test", type=Path, required=required, help="CoNLL-U test file")


def pos_args(q, required):
    ud_args(q, required)
    q.add_argument("--tagset", choices=["upos", "xpos"], default="upos",
                   help="which tag column to predict (default upos)")
    probe_args(q)


def wsj_args(q):
    q.add_argument("--treebank", type=Path,
                   help="NLTK's treebank.zip (the WSJ sample; default: under --data)")


def coref_args(q):
    q.add_argument("--litbank", type=Path, help="LitBank's coreference folder (*_brat.conll; default: "
                                                "under --data)")
    q.add_argument("--limit-docs", type=int, help="use a part of each split's novels (at least one each)")
    q.add_argument("--coref-epochs", type=int, default=20, help="probe training epochs at most (default 20)")
    q.add_argument("--coref-context", choices=["sentence", "document"],
                   help="--context for coreference alone (default: --context)")


def data_arg(q, what):
    q.add_argument("--data", type=Path, help=f"folder in the layout of ../shared/data: {what} "
                                             "default to the files under it")


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
    q.add_argument("--ner-seeds", type=positive_int, default=1,
                   help="taggers trained per input, seeds --seed .. --seed + N - 1; the scores "
                        "are their mean, with the spread over seeds (default 1)")
