import random

import pytest
import torch

from torchelmo import BiLM, ElmoConfig, ElmoError, batch_to_ids
from torchelmo.numerics.lstm import lstm_reference


def _random_sentences(n, seed=0, max_len=15):
    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "Überall", "北京", "!", "running", "x" * 60, "😀"]
    return [[rng.choice(words) for _ in range(rng.randint(1, max_len))] for _ in range(n)]


def _tiny_random(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ElmoConfig(lstm_dim=12, projection_dim=5, char_embed_dim=3, n_highway=1,
                     filters=[[1, 4], [2, 4], [3, 6]], **kw)
    model = BiLM(cfg).eval()
    with torch.no_grad():  # give the biases some spread so every gate matters
        for layer in model.layers:
            layer.bias.uniform_(-0.5, 0.5)
    return model


def test_shapes_and_mask(fixture_model):
    sents = [["a", "b", "c"], ["d"]]
    out = fixture_model.embed_sentences(sents)
    assert len(out.layers) == 3
    assert all(t.shape == (2, 3, 32) for t in out.layers)
    assert out.mask.tolist() == [[True, True, True], [True, False, False]]
    for t in out.layers:
        assert (t[1, 1:] == 0).all()
    kept = fixture_model.embed_sentences(sents, keep_sentence_boundaries=True)
    assert all(t.shape == (2, 5, 32) for t in kept.layers)
    assert kept.mask.sum(1).tolist() == [5, 3]
    # Removing the boundaries is exactly dropping positions 0 and L+1.
    torch.testing.assert_close(kept.layers[2][0, 1:4], out.layers[2][0], atol=0, rtol=0)
    torch.testing.assert_close(kept.layers[2][1, 1:2], out.layers[2][1, :1], atol=0, rtol=0)


def test_stateless_batch_independence(fixture_model):
    """A sentence alone and inside a batch of 32 of mixed lengths, in any row, gives the same output."""
    target = "The quick brown fox jumps over the lazy dog .".split()
    batch = _random_sentences(32, seed=1, max_len=20)
    with torch.no_grad():
        alone = fixture_model.embed_sentences([target]).layers
        again = fixture_model.embed_sentences([target]).layers
        for a, b in zip(alone, again):
            assert torch.equal(a, b)
        for row in (0, 7, 31):
            b = list(batch)
            b[row] = target
            out = fixture_model.embed_sentences(b).layers
            for k in range(3):
                torch.testing.assert_close(out[k][row, : len(target)], alone[k][0], atol=1e-6, rtol=0)


def test_empty_sentences(fixture_model):
    with torch.no_grad():
        out = fixture_model.embed_sentences([[], ["hello", "world"], []])
        alone = fixture_model.embed_sentences([["hello", "world"]])
        only_empty = fixture_model.embed_sentences([[]])
    assert out.mask.sum(1).tolist() == [0, 2, 0]
    assert (out.layers[2][0] == 0).all()
    torch.testing.assert_close(out.layers[2][1], alone.layers[2][0], atol=1e-6, rtol=0)
    assert all(t.shape == (1, 0, 32) for t in only_empty.layers)


def test_empty_batch_is_an_error(fixture_model):
    with pytest.raises(ElmoError, match="empty batch"):
        fixture_model(torch.zeros(0, 3, 50, dtype=torch.long))
    with pytest.raises(ElmoError, match="shape"):
        fixture_model(torch.zeros(2, 3, 49, dtype=torch.long))


def _reference_layers(model, sentences, states=None):
    """Per-sentence layers from the slow reference LSTM (boundaries removed)."""
    ids = batch_to_ids([["<S>", *s, "</S>"] for s in sentences])
    with torch.no_grad():
        e = model.encoder(ids)
    inputs = [e[b, : len(s) + 2] for b, s in enumerate(sentences)]
    outs, finals = lstm_reference(list(model.layers), inputs, states, model.config.cell_clip,
                                  model.config.proj_clip, model.config.use_skip_connections)
    layers = [[torch.cat([x[1:-1], x[1:-1]], -1) for x in inputs]]
    for k in range(model.config.n_layers):
        layers.append([outs[b][k][1:-1] for b in range(len(sentences))])
    return layers, finals


@pytest.mark.parametrize("skip", [True, False])
def test_fast_path_equals_reference(skip):
    model = _tiny_random(seed=3, use_skip_connections=skip, n_layers=3)
    sents = _random_sentences(9, seed=2)
    with torch.no_grad():
        fast = model.embed_sentences(sents).layers
    ref, _ = _reference_layers(model, sents)
    for k in range(4):
        for b, s in enumerate(sents):
            torch.testing.assert_close(fast[k][b, : len(s)], ref[k][b], atol=1e-5, rtol=0)


def test_stateful_equals_reference_carry():
    """Stateful mode: each row's final state seeds the same row of the next batch (checked against
    the reference run with explicitly carried states), batch size may shrink and grow."""
    model = _tiny_random(seed=4)
    model.stateful = True
    batches = [_random_sentences(4, seed=10), _random_sentences(4, seed=11),
               _random_sentences(2, seed=12), _random_sentences(5, seed=13)]
    D, P = model.config.lstm_dim, model.config.projection_dim
    carried = [(torch.zeros(2, 5, D), torch.zeros(2, 5, P)) for _ in model.layers]
    for batch in batches:
        with torch.no_grad():
            fast = model.embed_sentences(batch).layers
        B = len(batch)
        states = [(c[:, :B], h[:, :B]) for c, h in carried]
        ref, finals = _reference_layers(model, batch, states)
        for b, s in enumerate(batch):
            torch.testing.assert_close(fast[2][b, : len(s)], ref[2][b], atol=1e-5, rtol=0)
        for k in range(len(model.layers)):
            for b in range(B):
                carried[k][0][:, b], carried[k][1][:, b] = finals[b][k]
    model.reset_states()
    with torch.no_grad():
        a = model.embed_sentences(batches[0]).layers[2]
    stateless = _tiny_random(seed=4)
    with torch.no_grad():
        b = stateless.embed_sentences(batches[0]).layers[2]
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_stateful_depends_on_history_stateless_does_not(fixture_model):
    model = BiLM(fixture_model.config, stateful=True)
    model.load_state_dict(fixture_model.state_dict())
    s = [["a", "sentence", "here"]]
    with torch.no_grad():
        first = model.embed_sentences(s).layers[2]
        second = model.embed_sentences(s).layers[2]
        x1 = fixture_model.embed_sentences(s).layers[2]
        x2 = fixture_model.embed_sentences(s).layers[2]
    assert not torch.allclose(first, second)
    assert torch.equal(x1, x2)
    torch.testing.assert_close(first, x1, atol=1e-6, rtol=0)


def test_e0_is_context_free(fixture_model):
    with torch.no_grad():
        a = fixture_model.embed_sentences([["bank", "of", "river"]]).layers
        b = fixture_model.embed_sentences([["money", "in", "the", "bank"]]).layers
    torch.testing.assert_close(a[0][0, 0], b[0][0, 3], atol=1e-6, rtol=0)
    assert not torch.allclose(a[2][0, 0], b[2][0, 3], atol=1e-3)


@pytest.mark.core
def test_gradients_finite_differences_float64():
    """Analytic gradients of every parameter kind vs central finite differences (gradcheck)."""
    model = _tiny_random(seed=5, cell_clip=None, proj_clip=None).double().train()
    ids = batch_to_ids([["ab", "c"], ["de", "fgh", "ij"]])
    names = [n for n, _ in model.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in model.parameters())

    def f(*ps):
        out = torch.func.functional_call(model, dict(zip(names, ps)), (ids,))
        return sum((layer * (k + 1)).sin().sum() for k, layer in enumerate(out.layers))

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.core
def test_gradients_with_clipping_float64():
    # Clipping active (small clip values): gradients are still exact away from the clip boundary.
    model = _tiny_random(seed=6, cell_clip=0.3, proj_clip=0.2).double()
    ids = batch_to_ids([["ab", "c", "d"]])
    layer = model.layers[0]
    names = ["w_x", "w_h"]

    def f(w_x, w_h):
        out = torch.func.functional_call(model, {"layers.0.w_x": w_x, "layers.0.w_h": w_h}, (ids,))
        return out.layers[2].pow(2).sum()

    args = tuple(getattr(layer, n).detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-5, rtol=1e-4)


@pytest.mark.core
def test_a_frozen_bilm_under_autograd_runs_the_inference_path(monkeypatch):
    # Elmo keeps its biLM frozen while the task model trains with autograd on: the biLM's outputs
    # need no gradient path, so no graph is kept, no training path (nor any of its compiled
    # loops) runs, and the numbers are the no-grad ones, bit for bit.
    from torchelmo.model import encoder
    from torchelmo.numerics import compiled
    bilm = _tiny_random().requires_grad_(False)
    ids = batch_to_ids([["The", "cat", "sat", "."], ["Dogs", "bark"]])
    with torch.no_grad():
        want = bilm(ids).layers
    calls = []
    monkeypatch.setattr(compiled, "run", lambda *a, **k: calls.append(a) or a[2]())
    monkeypatch.setattr(encoder._WindowMax, "apply", lambda *a: calls.append(a))
    got = bilm(ids).layers
    assert not calls
    for g, w in zip(got, want):
        assert not g.requires_grad and g.grad_fn is None and torch.equal(g, w)
    bilm.layers[1].requires_grad_(True)               # part of it trains: the gradient path is back
    out = bilm(ids).layers
    assert out[2].requires_grad and not out[0].requires_grad
