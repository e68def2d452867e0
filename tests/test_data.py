"""Vocabulary, streamed corpus, BPTT streams and sentence batches."""

import random
import warnings

import pytest
import torch

from torchelmo.errors import ElmoError
from torchelmo.lm.corpus import Corpus, expand_files
from torchelmo.lm.data import SentenceBatcher, StreamBatcher, make_batch, sentences_batch
from torchelmo.lm.vocab import Vocabulary
from torchelmo.model.chars import word_to_char_ids
from torchelmo.model.encoder import PAD_ID


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def sents():
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    return [[rng.choice(words) for _ in range(rng.randint(1, 9))] for _ in range(57)]


@pytest.fixture
def corpus_files(tmp_path, sents):
    a = write(tmp_path / "part-0.txt", [" ".join(s) for s in sents[:30]])
    b = write(tmp_path / "part-1.txt", [" ".join(s) for s in sents[30:]])
    return [a, b]


def batch_tokens(batch, d):
    """Rows of input tokens (as char-id tuples) of direction d."""
    table = [tuple(r) for r in batch.char_ids.tolist()]
    return [[table[i] for i in row if i >= 0] for row in batch.token_index[d].tolist()]


def ids(tokens):
    return [word_to_char_ids(t) for t in tokens]


# -- vocabulary ------------------------------------------------------------------------------------
def test_vocab_build_order_counts_and_limits(tmp_path):
    f = write(tmp_path / "c.txt", ["b a a", "", "c a b", "   ", "d"])
    v = Vocabulary.build([f])
    assert v.tokens == ["<S>", "</S>", "<UNK>", "a", "b", "c", "d"]
    assert v.counts == [3, 3, 0, 3, 2, 1, 1]  # 3 sentences (blank lines skipped)
    v2 = Vocabulary.build([f], min_count=2)
    assert v2.tokens == ["<S>", "</S>", "<UNK>", "a", "b"] and v2.counts[2] == 2
    v3 = Vocabulary.build([f], max_size=4)
    assert v3.tokens == ["<S>", "</S>", "<UNK>", "a"]
    assert v3.id("zzz") == v3.unk == 2 and v3.ids(["a", "b"]) == [3, 2]
    out = v3.save(tmp_path / "v.txt")
    assert out.read_text() == "<S>\n</S>\n<UNK>\na\n"
    assert Vocabulary.from_file(out).tokens == v3.tokens
    v3.save(tmp_path / "vc.txt", with_counts=True)
    assert Vocabulary.from_file(tmp_path / "vc.txt").counts == v3.counts


def test_vocab_bad_files(tmp_path):
    with pytest.raises(ElmoError, match=r"v1.txt: the first three entries must be <S>, </S>, <UNK>"):
        Vocabulary.from_file(write(tmp_path / "v1.txt", ["the", "a"]))
    with pytest.raises(ElmoError, match=r"line 5: duplicate token 'a' \(first on line 4\)"):
        Vocabulary.from_file(write(tmp_path / "v2.txt", ["<S>", "</S>", "<UNK>", "a", "a"]))
    with pytest.raises(ElmoError, match=r"v3.txt: line 4: blank line"):
        Vocabulary.from_file(write(tmp_path / "v3.txt", ["<S>", "</S>", "<UNK>", "", "a"]))
    with pytest.raises(ElmoError, match="empty vocabulary"):
        Vocabulary.from_file(write(tmp_path / "v4.txt", []))
    with pytest.raises(ElmoError, match="no such vocabulary"):
        Vocabulary.from_file(tmp_path / "missing.txt")
    with pytest.raises(ElmoError, match="no sentences"):
        Vocabulary.build([write(tmp_path / "empty.txt", ["", "  "])])


def test_vocab_fixture_file(bilmtf_dir):
    v = Vocabulary.from_file(bilmtf_dir.parent / "train" / "vocab.txt")
    assert len(v) == 32 and v.tokens[3] == "of"


# -- corpus ----------------------------------------------------------------------------------------
@pytest.mark.core
def test_expand_files_globs_and_errors(tmp_path, corpus_files):
    assert expand_files([str(tmp_path / "part-*.txt")]) == corpus_files
    assert expand_files([corpus_files[1], str(tmp_path / "*.txt")]) == [corpus_files[1], corpus_files[0]]
    with pytest.raises(ElmoError, match="matches no files"):
        expand_files([str(tmp_path / "nope-*.txt")])
    with pytest.raises(ElmoError, match="no such file"):
        expand_files([tmp_path / "nope.txt"])


def test_corpus_epochs_are_shuffled_permutations(corpus_files, sents):
    c = Corpus(corpus_files, shuffle=True, seed=3, block_lines=7)
    got = [s for s, _ in c.sentences(epochs=3)]
    key = sorted(map(tuple, sents))
    n = len(sents)
    epochs = [got[i * n:(i + 1) * n] for i in range(3)]
    for e in epochs:
        assert sorted(map(tuple, e)) == key
    assert epochs[0] != epochs[1] and epochs[0] != [list(s) for s in sents]
    assert [s for s, _ in Corpus(corpus_files, shuffle=False).sentences(epochs=1)] == sents


def test_corpus_is_streamed_in_blocks(tmp_path):
    # Shuffling is within blocks of block_lines lines: the corpus is never held whole.
    f = write(tmp_path / "c.txt", [f"s{i}" for i in range(100)])
    got = [int(s[0][1:]) for s, _ in Corpus([f], seed=1, block_lines=10).sentences(epochs=1)]
    assert sorted(got) == list(range(100)) and got != list(range(100))
    for b in range(10):
        assert sorted(got[b * 10:(b + 1) * 10]) == list(range(b * 10, b * 10 + 10))


def test_corpus_resume_from_every_position(tmp_path, corpus_files):
    blank = write(tmp_path / "part-2.txt", ["", "x y", "", "", "", "z", ""])
    files = corpus_files + [blank]
    c = Corpus(files, shuffle=True, seed=5, block_lines=4)
    items = list(c.sentences(epochs=2))
    for k in range(0, len(items), 3):
        rest = [s for s, _ in Corpus(files, shuffle=True, seed=5, block_lines=4).sentences(items[k][1], epochs=2)]
        assert rest == [s for s, _ in items[k + 1:]]


def test_corpus_empty_and_blank(tmp_path):
    e = write(tmp_path / "e.txt", [])
    b = write(tmp_path / "b.txt", ["", "   ", "\t"])
    with pytest.raises(ElmoError, match="no sentences"):
        list(Corpus([e, b]).sentences(epochs=1))
    with pytest.raises(ElmoError, match="no sentences"):
        next(Corpus([b]).sentences())  # an infinite stream over nothing must not hang
    (tmp_path / "bad.txt").write_bytes(b"ok line\n\xff\xfe bad\n")
    with pytest.raises(ElmoError, match=r"bad.txt: line 2: invalid UTF-8"):
        list(Corpus([tmp_path / "bad.txt"], shuffle=False).sentences(epochs=1))


def test_long_tokens_warn_and_keep_their_target(tmp_path):
    long = "x" * 70
    f = write(tmp_path / "long.txt", ["a " + long + " b"])
    v = Vocabulary(["<S>", "</S>", "<UNK>", "a", "b", long])
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        sent = next(Corpus([f], shuffle=False).sentences(epochs=1))[0]
    assert any("line 1: token of 70 bytes" in str(x.message) for x in w)
    assert sent == ["a", long, "b"]
    b = sentences_batch([sent], v)
    assert b.targets[0, 0].tolist() == [3, 5, 4, 1]
    assert len(word_to_char_ids(long)) == 50  # characters truncated as in the original


# -- BPTT streams ----------------------------------------------------------------------------------
def expected_stream(sentences, d):
    ins, tgt = [], []
    for s in sentences:
        if d == 0:
            ins += ["<S>", *s]
            tgt += [*s, "</S>"]
        else:
            ins += ["</S>", *reversed(s)]
            tgt += [*reversed(s), "<S>"]
    return ins, tgt


def test_contiguous_streams_cover_the_text(corpus_files, sents):
    v = Vocabulary.build(corpus_files)
    B, T = 4, 6
    sb = StreamBatcher(Corpus(corpus_files, shuffle=False), v, B, T, contiguous=True)
    rows = {d: [[] for _ in range(B)] for d in (0, 1)}
    tgts = {d: [[] for _ in range(B)] for d in (0, 1)}
    total = 0
    for b in sb:
        assert b.token_index.shape == (2, B, T) and b.n_targets == b.global_targets
        total += b.n_targets
        for d in (0, 1):
            for r, toks in enumerate(batch_tokens(b, d)):
                rows[d][r] += toks
                n = int(b.lengths[r])
                tgts[d][r] += b.targets[d, r, :n].tolist()
                assert (b.targets[d, r, n:] == -1).all()
    assert total == sum(len(s) + 1 for s in sents)
    n = len(sents)
    for r in range(B):
        part = sents[r * n // B:(r + 1) * n // B]
        for d in (0, 1):
            ins, tgt = expected_stream(part, d)
            assert rows[d][r] == ids(ins)
            assert tgts[d][r] == v.ids(tgt)


@pytest.mark.core
def test_training_streams_resume_and_split_over_ranks(corpus_files):
    v = Vocabulary.build(corpus_files)
    c = lambda: Corpus(corpus_files, seed=2, block_lines=8)  # noqa: E731
    one = StreamBatcher(c(), v, 4, 5)
    ref = [next(one) for _ in range(40)]  # several epochs
    assert one.epoch >= 2
    # Each of 2 ranks gets its half of the rows, the global count is the whole batch's.
    for rank in (0, 1):
        sb = StreamBatcher(c(), v, 4, 5, rank=rank, world_size=2)
        for k in range(40):
            b = next(sb)
            for d in (0, 1):
                assert batch_tokens(b, d) == batch_tokens(ref[k], d)[2 * rank:2 * rank + 2]
            assert torch.equal(b.targets, ref[k].targets[:, 2 * rank:2 * rank + 2])
            assert b.global_targets == ref[k].global_targets == 20
    # Resume from a saved state.
    sb = StreamBatcher(c(), v, 4, 5)
    for _ in range(13):
        next(sb)
    st = sb.state_dict()
    sb2 = StreamBatcher(c(), v, 4, 5)
    sb2.load_state_dict(st)
    for k in range(13, 40):
        b = next(sb2)
        assert torch.equal(b.targets, ref[k].targets)
        assert batch_tokens(b, 1) == batch_tokens(ref[k], 1)
    with pytest.raises(ElmoError, match="not divisible"):
        StreamBatcher(c(), v, 5, 5, rank=0, world_size=2)


@pytest.mark.core
def test_stream_epochs_end(corpus_files, sents):
    v = Vocabulary.build(corpus_files)
    total = sum(b.n_targets for b in StreamBatcher(Corpus(corpus_files), v, 3, 7, epochs=1))
    assert total == sum(len(s) + 1 for s in sents)


# -- sentence batches ------------------------------------------------------------------------------
@pytest.mark.core
def test_sentence_batches_by_tokens_cover_epoch(corpus_files, sents):
    v = Vocabulary.build(corpus_files)
    sb = SentenceBatcher(Corpus(corpus_files, seed=1), v, batch_tokens=40, epochs=1, pool_size=20, seed=1)
    seen = []
    for b in sb:
        B, T = b.lengths.numel(), int(b.lengths.max())
        assert B == 1 or B * T <= 40
        for toks in batch_tokens(b, 0):
            seen.append(tuple(toks[1:]))
            assert toks[0] == word_to_char_ids("<S>")
    assert sorted(seen) == sorted(tuple(ids(s)) for s in sents)


@pytest.mark.core
def test_sentence_batches_resume_and_ranks(corpus_files):
    v = Vocabulary.build(corpus_files)
    c = lambda: Corpus(corpus_files, seed=4)  # noqa: E731
    ref = list(SentenceBatcher(c(), v, batch_size=6, epochs=3, pool_size=16, seed=4))
    sb = SentenceBatcher(c(), v, batch_size=6, epochs=3, pool_size=16, seed=4)
    for _ in range(9):
        next(sb)
    st = sb.state_dict()
    sb2 = SentenceBatcher(c(), v, batch_size=6, epochs=3, pool_size=16, seed=4)
    sb2.load_state_dict(st)
    rest = list(sb2)
    assert len(rest) == len(ref) - 9
    for a, b in zip(rest, ref[9:]):
        assert torch.equal(a.targets, b.targets)
    r0 = list(SentenceBatcher(c(), v, batch_size=6, epochs=3, pool_size=16, seed=4, rank=0, world_size=2))
    r1 = list(SentenceBatcher(c(), v, batch_size=6, epochs=3, pool_size=16, seed=4, rank=1, world_size=2))
    assert len(r0) == len(r1) == len(ref)
    for a, b, full in zip(r0, r1, ref):
        assert a.global_targets == b.global_targets == full.global_targets == full.n_targets
        assert a.n_targets + b.n_targets == full.n_targets
        assert batch_tokens(a, 0) + batch_tokens(b, 0) == \
            [batch_tokens(full, 0)[i] for i in list(range(0, len(full.lengths), 2)) + list(range(1, len(full.lengths), 2))]


@pytest.mark.core
def test_batch_tokens_sorted_by_length_with_their_runs():
    rows = [(["<S>", "a", "elephant"], [4, 5, 6], ["</S>", "elephant", "a"], [5, 4, 1]),
            (["<S>", "bb"], [7, 8], ["</S>", "bb"], [7, 1])]
    b = make_batch(rows, None, 5)
    lengths = [int(((r != PAD_ID).nonzero().max()) + 1) for r in b.char_ids]
    assert lengths == sorted(lengths) and [L for L, c in b.groups for _ in range(c)] == lengths
    # The index still names the right tokens.
    assert b.char_ids[b.token_index[0, 0, 2]].tolist() == list(word_to_char_ids("elephant"))
    assert b.char_ids[b.token_index[1, 1, 1]].tolist() == list(word_to_char_ids("bb"))
    assert (b.token_index[:, 1, 2:] == -1).all()
