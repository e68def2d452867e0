"""The char-CNN token encoder's fast path against its plain reference."""

import pytest
import torch

from torchelmo import BiLM, ElmoConfig, batch_to_ids
from torchelmo.encoder import Highway, plan_tokens

CFG = dict(lstm_dim=8, projection_dim=4, char_embed_dim=3, n_highway=1,
           filters=[[1, 3], [2, 3], [3, 4], [5, 4], [7, 5]])


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bilm_takes_host_ids_for_a_gpu_model():
    model = BiLM.from_pretrained("default").cuda()
    ids = batch_to_ids([["Host", "ids", "."], ["GPU", "model"]])
    with torch.no_grad():
        a, b = model(ids).layers, model(ids.cuda()).layers
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


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
