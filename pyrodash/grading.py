"""Answer grading shared by evaluation and the GRPO reward: `\\boxed{}` extraction and math-verify equivalence.

- `extract_answer(text)`: the content of the LAST `\\boxed{...}` (or its kin); None when there is none.
- `is_correct(output_text, gold)`: the extracted answer against the gold (a fast path, else math-verify).
- `grade_batch(outputs, golds, workers=None)`: the batched form, safe from any thread.

Each function's rules are in its docstring, and in `is_correct`'s why math-verify runs in a process pool off the
main thread.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from fractions import Fraction

TIMEOUT_S = 5  # math-verify's parse and verify timeouts (signal.alarm takes whole seconds)
INLINE_MAX = 64  # workers=None on the main thread: grade inline up to this many math-verify items, else use the pool

_BOX_RE = re.compile(r"\\(?:boxed|fbox|framebox)(?![A-Za-z])")
_INT_RE = re.compile(r"[-+]?\d+")
_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+")
_NUM_RE = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+))(?:[eE]([-+]?\d+)|(?:\\times|\\cdot)10\^\{?([-+]?\d+)\}?)?")
REL_TOL = 1e-6  # plain numbers: relative tolerance (math-verify rounds to 6 decimals: 1e-27 would equal 3e-19)
_SCI_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]([-+]?\d+)(?![\w.])")


def extract_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text` (nested braces kept), or None.

    Also `\\framebox{...}` (balanced, nested braces), and the space form `\\boxed 5`. None when there is none, or
    when the last one is cut off.
    """
    matches = list(_BOX_RE.finditer(text or ""))
    if not matches:
        return None
    i = matches[-1].end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        m = re.match(r"[^\s$]+", text[i:])  # `\boxed 5` / `\boxed5`: up to whitespace or `$`
        return m.group(0) if m else None
    depth, start = 0, i + 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{" and text[j - 1] != "\\":  # escaped braces \{ \} do not count
            depth += 1
        elif c == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start:j].strip()
    return None  # unbalanced: the output was cut off inside the box


def _normalise(s: str) -> str:
    """Light normalisation for the exact-match fast path (never makes two different answers equal)."""
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\left|\\right|\\!|\\,|\\;|\\ ", "", s)
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    s = re.sub(r"\\text\{\s*([^{}]*?)\s*\}", r"\1", s)
    s = re.sub(r"\s+", "", s)
    s = s.rstrip(".")
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    return s


def _for_math_verify(s: str) -> str:
    """Strip `$` (we add our own delimiters) and write `4.5e33` as `4.5\\times10^{33}` (else e is Euler's e)."""
    s = s.replace("\\$", "").replace("$", " ").strip()
    return _SCI_RE.sub(r"\1\\times10^{\2}", s)


def _gold_text(gold: str | list[str]) -> str:
    if isinstance(gold, (list, tuple)):
        if not gold:
            raise ValueError("gold is an empty list; give at least one reference answer")
        return ", ".join(_for_math_verify(str(g)) for g in gold)
    return _for_math_verify(str(gold))


def _fast(answer: str | None, gold: str | list[str]) -> bool | None:
    """True/False when decidable without math-verify, None when math-verify must decide."""
    if answer is None:
        return False
    if isinstance(gold, (list, tuple)):
        if len(gold) != 1:
            return None
        gold = gold[0]
    a, g = _normalise(answer), _normalise(str(gold))
    if a == g and a:
        return True
    if _INT_RE.fullmatch(a) and _INT_RE.fullmatch(g):
        return _int_key(a) == _int_key(g)
    x, y = _plain_number(a), _plain_number(g)
    if x is not None and y is not None:
        if _INT_RE.fullmatch(g):  # an integer gold (GSM8K, AIME) is exact: 1450001.0 is not 1450000
            return x == y
        return x == y or abs(x - y) <= REL_TOL * max(abs(x), abs(y))
    return None


def _int_key(s: str) -> str:
    """`+007` -> `7`, `-0` -> `0`, without int() (Python refuses int() of strings over 4300 digits)."""
    digits = s.lstrip("+-").lstrip("0") or "0"
    return ("-" if s.startswith("-") and digits != "0" else "") + digits


def _plain_number(s: str) -> Fraction | None:
    """`-1.5`, `4.5e33`, `4.5\\times10^{33}` (normalised: no spaces) as an exact Fraction; None otherwise."""
    m = _NUM_RE.fullmatch(s)
    if m is None:
        return None
    exp = int(m.group(2) or m.group(3) or 0)
    if abs(exp) > 400 or len(m.group(1)) > 400:  # absurd sizes: leave them to math-verify (it has a timeout)
        return None
    return Fraction(m.group(1)) * Fraction(10) ** exp


def _verify(answer: str, gold: str | list[str], timeout_s: int = TIMEOUT_S) -> bool:
    """math-verify alone (main thread only)."""
    from math_verify import parse, verify

    gold_parsed = parse(f"${_gold_text(gold)}$", parsing_timeout=timeout_s)
    pred_parsed = parse(f"\\boxed{{{_for_math_verify(answer)}}}", parsing_timeout=timeout_s)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s))


def _grade_one(output_text: str, gold: str | list[str], fast: bool = True, timeout_s: int = TIMEOUT_S) -> bool:
    answer = extract_answer(output_text)
    if answer is None:
        return False
    if fast:
        decided = _fast(answer, gold)
        if decided is not None:
            return decided
    try:
        return _verify(answer, gold, timeout_s)
    except Exception:  # math-verify's own errors and timeouts: a wrong answer, never a crashed evaluation
        return False


def _grade_chunk(items: list[tuple[str, str | list[str], bool, int]]) -> list[bool]:
    """Process-pool entry point (top level, so it pickles under spawn)."""
    return [_grade_one(o, g, fast, t) for o, g, fast, t in items]


def _warm_worker() -> None:
    import math_verify  # noqa: F401  (first import costs ~0.5 s; pay it at pool start)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _check_gold(gold: str | list[str]) -> None:
    if isinstance(gold, (list, tuple)) and not gold:
        raise ValueError("gold is an empty list; give at least one reference answer")


def _check_timeout(timeout_s: int) -> int:
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or timeout_s < 1:
        raise ValueError(f"timeout_s must be a whole number of seconds >= 1 (signal.alarm), got {timeout_s!r}")
    return timeout_s


def is_correct(output_text: str, gold: str | list[str], timeout_s: int = TIMEOUT_S) -> bool:
    """Whether the last boxed answer of `output_text` equals `gold` (a string, or a list: all must be given).

    Only the extracted answer of the output is compared (no box -> False). A fast path decides without math-verify
    when both sides are the same after light normalisation, or both are integers (the built-in world's answers,
    GSM8K, AIME), or both plain numbers (`-1.5`, `4.5e33`, `4.5\\times10^{33}`: equal within a relative tolerance
    of 1e-6, where math-verify's 6-decimal rounding would call 1e-27 and 3e-19 equal; an integer gold takes no
    tolerance: `1450000.0` is right for `1450000`, `1450001.0` is wrong). Otherwise math-verify decides, with the
    gold wrapped as `$gold$` and the answer as `\\boxed{answer}`. A list gold (OlympiadBench multi-answer): the
    output must give all of them, in any order (`\\boxed{1, 2}`).

    math-verify times out with `signal.alarm`, which works only on the main thread of the main interpreter, so
    math-verify runs inline on the main thread and the item goes to a process pool otherwise. The pool is created
    lazily once per process (spawn start method: safe next to torch threads), reused, and shut down at exit.
    """
    timeout_s = _check_timeout(timeout_s)
    _check_gold(gold)
    if _on_main_thread():
        return _grade_one(output_text, gold, True, timeout_s)
    return grade_batch([output_text], [gold], timeout_s=timeout_s)[0]


# ---- process pool ---------------------------------------------------------------------------------------------

_pool: ProcessPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _get_pool(workers: int) -> ProcessPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size != workers:
            if _pool is not None:
                _pool.shutdown(wait=False, cancel_futures=True)
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            _pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_warm_worker)
            _pool_size = workers
        return _pool


def shutdown_pool() -> None:
    """Stop the grading worker processes (also done at interpreter exit)."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=True, cancel_futures=True)
        _pool, _pool_size = None, 0


atexit.register(shutdown_pool)


def _run_in_pool(items: list, workers: int) -> list[bool]:
    n_chunks = min(len(items), workers * 4)
    chunks = [items[i::n_chunks] for i in range(n_chunks)]  # strided: slow items spread over the workers
    for attempt in range(2):
        pool = _get_pool(workers)
        try:
            results = list(pool.map(_grade_chunk, chunks))
            break
        except BrokenProcessPool as e:  # a worker died (e.g. killed); start a fresh pool once
            shutdown_pool()
            if attempt == 1:
                raise RuntimeError(
                    "the grading worker processes died. Workers start with multiprocessing 'spawn', which re-imports "
                    "your main script: put its top-level code under `if __name__ == '__main__':`, or call grade_batch "
                    "with workers=0 on the main thread"
                ) from e
    out: list[bool] = [False] * len(items)
    for c, res in enumerate(results):
        out[c::n_chunks] = res
    return out


def grade_batch(
    outputs: list[str],
    golds: list[str | list[str]],
    workers: int | None = None,
    fast: bool = True,
    timeout_s: int = TIMEOUT_S,
) -> list[bool]:
    """`is_correct` over pairs, from any thread (off the main thread it always uses the process pool).

    workers: 0 = inline (main thread only; elsewhere the pool with the default size is used), N > 0 = a pool of N
    processes, None = inline on the main thread for up to INLINE_MAX math-verify items, else a pool of
    min(4, cpu_count) processes. Items the fast path decides never reach the pool.
    fast=False skips the fast path (math-verify decides everything; used to test math-verify on real golds).
    """
    if len(outputs) != len(golds):
        raise ValueError(f"grade_batch got {len(outputs)} outputs but {len(golds)} golds; pass one gold per output")
    if workers is not None and (not isinstance(workers, int) or workers < 0):
        raise ValueError(f"workers must be None or an int >= 0, got {workers!r}")
    timeout_s = _check_timeout(timeout_s)
    for g in golds:
        _check_gold(g)
    results: list[bool | None] = [None] * len(outputs)
    pending: list[int] = []
    for i, (o, g) in enumerate(zip(outputs, golds)):
        answer = extract_answer(o)
        decided = False if answer is None else (_fast(answer, g) if fast else None)
        if decided is None:
            pending.append(i)
        else:
            results[i] = decided
    if pending:
        main = _on_main_thread()
        inline = main and (workers == 0 or (workers is None and len(pending) <= INLINE_MAX))
        if inline:
            for i in pending:
                results[i] = _grade_one(outputs[i], golds[i], fast, timeout_s)
        else:
            n = workers if workers else _default_workers()
            items = [(outputs[i], golds[i], fast, timeout_s) for i in pending]
            for i, r in zip(pending, _run_in_pool(items, n)):
                results[i] = r
    return [bool(r) for r in results]
