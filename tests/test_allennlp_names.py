"""torchelmo.integrations.allennlp's other AllenNLP names (_ElmoBiLm, _ElmoCharacterEncoder, ScalarMix,
ElmoTokenEmbedder, the ELMo character indexer) and checkpoints in AllenNLP's layout.

There is no AllenNLP here: AllenNLP-keyed state dicts are built from the published HDF5 file by
AllenNLP's documented loading rules (``_ElmoCharacterEncoder._load_*``, ``ElmoLstm.load_weights``)
and checked two ways: through torchelmo they reproduce AllenNLP's reference outputs, and AllenNLP's
own equations (Highway, LstmCellWithProjection), run on them here, give torchelmo's activations.
"""

import copy
import inspect
import json
import pickle
import types

import h5py
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchelmo.integrations.allennlp as A
from torchelmo import BiLM, ElmoError, batch_to_ids, preset, word_to_char_ids
from torchelmo import Elmo as NativeElmo
from torchelmo.integrations.allennlp import (
    Elmo,
    ELMoCharacterMapper,
    ELMoTokenCharactersIndexer,
    ElmoTokenEmbedder,
    ScalarMix,
    _ElmoBiLm,
    _ElmoCharacterEncoder,
)
from torchelmo.model.chars import BOS_IDS, EOS_IDS

pytestmark = pytest.mark.usefixtures("one_thread")

TOP_ONLY = [-9e9, -9e9, 0.0]     # softmax -> exactly [0, 0, 1]
SENTS = [["The", "cat", "sat", "."], ["A", "dog"], ["Birds", "fly", "south", "in", "winter", "."]]


@pytest.fixture(scope="module")
def files(allennlp_dir):
    return str(allennlp_dir / "options.json"), str(allennlp_dir / "lm_weights.hdf5")


@pytest.fixture(scope="module")
def options(allennlp_dir):
    return json.loads((allennlp_dir / "options.json").read_text())


@pytest.fixture(scope="module")
def batches(allennlp_dir):
    s = json.loads((allennlp_dir / "sentences.json").read_text())
    return [[s[k][i].split() for k in range(3)] for i in range(10)]


def _reference(allennlp_dir, k, i):
    with h5py.File(allennlp_dir / f"lm_embeddings_{k}.hdf5", "r") as f:
        return np.concatenate(f[str(i)][...], -1)       # (2, n, P) -> (n, 2P)


def _allennlp_keyed(weight_file, options) -> dict[str, torch.Tensor]:
    """The ``_elmo_lstm.*`` state dict AllenNLP's ``_ElmoBiLm`` has after loading ``weight_file``,
    by AllenNLP's loading rules, written out here independently of torchelmo."""
    D, P = options["lstm"]["dim"], options["lstm"]["projection_dim"]
    perm = np.r_[0:D, 2 * D:3 * D, D:2 * D, 3 * D:4 * D]      # TF's i, j, f, o -> i, f, j, o
    te, sd = "_elmo_lstm._token_embedder.", {}
    with h5py.File(weight_file, "r") as f:
        emb = f["char_embed"][...]
        sd[te + "_char_embedding_weights"] = np.concatenate([np.zeros((1, emb.shape[1]), np.float32), emb])
        for i in range(len(options["char_cnn"]["filters"])):
            sd[f"{te}char_conv_{i}.weight"] = np.transpose(f["CNN"][f"W_cnn_{i}"][...][0], (2, 1, 0))
            sd[f"{te}char_conv_{i}.bias"] = f["CNN"][f"b_cnn_{i}"][...]
        for k in range(options["char_cnn"]["n_highway"]):
            hw = f[f"CNN_high_{k}"]
            # AllenNLP: gate * x + (1 - gate) * f(x); TF: (1 - carry) * x + carry * f(x): gate = -carry.
            sd[f"{te}_highways._layers.{k}.weight"] = np.concatenate([hw["W_transform"][...].T, -hw["W_carry"][...].T])
            sd[f"{te}_highways._layers.{k}.bias"] = np.concatenate([hw["b_transform"][...], -hw["b_carry"][...]])
        sd[te + "_projection.weight"] = f["CNN_proj"]["W_proj"][...].T
        sd[te + "_projection.bias"] = f["CNN_proj"]["b_proj"][...]
        for layer in range(options["lstm"]["n_layers"]):
            for d, direction in enumerate(("forward", "backward")):
                cell = f[f"RNN_{d}"]["RNN"]["MultiRNNCell"][f"Cell{layer}"]["LSTMCell"]
                w = cell["W_0"][...].T[perm]                       # (4D, P + P)
                bias = cell["B"][...].copy()
                bias[2 * D:3 * D] += 1.0                            # TF's forget bias, folded in
                base = f"_elmo_lstm._elmo_lstm.{direction}_layer_{layer}."
                sd[base + "input_linearity.weight"] = w[:, :P]
                sd[base + "state_linearity.weight"] = w[:, P:]
                sd[base + "state_linearity.bias"] = bias[perm]
                sd[base + "state_projection.weight"] = cell["W_P_0"][...].T
    return {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}


def _mix_keys(params, gamma=1.0, k=0):
    out = {f"scalar_mix_{k}.gamma": torch.tensor([gamma])}
    out.update({f"scalar_mix_{k}.scalar_parameters.{i}": torch.tensor([float(p)]) for i, p in enumerate(params)})
    return out


def _scramble(module, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)


def _positional(fn):
    """``[(name, default)]`` of a callable's parameters before any keyword-only one, self excluded."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY:
            break
        if p.name != "self":
            out.append((p.name, p.default))
    return out


E = inspect.Parameter.empty


@pytest.mark.core
def test_signatures_are_allennlps():
    assert _positional(_ElmoBiLm) == [("options_file", E), ("weight_file", E), ("requires_grad", False),
                                      ("vocab_to_cache", None)]
    assert _positional(_ElmoBiLm.forward) == [("inputs", E), ("word_inputs", None)]
    assert _positional(_ElmoCharacterEncoder) == [("options_file", E), ("weight_file", E), ("requires_grad", False)]
    assert _positional(_ElmoCharacterEncoder.forward) == [("inputs", E)]
    assert _positional(ScalarMix) == [("mixture_size", E), ("do_layer_norm", False),
                                      ("initial_scalar_parameters", None), ("trainable", True)]
    assert _positional(ScalarMix.forward) == [("tensors", E), ("mask", None)]
    assert [n for n, _ in _positional(ElmoTokenEmbedder)] == [
        "options_file", "weight_file", "do_layer_norm", "dropout", "requires_grad", "projection_dim",
        "vocab_to_cache", "scalar_mix_parameters"]
    assert [d for _, d in _positional(ElmoTokenEmbedder)][2:] == [False, 0.5, False, None, None, None]
    assert _positional(ElmoTokenEmbedder.forward) == [("elmo_tokens", E), ("word_inputs", None)]
    assert _positional(ELMoTokenCharactersIndexer) == [("namespace", "elmo_characters"), ("tokens_to_add", None),
                                                       ("token_min_padding_length", 0)]
    for name in ("_ElmoBiLm", "_ElmoCharacterEncoder", "ScalarMix", "ElmoTokenEmbedder", "ELMoCharacterMapper",
                 "ELMoTokenCharactersIndexer", "Elmo", "ElmoEmbedder", "batch_to_ids"):
        assert hasattr(A, name)


def test_character_encoder(files, allennlp_dir):
    enc = _ElmoCharacterEncoder(*files)
    assert enc.get_output_dim() == 16 and not any(p.requires_grad for p in enc.parameters())
    assert all(p.requires_grad for p in _ElmoCharacterEncoder(*files, requires_grad=True).parameters())
    with torch.no_grad():
        out = enc(batch_to_ids(SENTS))
    assert out["token_embedding"].shape == (3, 8, 16) and out["mask"].shape == (3, 8)
    assert out["mask"].sum(1).tolist() == [6, 4, 8]
    # The published context-free embeddings, <S> and </S> around them.
    vocab = (allennlp_dir / "vocab_test.txt").read_text(encoding="utf-8").split("\n")
    with h5py.File(allennlp_dir / "elmo_token_embeddings.hdf5", "r") as f:
        want = torch.from_numpy(f["embedding"][...])
    with torch.no_grad():
        got = enc(batch_to_ids([vocab]))["token_embedding"][0]
        ends = enc.encoder.encode_tokens(torch.tensor([BOS_IDS, EOS_IDS]))
    torch.testing.assert_close(got[1:-1], want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got[[0, -1]], ends)
    with pytest.raises(ElmoError, match=r"expected char ids of shape \(batch, tokens, 50\)"):
        enc(torch.zeros(2, 50, dtype=torch.long))


def test_bilm_activations_keep_the_boundaries(files, batches, allennlp_dir):
    bilm = _ElmoBiLm(*files, stateful=False)
    plain = BiLM.from_published(*files)
    assert bilm.num_layers == 3 and bilm.get_output_dim() == 32
    ids = batch_to_ids(SENTS)
    with torch.no_grad():
        out = bilm(ids)
        want = plain(ids, keep_sentence_boundaries=True)
        tokens = bilm._token_embedder(ids)
    assert [tuple(a.shape) for a in out["activations"]] == [(3, 8, 32)] * 3
    assert torch.equal(out["mask"], want.mask) and out["mask"].sum(1).tolist() == [6, 4, 8]
    for a, b in zip(out["activations"], want.layers):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    e = tokens["token_embedding"] * tokens["mask"].unsqueeze(-1)
    torch.testing.assert_close(out["activations"][0], torch.cat([e, e], -1))    # E0 = [e; e]
    # Stateful by default, as AllenNLP's: the reference's 10 batches, boundaries cut here.
    stateful = _ElmoBiLm(*files)
    with torch.no_grad():
        for i, batch in enumerate(batches):
            top = stateful(batch_to_ids(batch))["activations"][2]
            for k, toks in enumerate(batch):
                np.testing.assert_allclose(top[k, 1:len(toks) + 1].numpy(), _reference(allennlp_dir, k, i),
                                           atol=1e-6, rtol=1e-5)
    # Cached words.
    vocab = ["@@PADDING@@", "The", "cat", "sat", ".", "A", "dog"]
    cached = _ElmoBiLm(*files, vocab_to_cache=vocab, stateful=False)
    with torch.no_grad():
        by_id = cached(None, torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]]))
        by_chars = bilm(batch_to_ids(SENTS[:2]))
    for a, b in zip(by_id["activations"], by_chars["activations"]):
        torch.testing.assert_close(a, b)


def test_elmo_lstm_is_a_view_of_the_same_bilm_and_resets(files):
    elmo = Elmo(*files, 1, dropout=0.0)
    view = elmo._elmo_lstm
    assert isinstance(view, _ElmoBiLm) and view is elmo._elmo_lstm and view.bilm is elmo.bilm
    assert {id(p) for p in view.parameters()} <= {id(p) for p in elmo.parameters()}
    assert not any(k.startswith("_elmo_lstm") for k in elmo.state_dict())      # one model, saved once
    lstm = elmo._elmo_lstm._elmo_lstm
    assert lstm._states is None
    ids = batch_to_ids(SENTS)
    with torch.no_grad():
        first = elmo(ids)["elmo_representations"][0]
        h, c = lstm._states
        assert h.shape == (2, 3, 32) and c.shape == (2, 3, 128)
        second = elmo(ids)["elmo_representations"][0]
        assert (second - first).abs().max() > 1e-4                            # the carried state
        elmo._elmo_lstm._elmo_lstm.reset_states()
        assert lstm._states is None
        torch.testing.assert_close(elmo(ids)["elmo_representations"][0], first, atol=0, rtol=0)
        lstm._states = (h, c)                                                  # AllenNLP's layout, set back
        torch.testing.assert_close(elmo(ids)["elmo_representations"][0], second, atol=0, rtol=0)
        acts = elmo._elmo_lstm(ids)["activations"]                             # runs, carrying on
    assert len(acts) == 3 and acts[0].shape == (3, 8, 32)
    with pytest.raises(ElmoError, match="_states: expected"):
        lstm._states = (h[:1], c)
    # Copies and pickles leave the view out and rebuild it on the copy's own biLM.
    for clone in (copy.deepcopy(elmo), pickle.loads(pickle.dumps(elmo))):
        assert clone._elmo_lstm.bilm is clone.bilm and clone.bilm is not elmo.bilm
    assert Elmo(None, None, 1, module=_ElmoBiLm(*files)).bilm is not None     # module= an _ElmoBiLm


@pytest.mark.core
def test_scalar_mix_has_allennlps_layout():
    torch.manual_seed(0)
    tensors = [torch.randn(2, 5, 4) * (k + 1) + k for k in range(3)]
    mix = ScalarMix(3)
    assert isinstance(mix.scalar_parameters, nn.ParameterList) and len(mix.scalar_parameters) == 3
    assert all(p.shape == (1,) for p in mix.scalar_parameters) and mix.gamma.shape == (1,)
    assert list(mix.state_dict()) == ["gamma", "scalar_parameters.0", "scalar_parameters.1", "scalar_parameters.2"]
    torch.testing.assert_close(mix(tensors), sum(tensors) / 3)
    mix.scalar_parameters[1].data[0] = 2.0
    mix.gamma.data[0] = 0.5
    w = torch.softmax(torch.tensor([0.0, 2.0, 0.0]), 0)
    torch.testing.assert_close(mix(tensors), 0.5 * (w[0] * tensors[0] + w[1] * tensors[1] + w[2] * tensors[2]))
    mix(tensors).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mix.scalar_parameters)
    # torchelmo.ScalarMix's methods, on the module.
    assert mix.weights() == pytest.approx(w.tolist()) and mix.gamma_value() == 0.5
    torch.testing.assert_close(torch.softmax(torch.cat(list(mix.scalar_parameters)), 0), w)
    for p, x in zip(mix.scalar_parameters, [1.0, -1.0, 0.5]):
        p.data[0] = x
    assert [float(p) for p in mix.scalar_parameters] == [1.0, -1.0, 0.5] and mix.scalar_parameters[2].item() == 0.5
    assert float(mix.l2_penalty(0.01)) == pytest.approx(0.01 * 2.25)
    fixed = ScalarMix(3, initial_scalar_parameters=[1, 2, 3], trainable=False)
    assert all(not p.requires_grad for p in fixed.scalar_parameters) and not fixed.gamma.requires_grad
    assert [float(p) for p in fixed.scalar_parameters] == [1.0, 2.0, 3.0]
    # Layer norm: each tensor by the mean and variance of its elements at the masked positions.
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    normed = ScalarMix(3, do_layer_norm=True)
    want = []
    for t in tensors:
        m = mask.unsqueeze(-1).float()
        n = mask.sum() * t.shape[-1]
        mean = (t * m).sum() / n
        var = (((t - mean) * m) ** 2).sum() / n
        want.append((t - mean) / torch.sqrt(var + 1e-12))
    torch.testing.assert_close(normed(tensors, mask), sum(want) / 3, atol=1e-6, rtol=1e-6)
    with pytest.raises(ElmoError, match="needs the mask"):
        normed(tensors)
    with pytest.raises(ElmoError, match="2 tensors were passed, built to mix 3"):
        mix(tensors[:2])
    with pytest.raises(ElmoError, match="2 initial scalar parameters for mixture_size 3"):
        ScalarMix(3, initial_scalar_parameters=[0.0, 1.0])


def test_elmo_mixes_are_scalar_mix_k(files):
    elmo = Elmo(*files, 2, dropout=0.0, stateful=False)
    assert isinstance(elmo.scalar_mix_0, ScalarMix) and elmo.scalar_mixes == [elmo.scalar_mix_0, elmo.scalar_mix_1]
    assert elmo._scalar_mixes == elmo.scalar_mixes and elmo._dropout is elmo.dropout
    mix_keys = [k for k in elmo.state_dict() if not k.startswith("bilm.")]
    assert mix_keys == [f"scalar_mix_{m}.{n}" for m in range(2)
                        for n in ("gamma", "scalar_parameters.0", "scalar_parameters.1", "scalar_parameters.2")]
    ids = batch_to_ids(SENTS)
    for k, x in enumerate(TOP_ONLY):
        elmo.scalar_mix_1.scalar_parameters[k].data[0] = x
    with torch.no_grad():
        out = elmo(ids)["elmo_representations"]
        top = BiLM.from_published(*files)(ids).layers[2]
    torch.testing.assert_close(out[1], top, atol=1e-6, rtol=1e-6)
    assert (out[0] - out[1]).abs().max() > 1e-3


def test_token_embedder(files, monkeypatch):
    ids = batch_to_ids(SENTS)
    emb = ElmoTokenEmbedder(*files, dropout=0.0, stateful=False)
    elmo = Elmo(*files, 1, dropout=0.0, stateful=False)
    assert emb.get_output_dim() == 32 and emb._projection is None and isinstance(emb._elmo, Elmo)
    with torch.no_grad():
        out = emb(ids)
        torch.testing.assert_close(out, elmo(ids)["elmo_representations"][0])
    assert out.shape == (3, 6, 32)
    projected = ElmoTokenEmbedder(*files, dropout=0.0, projection_dim=7, stateful=False,
                                  scalar_mix_parameters=TOP_ONLY)
    assert projected.get_output_dim() == 7 and isinstance(projected._projection, nn.Linear)
    assert all(not p.requires_grad for p in projected._elmo.scalar_mix_0.scalar_parameters)
    with torch.no_grad():
        out = projected(ids)
        top = BiLM.from_published(*files)(ids).layers[2]
        torch.testing.assert_close(out, projected._projection(top), atol=1e-6, rtol=1e-6)
        nested = projected(ids.unsqueeze(1))                                  # (B, 1, T, 50)
    assert out.shape == (3, 6, 7) and nested.shape == (3, 1, 6, 7)
    vocab = ["@@PADDING@@", "The", "cat", "sat", "."]
    cached = ElmoTokenEmbedder(*files, dropout=0.0, vocab_to_cache=vocab, stateful=False)
    with torch.no_grad():
        torch.testing.assert_close(cached(None, torch.tensor([[1, 2, 3, 4]])), emb(batch_to_ids(SENTS[:1])))
    loaded = []
    monkeypatch.setattr(BiLM, "from_pretrained",
                        classmethod(lambda cls, name, **kw: loaded.append(name) or BiLM(preset("tiny"))))
    assert ElmoTokenEmbedder().get_output_dim() == BiLM(preset("tiny")).output_dim and loaded == ["original"]
    with pytest.raises(ElmoError, match="go together"):
        ElmoTokenEmbedder(files[0])


@pytest.mark.core
def test_character_mapper_and_indexer():
    m = ELMoCharacterMapper
    assert (m.max_word_length, m.beginning_of_sentence_character, m.end_of_sentence_character,
            m.beginning_of_word_character, m.end_of_word_character, m.padding_character) == (50, 256, 257, 258, 259, 260)
    assert m.beginning_of_sentence_characters == [258, 256, 259] + [260] * 47      # AllenNLP's: not shifted
    assert m.end_of_sentence_characters == [258, 257, 259] + [260] * 47
    assert (m.bos_token, m.eos_token) == ("<S>", "</S>")
    mapper = ELMoCharacterMapper()
    for word in ("cat", "<S>", "</S>", "naïve", "x" * 80):
        assert mapper.convert_word_to_char_ids(word) == list(word_to_char_ids(word))
    assert mapper.convert_word_to_char_ids("<S>") == [c + 1 for c in m.beginning_of_sentence_characters]
    special = ELMoCharacterMapper({"<MASK>": 5})
    assert special.convert_word_to_char_ids("<MASK>") == [259, 6, 260] + [261] * 47
    assert special == ELMoCharacterMapper({"<MASK>": 5}) and special != mapper
    with pytest.raises(ElmoError, match="character id in 0..260"):
        ELMoCharacterMapper({"<MASK>": 300})

    indexer = ELMoTokenCharactersIndexer()
    rows = indexer.tokens_to_indices(SENTS[0])["elmo_tokens"]
    assert rows == batch_to_ids([SENTS[0]])[0].tolist()
    as_tokens = [types.SimpleNamespace(text=t) for t in SENTS[0]]             # AllenNLP Token-like
    indexed = indexer.tokens_to_indices(as_tokens, vocabulary=None)
    assert indexed["elmo_tokens"] == rows and indexer.get_padding_lengths(indexed) == {"elmo_tokens": 4}
    padded = indexer.as_padded_tensor_dict(indexed, {"elmo_tokens": 6})["elmo_tokens"]
    assert torch.equal(padded, batch_to_ids([SENTS[0], SENTS[2]])[0])
    assert indexer.get_empty_token_list() == {"elmo_tokens": []}
    assert ELMoTokenCharactersIndexer(token_min_padding_length=9).get_padding_lengths(indexed) == {"elmo_tokens": 9}
    with pytest.raises(ElmoError, match="a token must be a str"):
        indexer.tokens_to_indices([None])


def test_allennlp_keys_from_the_published_file_reproduce_allennlps_outputs(files, options, batches, allennlp_dir):
    allen = {**_allennlp_keyed(files[1], options), **_mix_keys(TOP_ONLY)}
    elmo = Elmo(*files, 1, dropout=0.0, scalar_mix_parameters=[0.0, 0.0, 0.0])
    _scramble(elmo.bilm)
    assert set(elmo.allennlp_state_dict()) == set(allen)                       # the same keys and shapes
    assert all(v.shape == allen[k].shape for k, v in elmo.allennlp_state_dict().items())
    result = elmo.load_state_dict(allen)
    assert result.missing_keys == [] and result.unexpected_keys == []
    # The gate order and the forget bias land where the HDF5 loader puts them ...
    direct = BiLM.from_published(*files).state_dict()
    for k, v in elmo.bilm.state_dict().items():
        torch.testing.assert_close(v, direct[k], atol=1e-7, rtol=0)
    # ... and the model gives AllenNLP's reference outputs, carried state included.
    with torch.no_grad():
        for i, batch in enumerate(batches):
            out = elmo(batch_to_ids(batch))["elmo_representations"][0]
            for k, toks in enumerate(batch):
                np.testing.assert_allclose(out[k, :len(toks)].numpy(), _reference(allennlp_dir, k, i),
                                           atol=1e-6, rtol=1e-5)
    # Back to AllenNLP's keys: what was loaded (the forget bias within float32 rounding of 1 + b).
    for k, v in elmo.allennlp_state_dict().items():
        torch.testing.assert_close(v, allen[k], atol=1e-7, rtol=0)


def test_allennlps_equations_on_allennlp_keys_give_torchelmos_activations(files, options):
    """Highway and LstmCellWithProjection as AllenNLP computes them, on the AllenNLP-keyed tensors."""
    sd = {k[len("_elmo_lstm."):]: v for k, v in _allennlp_keyed(files[1], options).items()}
    cell_clip, proj_clip = options["lstm"]["cell_clip"], options["lstm"]["proj_clip"]
    D = options["lstm"]["dim"]
    te = "_token_embedder."
    sentence = SENTS[2]
    ids = torch.cat([torch.tensor([BOS_IDS]), batch_to_ids([sentence])[0], torch.tensor([EOS_IDS])])

    x = F.embedding(ids, sd[te + "_char_embedding_weights"]).transpose(1, 2)           # (n, E, 50)
    h = torch.cat([torch.relu(F.conv1d(x, sd[f"{te}char_conv_{i}.weight"], sd[f"{te}char_conv_{i}.bias"])
                              .max(-1).values) for i in range(5)], -1)
    for k in range(2):
        nonlinear, gate = F.linear(h, sd[f"{te}_highways._layers.{k}.weight"],
                                   sd[f"{te}_highways._layers.{k}.bias"]).chunk(2, -1)
        g = torch.sigmoid(gate)
        h = g * h + (1 - g) * torch.relu(nonlinear)
    e = F.linear(h, sd[te + "_projection.weight"], sd[te + "_projection.bias"])

    def cell(base, xs):
        hs, c, hh = [], torch.zeros(D), torch.zeros(xs.shape[1])
        for xt in xs:
            z = F.linear(xt, sd[base + "input_linearity.weight"]) + F.linear(
                hh, sd[base + "state_linearity.weight"], sd[base + "state_linearity.bias"])
            i, f, j, o = z.split(D)
            c = (torch.sigmoid(i) * torch.tanh(j) + torch.sigmoid(f) * c).clamp(-cell_clip, cell_clip)
            hh = F.linear(torch.sigmoid(o) * torch.tanh(c), sd[base + "state_projection.weight"])
            hh = hh.clamp(-proj_clip, proj_clip)
            hs.append(hh)
        return torch.stack(hs)

    want, fwd, bwd = [torch.cat([e, e], -1)], e, e.flip(0)
    for layer in range(2):
        f_out = cell(f"_elmo_lstm.forward_layer_{layer}.", fwd) + (fwd if layer else 0)
        b_out = cell(f"_elmo_lstm.backward_layer_{layer}.", bwd) + (bwd if layer else 0)
        want.append(torch.cat([f_out, b_out.flip(0)], -1))
        fwd, bwd = f_out, b_out
    with torch.no_grad():
        got = _ElmoBiLm(*files, stateful=False)(batch_to_ids([sentence]))["activations"]
    for a, b in zip(got, want):
        torch.testing.assert_close(a[0], b, atol=2e-6, rtol=1e-5)


def test_allennlp_state_dict_round_trip(files):
    ids = batch_to_ids(SENTS)
    source = Elmo(*files, 2, dropout=0.0, stateful=False)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in source.bilm.parameters():
            p.add_(torch.randn_like(p) * 0.05)                 # not the file's weights
        for mix in source.scalar_mixes:
            for p, x in zip(mix.scalar_parameters, torch.randn(3)):
                p.data[0] = x
            mix.gamma.fill_(float(torch.rand(1)) + 0.5)
    sd = source.allennlp_state_dict()
    assert len(sd) == 17 + 16 + 2 * 4
    assert "_elmo_lstm._elmo_lstm.backward_layer_1.state_linearity.bias" in sd
    assert sd["_elmo_lstm._token_embedder._highways._layers.0.weight"].shape == (248, 124)
    assert sd["_elmo_lstm._elmo_lstm.forward_layer_0.input_linearity.weight"].shape == (256, 16)
    target = Elmo(*files, 2, dropout=0.0, stateful=False)
    assert target.load_state_dict(sd) is not None
    with torch.no_grad():
        for a, b in zip(source(ids)["elmo_representations"], target(ids)["elmo_representations"]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    for a, b in zip(source.scalar_mixes, target.scalar_mixes):               # the learned mixes, exactly
        assert [float(p) for p in a.scalar_parameters] == [float(p) for p in b.scalar_parameters]
        assert a.gamma_value() == b.gamma_value()
    ours, theirs = source.state_dict(), target.state_dict()
    for k in ours:
        torch.testing.assert_close(ours[k], theirs[k], atol=1e-7, rtol=0)

    # Inside a larger model, under its prefix, strictly.
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.elmo = Elmo(*files, 2, dropout=0.0, stateful=False)
            self.out = nn.Linear(32, 5)

    tagger = Tagger()
    tagger.load_state_dict({**{"elmo." + k: v for k, v in sd.items()}, "out.weight": torch.zeros(5, 32),
                            "out.bias": torch.ones(5)})
    with torch.no_grad():
        torch.testing.assert_close(tagger.elmo(ids)["elmo_representations"][1],
                                   source(ids)["elmo_representations"][1], atol=1e-6, rtol=0)

    # ElmoTokenEmbedder: _elmo.* and _projection.*
    emb = ElmoTokenEmbedder(*files, dropout=0.0, projection_dim=7, stateful=False)
    _scramble(emb)
    esd = emb.allennlp_state_dict()
    assert "_elmo.scalar_mix_0.gamma" in esd and "_projection.weight" in esd
    assert "_elmo._elmo_lstm._token_embedder._projection.bias" in esd
    emb2 = ElmoTokenEmbedder(*files, dropout=0.0, projection_dim=7, stateful=False)
    emb2.load_state_dict(esd)
    with torch.no_grad():
        torch.testing.assert_close(emb2(ids), emb(ids), atol=1e-6, rtol=0)

    # The lower-level modules load and give AllenNLP's keys too.
    bilm = _ElmoBiLm(*files, stateful=False)
    bilm.load_state_dict({k[len("_elmo_lstm."):]: v for k, v in sd.items() if k.startswith("_elmo_lstm.")})
    enc = _ElmoCharacterEncoder(*files)
    enc.load_state_dict({k[len("_elmo_lstm._token_embedder."):]: v for k, v in sd.items()
                         if k.startswith("_elmo_lstm._token_embedder.")})
    with torch.no_grad():
        torch.testing.assert_close(bilm(ids)["activations"][2], target._elmo_lstm(ids)["activations"][2])
        torch.testing.assert_close(enc(ids)["token_embedding"], target._elmo_lstm._token_embedder(ids)["token_embedding"])
    assert set(bilm.allennlp_state_dict()) == {k[len("_elmo_lstm."):] for k in sd if k.startswith("_elmo_lstm.")}
    assert list(enc.allennlp_state_dict())[:2] == ["_char_embedding_weights", "char_conv_0.weight"]


def test_loading_keeps_caches_and_older_layouts_right(files):
    ids = batch_to_ids(SENTS[:2])
    vocab = ["@@PADDING@@", "The", "cat", "sat", ".", "A", "dog"]
    words = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    cached = Elmo(*files, 1, dropout=0.0, vocab_to_cache=vocab, stateful=False)
    other = Elmo(*files, 1, dropout=0.0, stateful=False)
    _scramble(other)
    sd = other.allennlp_state_dict()
    cached.load_state_dict(sd)                          # the word cache is rebuilt from the new weights
    with torch.no_grad():
        torch.testing.assert_close(cached(None, words)["elmo_representations"][0],
                                   other(ids)["elmo_representations"][0], atol=1e-6, rtol=0)
    # AllenNLP's Elmo with vocab_to_cache has _word_embedding.weight: given back, accepted.
    word_table = cached.allennlp_state_dict()["_elmo_lstm._word_embedding.weight"]
    assert word_table.shape == (7, 16) and not word_table[0].any()
    cached.load_state_dict(cached.allennlp_state_dict())
    # torchelmo.Elmo's state dict, and this drop-in's before scalar_mix_k: scalar_mixes.k.*
    native = NativeElmo(BiLM.from_published(*files), 1, dropout=0.0)
    with torch.no_grad():
        native.scalar_mixes[0].scalar_parameters.copy_(torch.tensor([0.3, -0.2, 0.9]))
        native.scalar_mixes[0].gamma.fill_(1.5)
    old = native.state_dict()
    assert "scalar_mixes.0.scalar_parameters" in old
    dropin = Elmo(*files, 1, dropout=0.0, stateful=False)
    dropin.load_state_dict(old)
    assert [float(p) for p in dropin.scalar_mix_0.scalar_parameters] == pytest.approx([0.3, -0.2, 0.9])
    assert dropin.scalar_mix_0.gamma_value() == 1.5


def test_bad_allennlp_state_dicts_are_clear_errors(files):
    elmo = Elmo(*files, 1, dropout=0.0)
    sd = elmo.allennlp_state_dict()
    key = "_elmo_lstm._elmo_lstm.forward_layer_0.input_linearity.weight"
    with pytest.raises(RuntimeError, match=rf"size mismatch for {key} \(AllenNLP layout\): copying a param "
                                           r"with shape \(16, 256\) from checkpoint, the shape in current "
                                           r"model is \(256, 16\)"):
        elmo.load_state_dict({**sd, key: sd[key].T})
    unknown = "_elmo_lstm._elmo_lstm.forward_layer_2.input_linearity.weight"
    with pytest.raises(RuntimeError, match=f'Unexpected key\\(s\\) in state_dict: "{unknown}"'):
        elmo.load_state_dict({**sd, unknown: sd[key]})
    partial = {k: v for k, v in sd.items() if k != key}
    with pytest.raises(RuntimeError, match=f'Missing key\\(s\\) in state_dict: "{key}"'):
        elmo.load_state_dict(partial)
    before = elmo.bilm.layers[0].w_x.detach().clone()
    result = elmo.load_state_dict(partial, strict=False)                  # the rest loads
    assert result.missing_keys == [key] and torch.equal(elmo.bilm.layers[0].w_x, before)
    with pytest.raises(RuntimeError, match="mixes AllenNLP's keys .* and torchelmo's"):
        elmo.load_state_dict({**sd, **{"bilm." + k: v for k, v in elmo.bilm.state_dict().items()}})
    with pytest.raises(RuntimeError, match="is a tensor of dtype torch.int64; expected floating point"):
        elmo.load_state_dict({**sd, key: sd[key].long()})
    with pytest.raises(RuntimeError, match="size mismatch for scalar_mix_0.scalar_parameters"):
        elmo.load_state_dict({**{k: v for k, v in sd.items() if ".scalar_parameters." not in k},
                              "scalar_mix_0.scalar_parameters": torch.zeros(2)})
    enc = _ElmoCharacterEncoder(*files)
    with pytest.raises(RuntimeError, match="size mismatch for char_conv_1.weight"):
        enc.load_state_dict({**enc.allennlp_state_dict(), "char_conv_1.weight": torch.zeros(8, 4, 3)})
