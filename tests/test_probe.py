"""torchelmo.probe: readers on the real files, feature cache, bootstrap, and the probes end to end on slices."""

import json

import numpy as np
import pytest
import torch

from conftest import shared_path
from torchelmo import ElmoError
from torchelmo.probe.conll import bio_spans, read_conll, read_conllu
from torchelmo.probe.features import extract, model_fingerprint, random_like
from torchelmo.probe.stats import accuracy_from_counts, bootstrap_ci, group_counts, paired_diff_ci, seed_mean


def ewt(split):
    return shared_path("data", "pos", "ud-english-ewt", f"en_ewt-ud-{split}.conllu")


def wnut(name):
    return shared_path("data", "ner", "wnut17", name)


EVAL = ("data", "wsd", "raganato-eval", "Evaluation_Datasets")


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _probe_cache_in_tmp(monkeypatch, tmp_path_factory):
    # `elmo probe` without --cache writes to $ELMO_PROBE_CACHE or ~/.cache: never the real home in tests.
    monkeypatch.setenv("ELMO_PROBE_CACHE", str(tmp_path_factory.mktemp("probe-cache")))


def tiny_deep_model(n_layers=5):
    """A random biLM with E0 .. E{n_layers}: deeper than the fixtures (2 LSTM layers)."""
    from torchelmo import BiLM, ElmoConfig
    torch.manual_seed(0)
    cfg = ElmoConfig(lstm_dim=12, projection_dim=5, char_embed_dim=3, n_highway=1,
                     filters=[[1, 4], [2, 4], [3, 6]], n_layers=n_layers)
    return BiLM(cfg).eval()


# -- readers -------------------------------------------------------------------------------------

def test_conllu_counts_match_the_release():
    train = read_conllu(ewt("train"))
    assert len(train) == 12544 and sum(len(s.tokens) for s in train) == 204577
    assert len({t for s in train for t in s.tags}) == 17
    assert len(read_conllu(ewt("dev"))) == 2001 and len(read_conllu(ewt("test"))) == 2077
    # Multi-word tokens are skipped, their syntactic words kept; XPOS are PTB tags.
    s = read_conllu(ewt("dev"), "xpos", limit=3)
    assert len(s) == 3 and s[0].tokens[:3] == ["From", "the", "AP"] and s[0].tags[:3] == ["IN", "DT", "NNP"]


def test_conllu_bad_input_names_file_and_line(tmp_path):
    good = "1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_\n"
    p = tmp_path / "bad.conllu"
    p.write_text("# c\n" + good + "2\tthere\tthere\tADV\n\n")
    with pytest.raises(ElmoError, match=r"bad\.conllu:3: expected 10"):
        read_conllu(p)
    p.write_text(good + good)
    with pytest.raises(ElmoError, match=r"bad\.conllu:2: word id 1 out of sequence"):
        read_conllu(p)
    with pytest.raises(ElmoError, match="tagset"):
        read_conllu(ewt("dev"), "lemma")
    with pytest.raises(ElmoError, match="no such file"):
        read_conllu(tmp_path / "missing.conllu")


def test_wnut_counts_and_bio():
    assert [len(read_conll(wnut(f))) for f in
            ("wnut17train.conll", "emerging.dev.conll", "emerging.test.annotated")] == [3394, 1009, 1287]
    s = read_conll(wnut("wnut17train.conll"), limit=1)[0]
    assert s.tokens[14:17] == ["Empire", "State", "Building"]
    assert (14, 17, "location") in bio_spans(s.tags)
    # conlleval: a stray I- starts an entity; a type change splits.
    assert bio_spans(["I-x", "I-x", "I-y", "O", "B-x", "B-x"]) == {(0, 2, "x"), (2, 3, "y"), (4, 5, "x"), (5, 6, "x")}


@pytest.mark.core
def test_wnut_bad_tag(tmp_path):
    p = tmp_path / "bad.conll"
    p.write_text("a\tO\n\t\nb\tPERSON\n")
    with pytest.raises(ElmoError, match=r"bad\.conll:3: tag 'PERSON' is not BIO"):
        read_conll(p)


def test_raganato_counts_and_overlap():
    from torchelmo.probe.wsd import read_raganato
    all_ = read_raganato(shared_path(*EVAL, "ALL", "ALL.data.xml"))
    assert len(all_.sentences) == 1173 and len(all_.instances) == 7253
    by_set = {}
    for i in all_.instances:
        by_set[i.id.split(".")[0]] = by_set.get(i.id.split(".")[0], 0) + 1
    assert by_set == {"senseval2": 2282, "senseval3": 1850, "semeval2007": 455, "semeval2013": 1644,
                      "semeval2015": 1022}
    # A multi-word instance is one instance over several biLM tokens.
    inst = next(i for i in all_.instances if i.lemma == "belong_to")
    assert all_.sentences[inst.sentence][inst.start:inst.end] == ["belong", "to"]
    s07 = read_raganato(shared_path(*EVAL, "semeval2007", "semeval2007.data.xml"))
    assert len(s07.instances) == 455
    # Each sentence's document (its <text id>), for --context document: each instance's sentence
    # lies in the document its id names.
    assert len(all_.documents) == len(all_.sentences) and all_.documents[0] == "senseval2.d000"
    assert all(all_.documents[i.sentence] == ".".join(i.id.split(".")[:2]) for i in all_.instances)
    assert len(set(all_.documents)) == 26


def test_semcor_full_counts():
    from torchelmo.probe.wsd import read_raganato
    d = ("data", "wsd", "semcor")
    sc = read_raganato(shared_path(*d, "semcor.data.xml.gz"), shared_path(*d, "semcor.gold.key.txt.gz"))
    assert len(sc.sentences) == 37176 and len(sc.instances) == 226171
    assert sum(i.pos == "v" for i in sc.instances) == 88084
    first = sc.instances[0]
    assert first.lemma == "group" and first.keys == ["group%1:03:00::"]
    assert sc.sentences[0][first.start:first.end] == ["Fulton", "County", "Grand", "Jury"]


@pytest.mark.core
def test_wsd_bad_input(tmp_path):
    from torchelmo.probe.wsd import read_raganato, read_sense_index
    x = tmp_path / "t.data.xml"
    k = tmp_path / "t.gold.key.txt"
    k.write_text("d0.s0.t0 bank%1:14:00::\n")
    x.write_text('<corpus>\n<text id="d0">\n<sentence id="d0.s0">\n'
                 '<instance id="d0.s0.t0" lemma="bank" pos="NOUN">bank</instance>\n</text>\n</corpus>\n')
    with pytest.raises(ElmoError, match=r"t\.data\.xml:5: malformed XML"):
        read_raganato(x)
    x.write_text('<corpus>\n<sentence id="d0.s0">\n'
                 '<instance id="d0.s0.t1" lemma="bank" pos="NOUN">bank</instance>\n</sentence>\n</corpus>\n')
    with pytest.raises(ElmoError, match=r"t\.data\.xml:3: instance d0\.s0\.t1 has no gold key"):
        read_raganato(x)
    k.write_text("d0.s0.t0\n")
    with pytest.raises(ElmoError, match=r"t\.gold\.key\.txt:1: expected"):
        read_raganato(x)
    idx = tmp_path / "index.sense"
    idx.write_text("bank%1:14:00:: 08420278 1 25\nbank%1:17:01:: 09213565 x 20\n")
    with pytest.raises(ElmoError, match=r"index\.sense:2:"):
        read_sense_index(idx)


def test_sense_index_first_senses():
    from torchelmo.probe.wsd import read_sense_index
    first = read_sense_index(shared_path("data", "wsd", "wordnet-sense-index", "index.sense"))
    assert first[("bank", "n")] == "bank%1:17:01::"
    assert first[("say", "v")] == "say%2:32:00::"
    assert len(first) == 155287  # one first sense per (lemma, POS); satellites counted as adjectives


# -- statistics ----------------------------------------------------------------------------------

@pytest.mark.core
def test_bootstrap_interval_is_sane():
    rng = np.random.default_rng(1)
    correct = (rng.random(4000) < 0.8).astype(float)
    counts = np.stack([correct, np.ones_like(correct)], 1)
    est, lo, hi = bootstrap_ci(counts, accuracy_from_counts, n_boot=2000)
    assert est == pytest.approx(correct.mean())
    assert lo < est < hi
    se = np.sqrt(est * (1 - est) / len(correct))  # the normal approximation for iid tokens
    assert (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.15)
    est2, lo2, hi2 = bootstrap_ci(counts[:400], accuracy_from_counts, n_boot=2000)
    assert (hi2 - lo2) > 2 * (hi - lo)  # ~sqrt(10) wider with a tenth of the data
    assert bootstrap_ci(counts, accuracy_from_counts, seed=3) == bootstrap_ci(counts, accuracy_from_counts, seed=3)
    with pytest.raises(ElmoError):
        bootstrap_ci(np.zeros((0, 2)), accuracy_from_counts)


@pytest.mark.core
def test_paired_bootstrap_of_a_difference():
    rng = np.random.default_rng(2)
    a = (rng.random(4000) < 0.8).astype(float)
    b = a.copy()
    fixed = np.flatnonzero(a == 0)[:80]  # b gets 80 of a's errors right: +2 points, nothing else differs
    b[fixed] = 1
    ca, cb = (np.stack([x, np.ones_like(x)], 1) for x in (a, b))
    d, lo, hi = paired_diff_ci(ca, cb, accuracy_from_counts, n_boot=2000)
    assert d == pytest.approx(0.02)
    se = np.std(b - a) / np.sqrt(len(a))  # the normal approximation of the paired difference
    assert 0 < lo < d < hi and (hi - lo) == pytest.approx(2 * 1.96 * se, rel=0.15)
    # Unpaired, the two separate intervals overlap: pairing is what resolves a small gap.
    _, alo, ahi = bootstrap_ci(ca, accuracy_from_counts, n_boot=2000)
    _, blo, bhi = bootstrap_ci(cb, accuracy_from_counts, n_boot=2000)
    assert blo < ahi and (hi - lo) < 0.5 * (ahi - alo)
    assert paired_diff_ci(ca, ca, accuracy_from_counts, n_boot=200) == (0.0, 0.0, 0.0)
    with pytest.raises(ElmoError):
        paired_diff_ci(ca, cb[:10], accuracy_from_counts)



@pytest.mark.core
def test_document_bootstrap_against_a_hand_computed_case():
    # Three sentences in two documents: A holds (2 of 2) and (1 of 2) correct, B (0 of 2). Drawn
    # by document, a resample is AA, AB or BB (probabilities 1/4, 1/2, 1/4) with accuracy 6/8, 3/6
    # or 0: the 95% interval is exactly [0, 0.75]. Drawn by sentence, three A-first sentences can
    # all come out (2 of 2) and the interval reaches 1.
    counts = np.array([[2, 2], [1, 2], [0, 2]])
    docs = ["A", "A", "B"]
    assert group_counts(counts, docs).tolist() == [[3, 4], [0, 2]]
    assert group_counts(counts, [7, 3, 7]).tolist() == [[2, 4], [1, 2]]      # order of first appearance
    assert bootstrap_ci(counts, accuracy_from_counts, n_boot=4000, groups=docs) == (0.5, 0.0, 0.75)
    assert bootstrap_ci(counts, accuracy_from_counts, n_boot=4000)[2] == 1.0
    # Paired by document: b is right on B's sentences where a is not; its gain moves with B.
    b = np.array([[2, 2], [1, 2], [2, 2]])
    d, lo, hi = paired_diff_ci(counts, b, accuracy_from_counts, n_boot=4000, groups=docs)
    assert d == pytest.approx(2 / 6) and (lo, hi) == (0.0, 1.0)               # AA: 0, BB: 2/2 - 0/2
    with pytest.raises(ElmoError, match="one group per unit"):
        bootstrap_ci(counts, accuracy_from_counts, groups=["A"])


@pytest.mark.core
def test_seed_mean_scores_every_seed_on_the_same_resample():
    # Two probe seeds on the same units: the statistic is the seeds' mean, and its interval, with
    # the seeds resampled together, lies between the two seeds' own.
    rng = np.random.default_rng(4)
    a = (rng.random(2000) < 0.8).astype(float)
    b = (rng.random(2000) < 0.7).astype(float)
    ca, cb = (np.stack([x, np.ones_like(x)], 1) for x in (a, b))
    est, lo, hi = bootstrap_ci(np.concatenate([ca, cb], 1), seed_mean(accuracy_from_counts, 2), n_boot=2000)
    assert est == pytest.approx((a.mean() + b.mean()) / 2)
    _, alo, ahi = bootstrap_ci(ca, accuracy_from_counts, n_boot=2000)
    _, blo, bhi = bootstrap_ci(cb, accuracy_from_counts, n_boot=2000)
    assert blo < lo < alo and bhi < hi < ahi


# -- features ------------------------------------------------------------------------------------

def test_features_with_document_context(fixture_model, tmp_path):
    # Each sentence starts from the state its document's previous sentence ended with: the same as
    # running each document alone, one sentence at a time, with a stateful biLM; a document's
    # first sentence is as without context, later ones differ; spans read the same tokens.
    sents = [s.tokens for s in read_conllu(ewt("dev"), limit=9)]
    docs = ["a"] * 4 + ["b"] * 2 + ["c"] * 3
    f = extract(fixture_model, sents, tmp_path, name="t", progress=False, documents=docs)
    plain = extract(fixture_model, sents, tmp_path, name="t", progress=False)
    assert f.path != plain.path and not fixture_model.stateful
    fixture_model.stateful = True
    try:
        for rows in ([0, 1, 2, 3], [4, 5], [6, 7, 8]):
            fixture_model.reset_states()
            for i in rows:
                with torch.no_grad():
                    want = torch.stack(fixture_model.embed_sentences([sents[i]]).layers)[:, 0].numpy()
                got = f.all_layers(slice(int(f.offsets[i]), int(f.offsets[i + 1]))).astype(np.float32)
                np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-2)
    finally:
        fixture_model.stateful = False
        fixture_model.reset_states()
    first, later = slice(int(f.offsets[4]), int(f.offsets[5])), slice(int(f.offsets[5]), int(f.offsets[6]))
    np.testing.assert_array_equal(f.all_layers(first), plain.all_layers(first))
    assert np.abs(f.all_layers(later)[2].astype(np.float32) - plain.all_layers(later)[2]).max() > 1e-2
    spans = [(5, 0, 2), (8, 1, 2)]
    fs = extract(fixture_model, sents, tmp_path, spans=spans, name="t", progress=False, documents=docs)
    np.testing.assert_allclose(fs.layer(2)[0], f.layer(2)[int(f.offsets[5]):int(f.offsets[5]) + 2].mean(0), atol=2e-3)
    with pytest.raises(ElmoError, match="document 'a' comes back at sentence 6"):
        extract(fixture_model, sents, tmp_path, progress=False, documents=["a"] * 4 + ["b"] * 2 + ["a"] * 3)
    with pytest.raises(ElmoError, match="8 document names for 9 sentences"):
        extract(fixture_model, sents, tmp_path, progress=False, documents=["a"] * 8)


def test_feature_cache_is_exact_and_reused(fixture_model, tmp_path):
    sents = [s.tokens for s in read_conllu(ewt("dev"), limit=20)]
    f1 = extract(fixture_model, sents, tmp_path, name="t", progress=False)
    L, F = fixture_model.num_layers, fixture_model.output_dim
    assert (f1.num_layers, f1.n, f1.dim) == (L, sum(map(len, sents)), F)
    # Against the biLM run directly, one sentence at a time (float16 storage).
    with torch.no_grad():
        ref = fixture_model.embed_sentences([sents[7]]).layers
    a, b = f1.offsets[7], f1.offsets[8]
    for k in range(L):
        np.testing.assert_allclose(f1.layer(k)[a:b], ref[k][0].numpy(), rtol=2e-3, atol=2e-3)
    # A rerun reads the cache: the model is not called, the features are identical.
    forward = fixture_model.forward
    fixture_model.forward = lambda *a, **k: pytest.fail("cache miss")
    try:
        f2 = extract(fixture_model, sents, tmp_path, name="t", progress=False)
    finally:
        fixture_model.forward = forward
    assert f2.path == f1.path and np.array_equal(f2.all_layers(), f1.all_layers())
    # Spans are means of their tokens; other data or other weights get another cache entry.
    spans = [(7, 1, 3), (0, 0, 1)]
    fs = extract(fixture_model, sents, tmp_path, spans=spans, name="t", progress=False)
    np.testing.assert_allclose(fs.layer(2)[0], f1.layer(2)[a + 1:a + 3].mean(0), atol=2e-3)
    rnd = random_like(fixture_model)
    assert model_fingerprint(rnd) != model_fingerprint(fixture_model)
    assert extract(rnd, sents, tmp_path, name="t", progress=False).path != f1.path
    assert fs.path != f1.path
    with pytest.raises(ElmoError, match="span 0"):
        extract(fixture_model, sents, tmp_path, spans=[(0, 2, 1)], progress=False)
    with pytest.raises(ElmoError, match="sentence 1 is empty"):
        extract(fixture_model, [["a"], []], tmp_path, progress=False)


# -- probes --------------------------------------------------------------------------------------

def test_pos_probe_beats_majority(fixture_model, tmp_path):
    from torchelmo.probe.pos import ProbeConfig, run_pos
    sets = [read_conllu(ewt(s), limit=n) for s, n in (("train", 300), ("dev", 80), ("test", 100))]
    feats = [extract(fixture_model, [s.tokens for s in ss], tmp_path, name=n, progress=False)
             for ss, n in zip(sets, "abc")]
    units = {}
    r = run_pos(*feats, tuple([s.tags for s in ss] for ss in sets),
                ProbeConfig(max_epochs=12, lr=3e-3, n_boot=300), log=lambda m: None, units=units)
    maj = r["majority"]["acc"]
    # The per-sentence counts handed out for pairing with another run are the scores' own.
    assert set(units) == {"E0", "E1", "E2", "mix"}
    for name, c in units.items():
        assert c.shape == (100, 2) and c[:, 1].sum() == r["n_test_tokens"]
        acc = r["mix"]["acc"] if name == "mix" else r["layers"][name]["acc"]
        assert c[:, 0].sum() / c[:, 1].sum() == pytest.approx(acc)
    for name in ("E0", "E1", "E2"):
        lo, hi = r["layers"][name]["ci"]
        assert lo <= r["layers"][name]["acc"] <= hi and hi - lo < 0.1
        assert r["layers"][name]["acc"] > maj + 0.15, (name, r["layers"][name]["acc"], maj)
    assert r["mix"]["acc"] > maj + 0.15
    assert sum(r["mix"]["weights"]) == pytest.approx(1) and r["mix"]["gamma"] > 0
    assert r["mix"]["weights"] != pytest.approx([1 / 3] * 3, abs=1e-3)  # s was learned
    p = r["paired"]["E2-E1"]
    assert p["diff"] == pytest.approx(r["layers"]["E2"]["acc"] - r["layers"]["E1"]["acc"])
    assert p["ci"][0] <= p["diff"] <= p["ci"][1]


def test_pos_probe_seeds_and_documents(fixture_model, tmp_path):
    # Three probe seeds, resampled by document: each score is the seeds' mean, each seed's own
    # score is kept, and the per-sentence counts with their documents reproduce the intervals.
    from torchelmo.probe.pos import ProbeConfig, run_pos
    from torchelmo.probe.stats import bootstrap_ci, paired_diff_ci, seed_mean
    sets = [read_conllu(ewt(s), limit=n) for s, n in (("train", 200), ("dev", 60), ("test", 120))]
    feats = [extract(fixture_model, [s.tokens for s in ss], tmp_path, name=n, progress=False)
             for ss, n in zip(sets, "abc")]
    docs = [s.doc for s in sets[2]]
    assert all(docs) and 3 < len(set(docs)) < len(docs)        # EWT names its documents
    cfg = ProbeConfig(max_epochs=4, lr=3e-3, n_boot=300, seeds=3)
    r = run_pos(*feats, tuple([s.tags for s in ss] for ss in sets), cfg, log=lambda m: None, groups=docs)
    u = r["units"]
    assert u["seeds"] == 3 and u["resampled"] == "documents" and u["documents"] == docs
    assert r["n_test_documents"] == len(set(docs))
    for name in ("E0", "E1", "E2", "mix"):
        s = r["mix"] if name == "mix" else r["layers"][name]
        c = np.array(u["counts"][name])
        assert c.shape == (120, 6) and len(s["seeds"]) == 3 and len(s["fits"]) == 3
        assert s["acc"] == pytest.approx(np.mean(s["seeds"]))
        assert [c[:, 2 * k].sum() / c[:, 2 * k + 1].sum() for k in range(3)] == pytest.approx(s["seeds"])
        assert s["sd"] == pytest.approx(np.std(s["seeds"], ddof=1))
        assert s["ci"] == list(bootstrap_ci(c, seed_mean(accuracy_from_counts, 2), 300, groups=docs)[1:])
    assert len(set(r["layers"]["E2"]["seeds"])) > 1           # the seeds train different probes
    assert len(r["mix"]["seed_weights"]) == 3
    assert r["mix"]["weights"] == pytest.approx(np.mean(r["mix"]["seed_weights"], 0).tolist())
    d = paired_diff_ci(np.array(u["counts"]["E1"]), np.array(u["counts"]["E2"]),
                       seed_mean(accuracy_from_counts, 2), 300, groups=docs)
    assert [r["paired"]["E2-E1"]["diff"], *r["paired"]["E2-E1"]["ci"]] == pytest.approx(list(d))
    # By document the interval is wider than by sentence (sentences of a document are alike).
    by_sentence = bootstrap_ci(np.array(u["counts"]["E2"]), seed_mean(accuracy_from_counts, 2), 300)
    ci = r["layers"]["E2"]["ci"]
    assert ci[1] - ci[0] > 0.8 * (by_sentence[2] - by_sentence[1])
    with pytest.raises(ElmoError, match="seeds must be a positive integer"):
        run_pos(*feats, tuple([s.tags for s in ss] for ss in sets), ProbeConfig(seeds=0), log=lambda m: None)


def test_units_go_beside_the_results(tmp_path):
    from torchelmo.probe.report import UNITS_NAME, load_results, write_results
    units = {"k": 2, "seeds": 1, "resampled": "units", "documents": None, "counts": {"E1": [[1, 2]]}}
    write_results(tmp_path / "results.json", {"pos": {"E1": 0.5, "details": {"trained": {"units": units}}},
                                              "model": {"path": "m"}})
    assert load_results(tmp_path / "results.json") == {"pos": {"E1": 0.5, "details": {"trained": {}}},
                                                       "model": {"path": "m"}}
    side = json.loads((tmp_path / UNITS_NAME).read_text())
    assert side == {"pos/details/trained": units}
    # Another task's run keeps the first task's counts; a rerun of the task replaces them.
    write_results(tmp_path / "results.json", {"deps": {"details": {"trained": {"uas": {"units": units}}}}})
    assert set(json.loads((tmp_path / UNITS_NAME).read_text())) == {"pos/details/trained",
                                                                    "deps/details/trained/uas"}


def test_wsd_probe_on_a_slice(fixture_model, tmp_path):
    from torchelmo.probe.wsd import read_raganato, read_sense_index, run_wsd
    d = ("data", "wsd", "semcor")
    sc = read_raganato(shared_path(*d, "semcor.data.xml.gz"), shared_path(*d, "semcor.gold.key.txt.gz"),
                       limit=1500)
    test = read_raganato(shared_path(*EVAL, "ALL", "ALL.data.xml"))
    first = read_sense_index(shared_path("data", "wsd", "wordnet-sense-index", "index.sense"))
    ftr = extract(fixture_model, sc.sentences, tmp_path, spans=sc.spans, progress=False)
    fte = extract(fixture_model, test.sentences, tmp_path, spans=test.spans, progress=False)
    r = run_wsd(sc, ftr, test, fte, first, n_boot=200, mix_epochs=1, log=lambda m: None)
    # Peters et al. (2018), Table 5: the WordNet first-sense baseline on ALL is 65.2.
    assert r["first_sense"]["f1"] == pytest.approx(0.652, abs=0.0006)
    for name in ("E0", "E1", "E2"):
        lr = r["layers"][name]
        assert lr["ci"][0] <= lr["f1"] <= lr["ci"][1] and lr["ci"][1] - lr["ci"][0] < 0.05
        assert lr["all_minus_dev"]["n"] == 7253 - 455 and lr["dev"]["n"] == 455
    for part in ("all", "all_minus_dev"):
        p = r["paired"][f"E2-E1 {part}"]
        assert p["diff"] == pytest.approx(r["layers"]["E2"][part]["f1"] - r["layers"]["E1"][part]["f1"])
        assert p["ci"][0] <= p["diff"] <= p["ci"][1]
    # Where the 1-NN has a choice (2+ candidate senses seen in SemCor), it beats choosing uniformly
    # among the same candidates (the majority-class analogue for a per-lemma decision).
    from torchelmo.probe.wsd import build_inventory, predict_1nn
    inv = build_inventory(sc, ftr)
    rows = [j for j, i in enumerate(test.instances) if len(inv.candidates.get((i.lemma, i.pos), [])) >= 2]
    assert len(rows) > 1000
    chance = np.mean([np.mean([inv.keys[c] in test.instances[j].keys
                               for c in inv.candidates[(test.instances[j].lemma, test.instances[j].pos)]])
                      for j in rows])
    acc = []
    for k in range(3):
        preds, used = predict_1nn(inv, test, fte.layer(k), inv.vectors()[k], first)
        assert used[rows].all()
        acc.append(np.mean([preds[j] in test.instances[j].keys for j in rows]))
    # Even this tiny fixture biLM: context (E1, E2) separates senses better than the type (E0).
    assert acc[0] > chance and min(acc[1], acc[2]) > max(chance + 0.025, acc[0] + 0.01), (acc, chance)
    assert r["mix"]["f1"] > r["layers"]["E0"]["f1"] - 0.02 and sum(r["mix"]["weights"]) == pytest.approx(1)
    assert sum(r["mix_grid"]["weights"]) == pytest.approx(1)
    # The per-instance counts reproduce each score; resampled by document (Raganato's 26 test
    # documents, 3 of them SemEval-2007's) the intervals come from the same counts.
    from torchelmo.probe.stats import bootstrap_ci
    from torchelmo.probe.wsd import f1_wsd
    from torchelmo.probe.wsd import run_wsd as run
    u = r["units"]
    assert u["resampled"] == "instances" and u["documents"] is None and len(u["ids"]) == 7253
    for name in ("E0", "E1", "E2", "mix"):
        c = np.array(u["counts"][name])
        assert f1_wsd(c.sum(0)) == pytest.approx((r["mix"] if name == "mix" else r["layers"][name])["f1"])
    rd = run(sc, ftr, test, fte, first, n_boot=200, mix=False, log=lambda m: None, documents=True)
    docs = rd["units"]["documents"]
    assert len(set(docs)) == 26 and rd["units"]["resampled"] == "documents"
    assert rd["layers"]["E2"]["f1"] == r["layers"]["E2"]["f1"]
    want = bootstrap_ci(np.array(u["counts"]["E2"]), f1_wsd, 200, groups=docs)
    assert rd["layers"]["E2"]["ci"] == [want[1], want[2]]
    assert rd["paired"]["E2-E1 all"]["diff"] == r["paired"]["E2-E1 all"]["diff"]
    assert rd["paired"]["E2-E1 all"]["ci"] != r["paired"]["E2-E1 all"]["ci"]


def test_ner_tagger_learns_and_runs(fixture_model, tmp_path):
    from torchelmo.probe.ner import TaggerConfig, encode_bio, run_ner
    sets = [read_conll(wnut(f), limit=n) for f, n in
            (("wnut17train.conll", 400), ("emerging.dev.conll", 100), ("emerging.test.annotated", 100))]
    tags = tuple([s.tags for s in ss] for ss in sets)
    feats = [extract(fixture_model, [s.tokens for s in ss], tmp_path, progress=False) for ss in sets]
    offsets = tuple(f.offsets for f in feats)
    # A learnable input (a noisy code of the gold tag) shows the tagger, decoding and scoring work.
    labels, ys = encode_bio(*tags)
    rng = np.random.default_rng(0)
    code = rng.normal(size=(len(labels), 16)).astype(np.float32)
    oracle = tuple((code[y] + 0.3 * rng.normal(size=(len(y), 16)).astype(np.float32))[None] for y in ys)
    inputs = {"oracle": oracle, "mix": tuple(f.all_layers() for f in feats)}
    r = run_ner(inputs, offsets, tags, TaggerConfig(max_epochs=6, lr=1e-2, n_boot=200), log=lambda m: None)
    assert r["inputs"]["oracle"]["f1"] > 0.9
    mix = r["inputs"]["mix"]
    assert 0 <= mix["ci"][0] <= mix["f1"] <= mix["ci"][1] <= 1 and len(mix["weights"]) == 3


def test_static_embeddings(tmp_path):
    from torchelmo.probe.ner import train_static_embeddings
    emb = train_static_embeddings([shared_path("data", "lm", "ptb", "ptb.valid.txt")], dim=50,
                                  cache_dir=tmp_path, log=lambda m: None)
    i = {w: k for k, w in enumerate(emb.words)}
    v = emb.vectors
    assert v[i["monday"]] @ v[i["tuesday"]] > 0.5 > float(np.mean(v @ v[i["monday"]]))
    vec, oov = emb.lookup([["Monday", "zzzqqq"]])
    assert np.allclose(vec[0], v[i["monday"]]) and not vec[1].any() and oov == 0.5
    again = train_static_embeddings([shared_path("data", "lm", "ptb", "ptb.valid.txt")], dim=50,
                                    cache_dir=tmp_path, log=lambda m: pytest.fail("not cached"))
    assert np.array_equal(again.vectors, v)


def test_cli_all_writes_results_and_report(allennlp_dir, tmp_path, capsys):
    from torchelmo.cli import main
    out = tmp_path / "out"
    rc = main(["probe", "all", "--model", str(allennlp_dir), "--data", str(shared_path("data")),
               "--out", str(out), "--tasks", "pos,wsd", "--limit", "120", "--limit-semcor", "400",
               "--max-epochs", "3", "--mix-epochs", "1", "--n-boot", "100", "--quiet"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    for task in ("pos", "wsd"):
        assert {"E0", "E1", "E2", "mix", "mix_weights", "intervals", "control_random"} <= set(res[task])
        assert len(res[task]["mix_weights"]) == 3
        assert {"E0", "E1", "E2", "mix"} <= set(res[task]["control_random"])
    report = (out / "report.md").read_text()
    assert "## UD POS" in report and "## WSD" in report and "97.3" in report and "69.0" in report
    d = res["pos"]["paired"]["E2-E1"]
    assert f"Paired bootstrap E2 - E1 (trained): {100 * d['diff']:+.2f}" in report
    assert "(random-weights control)" in report
    for png in ("pos_layers.png", "wsd_layers.png", "mix_weights.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    # Bad input: one line naming the file, exit code 1.
    bad = tmp_path / "bad.conllu"
    bad.write_text("1\tx\n")
    rc = main(["probe", "pos", "--model", str(allennlp_dir), "--train", str(bad), "--dev", str(bad),
               "--test", str(bad), "--out", str(out), "--no-control", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1].startswith("elmo probe: error:") and "bad.conllu:1" in err[-1]


@pytest.mark.core
def test_ner_tagger_is_not_stopped_before_min_epochs():
    # Noise features and a dev set without entities: dev F1 stays 0 from epoch 1, yet the tagger must get min_epochs before
    # early stopping (entities are rare; a real tagger predicts all O for its first epochs).
    from torchelmo.probe.ner import TaggerConfig, TaggingData, train_tagger
    rng = np.random.default_rng(0)
    labels = ["O", "B-person", "I-person"]

    def data(n_sent, n_tok, every):
        y = np.zeros(n_sent * n_tok, dtype=np.int64)
        if every:
            y[::every] = 1
        x = rng.normal(size=(1, len(y), 8)).astype(np.float32)
        return TaggingData(x, np.arange(0, len(y) + 1, n_tok), y)

    cfg = TaggerConfig(hidden=8, max_epochs=12, patience=2, min_epochs=7, n_boot=10)
    _, info = train_tagger(data(40, 10, 25), data(20, 10, 0), labels, cfg, log=lambda m: None)
    assert info["dev_f1"] == 0.0 and 7 <= info["epochs"] <= 12


@pytest.mark.core
def test_early_stopping_breaks_ties_on_a_second_score():
    # The dev score flat at 0 (a tagger that predicts no entity yet): the tie-break (the dev
    # likelihood, for NER) keeps training going while it improves and picks the best epoch.
    import torch.nn as nn

    from torchelmo.probe.common import fit_early_stopped
    model = nn.Linear(2, 1)
    second = iter([0.1, 0.2, 0.3, 0.4, 0.5, 0.45, 0.44, 0.43, 0.42, 0.41, 0.40, 0.39])
    fit = fit_early_stopped(model, lambda: iter([model(torch.ones(1, 2)).sum()]), lambda: 0.0, lr=1e-3,
                            max_epochs=12, patience=3, min_epochs=2, tie_break=lambda: next(second))
    assert (fit["best_epoch"], fit["epochs"], fit["best_score"]) == (5, 8, 0.0)
    # A higher dev score wins over any tie-break; without one, equal scores never improve.
    scores, second = iter([0.0, 0.1, 0.1, 0.1]), iter([0.9, 0.0, 0.5, 0.6])
    fit = fit_early_stopped(model, lambda: iter([model(torch.ones(1, 2)).sum()]), lambda: next(scores), lr=1e-3,
                            max_epochs=4, patience=5, tie_break=lambda: next(second))
    assert fit["best_epoch"] == 4 and fit["best_score"] == 0.1
    fit = fit_early_stopped(model, lambda: iter([model(torch.ones(1, 2)).sum()]), lambda: 0.0, lr=1e-3,
                            max_epochs=6, patience=2, min_epochs=4)
    assert (fit["best_epoch"], fit["epochs"]) == (1, 4)


def test_early_stopping_divides_the_learning_rate_after_each_epoch_that_does_not_improve(monkeypatch):
    # Hewitt & Manning's plateau schedule: every epoch without a strict improvement of the dev
    # score multiplies the learning rate by lr_decay; improving epochs leave it alone.
    import torch.nn as nn

    from torchelmo.probe.common import fit_early_stopped
    model, lrs, step = nn.Linear(2, 1), [], torch.optim.Adam.step

    def recording_step(self, *a, **k):
        lrs.append(self.param_groups[0]["lr"])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    scores = iter([0.1, 0.2, 0.2, 0.3, 0.25, 0.25, 0.2])
    fit = fit_early_stopped(model, lambda: iter([model(torch.ones(1, 2)).sum()]), lambda: next(scores), lr=1.0,
                            max_epochs=7, patience=3, lr_decay=0.1)
    assert (fit["best_epoch"], fit["epochs"]) == (4, 7)
    # epochs 1, 2 improve; 3 does not (lr / 10 from epoch 4); 4 improves; 5, 6 do not; 7 stops.
    assert lrs == pytest.approx([1.0, 1.0, 1.0, 0.1, 0.1, 0.01, 0.001])


# -- deeper models, the cache folder, --out, the report's orderings, the static corpus ---------------

def test_probes_and_report_name_every_layer_of_a_deeper_model(tmp_path):
    # Layer names used to stop at E4: a biLM with 5 LSTM layers (E0 .. E5) raised IndexError.
    from torchelmo.probe.pos import ProbeConfig, run_pos
    from torchelmo.probe.report import render, summarize_pos, summarize_wsd
    from torchelmo.probe.wsd import read_raganato, read_sense_index, run_wsd
    model = tiny_deep_model(5)
    names = [f"E{k}" for k in range(6)]
    sets = [read_conllu(ewt(s), limit=n) for s, n in (("train", 60), ("dev", 20), ("test", 20))]
    feats = [extract(model, [s.tokens for s in ss], tmp_path, name=n, progress=False)
             for ss, n in zip(sets, ("train", "dev", "test"))]
    assert feats[0].num_layers == 6
    pos = run_pos(*feats, tuple([s.tags for s in ss] for ss in sets), ProbeConfig(max_epochs=2, n_boot=20),
                  log=lambda m: None)
    assert list(pos["layers"]) == names and len(pos["mix"]["weights"]) == 6
    d = ("data", "wsd", "semcor")
    sc = read_raganato(shared_path(*d, "semcor.data.xml.gz"), shared_path(*d, "semcor.gold.key.txt.gz"),
                       limit=200)
    test = read_raganato(shared_path(*EVAL, "semeval2007", "semeval2007.data.xml"))
    first = read_sense_index(shared_path("data", "wsd", "wordnet-sense-index", "index.sense"))
    wsd = run_wsd(sc, extract(model, sc.sentences, tmp_path, spans=sc.spans, progress=False), test,
                  extract(model, test.sentences, tmp_path, spans=test.spans, progress=False), first,
                  mix=False, n_boot=20, log=lambda m: None)
    assert list(wsd["layers"]) == names
    report = render({"pos": summarize_pos(pos), "wsd": summarize_wsd(wsd)}, tmp_path / "out").read_text()
    for head in ("## UD POS", "## WSD"):
        section = report.split(head)[1].split("## ")[0]
        assert all(f"| {n} |" in section for n in names), section
    assert (tmp_path / "out" / "mix_weights.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_cache_folder_and_required_out(tmp_path, monkeypatch, capsys):
    from torchelmo.cli import main
    from torchelmo.commands.probe import default_cache_dir
    model_dir = tmp_path / "model"
    tiny_deep_model(5).save_pretrained(model_dir)
    cache, out = tmp_path / "env-cache", tmp_path / "out"
    monkeypatch.setenv("ELMO_PROBE_CACHE", str(cache))
    args = ["probe", "pos", "--model", str(model_dir), "--train", str(ewt("train")), "--dev", str(ewt("dev")),
            "--test", str(ewt("test")), "--limit", "40", "--max-epochs", "1", "--n-boot", "20",
            "--no-control", "--quiet"]
    assert main(args + ["--out", str(out)]) == 0
    # No --cache: the features went to $ELMO_PROBE_CACHE, nothing into the output folder.
    assert len(list(cache.glob("pos-*.h5"))) == 3 and not (out / "cache").exists()
    assert json.loads((out / "results.json").read_text())["pos"]["E5"] > 0
    # Unset (or empty), the default is ~/.cache/elmo/probe.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ELMO_PROBE_CACHE", "")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "elmo" / "probe"
    monkeypatch.delenv("ELMO_PROBE_CACHE")
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "elmo" / "probe"
    # --out has no default (one inside the checkout overwrote the committed report).
    capsys.readouterr()
    for argv in (args, ["probe", "report"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and "--out" in capsys.readouterr().err


def _summary(task, e1, e2, ci):
    return {"E0": 0.5, "E1": e1, "E2": e2, "intervals": {"E0": [0.49, 0.51], "E1": [e1 - 0.01, e1 + 0.01],
                                                          "E2": [e2 - 0.01, e2 + 0.01]},
            "paired": {"E2-E1" if task == "pos" else "E2-E1 all": {"diff": e2 - e1, "ci": ci}},
            "baseline": {"majority": 0.2}}


@pytest.mark.core
def test_report_claims_an_ordering_only_when_the_paired_interval_excludes_zero(tmp_path):
    from torchelmo.probe.report import ordering, render
    assert ordering("E1", "E2", {"diff": 0.004, "ci": [-0.001, 0.009]}) is None
    assert ordering("E1", "E2", {"diff": 0.004, "ci": [0.001, 0.009]}) == "E2"
    assert ordering("E1", "E2", {"diff": -0.004, "ci": [-0.009, -0.001]}) == "E1"
    assert ordering("E1", "E2", None) is None
    # E2 ahead on the point estimates (and E1 ahead for WSD), but both intervals include zero.
    res = {"pos": _summary("pos", 0.896, 0.897, [-0.0017, 0.0033]),
           "wsd": _summary("wsd", 0.585, 0.581, [-0.012, 0.004])}
    report = render(res, tmp_path / "a").read_text()
    assert "beats" not in report and "**yes**" not in report and "**no**" not in report
    assert report.count("not significant") == 2
    assert "Paper's ordering E1 > E2 for POS: **not shown**" in report
    assert "[-0.17, +0.33] points includes zero" in report
    # Intervals that exclude zero: the ordering is stated, with the paper's verdict.
    res = {"pos": _summary("pos", 0.896, 0.905, [0.002, 0.016]),
           "wsd": _summary("wsd", 0.572, 0.581, [0.0017, 0.0167])}
    report = render(res, tmp_path / "b").read_text()
    assert "not significant" not in report
    assert "Paper's ordering E1 > E2 for POS: **no**: E2 beats E1" in report
    assert "Paper's ordering E2 > E1 for WSD: **yes**: E2 beats E1 (paired 95% interval of E2 - E1 " \
           "[+0.17, +1.67] points excludes zero)" in report
    assert "random-weights control orders" not in report
    # A control with the same ordering is named beside the claim; one without it is not.
    res["pos"]["control_random"] = {"paired": {"E2-E1": {"diff": 0.006, "ci": [0.001, 0.011]}}}
    res["wsd"]["control_random"] = {"paired": {"E2-E1 all": {"diff": -0.007, "ci": [-0.0105, -0.0034]}}}
    report = render(res, tmp_path / "d").read_text()
    assert "E2 beats E1 (paired 95% interval of E2 - E1 [+0.20, +1.60] points excludes zero). The " \
           "random-weights control orders them the same way (E2 - E1 [+0.10, +1.10] points)." in report
    assert report.count("random-weights control orders") == 1
    # Without a paired interval nothing is claimed either.
    del res["pos"]["paired"]
    report = render(res, tmp_path / "c").read_text()
    assert "Paper's ordering E1 > E2 for POS: **not tested**" in report


@pytest.mark.core
def test_static_corpus_is_read_as_sentence_files(tmp_path):
    from torchelmo.probe.ner import train_static_embeddings
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"\xef\xbb\xbfThe cat sat\n\n" + b"the dog sat\na cat ran\n" * 3)
    emb = train_static_embeddings([corpus], dim=2, min_count=1, log=lambda m: None)
    assert "the" in emb.words and not any(w.startswith("\ufeff") for w in emb.words)  # BOM dropped
    corpus.write_bytes(b"the cat\nthe \xff dog\n")
    with pytest.raises(ElmoError, match=r"c\.txt: line 2: invalid UTF-8 \(byte 0xff at column 5\)"):
        train_static_embeddings([corpus], dim=2, min_count=1, log=lambda m: None)


@pytest.mark.core
def test_ner_taggers_over_several_seeds_and_paired_differences(tmp_path):
    # Synthetic inputs of known difficulty: "mix" (3 layers, one of them a noisy code of the gold
    # tag), "E0" (a noisier code), "static" (noise). Each input is trained once per seed.
    from torchelmo.probe.ner import TaggerConfig, mean_f1, run_ner
    rng = np.random.default_rng(1)
    tags = []
    for n in (120, 40, 40):
        split = []
        for _ in range(n):
            s = ["O"] * 8
            k = int(rng.integers(0, 6))
            s[k], s[k + 1] = "B-person", "I-person"
            split.append(s)
        tags.append(split)
    labels = ["O", "B-person", "I-person"]
    code = rng.normal(size=(3, 8)).astype(np.float32)
    ys = [np.array([labels.index(t) for s in split for t in s]) for split in tags]
    offsets = tuple(np.arange(0, len(y) + 1, 8) for y in ys)

    def noisy(scale, layers=1):
        return tuple(np.stack([code[y] + scale * rng.normal(size=(len(y), 8)).astype(np.float32)
                               for _ in range(layers)]) for y in ys)
    inputs = {"mix": noisy(0.3, 3), "E0": noisy(1.5), "static": tuple(rng.normal(size=(1, len(y), 8)).astype(
        np.float32) for y in ys)}
    inputs["top"] = tuple(x[-1:] for x in inputs["mix"])
    cfg = TaggerConfig(hidden=16, dropout=0.1, batch_size=16, max_epochs=8, min_epochs=8, lr=2e-2, n_boot=200, seed=5)
    r = run_ner(inputs, offsets, tuple(tags), cfg, log=lambda m: None, seeds=3)
    assert r["seeds"] == 3
    for x in r["inputs"].values():
        per_seed = [s["f1"] for s in x["seeds"]]
        assert [s["seed"] for s in x["seeds"]] == [5, 6, 7]
        assert x["f1"] == pytest.approx(np.mean(per_seed)) and x["f1_sd"] == pytest.approx(np.std(per_seed, ddof=1))
        assert x["ci"][0] <= x["f1"] <= x["ci"][1]
    assert len({s["f1"] for s in r["inputs"]["E0"]["seeds"]}) > 1 and r["inputs"]["E0"]["f1_sd"] > 0   # seeds matter
    assert len(r["inputs"]["mix"]["weights"]) == 3
    assert r["inputs"]["mix"]["weights"] == pytest.approx(np.mean([s["weights"] for s in r["inputs"]["mix"]["seeds"]], 0))
    d = r["paired"]["mix-E0"]
    assert d["diff"] == pytest.approx(r["inputs"]["mix"]["f1"] - r["inputs"]["E0"]["f1"])
    assert d["ci"][0] <= d["diff"] <= d["ci"][1] and set(r["paired"]) == {"mix-E0", "mix-static", "E0-static", "mix-top"}
    # The paper's Table 2 pair: the mix of all layers against the top layer alone.
    top = r["paired"]["mix-top"]
    assert top["diff"] == pytest.approx(r["inputs"]["mix"]["f1"] - r["inputs"]["top"]["f1"])
    # Per-sentence counts of every input and seed, for recomputing any interval.
    from torchelmo.probe.stats import bootstrap_ci
    u = r["units"]
    assert set(u["counts"]) == set(inputs) and np.array(u["counts"]["mix"]).shape == (40, 9)
    assert bootstrap_ci(np.array(u["counts"]["mix"]), mean_f1, 200, seed=5)[1:] == tuple(r["inputs"]["mix"]["ci"])
    assert r["inputs"]["mix"]["f1"] > r["inputs"]["static"]["f1"] and r["paired"]["mix-static"]["ci"][0] > 0
    from torchelmo.probe.report import render, summarize_ner
    report = render({"ner": summarize_ner(r)}, tmp_path / "report").read_text()
    assert "mean of 3 seeds" in report and f"| E0 | {100 * r['inputs']['E0']['f1']:.1f}" in report
    assert f"Paired bootstrap mix - E0: {100 * d['diff']:+.2f}" in report
    # mean_f1: the mean of each seed's micro F1 over its (tp, fp, fn)
    c = np.array([4.0, 1.0, 3.0, 2.0, 0.0, 2.0])
    assert mean_f1(c) == pytest.approx((8 / 12 + 4 / 6) / 2)
    with pytest.raises(ElmoError, match="seeds must be a positive integer"):
        run_ner(inputs, offsets, tuple(tags), cfg, log=lambda m: None, seeds=0)
