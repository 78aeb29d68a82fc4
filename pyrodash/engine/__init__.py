"""The Collaborate Engine: the one home of Algorithm 1 (`core.py`: the engine and its two drivers, `stream` and
`batch`), the requests it runs and makes (`requests.py`), fitting prompts to context windows (`fitting.py`) and a
request's state and record (`turn.py`)."""

from pyrodash.backends.retry import FailurePolicy
from pyrodash.engine.core import CollaborateEngine, EngineError
from pyrodash.engine.requests import (
    EngineRequest,
    check_share,
    handoff_admitted,
    handoff_request,
    slm_chat,
)
from pyrodash.engine.turn import MODES, Turn

__all__ = [
    "MODES",
    "CollaborateEngine",
    "EngineError",
    "EngineRequest",
    "FailurePolicy",
    "Turn",
    "check_share",
    "handoff_admitted",
    "handoff_request",
    "slm_chat",
]
