"""ELMoForManyLangs' ``Embedder`` on torchelmo.

A model directory as ELMoForManyLangs ships it loads into a :class:`ManyLangsBiLM` (see
:mod:`torchelmo.model.manylangs`: the same directory is a model for ``BiLM.from_pretrained`` and
every ``elmo`` command too), and :class:`Embedder` gives what ``elmoformanylangs.Embedder`` gives
(to float32 rounding)::

    from torchelmo.integrations.manylangs import Embedder

    e = Embedder("zhs.model")                          # the unpacked model directory
    vectors = e.sents2elmo([["今天", "天气", "很", "好"], ["你好"]])
    vectors[0].shape                                    # (4, 1024): the average of the 3 layers
    e.sents2elmo([["你好"]], output_layer=-2)[0].shape  # (3, 1, 1024): every layer
    e.model.reset_states()                              # forget the carried LSTM state (see below)

What their ``Embedder`` does, reproduced as it is: sentences are sorted by length, batched, and
the batches run in an order drawn with Python's ``random``; and the LSTM state is carried from
one batch to the next and from one call to the next (row r of a batch starts where row r of the
previous batch ended), so a sentence's vectors depend on what ran before it.
"""


from __future__ import annotations

from ...model.manylangs import (
    ManyLangsBiLM,
    ManyLangsConfig,
    ManyLangsTokenEncoder,
    ManyLangsVocab,
    load_state_dict,
    read_lexicon,
)
from .embedder import Embedder

__all__ = ["Embedder", "ManyLangsBiLM", "ManyLangsConfig", "ManyLangsTokenEncoder", "ManyLangsVocab",
           "load_state_dict", "read_lexicon"]
