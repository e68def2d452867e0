"""The compiled gate epilogue (backend ``cpu+compile``): its rational tanh and sigmoid against
float64, its numbers against the eager path's on both inference paths, the backend that ``auto``
picks for it, and the fallback when the compiler fails."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchelmo import backend as B
from torchelmo import epilogue
from torchelmo import lstm as L
from torchelmo.errors import ElmoError
from torchelmo.precision import cpu_bf16_support, resolve_precision

needs_compiler = pytest.mark.skipif(not epilogue.compiler_found(), reason="no C++ compiler for torch.compile")


def test_rational_tanh_and_sigmoid_against_float64():
    x = torch.cat([torch.linspace(-30, 30, 600_001), torch.tensor([0.0, 1e-30, -1e-8, float("inf"), -float("inf")])])
    exact = torch.tanh(x.double())
    assert (epilogue.rational_tanh(x).double() - exact).abs().max() < 5e-7
    assert (epilogue.rational_sigmoid(x).double() - torch.sigmoid(x.double())).abs().max() < 3e-7
    assert epilogue.rational_tanh(-x).equal(-epilogue.rational_tanh(x))     # odd, as tanh
    assert epilogue.rational_tanh(torch.tensor(float("nan"))).isnan()


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
        if precision == "fp32" or cpu_bf16_support() != "amx":
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
    assert not epilogue._failed   # compiled throughout, one running row included


def test_auto_picks_the_compiled_epilogue_for_bf16_operands_on_wide_layers(monkeypatch):
    monkeypatch.setattr(B, "triton_installed", lambda: False)
    monkeypatch.setattr(B, "cpu_bf16_support", lambda: "amx")
    monkeypatch.setattr(B, "compiler_found", lambda: True)
    wide, narrow = B.COMPILE_MIN_CELLS, B.COMPILE_MIN_CELLS - 1
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "bf16") == "cpu+compile"
    assert B.resolve_backend("auto", "cpu", 5, 4, narrow, "bf16") == "cpu"
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "fp32") == "cpu"      # fp32: no faster, so eager
    assert B.resolve_backend("cpu", "cpu", 5, 4, wide, "bf16") == "cpu"
    assert B.resolve_backend("cpu+compile", "cpu", 5, 4, 8, "fp32") == "cpu+compile"
    monkeypatch.setattr(B, "cpu_bf16_support", lambda: "avx512_bf16")          # bf16 runs as fp32 there
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "bf16") == "cpu"
    monkeypatch.setattr(B, "cpu_bf16_support", lambda: "amx")
    monkeypatch.setattr(B, "compiler_found", lambda: False)
    assert B.resolve_backend("auto", "cpu", 5, 4, wide, "bf16") == "cpu"
    with pytest.raises(ElmoError, match="backend cpu\\+compile: no C\\+\\+ compiler found"):
        B.resolve_backend("cpu+compile", "cpu", 5, 4, wide, "bf16")


def test_compiler_found_follows_cxx(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    epilogue.compiler_found.cache_clear()        # looked up once per process
    try:
        assert not epilogue.compiler_found()
        monkeypatch.setenv("PATH", "")
        monkeypatch.delenv("CXX")
        epilogue.compiler_found.cache_clear()
        assert not epilogue.compiler_found()
    finally:
        epilogue.compiler_found.cache_clear()


def test_a_failing_compile_warns_once_and_runs_eager(monkeypatch):
    def broken():
        def fail(*a):
            raise RuntimeError("InductorError: CppCompileError: C++ compile error\nmore lines")
        return fail
    monkeypatch.setattr(epilogue, "compiler_found", lambda: True)
    monkeypatch.setattr(epilogue, "_compiled_step", broken)
    monkeypatch.setattr(epilogue, "_failed", False)
    layer = _layer(8, 16, 8)
    x, c0, h0 = torch.randn(2, 3, 4, 8), torch.zeros(2, 3, 16), torch.zeros(2, 3, 8)
    eager = _run(layer, "cpu", "fp32", [4, 3, 1], 3.0, x, c0, h0)
    with pytest.warns(epilogue.CompileWarning, match="torch.compile failed .*RuntimeError: InductorError"):
        fused = _run(layer, "cpu+compile", "fp32", [4, 3, 1], 3.0, x, c0, h0)
    for a, b in zip(eager, fused):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # once: later layers take the eager path quietly
        _run(layer, "cpu+compile", "fp32", [4, 3, 1], 3.0, x, c0, h0)
