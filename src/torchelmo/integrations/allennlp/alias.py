"""The drop-in under AllenNLP's own module paths, for code that imports ``allennlp`` itself and
cannot be edited (a library such as flair, whose ``ELMoEmbeddings`` imports
``allennlp.commands.elmo``)::

    from torchelmo.integrations.allennlp import register_as_allennlp
    register_as_allennlp()                 # once, before the other library imports allennlp
    from flair.embeddings import ELMoEmbeddings
    embedding = ELMoEmbeddings(options_file="elmo_options.json", weight_file="elmo_weights.hdf5")

Nothing is registered on import: only this call does it, and only where the real ``allennlp`` is
not importable (then it returns False and changes nothing). The modules it registers hold the
names AllenNLP had there and nothing else:

=============================================================  ===================================
``allennlp.commands``                                          ``main`` (its ``elmo`` subcommand)
``allennlp.common.checks``                                     ``ConfigurationError``
``allennlp.commands.elmo``                                     ``ElmoEmbedder``, ``DEFAULT_OPTIONS_FILE``,
                                                               ``DEFAULT_WEIGHT_FILE``, ``DEFAULT_BATCH_SIZE``
``allennlp.modules.elmo``                                      ``Elmo``, ``_ElmoBiLm``,
                                                               ``_ElmoCharacterEncoder``, ``batch_to_ids``
``allennlp.modules.scalar_mix``                                ``ScalarMix``
``allennlp.modules.elmo_lstm``                                 ``ElmoLstm``
``allennlp.modules.lstm_cell_with_projection``                 ``LstmCellWithProjection``
``allennlp.modules.token_embedders.elmo_token_embedder``       ``ElmoTokenEmbedder``
``allennlp.data.token_indexers.elmo_indexer``                  ``ELMoCharacterMapper``,
                                                               ``ELMoTokenCharactersIndexer``
=============================================================  ===================================

and the packages above them (``allennlp.modules`` also has ``Elmo`` and ``ScalarMix``,
``allennlp.modules.token_embedders`` ``ElmoTokenEmbedder``, ``allennlp.data.token_indexers``
the indexer). Objects pickled through these paths record torchelmo's own module paths, so they
load where the alias is not registered.
"""

from __future__ import annotations

import importlib.util
import sys
import types

from ...model.chars import batch_to_ids
from .checks import ConfigurationError
from .commands import main
from .elmo import Elmo, ElmoTokenEmbedder
from .embedder import DEFAULT_BATCH_SIZE, DEFAULT_OPTIONS_FILE, DEFAULT_WEIGHT_FILE, ElmoEmbedder
from .indexer import ELMoCharacterMapper, ELMoTokenCharactersIndexer
from .lstm import ElmoLstm, LstmCellWithProjection
from .mix import ScalarMix
from .modules import _ElmoBiLm, _ElmoCharacterEncoder

MARK = "__torchelmo_alias__"

_MODULES: dict[str, dict[str, object]] = {
    "allennlp": {},
    "allennlp.commands": {"main": main},
    "allennlp.commands.elmo": {"ElmoEmbedder": ElmoEmbedder, "DEFAULT_OPTIONS_FILE": DEFAULT_OPTIONS_FILE,
                               "DEFAULT_WEIGHT_FILE": DEFAULT_WEIGHT_FILE,
                               "DEFAULT_BATCH_SIZE": DEFAULT_BATCH_SIZE},
    "allennlp.modules": {"Elmo": Elmo, "ScalarMix": ScalarMix},
    "allennlp.modules.elmo": {"Elmo": Elmo, "_ElmoBiLm": _ElmoBiLm,
                              "_ElmoCharacterEncoder": _ElmoCharacterEncoder, "batch_to_ids": batch_to_ids},
    "allennlp.modules.scalar_mix": {"ScalarMix": ScalarMix},
    "allennlp.modules.elmo_lstm": {"ElmoLstm": ElmoLstm},
    "allennlp.modules.lstm_cell_with_projection": {"LstmCellWithProjection": LstmCellWithProjection},
    "allennlp.modules.token_embedders": {"ElmoTokenEmbedder": ElmoTokenEmbedder},
    "allennlp.modules.token_embedders.elmo_token_embedder": {"ElmoTokenEmbedder": ElmoTokenEmbedder},
    "allennlp.common": {},
    "allennlp.common.checks": {"ConfigurationError": ConfigurationError},
    "allennlp.data": {},
    "allennlp.data.token_indexers": {"ELMoTokenCharactersIndexer": ELMoTokenCharactersIndexer},
    "allennlp.data.token_indexers.elmo_indexer": {"ELMoCharacterMapper": ELMoCharacterMapper,
                                                  "ELMoTokenCharactersIndexer": ELMoTokenCharactersIndexer},
}


def is_registered() -> bool:
    """Whether ``allennlp`` is this alias."""
    return getattr(sys.modules.get("allennlp"), MARK, False)


def register_as_allennlp() -> bool:
    """Register the drop-in as ``allennlp`` (the modules in this module's docstring). Returns True
    when ``allennlp`` is the drop-in afterwards, False when the real AllenNLP is importable (it is
    left alone). Calling it again does nothing more."""
    if is_registered():
        return True
    if "allennlp" in sys.modules or importlib.util.find_spec("allennlp") is not None:
        return False
    made = {}
    for name, names in _MODULES.items():
        module = types.ModuleType(name, f"torchelmo's AllenNLP drop-in, registered as {name}")
        module.__path__ = []          # a package: its submodules are found in sys.modules
        module.__dict__.update(names)
        setattr(module, MARK, True)
        made[name] = module
    for name, module in made.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(made[parent], child, module)
    sys.modules.update(made)
    return True
