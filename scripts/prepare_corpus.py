#!/usr/bin/env python3
"""Prepare the training corpus of a stronger biLM: ~18M tokens of cased, openly usable English from
../shared/data, one PTB-tokenised sentence per line, de-duplicated, with every probe's evaluation
text held out.

    .venv/bin/python scripts/prepare_corpus.py OUT_DIR [--data DIR]   # needs nltk (extra "corpus")

Writes OUT_DIR/sources/<source>.txt (one file per source, in document order), OUT_DIR/train/
shard-NN.txt (the training text: every source's sentences spread over SHARDS files at random, so
that each shard is a sample of the whole corpus), OUT_DIR/valid.txt (whole held-out documents),
OUT_DIR/counts.json (sentences and tokens per source, shard and split, and everything dropped) and
OUT_DIR/SOURCES.md (sizes and licences), and prints the counts. ``--reshard`` only redoes the
shards from OUT_DIR/sources.

The trainer streams a corpus file by file (shuffling the file order and the sentences within a
file), so files that each held one source would train on one domain at a time, novels for hours,
then reviews; the held-out perplexity would follow the current domain rather than the model. A source
or hold-out set missing under DIR is skipped with a note. Needs the torchelmo package (its
CoNLL-U reader) and nltk (its regex word tokenizer; no NLTK data is downloaded).

Sources, in this order (licences as ../shared/data/README.md gives them):
- litbank_novels: the 100 LitBank novels (Project Gutenberg editions; public domain in the US),
  raw text; Gutenberg header/footer stripped if present, chapter headings and [Illustration]
  lines dropped, _italics_ underscores removed.
- brown (non-commercial), masc (permissive): NLTK's tagged packages, tags stripped.
- ud_ewt_train (CC BY-SA 4.0): the FORM column (syntactic words).
- wikitext2_valid, wikitext2_test (CC BY-SA 3.0): headings dropped, @-@ @,@ @.@ joined with
  their neighbours ("17 @,@ 808" -> "17,808", "guest @-@ starring" -> "guest-starring"),
  sentences with <unk> dropped. Both are training text
  here, so neither can serve as a clean perplexity benchmark for a model trained on this corpus.
- nltk_abc, nltk_inaugural, nltk_movie_reviews, nltk_product_reviews_1, nltk_product_reviews_2,
  nltk_state_union, nltk_webtext (NLTK packages; research use, public domain for the speeches):
  each line a paragraph (a sentence in abc, movie_reviews and the product reviews, whose feature
  annotations and titles are dropped). movie_reviews and product_reviews_1 are lower-cased
  at source.

Held out, never in train or valid:
- by position: each novel's LitBank-annotated opening (coref/litbank/*_brat.conll, the coreference
  probe's text). Its tokens' characters are aligned with the novel's (whitespace ignored); every
  paragraph up to the one where they end, plus the next paragraph, is dropped.
- by source: NLTK treebank (the WSJ sample), UD EWT dev/test and WNUT-17 dev/test are never read
  as text.
- by match: any sentence whose normalised characters (tokens joined without spaces, so a
  different tokenisation still matches) equal a sentence of UD EWT dev or test, the NLTK treebank,
  the WSD evaluation sets (wsd/raganato-eval), the LitBank openings or WNUT-17 dev or test.
- by document: a document with at least 2, and at least 5% of its sentences, matches of 8+
  tokens is that evaluation text under another name (MASC ships 34 of the treebank sample's WSJ
  files; Brown cl23 is Senseval-3 text) and is dropped whole, since its other sentences, split
  or tokenised differently, would not match.
Validation: the whole documents VALID_DOCS names (a fixed list: two novels, four Brown files, two
State of the Union and two inaugural addresses, 20 movie reviews, one webtext file; ~1.3% of the
tokens). They are written first; train then drops any sentence already in valid.

Text policy:
- Unicode NFC; curly and typewriter quotes mapped to ASCII: double quotes (“ ” „ « » `` '') to
  ", single quotes and apostrophes (‘ ’ ‚ ` ´) to '; the ellipsis character to "..."; exotic
  spaces to spaces; soft hyphens and zero-width characters removed; dashes kept as written.
- Raw text is split into sentences by rule (below) and tokenised with NLTK's NLTKWordTokenizer
  (PTB regexes: punctuation split off, "don't" -> "do n't", "John's" -> "John 's", "cannot" ->
  "can not"), its `` and '' turned back into ". Already tokenised sources keep their tokens, with
  the same character mapping, PTB bracket codes (-LRB- ...) turned back into brackets, clitics
  split PTB-style where the source did not (Brown: "didn't" -> "did n't"; WikiText and
  product_reviews_1: "don 't" -> "do n't"), and tokens made only of underscores dropped.
- Sentence splitter: a boundary after . ! ? (and any closing quotes or brackets) where the next
  word (after any opening quotes or brackets) starts upper-case, except after a title
  abbreviation (Mr. Mrs. Dr. St. ...), a single-letter initial (not "I") or a dotted
  abbreviation (U.S. e.g. p.m.). A lower-case word after "!" or "?" ('"Oh!" said he') continues
  the sentence. Paragraphs never join.
- Sentences over MAX_TOKENS (250) tokens are dropped, not split (mostly unpunctuated passages).
- De-duplication: exact, on the space-joined normalised tokens, across all sources and both
  splits; the first occurrence is kept (valid, then the sources in the order above).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import html
import json
import random
import re
import sys
import time
import unicodedata
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
MAX_TOKENS = 250
SHARDS = 20          # ~0.9M tokens each: every shard is read whole into one shuffle block
SHARD_SEED = 0
# A document is evaluation text under another name, and dropped whole, when at least 2 and at
# least this share of its sentences are hold-out sentences of at least this many tokens.
CONTAMINATION_SHARE = 0.05
CONTAMINATION_MIN_TOKENS = 8

Sentences = Iterable[list[str]]
Want = Callable[[str], bool]

# Whole documents for validation, as fnmatch patterns on each source's document ids.
VALID_DOCS = {
    "litbank_novels": ["105_persuasion", "120_treasure_island"],
    "brown": ["brown/ca01", "brown/cf01", "brown/cn01", "brown/cp01"],
    "nltk_inaugural": ["inaugural/1861-Lincoln.txt", "inaugural/2009-Obama.txt"],
    "nltk_movie_reviews": ["movie_reviews/neg/cv00?_*", "movie_reviews/pos/cv00?_*"],
    "nltk_state_union": ["state_union/1962-Kennedy.txt", "state_union/1997-Clinton.txt"],
    "nltk_webtext": ["webtext/grail.txt"],
}


# ---------------------------------------------------------------------------------------------
# Normalisation, sentence splitting, tokenisation

_CHAR_MAP = str.maketrans({
    **dict.fromkeys("“”„‟«»", '"'),
    **dict.fromkeys("‘’‚‛`´", "'"),
    "…": "...",
    **dict.fromkeys("\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                    "\u202f\u205f\u3000", " "),
    **dict.fromkeys("\u00ad\u200b\u200c\u200d\u2060\ufeff", None),
})
_PTB_CODES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}",
              "''": '"'}  # `` is '' once ` is mapped to '
_CLITIC = re.compile(r"^(.*[A-Za-z])(n't|N'T|'s|'S|'m|'M|'d|'D|'ll|'LL|'re|'RE|'ve|'VE)$")
_S_POSSESSIVE = re.compile(r"^(.*[A-Za-z][sS])(')$")  # "Jones'" -> "Jones '"
_ITALICS = re.compile(r"(?<![^\W_])_+(?=[^\W_])|(?<=[^\W_])_+(?![^\W_])")  # Gutenberg _word_
_WS = re.compile(r"\s+")


def clean_text(s: str) -> str:
    """NFC, ASCII quotes, single spaces."""
    return _WS.sub(" ", unicodedata.normalize("NFC", s).translate(_CHAR_MAP)).strip()


def split_clitics(tok: str) -> list[str]:
    if "'" not in tok:
        return [tok]
    m = _CLITIC.match(tok) or _S_POSSESSIVE.match(tok)
    return [m.group(1), m.group(2)] if m else [tok]


_NEGATED = frozenset("do does did is are was were have has had ca wo could would should must need might "
                     "ai sha dare".split())


def norm_tokens(tokens: Iterable[str]) -> list[str]:
    """Tokens of any source, normalised as the module docstring says."""
    out: list[str] = []
    for t in tokens:
        t = unicodedata.normalize("NFC", t).translate(_CHAR_MAP)
        for piece in t.split():  # a mapped space inside a token splits it
            piece = _PTB_CODES.get(piece, piece)
            if piece in ("'t", "'T") and out and out[-1][-1:] in "nN" and out[-1][:-1].lower() in _NEGATED:
                out[-1], piece = out[-1][:-1], out[-1][-1] + piece  # "don 't" -> "do n't"
            if piece.strip("_"):
                out.extend(split_clitics(piece))
    return out


_TITLES = frozenset("mr mrs ms messrs mme mlle dr st ste prof rev hon gen col capt lt sgt maj adm "
                    "gov sen rep fr mt ft vs viz cf".split())
_DOTTED = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$")  # U.S / e.g / p.m (before the final period)
_SENT_END = re.compile(r"""([.!?]+)(["')\]]*)(?: *-- *| +)""")  # "end.--Next": the dash is dropped
_OPENERS = "\"'(["


def _abbreviation_before(s: str, i: int) -> bool:
    word = s[s.rfind(" ", 0, i) + 1:i].lstrip(_OPENERS)
    if word.lower() in _TITLES or _DOTTED.match(word):
        return True
    return len(word) == 1 and word.isupper() and word != "I"  # an initial


def split_sentences(s: str) -> list[str]:
    """Sentences of one cleaned paragraph (see the module docstring for the rules)."""
    out, start, n = [], 0, len(s)
    for m in _SENT_END.finditer(s):
        j = m.end()
        while j < n and s[j] in _OPENERS:
            j += 1
        if j == n or not s[j].isupper():
            continue
        if m.group(1) == "." and not m.group(2) and _abbreviation_before(s, m.start()):
            continue
        out.append(s[start:m.end(2)].strip())
        start = m.end()
    if start < n:
        out.append(s[start:].strip())
    return [x for x in out if x]


_tokenizer = None


def tokenize(sentence: str) -> list[str]:
    global _tokenizer
    if _tokenizer is None:
        try:
            from nltk.tokenize import NLTKWordTokenizer
        except ImportError:
            sys.exit("prepare_corpus.py needs nltk: pip install 'torchelmo[corpus]' (or nltk>=3.8)")
        _tokenizer = NLTKWordTokenizer()
    return _tokenizer.tokenize(sentence)


_NUMBER_WORDS = (r"(?:twenty|thirty|forty|fifty)(?:-\w+)?|one|two|three|four|five|six|seven|eight|nine|ten|"
                 "eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|first|"
                 "second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth")
_HEADING = re.compile(
    rf"^(?:(?:chapter|book|part|volume|vol\.|phase|stave|canto|letter)\s+(?:[ivxlcdm]+\b|\d+|the\s+\w+|"
    rf"(?:{_NUMBER_WORDS})\b).{{0,60}}|(?:prologue|epilogue|preface|finis|the end|contents)[.:]?"
    rf"|[ivxlcdm]+\.?|\d+\.?|(?:{_NUMBER_WORDS})\.?)$", re.I)


def is_heading(p: str) -> bool:
    """A chapter heading or number, or a short all-capitals title line."""
    if _HEADING.match(p) or p.startswith("[Illustration"):
        return True
    return len(p.split()) <= 8 and not any(c.islower() for c in p) and any(c.isalpha() for c in p)


def raw_sentences(paragraph: str) -> Iterator[list[str]]:
    """Tokenised sentences of one paragraph of raw text (headings yield nothing)."""
    p = clean_text(_ITALICS.sub("", paragraph))
    if not p or is_heading(p):
        return
    for s in split_sentences(p):
        toks = norm_tokens(tokenize(s))
        if toks:
            yield toks


def decode(b: bytes) -> str:
    """UTF-8; else Big5 where that yields only punctuation (some NLTK speeches are Big5-encoded:
    \\xa1\\xa6 is ’); else Windows-1252. C1 control characters are read as Windows-1252."""
    for enc in ("utf-8", "big5"):
        try:
            s = b.decode(enc)
        except UnicodeDecodeError:
            continue
        if enc == "utf-8" or all(ord(c) < 128 or unicodedata.category(c)[0] in "PZ" for c in s):
            break
    else:
        s = b.decode("cp1252", errors="replace")
    return re.sub("[\x80-\x9f]", lambda m: m.group().encode("latin-1").decode("cp1252", "ignore"), s)


# ---------------------------------------------------------------------------------------------
# Sources: each reader yields (document id, sentences) for the documents `want` accepts.

class Source(NamedTuple):
    name: str
    path: str  # relative to the data folder; missing -> skipped with a note
    licence: str
    read: Callable[[Path, Want, Counter], Iterator[tuple[str, Sentences]]]


def _paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """(start offset, text) of each blank-line separated paragraph."""
    pos = 0
    for m in re.finditer(r"\n[ \t\r]*\n", text):
        if text[pos:m.start()].strip():
            yield pos, text[pos:m.start()]
        pos = m.end()
    if text[pos:].strip():
        yield pos, text[pos:]


_PG_START = re.compile(r"^\*\*\* ?START OF (?:THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_PG_END = re.compile(r"^(?:\*\*\* ?END OF (?:THE|THIS) PROJECT GUTENBERG|End of (?:the )?Project "
                     r"Gutenberg)", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    m = _PG_START.search(text)
    if m:
        text = text[m.end():]
    m = _PG_END.search(text)
    return text[:m.start()] if m else text


def read_conll_sentences(path: Path) -> list[list[str]]:
    """Sentences (column 4 tokens) of a CoNLL-2012 file."""
    sents, cur = [], []
    for line in open(path, encoding="utf-8"):
        cols = line.rstrip("\n").split("\t")
        if line.startswith("#") or len(cols) < 4:
            if cur:
                sents.append(cur)
            cur = []
        else:
            cur.append(cols[3])
    if cur:
        sents.append(cur)
    return sents


def opening_end(text: str, opening: list[list[str]], name: str) -> int:
    """Offset in `text` where the LitBank opening ends: its tokens' characters, whitespace
    ignored, are a prefix of the text's; if not (an edition difference), the end of its last 40
    characters (fewer in a short opening), searched from half-way; failing that, three times its
    length."""
    target = "".join("".join(t.split()) for s in opening for t in s)
    offs = []
    for i, c in enumerate(text):
        if not c.isspace():
            offs.append(i)
            if len(offs) >= 3 * len(target):
                break
    if not offs or not target:
        return 0
    chars = "".join(text[i] for i in offs)
    if chars.startswith(target):
        return offs[len(target) - 1] + 1
    tail = target[-min(40, len(target) // 2):]
    k = chars.find(tail, len(target) // 2)
    if k >= 0:
        print(f"note: {name}: LitBank opening aligned by its last characters", file=sys.stderr)
        return offs[k + len(tail) - 1] + 1
    print(f"note: {name}: LitBank opening not found; dropping 3x its length", file=sys.stderr)
    return offs[-1] + 1


def novel_sentences(path: Path, conll: Path, stats: Counter) -> Iterator[list[str]]:
    text = strip_gutenberg(unicodedata.normalize("NFC", path.read_text(encoding="utf-8")))
    cut = 0
    if conll.is_file():
        opening = [[unicodedata.normalize("NFC", t) for t in s] for s in read_conll_sentences(conll)]
        cut = opening_end(text, opening, path.stem)
    else:
        print(f"note: {path.stem}: no LitBank conll, nothing held out by position", file=sys.stderr)
    paras = list(_paragraphs(text))
    n_drop = sum(1 for start, _ in paras if start < cut)
    n_drop += 1 if cut else 0  # one more paragraph, for safety
    for _, p in paras[:n_drop]:
        stats["litbank_opening_paragraphs"] += 1
        for s in raw_sentences(p):
            stats["litbank_opening_sentences"] += 1
            stats["litbank_opening_tokens"] += len(s)
    for _, p in paras[n_drop:]:
        yield from raw_sentences(p)


def read_novels(data: Path, want: Want, stats: Counter):
    conll_dir = data / "coref" / "litbank"
    for path in sorted((data / "text" / "litbank-novels").glob("*.txt")):
        if want(path.stem):
            yield path.stem, novel_sentences(path, conll_dir / f"{path.stem}_brat.conll", stats)


def _zip_members(path: Path, want: Want, pattern: str = "*.txt"):
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            base = name.rsplit("/", 1)[-1]
            if name.endswith("/") or base.upper().startswith("README") or not fnmatch.fnmatch(base, pattern):
                continue
            if want(name):
                yield name, decode(z.read(name))


def _tagged_lines(text: str, sep: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        toks = norm_tokens(t.rsplit(sep, 1)[0] for t in line.split() if sep in t)
        if toks:
            yield toks


def read_brown(data, want, stats):
    for name, text in _zip_members(data / "text" / "brown.zip", want, "c[a-r][0-9][0-9]"):
        yield name, _tagged_lines(text, "/")


def read_masc(data, want, stats):
    for name, text in _zip_members(data / "text" / "masc_tagged.zip", want):
        if not name.endswith("categories.txt"):
            yield name, _tagged_lines(html.unescape(text), "_")


def read_conllu_forms(path: Path) -> Iterator[list[str]]:
    from torchelmo.probe.conll import read_conllu

    for s in read_conllu(path):
        toks = norm_tokens(s.tokens)
        if toks:
            yield toks


def read_ud_train(data, want, stats):
    name = "en_ewt-ud-train.conllu"
    if want(name):
        yield name, read_conllu_forms(data / "pos" / "ud-english-ewt" / name)


def wikitext_sentences_from_lines(lines: Iterable[str]) -> Iterator[list[str]]:
    """Sentences of WikiText token lines: headings dropped, "17 @,@ 808" -> "17,808" (and @-@,
    @.@ alike: one token, as the other sources have them), split after . ! ? tokens."""
    for line in lines:
        toks = line.split()
        if not toks or toks[0] == "=":
            continue
        joined: list[str] = []
        glue = False
        for t in toks:
            if t in ("@-@", "@,@", "@.@") and joined:
                joined[-1] += t[1]
                glue = True
            elif glue:
                joined[-1] += t
                glue = False
            else:
                joined.append(t)
        sent: list[str] = []
        for t in joined:
            sent.append(t)
            if t in (".", "!", "?"):
                yield sent
                sent = []
        if sent:
            yield sent


def _wikitext(split):
    def read(data, want, stats):
        name = f"wiki.{split}.tokens"
        if want(name):
            with open(data / "lm" / "wikitext-2-valid-test" / name, encoding="utf-8") as f:
                sents = wikitext_sentences_from_lines(f)
                yield name, (norm_tokens(s) for s in sents if "<unk>" not in s)
    return read


def _line_paragraphs(text: str) -> Iterator[list[str]]:
    for line in text.splitlines():
        yield from raw_sentences(line)


def _review_sentences(text: str) -> Iterator[list[str]]:
    # "feature[+2]##sentence"; [t] titles and the *-framed header carry no "##".
    for line in text.splitlines():
        if "##" in line and not line.startswith("[t]"):
            yield from raw_sentences(line.split("##", 1)[1])


def _nltk(package, lines=_line_paragraphs):
    def read(data, want, stats):
        for name, text in _zip_members(data / "text" / "nltk" / f"{package}.zip", want):
            yield name, lines(text)
    return read


SOURCES = [
    Source("litbank_novels", "text/litbank-novels",
           "LitBank's 100 Project Gutenberg novels, public domain (US)", read_novels),
    Source("brown", "text/brown.zip", "Brown corpus (NLTK package), non-commercial use", read_brown),
    Source("masc", "text/masc_tagged.zip",
           "MASC (American National Corpus, NLTK package), permissive incl. commercial use", read_masc),
    Source("ud_ewt_train", "pos/ud-english-ewt/en_ewt-ud-train.conllu",
           "UD English EWT v2.16 train, CC BY-SA 4.0", read_ud_train),
    Source("wikitext2_valid", "lm/wikitext-2-valid-test/wiki.valid.tokens",
           "WikiText-2 valid, CC BY-SA 3.0", _wikitext("valid")),
    Source("wikitext2_test", "lm/wikitext-2-valid-test/wiki.test.tokens",
           "WikiText-2 test, CC BY-SA 3.0", _wikitext("test")),
    Source("nltk_abc", "text/nltk/abc.zip", "ABC rural/science news (NLTK), research use", _nltk("abc")),
    Source("nltk_inaugural", "text/nltk/inaugural.zip", "US inaugural addresses (NLTK), public domain",
           _nltk("inaugural")),
    Source("nltk_movie_reviews", "text/nltk/movie_reviews.zip",
           "Pang & Lee movie reviews (NLTK), research release; lower-cased", _nltk("movie_reviews")),
    Source("nltk_product_reviews_1", "text/nltk/product_reviews_1.zip",
           "Hu & Liu product reviews (NLTK), research use; lower-cased",
           _nltk("product_reviews_1", _review_sentences)),
    Source("nltk_product_reviews_2", "text/nltk/product_reviews_2.zip",
           "Hu & Liu product reviews (NLTK), research use", _nltk("product_reviews_2", _review_sentences)),
    Source("nltk_state_union", "text/nltk/state_union.zip",
           "State of the Union addresses (NLTK), public domain", _nltk("state_union")),
    Source("nltk_webtext", "text/nltk/webtext.zip", "NLTK webtext, research use", _nltk("webtext")),
]


# ---------------------------------------------------------------------------------------------
# Hold-out sets: sentences that must not appear in train or valid

def holdout_treebank(path: Path) -> Iterator[list[str]]:
    leaf = re.compile(r"\(([^\s()]+) ([^\s()]+)\)")
    with zipfile.ZipFile(path) as z:
        for name in sorted(z.namelist()):
            if name.endswith(".mrg"):
                for tree in re.split(r"\n(?=\( ?\()", z.read(name).decode("latin-1")):
                    toks = [w for tag, w in leaf.findall(tree) if tag != "-NONE-"]
                    if toks:
                        yield toks


def holdout_raganato(folder: Path) -> Iterator[list[str]]:
    # As the WSD probe reads them: <wf>/<instance> texts split at spaces and underscores.
    for path in sorted(folder.rglob("*.data.xml")):
        for _, el in ET.iterparse(path):
            if el.tag == "sentence":
                words = [w.text or "" for w in el if w.tag in ("wf", "instance")]
                yield [p for w in words for p in w.replace("_", " ").split()]
                el.clear()


def holdout_litbank(folder: Path) -> Iterator[list[str]]:
    for path in sorted(folder.glob("*.conll")):
        yield from read_conll_sentences(path)


def holdout_wnut(path: Path) -> Iterator[list[str]]:
    sent = []
    for line in open(path, encoding="utf-8"):
        tok = line.split("\t")[0].strip()
        if tok:
            sent.append(tok)
        elif sent:
            yield sent
            sent = []
    if sent:
        yield sent


HOLDOUTS = [
    ("ud_ewt_dev", "pos/ud-english-ewt/en_ewt-ud-dev.conllu", read_conllu_forms),
    ("ud_ewt_test", "pos/ud-english-ewt/en_ewt-ud-test.conllu", read_conllu_forms),
    ("nltk_treebank", "text/nltk/treebank.zip", holdout_treebank),
    ("wsd_eval", "wsd/raganato-eval", holdout_raganato),
    ("litbank_openings", "coref/litbank", holdout_litbank),
    ("wnut17_dev", "ner/wnut17/emerging.dev.conll", holdout_wnut),
    ("wnut17_test", "ner/wnut17/emerging.test.annotated", holdout_wnut),
]


def match_key(tokens: list[str]) -> str:
    return "".join(tokens)


def load_holdouts(data: Path) -> tuple[dict[str, str], dict[str, int]]:
    """{match key: hold-out name} (the first set holding a key names it) and each set's size."""
    keys: dict[str, str] = {}
    sizes = {}
    for name, rel, read in HOLDOUTS:
        if not (data / rel).exists():
            print(f"note: hold-out {name}: {rel} missing, skipped", file=sys.stderr)
            continue
        n = 0
        for toks in read(data / rel):
            toks = norm_tokens(toks)
            if toks:
                keys.setdefault(match_key(toks), name)
                n += 1
        sizes[name] = n
    return keys, sizes


# ---------------------------------------------------------------------------------------------
# Writing

class Filter:
    """Drops contaminated documents and too long, held-out and already seen sentences, counting
    each."""

    def __init__(self, held: dict[str, str]):
        self.held = held
        self.seen: set[bytes] = set()
        self.held_out = Counter()  # sentences removed, per hold-out set
        self.contaminated: dict[str, dict[str, int]] = {}  # document -> long matches per set

    def write_doc(self, f, doc: str, sents: Sentences, rec: dict) -> bool:
        """Writes one document's new sentences to `f`; False if it was dropped whole."""
        sents = list(sents)
        n = len(sents)
        sents = [t for t in sents if len(t) <= MAX_TOKENS]
        rec["too_long"] += n - len(sents)
        hits = [self.held.get(match_key(t)) for t in sents]
        long_hits = Counter(h for h, t in zip(hits, sents) if h and len(t) >= CONTAMINATION_MIN_TOKENS)
        n_long = sum(long_hits.values())
        if n_long >= 2 and n_long >= CONTAMINATION_SHARE * len(sents):
            # Evaluation text under another name (MASC's WSJ files, Brown's Senseval-3 file): the
            # sentences that did not match exactly (other splits) are the same text.
            self.contaminated[doc] = dict(long_hits)
            rec["contaminated_documents"] += 1
            rec["contaminated_sentences"] += len(sents)
            return False
        rec["documents"] += 1
        for toks, hit in zip(sents, hits):
            if hit:
                rec["held_out"] += 1
                self.held_out[hit] += 1
                continue
            line = " ".join(toks)
            h = hashlib.blake2b(line.encode("utf-8"), digest_size=12).digest()
            if h in self.seen:
                rec["duplicates"] += 1
                continue
            self.seen.add(h)
            f.write(line + "\n")
            rec["sentences"] += 1
            rec["tokens"] += len(toks)
        return True


def _record() -> dict:
    return dict.fromkeys(("documents", "sentences", "tokens", "duplicates", "held_out", "too_long",
                          "contaminated_documents", "contaminated_sentences"), 0)


def _is_valid(source: str, doc: str) -> bool:
    return any(fnmatch.fnmatchcase(doc, p) for p in VALID_DOCS.get(source, ()))


def build(data: Path, out: Path) -> dict:
    held, sizes = load_holdouts(data)
    sources = []
    for src in SOURCES:
        if (data / src.path).exists():
            sources.append(src)
        else:
            print(f"note: source {src.name}: {src.path} missing, skipped", file=sys.stderr)
    filt, stats = Filter(held), Counter()
    counts: dict = {"train": {}, "valid": {}, "valid_documents": []}
    (out / "sources").mkdir(parents=True, exist_ok=True)
    with open(out / "valid.txt", "w", encoding="utf-8") as f:  # first: valid keeps its documents whole
        for src in sources:
            rec = counts["valid"][src.name] = _record()
            for doc, sents in src.read(data, lambda d, s=src.name: _is_valid(s, d), stats):
                if filt.write_doc(f, f"{src.name}/{doc}", sents, rec):
                    counts["valid_documents"].append(f"{src.name}/{doc}")
    for src in sources:
        rec = counts["train"][src.name] = _record()
        with open(out / "sources" / f"{src.name}.txt", "w", encoding="utf-8") as f:
            for doc, sents in src.read(data, lambda d, s=src.name: not _is_valid(s, d), stats):
                filt.write_doc(f, f"{src.name}/{doc}", sents, rec)
        print(f"{src.name}: {rec['sentences']:,} sentences, {rec['tokens']:,} tokens", file=sys.stderr)
    counts["valid"] = {k: v for k, v in counts["valid"].items() if v["documents"]}
    for split in ("train", "valid"):
        counts[f"{split}_total"] = {k: sum(r[k] for r in counts[split].values()) for k in _record()}
    counts["held_out"] = {
        "matched_sentences": {name: filt.held_out[name] for name in sizes},
        "contaminated_documents": filt.contaminated,
        "set_sizes": sizes,
        "litbank_openings_by_position": {k[len("litbank_opening_"):]: v for k, v in sorted(stats.items())},
    }
    counts["max_tokens"] = MAX_TOKENS
    return counts


def mix_shards(out: Path, names: list[str], shards: int = SHARDS, seed: int = SHARD_SEED) -> list[dict]:
    """Spread the sentences of OUT/sources/<name>.txt over OUT/train/shard-NN.txt, each sentence to
    a shard drawn at random (seeded), in the order read; returns each shard's counts."""
    train = out / "train"
    train.mkdir(parents=True, exist_ok=True)
    for old in train.glob("*.txt"):
        old.unlink()
    rng = random.Random(seed)
    files = [open(train / f"shard-{k:02d}.txt", "w", encoding="utf-8") for k in range(shards)]
    recs = [{"file": f"train/shard-{k:02d}.txt", "sentences": 0, "tokens": 0} for k in range(shards)]
    try:
        for name in names:
            with open(out / "sources" / f"{name}.txt", encoding="utf-8") as src:
                for line in src:
                    k = rng.randrange(shards)
                    files[k].write(line)
                    recs[k]["sentences"] += 1
                    recs[k]["tokens"] += len(line.split())
    finally:
        for f in files:
            f.close()
    return recs


def table(counts: dict) -> str:
    cols = [("train sent", 11), ("train tok", 12), ("valid sent", 11), ("valid tok", 10), ("dup", 8),
            ("held-out", 9), ("too long", 9), ("dropped docs", 13)]

    def row(name, tr, va):
        vals = [tr["sentences"], tr["tokens"], va["sentences"], va["tokens"]] + [
            tr[k] + va[k] for k in ("duplicates", "held_out", "too_long", "contaminated_documents")]
        return f"{name:<24}" + "".join(f"{v:>{w},}" for v, (_, w) in zip(vals, cols))

    rows = [f"{'source':<24}" + "".join(f"{c:>{w}}" for c, w in cols)]
    rows += [row(name, tr, counts["valid"].get(name, _record())) for name, tr in counts["train"].items()]
    rows.append(row("total", counts["train_total"], counts["valid_total"]))
    ho = counts["held_out"]
    rows.append("held out by match (sentences removed / sentences in the set): " + ", ".join(
        f"{k} {v:,}/{ho['set_sizes'][k]:,}" for k, v in ho["matched_sentences"].items()))
    if ho["contaminated_documents"]:
        docs = ho["contaminated_documents"]
        rows.append("dropped whole (long hold-out matches): " + ", ".join(
            f"{d} ({', '.join(f'{k} {v}' for k, v in m.items())})" for d, m in docs.items()))
    op = ho["litbank_openings_by_position"]
    if op:
        rows.append(f"held out by position (LitBank openings): {op.get('paragraphs', 0):,} paragraphs, "
                    f"{op.get('sentences', 0):,} sentences, {op.get('tokens', 0):,} tokens")
    return "\n".join(rows)


def write_sources_md(counts: dict, path: Path) -> None:
    lic = {s.name: s.licence for s in SOURCES}
    per_source = Counter(d.split("/", 1)[0] for d in counts["valid_documents"])
    with open(path, "w", encoding="utf-8") as f:
        f.write("| shard | sentences | tokens | source, licence |\n|---|---|---|---|\n")
        for name, r in counts["train"].items():
            f.write(f"| sources/{name}.txt | {r['sentences']:,} | {r['tokens']:,} | {lic[name]} |\n")
        sh = counts.get("shards", [])
        if sh:
            f.write(f"| train/shard-*.txt | {sum(r['sentences'] for r in sh):,} | {sum(r['tokens'] for r in sh):,} "
                    f"| the sources above spread over {len(sh)} shards at random (the training files) |\n")
        v = counts["valid_total"]
        f.write(f"| valid.txt | {v['sentences']:,} | {v['tokens']:,} | whole documents (counts.json lists "
                f"them): {', '.join(f'{n} {k}' for k, n in per_source.items())} |\n")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="data folder (default ../shared/data)")
    ap.add_argument("--shards", type=int, default=SHARDS, help=f"training shards (default {SHARDS})")
    ap.add_argument("--reshard", action="store_true",
                    help="only redo OUT/train/shard-*.txt from OUT/sources (and counts.json's shards)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error(f"--shards must be at least 1, got {args.shards}")
    t0 = time.time()
    if args.reshard:
        try:
            counts = json.loads((args.out / "counts.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"prepare_corpus.py: {args.out / 'counts.json'}: cannot read it ({e}); build the corpus first")
    else:
        counts = build(args.data, args.out)
    counts["shards"] = mix_shards(args.out, list(counts["train"]), args.shards)
    (args.out / "counts.json").write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")
    write_sources_md(counts, args.out / "SOURCES.md")
    print(table(counts))
    print(f"wrote {args.out} in {time.time() - t0:.0f} s")
    return counts


if __name__ == "__main__":
    main()
