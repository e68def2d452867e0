"""The model: the char-CNN token encoder (:mod:`.encoder`), the biLM (:mod:`.bilm`), a task's
scalar mix (:mod:`.mix`), what they are built from (:mod:`.config`, :mod:`.chars`), and how a model
is stored and named (:mod:`.weights`: the published and native formats; :mod:`.registry`: the
names ``from_pretrained`` takes; :mod:`.hub`: the Hugging Face Hub). How the recurrence computes
is :mod:`torchelmo.numerics`; language modelling, :mod:`torchelmo.lm`."""
