"""Which chat template an in-process model uses: the one given (a recipe's or serve config's `chat_template:`,
`--chat-template`), else the tokenizer's own, else PyroDash's default for base models that ship none
(docs/real-models.md). Training and serving resolve it the same way.

    tok.chat_template = resolve_template(tok, given, "gemma")
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("pyrodash.models")

# for base models that ship no template: role headers, each turn ended by the tokenizer's EOS (so generation stops
# there), assistant content and its EOS inside `{% generation %}` markers
DEFAULT_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '### ' + message['role'] + '\\n' -}}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- generation -%}{{- message['content'] + eos_token -}}{%- endgeneration -%}"
    "{%- else -%}{{- message['content'] + eos_token -}}{%- endif -%}"
    "{{- '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '### assistant\\n' -}}{%- endif -%}"
)


def read_template(value: str | None) -> str | None:
    """A template from a recipe's `chat_template:` / `--chat-template`: a path to a file (.jinja, ...) or the text."""
    if not value:
        return None
    if "{" not in value:
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"chat_template {value!r}: no such file (give a template file or the template text)")
        return path.read_text()
    return value


def resolve_template(tok, given: str | None, source) -> str:
    """The template a model trains with: `given` (recipe / flag), else the tokenizer's own, else
    `DEFAULT_CHAT_TEMPLATE` (a warning says so: a base model's turns then use that format everywhere)."""
    text = read_template(given)
    if text:
        return text
    if getattr(tok, "chat_template", None):
        return tok.chat_template
    log.warning(
        "%s: the tokenizer has no chat template; using PyroDash's default (docs/real-models.md), set "
        "`chat_template:` (recipe / serve config) or `--chat-template` to choose another",
        source,
    )
    return DEFAULT_CHAT_TEMPLATE


def add_chat_template_argument(p) -> None:
    """`--chat-template`, for the commands that load an in-process SLM or train one."""
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        default=None,
        help="the SLM's chat template (a Jinja file or the text), for a model that ships none or to replace its "
        "own (default: the tokenizer's, else PyroDash's: docs/real-models.md)",
    )
