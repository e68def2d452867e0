"""The projected LSTM layer: every production path (autograd, joint and chunked inference) against
the slow reference; the end-to-end and fixture comparisons are in test_embed and test_compat."""

import pytest
import torch

import torchelmo.numerics.lstm as L
from torchelmo.model.bilm import reverse_padded
from torchelmo.numerics.lstm import BiLstmLayer, lstm_layer, lstm_reference

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


@pytest.mark.parametrize("joint_max_k,chunk_bytes", [(512, 64 << 20), (0, 64 << 20), (0, 1)])
def test_lstm_inference_path_equals_reference(monkeypatch, joint_max_k, chunk_bytes):
    """Both inference variants (joint per-step matmul; chunked input products, here one step per
    chunk too) vs the slow reference, with nonzero initial states and rows of length 0."""
    monkeypatch.setattr(L, "JOINT_MAX_K", joint_max_k)
    monkeypatch.setattr(L, "INPUT_CHUNK_BYTES", chunk_bytes)
    torch.manual_seed(0)
    D, P = 12, 5
    layer = BiLstmLayer(P, D, P)
    with torch.no_grad():
        layer.bias.uniform_(-0.5, 0.5)
    lengths = [9, 9, 7, 4, 1, 0]
    B, T = len(lengths), max(lengths)
    seqs = [torch.randn(n, P) for n in lengths]
    x = torch.zeros(2, B, T, P)
    for b, s in enumerate(seqs):
        x[0, b, : len(s)] = s
    x[1] = reverse_padded(x[0], torch.tensor(lengths))
    c0, h0 = torch.randn(2, B, D) * 0.5, torch.randn(2, B, P) * 0.5
    with torch.no_grad():
        out, c, h = lstm_layer(layer, x, lengths, c0, h0, 0.7, 0.6)   # clips active
        ref, finals = lstm_reference([layer], seqs, [(c0, h0)], 0.7, 0.6, False)
    for b, n in enumerate(lengths):
        r = ref[b][0]
        torch.testing.assert_close(out[0, b, :n], r[:, :P], atol=1e-5, rtol=0)
        torch.testing.assert_close(out[1, b, :n], r[:, P:].flip(0), atol=1e-5, rtol=0)
        assert not out[:, b, n:].any()                                         # zeros past the end
        torch.testing.assert_close(c[:, b], finals[b][0][0], atol=1e-5, rtol=0)
        torch.testing.assert_close(h[:, b], finals[b][0][1], atol=1e-5, rtol=0)


def test_autograd_path_equals_inference_path():
    """The training path computes what inference computes (same inputs, gradients on)."""
    torch.manual_seed(2)
    D, P = 12, 5
    layer = BiLstmLayer(P, D, P)
    lengths = [6, 6, 3, 1]
    x = torch.randn(2, len(lengths), 6, P)
    c0, h0 = torch.randn(2, 4, D) * 0.5, torch.randn(2, 4, P) * 0.5
    with torch.no_grad():
        ref = layer(x, lengths, c0, h0, 0.7, 0.6)
    got = layer(x.requires_grad_(), lengths, c0, h0, 0.7, 0.6)
    assert got[0].requires_grad
    for a, b in zip(got, ref):
        torch.testing.assert_close(a.detach(), b, atol=1e-6, rtol=0)


def test_backend_table_picks_each_path(monkeypatch):
    from torchelmo.errors import ElmoError
    from torchelmo.numerics import backend as B

    monkeypatch.setattr(B, "triton_installed", lambda: True)
    assert B.resolve_backend("auto", "cpu", 5, 4, 16) == "cpu"
    assert B.resolve_backend("auto", "cuda", 5, 4, 16) == "triton"
    assert B.resolve_backend("triton+graphs", "cuda", 5, 4, 16) == "triton+graphs"
    assert B.resolve_backend("triton", "cpu", 5, 4, 16) == "triton"          # under the interpreter
    assert B.resolve_backend("cpu", "cuda", 5, 4, 16) == "cpu"
    assert B.resolve_backend("triton", "cuda", 2**16, 2**10, 2**12) == "cpu"   # past 32-bit offsets
    monkeypatch.setattr(B, "triton_installed", lambda: False)
    assert B.resolve_backend("auto", "cuda", 5, 4, 16) == "cpu"
    with pytest.raises(ElmoError, match="backend triton: Triton is not installed"):
        B.resolve_backend("triton", "cuda", 5, 4, 16)
    with pytest.raises(ElmoError, match="backend: must be one of auto, cpu, cpu\\+compile, triton, triton\\+graphs"):
        B.resolve_backend("cudnn", "cuda", 5, 4, 16)
    # The environment gives the default, read once.
    B.default_backend.cache_clear()
    monkeypatch.setenv("TORCHELMO_BACKEND", "cpu")
    assert B.resolve_backend(None, "cuda", 5, 4, 16) == "cpu"
    monkeypatch.setenv("TORCHELMO_BACKEND", "auto")
    assert B.default_backend() == "cpu"
    B.default_backend.cache_clear()
    # lstm_layer runs the table's entry for the resolved name, and BiLM passes its setting down.
    seen = []
    for name in ("cpu", "cpu+compile", "triton", "triton+graphs"):
        monkeypatch.setitem(L._BACKENDS, name, lambda *a, name=name: seen.append(name) or (None, None, None))
    monkeypatch.setattr(B, "triton_installed", lambda: True)
    layer = L.BiLstmLayer(4, 8, 4)
    x, c0, h0 = torch.zeros(2, 1, 2, 4), torch.zeros(2, 1, 8), torch.zeros(2, 1, 4)
    monkeypatch.setattr(B, "compiler_found", lambda: True)
    for name in ("cpu", "cpu+compile", "triton", "triton+graphs", "auto"):
        L.lstm_layer(layer, x, [2], c0, h0, None, None, backend=name)
    assert seen == ["cpu", "cpu+compile", "triton", "triton+graphs", "cpu"]


@pytest.mark.parametrize("clips", [(0.7, 0.6), (None, None)])
def test_training_recurrence_gradients_by_finite_differences(clips):
    """The hand-written backpropagation through time (bptt.Recurrence) against central finite
    differences, float64: every input, with rows that end early, steps after the last run, a
    nonzero initial state and clips that bind."""
    from torchelmo.numerics.bptt import Recurrence
    torch.manual_seed(3)
    B, T, I, D, P = 4, 6, 3, 4, 3
    args = [torch.randn(2, B, T, I), torch.randn(2, B, D), torch.randn(2, B, P), torch.randn(2, I, 4 * D),
            torch.randn(2, P, 4 * D), torch.randn(2, 4 * D), torch.randn(2, D, P)]
    args = [a.double().requires_grad_() for a in args]
    runs = [4, 3, 3, 1]                                   # step 4 and 5: no row runs
    assert torch.autograd.gradcheck(lambda *a: Recurrence.apply(*a, runs, *clips, None), args,
                                    eps=1e-6, atol=1e-6)


def test_training_gradients_equal_autograd_through_the_reference():
    """Gradients of the training path (weights, inputs, initial state) equal autograd's through
    the slow reference, sentence by sentence."""
    torch.manual_seed(4)
    D, P = 12, 5
    layer = BiLstmLayer(P, D, P)
    with torch.no_grad():
        layer.bias.uniform_(-0.5, 0.5)
    lengths = [7, 7, 4, 1, 0]
    B, T = len(lengths), max(lengths)
    seqs = [torch.randn(n, P) for n in lengths]
    c0, h0 = torch.randn(2, B, D) * 0.5, torch.randn(2, B, P) * 0.5
    weights = torch.randn(B, T, 2 * P)                    # a loss that weighs every output

    def grads(run):
        layer.zero_grad(set_to_none=True)
        inputs = [s.clone().requires_grad_() for s in seqs]
        states = (c0.clone().requires_grad_(), h0.clone().requires_grad_())
        run(inputs, states).backward()
        return [p.grad for p in layer.parameters()] + [i.grad for i in inputs] + [s.grad for s in states]

    def production(inputs, states):
        x = torch.zeros(2, B, T, P)
        for b, s in enumerate(inputs):
            x[0, b, :len(s)] = s
            x[1, b, :len(s)] = s.flip(0)
        out, c, h = lstm_layer(layer, x, lengths, *states, 0.7, 0.6)
        both = torch.cat([out[0], reverse_padded(out[1], torch.tensor(lengths))], dim=-1)
        return (both * weights).sum() + c.sum() + (h * h).sum()

    def reference(inputs, states):
        outs, finals = lstm_reference([layer], inputs, [states], 0.7, 0.6, False)
        loss = sum((o[0] * weights[b, :len(o[0])]).sum() for b, o in enumerate(outs))
        return loss + sum(f[0][0].sum() + (f[0][1] ** 2).sum() for f in finals)

    for got, want in zip(grads(production), grads(reference)):
        if want is None:                                  # the empty sentence's input
            assert got is None or got.numel() == 0
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
