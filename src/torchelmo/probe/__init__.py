"""Probing: what each layer of a frozen biLM knows (POS, syntax, WSD, NER), with controls.

* :mod:`.features` frozen-biLM features per token or span, cached on disk (HDF5).
* :mod:`.conll`, :mod:`.treebank`, :mod:`.wsd_data` readers for CoNLL-U (tags and trees), WNUT-17,
  token-per-line tag files, the WSJ treebank sample, Raganato's unified WSD format, WordNet.
* :mod:`.common` what the probes share: layer names, standardization, the early-stopped fit.
* :mod:`.pos` linear probes per layer and a ScalarMix probe; :mod:`.deps` dependency arc (bilinear)
  and label probes; :mod:`.wsd` 1-NN sense vectors;
  :mod:`.ner` a BiLSTM tagger over the mix / E0 / static embeddings.
* :mod:`.stats` bootstrap intervals; :mod:`.report` results.json, report.md, plots;
  :mod:`.cli` the ``elmo probe`` subcommand. See ``docs/probing.md``.
"""

from .conll import TaggedSentence, bio_spans, read_conll, read_conllu
from .features import Features, extract, model_fingerprint, random_like
from .stats import bootstrap_ci

__all__ = ["Features", "TaggedSentence", "bio_spans", "bootstrap_ci", "extract", "model_fingerprint",
           "random_like", "read_conll", "read_conllu"]
