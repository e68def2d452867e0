import pytest
import torch

from torchelmo import BiLM, Elmo, ElmoError, ScalarMix, batch_to_ids


@pytest.mark.core
def test_scalar_mix_formula():
    torch.manual_seed(0)
    layers = [torch.randn(2, 4, 6) for _ in range(3)]
    mix = ScalarMix(3)
    assert mix.weights() == pytest.approx([1 / 3] * 3) and mix.gamma_value() == 1.0
    with torch.no_grad():
        mix.scalar_parameters.copy_(torch.tensor([0.5, -1.0, 2.0]))
        mix.gamma.fill_(1.7)
    w = torch.softmax(torch.tensor([0.5, -1.0, 2.0]), 0)
    expect = 1.7 * (w[0] * layers[0] + w[1] * layers[1] + w[2] * layers[2])
    torch.testing.assert_close(mix(layers), expect)
    assert mix.weights() == pytest.approx(w.tolist())
    assert mix.gamma_value() == pytest.approx(1.7)
    assert float(mix.l2_penalty(0.001).detach()) == pytest.approx(0.001 * (0.25 + 1 + 4))


@pytest.mark.core
def test_scalar_mix_layer_norm_masked():
    torch.manual_seed(1)
    layers = [torch.randn(2, 5, 4) * (k + 1) + k for k in range(3)]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    mix = ScalarMix(3, do_layer_norm=True)
    out = mix(layers, mask)
    # Re-derivation: statistics over the 8 real tokens' features only.
    normed = []
    for t in layers:
        vals = t[mask]
        normed.append((t - vals.mean()) / torch.sqrt(vals.var(unbiased=False) + 1e-12))
    torch.testing.assert_close(out, sum(n / 3 for n in normed), atol=1e-5, rtol=1e-5)
    # Padding values must not influence the real positions.
    layers2 = [t.clone() for t in layers]
    for t in layers2:
        t[0, 3:] = 1e3
    torch.testing.assert_close(mix(layers2, mask)[mask], out[mask])
    with pytest.raises(ElmoError, match="mask"):
        mix(layers)


@pytest.mark.core
def test_scalar_mix_bad_layer_count():
    with pytest.raises(ElmoError):
        ScalarMix(3)([torch.zeros(1, 1, 1)] * 2)
    with pytest.raises(ElmoError):
        ScalarMix(3, initial_scalar_parameters=[0.0])


def test_gradients_reach_s_gamma_and_unfrozen_bilm(fixture_model):
    ids = batch_to_ids([["a", "b"], ["c"]])
    frozen = Elmo(fixture_model, num_output_representations=2, dropout=0.0)
    out = frozen(ids)
    (out["elmo_representations"][0].sum() + 2 * out["elmo_representations"][1].sum()).backward()
    for mix in frozen.scalar_mixes:
        assert mix.scalar_parameters.grad is not None and mix.scalar_parameters.grad.abs().sum() > 0
        assert mix.gamma.grad is not None and mix.gamma.grad.abs().sum() > 0
    assert all(p.grad is None for p in fixture_model.parameters())

    bilm = BiLM(fixture_model.config)
    bilm.load_state_dict(fixture_model.state_dict())
    unfrozen = Elmo(bilm, dropout=0.0, requires_grad=True)
    unfrozen(ids)["elmo_representations"][0].pow(2).sum().backward()
    grads = {n: p.grad for n, p in bilm.named_parameters()}
    assert all(g is not None for g in grads.values())
    for name in ("encoder.char_embed.weight", "encoder.convs.0.weight", "layers.0.w_x", "layers.1.w_p"):
        assert grads[name].abs().sum() > 0, name


def test_token_cache_not_used_when_bilm_trains(fixture_model):
    bilm = BiLM(fixture_model.config)
    bilm.load_state_dict(fixture_model.state_dict())
    bilm.cache_token_embeddings(["a", "b"])
    bilm.requires_grad_(True)
    bilm(batch_to_ids([["a", "b"]])).layers[0].sum().backward()
    assert bilm.encoder.proj.weight.grad.abs().sum() > 0


def test_elmo_shares_one_bilm_run(fixture_model):
    calls = []
    handle = fixture_model.register_forward_hook(lambda *a: calls.append(1))
    try:
        elmo = Elmo(fixture_model, num_output_representations=3)
        out = elmo([["x", "y", "z"]])
    finally:
        handle.remove()
    assert len(calls) == 1
    assert len(out["elmo_representations"]) == 3
    assert out["elmo_representations"][0].shape == (1, 3, 32) and elmo.get_output_dim() == 32


def test_elmo_dropout_train_only(fixture_model):
    elmo = Elmo(fixture_model, dropout=0.5).eval()
    ids = batch_to_ids([["x", "y", "z"]])
    with torch.no_grad():
        a = elmo(ids)["elmo_representations"][0]
        b = elmo(ids)["elmo_representations"][0]
        assert torch.equal(a, b)
        elmo.train()
        torch.manual_seed(0)
        c = elmo(ids)["elmo_representations"][0]
    assert (c == 0).float().mean() > 0.2
    nz = c != 0
    torch.testing.assert_close(c[nz], 2 * a[nz])


def test_elmo_fixed_mix_parameters(fixture_model):
    elmo = Elmo(fixture_model, dropout=0.0, scalar_mix_parameters=[-9e9, -9e9, 0.0])
    out = elmo([["x", "y"]])
    top = fixture_model.embed_sentences([["x", "y"]]).layers[2]
    torch.testing.assert_close(out["elmo_representations"][0], top)
    assert not elmo.scalar_mixes[0].scalar_parameters.requires_grad


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
def test_elmo_to_device(fixture_model, device):
    bilm = BiLM(fixture_model.config)
    bilm.load_state_dict(fixture_model.state_dict())
    elmo = Elmo(bilm, dropout=0.0).to(device).eval()
    ids = batch_to_ids([["to", "device"], ["x"]])
    with torch.no_grad():
        out = elmo(ids.to(device))["elmo_representations"][0].cpu()
        ref = Elmo(fixture_model, dropout=0.0)(ids)["elmo_representations"][0]
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert elmo([["list", "input"]])["elmo_representations"][0].device.type == device
