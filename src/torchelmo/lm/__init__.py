"""Language modelling with the biLM: the vocabulary (:mod:`.vocab`), the softmaxes (:mod:`.softmax`),
:class:`~.model.LanguageModel` (the biLM with its softmax: loss, scoring, perplexity), and its text
as batches: a streamed, exactly resumable corpus (:mod:`.corpus`) and the training and scoring
batches (:mod:`.data`)."""
