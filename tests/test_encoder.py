"""The char-CNN token encoder's fast path against its plain reference."""

import functools
import warnings

import pytest
import torch

from torchelmo import BiLM, ElmoConfig, batch_to_ids
from torchelmo.model import encoder as E_
from torchelmo.model.encoder import Highway, plan_tokens
from torchelmo.numerics import compiled

CFG = dict(lstm_dim=8, projection_dim=4, char_embed_dim=3, n_highway=1,
           filters=[[1, 3], [2, 3], [3, 4], [5, 4], [7, 5]])


@pytest.mark.core
def test_char_cnn_fast_path_equals_reference():
    """The grouped, all-widths-in-one-matmul char-CNN computes the same windows as the plain one,
    for tokens of every length (0 .. 50 characters, windows reaching the end) and arbitrary ids."""
    torch.manual_seed(1)
    cfg = ElmoConfig(lstm_dim=8, projection_dim=4, char_embed_dim=3, n_highway=1,
                     filters=[[1, 3], [2, 3], [3, 4], [5, 4], [7, 5]])
    enc = BiLM(cfg).encoder
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.7)
    ids = batch_to_ids([["a", "ab", "hello", "北京", "😀", "<S>", "</S>"]
                        + ["w" * n for n in range(40, 52)]]).view(-1, 50)
    ids = torch.cat([ids, torch.randint(1, 262, (6, 50)), torch.full((1, 50), 261),
                     torch.zeros(1, 50, dtype=torch.long)])
    with torch.no_grad():
        ref = enc.conv_reference(ids)
        fast = enc._act(enc._conv_max(ids))
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=0)
        assert ref.abs().max() > 1


def _all_lengths_encoder(dtype=torch.float64):
    torch.manual_seed(1)
    enc = BiLM(ElmoConfig(**CFG)).encoder.to(dtype)
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.7)
    # every length 0 .. 50 (windows reaching the end), repeated characters (tied windows), the
    # padding character itself, arbitrary ids, and an all-zero row
    ids = batch_to_ids([["a", "ab", "hello", "aaaa", "北京", "😀", "<S>", "</S>"]
                        + ["w" * n for n in range(40, 52)] + ["x" * n for n in range(1, 40)]]).view(-1, 50)
    ids = torch.cat([ids, torch.randint(1, 262, (6, 50)), torch.full((1, 50), 261),
                     torch.zeros(1, 50, dtype=torch.long)])
    return enc, ids


def _grads(enc, loss):
    enc.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in enc.named_parameters() if p.grad is not None}


@pytest.mark.core
def test_char_cnn_training_gradients_equal_the_reference():
    """In training the char-CNN's max-pool has a written-out backward: its gradients, for every
    parameter, equal autograd's through the plain char-CNN (float64), with the tokens in any order
    and with a host plan's length groups."""
    enc, ids = _all_lengths_encoder()
    w = torch.randn(len(ids), enc.config.n_filters, dtype=torch.float64)
    ref = _grads(enc, (enc.conv_reference(ids) * w).sum())
    fast = _grads(enc, (enc._act(enc._conv_max(ids)) * w).sum())
    plan = plan_tokens(ids)
    planned = _grads(enc, (enc._act(enc._conv_max(plan.unique, plan.groups))[plan.inverse] * w).sum())
    assert set(fast) == set(ref) == set(planned)
    for name in ref:
        torch.testing.assert_close(fast[name], ref[name], atol=1e-10, rtol=0, msg=name)
        torch.testing.assert_close(planned[name], ref[name], atol=1e-10, rtol=0, msg=name)


@pytest.mark.core
def test_char_cnn_training_on_bf16_operands():
    """The written-out backward on bfloat16 operands (as ``--precision bf16`` trains on a CPU): values and gradients within bf16's rounding of the float64 reference."""
    enc, ids = _all_lengths_encoder(torch.float32)
    enc64 = BiLM(ElmoConfig(**CFG)).encoder.double()
    enc64.load_state_dict(enc.state_dict())
    plan = plan_tokens(ids)
    w = torch.randn(len(plan.unique), enc.config.n_filters)
    ref_out = enc64.conv_reference(plan.unique)
    ref = _grads(enc64, (ref_out * w.double()).sum())
    E = enc.config.char_embed_dim
    pad_emb = enc.char_embed.weight[enc.pad_id].view(1, E)
    emb = torch.cat([enc.char_embed(plan.unique), pad_emb.expand(len(plan.unique), 6, E)], dim=1)
    layout = E_._Layout(50, [1, 2, 3, 5, 7], torch.tensor([w_ for w_, n in CFG["filters"] for _ in range(n)]))
    bias = torch.cat([conv.bias for conv in enc.convs])
    out = E_._WindowMax.apply(emb, enc._stacked_filters(), bias, pad_emb.repeat(1, 7), plan.groups, layout,
                              torch.bfloat16)
    assert out.dtype == torch.float32
    got = _grads(enc, (enc._act(out) * w).sum())
    torch.testing.assert_close(enc._act(out).detach().double(), ref_out.detach(), atol=0.03 * ref_out.abs().max().item(), rtol=0)
    for name in ref:
        assert got[name].dtype == torch.float32
        torch.testing.assert_close(got[name].double(), ref[name], atol=0.02 * ref[name].abs().max().item(), rtol=0,
                                   msg=name)


@pytest.mark.core
@pytest.mark.skipif(not compiled.compiler_found(), reason="no C++ compiler for torch.compile")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_max_and_position_equal_torch_max(dtype):
    # the first position of a tied maximum, as torch.max gives it; one token or one position eager
    torch.manual_seed(0)
    for count, n in [(7, 5), (3, 11), (1, 4), (6, 1)]:
        y = torch.randn(count, n, 16).to(dtype)
        if n > 3:
            y[:, 3] = y[:, 1]
        top, at = E_._max_at(y)
        want = y.max(dim=1)
        assert torch.equal(top, want.values) and torch.equal(at, want.indices)
    assert not compiled._failed


def test_host_token_plan_gives_the_same_embeddings():
    torch.manual_seed(0)
    model = BiLM(ElmoConfig(**CFG)).eval()
    sentences = [["The", "cat", "sat", "."], ["the", "cat", "The"], [], ["a" * 70, "x"]]
    ids = batch_to_ids(sentences)
    plan = plan_tokens(ids)
    # Distinct rows, in ascending order of length, with runs that add up, and an exact inverse.
    assert len({tuple(r) for r in plan.unique.tolist()}) == len(plan.unique)
    assert sum(c for _, c in plan.groups) == len(plan.unique)
    lengths = [L for L, c in plan.groups for _ in range(c)]
    assert lengths == sorted(lengths) and plan.groups[-1][0] == 50   # the all-zero padding row
    assert torch.equal(plan.unique[plan.inverse], ids)
    with torch.no_grad():
        torch.testing.assert_close(model.encoder(ids, plan), model.encoder(ids), rtol=0, atol=1e-6)


@pytest.mark.core
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bilm_takes_host_ids_for_a_gpu_model():
    model = BiLM.from_pretrained("default").cuda()
    ids = batch_to_ids([["Host", "ids", "."], ["GPU", "model"]])
    with torch.no_grad():
        a, b = model(ids).layers, model(ids.cuda()).layers
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


@pytest.mark.core
def test_highway_mix_is_the_published_highway():
    # the one definition against the published form, in float64, and the exported graph's
    # (TorchScript) and in-place forms equal to it
    g = torch.Generator().manual_seed(0)
    t, c, x = (3 * torch.randn(6, 16, generator=g, dtype=torch.float64) for _ in range(3))
    gate = torch.sigmoid(c)
    torch.testing.assert_close(E_.highway_mix(t, c, x), gate * torch.relu(t) + (1 - gate) * x, rtol=0, atol=1e-14)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)    # torch.jit.script's; the export uses it
        scripted = torch.jit.script(E_.highway_mix)
    t, c, x = t.float(), c.float(), x.float()
    want = E_.highway_mix(t, c, x)
    assert torch.equal(scripted(t, c, x), want) and torch.equal(E_.highway_mix_(t.clone(), c.clone(), x), want)


@pytest.mark.core
def test_highway_in_place_without_autograd_equals_autograd():
    # Without autograd the highway works in its product's memory; its numbers and its output
    # type are those of the autograd path, also where autocast makes the product bf16.
    torch.manual_seed(0)
    hw, x = Highway(16), torch.randn(5, 16)
    x0 = x.clone()
    with torch.no_grad():
        fast = hw(x)
    assert torch.equal(fast, hw(x).detach()) and torch.equal(x, x0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            fast = hw(x)
        slow = hw(x).detach()
    assert fast.dtype == slow.dtype == torch.float32 and torch.equal(fast, slow)


@pytest.mark.core
@pytest.mark.skipif(not compiled.compiler_found(), reason="no C++ compiler for torch.compile")
def test_compiled_max_pool_at_bf16_inference_equals_the_eager_one(monkeypatch):
    # At inference on bf16 operands each length group's max-pool (max over positions, bias, the
    # all-padding window) is one compiled loop: the same numbers as the eager ops, for every length.
    enc, ids = _all_lengths_encoder(torch.float32)
    plan = plan_tokens(ids)
    E = enc.config.char_embed_dim
    pad_emb = enc.char_embed.weight[enc.pad_id].view(1, E)
    with torch.no_grad():
        emb = torch.cat([enc.char_embed(plan.unique), pad_emb.expand(len(plan.unique), 6, E)], dim=1)
        layout = E_._Layout(50, [1, 2, 3, 5, 7], torch.tensor([w for w, n in CFG["filters"] for _ in range(n)]))
        bias = torch.cat([conv.bias for conv in enc.convs])
        args = (emb.bfloat16(), enc._stacked_filters().bfloat16(), bias, pad_emb.repeat(1, 7).bfloat16(),
                plan.groups, layout)
        fused = E_._window_max(*args)[0]
        assert not compiled._failed
        monkeypatch.setattr(E_, "usable", lambda: False)
        eager = E_._window_max(*args)[0]
    assert fused.dtype == torch.float32 and torch.equal(fused, eager)


@pytest.mark.core
@pytest.mark.skipif(not compiled.compiler_found(), reason="no C++ compiler for torch.compile")
def test_compiled_highway_equals_the_eager_one():
    # The highway's compiled loop from the bf16 product (bias, relu, sigmoid, mix) against the same
    # arithmetic eager, and against the module's fp32 output to bf16 accuracy; one row runs eager.
    torch.manual_seed(0)
    hw = Highway(64)
    for rows in (37, 1):
        x = torch.randn(rows, 64)
        p = torch.randn(rows, 128).bfloat16()
        eager = functools.partial(E_._highway_fused, p, hw.proj.bias, x)
        got = compiled.run(E_._highway_fused, (p, hw.proj.bias, x), eager, [(p, 0), (x, 0)], "test")
        torch.testing.assert_close(got, eager(), rtol=0, atol=1e-6)
        with torch.no_grad():
            p = (x.bfloat16() @ hw.proj.weight.bfloat16().t())
            got = compiled.run(E_._highway_fused, (p, hw.proj.bias, x),
                               functools.partial(E_._highway_fused, p, hw.proj.bias, x), [(p, 0), (x, 0)], "test")
            torch.testing.assert_close(got, hw(x), rtol=0, atol=0.02)
    assert not compiled._failed
