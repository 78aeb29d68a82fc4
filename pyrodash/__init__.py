"""PyroDash: cost-aware, token-level collaboration between a small and a large language model."""

from pyrodash.cost import Prices, Usage
from pyrodash.engine import CollaborateEngine, EngineError, FailurePolicy
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts, get_prompts

__all__ = [
    "OFFLOAD_TOKEN",
    "CollaborateEngine",
    "Done",
    "EngineError",
    "FailurePolicy",
    "Handoff",
    "LLMDelta",
    "Prices",
    "Prompts",
    "SLMDelta",
    "Usage",
    "get_prompts",
]
__version__ = "0.1.0"
