"""Other libraries' front doors onto the model: AllenNLP's and flair's names (:mod:`.allennlp`),
ELMoForManyLangs' folders (:mod:`.manylangs`), the spaCy pipeline component (:mod:`.spacy`) and
ONNX export (:mod:`.onnx`). Each imports its library only when used."""
