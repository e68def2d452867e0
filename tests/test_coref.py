"""torchelmo.probe.litbank (the LitBank reader, the split by novel) and torchelmo.probe.coref (mention
pairs, the pair probe)."""

import json
import random

import numpy as np
import pytest

from conftest import SHARED
from torchelmo import ElmoError
from torchelmo.probe.coref import CorefConfig, build_pairs, head_match, probe_coref, run_coref, unit_counts
from torchelmo.probe.litbank import (
    CorefDocument,
    Mention,
    part_sizes,
    read_litbank,
    read_litbank_file,
    split_documents,
)
from torchelmo.probe.stats import f1_from_counts

pytestmark = pytest.mark.usefixtures("one_thread")


def conll(name, sentences):
    """A LitBank-style file: ``sentences`` are lists of (token, chains cell) pairs."""
    lines = [f"#begin document ({name}); part 0"]
    for s in sentences:
        lines += [f"{name}\t0\t{i}\t{tok}\t_\t_\t_\t_\t_\t_\t_\t_\t{cell}" for i, (tok, cell) in enumerate(s)]
        lines.append("")
    return "\n".join(lines + ["#end document", ""])


ALICE = [[("Alice", "(1)"), ("was", ""), ("tired", ""), ("of", ""), ("her", "(2|(1)"), ("sister", "2)"),
          (".", "")],
         [("She", "(1)"), ("saw", "_"), ("the", "(3"), ("White", "(4"), ("Rabbit", "4)|3)"), ("and", "-"),
          ("it", "(3)"), ("ran", "")]]


def test_reader_nested_one_token_and_several_per_cell(tmp_path):
    p = tmp_path / "11_alice_brat.conll"
    p.write_text(conll("11_alice_brat", ALICE))
    d = read_litbank_file(p)
    assert d.name == "11_alice_brat"
    assert d.sentences == [[t for t, _ in s] for s in ALICE] and d.n_tokens == 15
    assert d.mentions == [Mention(0, 0, 1, 1), Mention(0, 4, 5, 1), Mention(0, 4, 6, 2),
                          Mention(1, 0, 1, 1), Mention(1, 2, 5, 3), Mention(1, 3, 5, 4), Mention(1, 6, 7, 3)]
    # "N)|(N" closes one mention of N and opens the next; space-aligned columns also read.
    q = tmp_path / "b.conll"
    q.write_text("#begin document (b)\nb 0 0 a (1\nb 0 1 b 1)|(1\nb 0 2 c 1)\n\n#end document\n")
    assert read_litbank_file(q).mentions == [Mention(0, 0, 2, 1), Mention(0, 1, 3, 1)]


@pytest.mark.parametrize("text, match", [
    (conll("x", [[("a", "1)")]]), r"x\.conll:2: '1\)' closes entity 1, which has no open mention"),
    (conll("x", [[("a", "(1")], [("b", "1)")]]), r"x\.conll:2: the mention of entity 1 .* not closed before "
                                                 r"the end of its sentence \(line 3\)"),
    (conll("x", [[("a", "(1"), ("b", "")]]), r"x\.conll:2: .*not closed"),
    (conll("x", [[("a", "(x)")]]), r"x\.conll:2: bad coreference part '\(x\)'"),
    (conll("x", [[("a", "(1)||(2)")]]), r"x\.conll:2: bad coreference part ''"),
    ("#begin document (x)\nx\t0\t0\ta\n\n#end document\n", r"x\.conll:2: expected at least 5 columns"),
    ("#begin document (x)\nx 0 0 a _ (1)\n", r"x\.conll: no '#end document'"),
    ("x 0 0 a _ (1)\n", r"x\.conll:1: a token line outside"),
    ("x 0 0 a _ (1)\n".join(["#begin document (x)\n", "\n#end document\n#begin document (y)\n"]),
     r"x\.conll:5: a second '#begin document'"),
    ("", r"x\.conll: no '#begin document'"),
])
def test_reader_bad_input_names_file_and_line(tmp_path, text, match):
    p = tmp_path / "x.conll"
    p.write_text(text)
    with pytest.raises(ElmoError, match=match) as e:
        read_litbank_file(p)
    assert "\n" not in str(e.value)


def test_read_folder(tmp_path):
    with pytest.raises(ElmoError, match="no such folder"):
        read_litbank(tmp_path / "none")
    with pytest.raises(ElmoError, match=r"no \*\.conll files"):
        read_litbank(tmp_path)
    for n in ("b", "a", "c"):
        (tmp_path / f"{n}.conll").write_text(conll(n, ALICE))
    assert [d.name for d in read_litbank(tmp_path)] == ["a", "b", "c"]


def docs_named(names):
    return [CorefDocument(n, [["x"]], []) for n in names]


@pytest.mark.core
def test_split_by_novel_is_the_seeded_shuffle():
    names = [f"{k}_novel_brat" for k in range(100)]
    random.Random(7).shuffle(names)  # input order does not matter: the names are sorted first
    parts = split_documents(docs_named(names))
    assert [len(p) for p in parts] == [70, 10, 20]
    expected = sorted(names)
    random.Random(0).shuffle(expected)
    for p, (a, b) in zip(parts, ((0, 70), (70, 80), (80, 100))):
        assert [d.name for d in p] == sorted(expected[a:b])
    assert [[d.name for d in p] for p in split_documents(docs_named(names[::-1]))] == \
        [[d.name for d in p] for p in parts]
    assert set().union(*[{d.name for d in p} for p in parts]) == set(names)
    other = split_documents(docs_named(names), seed=1)
    assert {d.name for d in other[2]} != {d.name for d in parts[2]}
    # Fewer documents: in proportion, and no part empty from 3 documents on.
    assert part_sizes(10, (70, 10, 20)) == [7, 1, 2]
    for n in range(3, 40):
        s = part_sizes(n, (70, 10, 20))
        assert sum(s) == n and min(s) >= 1
    assert [len(p) for p in split_documents(docs_named("abc"))] == [1, 1, 1]
    with pytest.raises(ElmoError, match="share a name"):
        split_documents(docs_named("aab"))


@pytest.mark.core
def test_pairs_labels_and_units_by_hand():
    d = CorefDocument("a", [["Alice", "saw", "her", "sister"], ["She", "left", "."]],
                      [Mention(1, 0, 1, 1), Mention(0, 2, 4, 2), Mention(0, 0, 1, 1), Mention(0, 2, 3, 1)])
    e = CorefDocument("b", [["It", "rained", "."]], [Mention(0, 0, 1, 5)])
    cs = build_pairs([d, e])
    # Document order: Alice(1), her(1), her sister(2), She(1); then b's only mention (no pairs).
    assert cs.spans == [(0, 0, 1), (0, 2, 3), (0, 2, 4), (1, 0, 1), (2, 0, 1)]
    assert cs.heads == ["alice", "her", "sister", "she", "it"]
    assert cs.pairs.tolist() == [[0, 1], [0, 2], [1, 2], [0, 3], [1, 3], [2, 3]]
    assert cs.labels.tolist() == [1, 0, 0, 1, 1, 0]
    assert cs.units.tolist() == [0, 1, 1, 2, 2, 2]
    assert (cs.n_units, cs.n_anaphoric, cs.n_entities, cs.n_documents) == (3, 2, 3, 2)
    assert head_match(cs).tolist() == [False] * 6
    assert build_pairs([d], max_antecedents=1).pairs.tolist() == [[0, 1], [1, 2], [2, 3]]


@pytest.mark.core
def test_pairs_window_of_50():
    ms = [Mention(0, k, k + 1, k % 7) for k in range(60)]
    cs = build_pairs([CorefDocument("a", [["w"] * 60], ms)])
    assert len(cs.pairs) == sum(min(j, 50) for j in range(60)) and cs.n_units == 59
    last = cs.pairs[cs.units == 58]
    assert last[:, 1].tolist() == [59] * 50 and last[:, 0].tolist() == list(range(9, 59))
    assert (cs.labels == (cs.pairs[:, 0] % 7 == cs.pairs[:, 1] % 7)).all()


@pytest.mark.core
def test_pairwise_f1_counts_by_hand():
    labels = np.array([1, 0, 0, 1, 1, 0])
    pred = np.array([1, 1, 0, 0, 1, 0])
    units = np.array([0, 1, 1, 2, 2, 2])
    c = unit_counts(pred, labels, units, 3)
    assert c.tolist() == [[1, 0, 0], [0, 1, 0], [1, 0, 1]]
    assert f1_from_counts(c.sum(0)) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
    assert f1_from_counts(unit_counts(np.zeros(6), labels, units, 3).sum(0)) == 0


def synthetic(n_docs, rng, n_mentions=30, n_entities=5):
    docs = []
    for k in range(n_docs):
        ents = rng.integers(0, n_entities, n_mentions)
        docs.append(CorefDocument(f"d{k}", [[f"w{t}" for t in range(n_mentions)]],
                                  [Mention(0, t, t + 1, int(e)) for t, e in enumerate(ents)]))
    return docs


@pytest.mark.core
def test_run_coref_learns_an_oracle_layer():
    """E0 a noisy code of the entity, E1 noise, E2 the clean code: the probe must tell them apart."""
    rng = np.random.default_rng(0)
    docs = [synthetic(n, rng) for n in (12, 3, 4)]
    sets = [build_pairs(ds) for ds in docs]
    code = 4 * np.linalg.qr(rng.normal(size=(16, 16)))[0][:5]  # orthogonal: m_i * m_j sums to 0 or 16
    xs = []
    for ds in docs:
        clean = np.stack([code[m.entity] for doc in ds for m in sorted(doc.mentions)]).astype(np.float32)
        noise = rng.normal(size=clean.shape).astype(np.float32)
        xs.append(np.stack([clean + 0.5 * noise, noise, clean]).astype(np.float16))
    logs = []
    r = run_coref(*xs, tuple(sets), CorefConfig(max_epochs=10, lr=1e-2, batch_size=256, n_boot=100),
                  log=logs.append)
    assert r["layers"]["E2"]["f1"] > 0.95 and r["layers"]["E0"]["f1"] > 0.9
    assert r["layers"]["E1"]["f1"] < 0.5
    assert r["paired"]["E2-E1"]["ci"][0] > 0.3
    assert r["mix"]["f1"] > 0.9 and max(r["mix"]["weights"]) == r["mix"]["weights"][2]
    assert r["baselines"]["majority"]["f1"] == 0
    assert r["counts"]["train"]["pairs"] == len(sets[0].labels) and len(logs) >= 6
    with pytest.raises(ElmoError, match="test features .* do not match"):
        run_coref(xs[0], xs[1], xs[1], tuple(sets), log=logs.append)


@pytest.mark.core
def test_run_coref_seeds_and_novels():
    """Two seeds, resampled by novel: each score the seeds' mean, intervals from the stored counts."""
    from torchelmo.probe.stats import bootstrap_ci, seed_mean
    rng = np.random.default_rng(1)
    docs = [synthetic(n, rng) for n in (8, 2, 5)]
    sets = [build_pairs(ds) for ds in docs]
    code = 4 * np.linalg.qr(rng.normal(size=(16, 16)))[0][:5]
    xs = []
    for ds in docs:
        clean = np.stack([code[m.entity] for doc in ds for m in sorted(doc.mentions)]).astype(np.float32)
        noise = rng.normal(size=clean.shape).astype(np.float32)
        xs.append(np.stack([clean + 2.0 * noise, noise, clean + noise]).astype(np.float16))
    cfg = CorefConfig(max_epochs=3, lr=1e-2, batch_size=256, n_boot=100, seeds=2, documents=True)
    r = run_coref(*xs, tuple(sets), cfg, log=lambda m: None)
    u = r["units"]
    assert u["resampled"] == "documents" and u["seeds"] == 2
    assert sorted(set(u["documents"])) == [f"d{k}" for k in range(5)] and len(u["documents"]) == sets[2].n_units
    for name in ("E0", "E1", "E2", "mix"):
        s = r["mix"] if name == "mix" else r["layers"][name]
        c = np.array(u["counts"][name])
        assert s["f1"] == pytest.approx(np.mean(s["seeds"])) and len(s["fits"]) == 2
        assert s["ci"] == list(bootstrap_ci(c, seed_mean(f1_from_counts, 3), 100, groups=u["documents"])[1:])
    assert len(r["mix"]["seed_weights"]) == 2
    # By novel, the interval is as wide as five novels make it: wider than by mention.
    by_mention = bootstrap_ci(np.array(u["counts"]["E2"]), seed_mean(f1_from_counts, 3), 100)
    assert r["layers"]["E2"]["ci"][1] - r["layers"]["E2"]["ci"][0] > by_mention[2] - by_mention[1]


def test_probe_coref_end_to_end(fixture_model, tmp_path):
    data = tmp_path / "litbank"
    data.mkdir()
    for k in range(3):
        (data / f"{k}_doc_brat.conll").write_text(conll(f"{k}_doc_brat", ALICE))
    logs = []
    r = probe_coref(fixture_model, data, cache=tmp_path / "cache", log=logs.append,
                    cfg=CorefConfig(n_boot=50, max_epochs=2))
    json.dumps(r)
    assert [r["counts"][s]["documents"] for s in ("train", "dev", "test")] == [1, 1, 1]
    assert r["counts"]["test"] == {"documents": 1, "sentences": 2, "mentions": 7, "entities": 4, "pairs": 21,
                                   "positive_pairs": 4, "units": 6, "anaphoric_mentions": 3}
    for res in [*r["layers"].values(), r["mix"], *r["baselines"].values()]:
        assert 0 <= res["ci"][0] <= res["f1"] <= res["ci"][1] <= 1
    assert list(r["layers"]) == ["E0", "E1", "E2"] and len(r["mix"]["weights"]) == 3
    assert r["mix"]["gamma"] > 0 and r["config"]["max_epochs"] == 2
    p = r["paired"]["E2-E1"]
    assert p["diff"] == pytest.approx(r["layers"]["E2"]["f1"] - r["layers"]["E1"]["f1"])
    assert r["layers"]["E0"]["pos_weight"] == pytest.approx(17 / 4)
    assert sorted(sum(r["documents"].values(), [])) == ["0_doc_brat", "1_doc_brat", "2_doc_brat"]
    assert len(list((tmp_path / "cache").glob("coref-*.h5"))) == 3
    with pytest.raises(ElmoError, match="at least 3 documents"):
        probe_coref(fixture_model, data, cache=tmp_path / "cache", limit_docs=2, log=logs.append)
    # With each novel's context carried from sentence to sentence: other features (cached apart),
    # the same pairs; the first sentence's mentions are as before.
    rc = probe_coref(fixture_model, data, cache=tmp_path / "cache", log=logs.append,
                     cfg=CorefConfig(n_boot=50, max_epochs=2, context="document"))
    assert rc["config"]["context"] == "document" and rc["counts"] == r["counts"]
    assert len(list((tmp_path / "cache").glob("coref-*.h5"))) == 6
    with pytest.raises(ElmoError, match="context must be 'sentence' or 'document'"):
        probe_coref(fixture_model, data, cache=tmp_path / "cache", cfg=CorefConfig(context="novel"))


LITBANK = SHARED / "data" / "coref" / "litbank"


@pytest.mark.skipif(not LITBANK.is_dir(), reason="LitBank is not in ../shared/data")
def test_real_litbank_reads_whole():
    docs = read_litbank(LITBANK)
    assert len(docs) == 100
    assert sum(len(d.sentences) for d in docs) == 8562 and sum(d.n_tokens for d in docs) == 210532
    assert sum(len(d.mentions) for d in docs) == 29103  # the LitBank paper's count
    for d in docs:
        assert d.mentions and d.mentions == sorted(set(d.mentions))
        for m in d.mentions:
            assert 0 <= m.start < m.end <= len(d.sentences[m.sentence])
    parts = split_documents(docs)
    assert [len(p) for p in parts] == [70, 10, 20]
    assert "2489_moby_dick_brat" in {d.name for d in parts[2]}


def test_cli_coref_end_to_end_with_control_and_report(allennlp_dir, tmp_path, capsys):
    from torchelmo.cli import main
    data = tmp_path / "data" / "coref" / "litbank"
    data.mkdir(parents=True)
    for k in range(3):
        (data / f"{k}_doc_brat.conll").write_text(conll(f"{k}_doc_brat", ALICE))
    out = tmp_path / "out"
    assert main(["probe", "coref", "--data", str(tmp_path / "data"), "--model", str(allennlp_dir), "--out",
                 str(out), "--cache", str(tmp_path / "c"), "--n-boot", "50", "--coref-epochs", "2", "-qq"]) == 0
    res = json.loads((out / "results.json").read_text())["coref"]
    assert {"E0", "E1", "E2", "mix", "mix_weights", "intervals", "paired", "baseline", "control_random",
            "counts"} <= set(res)
    assert all(0 <= res[k] <= 1 for k in ("E0", "E1", "E2", "mix")) and res["baseline"]["majority"] == 0
    assert res["data"]["documents"]["test"] == ["2_doc_brat"] or len(res["data"]["documents"]["test"]) == 1
    report = (out / "report.md").read_text()
    assert "## Coreference (LitBank) (pairwise F1, %)" in report and "E2 > E1" in report
    capsys.readouterr()
    assert main(["probe", "coref", "--model", str(allennlp_dir), "--out", str(out), "-q"]) == 1
    assert "--litbank: give LitBank's coreference folder, or --data" in capsys.readouterr().err
