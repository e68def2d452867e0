#!/usr/bin/env python3
"""Prepare the embedded default model's corpus: cased, openly licensed text from ../shared/data,
one tokenised sentence per line. Never a test split.

    .venv/bin/python scripts/prepare_default_corpus.py OUT_DIR     # needs the elmo package (its CoNLL-U reader)

Writes OUT_DIR/train/*.txt (one shard per source) and OUT_DIR/valid.txt (UD EWT dev), and
OUT_DIR/SOURCES.md (sizes and licences, for the model card).

- MASC (masc_tagged.zip, NLTK package; "may be used for ... research, and development, including
  commercial development"): lines of word_TAG tokens -> words.
- UD English EWT v2.16 train (CC BY-SA 4.0): the FORM column (multiword-token ranges skipped).
- WikiText-2 valid (CC BY-SA 3.0): paragraphs split after sentence-final . ! ?; headings dropped;
  @-@ @,@ @.@ joined back to - , .; sentences containing <unk> dropped (not real text).
- WNUT-17 train (CC BY 4.0): token column of the CoNLL file.
Validation: UD EWT dev (CC BY-SA 4.0).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from torchelmo.probe.conll import read_conllu

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def masc():
    with zipfile.ZipFile(DATA / "text" / "masc_tagged.zip") as z:
        for name in sorted(z.namelist()):
            if not name.endswith(".txt") or name.endswith("categories.txt") or "README" in name:
                continue
            for line in z.read(name).decode("utf-8", errors="replace").splitlines():
                toks = [t.rsplit("_", 1)[0] for t in line.split() if "_" in t]
                toks = [t for t in toks if t]
                if toks:
                    yield toks


def conllu(path):
    # Syntactic words, as the POS probe reads them; a space inside a form (UD allows it) would
    # split the token in a one-sentence-per-line file.
    for s in read_conllu(path):
        yield [t.replace(" ", "_") for t in s.tokens]


def wikitext():
    fix = {"@-@": "-", "@,@": ",", "@.@": "."}
    for line in open(DATA / "lm" / "wikitext-2-valid-test" / "wiki.valid.tokens", encoding="utf-8"):
        toks = line.split()
        if not toks or toks[0] == "=":
            continue
        sent = []
        for t in toks:
            sent.append(fix.get(t, t))
            if t in (".", "!", "?"):
                yield sent
                sent = []
        if sent:
            yield sent


def wnut():
    sent = []
    for line in open(DATA / "ner" / "wnut17" / "wnut17train.conll", encoding="utf-8"):
        cols = line.rstrip("\n").split("\t")
        if not cols[0].strip():
            if sent:
                yield sent
            sent = []
        else:
            sent.append(cols[0].strip().replace(" ", "_"))
    if sent:
        yield sent


def write(path: Path, sents) -> tuple[int, int]:
    n_s = n_t = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in sents:
            if "<unk>" in s:
                continue
            f.write(" ".join(s) + "\n")
            n_s += 1
            n_t += len(s)
    return n_s, n_t


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "runs" / "default_corpus")
    (out / "train").mkdir(parents=True, exist_ok=True)
    ewt = DATA / "pos" / "ud-english-ewt"
    rows = []
    for name, sents, lic in [
        ("masc", masc(), "MASC (American National Corpus), permissive incl. commercial use"),
        ("ud_ewt_train", conllu(ewt / "en_ewt-ud-train.conllu"), "UD English EWT v2.16 train, CC BY-SA 4.0"),
        ("wikitext2_valid", wikitext(), "WikiText-2 valid, CC BY-SA 3.0"),
        ("wnut17_train", wnut(), "WNUT-17 train, CC BY 4.0"),
    ]:
        n_s, n_t = write(out / "train" / f"{name}.txt", sents)
        rows.append((name, n_s, n_t, lic))
        print(f"{name}: {n_s:,} sentences, {n_t:,} tokens", file=sys.stderr)
    n_s, n_t = write(out / "valid.txt", conllu(ewt / "en_ewt-ud-dev.conllu"))
    rows.append(("valid (ud_ewt_dev)", n_s, n_t, "UD English EWT v2.16 dev, CC BY-SA 4.0"))
    with open(out / "SOURCES.md", "w") as f:
        f.write("| shard | sentences | tokens | source, licence |\n|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r[0]} | {r[1]:,} | {r[2]:,} | {r[3]} |\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
