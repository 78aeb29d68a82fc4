"""Model backends: in-process transformers (`hf.py`) and OpenAI-compatible HTTP (`openai_compat.py`)."""

from pyrodash.backends.base import Backend, GenChunk, GenRequest

__all__ = ["Backend", "GenChunk", "GenRequest"]
