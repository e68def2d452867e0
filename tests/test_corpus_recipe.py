"""scripts/prepare_corpus.py on a tiny fake data tree: hold-outs, de-duplication, the LitBank
opening, whole-document validation, PTB clitics and the counts file."""

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest

EXTRAS_NEEDED = ("corpus",)   # the script tokenises with NLTK

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("prepare_corpus", ROOT / "scripts" / "prepare_corpus.py")
pc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pc)

OPENING = [["Chapter", "1"], ["Sir", "Walter", "was", "vain", "."], ["He", "liked", "John", "'s", "hat", "."]]
TRAIN_NOVEL = """Chapter 1

Sir Walter was
vain. He liked John's hat.

The safety paragraph is dropped too.

CHAPTER II

After the opening, Mr. Smith didn't stay. "Hello!" said he.--Then he left.

The bank of the river was steep. He liked John's hat.

A duplicate line.
"""
WSD_LONG = ["The old man sat by the fire and smoked his pipe .",
            "Nobody in the village knew where the stranger had come_from ."]
VALID_NOVEL = """Chapter 1

Sir Walter was vain.

Dropped for safety.

Anne Elliot walked to the shore. The sea was grey.
"""


def conllu(sents):
    out = ""
    for a, b in sents:
        out += f"# text = {a} {b}\n1\t{a}\t_\tX\t_\t_\t0\troot\t_\t_\n2\t{b}\t_\tX\t_\t_\t1\tdep\t_\t_\n\n"
    return out


def brat(stem, sents):
    lines = [f"#begin document ({stem}); part 0"]
    for s in sents:
        lines += [f"{stem}\t0\t{i}\t{t}" + "\t_" * 8 for i, t in enumerate(s)] + [""]
    return "\n".join(lines + ["#end document"]) + "\n"


def zipped(path: Path, members: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)


@pytest.fixture
def tree(tmp_path):
    d = tmp_path / "data"
    novels, coref = d / "text" / "litbank-novels", d / "coref" / "litbank"
    novels.mkdir(parents=True)
    coref.mkdir(parents=True)
    (novels / "999_tiny.txt").write_text(TRAIN_NOVEL)
    (coref / "999_tiny_brat.conll").write_text(brat("999_tiny_brat", OPENING))
    (novels / "105_persuasion.txt").write_text(VALID_NOVEL)  # in VALID_DOCS
    (coref / "105_persuasion_brat.conll").write_text(brat("105_persuasion_brat", OPENING[:2]))
    zipped(d / "text" / "nltk" / "abc.zip", {
        "abc/README": "not text",
        "abc/rural.txt": "Farmers can't sell wheat.\nA duplicate line.\nStocks fell sharply.\nThanks a lot.\n",
    })
    zipped(d / "text" / "nltk" / "state_union.zip", {
        "state_union/1962-Kennedy.txt": "We choose to act. The Union is strong.\n",  # in VALID_DOCS
        "state_union/1963-Kennedy.txt": "The economy grew.\n"})
    zipped(d / "text" / "nltk" / "treebank.zip", {
        "treebank/combined/wsj_0001.mrg":
            "( (S (NP (NNS Stocks)) (VP (VBD fell) (ADVP (RB sharply))) (. .) ))\n"})
    cl23 = [s.replace("_", " ") for s in WSD_LONG] + ["Something else ."]
    zipped(d / "text" / "brown.zip", {  # cl23: WSD evaluation text under another name
        "brown/ca02": "\tHe/pps didn't/dod* go/vb ./.\n",
        "brown/cl23": "".join("\t" + " ".join(w + "/x" for w in s.split()) + "\n" for s in cl23)})
    ewt = d / "pos" / "ud-english-ewt"
    ewt.mkdir(parents=True)
    (ewt / "en_ewt-ud-train.conllu").write_text(conllu([("Good", "morning"), ("Hi", "there")]))
    (ewt / "en_ewt-ud-dev.conllu").write_text(conllu([("Thanks", "."), ("Hi", "there")]))
    wsd = d / "wsd" / "raganato-eval" / "Evaluation_Datasets" / "tiny"
    wsd.mkdir(parents=True)
    (wsd / "tiny.data.xml").write_text(
        '<?xml version="1.0"?><corpus lang="en"><text id="d0"><sentence id="d0.s0">'
        '<wf lemma="the" pos="DET">The</wf><instance id="d0.s0.t0" lemma="bank" pos="NOUN">bank</instance>'
        '<wf lemma="of" pos="ADP">of</wf><wf lemma="the" pos="DET">the</wf>'
        '<instance id="d0.s0.t1" lemma="river" pos="NOUN">river</instance><wf lemma="be" pos="VERB">was</wf>'
        '<wf lemma="steep" pos="ADJ">steep</wf><wf lemma="." pos=".">.</wf></sentence>'
        + "".join(f'<sentence id="d0.s{i}">' + "".join(f"<wf>{w}</wf>" for w in s.split()) + "</sentence>"
                  for i, s in enumerate(WSD_LONG, 1)) + "</text></corpus>")
    return d


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_prepare_corpus(tree, tmp_path, capsys):
    out = tmp_path / "corpus"
    counts = pc.main([str(out), "--data", str(tree)])
    printed = capsys.readouterr()
    train = {p.stem: lines(p) for p in sorted((out / "sources").glob("*.txt"))}
    valid = lines(out / "valid.txt")
    everything = valid + [s for shard in train.values() for s in shard]

    # Missing sources and hold-out sets are skipped with a note; the token counts are printed.
    assert "note: source masc" in printed.err and "note: hold-out wnut17_dev" in printed.err
    assert "train tok" in printed.out and f"{counts['train_total']['tokens']:,}" in printed.out
    assert set(train) == {"litbank_novels", "brown", "ud_ewt_train", "nltk_abc", "nltk_state_union"}

    # The LitBank opening, the paragraph after it and its repeats elsewhere are gone.
    for s in ["Sir Walter was vain .", "He liked John 's hat .", "The safety paragraph is dropped too .",
              "Dropped for safety ."]:
        assert s not in everything
    assert train["litbank_novels"][:3] == [
        "After the opening , Mr. Smith did n't stay .", '" Hello ! " said he .', "Then he left ."]
    assert "CHAPTER II" not in " ".join(everything)
    # Held out by match: WSD (in a novel), treebank (in abc), UD EWT dev (in UD train).
    for s in ["The bank of the river was steep .", "Stocks fell sharply .", "Thanks .", "Hi there"]:
        assert s not in everything
    assert counts["held_out"]["matched_sentences"] == {
        "ud_ewt_dev": 1, "nltk_treebank": 1, "wsd_eval": 1, "litbank_openings": 1}
    # A document that is evaluation text under another name is dropped whole.
    assert counts["held_out"]["contaminated_documents"] == {"brown/brown/cl23": {"wsd_eval": 2}}
    assert "Something else ." not in everything and counts["train"]["brown"]["contaminated_sentences"] == 3
    # Clitics split PTB-style (raw text and Brown's own tokens), duplicates removed (the first kept).
    assert "Farmers ca n't sell wheat ." in train["nltk_abc"] and train["brown"] == ["He did n't go ."]
    assert everything.count("A duplicate line .") == 1 and "A duplicate line ." in train["litbank_novels"]
    assert counts["train"]["nltk_abc"]["duplicates"] == 1

    # Validation: whole documents, none of their sentences in train.
    assert valid == ["Anne Elliot walked to the shore .", "The sea was grey .", "We choose to act .",
                     "The Union is strong ."]
    assert counts["valid_documents"] == [
        "litbank_novels/105_persuasion", "nltk_state_union/state_union/1962-Kennedy.txt"]
    assert train["nltk_state_union"] == ["The economy grew ."]
    assert not set(valid) & {s for shard in train.values() for s in shard}

    # counts.json matches the files.
    saved = json.loads((out / "counts.json").read_text())
    assert saved == counts
    for name, shard in train.items():
        assert counts["train"][name]["sentences"] == len(shard)
        assert counts["train"][name]["tokens"] == sum(len(s.split()) for s in shard)
    assert counts["valid_total"]["sentences"] == len(valid)
    assert counts["valid_total"]["tokens"] == sum(len(s.split()) for s in valid)
    assert "| valid.txt |" in (out / "SOURCES.md").read_text()

    # The training files: every source's sentences spread over the shards, none lost or repeated.
    shards = {p.name: lines(p) for p in sorted((out / "train").glob("*.txt"))}
    assert list(shards) == [f"shard-{k:02d}.txt" for k in range(pc.SHARDS)]
    assert sorted(s for shard in shards.values() for s in shard) == sorted(s for src in train.values() for s in src)
    assert [r["sentences"] for r in counts["shards"]] == [len(s) for s in shards.values()]

    # --reshard redoes the shards from the sources alone, the same way; fewer shards are possible.
    again = pc.main([str(out), "--reshard", "--shards", "3"])
    assert sorted(p.name for p in (out / "train").glob("*.txt")) == ["shard-00.txt", "shard-01.txt", "shard-02.txt"]
    assert again["train"] == counts["train"] and len(again["shards"]) == 3
    pc.main([str(out), "--reshard"])
    assert {p.name: lines(p) for p in sorted((out / "train").glob("*.txt"))} == shards


def test_sentence_splitter_and_tokens():
    sents = list(pc.raw_sentences('“Are you Mr. Jarndyce?” asked Dr. J. Smith. It was 3 p.m. I don’t '
                                  'know. "Oh!" said he. She left... Then _he_ came.'))
    assert [" ".join(s) for s in sents] == [
        '" Are you Mr. Jarndyce ? " asked Dr. J. Smith .', "It was 3 p.m. I do n't know .",
        '" Oh ! " said he .', "She left ...", "Then he came ."]
    assert pc.norm_tokens(["didn't", "Atlanta's", "``", "-LRB-", "o'clock", "__"]) == [
        "did", "n't", "Atlanta", "'s", '"', "(", "o'clock"]
    wiki = pc.wikitext_sentences_from_lines(
        ["The cat isn 't well @-@ fed . It ate 17 @,@ 808 mice .\n", " = Heading = \n"])
    assert [pc.norm_tokens(s) for s in wiki] == [
        ["The", "cat", "is", "n't", "well-fed", "."], ["It", "ate", "17,808", "mice", "."]]
    assert pc.norm_tokens("i can 't , then 't is".split()) == ["i", "ca", "n't", ",", "then", "'t", "is"]


def test_opening_alignment_tolerates_edition_differences():
    text = "CHAPTER ONE\n\nIt was a dark night. The rain fell.\n\nLater on."
    exact = [["CHAPTER", "ONE"], ["It", "was", "a", "dark", "night", "."]]
    assert text[:pc.opening_end(text, exact, "t")].endswith("night.")
    other_heading = [["Chapter", "1"], ["It", "was", "a", "dark", "night", "."], ["The", "rain", "fell", "."]]
    assert text[:pc.opening_end(text, other_heading, "t")].endswith("fell.")
    cut = pc.opening_end(text, [["Nothing", "like", "it"]], "t")  # not found: drop 3x its length
    assert len("".join(text[:cut].split())) == 3 * len("Nothinglikeit")


def test_shards_mix_the_sources(tmp_path):
    # Each shard is a sample of the whole corpus, not a run of one source (the trainer reads a
    # file at a time), and sentences keep their order within a shard.
    (tmp_path / "sources").mkdir()
    for name in ("novels", "reviews"):
        (tmp_path / "sources" / f"{name}.txt").write_text("".join(f"{name} {i} .\n" for i in range(2000)))
    recs = pc.mix_shards(tmp_path, ["novels", "reviews"], shards=4)
    assert sum(r["sentences"] for r in recs) == 4000 and sum(r["tokens"] for r in recs) == 12000
    for k in range(4):
        shard = lines(tmp_path / "train" / f"shard-{k:02d}.txt")
        novels = [s for s in shard if s.startswith("novels")]
        assert 0.4 < len(novels) / len(shard) < 0.6
        assert novels == sorted(novels, key=lambda s: int(s.split()[1]))
