"""vocgraft: adapt English-centric LLMs to other languages by changing their vocabulary."""

__version__ = "0.1.0"
