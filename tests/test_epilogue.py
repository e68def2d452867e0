"""The compiled gate epilogue (backend ``cpu+compile``): its cell over common denominators against
float64, its numbers against the eager path's on both inference paths, the backend that ``auto``
picks for it, and the fallback when the compiler fails."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchelmo.errors import ElmoError
from torchelmo.numerics import backend as B
from torchelmo.numerics import compiled, epilogue
from torchelmo.numerics import lstm as L
from torchelmo.numerics.precision import resolve_precision

pytestmark = pytest.mark.core   # needs neither ../shared nor an optional extra

needs_compiler = pytest.mark.skipif(not compiled.compiler_found(), reason="no C++ compiler for torch.compile")


@pytest.mark.parametrize("clip", [3.0, None])
def test_rational_step_against_float64(clip):
    # the cell over common denominators (two divisions) against float64 sigmoid and tanh, with
    # products far past the rational functions' range (|z| up to 60) and the fp32 state unclipped
    torch.manual_seed(0)
    z = torch.cat([torch.randn(2, 64, 4 * 32) * 4, torch.randn(2, 8, 4 * 32) * 30], dim=1)
    bias, c = torch.randn(2, 1, 4 * 32), torch.randn(2, 72, 32) * 5
    c_ref, out_ref = epilogue.step(z.double(), None, bias.double(), c.double(), clip, False)
    c_new, out = epilogue.step(z, None, bias, c, clip, True)
    assert c_new.isfinite().all() and out.isfinite().all()
    assert (c_new.double() - c_ref).abs().max() < 2e-6 * max(1.0, float(c_ref.abs().max()))
    assert (out.double() - out_ref).abs().max() < 1e-6


def _layer(In, D, P, seed=0):
    torch.manual_seed(seed)
    layer = L.BiLstmLayer(In, D, P)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.3)
    return layer


def _run(layer, backend, precision, lengths, cell_clip, x, c0, h0):
    with torch.no_grad(), resolve_precision(precision, "cpu").scope():
        return L.lstm_layer(layer, x, lengths, c0, h0, cell_clip, 2.5, precision=precision, backend=backend)


@needs_compiler
@pytest.mark.parametrize("In", [16, 600])              # the joint path and the chunked one
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_epilogue_equals_eager(In, precision):
    D, P = 32, 16
    layer = _layer(In, D, P)
    lengths = [7, 6, 4, 2, 0]   # rows ending early, one never starting; step 6 runs one row alone
    B_ = len(lengths)
    x = torch.randn(2, B_, max(lengths), In)
    c0, h0 = torch.randn(2, B_, D), torch.randn(2, B_, P)
    for clip in (3.0, None):
        eager = _run(layer, "cpu", precision, lengths, clip, x, c0, h0)
        fused = _run(layer, "cpu+compile", precision, lengths, clip, x, c0, h0)
        if precision == "fp32":
            # torch's own sigmoid and tanh in one loop: the eager numbers but for rounding
            for a, b in zip(eager, fused):
                torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
        else:
            # the rational functions move a gate by at most 5e-7; the outputs are bf16-rounded
            # products, equal but where that moves one across a rounding boundary (one bf16 unit)
            out_e, out_f = eager[0], fused[0]
            assert ((out_e - out_f).abs() <= 2.0 ** -7 * out_e.abs().clamp(min=1e-3)).all()
            assert (out_e == out_f).double().mean() > 0.95
            torch.testing.assert_close(fused[1], eager[1], atol=2e-2, rtol=0)   # c: fp32 state
        # the row that never started keeps its initial state, as on the eager path
        assert fused[1][:, 4].equal(c0[:, 4]) and fused[2][:, 4].equal(eager[2][:, 4])
    assert not compiled._failed   # compiled throughout, one running row included


def test_auto_picks_the_compiled_epilogue_for_bf16_operands_on_wide_layers(monkeypatch):
    monkeypatch.setattr(B, "triton_installed", lambda: False)
    monkeypatch.setattr(B, "compiler_found", lambda: True)
    wide, narrow = B.COMPILE_MIN_CELLS, B.COMPILE_MIN_CELLS - 1
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "bf16", long_run=True) == "cpu+compile"
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "bf16") == "cpu"      # too little work to pay a compile
    assert B.resolve_backend("auto", "cpu", 5, 4, narrow, "bf16", long_run=True) == "cpu"
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "fp32", long_run=True) == "cpu"  # fp32: no faster, so eager
    assert B.resolve_backend("cpu", "cpu", 5, 4, wide, "bf16") == "cpu"
    assert B.resolve_backend("cpu+compile", "cpu", 5, 4, 8, "fp32") == "cpu+compile"
    monkeypatch.setattr(B, "compiler_found", lambda: False)
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "bf16", long_run=True) == "cpu"
    with pytest.raises(ElmoError, match="backend cpu\\+compile: no C\\+\\+ compiler found"):
        B.resolve_backend("cpu+compile", "cpu", 5, 4, wide, "bf16")


def test_compiler_found_follows_cxx(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    compiled.compiler_found.cache_clear()        # looked up once per process
    try:
        assert not compiled.compiler_found()
        monkeypatch.setenv("PATH", "")
        monkeypatch.delenv("CXX")
        compiled.compiler_found.cache_clear()
        assert not compiled.compiler_found()
    finally:
        compiled.compiler_found.cache_clear()


def test_a_failing_compile_warns_once_and_runs_eager(monkeypatch):
    def broken():
        def fail(*a):
            raise RuntimeError("InductorError: CppCompileError: C++ compile error\nmore lines")
        return fail
    monkeypatch.setattr(compiled, "compiler_found", lambda: True)
    monkeypatch.setattr(compiled, "_compile", lambda fn: broken())
    monkeypatch.setattr(compiled, "_failed", set())
    layer = _layer(8, 16, 8)
    x, c0, h0 = torch.randn(2, 3, 4, 8), torch.zeros(2, 3, 16), torch.zeros(2, 3, 8)
    eager = _run(layer, "cpu", "fp32", [4, 3, 1], 3.0, x, c0, h0)
    with pytest.warns(compiled.CompileWarning, match="torch.compile failed .*RuntimeError: InductorError"):
        fused = _run(layer, "cpu+compile", "fp32", [4, 3, 1], 3.0, x, c0, h0)
    for a, b in zip(eager, fused):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # once: later layers take the eager path quietly
        _run(layer, "cpu+compile", "fp32", [4, 3, 1], 3.0, x, c0, h0)
    # Only that loop: another one still compiles.
    assert compiled._failed == {"the LSTM's gate epilogue"}
    assert compiled.usable() and compiled.usable("the highway") and not compiled.usable("the LSTM's gate epilogue")
    tried = []
    monkeypatch.setattr(compiled, "_compile", lambda fn: lambda *a: tried.append(fn) or fn(*a))
    y = torch.randn(4, 3)
    assert torch.equal(compiled.run(torch.relu, (y,), lambda: 1 / 0, [(y, 0)], "the highway"), torch.relu(y))
    assert tried == [torch.relu]


@pytest.mark.parametrize("clip", [3.0, None])
def test_training_step_backward_is_the_gradient_of_the_step(clip):
    # train_step_backward against autograd through train_step, in float64 (torch's functions):
    # the written-out gradient rounded once to bf16, the cell gradient exact.
    torch.manual_seed(0)
    n, D = 5, 8
    z = (2 * torch.randn(2, n, 4 * D, dtype=torch.float64)).requires_grad_()
    bias = torch.randn(2, 1, 4 * D, dtype=torch.float64)
    c = (2 * torch.randn(2, n, D, dtype=torch.float64)).requires_grad_()
    gates, c_pre, c_new, q = epilogue.train_step(z, bias, c, clip, False)
    dq, dc = torch.randn(2, n, D, dtype=torch.float64), torch.randn(2, n, D, dtype=torch.float64)
    torch.autograd.backward([q, c_new], [dq, dc])
    dz, dc_prev = epilogue.train_step_backward(dq, gates.detach(), c_pre.detach(), c.detach(), dc, clip, False)
    assert dz.dtype == torch.bfloat16
    torch.testing.assert_close(dz.double(), z.grad, rtol=2 ** -8, atol=1e-12)
    torch.testing.assert_close(dc_prev, c.grad, rtol=1e-12, atol=1e-12)


@needs_compiler
def test_compiled_settings_nest_and_give_dynamo_config_back(monkeypatch):
    # Entered once around a layer's loop, the settings hold for the compiled calls inside (which
    # then enter nothing themselves) and give back the caller's config at the end.
    config = torch._dynamo.config
    monkeypatch.setattr(compiled, "_failed", set())
    with config.patch(recompile_limit=5, fail_on_recompile_limit_hit=False):
        with compiled.settings():
            assert compiled._in_settings()
            with compiled.settings():
                y = torch.randn(6, 5, 3)
                v, i = compiled.run(lambda t: tuple(t.max(dim=1)), (y,), lambda: tuple(y.max(dim=1)),
                                    [(y, 0)], "a test loop")
            assert (config.recompile_limit, config.fail_on_recompile_limit_hit) == (64, True)
        assert (config.recompile_limit, config.fail_on_recompile_limit_hit) == (5, False)
        assert not compiled._in_settings()
    assert torch.equal(v, y.max(dim=1).values) and torch.equal(i, y.max(dim=1).indices)


@pytest.mark.parametrize("clip", [3.0, None])
def test_training_steps_write_into_views_of_the_buffers(clip):
    # The _into forms store what the pure functions return into strided views (a step of a
    # time-major buffer, the running rows of the state), and touch nothing else.
    torch.manual_seed(0)
    T, B, n, D = 3, 6, 4, 8
    z, bias = 2 * torch.randn(2, n, 4 * D), torch.randn(2, 1, 4 * D)
    c = 2 * torch.randn(2, B, D)
    q = torch.zeros(2, T, B, D, dtype=torch.bfloat16)
    gates, c_pre, c_new, q_new = epilogue.train_step(z, bias, c[:, :n].clone(), clip, False)
    c_rest = c[:, n:].clone()
    g2, cp2 = epilogue.train_step_into(z, bias, c[:, :n], q[:, 1, :n], clip, False)
    assert torch.equal(g2, gates) and torch.equal(cp2, c_pre) and torch.equal(c[:, :n], c_new)
    assert torch.equal(q[:, 1, :n], q_new.to(torch.bfloat16)) and torch.equal(c[:, n:], c_rest)
    assert not q[:, [0, 2]].any() and not q[:, 1, n:].any()

    dq, dc = torch.randn(2, n, D), torch.randn(2, B, D)
    c_prev = torch.randn(2, n, D)
    dz_ref, dc_ref = epilogue.train_step_backward(dq, gates, c_pre, c_prev, dc[:, :n].clone(), clip, False)
    dz = torch.zeros(2, T, B, 4 * D, dtype=torch.bfloat16)
    dc_rest = dc[:, n:].clone()
    epilogue.train_step_backward_into(dq, gates, c_pre, c_prev, dc[:, :n], dz[:, 2, :n], clip, False)
    assert torch.equal(dz[:, 2, :n], dz_ref) and torch.equal(dc[:, :n], dc_ref) and torch.equal(dc[:, n:], dc_rest)
    assert not dz[:, :2].any() and not dz[:, 2, n:].any()


@needs_compiler
def test_compiled_training_gates_follow_the_eager_ones():
    # A bf16 training pass of one layer, forward and backward: each step's gates as two compiled
    # loops (rational sigmoid and tanh) against the eager ops; the same numbers to a few bf16
    # units, with rows that end early.
    layer = _layer(24, 32, 16)
    lengths = [6, 6, 4, 2]
    x = torch.randn(2, len(lengths), max(lengths), 24)
    c0, h0 = 0.5 * torch.randn(2, len(lengths), 32), 0.5 * torch.randn(2, len(lengths), 16)
    got = {}
    for backend in ("cpu", "cpu+compile"):
        layer.zero_grad()
        xx = x.clone().requires_grad_()
        with resolve_precision("bf16", "cpu").scope():
            out, c, h = L.lstm_layer(layer, xx, lengths, c0, h0, 3.0, 2.5, precision="bf16", backend=backend)
        (out * torch.linspace(-1, 1, 16)).sum().backward()
        got[backend] = [out.detach(), c.detach(), xx.grad] + [p.grad.clone() for p in layer.parameters()]
    for a, b in zip(got["cpu"], got["cpu+compile"]):
        assert (b - a).norm() <= 2 ** -7 * a.norm()


@needs_compiler
def test_a_failing_training_compile_warns_once_and_trains_eager(monkeypatch):
    def broken(fn):
        def fail(*a):
            raise RuntimeError("InductorError: CppCompileError")
        return fail
    monkeypatch.setattr(compiled, "_compile", broken)
    monkeypatch.setattr(compiled, "_failed", set())
    layer = _layer(24, 32, 16)
    x = torch.randn(2, 3, 5, 24, requires_grad=True)
    c0, h0 = torch.zeros(2, 3, 32), torch.zeros(2, 3, 16)
    with pytest.warns(compiled.CompileWarning, match="torch.compile failed"), \
            resolve_precision("bf16", "cpu").scope():
        out, _, _ = L.lstm_layer(layer, x, [5, 4, 3], c0, h0, 3.0, 2.5, precision="bf16", backend="cpu+compile")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_auto_compiles_only_where_the_work_pays_for_it(monkeypatch, tmp_path):
    # bf16 on a wide model: a short job (the README's example, a small file) runs eager, with no
    # compiled loop at all (recurrence, highway or max-pool); a long run (elmo train's
    # validations, elmo probe, elmo embed of a large input) compiles them.
    from torchelmo import BiLM, ElmoConfig, batch_to_ids
    from torchelmo.cli import main
    from torchelmo.commands import embed as embed_cmd
    from torchelmo.model import encoder as enc_mod
    monkeypatch.setattr(B, "triton_installed", lambda: False)
    monkeypatch.setattr(B, "compiler_found", lambda: True)
    monkeypatch.setattr(compiled, "compiler_found", lambda: True)
    calls = []

    def record(fn, args, eager, dynamic, what):
        calls.append(what)
        return eager()
    monkeypatch.setattr(compiled, "run", record)
    monkeypatch.setattr(epilogue, "run", record)
    monkeypatch.setattr(enc_mod, "run", record)
    torch.manual_seed(0)
    model = BiLM(ElmoConfig(lstm_dim=B.COMPILE_MIN_CELLS, projection_dim=16, char_embed_dim=4, n_highway=1,
                            filters=[[1, 8], [2, 8]]), precision="bf16").eval()
    ids = batch_to_ids([["The", "cat", "sat", "."], ["Dogs", "bark", "at", "cats"]])
    with torch.no_grad():
        short = model(ids).layers
    assert calls == []
    model.long_run = True
    with torch.no_grad():
        long = model(ids).layers
    assert {"the LSTM's gate epilogue", "the highway", "the char-CNN's max-pool"} <= set(calls)
    for a, b in zip(short, long):
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.02)   # eager and compiled: bf16 roundings apart
    # elmo embed decides from the input's size.
    seen = []
    monkeypatch.setattr(embed_cmd, "embed_file", lambda model, *a, **k: seen.append(model.long_run) or 1 / 0)
    small = tmp_path / "in.txt"
    small.write_text("a b c\n")
    for limit in (1 << 20, 4):
        monkeypatch.setattr(embed_cmd, "COMPILE_MIN_INPUT_BYTES", limit)
        with pytest.raises(ZeroDivisionError):
            main(["embed", str(small), str(tmp_path / "out.hdf5"), "--top", "--precision", "bf16"])
    assert seen == [False, True]
