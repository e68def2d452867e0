"""ELMoForManyLangs model directories (HIT-SCIR's pretrained ELMo for 44 languages) as a
torchelmo model: a :class:`ManyLangsBiLM` is a :class:`~torchelmo.BiLM` with ELMoForManyLangs'
token encoder and lexicons and torchelmo's recurrence, and it is found wherever a model is named
(``BiLM.from_pretrained``, every ``elmo`` command, spaCy, the probes).

A directory as ELMoForManyLangs ships it holds ``config.json`` (which names the model config),
that model config (or the name of one the elmoformanylangs package ships), ``char.dic``,
``word.dic``, ``encoder.pkl`` and ``token_embedder.pkl``. Nothing pickled is run: the ``.pkl``
files are read with ``torch.load(weights_only=True)``, and a file that holds anything but
tensors is refused.

What ELMoForManyLangs does, reproduced as it is (see :class:`ManyLangsVocab`): tokens longer than
``max_characters_per_token - 2`` characters are cut (the word embedding then looks up the cut
token too); a token's characters sit between the ids of ``<eow>`` (first) and ``<bow>`` (last),
its code assigning the two markers the other way round from their names; a ``.dic`` line with
one field is the entry of ``U+3000``. Their ``Embedder`` (its batching and carried state) is
:mod:`torchelmo.integrations.manylangs`.
"""

from __future__ import annotations

from .config import ManyLangsConfig
from .files import load_state_dict, read_lexicon
from .model import ManyLangsBiLM, ManyLangsTokenEncoder
from .vocab import ManyLangsVocab

__all__ = ["ManyLangsBiLM", "ManyLangsConfig", "ManyLangsTokenEncoder", "ManyLangsVocab", "load_state_dict",
           "read_lexicon"]
