"""Megatron-core path (``trainer.strategy=megatron``): HF config/weight conversion, GPT model building, the
actor/ref worker and the checkpoint manager. Importing this package does not import megatron-core; the
modules that need it import it lazily (``pip install -e .[megatron]``)."""
