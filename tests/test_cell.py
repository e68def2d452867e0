"""The LSTM cell's one definition (torchelmo.numerics.cell): its rational activations against
float64, its backward against autograd through its forward, the in-place eager form bitwise equal
to it, the exported gate order, TorchScript, and every CPU path of the recurrence running it."""

import warnings

import pytest
import torch

from torchelmo.numerics import cell, compiled, epilogue
from torchelmo.numerics import lstm as L

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra


def _inputs(n=7, D=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = 3 * torch.randn(2, n, 4 * D, generator=g, dtype=dtype)
    c = 2 * torch.randn(2, n, D, generator=g, dtype=dtype)
    return z, c


def test_rational_tanh_and_sigmoid_against_float64():
    x = torch.cat([torch.linspace(-30, 30, 600_001), torch.tensor([0.0, 1e-30, -1e-8, float("inf"), -float("inf")])])
    exact = torch.tanh(x.double())
    assert (cell.rational_tanh(x).double() - exact).abs().max() < 5e-7
    assert (cell.rational_sigmoid(x).double() - torch.sigmoid(x.double())).abs().max() < 3e-7
    assert cell.rational_tanh(-x).equal(-cell.rational_tanh(x))     # odd, as tanh
    assert cell.rational_tanh(torch.tensor(float("nan"))).isnan()


@pytest.mark.parametrize("clip", [1.5, None])
def test_forward_is_the_published_step_in_float64(clip):
    # against the formula written out on its own, per gate, in float64
    z, c = _inputs(dtype=torch.float64)
    (gi, gj, gf, go), c_pre, c_new, q = cell.forward(z, c, clip)
    i, j, f, o = z.chunk(4, dim=-1)
    want_pre = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
    want = want_pre if clip is None else want_pre.clamp(-clip, clip)
    assert torch.allclose(c_pre, want_pre, rtol=0, atol=1e-15) and torch.allclose(c_new, want, rtol=0, atol=1e-15)
    assert torch.allclose(q, torch.sigmoid(o) * torch.tanh(want), rtol=0, atol=1e-15)
    assert clip is None or (c_pre.abs() > clip).any()                 # the clip was exercised


@pytest.mark.parametrize("clip", [1.5, None])
def test_backward_is_the_gradient_of_forward(clip):
    # the written-out backward against autograd through forward, in float64
    z, c = _inputs(dtype=torch.float64)
    z.requires_grad_(), c.requires_grad_()
    gates, c_pre, c_new, q = cell.forward(z, c, clip)
    g = torch.Generator().manual_seed(1)
    dq, dc = torch.randn(q.shape, generator=g, dtype=q.dtype), torch.randn(q.shape, generator=g, dtype=q.dtype)
    torch.autograd.backward([q, c_new], [dq, dc])
    dz, dc_prev = cell.backward(dq, torch.cat(gates, dim=-1).detach(), c_pre.detach(), c.detach(), dc, clip)
    torch.testing.assert_close(dz, z.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dc_prev, c.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("clip", [1.5, None])
def test_in_place_form_is_bitwise_the_definition(clip):
    # forward_ / backward_ on strided views of larger buffers (as the eager loops pass them)
    z, c = _inputs()
    gates, c_pre, c_new, q = cell.forward(z, c, clip)
    zb, cb = z.clone(), torch.full((2, 9, 16), 7.0)
    cb[:, :7] = c
    qb, tanh_c, pre = torch.zeros(2, 9, 16, dtype=torch.bfloat16), torch.empty(2, 9, 16), torch.empty(2, 7, 16)
    out = cell.forward_(zb, cb[:, :7], clip, qb[:, :7], tanh_c[:, :7], c_pre=pre)
    assert out.data_ptr() == qb.data_ptr()
    assert torch.equal(zb, torch.cat(gates, dim=-1)) and torch.equal(pre, c_pre) and torch.equal(cb[:, :7], c_new)
    assert torch.equal(qb[:, :7], q.to(torch.bfloat16)) and not qb[:, 7:].any() and (cb[:, 7:] == 7).all()

    g = torch.Generator().manual_seed(1)
    dq, dc, c_prev = (torch.randn(2, 7, 16, generator=g) for _ in range(3))
    dz, dc_prev = cell.backward(dq, zb, pre, c_prev, dc, clip)
    dzb, dcb = torch.zeros(2, 9, 64), dc.clone()
    cell.backward_(dq, zb, pre, c_prev, dcb, clip, dzb[:, :7])
    assert torch.equal(dzb[:, :7], dz) and torch.equal(dcb, dc_prev) and not dzb[:, 7:].any()


def test_exported_gate_order_and_torchscript():
    # [i, f, o, j] (one sigmoid over three blocks) gives the same step, to a unit in the last place
    # (a vectorised kernel rounds its tail elements apart); scripted, the same numbers
    z, c = _inputs()
    D = c.shape[-1]
    i, j, f, o = z.chunk(4, dim=-1)
    _, _, c_a, q_a = cell.forward(z, c, 1.5)
    _, _, c_b, q_b = cell.forward(torch.cat([i, f, o, j], dim=-1), c, 1.5, False, cell.GATES_EXPORT)
    torch.testing.assert_close(c_b, c_a, rtol=0, atol=1e-6)
    torch.testing.assert_close(q_b, q_a, rtol=0, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)    # torch.jit.script's; the export uses it
        scripted = torch.jit.script(cell.forward)
    _, _, c_s, q_s = scripted(torch.cat([i, f, o, j], dim=-1), c, 1.5, False, "ifoj")
    assert torch.equal(c_s, c_b) and torch.equal(q_s, q_b) and D == 16


@pytest.mark.parametrize("clip", [1.5, None])
def test_rational_activations_stay_within_their_error(clip):
    z, c = _inputs()
    exact = cell.forward(z.double(), c.double(), clip)
    approx = cell.forward(z, c, clip, rational=True)
    for a, b in zip(approx[1:], exact[1:]):
        assert (a.double() - b).abs().max() < 2e-6


def test_every_cpu_path_runs_the_one_cell(monkeypatch):
    # Count calls into the definitions: the eager inference loops (joint and chunked), training's
    # written-out backpropagation (forward and backward), the reference, and, where a compiler
    # is found, the compiled epilogue (traced from cell.forward). A path with its own copy of
    # the cell would not call in.
    calls = {name: 0 for name in ("forward", "forward_", "backward", "backward_")}
    for name in calls:
        fn = getattr(cell, name)

        def counted(*a, _fn=fn, _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)
        monkeypatch.setattr(cell, name, counted)
    torch.manual_seed(0)
    layer = L.BiLstmLayer(6, 8, 6)
    lengths = [4, 3]
    x, c0, h0 = torch.randn(2, 2, 4, 6), torch.zeros(2, 2, 8), torch.zeros(2, 2, 6)
    for k in (512, 0):                                               # joint, then chunked
        monkeypatch.setattr(L, "JOINT_MAX_K", k)
        before = calls["forward_"]
        with torch.no_grad():
            L.lstm_layer(layer, x, lengths, c0, h0, 1.0, 1.0, backend="cpu")
        assert calls["forward_"] == before + 4                       # once per step
    out, _, _ = L.lstm_layer(layer, x, lengths, c0, h0, 1.0, 1.0, backend="cpu")
    out.sum().backward()
    assert calls["forward_"] == 12 and calls["backward_"] == 4
    L.lstm_reference([layer], [x[0, 0], x[0, 1, :3]], None, 1.0, 1.0, False)
    assert calls["forward"] == 2 * (4 + 3)
    if compiled.compiler_found():
        z, c = _inputs(n=3, D=8)
        torch._dynamo.reset()
        epilogue.compiled()(z, None, None, c, 1.0, False)
        assert calls["forward"] > 2 * (4 + 3)
