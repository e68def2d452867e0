"""Precision: bf16 on the CPU computes what it promises (bf16 operands, fp32 accumulation, bias,
state and gates), ``auto`` picks by the hardware, and the model applies its precision exactly once
on every path (inference, training step, validation)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import base_config
from torchelmo import BiLM, batch_to_ids, preset
from torchelmo.cli import main
from torchelmo.lm.model import LanguageModel
from torchelmo.numerics import precision as precision_mod
from torchelmo.numerics.compiled import compiler_found
from torchelmo.numerics.lstm import BiLstmLayer, lstm_layer
from torchelmo.numerics.operands import bf16_cache, linear, mm, padded_rows
from torchelmo.numerics.precision import Precision, resolve_precision
from torchelmo.train import train

BF16_UNITS = precision_mod.cpu_bf16_support() != "none"   # AMX or AVX512-BF16


def rounded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).double()


def reference_layer(layer, x, lengths, cell_clip, proj_clip, round_operands, round_products=False):
    """One direction-stacked layer in float64, step by step; every matmul operand rounded to
    bfloat16 when ``round_operands`` (the bias, state, gates and clips exact), and every matmul's
    result too when ``round_products`` (bf16 tensors: a matmul's output is bf16)."""
    r = rounded if round_operands else (lambda t: t.double())
    p = rounded if round_products else (lambda t: t)
    _, B, T, _ = x.shape
    D, P = layer.lstm_dim, layer.projection_dim
    out = torch.zeros(2, B, T, P, dtype=torch.float64)
    for d in range(2):
        for b in range(B):
            c, h = torch.zeros(D, dtype=torch.float64), torch.zeros(P, dtype=torch.float64)
            for t in range(lengths[b]):
                xh = torch.cat([r(x[d, b, t]), r(h)])
                z = p(xh @ torch.cat([r(layer.w_x[d]), r(layer.w_h[d])])) + layer.bias[d].double()
                i, j, f, o = z.split(D)
                c = (torch.sigmoid(f + 1.0) * c + torch.sigmoid(i) * torch.tanh(j)).clamp(-cell_clip, cell_clip)
                h = p(r(torch.sigmoid(o) * torch.tanh(c)) @ r(layer.w_p[d])).clamp(-proj_clip, proj_clip)
                out[d, b, t] = h
    return out


# Shapes where every matmul, even of one running row, is over PyTorch's 16^3 multiply-adds below
# which a CPU matmul stays fp32 whatever the math mode.
SHAPES = [(24, 48, 64), (320, 48, 256)]     # narrow (one matmul per step) and wide (chunked) paths


def _bf16_run(input_dim, lstm_dim, proj_dim, lengths, grad, backend=None):
    torch.manual_seed(0)
    layer = BiLstmLayer(input_dim, lstm_dim, proj_dim)
    with torch.no_grad():
        layer.bias.normal_(0.0, 0.5)
    x = torch.randn(2, len(lengths), max(lengths), input_dim)
    for b, n in enumerate(lengths):
        x[:, b, n:] = 0.0
    c0, h0 = torch.zeros(2, len(lengths), lstm_dim), torch.zeros(2, len(lengths), proj_dim)
    with torch.set_grad_enabled(grad), resolve_precision("bf16", "cpu").scope():
        out, _, _ = lstm_layer(layer, x.requires_grad_(grad), lengths, c0, h0, 3.0, 3.0, precision="bf16",
                               backend=backend)
    return layer, x.detach(), out.detach().double()


@pytest.mark.core
@pytest.mark.parametrize("input_dim,lstm_dim,proj_dim", SHAPES)
def test_bf16_training_recurrence_is_bf16_matmuls_with_fp32_gates(input_dim, lstm_dim, proj_dim):
    # The autograd path: bf16 tensors (one product per step over [x_t ; h_{t-1}], rounded to
    # bf16), fp32 bias, gates, cell and clips, on every CPU.
    lengths = [7, 5, 2]
    layer, x, out = _bf16_run(input_dim, lstm_dim, proj_dim, lengths, grad=True)
    exact = reference_layer(layer, x, lengths, 3.0, 3.0, round_operands=False)
    want = reference_layer(layer, x, lengths, 3.0, 3.0, round_operands=True, round_products=True)
    assert (out - want).abs().max() <= 2.0 ** -6 * want.abs().max()
    assert (out - exact).abs().max() > 1e-3
    assert (out - exact).abs().max() < 2.0 ** -4 * exact.abs().max()


@pytest.mark.core
@pytest.mark.parametrize("backend", ["cpu", pytest.param("cpu+compile", marks=pytest.mark.skipif(
    not compiler_found(), reason="no C++ compiler for torch.compile"))])
@pytest.mark.parametrize("input_dim,lstm_dim,proj_dim", SHAPES)
def test_bf16_inference_recurrence_is_bf16_matmuls_with_fp32_gates(input_dim, lstm_dim, proj_dim, backend):
    # The inference paths: bfloat16 operands and products, the bias, gates, cell and clips in
    # fp32 (compiled: the gates' sigmoid and tanh rational, to 5e-7). One step from the zero state
    # matches that arithmetic except where the product's fp32 accumulation lands on the other side
    # of a bf16 rounding boundary than float64's; over a sequence such one-unit differences travel
    # on, so the bound is a few bf16 units.
    layer, x, out = _bf16_run(input_dim, lstm_dim, proj_dim, [1, 1, 1, 1], grad=False, backend=backend)
    want = reference_layer(layer, x, [1] * 4, 3.0, 3.0, round_operands=True, round_products=True)
    close = (out - want).abs() < 1e-5
    assert close.double().mean() > 0.98
    assert (out - want).abs().max() <= 2.0 ** -8 * want.abs().max()
    lengths = [7, 5, 2]
    layer, x, out = _bf16_run(input_dim, lstm_dim, proj_dim, lengths, grad=False, backend=backend)
    want = reference_layer(layer, x, lengths, 3.0, 3.0, round_operands=True, round_products=True)
    assert (out - want).abs().max() <= 2.0 ** -6 * want.abs().max()
    exact = reference_layer(layer, x, lengths, 3.0, 3.0, round_operands=False)
    assert (out - exact).abs().max() > 1e-3
    assert (out - exact).abs().max() < 2.0 ** -4 * exact.abs().max()


@pytest.mark.core
def test_bf16_weights_are_cast_once_and_recast_when_they_change():
    layer, x, _ = _bf16_run(24, 48, 64, [3, 2], grad=False)
    joint = bf16_cache(layer)["joint"]
    c0, h0 = torch.zeros(2, 2, 48), torch.zeros(2, 2, 64)
    run = lambda: lstm_layer(layer, x, [3, 2], c0, h0, 3.0, 3.0, precision="bf16")[0]  # noqa: E731
    with torch.no_grad(), resolve_precision("bf16", "cpu").scope():
        first = run()
        assert bf16_cache(layer)["joint"] is joint              # reused, not recast
        layer.w_h.mul_(0.5)                                      # an optimizer step, a load_state_dict
        second = run()
    assert bf16_cache(layer)["joint"] is not joint and not torch.equal(first, second)
    torch.testing.assert_close(bf16_cache(layer)["joint"][:, 24:].float(), layer.w_h.detach().bfloat16().float())
    assert "_bf16" not in str(vars(layer)) and not bf16_cache(copy.deepcopy(layer))   # never carried along
    with torch.no_grad():
        assert torch.equal(run(), second)                        # the argument decides, scope or none
        assert not torch.equal(lstm_layer(layer, x, [3, 2], c0, h0, 3.0, 3.0)[0], second)   # fp32


@pytest.mark.core
def test_bf16_inference_after_a_fused_optimizer_step_uses_the_new_weights():
    # PyTorch's fused optimizers update weights in place without bumping their version counters:
    # the cached bf16 casts must still follow (the trainer validates in bf16 between steps).
    torch.manual_seed(0)
    model = BiLM(preset("tiny"), precision="bf16").eval()
    ids = batch_to_ids([["The", "cat", "sat", "."], ["Dogs", "bark"]])
    with torch.no_grad():
        model(ids)                                               # the casts are cached
    opt = torch.optim.Adam(model.parameters(), lr=0.05, fused=True)
    model.train()
    sum(layer.sum() for layer in model(ids).layers).backward()
    opt.step()
    model.eval()
    fresh = copy.deepcopy(model)                                 # no cache travels with a copy
    with torch.no_grad():
        for got, want in zip(model(ids).layers, fresh(ids).layers):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.core
def test_a_models_bf16_casts_are_its_own():
    # Another model's training pass and optimizer step leave this model's cached casts in place
    # (the cache used to go stale with any training pass in the process); its own step does not.
    torch.manual_seed(0)
    mine, other = BiLM(preset("tiny"), precision="bf16").eval(), BiLM(preset("tiny"), precision="bf16")
    ids = batch_to_ids([["The", "cat", "sat", "."], ["Dogs", "bark"]])
    with torch.no_grad():
        mine(ids)
    cached = bf16_cache(mine.layers[0])["joint"]
    opt = torch.optim.Adam(other.parameters(), lr=0.05, fused=True)
    sum(layer.sum() for layer in other(ids).layers).backward()
    opt.step()
    with torch.no_grad():
        mine(ids)
    assert bf16_cache(mine.layers[0])["joint"] is cached
    opt = torch.optim.Adam(mine.parameters(), lr=0.05, fused=True)
    mine.train()
    sum(layer.sum() for layer in mine(ids).layers).backward()
    opt.step()
    with torch.no_grad():
        mine.eval()(ids)
    assert bf16_cache(mine.layers[0])["joint"] is not cached


@pytest.mark.core
def test_bf16_token_encoder_multiplies_bf16_weights_at_inference():
    # Highway and projection: bf16 weights (cached) and activations, fp32 bias and gates; the
    # same numbers to bf16 accuracy; autograd (training) keeps fp32 tensors.
    torch.manual_seed(0)
    model = BiLM(preset("tiny")).eval()
    ids = batch_to_ids([["The", "cat", "sat", "."], ["Dogs", "bark"]])
    with torch.no_grad():
        exact = model.encoder(ids)
        got = model.encoder(ids, precision="bf16")
    assert "weight" in bf16_cache(model.encoder.proj) and "weight" in bf16_cache(model.encoder.highways[0].proj)
    err = (got - exact).abs()
    assert 0 < err.max() and err.mean() < 0.01 * exact.abs().mean()
    assert model.encoder(ids, precision="bf16").requires_grad   # the training path: no cache


@pytest.mark.core
def test_bf16_training_gradients_reach_fp32_weights():
    # One forward and backward pass of the biLM: under bf16 the char-CNN, highway,
    # projection and recurrence multiply bf16 tensors, so every weight's gradient differs from
    # fp32's a little; it arrives in fp32 on the fp32 parameter, close to fp32's.
    torch.manual_seed(0)
    model = BiLM(preset("tiny")).train()
    ids = batch_to_ids([["The", "cat", "sat", "on", "the", "mat", "."], ["Dogs", "bark"]])
    grads = {}
    for p in ("fp32", "bf16"):
        model.zero_grad(set_to_none=True)
        model.precision = p
        out = model(ids)
        sum((layer * torch.linspace(-1, 1, layer.shape[-1])).sum() for layer in out.layers).backward()
        grads[p] = {n: w.grad.clone() for n, w in model.named_parameters() if w.grad is not None}
    names = ["encoder.convs.0.weight", "encoder.highways.0.proj.weight", "encoder.proj.weight",
             "layers.0.w_x", "layers.0.w_h", "layers.1.w_p"]
    for n in names:
        g32, g16 = grads["fp32"][n], grads["bf16"][n]
        assert g16.dtype == torch.float32
        rel = (g16 - g32).norm() / g32.norm()
        assert rel < 0.05, n
        assert rel > 1e-4, n


@pytest.mark.core
def test_a_cpu_scope_sets_no_process_wide_switch():
    # On a CPU the precision travels as an argument: the scope leaves oneDNN's math mode (which
    # every thread shares) as it found it, so an fp32 matmul inside a bf16 scope stays fp32.
    mkl = torch.backends.mkldnn
    before = mkl.matmul.fp32_precision, mkl.conv.fp32_precision
    a, b = torch.randn(64, 256), torch.randn(256, 64)
    with Precision("bf16", "cpu").scope():
        assert (mkl.matmul.fp32_precision, mkl.conv.fp32_precision) == before
        assert (a @ b - (a.double() @ b.double()).float()).abs().max() < 1e-3   # bf16 operands: ~0.1


@pytest.mark.core
def test_auto_follows_the_hardware(monkeypatch):
    assert resolve_precision("auto", "cpu").name == ("bf16" if BF16_UNITS else "fp32")
    assert resolve_precision("auto", "cuda").name == "fp32"
    for kind, want in (("amx", "bf16"), ("avx512_bf16", "bf16"), ("none", "fp32")):
        monkeypatch.setattr(precision_mod, "cpu_bf16_support", lambda kind=kind: kind)
        assert resolve_precision("auto", "cpu").name == want
        assert kind.split("_")[0].upper() in precision_mod.support_line() or kind == "none"
    # Asking for bf16 where it is slower than fp32 warns once, in one line, and still runs bf16;
    # where the CPU has bf16 units it does not warn.
    precision_mod._warn_slow_bf16.cache_clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert resolve_precision("bf16", "cpu").name == "bf16"
        resolve_precision("bf16", "cpu")
    assert [w.category for w in seen] == [precision_mod.PrecisionWarning]
    assert "no bfloat16 units" in str(seen[0].message) and "\n" not in str(seen[0].message)
    precision_mod._warn_slow_bf16.cache_clear()
    monkeypatch.setattr(precision_mod, "cpu_bf16_support", lambda: "avx512_bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_precision("bf16", "cpu").name == "bf16"


@pytest.mark.core
def test_cpu_support_respects_onednn_isa_ceiling(monkeypatch):
    monkeypatch.setattr(precision_mod, "_cpu_flags", lambda: {"avx512_bf16", "amx_bf16"})
    monkeypatch.setattr(precision_mod, "_amx_usable", lambda: True)
    for isa, want in (("", "amx"), ("AVX512_CORE_BF16", "avx512_bf16"), ("AVX512_CORE", "none"),
                      ("AVX2", "none")):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
        precision_mod.cpu_bf16_support.cache_clear()
        assert precision_mod.cpu_bf16_support() == want, isa
    precision_mod.cpu_bf16_support.cache_clear()


class ScopeCounter:
    """Counts entries into :meth:`Precision.scope` and records the precision the softmax (the
    LM's last matmul) is given."""

    def __init__(self, monkeypatch, lm: LanguageModel | None = None) -> None:
        self.entries, self.softmax_precisions = 0, []
        real = Precision.scope

        def counted(p):
            self.entries += 1
            return real(p)
        monkeypatch.setattr(Precision, "scope", counted)
        if lm is not None:
            nll = lm.softmax.nll

            def watched(*a, **kw):
                self.softmax_precisions.append(a[3] if len(a) > 3 else kw.get("precision"))
                return nll(*a, **kw)
            monkeypatch.setattr(lm.softmax, "nll", watched)


@pytest.mark.core
def test_precision_is_applied_once_per_forward(monkeypatch):
    torch.manual_seed(0)
    model = BiLM(preset("tiny"), precision="bf16").eval()
    counter = ScopeCounter(monkeypatch)
    with torch.no_grad():
        model(batch_to_ids([["a", "b"], ["c"]]))
    assert counter.entries == 1


def test_precision_is_applied_once_per_training_step_and_validation(tmp_path, fixture_corpus, monkeypatch):
    data, vocab = fixture_corpus
    import torchelmo.train.trainer as trainer_mod

    counters = []
    build = trainer_mod.build_lm

    def build_and_watch(*a, **kw):
        lm = build(*a, **kw)
        counters.append(ScopeCounter(monkeypatch, lm))
        return lm
    monkeypatch.setattr(trainer_mod, "build_lm", build_and_watch)
    cfg = base_config(tmp_path, data, vocab, precision="bf16", max_steps=4, eval_every=2,
                      valid=[str(data)], eval_batch_size=64, softmax="sampled", num_samples=20)
    train(cfg, log=lambda s: None)
    counter = counters[0]
    # Every LM call (4 steps, and one per validation batch) gives its softmax the precision.
    assert len(counter.softmax_precisions) > 4 and set(counter.softmax_precisions) == {"bf16"}
    assert counter.entries >= len(counter.softmax_precisions)


def test_bf16_training_resumes_exactly(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    kw = dict(precision="bf16", softmax="sampled", num_samples=20, dropout=0.1, checkpoint_every=3)
    train(base_config(tmp_path / "straight", data, vocab, max_steps=8, **kw), log=lambda s: None)
    train(base_config(tmp_path / "split", data, vocab, max_steps=3, **kw), log=lambda s: None)
    train(base_config(tmp_path / "split", data, vocab, max_steps=8, resume=True, **kw), log=lambda s: None)
    a = LanguageModel.from_pretrained(tmp_path / "straight" / "run" / "model").state_dict()
    b = LanguageModel.from_pretrained(tmp_path / "split" / "run" / "model").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    cfg = json.loads((tmp_path / "split" / "run" / "train_config.json").read_text())
    assert cfg["precision"] == "bf16"
    # Parameters and optimizer state stay fp32 under bf16.
    assert all(v.dtype == torch.float32 for v in a.values() if v.is_floating_point())


@pytest.mark.core
def test_cli_precision_choices(tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a b c\n")
    for p in ("auto", "bf16"):
        assert main(["embed", str(src), str(tmp_path / f"{p}.hdf5"), "--top", "--precision", p]) == 0
    with pytest.raises(SystemExit):
        main(["embed", str(src), str(tmp_path / "x.hdf5"), "--dtype", "bfloat16"])
    capsys.readouterr()
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    machine = json.loads(out[out.index("{"):])["machine"]
    assert machine.startswith("precision: CPU") and ("auto picks bf16" in machine) == BF16_UNITS


@pytest.mark.core
def test_cli_backend_option(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("a b c\n")
    assert main(["embed", str(src), str(tmp_path / "cpu.hdf5"), "--top", "--backend", "cpu"]) == 0
    with pytest.raises(SystemExit):
        main(["embed", str(src), str(tmp_path / "x.hdf5"), "--backend", "cudnn"])


@pytest.mark.core
def test_padded_rows_are_few_sizes_at_most_a_sixteenth_more():
    sizes = [padded_rows(m) for m in range(1, 4097)]
    assert all(m <= p <= m + m / 16 for m, p in zip(range(1, 4097), sizes))
    assert sizes[:32] == list(range(1, 33))
    assert len(set(sizes)) == 32 + 16 * 7                  # 16 per power of two from 32 to 4096
    assert all(padded_rows(p) == p for p in sizes)


@pytest.mark.core
@pytest.mark.parametrize("rows", [1, 37, 1111])
def test_padded_products_equal_plain_ones(rows):
    # Values and gradients of mm and linear on padded bf16 rows equal the plain bf16 product's
    # (to one bf16 unit, where oneDNN's blocking of another shape rounds otherwise): the padding
    # never leaks into a result or a gradient.
    torch.manual_seed(0)
    grads = {}
    for name, f in (("padded", mm), ("plain", torch.mm)):
        a = torch.randn(rows, 96, generator=torch.Generator().manual_seed(1)).bfloat16().requires_grad_()
        b = torch.randn(96, 200, generator=torch.Generator().manual_seed(2)).bfloat16().requires_grad_()
        y = f(a, b)
        assert y.shape == (rows, 200) and y.dtype == torch.bfloat16
        (y.float() * torch.linspace(-1, 1, 200)).sum().backward()
        grads[name] = (y.detach().double(), a.grad.double(), b.grad.double())
    want = a.detach().double() @ b.detach().double()
    torch.testing.assert_close(grads["padded"][0], want, rtol=2 ** -7, atol=1e-2)
    for got, plain in zip(grads["padded"], grads["plain"]):
        torch.testing.assert_close(got, plain, rtol=2 ** -7, atol=2 ** -7 * float(plain.abs().max()))
    x32, w32 = a.detach().float(), b.detach().float()
    assert torch.equal(mm(x32, w32), torch.mm(x32, w32))          # fp32: untouched
    layer = torch.nn.Linear(96, 200)
    x = torch.randn(3, rows, 96)
    with torch.no_grad():
        got = linear(layer, x, "bf16")
    assert got.shape == (3, rows, 200) and got.dtype == torch.float32
    torch.testing.assert_close(got, layer(x), rtol=0.02, atol=0.05)


@pytest.mark.core
@pytest.mark.skipif(not BF16_UNITS, reason="oneDNN compiles bf16 kernels only where the CPU has bf16 units")
def test_bf16_products_of_changing_row_counts_reuse_their_kernels(tmp_path):
    # Row counts 1,025..1,088 (a batch's distinct tokens, say) make one padded shape: one
    # compiled forward kernel, where each count used to compile its own.
    script = tmp_path / "rows.py"
    script.write_text(
        "import torch\n"
        "from torchelmo.numerics.operands import linear\n"
        "layer = torch.nn.Linear(64, 256)\n"
        "with torch.no_grad():\n"
        "    for m in range(1025, 1089):\n"
        "        linear(layer, torch.randn(m, 64), 'bf16')\n")
    env = {**os.environ, "ONEDNN_VERBOSE": "profile_create"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True).stdout
    compiled = [line for line in out.splitlines() if "create:cache_miss" in line and ",matmul," in line]
    assert compiled and len(compiled) <= 2, compiled


@pytest.mark.core
def test_linear_adds_its_bias_once_on_every_path():
    # fp32, under autocast (what bf16 does where the operands are not bf16 tensors: the bias comes
    # with F.linear's own product) and on bf16 operands (the bias added after, in fp32).
    torch.manual_seed(0)
    layer, x = torch.nn.Linear(32, 24), torch.randn(5, 32)
    layer.bias.data += 10.0   # a bias added twice, or not at all, is far outside bf16's rounding
    want = x @ layer.weight.t() + layer.bias
    torch.testing.assert_close(linear(layer, x), want)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear(layer, x)
    assert (got.float() - want).abs().max() < 0.1
    with torch.no_grad():
        got = linear(layer, x, "bf16")
    assert got.dtype == torch.float32 and (got - want).abs().max() < 0.1


@pytest.mark.core
def test_models_of_two_precisions_in_two_threads_keep_their_own_numbers():
    # The precision is an argument, not a switch: an fp32 model and a bf16 model running at the
    # same time in two threads each give what they give alone, bit for bit (a process-wide math
    # mode set by the bf16 thread would round the fp32 thread's products).
    import threading
    torch.manual_seed(0)
    fp32 = BiLM(preset("tiny")).eval()
    bf16 = BiLM(preset("tiny"), precision="bf16").eval()
    bf16.load_state_dict(fp32.state_dict())
    ids = batch_to_ids([["The", "cat", "sat", "on", "the", "mat", "."], ["Dogs", "bark"]] * 4)
    with torch.no_grad():
        alone = {m: m(ids).layers for m in (fp32, bf16)}
    assert not torch.equal(alone[fp32][2], alone[bf16][2])
    mismatches = []

    def run(model):
        with torch.no_grad():
            for _ in range(10):
                got = model(ids).layers
                mismatches.extend(k for k, (g, w) in enumerate(zip(got, alone[model])) if not torch.equal(g, w))
    threads = [threading.Thread(target=run, args=(m,)) for m in (fp32, bf16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []