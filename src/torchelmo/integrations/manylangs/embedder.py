"""``elmoformanylangs.Embedder`` on torchelmo."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ...errors import ElmoError
from ...model.manylangs import ManyLangsBiLM


class Embedder:
    """``elmoformanylangs.Embedder`` on torchelmo: ``Embedder(model_dir, batch_size=64)``,
    :meth:`sents2elmo` with its arguments and its outputs.

    ``device``: where the model runs (the CPU by default). ``rng``: what draws the order the
    batches run in; theirs uses Python's global ``random`` and so does None, so with the same
    seed both run the same order (which matters through the carried state). ``stateful``: False
    starts every batch from the zero state instead (then the order does not matter).
    """

    def __init__(self, model_dir: str | Path, batch_size: int = 64, device: str | torch.device | None = None,
                 rng: random.Random | None = None, stateful: bool = True) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoError(f"Embedder: batch_size must be a positive integer, got {batch_size!r}")
        self.model_dir = Path(model_dir)
        self.batch_size = batch_size
        self.model = ManyLangsBiLM.from_dir(model_dir, stateful=stateful)
        if device is not None:
            self.model.to(device)
        self.rng = rng

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    def _check(self, sents: Sequence[Sequence[str]], output_layer: int) -> None:
        n = self.model.num_layers
        if isinstance(output_layer, bool) or not isinstance(output_layer, int) or not -2 <= output_layer < n:
            raise ElmoError(f"sents2elmo: output_layer must be -1 (the average), -2 (all layers) or a layer "
                            f"0..{n - 1}, got {output_layer!r}")
        for i, s in enumerate(sents):
            if isinstance(s, str) or not isinstance(s, Sequence):
                raise ElmoError(f"sents2elmo: sentence {i} is a {type(s).__name__}, not a list of tokens")
            bad = next((t for t in s if not isinstance(t, str)), None)
            if bad is not None:
                raise ElmoError(f"sents2elmo: sentence {i} has a token of type {type(bad).__name__}, not str")

    @torch.no_grad()
    def sents2elmo(self, sents: Sequence[Sequence[str]], output_layer: int = -1) -> list[np.ndarray]:
        """Per sentence, in the given order, a float32 array without ``<bos>``/``<eos>``:
        ``output_layer`` -1 the average of the layers ``(n, 2P)``, -2 all of them ``(L, n, 2P)``,
        k layer k ``(n, 2P)`` (0: the token embedding, duplicated)."""
        if isinstance(sents, str):
            raise ElmoError("sents2elmo: expected a list of sentences (lists of tokens), got a str")
        sents = list(sents)
        self._check(sents, output_layer)
        vocab = self.model.vocab
        seqs = [vocab.sentence(s) for s in sents]
        # Their order: sorted by length (stable), cut into batches, the batches shuffled.
        order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        perm = list(range(len(batches)))
        (self.rng or random).shuffle(perm)
        out: list[np.ndarray | None] = [None] * len(seqs)
        for b in perm:
            rows = batches[b]
            word_ids, char_ids, lengths = vocab.batch([seqs[i] for i in rows])
            layers = torch.stack(self.model(word_ids, char_ids, lengths).layers).float().cpu().numpy()
            for r, i in enumerate(rows):
                data = layers[:, r, 1:len(seqs[i]) - 1]                     # (L, n, 2P)
                if output_layer == -1:
                    # np.average's own result (their call), without its ZeroDivisionError on an
                    # empty sentence
                    out[i] = data.mean(axis=0)
                elif output_layer == -2:
                    out[i] = data.copy()
                else:
                    out[i] = data[output_layer].copy()
        return out   # type: ignore[return-value]
