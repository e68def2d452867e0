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

Distributed: ``torchrun --nproc_per_node N -m torchelmo.cli train ...`` (gloo on CPU, nccl on GPU).
Each rank computes the rows of the global batch it owns (see :mod:`torchelmo.lm.data`); gradients are
averaged by DistributedDataParallel with the loss normalised by the global number of targets, so
N ranks with global batch B compute the same steps as one process with batch B.
"""

from .checkpoint import (
           CHECKPOINT_NAME,
           KEPT_DIR,
           Progress,
           lm_from_checkpoint,
           load_checkpoint,
           load_lm,
           save_checkpoint,
)
from .config import MAX_GRAD_ACCUM, RESUME_OVERRIDABLE, TRAIN_PRESETS, TrainConfig
from .metrics import METRICS_NAME
from .trainer import TRAIN_CONFIG_NAME, Trainer, train

__all__ = ["CHECKPOINT_NAME", "KEPT_DIR", "MAX_GRAD_ACCUM", "METRICS_NAME", "Progress", "RESUME_OVERRIDABLE",
           "TRAIN_CONFIG_NAME", "TRAIN_PRESETS", "TrainConfig", "Trainer", "lm_from_checkpoint", "load_checkpoint",
           "load_lm", "save_checkpoint", "train"]
