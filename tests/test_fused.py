"""The fused (Triton) recurrence against the autograd path and finite differences.

Without a GPU the kernels run under Triton's interpreter (set before the kernels are built), on
tiny shapes; with CUDA they are compiled and also checked on the GPU.
"""

import json
import os

import numpy as np
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from torchelmo import BiLM, batch_to_ids
from torchelmo.errors import ElmoError  # noqa: E402
from torchelmo.model.config import ElmoConfig  # noqa: E402
from torchelmo.numerics import backend
from torchelmo.numerics import fused as F  # noqa: E402
from torchelmo.numerics.lstm import BiLstmLayer, lstm_layer, lstm_layer_autograd  # noqa: E402

DEVICES = ["cpu"] if not HAS_CUDA else ["cuda"]
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def _layer(In=8, D=20, P=12, seed=0, device="cpu"):
    torch.manual_seed(seed)
    layer = BiLstmLayer(In, D, P)
    with torch.no_grad():
        layer.bias.normal_()
    return layer.to(device)


def _inputs(layer, lengths, T, device="cpu", grad=True):
    B = len(lengths)
    x = torch.randn(2, B, T, layer.input_dim, device=device)
    c0 = torch.randn(2, B, layer.lstm_dim, device=device)
    h0 = torch.randn(2, B, layer.projection_dim, device=device)
    return [t.requires_grad_(grad) for t in (x, c0, h0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("clips", [(None, None), (0.5, 0.3)])
def test_forward_and_gradients_equal_autograd_path(device, clips):
    layer = _layer(device=device)
    lengths, T = [6, 6, 4, 1, 0], 6          # a full row, shorter ones, and an empty one
    x, c0, h0 = _inputs(layer, lengths, T, device)
    ref = lstm_layer_autograd(layer, x, lengths, c0, h0, *clips, layer.w_h)
    got = lstm_layer(layer, x, lengths, c0, h0, *clips, backend="triton")
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    if clips[1] is not None:   # the clips were active, so their gradient masks are exercised
        assert (got[0].abs() == clips[1]).any()
    assert (got[0][:, 3, 1:] == 0).all() and (got[0][:, 4] == 0).all()   # zeros past each length
    torch.testing.assert_close(got[1][:, 4], c0[:, 4])                    # length 0 keeps its state
    weights = torch.Generator(device=device).manual_seed(1)
    r = [torch.randn(t.shape, generator=weights, device=device) for t in ref]
    params = [x, c0, h0, layer.w_x, layer.w_h, layer.w_p, layer.bias]
    g_ref = torch.autograd.grad(sum((a * w).sum() for a, w in zip(ref, r)), params)
    g_got = torch.autograd.grad(sum((a * w).sum() for a, w in zip(got, r)), params)
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


def test_gradients_by_finite_differences_float64():
    torch.manual_seed(0)
    D, P, B, T = 3, 2, 2, 3
    f64 = dict(dtype=torch.float64)
    xw = torch.randn(2, T, B, 4 * D, **f64)
    w_h, w_p = 0.5 * torch.randn(2, P, 4 * D, **f64), 0.5 * torch.randn(2, D, P, **f64)
    c0, h0 = torch.randn(2, B, D, **f64), torch.randn(2, B, P, **f64)
    args = [t.requires_grad_() for t in (xw, w_h, w_p, c0, h0)]
    lengths = torch.tensor([3, 2])
    for clips in [(None, None), (0.8, 0.6)]:
        assert torch.autograd.gradcheck(lambda *a, clips=clips: F.fused_recurrence(*a, lengths, *clips), args,
                                        eps=1e-6, atol=1e-5, fast_mode=True)


def test_reduced_precision_modes_stay_close():
    layer = _layer(In=16, D=32, P=16, seed=3)
    lengths, T = [5, 3, 2], 5
    x, c0, h0 = _inputs(layer, lengths, T, grad=False)
    with torch.no_grad():
        exact = lstm_layer(layer, x, lengths, c0, h0, 3.0, 3.0, backend="triton")[0]
        bf16 = lstm_layer(layer, x, lengths, c0, h0, 3.0, 3.0, precision="bf16", backend="triton")[0]
        tf32 = lstm_layer(layer, x, lengths, c0, h0, 3.0, 3.0, precision="tf32", backend="triton")[0]
    err = (bf16 - exact).abs().max().item()
    assert 1e-4 < err < 5e-2          # operands really are rounded, and the result stays close
    assert (tf32 - exact).abs().max().item() < 1e-2


def test_bilm_through_fused_path_equals_cpu_path(monkeypatch):
    torch.manual_seed(0)
    config = {**_tiny(), "n_layers": 2, "cell_clip": 3.0, "proj_clip": 3.0}
    model = BiLM(ElmoConfig(**config), stateful=True).eval()
    batches = [[["The", "cat", "sat", "."], ["Hello", "!"]], [["One"], ["Two", "more", "words"]]]
    with torch.no_grad():
        ref = [model(batch_to_ids(b)).layers for b in batches]   # the state carries across batches
        model.reset_states()
        model.backend = "triton"
        got = [model(batch_to_ids(b)).layers for b in batches]
    for lr, lg in zip(ref, got):
        for a, b in zip(lg, lr):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_precision_is_validated():
    model = BiLM(ElmoConfig(**_tiny()))
    with pytest.raises(ElmoError, match="precision.*fp32, tf32, bf16.*'fp16'"):
        model.precision = "fp16"
    with pytest.raises(ValueError, match="precision"):
        F.fused_recurrence(*([torch.zeros(1)] * 6), None, None, "fp64")


def _tiny():
    return dict(lstm_dim=16, projection_dim=8, n_layers=1, cell_clip=None, proj_clip=None,
                use_skip_connections=True, char_embed_dim=4, filters=[[1, 4], [2, 4]], n_highway=1,
                activation="relu", n_characters=262, max_characters_per_token=50)


@needs_cuda
def test_default_model_on_cuda_fused_equals_cpu():
    model = BiLM.from_pretrained("default")
    sentences = [["The", "fused", "recurrence", "runs", "here", "."], ["Short", "."], ["x"]]
    ids = batch_to_ids(sentences)
    with torch.no_grad():
        ref = model(ids).layers
        model.cuda()
        for precision, tol in [("fp32", 1e-5), ("tf32", 5e-2), ("bf16", 1e-1)]:
            model.precision = precision
            got = model(ids.cuda()).layers
            for a, b in zip(got, ref):
                assert (a.float().cpu() - b).abs().max().item() < tol, precision


def test_training_through_fused_path_follows_the_same_losses(monkeypatch, tmp_path, fixture_corpus):
    from torchelmo.train import TrainConfig, train
    data, vocab = fixture_corpus
    losses = []
    for fused in ("cpu", "triton"):   # the default backend, which training uses
        monkeypatch.setattr(backend, "default_backend", lambda fused=fused: fused)
        cfg = TrainConfig(train=[str(data)], vocab=str(vocab), out_dir=str(tmp_path / fused), model="tiny",
                          batch_size=4, unroll=5, max_steps=3, log_every=1, eval_every=1000,
                          checkpoint_every=1000, threads=1, progress=False, dropout=0.0)
        train(cfg, log=lambda s: None)
        rows = [json.loads(x) for x in (tmp_path / fused / "metrics.jsonl").read_text().splitlines()]
        losses.append([r["loss"] for r in rows if "loss" in r])
    assert len(losses[0]) == 3
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


def test_inference_keeps_nothing_for_backward(monkeypatch):
    layer = _layer(In=16, D=16, P=16)
    x, c0, h0 = _inputs(layer, [3, 2], 3, grad=False)
    saves = []
    real = F._forward
    monkeypatch.setattr(F, "_forward", lambda *a, save: saves.append(save) or real(*a, save=save))
    with torch.no_grad():
        out = lstm_layer(layer, x, [3, 2], c0, h0, None, None, backend="triton")[0]
    assert saves == [False] and out.grad_fn is None
    lstm_layer(layer, x, [3, 2], c0, h0, None, None, backend="triton")[0].sum().backward()
    assert saves == [False, True] and layer.w_h.grad is not None


@needs_cuda
def test_cuda_graphs_replay_equals_eager(monkeypatch):
    from torchelmo.numerics import graphs

    torch.manual_seed(0)
    config = {**_tiny(), "n_layers": 2, "cell_clip": 3.0, "proj_clip": 3.0}
    model = BiLM(ElmoConfig(**config), stateful=True).eval().cuda()
    # The first two share a bucket (16 rows x 8 steps); the third needs a new one.
    batches = [[["The", "cat", "sat", "."], ["Hello", "!"]],
               [["One"], ["Two", "more", "words", "here", "now"], ["x"]],
               [["w"] * (k % 11 + 1) for k in range(20)]]

    def run():
        model.reset_states()
        with torch.no_grad():
            return [model(batch_to_ids(b).cuda()).layers for b in batches]
    model.backend = "triton"
    ref = run()
    graphs.clear()
    model.backend = "triton+graphs"
    got = run()
    assert len(graphs._graphs) == 2 * model.config.n_layers     # two buckets, per layer
    for lr, lg in zip(ref, got):
        for a, b in zip(lg, lr):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    # The recorded graphs read weights changed in place: no new graphs, new results.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)
    model.backend = "triton"
    ref = run()
    model.backend = "triton+graphs"
    got = run()
    assert len(graphs._graphs) == 2 * model.config.n_layers
    for lr, lg in zip(ref, got):
        for a, b in zip(lg, lr):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    graphs.clear()


def test_cuda_graphs_stay_off_where_they_cannot_apply():
    from torchelmo.numerics import graphs

    x = torch.zeros(2, 1, 1, 4)
    assert not graphs.replayable(x)                    # not on CUDA
    if HAS_CUDA:
        x = x.cuda()
        with torch.no_grad():
            assert graphs.replayable(x)
        assert not graphs.replayable(x)                # autograd on
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            assert not graphs.replayable(x)            # autocast on


def test_padded_rows_and_steps_change_nothing():
    # What CUDA graphs rely on to bucket shapes: rows of length 0 and steps past every length,
    # whatever their inputs hold, leave the real rows' outputs and states as they were.
    from torchelmo.numerics.fused import lstm_layer_fused

    layer = _layer()
    lengths, T = [5, 3, 1], 5
    x, c0, h0 = _inputs(layer, lengths, T, grad=False)
    with torch.no_grad():
        ref = lstm_layer_fused(layer, x, torch.tensor(lengths), c0, h0, 0.5, 0.3, layer.w_h, "fp32")
        xp, cp, hp = _inputs(layer, lengths + [0, 0, 0, 0], T + 3, grad=False)
        xp.mul_(10)                        # large garbage in the padding
        xp[:, :3, :T], cp[:, :3], hp[:, :3] = x, c0, h0
        got = lstm_layer_fused(layer, xp, torch.tensor(lengths + [0] * 4), cp, hp, 0.5, 0.3, layer.w_h, "fp32")
    torch.testing.assert_close(got[0][:, :3, :T], ref[0], rtol=0, atol=1e-6)
    assert not got[0][:, :, T:].any() and not got[0][:, 3:].any()
    for a, b in zip(got[1:], ref[1:]):
        torch.testing.assert_close(a[:, :3], b, rtol=0, atol=1e-6)


def test_published_fixture_through_fused_path(allennlp_dir, monkeypatch):
    # The fused kernels in exact fp32 (compiled on CUDA, else interpreted) against the original
    # TensorFlow biLM's outputs, state carried across batches, clipping on.
    from conftest import check_stateful_fixture

    monkeypatch.setattr(backend, "default_backend", lambda: "triton")
    # The interpreter is slow: there, the first 3 batches (the state carried twice).
    check_stateful_fixture(allennlp_dir, "sentences.json", DEVICES[0], atol=2e-6,
                           batches=10 if HAS_CUDA else 3)


def test_views_are_read_through_their_strides_without_copies(monkeypatch):
    # xw, w_h, w_p, the initial cell state and the output gradient as views (a transpose, slices
    # of wider tensors): the same numbers and gradients as contiguous inputs, and no copy made.
    torch.manual_seed(3)
    B, T, D, P = 3, 4, 16, 8
    G = 4 * D
    xw_btg = torch.randn(2, B, T, G)
    wide_h, wide_p = torch.randn(2, P, G + 5), torch.randn(2, D, P + 3)
    c_wide, h0 = torch.randn(2, B, D + 2), torch.randn(2, B, P)
    lengths = torch.tensor([4, 2, 3], dtype=torch.int32)
    views = [xw_btg.transpose(1, 2), wide_h[..., :G], wide_p[..., :P], c_wide[..., :D], h0]
    assert not any(v.is_contiguous() for v in views[:4])
    dense = [v.contiguous() for v in views]
    for ins in (views, dense):
        for v in ins:
            v.requires_grad_(True)
    d_out = torch.randn(2, B, T, P).transpose(1, 2)       # (2, T, B, P), not contiguous

    copies = []
    contiguous = torch.Tensor.contiguous

    def counting(self, *a, **k):
        if not self.is_contiguous():
            copies.append(tuple(self.shape))
        return contiguous(self, *a, **k)

    def run(ins):
        out, c, h = F.fused_recurrence(*ins, lengths, 0.7, 0.5)
        grads = torch.autograd.grad((out * d_out).sum() + c.sum() + h.sum(), ins)
        return (out, c, h, *grads)

    want = run(dense)
    monkeypatch.setattr(torch.Tensor, "contiguous", counting)
    got = run(views)
    monkeypatch.undo()
    assert copies == []
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
