"""Weights: the published bilm-tf/AllenNLP HDF5 layout and our native safetensors format (the
names that find them are :mod:`torchelmo.model.registry`'s).

Published layout (``options.json`` + HDF5, see ``docs/format.md``)::

    char_embed                                   (261, E)      row k is char id k + 1
    CNN/W_cnn_i, CNN/b_cnn_i                     (1, w_i, E, n_i), (n_i,)
    CNN_high_k/{W,b}_{carry,transform}           (n, n), (n,)
    CNN_proj/W_proj, CNN_proj/b_proj             (n, P), (P,)
    RNN_d/RNN/MultiRNNCell/Cell{l}/LSTMCell/W_0  (P + P, 4D)   rows [x; h], columns i, j, f, o
                                         .../B   (4D,)         without the forget bias
                                         .../W_P_0 (D, P)

Native layout: a directory with ``config.json`` (the same options schema) and
``model.safetensors`` (the module's state dict).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..errors import ElmoError
from ..io.download import cache_dir, cached_path  # noqa: F401  (part of this module's API)
from ..io.fileio import atomic_path, write_error
from .config import ElmoConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
EXTRA_CONFIG_NAME = "training.json"  # what a model dir holds beyond the biLM (an LM's softmax, vocab)
VOCAB_NAME = "vocab.txt"             # an LM's output vocabulary

# ------------------------------------------------------------------------------------------------
# The published HDF5 layout, written once as (name, shape, read-from-model, write-into-model).
# ------------------------------------------------------------------------------------------------
Entry = tuple[str, tuple[int, ...], Callable[[], np.ndarray], Callable[[np.ndarray], None]]


def _published_layout(bilm) -> list[Entry]:
    cfg: ElmoConfig = bilm.config
    enc = bilm.encoder
    E, n, P, D = cfg.char_embed_dim, cfg.n_filters, cfg.projection_dim, cfg.lstm_dim
    entries: list[Entry] = []

    def add(name, shape, get, put):
        entries.append((name, tuple(shape), get, put))

    def np_(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().float().numpy()

    def setter(param: torch.Tensor, transform=lambda a: a):
        def put(a: np.ndarray) -> None:
            with torch.no_grad():
                param.copy_(torch.from_numpy(np.ascontiguousarray(transform(a))))
        return put

    w = enc.char_embed.weight
    add("char_embed", (cfg.n_characters - 1, E), lambda: np_(w[1:]), setter(w[1:]))
    for i, ((width, count), conv) in enumerate(zip(cfg.filters, enc.convs)):
        add(f"CNN/W_cnn_{i}", (1, width, E, count), lambda c=conv: np_(c.weight.permute(2, 1, 0))[None],
            setter(conv.weight, lambda a: a[0].transpose(2, 1, 0)))
        add(f"CNN/b_cnn_{i}", (count,), lambda c=conv: np_(c.bias), setter(conv.bias))
    for k, hw in enumerate(enc.highways):
        for part, rows in (("transform", slice(0, n)), ("carry", slice(n, 2 * n))):
            add(f"CNN_high_{k}/W_{part}", (n, n), lambda r=rows, h=hw: np_(h.proj.weight[r].T),
                setter(hw.proj.weight[rows], lambda a: a.T))
            add(f"CNN_high_{k}/b_{part}", (n,), lambda r=rows, h=hw: np_(h.proj.bias[r]),
                setter(hw.proj.bias[rows]))
    add("CNN_proj/W_proj", (n, P), lambda: np_(enc.proj.weight.T), setter(enc.proj.weight, lambda a: a.T))
    add("CNN_proj/b_proj", (P,), lambda: np_(enc.proj.bias), setter(enc.proj.bias))
    for l, layer in enumerate(bilm.layers):
        for d in range(2):
            base = f"RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell"
            in_dim = layer.input_dim

            def put_w0(a, layer=layer, d=d, in_dim=in_dim):
                with torch.no_grad():
                    layer.w_x[d].copy_(torch.from_numpy(np.ascontiguousarray(a[:in_dim])))
                    layer.w_h[d].copy_(torch.from_numpy(np.ascontiguousarray(a[in_dim:])))

            add(f"{base}/W_0", (in_dim + P, 4 * D),
                lambda layer=layer, d=d: np_(torch.cat([layer.w_x[d], layer.w_h[d]])), put_w0)
            add(f"{base}/B", (4 * D,), lambda layer=layer, d=d: np_(layer.bias[d]), setter(layer.bias[d]))
            add(f"{base}/W_P_0", (D, P), lambda layer=layer, d=d: np_(layer.w_p[d]), setter(layer.w_p[d]))
    return entries


def load_published_weights(bilm, weight_file: str | Path) -> None:
    """Copy a published HDF5 weight file into ``bilm`` (whose config came from its options)."""
    import h5py

    weight_file = Path(weight_file)
    if not weight_file.is_file():
        raise ElmoError(f"{weight_file}: weight file not found")
    if not h5py.is_hdf5(weight_file):
        raise ElmoError(f"{weight_file}: not an HDF5 file")
    try:
        with h5py.File(weight_file, "r") as f:
            for name, shape, _, put in _published_layout(bilm):
                put(_read_dataset(f, name, shape, weight_file))
    except (OSError, RuntimeError) as e:  # truncated or damaged: h5py finds out as it reads
        raise ElmoError(f"{weight_file}: damaged or truncated HDF5 file ({' '.join(str(e).split())[:160]})") from None
    bilm.encoder.clear_cache()


def _read_dataset(f, name: str, shape: tuple[int, ...], weight_file: Path) -> np.ndarray:
    """One weight dataset as float32, checked: present, the options' shape, real numbers, finite."""
    import h5py

    if name not in f or not isinstance(f[name], h5py.Dataset):
        raise ElmoError(f"{weight_file}: missing dataset {name!r} (the options ask for it)")
    ds = f[name]
    if tuple(ds.shape) != shape:
        raise ElmoError(f"{weight_file}: dataset {name!r} has shape {tuple(ds.shape)}, "
                        f"the options imply {shape}")
    if ds.dtype.kind != "f":   # strings, integers, complex: never what a weight file holds
        raise ElmoError(f"{weight_file}: dataset {name!r} has dtype {ds.dtype}, expected floating point")
    arr = np.asarray(ds[...], dtype=np.float32)
    check_finite(arr, f"{weight_file}: dataset {name!r}")
    return arr


def check_finite(arr: np.ndarray | torch.Tensor, what: str) -> None:
    """NaN or infinite weights would give NaN vectors silently: refuse them at load."""
    bad = ~torch.isfinite(torch.as_tensor(arr))
    if bad.any():
        raise ElmoError(f"{what} holds {int(bad.sum())} non-finite value(s) (NaN or inf)")


def export_published(bilm, out_dir: str | Path, name: str = "elmo") -> tuple[Path, Path]:
    """Write ``<name>_options.json`` and ``<name>_weights.hdf5`` in the published layout."""
    import h5py

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    options_path, weights_path = out_dir / f"{name}_options.json", out_dir / f"{name}_weights.hdf5"
    with atomic_path(weights_path) as tmp:
        with h5py.File(tmp, "w") as f:
            for ds_name, shape, get, _ in _published_layout(bilm):
                arr = get()
                assert arr.shape == shape, (ds_name, arr.shape, shape)
                f.create_dataset(ds_name, data=arr)
    with atomic_path(options_path) as tmp:
        bilm.config.to_json_file(tmp)
    return options_path, weights_path


# ------------------------------------------------------------------------------------------------
# Native format.
# ------------------------------------------------------------------------------------------------
# What a model may be stored in (``save_pretrained(dtype=...)``); loading computes in fp32.
STORAGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def save_native(bilm, out_dir: str | Path, extra_tensors: dict[str, torch.Tensor] | None = None,
                extra_config: dict | None = None, dtype: str = "float32") -> Path:
    """``dtype``: the weights' type on disk (``float16``: half the size, each weight within 2^-11
    of itself; loading converts back to the model's type)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    if dtype not in STORAGE_DTYPES:
        raise ElmoError(f"save: dtype must be one of {', '.join(STORAGE_DTYPES)}, got {dtype!r}")
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(out_dir, e) from None
    tensors = {k: v.detach().cpu().contiguous() for k, v in bilm.state_dict().items()}
    for k, v in (extra_tensors or {}).items():
        tensors[k] = v.detach().cpu().contiguous()
    for k, v in tensors.items():
        if v.is_floating_point() and v.dtype != STORAGE_DTYPES[dtype]:
            tensors[k] = v.to(STORAGE_DTYPES[dtype])
            check_finite(tensors[k], f"save: tensor {k!r} in {dtype} (out of its range)")
    try:
        with atomic_path(out_dir / WEIGHTS_NAME) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "elmo-native-1"})
    except (SafetensorError, OSError) as e:   # a full disk, above all
        raise ElmoError(f"{out_dir / WEIGHTS_NAME}: cannot write ({' '.join(str(e).split())[:160]})") from None
    with atomic_path(out_dir / CONFIG_NAME) as tmp:
        bilm.config.to_json_file(tmp)
    if extra_config:
        with atomic_path(out_dir / EXTRA_CONFIG_NAME) as tmp:
            tmp.write_text(json.dumps(extra_config, indent=2) + "\n")
    return out_dir


def require_native_weights(model_dir: str | Path) -> None:
    """Check that a native model directory holds its weights file, before a model of its config
    is allocated (a config within the size bounds can still ask for gigabytes)."""
    path = Path(model_dir) / WEIGHTS_NAME
    if not path.is_file():
        raise ElmoError(f"{path}: missing (a native model is {CONFIG_NAME} + {WEIGHTS_NAME}); "
                        "nothing was loaded")


def load_native_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(model_dir) / WEIGHTS_NAME
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ElmoError(f"{path}: cannot read safetensors weights ({e})") from None


def load_native(bilm, model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Load a native model's weights into ``bilm``; returns tensors that are not the biLM's
    (e.g. a trained softmax), so callers that know them can use them."""
    tensors = load_native_tensors(model_dir)
    own = bilm.state_dict()
    path = Path(model_dir) / WEIGHTS_NAME
    for k, v in own.items():
        if k not in tensors:
            raise ElmoError(f"{path}: missing tensor {k!r}")
        if tuple(tensors[k].shape) != tuple(v.shape):
            raise ElmoError(f"{path}: tensor {k!r} has shape {tuple(tensors[k].shape)}, "
                            f"config.json implies {tuple(v.shape)}")
        if not tensors[k].is_floating_point():
            raise ElmoError(f"{path}: tensor {k!r} has dtype {tensors[k].dtype}, expected floating point")
        check_finite(tensors[k], f"{path}: tensor {k!r}")
    bilm.load_state_dict({k: tensors[k] for k in own})
    bilm.encoder.clear_cache()
    return {k: v for k, v in tensors.items() if k not in own}
