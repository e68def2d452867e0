"""One training step's gradients: the micro-batches of a step through the model (DDP's gradient
sync on the last only), the carried LSTM state of stream batching and its random row resets,
the loss summed over ranks, and the clipped gradient norm. The optimizer update stays with the
trainer, which decides on the learning rate and on divergence."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from ..lm.data import SentenceBatcher, StreamBatcher
from .config import MAX_GRAD_ACCUM, TrainConfig
from .distributed import DistEnv

State = list[tuple[torch.Tensor, torch.Tensor]] | None   # per layer c (2, B, D), h (2, B, P)


def micro_seed(base: int, step: int, micro: int) -> int:
    """The seed of micro-batch ``micro`` of a step: the same on every rank and after a resume, and
    distinct for every (step, micro) since ``micro < MAX_GRAD_ACCUM``."""
    return (base + step * MAX_GRAD_ACCUM + micro) % (2**63)


class Stepper:
    """``model``: the LM or its DDP wrapper; ``lm``: the LM itself (its parameters are clipped)."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, device: torch.device, model: torch.nn.Module,
                 lm: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 batcher: StreamBatcher | SentenceBatcher) -> None:
        self.cfg, self.env, self.device = cfg, env, device
        self.model, self.lm, self.optimizer, self.batcher = model, lm, optimizer, batcher

    def next_micro_batches(self) -> list | None:
        """The next step's ``grad_accum`` batches (fewer at the end of the data; None after it)."""
        out = []
        for _ in range(self.cfg.grad_accum):
            try:
                out.append(next(self.batcher))
            except StopIteration:
                break
        return out or None

    def gradients(self, micro: list, state: State, step: int) -> tuple[float, int, float, State]:
        """Zero the gradients, accumulate those of ``micro`` (step ``step``, from ``state``),
        clip them; returns (global loss per target, global targets, gradient norm, next state)."""
        cfg, env = self.cfg, self.env
        n_global = sum(b.global_targets for b in micro)
        local = torch.zeros(2, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        for i, b in enumerate(micro):
            b = b.to(self.device)
            if cfg.state_reset > 0 and state is not None:
                state = self._reset_some_rows(state, step, i)
            sampler = torch.Generator().manual_seed(micro_seed(cfg.seed * 1_000_003, step, i))
            sync = contextlib.nullcontext() if (not env.active or i == len(micro) - 1) else self.model.no_sync()
            with sync:
                sums, final = self.model(b.char_ids, b.token_index, b.targets, b.lengths, state, sampler, b.groups)
                loss = 0.5 * sums.float().sum() * (env.world_size / n_global)
                loss.backward()
            local += sums.detach().double().cpu()
            if cfg.batching == "stream":
                state = [(c.detach().float(), h.detach().float()) for c, h in final]
        if env.active:
            dist.all_reduce(local)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.lm.parameters(), cfg.clip_norm)
        return 0.5 * float(local.sum()) / n_global, n_global, float(grad_norm), state

    def _reset_some_rows(self, state: State, step: int, micro: int) -> State:
        # The same draw on every rank (over the global rows) and after a resume.
        g = torch.Generator().manual_seed(micro_seed(self.cfg.seed * 7_919 + 1, step, micro))
        rows = self.batcher.rows
        keep = (torch.rand(self.batcher.batch_size, generator=g) >= self.cfg.state_reset)[rows.start:rows.stop]
        keep = keep.to(self.device).view(1, -1, 1)
        return [(c * keep, h * keep) for c, h in state]
