"""The context-free token encoder: characters -> char-CNN -> highway -> projection (E0)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ElmoConfig


class Highway(nn.Module):
    """``g = sigmoid(x W_carry + b_carry)``; ``y = g * relu(x W_transform + b_transform) + (1 - g) * x``.

    The published "carry" gate gates the transformed branch. Both products run as one matmul.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.proj = nn.Linear(dim, 2 * dim)  # rows [0, dim): transform, [dim, 2 dim): carry

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        transform, carry = self.proj(x).split(self.dim, dim=-1)
        g = torch.sigmoid(carry)
        return g * F.relu(transform) + (1.0 - g) * x


class CharCNNEncoder(nn.Module):
    """Maps character ids to token embeddings.

    Input ``(..., 50)`` shifted char ids, output ``(..., P)``. E0 of a token depends only on
    its own characters, so a batch's distinct tokens are encoded once each (``forward``), and a
    vocabulary can be precomputed (:meth:`build_cache`).
    """

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.config = config
        self.char_embed = nn.Embedding(config.n_characters, config.char_embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(
            nn.Conv1d(config.char_embed_dim, n, w) for w, n in config.filters)
        self.highways = nn.ModuleList(Highway(config.n_filters) for _ in range(config.n_highway))
        self.proj = nn.Linear(config.n_filters, config.projection_dim)
        self._act = torch.relu if config.activation == "relu" else torch.tanh
        self._cache: dict[tuple[int, ...], int] | None = None
        self._cache_table: torch.Tensor | None = None

    def encode_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """``(N, 50)`` -> ``(N, P)``, no deduplication, no cache."""
        x = self.char_embed(ids).transpose(1, 2)             # (N, E, 50)
        feats = [self._act(conv(x).amax(dim=-1)) for conv in self.convs]
        h = torch.cat(feats, dim=-1)                          # (N, n_filters)
        for hw in self.highways:
            h = hw(h)
        return self.proj(h)

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """``(B, T, 50)`` -> ``(B, T, P)``; padded positions (all-zero ids) give zeros."""
        B, T, C = char_ids.shape
        flat = char_ids.reshape(-1, C)
        if flat.shape[0] == 0:
            return self.proj.weight.new_zeros(B, T, self.config.projection_dim)
        uniq, inverse = torch.unique(flat, dim=0, return_inverse=True)
        emb = self._encode_unique(uniq)
        out = emb[inverse].view(B, T, -1)
        return out * (char_ids[..., 0] > 0).unsqueeze(-1).to(out.dtype)

    # -- token-embedding cache ---------------------------------------------------------------------
    def _cache_usable(self) -> bool:
        # A cache holds detached values: never use it where gradients should reach the encoder.
        return self._cache is not None and not (
            torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()))

    def _encode_unique(self, uniq: torch.Tensor) -> torch.Tensor:
        if not self._cache_usable():
            return self.encode_tokens(uniq)
        assert self._cache is not None and self._cache_table is not None
        rows = [self._cache.get(tuple(r)) for r in uniq.tolist()]
        hit = [i for i, r in enumerate(rows) if r is not None]
        miss = [i for i, r in enumerate(rows) if r is None]
        table = self._cache_table.to(device=uniq.device, dtype=self.proj.weight.dtype)
        out = table.new_empty(len(rows), table.shape[1])
        if hit:
            out[hit] = table[[rows[i] for i in hit]]
        if miss:
            out[miss] = self.encode_tokens(uniq[miss])
        return out

    @torch.no_grad()
    def build_cache(self, char_ids: torch.Tensor, batch_size: int = 4096) -> None:
        """Precompute embeddings of a vocabulary given as ``(V, 50)`` char ids."""
        table = torch.cat([self.encode_tokens(char_ids[i:i + batch_size])
                           for i in range(0, len(char_ids), batch_size)])
        self._cache = {tuple(r): i for i, r in enumerate(char_ids.tolist())}
        self._cache_table = table

    def clear_cache(self) -> None:
        self._cache, self._cache_table = None, None
