"""The char-CNN token encoder's fast path against its plain reference."""

import torch

from torchelmo import BiLM, ElmoConfig, batch_to_ids


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
