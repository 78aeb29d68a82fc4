"""`pyrodash check --llm SPEC [--slm SPEC]`: what PyroDash finds at an LLM endpoint (and an SLM server) before use.

    pyrodash check --llm http://127.0.0.1:8001/v1#llm
    pyrodash check --llm https://api.openai.com/v1#gpt-5-mini --slm http://127.0.0.1:8000/v1#slm
    pyrodash check --llm '{"url": "https://api.anthropic.com/v1", "model": "claude-x", "mode": "anthropic"}'

LLM: reachable, model served, API key accepted, the continuation mode (detected, or the configured one verified),
whether the server reports token usage, and whether tool calls work in that mode (one more short request offering a
function). SLM: its `<offload>` id, whether `stop_token_ids` is honoured, whether the
server reports `stop_reason`, and which stop ended a plain answer. Exit 0 when both are usable, 1 otherwise (the
last line then names the fix).
"""

from __future__ import annotations

import argparse
import json

from pyrodash.backends import load_backend
from pyrodash.backends.hf.chat_template import add_chat_template_argument
from pyrodash.backends.http.endpoint import LLMEndpoint, add_llm_mode_argument, is_http_spec, with_mode
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.backends.http.probe import probe_llm
from pyrodash.backends.http.slm_probe import probe_slm
from pyrodash.backends.loader import with_chat_template


def _spec(text: str):
    text = text.strip()
    return json.loads(text) if text.startswith("{") else text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--llm",
        required=True,
        type=_spec,
        help="LLM endpoint: http(s)://host:port/v1#model or a JSON spec {url, model, mode, api_key_env, tokenizer}",
    )
    add_llm_mode_argument(p)
    p.add_argument("--slm", type=_spec, default=None, help="SLM: http(s)://host:port/v1#model or a local model dir")
    add_chat_template_argument(p)


def run(args: argparse.Namespace) -> int:
    errors = []
    if is_http_spec(args.llm):
        spec = with_mode(args.llm, args.llm_mode)
        backend = OpenAICompatBackend.from_endpoint(LLMEndpoint.parse(spec))
        rep = probe_llm(backend, tools=True)
        print("\n".join(rep.lines()))
        errors += [rep.error] if rep.error else []
    else:
        print(f"LLM               {args.llm} (in process: continues the trace itself; nothing to probe)")
    if args.slm is not None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        srep = probe_slm(load_backend(with_chat_template(args.slm, args.chat_template)))
        print("\n".join(srep.lines()))
        errors += [srep.error] if srep.error else []
    if errors:
        print(f"pyrodash check: {len(errors)} problem(s); first: {errors[0]}")
        return 1
    print("pyrodash check: ok")
    return 0
