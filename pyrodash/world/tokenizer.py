"""The built-in world's character-level tokenizer, built locally with the `tokenizers` library.

One token per printable ASCII character plus newline and tab, one per role word (a template costs 8 tokens, not 19),
and `<|im_start|>`, `<|im_end|>` (EOS), `<|endoftext|>` (padding), `<|unk|>`. The Qwen-style chat template wraps
assistant content in `{% generation %}` markers (TRL's assistant-only loss). `<offload>` is not in the vocabulary:
Stage 1 adds it. `render_chat` / `encode_chat` reproduce the template in plain Python (fast; tests check they agree).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pyrodash.chat import CALL_CLOSE, CALL_OPEN, template_messages

IM_START, IM_END, PAD, UNK = "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|unk|>"
SPECIAL_TOKENS = (PAD, IM_START, IM_END, UNK)  # ids 0..3
CHARS = "\n\t" + "".join(chr(c) for c in range(32, 127))
ROLES = ("system", "user", "assistant")  # one token each, wherever they appear (as HF added tokens match)
_ROLE_RE = re.compile("|".join(ROLES))

# a tool call as the world writes it: one compact JSON block between `chat.CALL_OPEN` and `chat.CALL_CLOSE` (the
# Hermes family of `pyrodash.engine.tool_parser`)
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>tools\n' -}}"
    "{%- for tool in tools -%}{{- (tool.function if tool.function is defined else tool) | tojson(separators=(',', ':'))"
    " + '\n' -}}{%- endfor -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- generation -%}{{- message['content'] or '' -}}"
    "{%- for tc in message.get('tool_calls') or [] -%}"
    "{%- set fn = tc.function if tc.function is defined else tc -%}"
    "{{- '<tool_call>{\"name\":' + (fn.name | tojson) + ',\"arguments\":' + "
    "(fn.arguments | tojson(separators=(',', ':')) if fn.arguments is mapping else fn.arguments) + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\n' -}}"
    "{%- elif message['role'] in ['system', 'user', 'tool'] -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- else -%}"
    "{{- raise_exception('world chat template: role must be system, user, assistant or tool, not '"
    " + message['role']) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def _compact(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def call_text(name: str, arguments) -> str:
    """One tool call as the world writes it (`arguments`: an object, or JSON text kept as it is)."""
    args = arguments if isinstance(arguments, str) else _compact(arguments)
    return f'{CALL_OPEN}{{"name":{json.dumps(name, ensure_ascii=False)},"arguments":{args}}}{CALL_CLOSE}'


def _assistant_text(m: dict) -> str:
    """An assistant message's content and its tool calls (arguments parsed as a template reads them:
    `chat.template_messages`), as the template writes them."""
    (shown,) = template_messages([m])
    calls = [call_text(tc.get("function", tc)["name"], tc.get("function", tc).get("arguments")) for tc in
             shown.get("tool_calls") or []]  # fmt: skip
    return (m.get("content") or "") + "".join(calls)


def _tools_text(tools: list[dict] | None) -> str:
    if not tools:
        return ""
    lines = "".join(_compact(t.get("function", t)) + "\n" for t in tools)
    return f"{IM_START}tools\n{lines}{IM_END}\n"


VOCAB: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(CHARS) + ROLES)}
PAD_ID, IM_START_ID, IM_END_ID, UNK_ID = (VOCAB[t] for t in SPECIAL_TOKENS)


def build_tokenizer():
    """A `PreTrainedTokenizerFast` over the world vocabulary, with the chat template and special tokens set."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.add_tokens([AddedToken(r, normalized=False) for r in ROLES])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[IM_START],
        model_max_length=1024,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(out_dir: str | Path):
    """Build the tokenizer and `save_pretrained` it into `out_dir`; returns it."""
    tok = build_tokenizer()
    tok.save_pretrained(str(out_dir))
    return tok


def render_chat(messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None) -> str:
    """The chat template in plain Python (same text as `apply_chat_template(..., tokenize=False, tools=tools)`)."""
    out = [_tools_text(tools)]
    for m in messages:
        role = _role(m)
        text = _assistant_text(m) if role == "assistant" else m["content"]
        out.append(f"{IM_START}{role}\n{text}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def _role(m: dict) -> str:
    role = m["role"]
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"world chat template: role must be system, user, assistant or tool, not {role!r}")
    return role


def encode_text(text: str) -> list[int]:
    """Ids of plain text with no special tokens in it: one id per role word (`ROLES`), else one per character
    (characters outside the vocabulary map to `<|unk|>`)."""
    ids, pos = [], 0
    for m in _ROLE_RE.finditer(text):
        ids += [VOCAB.get(c, UNK_ID) for c in text[pos : m.start()]]
        ids.append(VOCAB[m.group()])
        pos = m.end()
    return ids + [VOCAB.get(c, UNK_ID) for c in text[pos:]]


def encode_chat(
    messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None
) -> tuple[list[int], list[int]]:
    """(input ids, assistant mask) of a chat: the mask is 1 on assistant content (its tool calls included) and its
    `<|im_end|>` only, exactly as `apply_chat_template(..., return_assistant_tokens_mask=True)` marks them."""
    ids: list[int] = []
    mask: list[int] = []
    if tools:
        head = [IM_START_ID] + encode_text(_tools_text(tools)[len(IM_START) : -len(IM_END) - 1]) + [IM_END_ID]
        ids += head + [VOCAB["\n"]]
        mask += [0] * (len(head) + 1)
    for m in messages:
        role = _role(m)
        head = [IM_START_ID] + encode_text(role + "\n")
        ids += head
        mask += [0] * len(head)
        body = encode_text(_assistant_text(m) if role == "assistant" else m["content"]) + [IM_END_ID]
        ids += body
        mask += [int(role == "assistant")] * len(body)
        ids.append(VOCAB["\n"])
        mask.append(0)
    if add_generation_prompt:
        head = [IM_START_ID] + encode_text("assistant\n")
        ids += head
        mask += [0] * len(head)
    return ids, mask
