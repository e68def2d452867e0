"""Sentence files (one reader, one BOM and UTF-8 policy for every command) and length bucketing."""

import random

import pytest

from torchelmo.cli import main
from torchelmo.errors import ElmoError
from torchelmo.io.text import count_lines, length_batches, read_lines, read_sentences
from torchelmo.lm.corpus import Corpus
from torchelmo.lm.vocab import Vocabulary

BOM = "\ufeff"


def test_bom_is_dropped_by_every_reader(tmp_path, capsys):
    f = tmp_path / "bom.txt"
    f.write_text(BOM + "The cat sat .\nThe dog .\n", encoding="utf-8")
    assert [ln.tokens for ln in read_lines(f)] == [["The", "cat", "sat", "."], ["The", "dog", "."]]
    assert next(iter(read_lines(f))).text == "The cat sat ."
    assert list(read_sentences([f]))[0][0] == "The"
    assert [s for s, _ in Corpus([f], shuffle=False).sentences(epochs=1)][0][0] == "The"
    # elmo vocab used to write the entry "\ufeffThe".
    out = tmp_path / "vocab.txt"
    assert main(["vocab", str(f), "-o", str(out), "--counts"]) == 0
    vocab = Vocabulary.from_file(out)
    assert "The" in vocab and not any(BOM in t for t in vocab.tokens)
    assert vocab.counts[vocab.id("The")] == 2


@pytest.mark.core
def test_bom_only_at_the_start_of_a_file(tmp_path):
    f = tmp_path / "mid.txt"
    f.write_text("a b\n" + BOM + "c\n", encoding="utf-8")
    assert [ln.tokens for ln in read_lines(f)] == [["a", "b"], [BOM + "c"]]


@pytest.mark.core
def test_resume_at_a_line_end_and_shards(tmp_path):
    f = tmp_path / "t.txt"
    lines = [f"s{i} x" if i % 4 else "" for i in range(11)]
    f.write_text("\n".join(lines), encoding="utf-8")       # no final newline
    all_lines = list(read_lines(f))
    assert [ln.index for ln in all_lines] == list(range(11)) and count_lines(f) == 11
    third = all_lines[3]
    rest = list(read_lines(f, start=third.end, first_index=4))
    assert [(ln.index, ln.tokens) for ln in rest] == [(ln.index, ln.tokens) for ln in all_lines[4:]]
    reader = read_lines(f, shard=(1, 3), skip_blank=True)
    got = [ln.index for ln in reader]
    assert got == [i for i in range(11) if i % 3 == 1 and i % 4] and reader.lines_read == 11


def test_invalid_utf8_names_file_line_and_byte(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"ok\nab\xe9c\n")
    with pytest.raises(ElmoError, match=r"bad.txt: line 2: invalid UTF-8 \(byte 0xe9 at column 3\)"):
        list(read_lines(f))
    assert [ln.text for ln in read_lines(f, errors="replace")] == ["ok", "ab\ufffdc"]
    with pytest.raises(ElmoError, match=r"missing.txt: cannot read corpus file"):
        list(read_sentences([tmp_path / "missing.txt"]))


def _reference_batches(lengths, max_rows, max_tokens):
    """The rule written out: longest first, close a batch at max_rows or when rows x longest would
    exceed max_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out, cur = [], []
    for i in order:
        longest = lengths[cur[0]] if cur else lengths[i]
        if cur and (len(cur) >= max_rows or (len(cur) + 1) * longest > max_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    return out + ([cur] if cur else [])


@pytest.mark.core
def test_length_batches_follows_the_rule():
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 60))]
        max_rows, max_tokens = rng.randint(1, 16), rng.randint(1, 200)
        got = length_batches(lengths, max_rows, max_tokens)
        assert got == _reference_batches(lengths, max_rows, max_tokens)
        assert sorted(i for b in got for i in b) == list(range(len(lengths)))
        for b in got:  # within the caps, or a single item longer than the token cap
            assert len(b) <= max_rows
            assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= max_tokens


@pytest.mark.core
def test_length_batches_ascending_keeps_min_rows():
    lengths = [5, 1, 9, 9, 2, 30]
    # Shortest first; the cap applies from 2 rows on, so [1, 2] may exceed nothing yet and the
    # second 9 joins the first although 9 x 2 is within 20 only because a lone row is never closed.
    assert length_batches(lengths, None, 20, descending=False, min_rows=2) == [[1, 4, 0], [2, 3], [5]]
    assert length_batches(lengths, None, 20, descending=False) == [[1, 4, 0], [2, 3], [5]]
    assert length_batches(lengths, None, 8, descending=False, min_rows=2) == [[1, 4], [0, 2], [3, 5]]
    assert length_batches(lengths, None, 8, descending=False) == [[1, 4], [0], [2], [3], [5]]
