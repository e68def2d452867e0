import pytest
import torch

from torchelmo import ElmoError, batch_to_ids, word_to_char_ids
from torchelmo.model.chars import BOS_IDS, EOS_IDS


@pytest.mark.core
def test_published_example():
    # From the published mapping (ids shifted by +1): "Second".
    assert list(word_to_char_ids("Second")[:10]) == [259, 84, 102, 100, 112, 111, 101, 260, 261, 261]
    assert len(word_to_char_ids("Second")) == 50


@pytest.mark.core
def test_sentence_markers_are_whole_tokens():
    assert list(BOS_IDS[:4]) == [259, 257, 260, 261]
    assert list(EOS_IDS[:4]) == [259, 258, 260, 261]
    # A literal marker in the input gets the marker's ids, as in both originals.
    assert word_to_char_ids("<S>") == BOS_IDS and word_to_char_ids("</S>") == EOS_IDS
    assert word_to_char_ids("<S>x") != BOS_IDS


@pytest.mark.core
def test_truncation_to_48_bytes():
    ids = word_to_char_ids("a" * 100)
    assert ids[0] == 259 and ids[49] == 260 and ids[1:49] == (98,) * 48
    # A multibyte char may be split by truncation; it must not crash.
    ids = word_to_char_ids("é" * 30)  # 60 bytes
    raw = "é".encode() * 24
    assert list(ids[1:49]) == [b + 1 for b in raw]


@pytest.mark.core
@pytest.mark.parametrize("word", ["café", "北京", "😀", "\ud800", "a\udfffb", "\x00", " "])
def test_any_str(word):
    ids = word_to_char_ids(word)
    assert len(ids) == 50 and all(1 <= i <= 261 for i in ids)
    assert ids[0] == 259


@pytest.mark.core
def test_distinct_words_distinct_ids():
    assert word_to_char_ids("\ud800") != word_to_char_ids("\ud801")
    assert word_to_char_ids("😀") != word_to_char_ids("😁")


@pytest.mark.core
def test_batch_padding():
    ids = batch_to_ids([["a", "b", "c"], ["d"], []])
    assert ids.shape == (3, 3, 50) and ids.dtype == torch.long
    assert (ids[1, 1:] == 0).all() and (ids[2] == 0).all()
    assert (ids[0] > 0).all()
    assert ids[1, 0].tolist() == list(word_to_char_ids("d"))


def test_all_empty_sentences():
    assert batch_to_ids([[], []]).shape == (2, 0, 50)


@pytest.mark.core
def test_bad_batches():
    with pytest.raises(ElmoError, match="empty batch"):
        batch_to_ids([])
    with pytest.raises(ElmoError, match="sentence 1 is a str"):
        batch_to_ids([["ok"], "not tokenised"])
    with pytest.raises(ElmoError, match="sentence 0 token 1"):
        batch_to_ids([["ok", 3]])


def test_batch_ids_equal_the_token_by_token_mapping():
    words = ["", "a", "Second", "<S>", "</S>", "<S>x", "x</S>", "<s>", "a" * 47, "a" * 48, "a" * 49,
             "é" * 30, "北京", "😀", "\ud800", "tab\there", "x" * 200, "end"]
    sentences = [words, words[::-1][:5], [], ["only"]]
    got = batch_to_ids(sentences)
    for b, s in enumerate(sentences):
        for t, w in enumerate(s):
            assert tuple(got[b, t].tolist()) == word_to_char_ids(w), (b, t, w)
        assert (got[b, len(s):] == 0).all()
    # A token holding a newline cannot be split on newlines: it goes token by token.
    nl = batch_to_ids([["a\nb", "c"]])
    assert tuple(nl[0, 0].tolist()) == word_to_char_ids("a\nb") and tuple(nl[0, 1].tolist()) == word_to_char_ids("c")
    assert tuple(batch_to_ids([[""]])[0, 0].tolist()) == word_to_char_ids("")
