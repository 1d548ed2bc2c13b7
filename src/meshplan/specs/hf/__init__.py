"""The Hugging Face config.json reader: a ModelSpec from a model's config (config.py), read by its hand-written family
(families.py) or, with transformers, from the model built on the meta device (meta.py, generic.py) and checked
against that build layer by layer (verify.py)."""
