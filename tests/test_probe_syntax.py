"""Syntax probes: the WSJ treebank reader, CoNLL-U trees, token-per-line tag files, the dependency
probes' metric, and `elmo probe pos-wsj|deps|tag|all` end to end on tiny inline data."""

import json
import zipfile

import numpy as np
import pytest
import torch

from torchelmo import ElmoError
from torchelmo.probe.conll import DepSentence, read_columns, read_conllu, read_conllu_trees
from torchelmo.probe.treebank import parse_trees, read_treebank

pytestmark = pytest.mark.usefixtures("one_thread")

DETS, NOUNS, VERBS = ["the", "a", "my"], ["cat", "dog", "bird", "fish"], ["sees", "likes", "eats"]


def toy(n, seed):
    """``n`` sentences 'DET NOUN VERB DET NOUN .' as (words, PTB tags, heads, deprels)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w = [rng.choice(DETS), rng.choice(NOUNS), rng.choice(VERBS), rng.choice(DETS), rng.choice(NOUNS), "."]
        det = ["nmod:poss" if d == "my" else "det" for d in (w[0], w[3])]
        out.append(([str(x) for x in w], ["DT", "NN", "VBZ", "DT", "NN", "."], [2, 3, 0, 5, 3, 3],
                    [det[0], "nsubj", "root", det[1], "obj", "punct"]))
    return out


def conllu_text(sents, extras=False, doc_every=None):
    lines = []
    for k, (w, tags, heads, rels) in enumerate(sents):
        if doc_every and k % doc_every == 0:
            lines.append(f"# newdoc id = d{k // doc_every}")
        lines.append(f"# sent_id = s{k}")
        if extras and k == 0:
            lines.append("1-2\tthecat\t_\t_\t_\t_\t_\t_\t_\t_")   # a multi-word token: skipped
        for i, (x, t, h, r) in enumerate(zip(w, tags, heads, rels), 1):
            upos = {"DT": "DET", "NN": "NOUN", "VBZ": "VERB", ".": "PUNCT"}[t]
            lines.append(f"{i}\t{x}\t{x}\t{upos}\t{t}\t_\t{h}\t{r}\t_\t_")
            if extras and k == 0 and i == 3:
                lines.append("3.1\tsaw\tsee\tVERB\tVBD\t_\t_\t_\t3:conj\t_")   # an empty node: skipped
        lines.append("")
    return "\n".join(lines) + "\n"


def mrg_text(sents):
    trees = []
    for w, tags, _, _ in sents:
        lv = [f"({t} {x})" for x, t in zip(w, tags)]
        trees.append(f"( (S \n    (NP-SBJ {lv[0]} {lv[1]} )\n    (VP {lv[2]} \n      (NP {lv[3]} {lv[4]} )\n"
                     f"      (S (NP-SBJ (-NONE- *-1) )))\n    {lv[5]} ))\n")
    return "\n".join(trees)


def write_treebank(path, files):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("treebank/combined/README", "not a tree file\n")
        for num, text in files.items():
            z.writestr(f"treebank/combined/wsj_{num:04d}.mrg", text)
    return path


# -- readers -------------------------------------------------------------------------------------

def test_treebank_reader_splits_by_file_and_drops_empty_elements(tmp_path):
    text = ("\n( (S \n    (NP-SBJ (-NONE- *) )\n    (VP (VBD said) \n"
            "      (`` ``) (-LRB- -LCB-) (NNP Mr.) (-RRB- -RRB-) (''  '') )\n"
            "    (. .) ))\n( (S (NP (-NONE- *T*-1) )))\n( (FRAG (NN yes) ))\n")
    zp = write_treebank(tmp_path / "treebank.zip", {1: text, 159: mrg_text(toy(2, 0)), 160: mrg_text(toy(1, 1)),
                                                    199: mrg_text(toy(3, 2))})
    train = read_treebank(zp, "train")
    # -NONE- leaves go; a tree of empty elements only is no sentence; codes become characters.
    assert [s.tokens for s in train[:2]] == [["said", '"', "{", "Mr.", ")", '"', "."], ["yes"]]
    assert train[0].tags == ["VBD", "``", "-LRB-", "NNP", "-RRB-", "''", "."] and train[1].tags == ["NN"]
    assert (train[0].line, train[1].line) == (2, 8)
    assert len(train) == 4 and train[2].tokens == toy(2, 0)[0][0] and train[2].tags == toy(2, 0)[0][1]
    assert read_treebank(zp, "train", unescape=False)[0].tokens[1:3] == ["``", "-LCB-"]
    assert [len(read_treebank(zp, s)) for s in ("dev", "test")] == [1, 3]
    assert len(read_treebank(zp)) == 8 and len(read_treebank(zp, "train", limit=3)) == 3


@pytest.mark.core
@pytest.mark.parametrize("text, message", [
    ("( (S (NN cat) )\n", r":1: end of file inside a tree"),
    ("( (S (NN cat) )))\n", r":1: '\)' closes no bracket"),
    ("( (S (NN cat dog) ))\n", r":1: node \(NN \.\.\.\) mixes words"),
    ("( (S\n  (NN cat (DT the)) ))\n", r":2: node \(NN cat \.\.\.\) mixes words"),
    ("( (S (NN cat) ))\nstray\n", r":2: text 'stray' outside a tree"),
    ("( (S (NN cat) ) oops)\n", r":1: word 'oops' has no tag"),
    ("( (S (NN cat) () ))\n", r":1: empty bracket \(\)"),
    ("( (S\n ( cat) ))\n", r":2: empty bracket \(cat\)"),
])
def test_treebank_malformed_input_names_file_and_line(tmp_path, text, message):
    zp = write_treebank(tmp_path / "tb.zip", {5: text})
    with pytest.raises(ElmoError, match=r"tb\.zip:treebank/combined/wsj_0005\.mrg" + message):
        read_treebank(zp)


def test_treebank_bad_files(tmp_path):
    with pytest.raises(ElmoError, match="no such file"):
        read_treebank(tmp_path / "missing.zip")
    (tmp_path / "x.zip").write_text("not a zip")
    with pytest.raises(ElmoError, match=r"x\.zip: not a zip file"):
        read_treebank(tmp_path / "x.zip")
    with zipfile.ZipFile(tmp_path / "empty.zip", "w") as z:
        z.writestr("other.txt", "")
    with pytest.raises(ElmoError, match="no wsj_NNNN.mrg files"):
        read_treebank(tmp_path / "empty.zip")
    zp = write_treebank(tmp_path / "tb.zip", {1: mrg_text(toy(1, 0))})
    with pytest.raises(ElmoError, match="no sentences in split 'test'"):
        read_treebank(zp, "test")
    with pytest.raises(ElmoError, match="split must be one of"):
        read_treebank(zp, "valid")
    assert parse_trees("", "x") == []


def test_conllu_trees_skip_ranges_and_empty_nodes(tmp_path):
    p = tmp_path / "t.conllu"
    sents = toy(3, 0)
    p.write_text(conllu_text(sents, extras=True))
    trees = read_conllu_trees(p)
    assert [t.tokens for t in trees] == [s[0] for s in sents]
    assert trees[0].heads == [2, 3, 0, 5, 3, 3] and trees[0].rels == sents[0][3] and trees[0].line == 3
    # The same words as the POS reader reads: one feature file serves both probes.
    assert [s.tokens for s in read_conllu(p)] == [t.tokens for t in trees]
    assert len(read_conllu_trees(p, limit=2)) == 2


@pytest.mark.core
def test_conllu_sentences_know_their_documents(tmp_path):
    # '# newdoc id' names the document of the sentences after it; without one, the sent_id less
    # its sentence number (UD EWT's weblog-...-0001).
    text = conllu_text(toy(4, 0)).split("# sent_id = ")
    p = tmp_path / "d.conllu"
    p.write_text("# newdoc id = A\n# sent_id = " + text[1] + "# sent_id = " + text[2]
                 + "# newdoc id = B\n# sent_id = " + "# sent_id = ".join(text[3:]))
    assert [s.doc for s in read_conllu(p)] == ["A", "A", "B", "B"]
    assert [s.doc for s in read_conllu_trees(p)] == ["A", "A", "B", "B"]
    q = tmp_path / "e.conllu"
    q.write_text(conllu_text(toy(3, 0)).replace("# sent_id = s0", "# sent_id = blog-x_2004-0001")
                 .replace("# sent_id = s1", "# sent_id = blog-x_2004-0002"))
    assert [s.doc for s in read_conllu(q)] == ["blog-x_2004", "blog-x_2004", "s2"]


@pytest.mark.core
@pytest.mark.parametrize("head, rel, message", [
    ("7", "det", r"t\.conllu:3: word 2 has head '7'; expected 0 \(ROOT\) or another word of the sentence "
                 r"\(1\.\.2\)"),
    ("2", "det", r"t\.conllu:3: word 2 has head '2'"),
    ("_", "det", r"t\.conllu:3: word 2 has head '_'"),
    ("1", "_", r"t\.conllu:3: word 2 has no DEPREL"),
])
def test_conllu_trees_bad_heads(tmp_path, head, rel, message):
    p = tmp_path / "t.conllu"
    p.write_text(f"# c\n1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n2\tyou\tyou\tPRON\tPRP\t_\t{head}\t{rel}\t_\t_\n\n")
    with pytest.raises(ElmoError, match=message):
        read_conllu_trees(p)


def test_read_columns(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("-DOCSTART- -X- O\n\n# a comment\nThe the B-NP\ncat cat I-NP\n\n  \nsat sit B-VP\n")
    s = read_columns(p, 2)
    assert [(x.tokens, x.tags, x.line) for x in s] == [(["The", "cat"], ["B-NP", "I-NP"], 4),
                                                       (["sat"], ["B-VP"], 8)]
    assert read_columns(p, 2, token_column=1)[0].tokens == ["the", "cat"]
    assert len(read_columns(p, 0, token_column=2, limit=1)) == 1
    p.write_text("The DT\ncat NN x\n")
    with pytest.raises(ElmoError, match=r"t\.txt:2: 3 column\(s\), the file's first token line has 2"):
        read_columns(p, 1)
    with pytest.raises(ElmoError, match=r"t\.txt:1: 2 column\(s\), but --column 4 .* need at least 5"):
        read_columns(p, 4)
    with pytest.raises(ElmoError, match="both 0"):
        read_columns(p, 0)
    p.write_text("# only\n\n")
    with pytest.raises(ElmoError, match="no sentences"):
        read_columns(p, 1)


# -- the dependency probes' metric -----------------------------------------------------------------

@pytest.mark.core
def test_uas_of_a_hand_set_scorer_and_of_the_neighbour_baselines():
    from torchelmo.probe.common import Standardize
    from torchelmo.probe.deps import (
        ArcScorer,
        Batch,
        Encoder,
        LabelScorer,
        Trees,
        evaluate,
        neighbour_heads,
        sentence_counts,
    )
    # Words are one-hot x = e_i, A = I, B = M: s(i, j) = M[i, j] and s(i, ROOT) = r[i].
    M = torch.tensor([[0.0, -1, -1], [-0.5, -2, -3], [3, -1, -1]])
    r = torch.tensor([5.0, -1, -1])
    model = ArcScorer(Encoder(Standardize(np.zeros(3), np.ones(3))), 3, 3)
    with torch.no_grad():
        model.dep.weight.copy_(torch.eye(3))
        model.head.weight.copy_(M)
        model.root.copy_(r)
    x = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1]]
    sents = [DepSentence(["a", "b", "c"], [0, 1, 2], ["root", "obj", "obj"]),
             DepSentence(["a", "b"], [2, 0], ["nsubj", "root"])]
    trees = Trees.build(sents, {"nsubj": 0, "obj": 1, "root": 2})
    # Predicted heads: [ROOT, 1, 1] and [ROOT, 1]. In the short sentence every real candidate of word 2
    # scores below 0, the padding's score: it must be masked, not chosen.
    correct = evaluate(model, x, trees)
    assert correct.tolist() == [True, True, False, False, False]
    assert sentence_counts(correct, trees.offsets).tolist() == [[2, 3], [0, 2]]   # UAS 2/5
    assert correct.mean() == pytest.approx(0.4)
    # The trivial parsers: "The cat sleeps" (heads 2 3 0) is all right-neighbour.
    offsets = np.array([0, 3])
    assert neighbour_heads(offsets, 1).tolist() == [2, 3, 0]
    assert neighbour_heads(offsets, -1).tolist() == [0, 1, 2]
    # The label probe's ROOT arc sees a zero head vector: [x_dep; 0; 0].
    seen = []
    lab = LabelScorer(Encoder(Standardize(np.zeros(3), np.ones(3))), 3, 3)
    lab.out.register_forward_hook(lambda m, i, o: seen.append(i[0]))
    lab(torch.from_numpy(x), Batch.of(trees, np.array([0, 1])))
    z = seen[0]
    assert torch.equal(z[0], torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0, 0]))          # word a -> ROOT
    assert torch.equal(z[1], torch.tensor([0.0, 1, 0, 1, 0, 0, 0, 0, 0]))          # word b -> a


def test_tree_distances_spanning_tree_and_uuas_of_a_hand_set_probe():
    from torchelmo.probe.common import Standardize
    from torchelmo.probe.deps import (
        Batch,
        DistanceProbe,
        Encoder,
        Trees,
        evaluate,
        sentence_counts,
        spanning_tree,
        tree_distances,
    )
    # 'DET NOUN VERB DET NOUN .': heads 2 3 0 5 3 3; the VERB (3) is the hub.
    heads = np.array([2, 3, 0, 5, 3, 3])
    d = tree_distances(heads)
    assert d[0].tolist() == [0, 1, 2, 4, 3, 3] and (d == d.T).all() and d[3, 5] == 3
    assert tree_distances(np.array([2, 1])).tolist() == [[0, 1], [1, 0]]           # a cycle: still a graph
    assert tree_distances(np.array([0, 0]))[0, 1] == -1                            # two roots: no path
    assert spanning_tree(d.astype(float)) == {(0, 1), (1, 2), (3, 4), (2, 4), (2, 5)}
    assert spanning_tree(np.zeros((1, 1))) == set()
    # A probe whose B maps each word to a point at its tree position, but word 6 (the '.') placed
    # beside word 5: the spanning tree then joins 5-6 instead of 3-6 (4 of 5 edges right).
    pts = torch.tensor([[0.0, 0], [1, 0], [2, 0], [3, -1], [3, 0], [3.2, 0.1]])
    model = DistanceProbe(Encoder(Standardize(np.zeros(6), np.ones(6))), 6, 2)
    with torch.no_grad():
        model.proj.weight.copy_(pts.T)
    x = np.eye(6, dtype=np.float32)
    sents = [DepSentence(list("abcdef"), heads.tolist(), ["det", "nsubj", "root", "det", "obj", "punct"])]
    trees = Trees.build(sents, {"det": 0})
    correct = evaluate(model, x, trees)
    assert correct.tolist() == [True, True, False, True, True, False]   # the root's dependent has no edge
    assert sentence_counts(correct, trees.offsets, trees.heads > 0).tolist() == [[4, 5]]
    # The loss: |predicted - gold| over the pairs, divided by the squared length.
    b = Batch.of(trees, np.array([0]))
    want = (model(torch.from_numpy(x), b)[0] - torch.from_numpy(d).float()).abs().sum() / 36
    assert model.loss(torch.from_numpy(x), b).item() == pytest.approx(want.item())


def test_the_structural_probes_distances_are_the_squared_pairwise_differences():
    # Two sentences of different lengths in one padded batch: every pair's distance, and the
    # gradient of a loss through them, equal those of the differences taken one pair at a time.
    from torchelmo.probe.common import Standardize
    from torchelmo.probe.deps import Batch, DistanceProbe, Encoder, Trees
    sents = [DepSentence(list("abcde"), [2, 0, 2, 5, 2], ["x"] * 5), DepSentence(list("ab"), [0, 1], ["x"] * 2)]
    trees = Trees.build(sents, {"x": 0})
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((7, 8)).astype(np.float32))
    torch.manual_seed(0)
    model = DistanceProbe(Encoder(Standardize(np.zeros(8), np.ones(8))), 8, 3)
    b = Batch.of(trees, np.array([0, 1]))
    got = model(x, b)
    assert got.shape == (2, 5, 5)
    u = model.proj(x)
    for s, (a, n) in enumerate([(0, 5), (5, 2)]):
        want = ((u[a:a + n, None] - u[None, a:a + n]) ** 2).sum(-1)
        assert torch.allclose(got[s, :n, :n], want, atol=1e-5)
    g_fast = torch.autograd.grad(got[1, :2, :2].sum() + got[0].sum(), model.proj.weight)[0]
    g_ref = torch.autograd.grad((((u[:5, None] - u[None, :5]) ** 2).sum()
                                 + ((u[5:, None] - u[None, 5:]) ** 2).sum()), model.proj.weight)[0]
    assert torch.allclose(g_fast, g_ref, rtol=1e-4, atol=1e-4)


def test_the_structural_probe_learns_a_tree_that_the_features_hold():
    # Features: each word's position one-hot, plus noise; every sentence has the same tree, so a
    # linear map can place the words where their squared distances are the tree's.
    from torchelmo.probe.common import Standardize
    from torchelmo.probe.deps import DepsConfig, DistanceProbe, Encoder, Trees, evaluate, fit_probe
    rng = np.random.default_rng(0)
    heads = [2, 3, 0, 5, 3, 3]
    sents = [DepSentence(list("abcdef"), heads, ["x"] * 6) for _ in range(40)]
    trees = Trees.build(sents, {"x": 0})
    x = (np.tile(np.eye(6), (40, 1)) + 0.05 * rng.standard_normal((240, 6))).astype(np.float32)
    torch.manual_seed(0)
    model = DistanceProbe(Encoder(Standardize.fit(x)), 6, 6)
    before = evaluate(model, x, trees)[trees.heads > 0].mean()
    info = fit_probe(model, x, trees, x, trees, DepsConfig(rank=6, lr=0.05, max_epochs=40, patience=40))
    after = evaluate(model, x, trees)[trees.heads > 0].mean()
    assert after == 1.0 and info["dev_acc"] == 1.0 and before < 1.0


# -- end to end on the tiny fixture model ----------------------------------------------------------

def test_cli_tag_end_to_end(allennlp_dir, tmp_path, capsys):
    from torchelmo.cli import main

    def write(path, sents):   # token, position, PTB tag
        lines = ["# s\n" + "".join(f"{w} {i} {t}\n" for i, (w, t) in enumerate(zip(words, tags))) + "\n"
                 for words, tags, _, _ in sents]
        path.write_text("".join(lines))
        return path

    train, test = write(tmp_path / "train.txt", toy(30, 0)), write(tmp_path / "test.txt", toy(8, 1))
    out = tmp_path / "out"
    args = ["probe", "tag", str(train), str(test), "--column", "2", "--model", str(allennlp_dir),
            "--out", str(out), "--cache", str(tmp_path / "cache"), "--no-control", "--n-boot", "50",
            "--max-epochs", "2", "-q"]
    assert main(args) == 0
    assert "no --dev: the last 3 of the 30 sentences of" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())["tag"]
    assert {"E0", "E1", "E2", "mix", "mix_weights", "intervals", "paired"} <= set(res)
    assert res["data"]["sentences"] == [27, 3, 8]
    assert res["details"]["trained"]["labels"] == [".", "DT", "NN", "VBZ"]
    report = (out / "report.md").read_text()
    assert "## Tags `tag` (accuracy, %)" in report and (out / "tag_layers.png").is_file()
    # --dev and --name: another key beside the first.
    capsys.readouterr()
    assert main(args[:6] + ["--dev", str(test), "--name", "toy"] + args[6:-1]) == 0     # not quiet
    said = capsys.readouterr().out.splitlines()
    assert any(line.startswith("tag:toy: E1 test acc") for line in said) and not any(
        line.startswith("pos:") for line in said), said
    res = json.loads((out / "results.json").read_text())
    assert {"tag", "tag:toy"} <= set(res) and res["tag:toy"]["data"]["dev"] == str(test)
    assert "## Tags `tag:toy`" in (out / "report.md").read_text()
    # A line with a column too many: one line naming the file and line, exit code 1.
    test.write_text("the 0 DT\ncat 1 NN extra\n")
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("elmo probe: error:") and "test.txt:2: 4 column(s)" in err[-1]


def test_cli_deps_end_to_end_with_control(allennlp_dir, tmp_path, capsys):
    from torchelmo.cli import main
    files = {}
    for split, (n, seed) in {"train": (40, 0), "dev": (8, 1), "test": (8, 2)}.items():
        files[split] = tmp_path / f"{split}.conllu"
        files[split].write_text(conllu_text(toy(n, seed), extras=True))
    out = tmp_path / "out"
    assert main(["probe", "deps", "--train", str(files["train"]), "--dev", str(files["dev"]), "--test",
                 str(files["test"]), "--model", str(allennlp_dir), "--out", str(out),
                 "--cache", str(tmp_path / "c"),
                 "--n-boot", "50", "--max-epochs", "2", "-qq"]) == 0
    res = json.loads((out / "results.json").read_text())["deps"]
    for task in ("uas", "labels"):
        s = res[task]
        assert {"E0", "E1", "E2", "mix", "mix_weights", "gamma", "intervals", "paired", "baseline",
                "control_random"} <= set(s)
        assert all(0 <= s[k] <= 1 and s["intervals"][k][0] <= s[k] <= s["intervals"][k][1] for k in ("E0", "mix"))
        assert len(s["mix_weights"]) == 3 and {"E0", "E1", "E2", "mix"} <= set(s["control_random"])
    # Baselines on 'DET NOUN VERB DET NOUN .' (heads 2 3 0 5 3 3): left neighbours (0 1 2 3 4 5) get
    # none, right neighbours (2 3 4 5 6 0) the two determiners and the subject.
    assert res["uas"]["baseline"] == {"left neighbour": 0.0, "right neighbour": 0.5}
    assert res["labels"]["details"]["trained"]["labels"] == ["det", "nmod", "nsubj", "obj", "punct", "root"]
    assert res["n_test_words"] == 48
    report = (out / "report.md").read_text()
    for head in ("## Dependency arcs (UAS, %)", "## Dependency labels (label accuracy, %)",
                 "Expected ordering E1 > E2 for Dependency arcs", "| baseline: left neighbour |"):
        assert head in report
    assert (out / "deps_uas_layers.png").is_file() and (out / "mix_weights.png").is_file()
    # Two probe seeds, resampled by document (here each sentence is one): each seed's score kept,
    # and the per-sentence counts beside the results.
    assert main(["probe", "deps", "--train", str(files["train"]), "--dev", str(files["dev"]), "--test",
                 str(files["test"]), "--model", str(allennlp_dir), "--out", str(out), "--no-control",
                 "--cache", str(tmp_path / "c"), "--n-boot", "50", "--max-epochs", "2", "-qq",
                 "--probe-seeds", "2", "--resample", "documents"]) == 0
    res = json.loads((out / "results.json").read_text())["deps"]
    assert len(res["uas"]["details"]["trained"]["layers"]["E1"]["seeds"]) == 2 and res["n_test_documents"] == 8
    units = json.loads((out / "units.json").read_text())["deps/uas/details/trained"]
    assert units["seeds"] == 2 and units["documents"] == [f"s{k}" for k in range(8)]
    assert len(units["counts"]["E1"]) == 8 and len(units["counts"]["E1"][0]) == 4
    assert "Each probe trained with 2 seeds, the score their mean (sd over seeds, points: E0 " in (out / "report.md").read_text()
    # Where each layer's arcs are right: by the distance to the gold head ('DET NOUN VERB DET NOUN .',
    # heads 2 3 0 5 3 3: distances 1 1 root 1 2 3 in each of the 8 test sentences).
    d = res["uas"]["by_distance"]
    assert d["buckets"] == ["root", "1", "2", "3-6", "7+"] and d["words"] == [8, 24, 8, 8, 0]
    assert all(0 <= v <= 1 for v in d["E1"][:4]) and d["E1"][4] is None
    assert "| 3-6 | 8 |" in (out / "report.md").read_text()
    # The structural probe beside the arcs, with the chain of neighbours as its baseline (edges
    # 1-2, 2-3, 4-5 of the gold 1-2, 2-3, 4-5, 5-3, 6-3: 3 of 5), and E2 without its residual.
    u = res["uuas"]
    assert u["baseline"] == {"chain": 0.6} and {"E0", "E1", "E2", "E2 (no residual)", "mix"} <= set(u)
    assert set(u["paired"]) == {"E2-E1", "E2 (no residual)-E1", "E2-E2 (no residual)"}
    assert u["by_distance"]["words"] == [0, 24, 8, 8, 0]     # the root's dependent has no edge
    assert "E2 (no residual)" in res["uas"] and "E2 (no residual)" not in res["labels"]
    # ... and again under Hewitt & Manning's schedule (kept by dev loss): its fits carry the loss.
    h = res["uuas_hm"]
    assert h["baseline"] == {"chain": 0.6} and {"E0", "E1", "E2", "E2 (no residual)", "mix"} <= set(h)
    fit = h["details"]["trained"]["layers"]["E1"]
    assert fit["dev_loss"] == pytest.approx(min(fit["dev_history"])) and 0 <= fit["dev_acc"] <= 1
    report = (out / "report.md").read_text()
    assert "## Dependency tree distances (structural probe) (UUAS, %)" in report
    assert "## Dependency tree distances (structural probe, Hewitt & Manning's schedule) (UUAS, %)" in report
    assert "| E2 (no residual) |" in report
    assert "intervals resample the test documents" in (out / "report.md").read_text()
    # Nothing to default the files from: a one-line error.
    capsys.readouterr()
    assert main(["probe", "deps", "--model", str(allennlp_dir), "--out", str(out), "--no-control", "-q"]) == 1
    assert "--train: give the CoNLL-U file, or --data" in capsys.readouterr().err


def test_cli_context_document_carries_the_state_through_each_document(allennlp_dir, tmp_path, capsys):
    # --context document: each split's sentences get their document's carried state (features
    # cached apart from the zero-state ones), and the results and report say so; a tag file names
    # no documents, so there it is one line.
    from torchelmo.cli import main
    files = {}
    for split, (n, seed) in {"train": (24, 0), "dev": (8, 1), "test": (8, 2)}.items():
        files[split] = tmp_path / f"{split}.conllu"
        files[split].write_text(conllu_text(toy(n, seed), doc_every=4))
    args = ["--train", str(files["train"]), "--dev", str(files["dev"]), "--test", str(files["test"]),
            "--model", str(allennlp_dir), "--cache", str(tmp_path / "c"), "--no-control", "--n-boot", "20",
            "--max-epochs", "1", "-qq"]
    for context in ("sentence", "document"):
        assert main(["probe", "deps", *args, "--out", str(tmp_path / context), "--context", context]) == 0
    cached = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert len(cached) == 6 and sum("-doc" in n for n in cached) == 3
    doc = json.loads((tmp_path / "document" / "results.json").read_text())["deps"]
    assert doc["context"] == "document" and doc["uas"]["context"] == "document"
    assert "--context document" in (tmp_path / "document" / "report.md").read_text()
    assert "--context document" not in (tmp_path / "sentence" / "report.md").read_text()
    tags = tmp_path / "tags.txt"
    tags.write_text("the DT\ncat NN\n\na DT\ndog NN\n")
    capsys.readouterr()
    assert main(["probe", "tag", str(tags), str(tags), "--column", "1", "--model",
                 str(allennlp_dir), "--out", str(tmp_path / "t"), "--no-control", "--context", "document",
                 "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tag train: --context document:" in err[0] and "sentences name no document" in err[0]


def test_cli_all_runs_pos_wsj_and_deps_from_the_data_layout(allennlp_dir, tmp_path, capsys):
    from torchelmo.cli import main
    from torchelmo.commands.probe import DATA_LAYOUT
    data = tmp_path / "data"
    for path, (n, seed) in zip(DATA_LAYOUT["pos"], ((30, 0), (8, 1), (8, 2))):
        (data / path).parent.mkdir(parents=True, exist_ok=True)
        (data / path).write_text(conllu_text(toy(n, seed)))
    (data / DATA_LAYOUT["treebank"]).parent.mkdir(parents=True)
    write_treebank(data / DATA_LAYOUT["treebank"], {3: mrg_text(toy(30, 3)), 170: mrg_text(toy(6, 4)),
                                                    190: mrg_text(toy(6, 5))})
    out = tmp_path / "out"
    base = ["probe", "all", "--model", str(allennlp_dir), "--data", str(data), "--out", str(out),
            "--cache", str(tmp_path / "c"), "--no-control", "--n-boot", "50", "--max-epochs", "2", "-qq"]
    assert main(base + ["--tasks", "pos_wsj,deps,pos_xpos"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res) == {"model", "pos_wsj", "deps", "pos_xpos"}
    # UD EWT's PTB tags, on the features the UPOS probe extracts (one cache entry per split).
    assert res["pos_xpos"]["details"]["trained"]["labels"] == [".", "DT", "NN", "VBZ"]
    assert res["pos_xpos"]["data"]["tagset"] == "xpos"
    assert {p.name.split("-")[0] for p in (tmp_path / "c").glob("*.h5")} == {"pos", "wsj"}
    assert res["pos_wsj"]["data"]["sentences"] == [30, 6, 6] and "mix_weights" in res["pos_wsj"]
    assert res["pos_wsj"]["details"]["trained"]["labels"] == [".", "DT", "NN", "VBZ"]
    report = (out / "report.md").read_text()
    assert "## WSJ POS (accuracy, %)" in report and "Paper's ordering E1 > E2 for WSJ POS" in report
    assert "| E1 |" in report.split("## WSJ POS")[1] and "## Dependency labels" in report
    assert "Expected ordering E1 > E2 for UD EWT POS, PTB tags (XPOS)" in report
    # `probe report` redraws from results.json alone.
    (out / "report.md").unlink()
    assert main(["probe", "report", "--out", str(out)]) == 0 and (out / "report.md").read_text() == report
    capsys.readouterr()
    assert main(base + ["--tasks", "pos,parse"]) == 1
    assert "unknown task(s) parse; choose from pos, pos_xpos, pos_wsj, deps, wsd, coref, ner" in capsys.readouterr().err
    # All tasks by default; a missing input stops the run before the first task, naming the file.
    (out / "results.json").unlink()
    assert main(base) == 1 and not (out / "results.json").exists()
    assert "semcor.data.xml.gz: no such file (needed by task wsd" in capsys.readouterr().err


def _fake_run(folder, e1, e2, ci):
    from torchelmo.probe.report import write_results
    folder.mkdir(parents=True)
    task = {"E0": 0.8, "E1": e1, "E2": e2, "mix": max(e1, e2), "mix_weights": [0.2, 0.5, 0.3],
            "intervals": {"E0": [0.79, 0.81], "E1": [e1 - 0.01, e1 + 0.01], "E2": [e2 - 0.01, e2 + 0.01],
                          "mix": [0.8, 0.95]},
            "paired": {"E2-E1": {"diff": e2 - e1, "ci": ci}}}
    write_results(folder / "results.json", {"pos_wsj": task, "coref": {**task, "mix_weights": [0.1, 0.2, 0.7]}})


@pytest.mark.core
def test_cli_compare_runs_side_by_side(tmp_path, capsys):
    from torchelmo.cli import main
    _fake_run(tmp_path / "default", 0.90, 0.90, [-0.004, 0.004])       # no ordering
    _fake_run(tmp_path / "big", 0.95, 0.93, [-0.03, -0.01])            # E1 > E2
    out = tmp_path / "cmp"
    assert main(["probe", "compare", str(tmp_path / "default"), f"science@40000000={tmp_path / 'big'}",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "comparison.json").read_text())
    assert [r["label"] for r in summary["runs"]] == ["default", "science"]
    assert summary["runs"][1]["tokens"] == 40_000_000
    wsj, coref = summary["tasks"]["pos_wsj"], summary["tasks"]["coref"]
    assert wsj["expected"] == ["E1", "E2"] and coref["expected"] == ["E2", "E1"]
    assert wsj["runs"]["default"]["verdict"] == "not shown" and wsj["runs"]["science"]["verdict"] == "shown"
    assert coref["runs"]["science"]["verdict"] == "reversed"
    md = (out / "comparison.md").read_text()
    assert "| E1 | 90.0 [89.0, 91.0] | 95.0 [94.0, 96.0] |" in md
    assert "| mix weights E0 / E1 / E2 | 0.20 / 0.50 / 0.30 | 0.20 / 0.50 / 0.30 |" in md
    assert "WSJ POS, science: E1 > E2 **shown**" in md and "science 40.0M" in md
    from torchelmo.probe.report import plots_available
    if plots_available():   # the figure needs the plots extra; the tables do not
        assert "![E2 - E1 per task and model" in md and (out / "gaps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "gaps.png" not in md and not (out / "gaps.png").exists()
    assert main(["probe", "compare", str(tmp_path / "nothing"), "--out", str(out)]) == 1
    assert "no results.json" in capsys.readouterr().err
