"""ELMoForManyLangs models (HIT-SCIR's pretrained ELMo for 44 languages) on torchelmo.

A model directory as ELMoForManyLangs ships it (``config.json``, the model config it names,
``char.dic``, ``word.dic``, ``encoder.pkl``, ``token_embedder.pkl``) loads into a
:class:`ManyLangsBiLM`, a :class:`~torchelmo.BiLM` whose recurrence is torchelmo's own, and
:class:`Embedder` gives what ``elmoformanylangs.Embedder`` gives (to float32 rounding)::

    from torchelmo.integrations.manylangs import Embedder

    e = Embedder("zhs.model")                          # the unpacked model directory
    vectors = e.sents2elmo([["今天", "天气", "很", "好"], ["你好"]])
    vectors[0].shape                                    # (4, 1024): the average of the 3 layers
    e.sents2elmo([["你好"]], output_layer=-2)[0].shape  # (3, 1, 1024): every layer
    e.model.reset_states()                              # forget the carried LSTM state (see below)

Nothing pickled is run: the ``.pkl`` files are read with ``torch.load(weights_only=True)``, and
a file that holds anything but tensors is refused.

What ELMoForManyLangs does, reproduced as it is (see :class:`ManyLangsVocab`): tokens longer than
``max_characters_per_token - 2`` characters are cut (the word embedding then looks up the cut
token too); a token's characters sit between the ids of ``<eow>`` (first) and ``<bow>`` (last),
its code assigning the two markers the other way round from their names; a ``.dic`` line with
one field is the entry of ``U+3000``; sentences are sorted by length, batched, and the batches
run in an order drawn with Python's ``random``; and the LSTM state is carried from one batch to
the next and from one call to the next (row r of a batch starts where row r of the previous
batch ended), so a sentence's vectors depend on what ran before it.
"""


from __future__ import annotations

from .config import ManyLangsConfig
from .embedder import Embedder
from .files import load_state_dict, read_lexicon
from .model import ManyLangsBiLM, ManyLangsTokenEncoder
from .vocab import ManyLangsVocab

__all__ = ["Embedder", "ManyLangsBiLM", "ManyLangsConfig", "ManyLangsTokenEncoder", "ManyLangsVocab",
           "load_state_dict", "read_lexicon"]
