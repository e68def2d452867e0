"""AllenNLP's ELMo API on torchelmo, for code written against ``allennlp.modules.elmo`` and
``allennlp.commands.elmo`` (AllenNLP is archived and no longer installs with current PyTorch).

Change the import and keep the code::

    # from allennlp.modules.elmo import Elmo, batch_to_ids
    # from allennlp.commands.elmo import ElmoEmbedder
    from torchelmo.integrations.allennlp import Elmo, ElmoEmbedder, batch_to_ids

Same argument names, defaults and outputs. Like AllenNLP's, both classes carry the LSTM state
from one batch to the next (row r of a batch starts where row r of the previous one ended), so a
sentence's vectors depend slightly on what ran before; ``stateful=False`` makes every sentence
start from the zero state, as torchelmo's own API does. See docs/migrating.md.

The names AllenNLP code imports from ``allennlp.modules.elmo`` and its neighbours are here too,
one module each:

* :mod:`.elmo`: ``Elmo`` and ``ElmoTokenEmbedder``;
* :mod:`.modules`: ``_ElmoBiLm`` and ``_ElmoCharacterEncoder``;
* :mod:`.mix`: ``ScalarMix`` (AllenNLP's parameter layout);
* :mod:`.lstm`: ``LstmCellWithProjection`` and ``ElmoLstm`` (AllenNLP's arguments and names);
* :mod:`.embedder`: ``ElmoEmbedder`` (``allennlp.commands.elmo``);
* :mod:`.commands`: ``main`` (``allennlp.commands.main``, its ``elmo`` subcommand);
* :mod:`.checks`: ``ConfigurationError`` (``allennlp.common.checks``);
* :mod:`.indexer`: ``ELMoCharacterMapper`` and ``ELMoTokenCharactersIndexer``;
* :mod:`.state_dict`: checkpoints with AllenNLP's keys, which ``Elmo``, ``ElmoTokenEmbedder``,
  ``_ElmoBiLm`` and ``_ElmoCharacterEncoder`` load and give back (``allennlp_state_dict()``); its
  docstring has the table of keys and the conversions;
* :mod:`.alias`: ``register_as_allennlp()``, the drop-in under AllenNLP's module paths for code
  that imports ``allennlp`` itself (flair's ``ELMoEmbeddings``), only when called and only where
  the real AllenNLP is not installed.
"""

from ...model.chars import batch_to_ids
from .alias import register_as_allennlp
from .checks import ConfigurationError
from .commands import main
from .elmo import Elmo, ElmoTokenEmbedder
from .embedder import DEFAULT_BATCH_SIZE, ElmoEmbedder
from .embedder import DEFAULT_MODEL as DEFAULT_MODEL
from .indexer import ELMoCharacterMapper, ELMoTokenCharactersIndexer
from .lstm import ElmoLstm, LstmCellWithProjection
from .mix import ScalarMix
from .modules import _ElmoBiLm as _ElmoBiLm
from .modules import _ElmoCharacterEncoder as _ElmoCharacterEncoder
from .modules import _ElmoLstmState as _ElmoLstmState

__all__ = ["DEFAULT_BATCH_SIZE", "ConfigurationError", "ELMoCharacterMapper", "ELMoTokenCharactersIndexer", "Elmo",
           "ElmoEmbedder", "ElmoLstm", "ElmoTokenEmbedder", "LstmCellWithProjection", "ScalarMix", "batch_to_ids",
           "main", "register_as_allennlp"]
