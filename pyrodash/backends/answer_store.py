"""A run's answer store: greedy generations on disk, addressed by everything that decides them, so a model is never
asked the same thing twice in one run, whichever method or step asks (the LLM alone, the oracle, the routers,
RouteLLM's chosen model, the range-routed turns of long conversations; in one process or in the demo's workers).

    store = AnswerStore(Path("runs/demo-quick/answers"))
    backend.answers = store        # an in-process model (`HFBackend`): its greedy decodes are read and written there
    answer_counts(store.root)      # {"served": generations read back, "generated": generations decoded and kept}

An entry's address is the SHA-256 of (the model's fingerprint: its weights, dtype and end-of-sequence ids; the
prompt's token ids; every decoding setting of the request: max tokens, stop strings and ids, logit bias, top
log-probabilities). Greedy decoding writes the same tokens for the same address, alone or in any batch (tested in
tests/test_kv_cache.py), so an entry read back is the generation the model would make. Sampled requests, and requests
that keep their own KV for the next one (`GenRequest.cache_key`, a relay answer's), are never stored. Entries are
written whole (a temporary file renamed), so workers writing at once never leave half an entry; two that decode the
same request at once both keep it, with the same bytes. The model must not change while a store is attached to it
(evaluation loads its models once and never trains them).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

from pyrodash.backends.base import GenResult

ANSWERS_OFF = "off"  # an eval config's `answers: off`: no store
COUNTS = "counts.jsonl"  # one line per batch that used the store: {"served": n, "generated": m}


class AnswerStore:
    """Greedy generations under `root`, one JSON file each, named by its address (module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._models: dict[int, str] = {}  # id(model) -> its fingerprint, computed once

    def fingerprint(self, model, eos_ids) -> str:
        """SHA-256 of the model's weights (every tensor of its state dict: name, dtype, shape, bytes) and its
        end-of-sequence ids: what the tokens of a greedy decode depend on besides the prompt and the request."""
        if id(model) not in self._models:
            import torch

            h = hashlib.sha256(json.dumps(sorted(int(e) for e in eos_ids)).encode())
            for name, t in sorted(model.state_dict().items()):
                t = t.detach().to("cpu").contiguous().reshape(-1)
                h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
                h.update(t.view(torch.uint8).numpy().tobytes())
            self._models[id(model)] = h.hexdigest()
        return self._models[id(model)]

    def _path(self, model: str, decode: tuple) -> Path:
        prompt, settings = decode
        address = hashlib.sha256(json.dumps([model, list(prompt), settings]).encode()).hexdigest()
        return self.root / address[:2] / f"{address}.json"

    def take(self, model: str, decodes: dict[int, tuple]) -> dict[int, GenResult]:
        """{i: the stored generation} for the requests `decodes` ({i: (prompt ids, settings)}, `same_decode`'s key)
        already in the store; their prompt ids are the key's."""
        got = {}
        for i, decode in decodes.items():
            path = self._path(model, decode)
            if path.exists():
                got[i] = GenResult.from_json(json.loads(path.read_text()))
                got[i].prompt_ids = list(decode[0])
        return got

    def keep(self, model: str, decodes: dict[int, tuple], results: dict[int, GenResult], served: int) -> None:
        """Store `results[i]` at `decodes[i]`'s address (a failed call is never stored) and count the batch: `served`
        generations read back, the ones stored here decoded."""
        kept = 0
        for i, decode in decodes.items():
            r = results[i]
            if r.finish_reason == "error":
                continue
            path = self._path(model, decode)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")  # (one per writer: processes and threads)
            tmp.write_text(json.dumps(r.to_json()))
            os.replace(tmp, path)
            kept += 1
        if served or kept:
            self.root.mkdir(parents=True, exist_ok=True)
            with (self.root / COUNTS).open("a") as f:  # one short line per batch: appends of workers do not mix
                f.write(json.dumps({"served": served, "generated": kept}) + "\n")


def answer_counts(root: str | Path) -> dict[str, int]:
    """{"served": generations read back from the store under `root`, "generated": generations decoded and stored
    there}, over every process that used it (zeros for a run without one)."""
    counts = {"served": 0, "generated": 0}
    path = Path(root) / COUNTS
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                counts["served"] += int(d["served"])
                counts["generated"] += int(d["generated"])
    return counts


def run_answer_counts(run_dir: str | Path) -> dict[str, int]:
    """`answer_counts` of the store a run's evaluation used: its config.resolved.json's `answers` (a relative path
    is the working directory's, as the run wrote it; "off": zeros), else RUN_DIR/answers. A relative path that is not
    there from this working directory (the report run from elsewhere) is the run's own store when RUN_DIR/answers is."""
    resolved = Path(run_dir) / "config.resolved.json"
    where = json.loads(resolved.read_text()).get("answers") if resolved.exists() else None
    if where == ANSWERS_OFF:
        return {"served": 0, "generated": 0}
    own = Path(run_dir) / "answers"
    if where and not Path(where).is_absolute() and not Path(where).exists() and own.exists():
        where = own
    return answer_counts(where or own)


def answers_sentence(counts: dict[str, int]) -> str:
    """The report's line on the answer store: how many generations came from it."""
    total = counts["served"] + counts["generated"]
    return (
        f"Answer store: {counts['served']} of {total} greedy generations were read back from the run's store (a "
        f"model asked the same thing by another method or step), {counts['generated']} decoded."
    )
