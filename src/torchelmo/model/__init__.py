"""The model: the char-CNN token encoder (:mod:`.encoder`), the biLM (:mod:`.bilm`), a task's
scalar mix (:mod:`.mix`), what they are built from (:mod:`.config`, :mod:`.chars`), and how a model
is stored and named (:mod:`.weights`: the published and native formats; :mod:`.registry`: the
names ``from_pretrained`` takes; :mod:`.hub`: the Hugging Face Hub). How the recurrence computes
is :mod:`torchelmo.numerics`; language modelling, :mod:`torchelmo.lm`.

A model directory's layout is found by :mod:`.folders`; each kind of model adds its own there
when imported, so this package imports them all (:mod:`.manylangs`: ELMoForManyLangs')."""

from . import bilm, manylangs  # noqa: F401  (their layouts, for every from_pretrained)
