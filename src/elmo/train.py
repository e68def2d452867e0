"""Training the biLM: ``elmo train`` (one process, or many with ``torchrun``).

The original recipe (bilm-tf) is the default: truncated BPTT over continuous streams (20-step
windows, state carried), loss ``0.5 (L_fwd + L_bwd)``, Adagrad (lr 0.2, initial accumulator 1.0),
global-norm clipping at 10, dropout 0.1 on every LSTM layer's input and on the top output.

A run directory holds::

    train_config.json   the TrainConfig (resuming needs nothing else)
    checkpoint.pt       the latest checkpoint (written atomically): parameters, optimizer, RNG
                        states, data position, carried LSTM state, early-stopping bookkeeping
    metrics.jsonl       one JSON object per log line / validation
    best/               the LM with the best validation perplexity (native dir + softmax + vocab)
    model/              the final LM
    published/          the final biLM exported to the published options.json + HDF5

Distributed: ``torchrun --nproc_per_node N -m elmo.cli train ...`` (gloo on CPU, nccl on GPU).
Each rank computes the rows of the global batch it owns (see :mod:`elmo.data`); gradients are
averaged by DistributedDataParallel with the loss normalised by the global number of targets, so
N ranks with global batch B compute the same steps as one process with batch B.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from .config import ElmoConfig, preset
from .data import Corpus, SentenceBatcher, StreamBatcher, Vocabulary
from .errors import ElmoError
from .fileio import atomic_path
from .lm import LanguageModel
from .softmax import AdaptiveSoftmax, softmax_kind

CHECKPOINT_NAME = "checkpoint.pt"
TRAIN_CONFIG_NAME = "train_config.json"
METRICS_NAME = "metrics.jsonl"

# Shapes of the biLM. 'cpu' is ours: ~5.9M parameters with a 10k-word softmax (PTB), a char-CNN
# like Kim et al.'s LSTM-Char-Small (widths 1-6, 20 w filters, one highway layer) under a
# projected LSTM; it trains at about 1k tokens/s on one CPU core.
TRAIN_PRESETS: dict[str, Callable[[], ElmoConfig]] = {
    "tiny": lambda: preset("tiny"),
    "small": lambda: preset("small"),
    "medium": lambda: preset("medium"),
    "original": lambda: preset("original"),
    "cpu": lambda: ElmoConfig(lstm_dim=512, projection_dim=192, n_layers=2, char_embed_dim=16,
                              filters=[[w, 20 * w] for w in range(1, 7)], n_highway=1),
}

# Fields that may be changed when resuming (they do not change what is computed, or extend it).
RESUME_OVERRIDABLE = {"max_steps", "epochs", "log_every", "eval_every", "checkpoint_every", "patience",
                      "threads", "progress", "out_dir", "resume", "keep_checkpoints"}
KEPT_DIR = "checkpoints"


@dataclass
class TrainConfig:
    train: list[str]                       # corpus files or globs (one sentence per line)
    out_dir: str
    vocab: str | None = None               # built from the training corpus if not given
    valid: list[str] = field(default_factory=list)
    model: str = "small"                   # a preset name or a published options.json
    softmax: str = "auto"                  # auto | full | sampled | adaptive
    num_samples: int = 8192                # negatives of the sampled softmax
    batching: str = "stream"               # stream (truncated BPTT) | sentence
    batch_size: int | None = 128           # global rows (stream) or sentences per step
    batch_tokens: int | None = None        # instead of batch_size: tokens per global batch
    unroll: int = 20
    state_reset: float = 0.0               # stream: chance per row and window to restart from zero
    optimizer: str = "adagrad"             # adagrad | adam | sgd
    lr: float | None = None                # 0.2 adagrad, 1e-3 adam, 1.0 sgd
    adagrad_init: float = 1.0
    weight_decay: float = 0.0
    clip_norm: float = 10.0
    dropout: float = 0.1
    variational_dropout: bool = False      # one dropout mask per window over time (Gal & Ghahramani)
    weight_drop: float = 0.0               # DropConnect on the LSTM recurrent matrices (AWD-LSTM)
    lr_decay: float = 1.0                  # multiply the lr by this when validation does not improve
    lr_schedule: str = "constant"          # constant | linear | cosine (to 0 at max_steps)
    warmup_steps: int = 0                  # linear warm-up from 0 over this many steps
    bf16: bool = False
    seed: int = 0
    grad_accum: int = 1
    max_steps: int | None = None
    epochs: int | None = None
    log_every: int = 50
    eval_every: int = 1000
    eval_mode: str = "sentence"            # sentence (zero state) | stream (contiguous BPTT)
    eval_batch_size: int = 64
    checkpoint_every: int = 1000
    keep_checkpoints: int = 0              # also keep the last N checkpoints in checkpoints/ (for elmo average)
    patience: int | None = None            # early stopping: evaluations without improvement
    init_from: str | None = None
    threads: int | None = None
    device: str = "auto"
    block_lines: int = 1_000_000
    progress: bool = True
    resume: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.train, str):
            self.train = [self.train]
        if isinstance(self.valid, str):
            self.valid = [self.valid]
        self.validate()

    def validate(self) -> None:
        def bad(msg: str) -> ElmoError:
            return ElmoError(f"train config: {msg}")

        if not self.train:
            raise bad("no training corpus given")
        if self.softmax not in ("auto", "full", "sampled", "adaptive"):
            raise bad(f"softmax must be auto, full, sampled or adaptive, got {self.softmax!r}")
        if self.batching not in ("stream", "sentence"):
            raise bad(f"batching must be stream or sentence, got {self.batching!r}")
        if self.eval_mode not in ("stream", "sentence"):
            raise bad(f"eval_mode must be stream or sentence, got {self.eval_mode!r}")
        if self.optimizer not in ("adagrad", "adam", "sgd"):
            raise bad(f"optimizer must be adagrad, adam or sgd, got {self.optimizer!r}")
        if self.batch_tokens is not None:
            self.batch_size = None
        if self.batch_size is None and self.batch_tokens is None:
            raise bad("give batch_size or batch_tokens")
        for name in ("batch_size", "batch_tokens", "unroll", "grad_accum", "log_every", "eval_every",
                     "checkpoint_every", "eval_batch_size", "num_samples", "block_lines"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise bad(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.keep_checkpoints, int) or self.keep_checkpoints < 0:
            raise bad(f"keep_checkpoints must be a non-negative integer, got {self.keep_checkpoints!r}")
        if self.max_steps is not None and self.max_steps < 0:
            raise bad(f"max_steps must be >= 0, got {self.max_steps}")
        if self.max_steps is None and self.epochs is None:
            raise bad("give max_steps or epochs (or both)")
        if not 0.0 <= self.dropout < 1.0:
            raise bad(f"dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.weight_drop < 1.0:
            raise bad(f"weight_drop must be in [0, 1), got {self.weight_drop}")
        if self.lr is not None and not self.lr > 0:
            raise bad(f"lr must be positive, got {self.lr}")
        if not 0.0 <= self.state_reset <= 1.0:
            raise bad(f"state_reset must be in [0, 1], got {self.state_reset}")
        if not 0 < self.lr_decay <= 1:
            raise bad(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise bad(f"lr_schedule must be constant, linear or cosine, got {self.lr_schedule!r}")
        if self.lr_schedule != "constant" and self.max_steps is None:
            raise bad(f"lr_schedule {self.lr_schedule} decays to 0 at max_steps: give max_steps")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise bad(f"warmup_steps must be a non-negative integer, got {self.warmup_steps!r}")

    def lr_factor(self, step: int) -> float:
        """The schedule's multiplier for the update after ``step`` finished steps (a pure function
        of the step, so a resumed run follows the same curve)."""
        f = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        if self.lr_schedule == "constant":
            return f
        frac = min(1.0, step / max(1, self.max_steps))
        decay = 1.0 - frac if self.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
        return f * decay

    @property
    def learning_rate(self) -> float:
        return self.lr if self.lr is not None else {"adagrad": 0.2, "adam": 1e-3, "sgd": 1.0}[self.optimizer]

    def regularisation(self) -> dict[str, Any]:
        """The LanguageModel keyword arguments for dropout and weight drop."""
        return {"dropout": self.dropout, "variational_dropout": self.variational_dropout,
                "weight_drop": self.weight_drop}

    def model_config(self) -> ElmoConfig:
        if self.model in TRAIN_PRESETS:
            return TRAIN_PRESETS[self.model]()
        path = Path(self.model)
        if path.is_file():
            return ElmoConfig.from_json_file(path)
        raise ElmoError(f"model {self.model!r}: neither a preset ({', '.join(TRAIN_PRESETS)}) nor an "
                        "options.json file")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "train config") -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ElmoError(f"{source}: unknown option {', '.join(unknown)}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ElmoError(f"{source}: {e}") from None


# ------------------------------------------------------------------------------------------------
# Distributed helpers
# ------------------------------------------------------------------------------------------------
@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def _setup_distributed(device: torch.device) -> DistEnv:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistEnv()
    env = DistEnv(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return env


def _pick_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    d = torch.device(cfg.device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
    return d


# ------------------------------------------------------------------------------------------------
# The trainer
# ------------------------------------------------------------------------------------------------
class Trainer:
    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] | None = None) -> None:
        self.out = Path(cfg.out_dir)
        ckpt_path = self.out / CHECKPOINT_NAME
        self.resumed: dict | None = None
        if cfg.resume and ckpt_path.is_file():
            self.resumed = _load_checkpoint(ckpt_path)
            saved = TrainConfig.from_dict(self.resumed["config"], str(ckpt_path))
            given = asdict(cfg)
            for k in RESUME_OVERRIDABLE:
                setattr(saved, k, given[k])
            saved.validate()
            cfg = saved
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = _pick_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
        self.env = _setup_distributed(self.device)
        self._log = log or (lambda s: print(s, file=sys.stderr, flush=True))

        # Vocabulary: given, or built from the training corpus (identically on every rank).
        if cfg.vocab is None:
            vocab = Vocabulary.build(cfg.train)
            cfg.vocab = str(self.out / "vocab.txt")
            if self.env.is_main:
                vocab.save(cfg.vocab)
        self.vocab = Vocabulary.from_file(cfg.vocab)

        torch.manual_seed(cfg.seed)  # the same initial parameters on every rank
        if self.resumed is not None:
            self.lm = lm_from_checkpoint(self.resumed, ckpt_path, self.vocab, load_weights=False)
        elif cfg.init_from:
            self.lm = LanguageModel.init_from(cfg.init_from, self.vocab, softmax=None if cfg.softmax == "auto"
                                              else cfg.softmax, num_samples=cfg.num_samples,
                                              log=self.log, **cfg.regularisation())
        else:
            self.lm = LanguageModel(cfg.model_config(), self.vocab, softmax=cfg.softmax,
                                    num_samples=cfg.num_samples, **cfg.regularisation())
        cfg.softmax = softmax_kind(self.lm.softmax)  # resolved, so that a resume rebuilds the same
        self.lm.to(self.device)
        self.optimizer = self._make_optimizer()
        self.batcher = self._make_batcher()
        self.state = None            # carried LSTM state (stream batching)
        self.step = 0
        self.tokens_seen = 0
        self.best = math.inf
        self.bad_evals = 0
        self.lr_scale = 1.0
        self.elapsed = 0.0
        self.last_checkpoint_step: int | None = None
        if self.resumed is not None:
            self._restore(self.resumed)
        else:
            torch.manual_seed(cfg.seed * 1000 + 1 + self.env.rank)  # dropout masks differ per rank
        self.model: torch.nn.Module = self.lm
        if self.env.active:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.model = DDP(self.lm, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                             # the adaptive softmax skips the tail clusters no target falls in
                             find_unused_parameters=isinstance(self.lm.softmax, AdaptiveSoftmax))

    def log(self, msg: str) -> None:
        if self.env.is_main:
            self._log(msg)

    # -- pieces ----------------------------------------------------------------------------------
    def _make_optimizer(self) -> torch.optim.Optimizer:
        cfg, params = self.cfg, self.lm.parameters()
        if cfg.optimizer == "adagrad":
            return torch.optim.Adagrad(params, lr=cfg.learning_rate, initial_accumulator_value=cfg.adagrad_init,
                                       weight_decay=cfg.weight_decay)
        if cfg.optimizer == "adam":
            return torch.optim.Adam(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        return torch.optim.SGD(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

    def _make_batcher(self):
        cfg, env = self.cfg, self.env
        corpus = Corpus(cfg.train, shuffle=True, seed=cfg.seed, block_lines=cfg.block_lines)
        if cfg.batching == "stream":
            rows = cfg.batch_size if cfg.batch_size is not None else max(1, cfg.batch_tokens // cfg.unroll)
            if rows % env.world_size:
                raise ElmoError(f"stream batching: {rows} rows cannot be split evenly over "
                                f"{env.world_size} ranks")
            return StreamBatcher(corpus, self.vocab, rows, cfg.unroll, env.rank, env.world_size, cfg.epochs)
        return SentenceBatcher(corpus, self.vocab, cfg.batch_size, cfg.batch_tokens, env.rank, env.world_size,
                               cfg.epochs, shuffle=True, seed=cfg.seed)

    def _eval_batches(self):
        cfg = self.cfg
        corpus = Corpus(cfg.valid, shuffle=False)
        if cfg.eval_mode == "stream":
            return StreamBatcher(corpus, self.vocab, cfg.eval_batch_size, cfg.unroll, contiguous=True), True
        return SentenceBatcher(corpus, self.vocab, batch_size=cfg.eval_batch_size, epochs=1, shuffle=False), False

    def evaluate(self) -> dict:
        batches, stateful = self._eval_batches()
        return self.lm.evaluate(batches, stateful=stateful)

    # -- checkpoints -----------------------------------------------------------------------------
    def _gather_state(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        if self.state is None:
            return None
        local = [(c.float().cpu(), h.float().cpu()) for c, h in self.state]
        if not self.env.active:
            return local
        out = []
        for c, h in self.state:
            cs = [torch.empty_like(c) for _ in range(self.env.world_size)]
            hs = [torch.empty_like(h) for _ in range(self.env.world_size)]
            dist.all_gather(cs, c.contiguous())
            dist.all_gather(hs, h.contiguous())
            out.append((torch.cat(cs, 1).float().cpu(), torch.cat(hs, 1).float().cpu()))
        return out

    def _gather_rng(self) -> list:
        mine = {"torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None}
        if not self.env.active:
            return [mine]
        allr: list = [None] * self.env.world_size
        dist.all_gather_object(allr, mine)
        return allr

    def save_checkpoint(self) -> None:
        state = self._gather_state()
        rng = self._gather_rng()
        self.last_checkpoint_step = self.step  # on every rank: they must agree on collectives
        if not self.env.is_main:
            return
        ckpt = {
            "version": 1, "config": asdict(self.cfg), "step": self.step, "tokens_seen": self.tokens_seen,
            "elapsed": self.elapsed, "world_size": self.env.world_size,
            "model": self.lm.state_dict(), "optimizer": self.optimizer.state_dict(),
            "data": self.batcher.state_dict(), "lstm_state": state, "rng": rng,
            "best": self.best, "bad_evals": self.bad_evals, "lr_scale": self.lr_scale,
            "model_options": self.lm.bilm.config.to_options(),
            "cutoffs": getattr(self.lm.softmax, "cutoffs", None),
        }
        with atomic_path(self.out / CHECKPOINT_NAME) as tmp:
            torch.save(ckpt, tmp)
        self.last_checkpoint_step = self.step
        if self.cfg.keep_checkpoints:
            self._keep_checkpoint()

    def _keep_checkpoint(self) -> None:
        """A hard link to the checkpoint just written (no copy: the next one replaces the name
        checkpoint.pt, not the file), then the oldest kept ones beyond keep_checkpoints go."""
        kept = self.out / KEPT_DIR
        kept.mkdir(exist_ok=True)
        name = kept / f"step-{self.step:08d}.pt"
        name.unlink(missing_ok=True)  # a resumed run rewrites the steps after its checkpoint
        try:
            os.link(self.out / CHECKPOINT_NAME, name)
        except OSError:  # a file system without hard links
            with atomic_path(name) as tmp:
                tmp.write_bytes((self.out / CHECKPOINT_NAME).read_bytes())
        for old in sorted(kept.glob("step-*.pt"))[:-self.cfg.keep_checkpoints]:
            old.unlink()

    def _restore(self, ckpt: dict) -> None:
        self.lm.load_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.batcher.load_state_dict(ckpt["data"])
        self.step, self.tokens_seen, self.elapsed = ckpt["step"], ckpt["tokens_seen"], ckpt["elapsed"]
        self.best, self.bad_evals, self.lr_scale = ckpt["best"], ckpt["bad_evals"], ckpt["lr_scale"]
        self.last_checkpoint_step = self.step
        if ckpt["lstm_state"] is not None:
            rows = self.batcher.rows
            self.state = [(c[:, rows.start:rows.stop].to(self.device), h[:, rows.start:rows.stop].to(self.device))
                          for c, h in ckpt["lstm_state"]]
        rng = ckpt["rng"]
        if ckpt["world_size"] == self.env.world_size:
            mine = rng[self.env.rank]
            torch.set_rng_state(mine["torch"])
            random.setstate(mine["python"])
            if mine.get("cuda") is not None and self.device.type == "cuda":
                torch.cuda.set_rng_state(mine["cuda"], self.device)
        else:
            self.log(f"resume: the checkpoint was written by {ckpt['world_size']} ranks, this run has "
                     f"{self.env.world_size}; dropout RNG streams are reseeded (the data continues exactly)")
            torch.manual_seed(self.cfg.seed * 1000 + 1 + self.env.rank + 7919 * self.step)
        self._set_lr()
        self.log(f"resumed from {self.out / CHECKPOINT_NAME} at step {self.step}")

    def _set_lr(self) -> None:
        lr = self.cfg.learning_rate * self.lr_scale * self.cfg.lr_factor(self.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    # -- metrics ---------------------------------------------------------------------------------
    def _open_metrics(self):
        if not self.env.is_main:
            return None
        path = self.out / METRICS_NAME
        if self.resumed is not None and path.is_file():
            # Drop what was logged after the checkpoint: those steps are recomputed now.
            keep = [ln for ln in path.read_text().splitlines()
                    if ln.strip() and json.loads(ln).get("step", 0) <= self.step]
            with atomic_path(path) as tmp:
                tmp.write_text("".join(ln + "\n" for ln in keep))
        elif self.resumed is None:
            path.write_text("")
        return open(path, "a", encoding="utf-8")

    def _tensorboard(self):
        if not self.env.is_main:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # tensorboard not installed
            return None
        return SummaryWriter(str(self.out / "tensorboard"))

    def _record(self, metrics_file, tb, entry: dict) -> None:
        if metrics_file is None:
            return
        metrics_file.write(json.dumps(entry) + "\n")
        metrics_file.flush()
        if tb is not None:
            for k, v in entry.items():
                if k != "step" and isinstance(v, (int, float)):
                    tb.add_scalar(k, v, entry["step"])

    # -- the loop --------------------------------------------------------------------------------
    def _next_micro_batches(self) -> list | None:
        out = []
        for _ in range(self.cfg.grad_accum):
            try:
                out.append(next(self.batcher))
            except StopIteration:
                break
        return out or None

    def _sampler(self, micro: int) -> torch.Generator:
        # The same negatives on every rank, and after a resume.
        g = torch.Generator()
        g.manual_seed((self.cfg.seed * 1_000_003 + self.step * 64 + micro) % (2**63))
        return g

    def train_step(self, micro: list) -> tuple[float, int]:
        """One optimizer step over ``micro`` batches; returns (global loss, global targets)."""
        cfg, env = self.cfg, self.env
        n_global = sum(b.global_targets for b in micro)
        local = torch.zeros(2, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
        for i, b in enumerate(micro):
            b = b.to(self.device)
            if cfg.state_reset > 0 and self.state is not None:
                self._reset_some_rows(i)
            sync = contextlib.nullcontext() if (not env.active or i == len(micro) - 1) else self.model.no_sync()
            with sync:
                with autocast:
                    sums, final = self.model(b.char_ids, b.token_index, b.targets, b.lengths, self.state,
                                             self._sampler(i))
                loss = 0.5 * sums.float().sum() * (env.world_size / n_global)
                loss.backward()
            local += sums.detach().double().cpu()
            if cfg.batching == "stream":
                self.state = [(c.detach().float(), h.detach().float()) for c, h in final]
        if env.active:
            dist.all_reduce(local)
        loss_value = 0.5 * float(local.sum()) / n_global
        grad_norm = torch.nn.utils.clip_grad_norm_(self.lm.parameters(), cfg.clip_norm)
        if not math.isfinite(loss_value) or not torch.isfinite(grad_norm):
            where = (f"the last good checkpoint is {self.out / CHECKPOINT_NAME} (step "
                     f"{self.last_checkpoint_step})" if self.last_checkpoint_step is not None
                     else "no checkpoint was written yet")
            what = "loss" if not math.isfinite(loss_value) else "gradient norm"
            raise ElmoError(f"training stopped: the {what} is {loss_value if what == 'loss' else float(grad_norm)} "
                            f"at step {self.step + 1}; {where}. Lower the learning rate (--lr) or resume "
                            "from the checkpoint with --resume")
        self._set_lr()
        self.optimizer.step()
        return loss_value, n_global

    def _reset_some_rows(self, micro: int) -> None:
        # The same draw on every rank (over the global rows) and after a resume.
        g = torch.Generator().manual_seed((self.cfg.seed * 7_919 + self.step * 64 + micro + 1) % (2**63))
        rows = self.batcher.rows
        keep = (torch.rand(self.batcher.batch_size, generator=g) >= self.cfg.state_reset)[rows.start:rows.stop]
        keep = keep.to(self.device).view(1, -1, 1)
        self.state = [(c * keep, h * keep) for c, h in self.state]

    def _should_stop(self) -> bool:
        return self.cfg.max_steps is not None and self.step >= self.cfg.max_steps

    def run(self) -> dict:
        cfg, env = self.cfg, self.env
        if env.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            with atomic_path(self.out / TRAIN_CONFIG_NAME) as tmp:
                tmp.write_text(json.dumps(asdict(cfg), indent=2) + "\n")
        n_params = self.lm.num_parameters()
        self.log(f"elmo train: {n_params:,} parameters ({self.lm.bilm.config.lstm_dim}/"
                 f"{self.lm.bilm.config.projection_dim} LSTM, {type(self.lm.softmax).__name__} over "
                 f"{len(self.vocab):,} types), {env.world_size} rank(s) on {self.device}, "
                 f"{cfg.batching} batches, {cfg.optimizer} lr {cfg.learning_rate}")
        metrics, tb = self._open_metrics(), self._tensorboard()
        bar = None
        if env.is_main and cfg.progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=cfg.max_steps, initial=self.step, unit="step", dynamic_ncols=True,
                       mininterval=1.0, disable=None)
        window_loss, window_tokens, window_t0 = 0.0, 0, time.perf_counter()
        stopped_early = False
        last_eval: dict | None = None
        try:
            while not self._should_stop():
                t0 = time.perf_counter()
                micro = self._next_micro_batches()
                if micro is None:
                    break  # the requested epochs are done
                loss, ntok = self.train_step(micro)
                self.step += 1
                self.tokens_seen += ntok
                self.elapsed += time.perf_counter() - t0
                window_loss += loss * ntok
                window_tokens += ntok
                if bar is not None:
                    bar.update(1)
                if self.step % cfg.log_every == 0 or self._should_stop():
                    dt = time.perf_counter() - window_t0
                    avg = window_loss / max(1, window_tokens)
                    entry = {"step": self.step, "epoch": self.batcher.epoch, "loss": avg,
                             "ppl": math.exp(min(avg, 50.0)), "tokens_per_s": window_tokens / max(dt, 1e-9),
                             "lr": self.optimizer.param_groups[0]["lr"], "tokens": self.tokens_seen,
                             "time": round(self.elapsed, 2)}
                    self._record(metrics, tb, entry)
                    if bar is not None:
                        bar.set_postfix(tok_s=f"{entry['tokens_per_s']:.0f}", loss=f"{avg:.3f}",
                                        ppl=f"{entry['ppl']:.1f}", refresh=False)
                    if bar is None or bar.disable:
                        self.log(f"step {self.step} epoch {entry['epoch']} loss {avg:.4f} ppl {entry['ppl']:.2f} "
                                 f"{entry['tokens_per_s']:.0f} tok/s lr {entry['lr']:.3g}")
                    window_loss, window_tokens, window_t0 = 0.0, 0, time.perf_counter()
                if cfg.valid and self.step % cfg.eval_every == 0:
                    last_eval = self._validate(metrics, tb)
                    stopped_early = self._early_stop_decision()
                if self.step % cfg.checkpoint_every == 0 or stopped_early:
                    self.save_checkpoint()
                if stopped_early:
                    self.log(f"early stopping at step {self.step}: no improvement in {cfg.patience} evaluations")
                    break
            # The end: a final validation, checkpoint and the model directories.
            if cfg.valid and (last_eval is None or last_eval["step"] != self.step):
                last_eval = self._validate(metrics, tb)
            if self.last_checkpoint_step != self.step:
                self.save_checkpoint()
            if env.is_main:
                extra = {"train": {"steps": self.step, "tokens": self.tokens_seen, "seconds": round(self.elapsed, 1),
                                   "config": asdict(cfg)}}
                self.lm.save_pretrained(self.out / "model", extra=extra)
                self.lm.bilm.export_published(self.out / "published")
                if not (self.out / "best").is_dir():  # no validation set: best = final
                    self.lm.save_pretrained(self.out / "best", extra=extra)
        finally:
            if bar is not None:
                bar.close()
            if metrics is not None:
                metrics.close()
            if tb is not None:
                tb.close()
        summary = {"steps": self.step, "tokens": self.tokens_seen, "seconds": round(self.elapsed, 1),
                   "parameters": n_params, "best_valid_ppl_mean": None if math.isinf(self.best) else self.best,
                   "valid": last_eval, "out_dir": str(self.out)}
        self.log(f"done: {json.dumps(summary)}")
        return summary

    def _validate(self, metrics, tb) -> dict | None:
        result: dict | None = None
        if self.env.is_main:
            t0 = time.perf_counter()
            r = self.evaluate()
            result = {"step": self.step, "valid_ppl_forward": r["ppl_forward"], "valid_ppl_backward": r["ppl_backward"],
                      "valid_ppl_mean": r["ppl_mean"], "valid_tokens": r["tokens"],
                      "valid_seconds": round(time.perf_counter() - t0, 1)}
            self._record(metrics, tb, result)
            self.log(f"step {self.step} validation ppl forward {r['ppl_forward']:.2f} backward "
                     f"{r['ppl_backward']:.2f} mean {r['ppl_mean']:.2f}")
            improved = r["ppl_mean"] < self.best
            if improved:
                self.best = r["ppl_mean"]
                self.bad_evals = 0
                self.lm.save_pretrained(self.out / "best", extra={"train": {"steps": self.step, "valid": result}})
            else:
                self.bad_evals += 1
                if self.cfg.lr_decay < 1.0:
                    self.lr_scale *= self.cfg.lr_decay
                    self.log(f"validation did not improve: lr x {self.cfg.lr_decay} -> "
                             f"{self.cfg.learning_rate * self.lr_scale:.3g}")
        if self.env.active:
            obj = [(self.best, self.bad_evals, self.lr_scale)]
            dist.broadcast_object_list(obj, src=0)
            self.best, self.bad_evals, self.lr_scale = obj[0]
        self._set_lr()
        return result

    def _early_stop_decision(self) -> bool:
        return self.cfg.patience is not None and self.bad_evals >= self.cfg.patience


def lm_from_checkpoint(ckpt: dict, path: str | Path, vocab: Vocabulary | None = None,
                       load_weights: bool = True) -> LanguageModel:
    """The LM of a training checkpoint (as :func:`_load_checkpoint` returns it), built as its run
    built it; ``vocab`` defaults to the run's vocabulary file."""
    if not isinstance(ckpt, dict) or not {"model", "model_options", "config"} <= set(ckpt):
        raise ElmoError(f"{path}: not an elmo training checkpoint")
    cfg = TrainConfig.from_dict(ckpt["config"], str(path))
    if vocab is None:
        if not Path(cfg.vocab or "").is_file():
            raise ElmoError(f"{path}: its vocabulary {cfg.vocab} (from the run's config) is missing")
        vocab = Vocabulary.from_file(cfg.vocab)
    lm = LanguageModel(ElmoConfig.from_options(ckpt["model_options"], str(path)), vocab, softmax=cfg.softmax,
                       num_samples=cfg.num_samples, cutoffs=ckpt.get("cutoffs"), **cfg.regularisation())
    if load_weights:
        try:
            lm.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise ElmoError(f"{path}: parameters do not fit the checkpoint's own config ({e})") from None
    return lm


def _load_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a checkpoint is only ever replaced atomically, so this is a foreign file
        raise ElmoError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from None


def train(cfg: TrainConfig, log: Callable[[str], None] | None = None) -> dict:
    """Train (or resume) per ``cfg``; returns a summary. Call from every rank under torchrun."""
    trainer = Trainer(cfg, log)
    distributed = trainer.env.active
    try:
        return trainer.run()
    finally:
        if distributed and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.barrier()  # rank 0 writes the model dirs last
            # The DDP reducer holds the process group: free it now, not at interpreter shutdown,
            # where gloo's threads can be torn down unjoined (a SIGABRT after a finished run,
            # seen once in CI).
            del trainer
            gc.collect()
            dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------
# CLI: elmo vocab, elmo train, elmo perplexity
# ------------------------------------------------------------------------------------------------
def _add_train_args(p: argparse.ArgumentParser) -> None:
    S = argparse.SUPPRESS
    d = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    g = p.add_argument_group("data")
    g.add_argument("--train", nargs="+", default=S, metavar="FILE", help="training corpus files or globs")
    g.add_argument("--valid", nargs="+", default=S, metavar="FILE", help="validation files")
    g.add_argument("--vocab", default=S, help="vocabulary file (default: built from --train into OUT/vocab.txt)")
    g.add_argument("--out", dest="out_dir", default=S, help="run directory")
    g.add_argument("--config", default=S, help="a JSON file of TrainConfig fields (flags override it)")
    g.add_argument("--batching", choices=["stream", "sentence"], default=S, help=f"default {d['batching']}")
    g.add_argument("--batch-size", type=int, default=S, help=f"global rows/sentences per step (default {d['batch_size']})")
    g.add_argument("--batch-tokens", type=int, default=S, help="global tokens per step (instead of --batch-size)")
    g.add_argument("--unroll", type=int, default=S, help=f"BPTT window (default {d['unroll']})")
    g.add_argument("--state-reset", type=float, default=S,
                   help="stream batching: probability per row and window of restarting from the zero "
                        "state (default 0, the original; >0 keeps the LM sane from a zero state)")
    g = p.add_argument_group("model")
    g.add_argument("--model", default=S, help=f"preset ({', '.join(TRAIN_PRESETS)}) or options.json "
                                              f"(default {d['model']})")
    g.add_argument("--softmax", choices=["auto", "full", "sampled", "adaptive"], default=S)
    g.add_argument("--num-samples", type=int, default=S, help=f"sampled softmax negatives (default {d['num_samples']})")
    g.add_argument("--dropout", type=float, default=S, help=f"default {d['dropout']}")
    g.add_argument("--variational-dropout", action="store_true", default=S,
                   help="one dropout mask per window, shared over time (default: a mask per step)")
    g.add_argument("--weight-drop", type=float, default=S,
                   help="DropConnect on the LSTM recurrent matrices, as AWD-LSTM (default 0)")
    g.add_argument("--init-from", default=S, help="start from this model (LM dir, native or published biLM)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--optimizer", choices=["adagrad", "adam", "sgd"], default=S)
    g.add_argument("--lr", type=float, default=S, help="default 0.2 adagrad, 1e-3 adam, 1.0 sgd")
    g.add_argument("--lr-decay", type=float, default=S, help="lr factor when validation does not improve")
    g.add_argument("--lr-schedule", choices=["constant", "linear", "cosine"], default=S,
                   help="decay the lr to 0 at --max-steps (default constant)")
    g.add_argument("--warmup-steps", type=int, default=S, help="linear lr warm-up (default 0)")
    g.add_argument("--weight-decay", type=float, default=S)
    g.add_argument("--clip-norm", type=float, default=S, help=f"default {d['clip_norm']}")
    g.add_argument("--grad-accum", type=int, default=S)
    g.add_argument("--bf16", action="store_true", default=S, help="bfloat16 autocast")
    g.add_argument("--seed", type=int, default=S)
    g.add_argument("--max-steps", type=int, default=S)
    g.add_argument("--epochs", type=int, default=S)
    g = p.add_argument_group("run")
    g.add_argument("--log-every", type=int, default=S)
    g.add_argument("--eval-every", type=int, default=S)
    g.add_argument("--eval-mode", choices=["sentence", "stream"], default=S)
    g.add_argument("--eval-batch-size", type=int, default=S)
    g.add_argument("--checkpoint-every", type=int, default=S)
    g.add_argument("--keep-checkpoints", type=int, default=S, metavar="N",
                   help="also keep the last N checkpoints in OUT/checkpoints/ (to average with elmo average)")
    g.add_argument("--patience", type=int, default=S, help="early stopping after N evaluations without improvement")
    g.add_argument("--threads", type=int, default=S)
    g.add_argument("--device", default=S, help="auto, cpu, cuda, cuda:1 ...")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=S)
    g.add_argument("--resume", action="store_true", default=S,
                   help="continue from OUT/checkpoint.pt if there is one (else start)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = {k: v for k, v in vars(args).items() if k not in ("func", "command", "config")}
    base: dict[str, Any] = {}
    if getattr(args, "config", None):
        try:
            base = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ElmoError(f"{args.config}: cannot read train config ({e})") from None
    merged = {**base, **given}
    out = merged.get("out_dir")
    if merged.get("resume") and out and (Path(out) / CHECKPOINT_NAME).is_file():
        # Everything else comes from the checkpoint; keep only the overridable flags given.
        saved = _load_checkpoint(Path(out) / CHECKPOINT_NAME)["config"]
        merged = {**saved, **{k: v for k, v in merged.items() if k in RESUME_OVERRIDABLE}}
    if "out_dir" not in merged:
        raise ElmoError("--out is required")
    if "train" not in merged:
        raise ElmoError("--train is required")
    return TrainConfig.from_dict(merged, args.config if getattr(args, "config", None) else "elmo train")


def _run_train(args) -> int:
    train(config_from_args(args))
    return 0


def _run_vocab(args) -> int:
    vocab = Vocabulary.build(args.corpus, min_count=args.min_count, max_size=args.max_size)
    vocab.save(args.output, with_counts=args.counts)
    counts = vocab.counts or []
    total = sum(counts[1:]) if counts else 0
    covered = total - (counts[2] if counts else 0)
    print(f"{args.output}: {len(vocab):,} entries (incl. <S> </S> <UNK>); the vocabulary covers "
          f"{covered / max(1, total):.2%} of {total:,} target tokens", file=sys.stderr)
    return 0


def _run_perplexity(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = LanguageModel.from_pretrained(args.model)
    corpus = Corpus(args.files, shuffle=False)
    if args.mode == "stream":
        batches, stateful = StreamBatcher(corpus, lm.vocab, args.batch_size, args.unroll, contiguous=True), True
    else:
        batches, stateful = SentenceBatcher(corpus, lm.vocab, batch_size=args.batch_size, epochs=1,
                                            shuffle=False), False
    r = lm.evaluate(batches, stateful=stateful)
    r = {"model": str(args.model), "files": [str(f) for f in corpus.files], "mode": args.mode,
         "params": lm.num_parameters(), **r}
    text = json.dumps(r, indent=2)
    print(text)
    if args.json:
        with atomic_path(args.json) as tmp:
            tmp.write_text(text + "\n")
    return 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("vocab", help="build a vocabulary file from a corpus")
    p.add_argument("corpus", nargs="+", help="files or globs, one sentence per line")
    p.add_argument("-o", "--output", required=True, help="vocabulary file to write")
    p.add_argument("--min-count", type=int, default=1, help="keep tokens seen at least this often")
    p.add_argument("--max-size", type=int, default=None, help="at most this many entries (specials included)")
    p.add_argument("--counts", action="store_true", help="write 'token<TAB>count' lines")
    p.set_defaults(func=_run_vocab)

    p = sub.add_parser("train", help="train a biLM (torchrun for many processes)")
    _add_train_args(p)
    p.set_defaults(func=_run_train)

    p = sub.add_parser("perplexity", help="perplexity of an LM on text (both directions)")
    p.add_argument("model", help="an LM directory written by elmo train (e.g. RUN/best)")
    p.add_argument("files", nargs="+", help="files or globs, one sentence per line")
    p.add_argument("--mode", choices=["sentence", "stream"], default="sentence",
                   help="sentence: each sentence from a zero state; stream: the text as contiguous "
                        "streams with carried state (as word-level LM papers)")
    p.add_argument("--batch-size", type=int, default=64, help="sentences (sentence) or streams (stream)")
    p.add_argument("--unroll", type=int, default=20)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None, help="also write the result to this file")
    p.set_defaults(func=_run_perplexity)
