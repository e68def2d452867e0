"""AllenNLP's ``LstmCellWithProjection`` and ``ElmoLstm`` from the drop-in: AllenNLP's own tests
(shapes, masking, clipping, state sizes), and the same numbers as torchelmo's stacks from the
same weights, carried state included."""

import numpy as np
import pytest
import torch

from torchelmo import BiLM, ElmoConfig, ElmoError
from torchelmo.integrations.allennlp import ElmoLstm, LstmCellWithProjection
from torchelmo.model.layout import lstm_entries

pytestmark = pytest.mark.usefixtures("one_thread")


def _padded(lengths, size=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(len(lengths), max(lengths), size, generator=g)
    mask = torch.arange(max(lengths)).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return x * mask.unsqueeze(-1), mask


def test_cell_forward_pass_as_allennlps_test():
    x, _ = _padded([5, 4, 2, 1])
    lstm = LstmCellWithProjection(input_size=3, hidden_size=5, cell_size=7, memory_cell_clip_value=2,
                                  state_projection_clip_value=1)
    out, (h, c) = lstm(x, [5, 4, 2, 1])
    for row, n in enumerate([5, 4, 2, 1]):
        np.testing.assert_array_equal(out[row, n:].detach().numpy(), 0.0)
        torch.testing.assert_close(h[0, row], out[row, n - 1])      # the final state: its last step
    assert out.abs().max() <= 1 and c.abs().max() <= 2
    assert h.shape == (1, 4, 5) and c.shape == (1, 4, 7)
    # From a given state, backwards: the final state is the one after each row's first step.
    back = LstmCellWithProjection(3, 5, 7, go_forward=False)
    out, (h, _) = back(x, [5, 4, 2, 1], (torch.rand(1, 4, 5), torch.rand(1, 4, 7)))
    torch.testing.assert_close(h[0], out[:, 0])
    with pytest.raises(ElmoError, match="longest first"):
        back(x, [1, 2, 4, 5])


def test_elmo_lstm_as_allennlps_test():
    x, mask = _padded([5, 4, 2, 1])
    lstm = ElmoLstm(num_layers=2, input_size=3, hidden_size=5, cell_size=7, memory_cell_clip_value=2,
                    state_projection_clip_value=1)
    out = lstm(x, mask)
    assert out.shape == (2, 4, 5, 10)
    for row, n in enumerate([5, 4, 2, 1]):
        np.testing.assert_array_equal(out[:, row, n:].detach().numpy(), 0.0)
    assert list(lstm._states[0].size()) == [2, 4, 10]
    assert list(lstm._states[1].size()) == [2, 4, 14]
    assert sorted(lstm.state_dict()) == sorted(
        f"{d}_layer_{i}.{p}" for d in ("forward", "backward") for i in range(2)
        for p in ("input_linearity.weight", "state_linearity.weight", "state_linearity.bias",
                  "state_projection.weight"))


def _pair():
    """A torchelmo biLM (stateful) and an ElmoLstm holding its LSTM weights in AllenNLP's layout."""
    torch.manual_seed(0)
    cfg = ElmoConfig(lstm_dim=12, projection_dim=5, char_embed_dim=3, n_highway=1, filters=[[1, 4], [2, 4]],
                     cell_clip=3.0, proj_clip=0.5, use_skip_connections=True)
    bilm = BiLM(cfg, stateful=True)
    with torch.no_grad():
        for layer in bilm.layers:
            layer.bias.normal_(0, 0.5)
    lstm = ElmoLstm(input_size=5, hidden_size=5, cell_size=12, num_layers=2, memory_cell_clip_value=3.0,
                    state_projection_clip_value=0.5)
    state = {e.key.removeprefix("_elmo_lstm."): e.get()
             for l, layer in enumerate(bilm.layers) for d in range(2) for e in lstm_entries(layer, l, d)}
    lstm.load_state_dict(state)
    return bilm, lstm


def test_elmo_lstm_gives_torchelmos_numbers_and_carries_its_state():
    bilm, lstm = _pair()
    # Two batches, the second larger and in another length order: the carried rows line up.
    for lengths, seed in (([4, 6, 2], 1), ([3, 7, 5, 1], 2)):
        e, mask = _padded(lengths, size=5, seed=seed)
        with torch.no_grad():
            want = bilm.contextualise(e, torch.tensor(lengths))[1:]       # [fwd_k; bwd_k] per layer
            got = lstm(e, mask)
        for k, layer in enumerate(want):
            torch.testing.assert_close(got[k], layer * mask.unsqueeze(-1), atol=2e-6, rtol=0)
    h, c = lstm._states
    for k, (cs, hs) in enumerate(bilm._state):                           # (2, B, D), (2, B, P)
        torch.testing.assert_close(h[k], torch.cat([hs[0], hs[1]], -1), atol=2e-6, rtol=0)
        torch.testing.assert_close(c[k], torch.cat([cs[0], cs[1]], -1), atol=2e-6, rtol=0)
    lstm.reset_states()
    assert lstm._states is None


def test_cell_gradients_are_finite_differences():
    torch.manual_seed(0)
    lstm = LstmCellWithProjection(3, 4, 5, go_forward=False, memory_cell_clip_value=0.8,
                                  state_projection_clip_value=0.6).double()
    x, _ = _padded([4, 3, 1])
    x = x.double().requires_grad_()
    names = [n for n, _ in lstm.named_parameters()]
    params = [p.detach().clone().requires_grad_() for p in lstm.parameters()]

    def run(x, *ps):
        return torch.func.functional_call(lstm, dict(zip(names, ps)), (x, [4, 3, 1]))[0]
    assert torch.autograd.gradcheck(run, (x, *params))


def test_names_under_allennlps_paths():
    import sys

    from torchelmo.integrations.allennlp import register_as_allennlp
    before = {n for n in sys.modules if n == "allennlp" or n.startswith("allennlp.")}
    assert register_as_allennlp()
    try:
        from allennlp.modules.elmo_lstm import ElmoLstm as TheirElmoLstm
        from allennlp.modules.lstm_cell_with_projection import LstmCellWithProjection as TheirCell
        assert TheirElmoLstm is ElmoLstm and TheirCell is LstmCellWithProjection
    finally:
        for name in [n for n in sys.modules if (n == "allennlp" or n.startswith("allennlp.")) and n not in before]:
            del sys.modules[name]


def test_allennlps_empty_inputs():
    # AllenNLP's tests: an empty sentence embeds to (3, 0, dim); the indexer's empty token list.
    from torchelmo.integrations.allennlp import ElmoEmbedder, ELMoTokenCharactersIndexer
    e = ElmoEmbedder(model="default")
    dim = e.bilm.output_dim
    assert e.embed_sentence([]).shape == (3, 0, dim)
    got = e.embed_batch([[], ["a", "b"], []])
    assert [a.shape for a in got] == [(3, 0, dim), (3, 2, dim), (3, 0, dim)]
    indexer = ELMoTokenCharactersIndexer()
    assert indexer.get_empty_token_list() == {"elmo_tokens": []}
    empty = indexer.tokens_to_indices([], None)
    assert empty == {"elmo_tokens": []}
    padded = indexer.as_padded_tensor_dict(empty, indexer.get_padding_lengths(empty))
    assert padded["elmo_tokens"].shape == (0, 50)
    padded = indexer.as_padded_tensor_dict(empty, {"elmo_tokens": 2})
    assert padded["elmo_tokens"].shape == (2, 50) and not padded["elmo_tokens"].any()
