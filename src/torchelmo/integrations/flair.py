"""flair: ELMo token embeddings that flair's trainer can save and load.

flair's own ``ELMoEmbeddings`` runs on the AllenNLP drop-in
(:func:`torchelmo.integrations.allennlp.register_as_allennlp`), but a flair model holding it
cannot be saved: ``Model.save`` asks the embeddings for ``to_params``, which flair's class does
not have, so ``ModelTrainer.train`` dies writing ``best-model.pt`` or ``final-model.pt``. This
class takes the same arguments and saves with the flair model: its biLM's configuration in the
embeddings' parameters, its weights in the model's state dict. A saved model loads without the
original files, in any process that has imported this module (which registers the class with
flair)::

    from torchelmo.integrations.flair import ELMoEmbeddings      # instead of flair.embeddings'
    embeddings = ELMoEmbeddings("small")        # or options_file=..., weight_file=..., or any model folder
    tagger = SequenceTagger(hidden_size=256, embeddings=embeddings, tag_dictionary=tags,
                            tag_type="ner")
    ModelTrainer(tagger, corpus).train("out", max_epochs=10)      # best-model.pt, final-model.pt

    import torchelmo.integrations.flair                            # in another process
    tagger = SequenceTagger.load("out/final-model.pt")

The biLM is frozen (flair treats these embeddings as static); ``embedding_mode`` is flair's:
``all`` (the layers concatenated, ``(L + 1) * 2P`` values per token), ``top`` or ``average``.
Each sentence starts from the zero state, so its vectors do not depend on what was embedded
before; ``stateful=True`` carries the state from batch to batch as flair's own class did
(through AllenNLP's ``ElmoEmbedder``, after a first dummy sentence), which gives its vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from flair.data import Sentence
from flair.embeddings.base import register_embeddings
from flair.embeddings.token import TokenEmbeddings

from ..errors import ElmoError
from ..model.bilm import BiLM
from ..model.config import ElmoConfig
from ..model.manylangs import ManyLangsBiLM

MODES = ("all", "top", "average")
# flair's names for the published models, as torchelmo's registry spells them
_FLAIR_NAMES = {"large": "original-5.5b", "5.5B": "original-5.5b"}


@register_embeddings("torchelmo.ELMoEmbeddings")
class ELMoEmbeddings(TokenEmbeddings):
    """ELMo token embeddings for flair, savable with the flair model.

    Parameters
    ----------
    model : a name or folder :meth:`BiLM.from_pretrained` takes (flair's ``"original"``,
        ``"small"``, ``"medium"``, ``"large"``/``"5.5B"`` included), or a :class:`BiLM`.
    options_file, weight_file : a published model's two files (paths or URLs), as flair takes
        them; they win over ``model``.
    embedding_mode : ``all``, ``top`` or ``average`` (flair's).
    batch_size : sentences per biLM call.
    stateful : carry the LSTM state from batch to batch, as flair's own class did.
    """

    def __init__(self, model: str | Path | BiLM = "original", options_file: str | None = None,
                 weight_file: str | None = None, embedding_mode: str = "all", batch_size: int = 64,
                 stateful: bool = False) -> None:
        if embedding_mode not in MODES:
            raise ElmoError(f"ELMoEmbeddings: embedding_mode must be one of {', '.join(MODES)}, "
                            f"got {embedding_mode!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ElmoError(f"ELMoEmbeddings: batch_size must be a positive integer, got {batch_size!r}")
        if options_file or weight_file:
            if not (options_file and weight_file):
                raise ElmoError("ELMoEmbeddings: options_file and weight_file go together; give both or neither")
            bilm, label = BiLM.from_published(options_file, weight_file), Path(str(weight_file)).stem
        elif isinstance(model, BiLM):
            bilm, label = model, "model"
        else:
            bilm, label = BiLM.from_pretrained(_FLAIR_NAMES.get(str(model), model)), Path(str(model)).name
        self.name = f"elmo-{label}-{embedding_mode}"
        self.static_embeddings = True
        super().__init__()
        self.bilm = bilm.eval().requires_grad_(False)
        self.bilm.stateful = bool(stateful)
        self.embedding_mode, self.batch_size = embedding_mode, batch_size
        P2 = 2 * bilm.config.projection_dim
        self._length = P2 * (bilm.config.n_layers + 1) if embedding_mode == "all" else P2
        if stateful:   # flair's class embeds a dummy sentence first, and the state carries on from it
            self.embed(Sentence(["hello"]))

    @property
    def embedding_length(self) -> int:
        return self._length

    def train(self, mode: bool = True) -> ELMoEmbeddings:
        super().train(mode)
        self.bilm.eval()      # frozen: no dropout, whatever mode the flair model is in
        return self

    def _add_embeddings_internal(self, sentences: list[Sentence]) -> list[Sentence]:
        todo = [s for s in sentences if len(s) > 0]
        for i in range(0, len(todo), self.batch_size):
            chunk = todo[i:i + self.batch_size]
            with torch.no_grad():
                layers = self.bilm.embed_sentences([[t.text for t in s] for s in chunk]).layers   # (B, T, 2P) each
            if self.embedding_mode == "all":
                vectors = torch.cat(layers, dim=-1)
            elif self.embedding_mode == "top":
                vectors = layers[-1]
            else:
                vectors = torch.stack(layers).mean(dim=0)
            for b, sentence in enumerate(chunk):
                for j, token in enumerate(sentence.tokens):
                    token.set_embedding(self.name, vectors[b, j])
        return sentences

    def to_params(self) -> dict[str, Any]:
        """What :meth:`from_params` rebuilds the embeddings from (the biLM's weights travel in the
        flair model's state dict)."""
        model = (self.bilm.description() if isinstance(self.bilm, ManyLangsBiLM)   # an ELMoForManyLangs folder
                 else self.bilm.config.to_options())
        return {"config": model, "name": self.name, "embedding_mode": self.embedding_mode,
                "batch_size": self.batch_size, "stateful": self.bilm.stateful}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ELMoEmbeddings:
        source, stateful = "flair model: torchelmo.ELMoEmbeddings", params.get("stateful", False)
        if isinstance(params["config"], dict) and params["config"].get("format") == "elmoformanylangs":
            bilm: BiLM = ManyLangsBiLM.from_description(params["config"], source, stateful=stateful)
        else:
            bilm = BiLM(ElmoConfig.from_options(params["config"], source=source), stateful=stateful)
        embeddings = cls(bilm, embedding_mode=params["embedding_mode"], batch_size=params["batch_size"])
        embeddings.name = params["name"]    # the key its tokens' vectors are stored under
        return embeddings

    def extra_repr(self) -> str:
        return f"name={self.name!r}, embedding_length={self.embedding_length}"
