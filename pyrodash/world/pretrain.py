"""Pretraining the world's two base models from scratch: Qwen3-shaped decoders on chat-formatted problems.

Both see the whole problem distribution. Loss is on the assistant part (solution + `<|im_end|>`), except that the
SLM's loss skips the results of lookups outside its known part of the table (`untaught_spans`): it learns the
format and the additions everywhere, and the table only where it was taught. A fraction of examples carries a
world-v1 system message (the offloading prompt P_s or the completion prompt P_l), so neither model breaks when the
engine adds one. Since the loss covers every assistant position, a model continues any prefix of its own solution
(how the engine hands off). Deterministic for a seed and a thread count: one seeded data order, torch seeded, no
data-loader workers (matmuls split over a different number of threads round differently).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from pyrodash.prompts import get_prompts
from pyrodash.world.config import ModelSpec, WorldConfig
from pyrodash.world.multiturn import pretrain_example
from pyrodash.world.task import make_known, make_table, sample_problem, solve, untaught_spans
from pyrodash.world.tokenizer import IM_END_ID, PAD_ID, VOCAB, encode_chat, save_tokenizer

BUCKET = 8  # batches drawn at once and sorted by length, so a batch pads little


def model_config(spec: ModelSpec):
    """The `Qwen3Config` of a world model (vocabulary = the world tokenizer's)."""
    from transformers import Qwen3Config

    if spec.hidden_size % spec.num_heads:
        raise ValueError(f"hidden_size {spec.hidden_size} must be divisible by num_heads {spec.num_heads}")
    return Qwen3Config(
        vocab_size=len(VOCAB),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        head_dim=spec.hidden_size // spec.num_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=None,
        eos_token_id=IM_END_ID,
        pad_token_id=PAD_ID,
        use_cache=True,
    )


def chat_example(question: str, solution: str, system: str | None = None) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": question}, {"role": "assistant", "content": solution}]


def example_stream(which: str, cfg: WorldConfig, seed: int) -> Iterator[tuple[list[int], list[int]]]:
    """Endless (input ids, labels) of pretraining examples for `which` in {"slm", "llm"}."""
    if which not in ("slm", "llm"):
        raise ValueError(f"which must be 'slm' or 'llm', not {which!r}")
    table, known = make_table(seed), make_known(cfg.known_frac)
    prompts = get_prompts("world-v1")
    systems = [prompts.offload_system, prompts.completion_system]
    rng = random.Random(f"world-pretrain-{seed}-{which}")
    # conversations come from their own generator, so the single-question examples are the same with or without them
    mt_rng = random.Random(f"world-pretrain-multiturn-{seed}-{which}")
    while True:
        if cfg.multiturn_frac and mt_rng.random() < cfg.multiturn_frac:
            system = mt_rng.choice(systems) if mt_rng.random() < cfg.system_frac else None
            ids, labels = pretrain_example(
                mt_rng,
                which,
                cfg.multiturn_turns,
                list(cfg.pretrain_tiers),
                list(cfg.followup_tiers),
                table,
                known,
                encode_chat,
                system,
                sample=lambda r, t: sample_problem(r, t, cfg.max_addend, cfg.pretrain_lead_runs),
            )
            yield ids[:-1], labels[:-1]  # as below: the trailing "\n" after the last <|im_end|> is never trained
            continue
        tier = rng.choice(cfg.pretrain_tiers)
        p = sample_problem(rng, tier, cfg.max_addend, cfg.pretrain_lead_runs)
        sol = solve(p, table)
        system = rng.choice(systems) if rng.random() < cfg.system_frac else None
        ids, mask = encode_chat(chat_example(p.question(), sol.text(), system))
        ids, mask = ids[:-1], mask[:-1]  # the trailing "\n" after <|im_end|> is never trained
        if which == "slm":
            start = mask.index(1)  # the solution's first character (one token per character)
            for a, b in untaught_spans(sol, known):
                mask[start + a : start + b] = [0] * (b - a)
        yield ids, [t if m else -100 for t, m in zip(ids, mask)]


def batch_stream(which: str, cfg: WorldConfig, seed: int, batch_size: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """Right-padded (input_ids, labels) batches; every BUCKET batches are cut from length-sorted examples."""
    stream = example_stream(which, cfg, seed)
    rng = random.Random(f"world-batches-{seed}-{which}")
    while True:
        rows = sorted((next(stream) for _ in range(batch_size * BUCKET)), key=lambda r: len(r[0]))
        chunks = [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
        rng.shuffle(chunks)
        for chunk in chunks:
            n = max(len(ids) for ids, _ in chunk)
            x = torch.full((len(chunk), n), PAD_ID, dtype=torch.long)
            y = torch.full((len(chunk), n), -100, dtype=torch.long)
            for i, (ids, labels) in enumerate(chunk):
                x[i, : len(ids)] = torch.tensor(ids)
                y[i, : len(ids)] = torch.tensor(labels)
            yield x, y


def lr_at(step: int, spec: ModelSpec) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    t = (step - spec.warmup_steps) / max(1, spec.train_steps - spec.warmup_steps)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train_step(model, opt, x: torch.Tensor, y: torch.Tensor) -> float:
    """One pretraining update in float32: forward, backward, clip to norm 1, optimizer step; the loss. (bf16
    autocast is slower here: measured on this machine kind, ms a step, float32 vs bf16, 1 / 2 threads: LLM 128 / 137
    and 77 / 97, SLM 60 / 100 on 1 thread: the models' matrices are too small for bf16 to pay for its casts.)"""
    loss = model(input_ids=x, labels=y).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def pretrain(
    which: str,
    cfg: WorldConfig,
    seed: int,
    progress=None,
    on_step: Callable[[int, float], None] | None = None,
    threads_from: tuple[int, int] | None = None,
) -> tuple[object, list[float]]:
    """Train `which` from scratch on the threads torch has; returns (model in eval mode, mean loss of every 50
    steps). `progress` is a rich Progress to draw a bar on; `on_step(step, loss)` is called after every step;
    `threads_from=(step, n)` moves training to n threads from that step on (at a fixed step, so deterministic)."""
    from transformers import Qwen3ForCausalLM

    spec = cfg.slm if which == "slm" else cfg.llm
    torch.manual_seed(seed * 1000 + (0 if which == "slm" else 1))
    model = Qwen3ForCausalLM(model_config(spec))
    # SDPA: PyTorch's CPU flash-attention kernel (builds of the earlier, 130-token world used eager attention).
    model.set_attn_implementation("sdpa")
    model.train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.98),
        fused=True,
    )
    task = progress.add_task(f"pretrain {which}", total=spec.train_steps) if progress is not None else None
    losses: list[float] = []
    running = 0.0
    for step, (x, y) in zip(range(spec.train_steps), batch_stream(which, cfg, seed, spec.batch_size)):
        if threads_from is not None and step == threads_from[0]:
            torch.set_num_threads(threads_from[1])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, spec)
        value = train_step(model, opt, x, y)
        running += value
        if (step + 1) % 50 == 0:
            losses.append(round(running / 50, 4))
            running = 0.0
        if task is not None:
            progress.update(task, advance=1, description=f"pretrain {which} loss {value:.3f}")
        if on_step is not None:
            on_step(step + 1, value)
    model.eval()
    return model, losses


def save_model(model, out_dir: str | Path) -> None:
    """`save_pretrained` the model with the world tokenizer and a generation config whose EOS is `<|im_end|>`."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(eos_token_id=IM_END_ID, pad_token_id=PAD_ID, do_sample=False)
    model.save_pretrained(str(out_dir))
    save_tokenizer(out_dir)
