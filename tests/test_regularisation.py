"""Weight drop and variational dropout: what each masks, that evaluation is untouched, and that a
run keeps them through save, resume and checkpoint loading."""

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import base_config
from torchelmo import BiLM, ElmoConfig
from torchelmo.errors import ElmoError
from torchelmo.lm.model import LanguageModel
from torchelmo.model.bilm import Regularisation, sequence_dropout
from torchelmo.train import CHECKPOINT_NAME, TrainConfig, lm_from_checkpoint, load_checkpoint, train


def _bilm(seed=0, regularisation=None):
    torch.manual_seed(seed)
    cfg = ElmoConfig(lstm_dim=12, projection_dim=5, char_embed_dim=3, n_highway=1,
                     filters=[[1, 4], [2, 4]], cell_clip=None, proj_clip=None)
    return BiLM(cfg, regularisation=regularisation)


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 7, 5, generator=g)
    return x, torch.tensor([7, 4, 6])


@pytest.mark.core
def test_weight_drop_is_one_mask_per_window_on_the_recurrent_matrix():
    model = _bilm(regularisation=Regularisation(weight_drop=0.5))
    model.train()
    x, lengths = _inputs()
    torch.manual_seed(123)
    outs, _ = model.run_stacks(x, lengths)
    # The same draws, made by hand: one (2, P, 4D) mask per layer, in layer order.
    torch.manual_seed(123)
    masks = [F.dropout(torch.ones_like(layer.w_h), 0.5, True) for layer in model.layers]
    assert all(0.3 < (m == 0).float().mean() < 0.7 for m in masks)
    ref = copy.deepcopy(model).eval()
    with torch.no_grad():
        for layer, m in zip(ref.layers, masks):
            layer.w_h.mul_(m)
        ref_outs, _ = ref.run_stacks(x, lengths)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # It really changes the output, and gradients reach only the kept entries.
    model.eval()
    with torch.no_grad():
        plain, _ = model.run_stacks(x, lengths)
    assert not torch.allclose(plain[-1], outs[-1])
    outs[-1].sum().backward()
    for layer, m in zip(model.layers, masks):
        assert (layer.w_h.grad[m == 0] == 0).all()
        assert (layer.w_h.grad[m != 0] != 0).float().mean() > 0.9


@pytest.mark.core
def test_evaluation_ignores_dropout_and_weight_drop():
    model = _bilm()
    x, lengths = _inputs()
    model.eval()
    with torch.no_grad():
        plain, _ = model.run_stacks(x, lengths)
        model.regularisation = Regularisation(dropout=0.5, variational_dropout=True, weight_drop=0.5)
        again, _ = model.run_stacks(x, lengths)
    for a, b in zip(plain, again):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.core
def test_variational_mask_is_shared_over_time():
    torch.manual_seed(0)
    x = torch.ones(2, 3, 40, 64)
    y = sequence_dropout(x, 0.4, True)
    assert torch.equal(y, y[:, :, :1].expand_as(y))                  # constant along T
    vals = y.unique()
    assert len(vals) == 2 and vals[0] == 0 and abs(vals[1].item() - 1 / 0.6) < 1e-6
    assert 0.3 < (y[:, :, 0] == 0).float().mean() < 0.5
    z = sequence_dropout(x, 0.4, False)                               # the default: a mask per step
    assert not torch.equal(z, z[:, :, :1].expand_as(z))
    assert abs(z.mean().item() - 1.0) < 0.05


def test_run_keeps_regularisation_through_save_resume_and_checkpoint(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    cfg = base_config(tmp_path, data, vocab, weight_drop=0.3, variational_dropout=True, dropout=0.2,
                      max_steps=3, checkpoint_every=3)
    train(cfg, log=lambda s: None)
    run = tmp_path / "run"
    lm = LanguageModel.from_pretrained(run / "model")
    assert (lm.dropout, lm.variational_dropout, lm.weight_drop) == (0.2, True, 0.3)
    assert (lm.bilm.dropout, lm.bilm.variational_dropout, lm.bilm.weight_drop) == (0.2, True, 0.3)
    meta = json.loads((run / "model" / "training.json").read_text())
    assert meta["weight_drop"] == 0.3 and meta["variational_dropout"] is True
    ckpt = load_checkpoint(run / CHECKPOINT_NAME)
    from_ckpt = lm_from_checkpoint(ckpt, run / CHECKPOINT_NAME)
    assert from_ckpt.weight_drop == 0.3 and from_ckpt.variational_dropout
    for (k, a), b in zip(lm.state_dict().items(), from_ckpt.state_dict().values()):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=k)
    # Resuming keeps them (they are not resume-overridable) and continues.
    s = train(base_config(tmp_path, data, vocab, max_steps=5, resume=True), log=lambda s: None)
    assert s["steps"] == 5
    assert LanguageModel.from_pretrained(run / "model").weight_drop == 0.3


def test_weight_drop_must_be_a_probability(tmp_path, fixture_corpus):
    data, vocab = fixture_corpus
    with pytest.raises(ElmoError, match="weight_drop must be in"):
        base_config(tmp_path, data, vocab, weight_drop=1.0)
    with pytest.raises(ElmoError, match="weight_drop must be in"):
        TrainConfig(train=[str(data)], out_dir=str(tmp_path), max_steps=1, weight_drop=-0.1)
