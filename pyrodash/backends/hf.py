"""In-process Hugging Face transformers backend: our own KV-cached decode loop (CPU or GPU).

    backend = HFBackend("path/or/hub-id")                   # or HFBackend(model, tokenizer)
    async for chunk in backend.stream(GenRequest(messages=[{"role": "user", "content": "2+2?"}])): ...
    results = backend.generate_batch([req1, req2])            # left-padded batch, for evaluation and rollouts

The prompt is the tokenizer's chat template with `add_generation_prompt=True`, followed by `req.prefix` (the text
the model continues as its own assistant message). Our own loop, rather than `model.generate`, gives exact stop-id
handling (a stop id ends the sequence and is never decoded into text), per-request `logit_bias`, top-k logprobs of
the raw distribution, stop strings, and cancellation between any two tokens. One lock per model serialises
concurrent requests; `stream` runs the loop in a worker thread and hands chunks to the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import torch

from pyrodash.backends.base import GenChunk, GenRequest, GenResult

_END = object()
_BIG = 1e9  # +-inf biases are clamped to this, so sampling stays finite


class _Seq:
    """Decoding state of one sequence: generated ids, text, stop handling, incremental detokenisation."""

    def __init__(self, req: GenRequest, tokenizer, eos_ids: set[int]):
        self.req, self.tok, self.eos_ids = req, tokenizer, eos_ids
        self.stop_ids = set(req.stop_token_ids)
        self.all_ids: list[int] = []  # every generated id (stop token included)
        self.text_ids: list[int] = []  # ids that make up the text
        self.text = ""
        self.sent = 0  # characters of `text` already handed out
        self.hold = max((len(s) for s in req.stop), default=1) - 1
        self.done = False
        self.finish: str | None = None
        self.stop_id: int | None = None
        self.logprobs: list[dict[str, float]] = []

    def push(self, tid: int) -> None:
        self.all_ids.append(tid)
        if tid in self.stop_ids or tid in self.eos_ids:
            self.done, self.finish = True, "stop"
            self.stop_id = tid if tid in self.stop_ids else None
            return
        self.text_ids.append(tid)
        text = self.tok.decode(self.text_ids, skip_special_tokens=False)
        for s in self.req.stop:
            i = text.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                text, self.done, self.finish = text[:i], True, "stop"
        self.text = text
        if not self.done and len(self.all_ids) >= self.req.max_tokens:
            self.done, self.finish = True, "length"

    def delta(self) -> str:
        """New text that is safe to hand out (held back: a possible stop-string start, an incomplete character)."""
        end = len(self.text) if self.done else max(self.sent, len(self.text) - self.hold)
        while not self.done and end > self.sent and self.text[end - 1] == "\ufffd":
            end -= 1
        out = self.text[self.sent : end]
        self.sent = end
        return out


class HFBackend:
    """A local transformers causal LM behind the `Backend` protocol, plus batched generation."""

    def __init__(self, model_or_path, tokenizer=None, device: str | None = None, dtype: str = "auto",
                 name: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model_or_path, (str, Path)):
            path = str(model_or_path)
            if not Path(path).exists() and path.startswith((".", "/")):
                raise ValueError(f"model path {path} does not exist: give an HF model directory or a hub id")
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            name = name or path
        else:
            model = model_or_path
            if tokenizer is None:
                raise ValueError("HFBackend(model, tokenizer): pass the tokenizer together with a model object")
        if device is not None:
            model = model.to(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.device = next(model.parameters()).device
        eos = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
        eos_list = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {int(e) for e in eos_list + [tokenizer.eos_token_id] if e is not None}
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        self._lock = threading.Lock()

    # ---- prompts -------------------------------------------------------------------------------------------
    def token_id(self, token: str) -> int | None:
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == self.tokenizer.unk_token_id:
            return None
        return int(tid) if int(tid) < self.model.get_input_embeddings().weight.shape[0] else None

    def render(self, req: GenRequest) -> str:
        """The prompt text: chat template with a generation prompt, then the assistant prefix to continue."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"{self.name}: the tokenizer has no chat_template; set tokenizer.chat_template")
        text = self.tokenizer.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
        return text + req.prefix

    def prompt_ids(self, req: GenRequest) -> list[int]:
        return list(self.tokenizer.encode(self.render(req), add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    # ---- the decode loop -----------------------------------------------------------------------------------
    def _pick(self, logits: torch.Tensor, req: GenRequest, gen: torch.Generator | None) -> int:
        if req.logit_bias:
            idx = torch.tensor(list(req.logit_bias), device=logits.device)
            val = torch.tensor([max(-_BIG, min(_BIG, v)) for v in req.logit_bias.values()], device=logits.device)
            logits = logits.clone()
            logits[idx] += val
        if req.temperature <= 0:
            return int(torch.argmax(logits))
        probs = torch.softmax(logits / req.temperature, dim=-1)
        if req.top_p < 1.0:
            sp, si = torch.sort(probs, descending=True)
            cut = torch.cumsum(sp, -1) - sp > req.top_p
            sp[cut] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, si, sp)
        return int(torch.multinomial(probs, 1, generator=gen))

    def _top(self, logits: torch.Tensor, k: int) -> dict[str, float]:
        lp = torch.log_softmax(logits, -1)
        vals, ids = torch.topk(lp, k)
        out: dict[str, float] = {}
        for v, i in zip(vals.tolist(), ids.tolist()):
            out.setdefault(self.tokenizer.decode([i], skip_special_tokens=False), v)
        return out

    @torch.inference_mode()
    def _decode(self, prompts: list[list[int]], reqs: list[GenRequest],
                emit: Callable[[int, GenChunk], None] | None = None, cancel: threading.Event | None = None
                ) -> list[_Seq]:
        from transformers import DynamicCache

        bsz, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((bsz, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((bsz, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = [None if r.temperature <= 0 else torch.Generator(device=self.device) for r in reqs]
        for g, r in zip(gens, reqs):
            if g is not None:
                g.manual_seed(r.seed if r.seed is not None else int(torch.randint(0, 2**62, (1,))))
        seqs = [_Seq(r, self.tokenizer, self.eos_ids) for r in reqs]
        for s in seqs:
            s.done = s.req.max_tokens <= 0
            s.finish = "length" if s.done else None
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
        while not all(s.done for s in seqs) and not (cancel is not None and cancel.is_set()):
            logits = out.logits[:, -1, :].float()
            nxt = []
            for i, s in enumerate(seqs):
                if s.done:
                    nxt.append(self.pad_id)
                    continue
                tid = self._pick(logits[i], s.req, gens[i])
                lp = self._top(logits[i], s.req.top_logprobs) if s.req.top_logprobs > 0 else None
                if lp is not None:
                    s.logprobs.append(lp)
                s.push(tid)
                nxt.append(tid)
                if emit is not None:
                    emit(i, GenChunk(text=s.delta(), token_ids=[tid], top_logprobs=[lp] if lp is not None else None))
            if all(s.done for s in seqs):
                break
            mask = torch.cat([mask, mask.new_ones((bsz, 1))], dim=1)
            pos = pos[:, -1:] + 1
            inp = torch.tensor(nxt, dtype=torch.long, device=self.device)[:, None]
            out = self.model(input_ids=inp, attention_mask=mask, position_ids=pos, past_key_values=cache,
                             use_cache=True)
        return seqs

    def _final(self, s: _Seq, n_prompt: int) -> GenChunk:
        return GenChunk(text=s.delta() if s.done else "", finish_reason=s.finish or "length", stop_token_id=s.stop_id,
                        prompt_tokens=n_prompt, completion_tokens=len(s.all_ids), cached_tokens=None)

    # ---- public API ----------------------------------------------------------------------------------------
    async def stream(self, req: GenRequest) -> AsyncIterator[GenChunk]:
        """Token-by-token chunks; the last one has finish_reason, stop_token_id and usage. Closing the iterator
        (a client that went away) stops the decode loop before its next token."""
        prompt = self.prompt_ids(req)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                cancel.set()

        def work() -> None:
            try:
                with self._lock:
                    if cancel.is_set():
                        return
                    (seq,) = self._decode([prompt], [req], emit=lambda _i, c: put(c), cancel=cancel)
                if not cancel.is_set():
                    put(self._final(seq, len(prompt)))
                put(_END)
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                put(e)

        threading.Thread(target=work, daemon=True, name="pyrodash-hf-decode").start()
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                if item.text or item.token_ids or item.finish_reason:
                    yield item
        finally:
            cancel.set()

    def generate_batch(self, reqs: list[GenRequest], batch_size: int | None = None) -> list[GenResult]:
        """Generate for every request (blocking). Left-padded batches of `batch_size` (default: all at once);
        sampling is reproducible per request through `req.seed`."""
        if not reqs:
            return []
        bs = batch_size or len(reqs)
        results: list[GenResult] = []
        for start in range(0, len(reqs), bs):
            chunk = reqs[start : start + bs]
            prompts = [self.prompt_ids(r) for r in chunk]
            with self._lock:
                seqs = self._decode(prompts, chunk)
            for p, s in zip(prompts, seqs):
                results.append(GenResult(
                    text=s.text, token_ids=list(s.all_ids), prompt_ids=p, finish_reason=s.finish or "length",
                    stop_token_id=s.stop_id, prompt_tokens=len(p), completion_tokens=len(s.all_ids),
                    top_logprobs=s.logprobs if s.req.top_logprobs > 0 else None))
        return results

    def generate(self, req: GenRequest) -> GenResult:
        return self.generate_batch([req])[0]

    async def aclose(self) -> None:
        return None
