"""In-process Hugging Face transformers backend: our own KV-cached decode loop (CPU or GPU).

    backend = HFBackend("path/or/hub-id")                   # or HFBackend(model, tokenizer)
    async for chunk in backend.stream(GenRequest(messages=[{"role": "user", "content": "2+2?"}])): ...
    results = backend.generate_batch([req1, req2])            # left-padded batch, for evaluation and rollouts

The prompt is the chat template (generation prompt on) followed by `req.prefix`, each template rendered and each
prompt tokenized once (`prompts`, a `PromptMemo`: the server's context check, the engine's fitting and the decode ask
for the same prompt, and a relay's resumes for the same template). Our own loop, not `model.generate`:
exact stop ids, per-request `logit_bias`, raw top-k logprobs, stop strings, cancellation between tokens. One lock per
model; `stream` decodes in a worker thread that is always joined (a daemon thread killed inside torch aborts the
process at exit). Literal-marked content (`pyrodash.backends.literal`) is tokenized as plain characters, so a client
cannot forge `<|im_end|>` or `<offload>`.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import fields
from pathlib import Path

import torch

from pyrodash.backends import literal
from pyrodash.backends.base import GenChunk, GenRequest, GenResult, public_name
from pyrodash.backends.hf.chat_template import resolve_template
from pyrodash.backends.hf.kv_cache import growing, growing_cache, row_cache, stack_rows
from pyrodash.backends.hf.lean_step import lean_step
from pyrodash.backends.hf.prefix_cache import PrefixCache
from pyrodash.backends.hf.prompt_memo import PromptMemo
from pyrodash.backends.hf.stream_batch import StreamBatcher, StreamJob
from pyrodash.chat import render_chat

_END = object()
_BIG = 1e9  # +-inf biases are clamped to this, so sampling stays finite
_GREEDY_BELOW = 1e-5  # temperatures at or below this decode greedily


class _Seq:
    """Decoding state of one sequence: generated ids, text, stop handling, incremental detokenisation."""

    def __init__(self, req: GenRequest, tokenizer, eos_ids: set[int], incremental: bool = True):
        self.req, self.tok, self.eos_ids = req, tokenizer, eos_ids
        self.incremental = incremental or bool(req.stop)  # else the text is decoded once, at the end
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
        if self.incremental:
            text = self.tok.decode(self.text_ids, skip_special_tokens=False)
            for s in self.req.stop:
                i = text.find(s, max(0, self.sent - len(s)))
                if i >= 0:
                    text, self.done, self.finish = text[:i], True, "stop"
            self.text = text
        if not self.done and len(self.all_ids) >= self.req.max_tokens:
            self.done, self.finish = True, "length"

    def finalize(self) -> None:
        if not self.incremental:
            self.text = self.tok.decode(self.text_ids, skip_special_tokens=False)

    def delta(self) -> str:
        """New text that is safe to hand out (held back: a possible stop-string start, an incomplete character)."""
        end = len(self.text) if self.done else max(self.sent, len(self.text) - self.hold)
        while not self.done and end > self.sent and self.text[end - 1] == "\ufffd":
            end -= 1
        out = self.text[self.sent : end]
        self.sent = end
        return out


def same_decode(prompt: list[int], req: GenRequest) -> tuple | None:
    """What determines the tokens the decode loop gives `req` on `prompt`: two requests with the same key decode the
    same tokens; None for a request sampled without a seed (each such draw is its own). Stage 3's handoffs repeat:
    rollouts of one prompt that agree up to `<offload>` hand the LLM the same request (measured, quick world seed 0,
    λ 0.6: 536 LLM requests in 40 steps, 248 distinct; decoded once each, Stage 3 on one thread took 37 -> 31 s and
    wrote the same weights, byte for byte)."""
    if (req.temperature > _GREEDY_BELOW and req.seed is None) or req.cache_key is not None:
        return None  # (a keyed request keeps its own KV for its answer: decoded as its own)
    # every field of the request but the prompt's text (the ids stand for it), so a field added later is part of it
    settings = {f.name: getattr(req, f.name) for f in fields(req) if f.name not in ("messages", "prefix")}
    if req.temperature <= _GREEDY_BELOW:  # greedy: the sampling settings do not change a token
        for name in ("temperature", "top_p", "seed"):
            settings.pop(name)
    return tuple(prompt), json.dumps(settings, sort_keys=True, default=repr)


class _Batch:
    """The rows still decoding: each row's request index (`active`), its last logits, attention mask, positions,
    temperature, top-p and logit bias."""

    def __init__(self, logits, mask, pos, temps, top_ps, bias, dev):
        self.logits, self.mask, self.pos, self.temps, self.top_ps, self.bias = logits, mask, pos, temps, top_ps, bias
        self.dev = dev
        self.active = list(range(logits.shape[0]))
        self.keep: Callable[[int, int], None] | None = None  # (row, request index): keep a row's KV before it leaves

    @classmethod
    def of(cls, reqs: list[GenRequest], logits, mask, pos, dev) -> _Batch:
        temps = torch.tensor([r.temperature if r.temperature > _GREEDY_BELOW else 1.0 for r in reqs], device=dev)
        top_ps = torch.tensor([r.top_p for r in reqs], device=dev)[:, None]
        bias = None
        if any(r.logit_bias for r in reqs):
            bias = torch.zeros_like(logits)
            for i, r in enumerate(reqs):
                for t, v in r.logit_bias.items():
                    bias[i, t] = max(-_BIG, min(_BIG, v))
        return cls(logits, mask, pos, temps[:, None], top_ps, bias, dev)

    def drop_finished(self, seqs: list[_Seq], cache) -> None:
        """Finished sequences leave the batch: their rows of every tensor and of the KV cache."""
        keep = [j for j, i in enumerate(self.active) if not seqs[i].done]
        if len(keep) == len(self.active):
            return
        if self.keep is not None:
            for j, i in enumerate(self.active):
                if seqs[i].done:
                    self.keep(j, i)
        rows = torch.tensor(keep, device=self.dev)
        self.logits, self.mask, self.pos, self.temps, self.top_ps = (
            t[rows] for t in (self.logits, self.mask, self.pos, self.temps, self.top_ps)
        )
        self.bias = None if self.bias is None else self.bias[rows]
        cache.batch_select_indices(rows)
        self.active = [self.active[j] for j in keep]

    def pick(self, logits: torch.Tensor, gens: list[torch.Generator | None]) -> torch.Tensor:
        """Each row's next token: the argmax, or for a sampled row the Gumbel-max of its temperature / top-p
        distribution drawn with its own generator."""
        pick = torch.argmax(logits, -1)
        sampled = [j for j, i in enumerate(self.active) if gens[i] is not None]
        if sampled:
            rows = torch.tensor(sampled, device=self.dev)
            z = logits[rows] / self.temps[rows]
            if bool((self.top_ps[rows] < 1.0).any()):
                sp, si = torch.sort(torch.softmax(z, -1), descending=True)
                cut = (torch.cumsum(sp, -1) - sp) > self.top_ps[rows]
                z = z.masked_fill(torch.zeros_like(cut).scatter_(1, si, cut), float("-inf"))
            u = torch.stack([torch.rand(z.shape[1], generator=gens[self.active[j]], device=self.dev) for j in sampled])
            pick[rows] = torch.argmax(z - torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7))), -1)
        return pick


class HFBackend:
    """A local transformers causal LM behind the `Backend` protocol, plus batched generation."""

    def __init__(
        self,
        model_or_path,
        tokenizer=None,
        device: str | None = None,
        dtype: str = "auto",
        name: str | None = None,
        chat_template: str | None = None,
    ):
        """`chat_template`: template text or file for a model loaded from its path (else its tokenizer's own, else
        PyroDash's default for a base model: `pyrodash.backends.hf.chat_template`)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model_or_path, (str, Path)):
            path = str(model_or_path)
            if not Path(path).exists() and path.startswith((".", "/")):
                raise ValueError(f"model path {path} does not exist: give an HF model directory or a hub id")
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            name = name or public_name(path, "model")  # never the directory: names reach clients
            tokenizer.chat_template = resolve_template(tokenizer, chat_template, name)
        elif chat_template is not None:
            raise ValueError("HFBackend(model, tokenizer): set the template on the tokenizer you pass")
        else:
            model = model_or_path
            if tokenizer is None:
                raise ValueError("HFBackend(model, tokenizer): pass the tokenizer together with a model object")
        if device is not None:
            model = model.to(device)
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or public_name(getattr(model.config, "_name_or_path", ""), type(model).__name__)
        self.device = next(model.parameters()).device
        eos = getattr(model.generation_config, "eos_token_id", None) if model.generation_config else None
        eos_list = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {int(e) for e in eos_list + [tokenizer.eos_token_id] if e is not None}
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        self._lock = threading.Lock()
        self.streams = StreamBatcher(self._decode_streams)  # streamed requests, decoded in batches as they wait
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters
        # the KV cache keyword: `cache` since transformers renamed it (`past_key_values` warns there), else the old one
        base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under PEFT: the wrapped model
        self._cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        self.lean = True  # decode steps through `lean_step` where it covers the model (same logits, less overhead)
        self._pieces: dict[int, str] = {}  # token id -> its text alone (top-k logprobs)
        # the KV of the sequences of keyed requests (`GenRequest.cache_key`: one relay answer's SLM requests), reused by
        # the answer's next request (pyrodash.backends.hf.prefix_cache); None turns it off, a PrefixCache sets other
        # bounds. None for a model with sliding-window layers (a cropped sliding-window cache is not a prefix's).
        self._full_attention = growing(growing_cache(model.config))  # (its caches crop to prefixes and stack as rows)
        self.prefix_cache: PrefixCache | None = PrefixCache() if self._full_attention else None
        self.answers = None  # an AnswerStore (pyrodash.backends.answer_store): greedy batch decodes kept, read back
        self.prompts = PromptMemo()  # rendered chat templates and tokenized prompts, each made once

    # ---- prompts -------------------------------------------------------------------------------------------
    def token_id(self, token: str) -> int | None:
        tid = self.tokenizer.convert_tokens_to_ids(token)
        if tid is None or tid == self.tokenizer.unk_token_id:
            return None
        return int(tid) if int(tid) < self.model.get_input_embeddings().weight.shape[0] else None

    @property
    def tool_format(self) -> str:
        """How this model writes a tool call (a `pyrodash.engine.tool_parser` family): "hermes" where its chat
        template shows `<tool_call>` blocks or none at all, "json" where the template offers tools in another shape."""
        template = getattr(self.tokenizer, "chat_template", None) or ""
        return "json" if "tools" in template and "<tool_call>" not in template else "hermes"

    def render(self, req: GenRequest) -> str:
        """The prompt text: chat template with a generation prompt, then the assistant prefix to continue
        (no messages: the prefix is the whole raw prompt, as in /v1/completions)."""
        if not req.messages:
            return req.prefix
        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise ValueError(f"{self.name}: the tokenizer has no chat_template; set tokenizer.chat_template")
        shown = json.dumps([req.messages, req.tools], sort_keys=True, default=str)
        key = ("template", shown, template)
        text = self.prompts.get(
            key, lambda: render_chat(self.tokenizer, req.messages, req.tools), lambda text: len(key[1]) + len(text)
        )
        return text + req.prefix

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """Token ids of the prompt; literal-marked spans are tokenized with special-token parsing off. Each prompt text
        is tokenized once (`prompts`; keyed with the vocabulary's size, so an added token is never served stale)."""
        text = self.render(req)
        ids = self.prompts.get(
            ("ids", text, len(self.tokenizer)), lambda: self._tokenize(text), lambda ids: len(text) + len(ids)
        )
        if not ids:
            raise ValueError(f"{self.name}: the prompt is empty; give messages or a non-empty prefix")
        return list(ids)

    def _tokenize(self, prompt: str) -> tuple[int, ...]:
        ids: list[int] = []
        for text, is_literal in literal.split(prompt):
            if is_literal:
                ids += self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            else:
                ids += self.tokenizer.encode(text, add_special_tokens=False)
        return tuple(ids)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def special_tokens(self) -> list[str]:
        """Every string the tokenizer turns into a single added/special token (what a client must not forge)."""
        return sorted(
            {t.content for t in self.tokenizer.added_tokens_decoder.values()} | set(self.tokenizer.all_special_tokens)
        )

    def context_window(self) -> int | None:
        """Positions the model was built for (prompt + generated tokens), or None when the config does not say."""
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    # ---- the decode loop -----------------------------------------------------------------------------------
    def _top(self, vals: list[float], ids: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        for v, i in zip(vals, ids):
            piece = self._pieces.get(i)
            if piece is None:  # each id decoded once per backend, not once per step and request
                piece = self._pieces[i] = self.tokenizer.decode([i], skip_special_tokens=False)
            out.setdefault(piece, v)
        return out

    def _forward(self, ids, mask, pos, cache) -> torch.Tensor:
        extra = {"logits_to_keep": 1} if self._keep_arg else {}  # no [B, L, V] logits for a long prompt
        extra[self._cache_arg] = cache
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra)
        return out.logits[:, -1, :].float()

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, attention mask, position ids) of `prompts` left-padded to one width, on the model's device."""
        bsz, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((bsz, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((bsz, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _generators(self, reqs: list[GenRequest]) -> list[torch.Generator | None]:
        """One seeded generator per sampled request (None: greedy); an unseeded request draws its seed here."""
        gens: list[torch.Generator | None] = []
        for r in reqs:
            g = None
            if r.temperature > _GREEDY_BELOW:  # vanishing temperatures are greedy (as in vLLM), not inf/nan
                g = torch.Generator(device=self.device)
                g.manual_seed(r.seed if r.seed is not None else int(torch.randint(0, 2**62, (1,))))
            gens.append(g)
        return gens

    def _record_step(self, seqs: list[_Seq], b: _Batch, raw: torch.Tensor, nxt: list[int], k_max: int, emit) -> None:
        """Push each row's next token into its sequence, with its top-k logprobs of the raw distribution when the
        request asked for them, and hand it to `emit` (streaming)."""
        top_v = top_i = None
        if k_max > 0:
            top_v, top_i = torch.topk(torch.log_softmax(raw, -1), k_max, dim=-1)
            top_v, top_i = top_v.tolist(), top_i.tolist()
        for j, i in enumerate(b.active):
            s = seqs[i]
            lp = None
            if s.req.top_logprobs > 0:
                k = s.req.top_logprobs
                lp = self._top(top_v[j][:k], top_i[j][:k])
                s.logprobs.append(lp)
            s.push(nxt[j])
            if emit is not None:
                emit(i, GenChunk(text=s.delta(), token_ids=[nxt[j]], top_logprobs=None if lp is None else [lp]))

    def _rest(self, prompt: list[int], n0: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, attention mask, position ids) of one prompt whose first `n0` positions are in the cache already."""
        ids = torch.tensor([prompt[n0:]], dtype=torch.long, device=self.device)
        mask = torch.ones((1, len(prompt)), dtype=torch.long, device=self.device)
        return ids, mask, torch.arange(n0, len(prompt), device=self.device)[None]

    def _keeper(self, prompts: list[list[int]], seqs: list[_Seq], cache, width: int, weights) -> Callable:
        """`keep(row, i)`: a keyed request i's KV (its row of `cache`, without the left padding) into the prefix cache,
        as the sequence of its prompt and generated ids."""

        def keep(row: int, i: int) -> None:
            key = seqs[i].req.cache_key
            if key is None:
                return
            pad = width - len(prompts[i])
            kv = (
                cache
                if cache.layers[0].keys.shape[0] == 1 and pad == 0
                else row_cache(cache, row, pad, self.model.config)
            )
            self.prefix_cache.put(prompts[i] + seqs[i].all_ids, kv, key, weights)

        return keep

    def _lookup(self, prompt: list[int], req: GenRequest) -> tuple[tuple | None, int | None]:
        """(`_decode`'s start, prompt tokens served) for a keyed request: the KV its answer's earlier sequence left in
        the prefix cache, (None, 0) when there is none; (None, None) without a key or a cache (nothing looked up)."""
        if self.prefix_cache is None or req.cache_key is None:
            return None, None
        kv, n0 = self.prefix_cache.take(prompt, req.cache_key, self._weights())
        return ((kv, n0) if kv is not None else None), n0

    def _weights(self) -> tuple:
        """What the prefix cache's KV depends on besides the ids: each parameter's storage and in-place version (an
        optimizer step or a `load_state_dict` changes it; a weight written through `.data` does not, nor does turning
        a PEFT adapter off: clear `prefix_cache` then)."""
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    @torch.inference_mode()
    def _decode(
        self,
        prompts: list[list[int]],
        reqs: list[GenRequest],
        emit: Callable[[int, GenChunk], None] | None = None,
        cancels: list[threading.Event] | None = None,
        starts: list[tuple | None] | None = None,
    ) -> list[_Seq]:
        """Decode all sequences together (left padding). Per step: logit_bias added, greedy rows take the argmax,
        sampled rows the Gumbel-max of their temperature/top-p distribution with their own seeded generator (so a
        request samples the same tokens alone or in any batch); top-k logprobs are of the raw distribution. A
        sequence that has finished leaves the batch (its rows of the KV cache too), so a long answer does not carry
        the finished short ones to its end; the cache grows in place (`kv_cache.growing_cache`). `starts`: per prompt,
        None or (KV cache, n0) holding its first n0 positions (`prefix_cache.take`): each prompt is then prefilled
        alone (only its rest where it has a start) and the rows stacked into one batch (`_prefill_rows`). `cancels`:
        per prompt, an event that ends its sequence before its next token. With a prefix cache, every keyed
        sequence's KV is kept in it (`_keeper`)."""
        seqs = [_Seq(r, self.tokenizer, self.eos_ids, incremental=emit is not None) for r in reqs]
        for s in seqs:
            s.done = s.req.max_tokens <= 0
            s.finish = "length" if s.done else None
        gens = self._generators(reqs)
        if starts is None:  # one left-padded batch, the prompts prefilled together: the model's own forward
            cache = growing_cache(self.model.config)
            ids, mask, pos = self._left_padded(prompts)
            logits = self._forward(ids, mask, pos, cache)
        else:
            logits, cache, mask, pos = self._prefill_rows(prompts, starts)
        step = (lean_step(self.model) if self.lean else None) or self._forward  # each token after it
        b = _Batch.of(reqs, logits, mask, pos, self.device)
        if self.prefix_cache is not None and growing(cache) and any(r.cache_key is not None for r in reqs):
            b.keep = self._keeper(prompts, seqs, cache, mask.shape[1], self._weights())
        k_max = max(r.top_logprobs for r in reqs)
        while not all(s.done for s in seqs):
            for s, c in zip(seqs, cancels or []):
                s.done = s.done or c.is_set()  # its stream's consumer went away: it leaves the batch now
            if all(s.done for s in seqs):
                break
            b.drop_finished(seqs, cache)
            raw = b.logits
            nxt = b.pick(raw if b.bias is None else raw + b.bias, gens).tolist()
            self._record_step(seqs, b, raw, nxt, k_max, emit)
            if all(s.done for s in seqs):
                break
            b.mask = torch.cat([b.mask, b.mask.new_ones((len(b.active), 1))], dim=1)
            b.pos = b.pos[:, -1:] + 1
            b.logits = step(torch.tensor(nxt, dtype=torch.long, device=self.device)[:, None], b.mask, b.pos, cache)
        if b.keep is not None:
            for j, i in enumerate(b.active):
                b.keep(j, i)
        for s in seqs:
            s.finalize()
        return seqs

    def _prefill_rows(self, prompts: list[list[int]], starts: list[tuple | None]) -> tuple:
        """(logits, cache, mask, positions) of `prompts` each prefilled alone (only its rest where its start holds the
        first n0 positions, as a lone stream prefills), their KV stacked into one left-padded batch (`stack_rows`)."""
        caches, logits = [], []
        for p, start in zip(prompts, starts, strict=True):
            cache, n0 = start if start is not None else (growing_cache(self.model.config), 0)
            ids, mask, pos = self._rest(p, n0) if n0 else self._left_padded([p])
            logits.append(self._forward(ids, mask, pos, cache))
            caches.append(cache)
        cache = caches[0] if len(caches) == 1 else stack_rows(caches, self.model.config)
        _, mask, pos = self._left_padded(prompts)
        return torch.cat(logits), cache, mask, pos

    def _decode_streams(self, jobs: list[StreamJob]) -> None:
        """The streamed requests waiting together (`StreamBatcher`), decoded as one batch, each stream fed its own
        tokens, then its final chunk (usage, the prompt tokens its prefix cache served) and the end. A model whose cache
        cannot be stacked (sliding-window layers) decodes them one by one."""
        if len(jobs) > 1 and not self._full_attention:
            for j in jobs:
                self._decode_streams([j])
            return
        with self._lock:
            looked = [self._lookup(j.prompt, j.req) for j in jobs]
            seqs = self._decode(
                [j.prompt for j in jobs],
                [j.req for j in jobs],
                emit=lambda i, c: jobs[i].put(c),
                cancels=[j.cancel for j in jobs],
                starts=[start for start, _ in looked],
            )
        for j, s, (_, cached) in zip(jobs, seqs, looked, strict=True):
            if not j.cancel.is_set():
                j.put(self._final(s, len(j.prompt), cached))
            j.put(_END)

    def _final(self, s: _Seq, n_prompt: int, cached: int | None) -> GenChunk:
        return GenChunk(
            text=s.delta() if s.done else "",
            finish_reason=s.finish or "length",
            stop_token_id=s.stop_id,
            prompt_tokens=n_prompt,
            completion_tokens=len(s.all_ids),
            cached_tokens=cached,  # prompt tokens served from the prefix cache (None: not looked up)
        )

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

        self.streams.submit(StreamJob(prompt, req, put, cancel))
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
        sampling is reproducible per request through `req.seed`. Requests that would decode the same tokens (the
        same prompt and settings, greedy or sampled with the same seed) are decoded once and each gets its own copy
        of the result (`same_decode`); each still counts and bills as its own call. With an answer store attached
        (`answers`, pyrodash.backends.answer_store) a greedy request decoded before in the run is read back from it,
        and the ones decoded here are kept there."""
        if not reqs:
            return []
        prompts = [self.prompt_ids(r) for r in reqs]
        keys = [same_decode(p, r) for p, r in zip(prompts, reqs)]
        owner: list[int] = []  # the request whose decode answers each request
        first: dict[tuple, int] = {}
        for i, key in enumerate(keys):
            owner.append(i if key is None else first.setdefault(key, i))
        unique = [i for i, o in enumerate(owner) if o == i]
        greedy = {i: keys[i] for i in unique if keys[i] is not None and reqs[i].temperature <= _GREEDY_BELOW}
        model = self.answers.fingerprint(self.model, self.eos_ids) if self.answers is not None and greedy else ""
        got: dict[int, GenResult] = self.answers.take(model, greedy) if model else {}
        todo = [i for i in unique if i not in got]
        bs = batch_size or max(len(todo), 1)
        for start in range(0, len(todo), bs):
            idx = todo[start : start + bs]
            got.update(zip(idx, self.generate_ids([prompts[i] for i in idx], [reqs[i] for i in idx])))
        if model:
            self.answers.keep(model, {i: greedy[i] for i in todo if i in greedy}, got, served=len(unique) - len(todo))
        return [got[i] if o == i else copy.deepcopy(got[o]) for i, o in enumerate(owner)]

    def generate_ids(self, prompts: list[list[int]], reqs: list[GenRequest]) -> list[GenResult]:
        """Generate for prompts given as token ids (one batch; `req.messages`/`req.prefix` are not read): what a
        trainer's rollouts hand over (Stage 3: TRL tokenizes the prompts)."""
        if len(prompts) != len(reqs):
            raise ValueError(f"{len(prompts)} prompts for {len(reqs)} requests")
        if not reqs:
            return []
        with self._lock:
            seqs = self._decode(prompts, reqs)
        return [
            GenResult(
                text=s.text,
                token_ids=list(s.all_ids),
                prompt_ids=p,
                finish_reason=s.finish or "length",
                stop_token_id=s.stop_id,
                prompt_tokens=len(p),
                completion_tokens=len(s.all_ids),
                top_logprobs=s.logprobs if s.req.top_logprobs > 0 else None,
            )
            for p, s in zip(prompts, seqs)
        ]

    def generate(self, req: GenRequest) -> GenResult:
        return self.generate_batch([req])[0]

    async def aclose(self) -> None:
        """Wait for decode threads still running (each stops before its next token once its stream is closed)."""
        threads = [t for t in self.streams.threads if t.is_alive()]
        if threads:
            await asyncio.to_thread(lambda: [t.join(timeout=30) for t in threads])
