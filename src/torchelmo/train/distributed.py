"""One process or many under ``torchrun``: the rank layout, the device, each process's random
state, and the collectives a checkpoint needs (gloo on CPU, nccl on GPU)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def setup_distributed(device: torch.device) -> DistEnv:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    env = DistEnv(int(os.environ["RANK"]), world)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return env


def gather_lstm_state(state: list[tuple[torch.Tensor, torch.Tensor]] | None, env: DistEnv
                      ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """The carried state of every global row (each rank holds its own rows), on the CPU."""
    if state is None:
        return None
    if not env.active:
        return [(c.float().cpu(), h.float().cpu()) for c, h in state]
    out = []
    for c, h in state:
        cs = [torch.empty_like(c) for _ in range(env.world_size)]
        hs = [torch.empty_like(h) for _ in range(env.world_size)]
        dist.all_gather(cs, c.contiguous())
        dist.all_gather(hs, h.contiguous())
        out.append((torch.cat(cs, 1).float().cpu(), torch.cat(hs, 1).float().cpu()))
    return out


def gather_rng(env: DistEnv, device: torch.device) -> list[dict]:
    """Every rank's generator states, in rank order."""
    mine = rng_state(device)
    if not env.active:
        return [mine]
    allr: list = [None] * env.world_size
    dist.all_gather_object(allr, mine)
    return allr


def seed_rngs(seed: int) -> None:
    """Seed the generators a checkpoint saves (torch's, and Python's, which nothing here draws from
    but a user's code may), so that a fresh run's are as reproducible as a resumed one's."""
    torch.manual_seed(seed)
    random.seed(seed)


def rng_state(device: torch.device) -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def restore_rng(ckpt: dict, rank: int, world_size: int, device: torch.device) -> bool:
    """Set this rank's generators as the checkpoint saved them; False if it was written by
    another number of ranks (the caller reseeds)."""
    if ckpt["world_size"] != world_size:
        return False
    mine = ckpt["rng"][rank]
    torch.set_rng_state(mine["torch"])
    random.setstate(mine["python"])
    if mine.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(mine["cuda"], device)
    return True
