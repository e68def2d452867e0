"""elmo: ELMo (Peters et al. 2018) in PyTorch."""

from .bilm import BiLM, BiLMOutput
from .chars import batch_to_ids, word_to_char_ids
from .config import ElmoConfig, preset
from .errors import ElmoError
from .mix import Elmo, ScalarMix

__version__ = "0.1.0"
__all__ = ["BiLM", "BiLMOutput", "Elmo", "ElmoConfig", "ElmoError", "ScalarMix", "batch_to_ids",
           "preset", "word_to_char_ids", "__version__"]
