"""Softmaxes, the LM objective against an independent path through BiLM.forward, scoring,
gradients, and saving/loading/initialising LMs."""

import math

import pytest
import torch

from torchelmo import BiLM
from torchelmo.errors import ElmoError
from torchelmo.lm.data import sentences_batch
from torchelmo.lm.model import LanguageModel
from torchelmo.lm.softmax import (
    AdaptiveSoftmax,
    FullSoftmax,
    SampledSoftmax,
    default_softmax,
    log_uniform_probs,
    make_softmax,
    sample_log_uniform,
)
from torchelmo.lm.vocab import Vocabulary
from torchelmo.model.bilm import Regularisation
from torchelmo.model.config import preset

WORDS = "the cat sat on a mat and dog ran far away".split()
SENTS = [["the", "cat", "sat"], ["a", "dog", "ran", "far", "away", "zebra"], ["on"], ["the", "mat"]]


@pytest.fixture
def vocab():
    return Vocabulary(["<S>", "</S>", "<UNK>", *WORDS])


@pytest.fixture
def lm(vocab):
    torch.manual_seed(0)
    return LanguageModel(preset("tiny"), vocab, softmax="full", regularisation=Regularisation(dropout=0.0)).eval()


# -- softmaxes -------------------------------------------------------------------------------------
@pytest.mark.core
def test_full_softmax_is_cross_entropy():
    torch.manual_seed(0)
    sm = FullSoftmax(50, 8)
    h, t = torch.randn(7, 8), torch.randint(0, 50, (7,))
    ref = -(h @ sm.weight.T + sm.bias).log_softmax(-1)[torch.arange(7), t]
    assert torch.allclose(sm.nll(h, t), ref, atol=1e-5)
    assert torch.allclose(sm.log_probs(h).exp().sum(-1), torch.ones(7), atol=1e-5)


@pytest.mark.core
def test_sampled_softmax_matches_independent_computation():
    torch.manual_seed(1)
    V, P, K = 40, 6, 12
    sm = SampledSoftmax(V, P, K)
    h, t = torch.randn(5, P), torch.tensor([0, 3, 17, 39, 3])
    samples = torch.tensor([3, 1, 1, 20, 0, 39, 5, 5, 7, 2, 9, 3])
    got = sm.sampled_nll(h, t, samples)
    # Plain Python: logits corrected by log(K q(k)), accidental hits removed.
    q = [(math.log(k + 2) - math.log(k + 1)) / math.log(V + 1) for k in range(V)]
    W, b = sm.weight.tolist(), sm.bias.tolist()
    for i in range(5):
        def logit(k, i=i):
            return sum(x * w for x, w in zip(h[i].tolist(), W[k])) + b[k] - math.log(K * q[k])
        terms = [logit(int(t[i]))] + [logit(int(s)) for s in samples if int(s) != int(t[i])]
        m = max(terms)
        lse = m + math.log(sum(math.exp(x - m) for x in terms))
        assert got[i].item() == pytest.approx(lse - terms[0], rel=1e-5)
    # In eval mode the loss is the exact full softmax.
    sm.eval()
    assert torch.allclose(sm.nll(h, t), FullSoftmax.nll(sm, h, t))


@pytest.mark.core
def test_log_uniform_sampler_distribution():
    V = 100
    g = torch.Generator().manual_seed(0)
    s = sample_log_uniform(V, 200_000, g)
    assert s.min() >= 0 and s.max() < V
    freq = torch.bincount(s, minlength=V).double() / s.numel()
    p = log_uniform_probs(V)
    assert p.sum().item() == pytest.approx(1.0)
    assert torch.allclose(freq[:10], p[:10], atol=4e-3)
    # Deterministic given the generator: every rank draws the same negatives.
    assert torch.equal(sample_log_uniform(V, 50, torch.Generator().manual_seed(7)),
                       sample_log_uniform(V, 50, torch.Generator().manual_seed(7)))


@pytest.mark.core
def test_adaptive_softmax_normalised():
    torch.manual_seed(2)
    sm = AdaptiveSoftmax(5000, 16)
    assert sm.cutoffs == [2000]
    h, t = torch.randn(9, 16), torch.tensor([0, 5, 1999, 2000, 4999, 3, 2500, 7, 1])
    lp = sm.log_probs(h)
    assert torch.allclose(lp.logsumexp(-1), torch.zeros(9), atol=1e-4)
    assert torch.allclose(sm.nll(h, t), -lp[torch.arange(9), t], atol=1e-4)
    with pytest.raises(ElmoError, match="cutoffs"):
        AdaptiveSoftmax(100, 4, [50, 20])


@pytest.mark.core
@pytest.mark.parametrize("vocab,cutoffs", [(100, [10, 40]), (5000, None), (12, [3, 6, 9])])
def test_adaptive_nll_is_torchs_with_its_gradients(vocab, cutoffs):
    # The training loss computes its products through torchelmo.numerics.operands (bf16 operands under
    # bf16); in fp32 it is nn.AdaptiveLogSoftmaxWithLoss's, value and gradients, to the bit.
    torch.manual_seed(3)
    sm = AdaptiveSoftmax(vocab, 16, cutoffs)
    with torch.no_grad():
        for w in sm.parameters():
            w.normal_(0.0, 0.3)
    h, t = torch.randn(200, 16, requires_grad=True), torch.randint(0, vocab, (200,))
    params = [h] + [w for w in sm.parameters() if w.numel()]
    ours, theirs = sm.nll(h, t), -sm.asm(h, t).output
    assert torch.equal(ours, theirs)
    for a, b in zip(torch.autograd.grad(ours.sum(), params), torch.autograd.grad(theirs.sum(), params)):
        assert torch.equal(a, b)


@pytest.mark.core
def test_default_softmax_by_vocab_size():
    assert default_softmax(10_000) == "full" and default_softmax(800_000) == "sampled"
    assert isinstance(make_softmax("auto", 10_000, 4), FullSoftmax)
    with pytest.raises(ElmoError, match="unknown softmax"):
        make_softmax("hierarchical", 10, 4)


# -- the objective ---------------------------------------------------------------------------------
def test_token_nll_matches_bilm_forward(lm, vocab):
    """Both LMs' predictions recomputed through BiLM.forward (its own <S>/</S> wrapping and
    per-sentence reversal) and a plain log-softmax."""
    b = sentences_batch(SENTS, vocab)
    nll, _ = lm.token_nll(b.char_ids, b.token_index, b.targets, b.lengths)
    from torchelmo import batch_to_ids
    out = lm.bilm(batch_to_ids(SENTS), keep_sentence_boundaries=True)
    top = out.layers[-1]
    P = lm.config.projection_dim
    W, bias = lm.softmax.weight, lm.softmax.bias
    for i, s in enumerate(SENTS):
        n = len(s)
        fwd_h = top[i, 0:n + 1, :P]                  # reading <S> w1 .. wn
        fwd_t = vocab.ids(s) + [vocab.eos]
        bwd_h = top[i, 1:n + 2, P:]                   # reading w1 .. wn </S>, backward
        bwd_t = [vocab.bos] + vocab.ids(s)            # predicts <S> w1 .. wn
        ref_f = -(fwd_h @ W.T + bias).log_softmax(-1)[torch.arange(n + 1), torch.tensor(fwd_t)]
        ref_b = -(bwd_h @ W.T + bias).log_softmax(-1)[torch.arange(n + 1), torch.tensor(bwd_t)]
        assert torch.allclose(nll[0, i, :n + 1], ref_f, atol=1e-5)
        assert torch.allclose(nll[1, i, :n + 1].flip(0), ref_b, atol=1e-5)
        assert (nll[:, i, n + 1:] == 0).all()
    scores = lm.score(SENTS)
    for i, (sc, s) in enumerate(zip(scores, SENTS)):
        assert len(sc.forward_token_logprobs) == len(s) + 1 == sc.n_predictions
        assert sc.forward_logprob == pytest.approx(-nll[0, i].sum().item(), rel=1e-5)
        assert sc.backward_logprob == pytest.approx(-nll[1, i].sum().item(), rel=1e-5)
    # A sentence's score does not depend on its batch mates.
    alone = lm.score([SENTS[1]])[0]
    assert alone.forward_logprob == pytest.approx(scores[1].forward_logprob, rel=1e-5)
    with pytest.raises(ElmoError, match="sentence 0 is a str"):
        lm.score(["the cat"])


def test_gradients_by_finite_differences(vocab):
    torch.manual_seed(3)
    lm = LanguageModel(preset("tiny"), vocab, softmax="full", regularisation=Regularisation(dropout=0.0)).double()
    b = sentences_batch(SENTS[:2], vocab)

    def loss():
        s, _ = lm.batch_nll(b)
        return 0.5 * s.sum() / b.n_targets

    loss().backward()
    params = dict(lm.named_parameters())
    g = torch.Generator().manual_seed(0)
    for name in ["softmax.weight", "softmax.bias", "bilm.layers.0.w_x", "bilm.layers.1.w_h",
                 "bilm.layers.1.w_p", "bilm.encoder.proj.weight", "bilm.encoder.char_embed.weight"]:
        p = params[name]
        for _ in range(3):
            idx = tuple(int(torch.randint(0, n, (1,), generator=g)) for n in p.shape)
            if name.endswith("char_embed.weight"):
                idx = (int(b.char_ids[0, 3]), idx[1])  # a character that occurs
            old = p.data[idx].item()
            eps = 1e-6
            with torch.no_grad():
                p.data[idx] = old + eps
                up = loss().item()
                p.data[idx] = old - eps
                down = loss().item()
                p.data[idx] = old
            assert p.grad[idx].item() == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-8), name


def test_sampled_lm_uses_shared_negatives(vocab):
    torch.manual_seed(4)
    lm = LanguageModel(preset("tiny"), vocab, softmax="sampled", num_samples=5, regularisation=Regularisation(dropout=0.0)).train()
    b = sentences_batch(SENTS, vocab)
    a, _ = lm.batch_nll(b, generator=torch.Generator().manual_seed(9))
    c, _ = lm.batch_nll(b, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, c)
    lm.eval()
    full, _ = lm.batch_nll(b)
    assert not torch.allclose(a, full)


# -- saving, loading, init-from --------------------------------------------------------------------
def test_save_load_roundtrip(tmp_path, lm, vocab):
    d = lm.save_pretrained(tmp_path / "lm")
    assert (d / "vocab.txt").read_text().splitlines() == vocab.tokens
    lm2 = LanguageModel.from_pretrained(d)
    b = sentences_batch(SENTS, vocab)
    assert torch.equal(lm.batch_nll(b)[0], lm2.eval().batch_nll(b)[0])
    # The directory is an ordinary biLM to the rest of the library.
    bilm = BiLM.from_pretrained(d)
    from torchelmo import batch_to_ids
    x = batch_to_ids(SENTS)
    assert torch.equal(bilm(x).layers[-1], lm.bilm(x).layers[-1])
    # A biLM without softmax cannot be scored, but can start an LM.
    bilm.save_pretrained(tmp_path / "bilm")
    with pytest.raises(ElmoError, match="without a softmax"):
        LanguageModel.from_pretrained(tmp_path / "bilm")
    fresh = LanguageModel.init_from(tmp_path / "bilm", vocab, log=lambda s: None)
    assert torch.equal(fresh.bilm.layers[0].w_x, lm.bilm.layers[0].w_x)


def test_init_from_with_new_vocabulary(tmp_path, lm, vocab):
    lm.save_pretrained(tmp_path / "lm")
    new = Vocabulary(vocab.tokens + ["zebra", "yak"])
    msgs = []
    lm2 = LanguageModel.init_from(tmp_path / "lm", new, log=msgs.append).eval()
    assert "2 new tokens" in msgs[-1]
    W, W2 = lm.softmax.weight, lm2.softmax.weight
    assert torch.equal(W2[:len(vocab)], W)
    assert torch.equal(W2[-1], W[vocab.unk]) and torch.equal(W2[-2], W[vocab.unk])
    assert lm2.softmax.bias[-1].item() == pytest.approx(lm.softmax.bias[vocab.unk].item() - math.log(3))
    # The old <UNK> mass is shared out: old words keep their probabilities exactly.
    b_old = sentences_batch([["the", "cat", "sat"]], vocab)
    b_new = sentences_batch([["the", "cat", "sat"]], new)
    assert torch.allclose(lm.batch_nll(b_old)[0], lm2.batch_nll(b_new)[0], atol=1e-5)
    # And zebra, formerly <UNK>, gets a third of <UNK>'s probability.
    z_old = lm.score([["zebra"]])[0].forward_token_logprobs[0]
    z_new = lm2.score([["zebra"]])[0].forward_token_logprobs[0]
    assert z_new == pytest.approx(z_old - math.log(3), abs=1e-4)


@pytest.mark.core
def test_published_export_of_trained_lm(tmp_path, lm):
    opts, weights = lm.bilm.export_published(tmp_path / "pub")
    back = BiLM.from_published(opts, weights)
    from torchelmo import batch_to_ids
    x = batch_to_ids(SENTS)
    assert torch.allclose(back(x).layers[-1], lm.bilm(x).layers[-1], atol=1e-6)
