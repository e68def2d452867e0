"""``elmo embed``: ELMo vectors for tokenised sentences, from Python or for a text file into HDF5.

* :mod:`torchelmo.embed.engine`: the batching engine and the Python API, :func:`embed_sentences` (a
  list in, a list of arrays out), :func:`iter_embed` (any iterable of sentences, streaming) and
  :func:`embed_batch` (one batch as given);
* :mod:`torchelmo.embed.hdf5`: :func:`iter_embed_file`, :func:`embed_file` (AllenNLP's ``elmo`` HDF5
  layout, described there), sharding and :func:`merge_shards`;
* the ``elmo embed`` and ``elmo embed-merge`` commands are :mod:`torchelmo.commands.embed`.
"""

from ..io.text import count_lines
from .engine import (
    LAYER_MODES,
    POOL_MODES,
    STATEFUL_BATCH_SIZE,
    STATELESS_BATCH_SIZE,
    STATELESS_MAX_TOKENS,
    WINDOW_BYTES,
    WINDOW_LINES,
    Batching,
    ElmoWarning,
    embed_batch,
    embed_sentences,
    iter_embed,
    output_shape,
)
from .hdf5 import (
    BLANK_WARNINGS,
    INDEX_DATASET,
    EmbedOptions,
    EmbedSummary,
    embed_file,
    iter_embed_file,
    merge_shards,
    parse_shard,
)

__all__ = ["BLANK_WARNINGS", "INDEX_DATASET", "LAYER_MODES", "POOL_MODES", "STATEFUL_BATCH_SIZE",
           "STATELESS_BATCH_SIZE", "STATELESS_MAX_TOKENS", "WINDOW_BYTES", "WINDOW_LINES",
           "Batching", "ElmoWarning", "EmbedOptions", "EmbedSummary", "count_lines", "embed_batch",
           "embed_file", "embed_sentences", "iter_embed", "iter_embed_file", "merge_shards",
           "output_shape", "parse_shard"]
