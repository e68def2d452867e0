"""The training checkpoint: one file that holds everything a run needs to continue exactly.

``RUN/checkpoint.pt`` (``torch.save`` of a dict, replaced atomically)::

    version          1
    config           the TrainConfig as a dict (resuming needs nothing else)
    model_options    the biLM's published options; cutoffs: the adaptive softmax's, or None
    model            the LM's state dict; optimizer: the optimizer's
    data             the batcher's position (see torchelmo.lm.data)
    lstm_state       the carried LSTM state of all global rows, per layer (c, h), or None
    rng              per rank: torch, python and CUDA generator states
    world_size       ranks that wrote it
    step, tokens_seen, elapsed, best, bad_evals, lr_scale     see Progress

A model the run saves (``best/``, ``model/``) records in its ``training.json`` what continuing
the run from it needs (:func:`continuation`): the configuration, the progress and the data
position. ``elmo train --continue-from DIR`` goes on from there when the checkpoints are lost;
inexactly: the optimizer's moments, the carried LSTM state and the dropout streams start afresh
(the learning rate warms up again), and weights stored in fp16 come back rounded.

``RUN/checkpoints/step-NNNNNNNN.pt`` keeps the last few (``keep_checkpoints``) for averaging.
``RUN/train.lock`` is the run's lock (:func:`hold_run_dir`): one trainer per directory.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import ElmoError
from ..io.fileio import GuardedWriter, atomic_path, check_path_name, lock_file, refused_global, write_error
from ..lm.model import EXTRA_CONFIG_NAME, LanguageModel, read_lm_meta
from ..lm.vocab import Vocabulary
from ..model import hub
from ..model.config import ElmoConfig
from ..model.folders import RUN_CONFIG_NAME, RUN_MODEL_DIRS
from .config import PER_INVOCATION, RESUME_OVERRIDABLE, TrainConfig
from .distributed import DistEnv, gather_lstm_state, gather_rng, restore_rng, seed_rngs
from .metrics import check_log

CHECKPOINT_NAME = "checkpoint.pt"
KEPT_DIR = "checkpoints"
FORMAT_VERSION = 1
REQUIRED_KEYS = {"model", "model_options", "config"}
# What resuming reads beyond REQUIRED_KEYS; a file without them can still be averaged or scored.
RESUME_KEYS = {"optimizer", "data", "lstm_state", "rng", "world_size", "step", "tokens_seen", "elapsed",
               "best", "bad_evals", "lr_scale"}
CONTINUE_KEY = "continue"   # in a saved model's training.json["train"]: see continuation()


@dataclass
class Progress:
    """Where a run stands, and its early-stopping and lr-decay bookkeeping."""

    step: int = 0
    tokens_seen: int = 0
    elapsed: float = 0.0
    best: float = math.inf          # best mean validation perplexity
    bad_evals: int = 0              # validations since the best one
    lr_scale: float = 1.0           # product of lr decays so far
    last_valid_step: int | None = None   # the step of the last validation
    rewarm_from: int | None = None       # continued from a saved model at this step (lr warms up again)


def make_checkpoint(cfg: TrainConfig, progress: Progress, lm: LanguageModel, optimizer: torch.optim.Optimizer,
                    data_state: dict, lstm_state: list | None, rng: list[dict], world_size: int) -> dict:
    return {
        "version": FORMAT_VERSION, "config": asdict(cfg), "step": progress.step,
        "tokens_seen": progress.tokens_seen, "elapsed": progress.elapsed, "world_size": world_size,
        "model": lm.state_dict(), "optimizer": optimizer.state_dict(), "data": data_state,
        "lstm_state": lstm_state, "rng": rng, "best": progress.best, "bad_evals": progress.bad_evals,
        "lr_scale": progress.lr_scale, "model_options": lm.bilm.config.to_options(),
        "cutoffs": getattr(lm.softmax, "cutoffs", None), "last_valid_step": progress.last_valid_step,
        "vocab_digest": lm.vocab.digest, "rewarm_from": progress.rewarm_from,
    }


def save_checkpoint(ckpt: dict, out_dir: str | Path) -> Path:
    """Write ``out_dir/checkpoint.pt`` atomically: a kill leaves the previous one intact."""
    path = Path(out_dir) / CHECKPOINT_NAME
    with atomic_path(path) as tmp:
        # Through a GuardedWriter: torch reports a failed write without its cause.
        out = GuardedWriter(tmp)
        try:
            torch.save(ckpt, out)
        except RuntimeError as e:
            if out.error is None:
                raise ElmoError(f"{path}: cannot write the checkpoint ({' '.join(str(e).split())[:160]})") from None
        finally:
            out.close()
        if out.error is not None:
            raise write_error(path, out.error, "cannot write the checkpoint, the previous one is kept")
    return path


def keep_checkpoint(out_dir: str | Path, step: int, keep: int) -> Path:
    """Keep the checkpoint just written as ``checkpoints/step-N.pt``, then drop all but the last
    ``keep``. A hard link, not a copy: the next save replaces the name checkpoint.pt, not the file."""
    out_dir = Path(out_dir)
    kept = out_dir / KEPT_DIR
    kept.mkdir(exist_ok=True)
    name = kept / f"step-{step:08d}.pt"
    name.unlink(missing_ok=True)  # a resumed run rewrites the steps after its checkpoint
    try:
        os.link(out_dir / CHECKPOINT_NAME, name)
    except OSError:  # a file system without hard links
        with atomic_path(name) as tmp:
            tmp.write_bytes((out_dir / CHECKPOINT_NAME).read_bytes())
    for old in sorted(kept.glob("step-*.pt"))[:-keep]:
        old.unlink()
    return name


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint as written by :func:`save_checkpoint`; anything else is an :class:`ElmoError`.

    Only tensors and plain data are unpickled (``weights_only``): a file that would run code or
    build other objects is refused, never executed."""
    path = Path(path)
    if path.is_dir():
        raise ElmoError(f"{path}: is a directory, not a checkpoint file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = refused_global(e)
        if found is None:   # not a pickle at all
            raise ElmoError(f"{path}: cannot read checkpoint (not a torch checkpoint file)") from None
        raise ElmoError(f"{path}: refused: holds Python objects ({found}) beyond tensors and plain "
                        "data; elmo loads only checkpoints it wrote") from None
    except Exception as e:  # a checkpoint is only ever replaced atomically, so this is a foreign file
        msg = " ".join(str(e).split())[:200]
        raise ElmoError(f"{path}: cannot read checkpoint ({type(e).__name__}: {msg})") from None
    if not isinstance(ckpt, dict) or not REQUIRED_KEYS <= set(ckpt):
        raise ElmoError(f"{path}: not an elmo training checkpoint")
    return ckpt


def resume_point(out_dir: str | Path | None, settings: dict[str, Any], strict: bool = False
                 ) -> tuple[dict[str, Any], dict | None]:
    """The configuration of a run resumed from ``out_dir/checkpoint.pt``, and that checkpoint.

    Everything comes from the checkpoint except the :data:`RESUME_OVERRIDABLE` fields of
    ``settings``. ``strict`` (``settings`` holds only what the user gave: flags, a config file):
    any other setting that differs from the run's is an error. Without a checkpoint (a first run
    under ``--resume``), ``settings`` as given and None.
    """
    path = Path(out_dir) / CHECKPOINT_NAME if out_dir else None
    if path is None or not path.exists():
        return settings, None
    ckpt = load_checkpoint(path)
    missing = sorted(RESUME_KEYS - set(ckpt))
    if missing:
        raise ElmoError(f"{path}: cannot resume from it: missing {', '.join(missing)}")
    if not isinstance(ckpt["config"], dict):
        raise ElmoError(f"{path}: its config is a {type(ckpt['config']).__name__}, not an object")
    check_resume_fields(ckpt, path)
    check_log(out_dir)
    kept = Path(out_dir) / KEPT_DIR
    if kept.exists() and (kept.is_symlink() or not kept.is_dir()):
        raise ElmoError(f"{kept}: not a directory (the run keeps its last checkpoints there); move it away to resume")
    # Any other setting the user gave must be the run's: a resumed run keeps them, and a changed
    # one would otherwise be dropped without a word.
    changed = changed_settings(ckpt["config"], settings) if strict else []
    if changed:
        raise ElmoError(f"{path}: a resumed run keeps its settings, but these differ: {'; '.join(changed)} "
                        f"(only {', '.join(sorted(RESUME_OVERRIDABLE - {'out_dir', 'resume'}))} may change)")
    merged = {**ckpt["config"], **{k: v for k, v in settings.items() if k in RESUME_OVERRIDABLE}}
    merged.update({k: settings.get(k, default) for k, default in PER_INVOCATION.items()})
    return merged, ckpt


def changed_settings(saved: dict[str, Any], given: dict[str, Any], unset: tuple = ("auto",)) -> list[str]:
    """The settings in ``given`` that a resumed or continued run cannot change but that differ from
    the run's ``saved`` ones, as ``name (old -> new)``. A given value in ``unset`` matches anything
    ("auto" is resolved when a run starts)."""
    fixed = set(given) - RESUME_OVERRIDABLE - set(PER_INVOCATION)
    return [f"{k} ({saved[k]!r} -> {given[k]!r})" for k in sorted(fixed)
            if k in saved and given[k] != saved[k] and given[k] not in unset]


# A checkpoint's counters, what each must be (a run of a trillion steps is beyond any machine).
MAX_COUNT = 10**12


def _whole(v: Any, hi: int = MAX_COUNT) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def progress_checks(p: dict) -> list[tuple[str, bool, str]]:
    """The counters of a run's progress (a checkpoint's, or a saved model's record of it), each as
    (name, whether it is of its type and in its range, what it must be)."""
    step = p.get("step")
    return [
        ("step", _whole(step), f"a whole number in 0..{MAX_COUNT:,}"),
        ("tokens_seen", _whole(p.get("tokens_seen"), MAX_COUNT * 10**6), "a whole number >= 0"),
        ("elapsed", _real(p.get("elapsed")) and 0 <= p["elapsed"] < math.inf, "finite seconds >= 0"),
        ("best", _real(p.get("best")) and p["best"] >= 1, "a perplexity >= 1 (inf before any validation)"),
        ("bad_evals", _whole(p.get("bad_evals")), "a whole number >= 0"),
        ("lr_scale", _real(p.get("lr_scale")) and 0 < p["lr_scale"] < math.inf, "a finite number > 0"),
        ("last_valid_step", p.get("last_valid_step") is None
         or (_whole(p["last_valid_step"]) and _whole(step) and p["last_valid_step"] <= step),
         "None or a step no later than the checkpoint's"),
        ("rewarm_from", p.get("rewarm_from") is None
         or (_whole(p["rewarm_from"]) and _whole(step) and p["rewarm_from"] <= step),
         "None or a step no later than the checkpoint's"),
    ]


def check_resume_fields(ckpt: dict, path: str | Path) -> None:
    """A checkpoint read as untrusted input: every field resuming uses, of its type and in its
    range, or one line naming the field."""
    checks = progress_checks(ckpt) + [
        ("world_size", _whole(ckpt["world_size"], 1 << 20) and ckpt["world_size"] >= 1, "a whole number >= 1"),
        ("rng", isinstance(ckpt["rng"], list) and all(
            isinstance(r, dict) and isinstance(r.get("torch"), torch.Tensor) and r["torch"].dtype == torch.uint8
            and isinstance(r.get("python"), tuple) for r in ckpt["rng"]),
         "a list of per-rank generator states (torch: a uint8 tensor, python: random.getstate())"),
        ("lstm_state", ckpt["lstm_state"] is None or (isinstance(ckpt["lstm_state"], list) and all(
            isinstance(pair, (tuple, list)) and len(pair) == 2
            and all(isinstance(t, torch.Tensor) and t.is_floating_point() and t.dim() == 3 for t in pair)
            for pair in ckpt["lstm_state"])),
         "None or per layer a pair (c, h) of float tensors (2, rows, dim)"),
    ]
    for name, ok, what in checks:
        if not ok:
            value = ckpt.get(name)
            shown = "malformed" if isinstance(value, (list, tuple, dict, torch.Tensor)) else repr(value)[:60]
            raise ElmoError(f"{path}: cannot resume from it: {name} is {shown}, not {what} (the file is damaged)")


# What a run writes into its directory; a new run there would mix with or silently replace it.
RUN_FILES = (CHECKPOINT_NAME, KEPT_DIR, "metrics.jsonl", RUN_CONFIG_NAME, *RUN_MODEL_DIRS, "published",
             "tensorboard")


LOCK_NAME = "train.lock"


@contextlib.contextmanager
def hold_run_dir(out_dir: str | Path) -> Iterator[None]:
    """Hold ``out_dir``'s lock for the life of the block: the writer's lock of
    :func:`torchelmo.io.fileio.lock_file` on ``out_dir/train.lock``, which the kernel releases
    however the holder ends (a lock file left by a dead process blocks nothing). Another trainer,
    fresh or resuming, is refused in one line naming the process that holds it. The directory is
    made if need be, and removed again if the block fails before anything but the lock is in it.
    Where such locks are unavailable (not Linux) nothing is locked."""
    out = Path(out_dir)
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        raise ElmoError(f"{out / LOCK_NAME}: cannot open the run's lock ({e.strerror or e})") from None
    try:
        taken = lock_file(fd)
        if taken is False:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise ElmoError(f"{out}: another elmo train (pid {holder}) is using this run directory; "
                            "wait for it to end, or stop it, before starting or resuming a run here")
        if taken:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        yield
    except BaseException:
        if made and [p.name for p in out.iterdir()] == [LOCK_NAME]:   # nothing of a run: as it was
            (out / LOCK_NAME).unlink()
            out.rmdir()
        raise
    finally:
        os.close(fd)          # releases the lock


# What a run killed before its first checkpoint leaves, and a new run rewrites from the start.
RUN_LOGS = ("metrics.jsonl", "train_config.json", "tensorboard")


def claim_run_dir(out_dir: str | Path, overwrite: bool, resume: bool = False, delete: bool = True) -> None:
    """Make sure a new run may start in ``out_dir``: refuse one that holds a run (unless
    ``overwrite``, which deletes that run's files when ``delete``) or a model. ``resume`` (asked
    to resume, and there is no checkpoint): the logs of a run killed before its first checkpoint
    are no obstacle; they are rewritten."""
    out = Path(out_dir)
    if not out.is_dir():
        return
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        raise ElmoError(f"{out}: holds a model, not a training run; give another --out")
    found = [name for name in RUN_FILES if (out / name).exists() and not (resume and name in RUN_LOGS)]
    if not found:
        return
    if not overwrite:
        raise ElmoError(f"{out}: holds a training run ({', '.join(found)}); continue it with --resume, or "
                        "start over with --overwrite (which deletes that run)")
    if delete:
        import shutil
        for name in found:
            p = out / name
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def restore(ckpt: dict, lm: LanguageModel, optimizer: torch.optim.Optimizer, batcher,
            path: str | Path = CHECKPOINT_NAME, new_data: bool = False) -> Progress:
    """Load the model, optimizer and data position (``new_data``: the next epoch's start on the
    current files); returns the run's progress."""
    try:
        lm.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        batcher.load_state_dict(ckpt["data"], new_data=new_data, where=str(path))
        return Progress(int(ckpt["step"]), int(ckpt["tokens_seen"]), float(ckpt["elapsed"]), float(ckpt["best"]),
                        int(ckpt["bad_evals"]), float(ckpt["lr_scale"]), ckpt.get("last_valid_step"),
                        ckpt.get("rewarm_from"))
    except ElmoError:
        raise   # already one line naming what is wrong (a changed corpus)
    except (RuntimeError, ValueError, TypeError, KeyError, AttributeError) as e:
        msg = " ".join(str(e).split())[:200]
        raise ElmoError(f"{path}: does not fit the run it configures ({type(e).__name__}: {msg})") from None


class Checkpointer:
    """A run's checkpoints: every rank gathers its part, rank 0 writes ``OUT/checkpoint.pt`` (and
    keeps the last ``keep_checkpoints``); a resumed run restores everything from one."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, device: torch.device, out: Path,
                 log: Callable[[str], None]) -> None:
        self.cfg, self.env, self.device, self.out, self.log = cfg, env, device, out, log
        self.path = out / CHECKPOINT_NAME
        self.last_step: int | None = None     # of the last checkpoint written or restored

    def save(self, progress: Progress, lm: LanguageModel, optimizer: torch.optim.Optimizer, batcher,
             state: list | None) -> None:
        lstm_state = gather_lstm_state(state, self.env)
        rng = gather_rng(self.env, self.device)
        self.last_step = progress.step  # on every rank: they must agree on collectives
        if not self.env.is_main:
            return
        ckpt = make_checkpoint(self.cfg, progress, lm, optimizer, batcher.state_dict(), lstm_state, rng,
                               self.env.world_size)
        save_checkpoint(ckpt, self.out)
        if self.cfg.keep_checkpoints:
            keep_checkpoint(self.out, progress.step, self.cfg.keep_checkpoints)

    def restore(self, ckpt: dict, lm: LanguageModel, optimizer: torch.optim.Optimizer, batcher
                ) -> tuple[Progress, list | None]:
        """The run's progress and this rank's rows of the carried LSTM state; the model,
        optimizer, data position and RNGs restored in place."""
        cfg, env = self.cfg, self.env
        progress = restore(ckpt, lm, optimizer, batcher, self.path, new_data=cfg.new_data)
        if cfg.new_data:
            self.log(f"resume: new data: epoch {batcher.epoch} starts on the current training files "
                     "(model, optimizer and schedule continue)")
        self.last_step = progress.step
        state = None
        if ckpt["lstm_state"] is not None:
            rows = batcher.rows
            state = [(c[:, rows.start:rows.stop].to(self.device), h[:, rows.start:rows.stop].to(self.device))
                     for c, h in ckpt["lstm_state"]]
        try:
            same_ranks = restore_rng(ckpt, env.rank, env.world_size, self.device)
        except (RuntimeError, TypeError, ValueError, IndexError) as e:   # a state torch or random refuses
            msg = " ".join(str(e).split())[:160]
            raise ElmoError(f"{self.path}: cannot resume from it: its generator state does not load "
                            f"({type(e).__name__}: {msg}; the file is damaged)") from None
        if not same_ranks:
            self.log(f"resume: the checkpoint was written by {ckpt['world_size']} ranks, this run has "
                     f"{env.world_size}; dropout RNG streams are reseeded (the data continues exactly)")
            seed_rngs(cfg.seed * 1000 + 1 + env.rank + 7919 * progress.step)
        return progress, state


def continuation(cfg: TrainConfig, progress: Progress, batcher) -> dict:
    """What a saved model of the run records (in ``training.json``) so that the run can be
    continued from it by :func:`continue_point`: its configuration, progress and data position."""
    p = asdict(progress)
    if math.isinf(p["best"]):
        p["best"] = None      # JSON has no infinity
    return {"config": asdict(cfg), "progress": p, "data": batcher.state_dict()}


def continue_point(model_dir: str | Path, cfg: TrainConfig, lm: LanguageModel) -> tuple[Progress, dict]:
    """Continue a run from one of its saved models (``cfg.continue_from``): its weights into
    ``lm`` (a new LM of ``cfg``), checked to be this run's; returns where the run stood and its
    data position. Everything read is checked; a mismatch is one line naming the model."""
    check_path_name(model_dir)
    src = Path(model_dir)
    if not src.is_dir():
        raise ElmoError(f"--continue-from {src}: no such model directory")
    meta_path = src / EXTRA_CONFIG_NAME
    try:
        train = read_lm_meta(src).get("train")
    except ElmoError as e:
        raise ElmoError(f"--continue-from {src}: not a model a training run saved ({e})") from None
    point = train.get(CONTINUE_KEY) if isinstance(train, dict) else None
    if not isinstance(point, dict) or not all(isinstance(point.get(k), dict) for k in ("config", "progress", "data")):
        raise ElmoError(f"--continue-from {src}: not a model a training run saved with what continuing "
                        f"it needs (no {CONTINUE_KEY!r} record of config, progress and data in {meta_path.name})")
    # The whole config, not only what was given: None there (an option left unset, --lr say) matches.
    changed = changed_settings(point["config"], asdict(cfg), unset=("auto", None))
    if changed:
        raise ElmoError(f"--continue-from {src}: the run it was saved from had other settings: {'; '.join(changed)}")
    pr = dict(point["progress"])
    if pr.get("best") is None:
        pr["best"] = math.inf      # JSON has no infinity: None before any validation
    bad = [name for name, ok, _ in progress_checks(pr) if not ok]
    if bad:
        raise ElmoError(f"--continue-from {meta_path}: {', '.join(bad)} of its progress malformed (the file is damaged)")
    old = LanguageModel.from_pretrained(src)
    if old.vocab.digest != lm.vocab.digest:
        raise ElmoError(f"--continue-from {src}: its vocabulary ({len(old.vocab):,} words) is not the run's "
                        f"({len(lm.vocab):,} words, {cfg.vocab or 'built from --train'}): words changed, added or reordered")
    try:
        lm.load_state_dict(old.state_dict())    # fp16 storage comes back as fp32
    except RuntimeError as e:
        msg = " ".join(str(e).split())[:200]
        raise ElmoError(f"--continue-from {src}: its weights do not fit the run's model ({msg})") from None
    step = pr["step"]
    progress = Progress(step, pr["tokens_seen"], float(pr["elapsed"]), float(pr["best"]), pr["bad_evals"],
                        float(pr["lr_scale"]), pr.get("last_valid_step"), rewarm_from=step)
    return progress, point["data"]


def lm_from_checkpoint(ckpt: dict, path: str | Path, vocab: Vocabulary | None = None,
                       load_weights: bool = True) -> LanguageModel:
    """The LM of a checkpoint (as :func:`load_checkpoint` returns it), built as its run built it;
    ``vocab`` defaults to the run's vocabulary file."""
    cfg = TrainConfig.from_dict(ckpt["config"], str(path))
    if vocab is None:
        if not Path(cfg.vocab or "").is_file():
            raise ElmoError(f"{path}: its vocabulary {cfg.vocab} (from the run's config) is missing")
        vocab = Vocabulary.from_file(cfg.vocab)
    saved = ckpt.get("vocab_digest")     # checkpoints before the digest was recorded have none
    if saved is not None and saved != vocab.digest:
        raise ElmoError(f"{cfg.vocab}: not the vocabulary {path} was trained with ({len(vocab):,} words, digest "
                        f"{vocab.digest[:12]}; the checkpoint's: {str(saved)[:12]}): words changed, added or "
                        "reordered. Give the run its own vocabulary")
    lm = LanguageModel(ElmoConfig.from_options(ckpt["model_options"], str(path)), vocab, softmax=cfg.softmax,
                       num_samples=cfg.num_samples, cutoffs=ckpt.get("cutoffs"),
                       regularisation=cfg.regularisation())
    if load_weights:
        try:
            lm.load_state_dict(ckpt["model"])
        except RuntimeError as e:
            raise ElmoError(f"{path}: parameters do not fit the checkpoint's own config ({e})") from None
    return lm


def load_lm(source: str | Path) -> LanguageModel:
    """An LM from an LM directory (``save_pretrained``), a training checkpoint file or a Hugging
    Face Hub id (a local directory or file of that name wins)."""
    check_path_name(source)
    path = Path(source)
    if path.is_dir() or (not path.exists() and hub.is_repo_id(str(source))):
        return LanguageModel.from_pretrained(source)
    if not path.is_file():
        raise ElmoError(f"{path}: no such LM directory or checkpoint")
    return lm_from_checkpoint(load_checkpoint(path), path)
