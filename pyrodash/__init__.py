"""PyroDash: cost-aware, token-level collaboration between a small and a large language model."""

from pyrodash.cost import Prices, Usage
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts, get_prompts

__all__ = ["OFFLOAD_TOKEN", "Prices", "Prompts", "Usage", "get_prompts"]
__version__ = "0.1.0"
