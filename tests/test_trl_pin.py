"""The `trl` pin (pyproject: trl>=1.14.2): from that release on, GRPO takes its generation stop ids from the model's
`generation_config.eos_token_id`, so Stage 3 rollouts stop at `<offload>` (which Stage 3 adds there). trl 1.14.1 and
earlier stop only at the tokenizer's EOS: rollouts would run past `<offload>`, never hand off, and Stage 3 would train
with zero handoffs. This test fails on such a trl."""

from __future__ import annotations

import datasets
from tiny_models import tiny_model

from pyrodash.prompts import OFFLOAD_TOKEN


def test_grpo_rollouts_stop_at_offload(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    model, tok = tiny_model(seed=0)
    tid = tok.convert_tokens_to_ids(OFFLOAD_TOKEN)
    model.generation_config.eos_token_id = sorted({tok.eos_token_id, tid})  # what Stage 3 does
    cfg = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=8,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        max_steps=1,
    )
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": "x"}]}] * 2)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
    )
    stops = trainer.generation_config.eos_token_id
    stops = [stops] if isinstance(stops, int) else list(stops or [])
    assert tid in stops, f"this trl's GRPO does not stop rollouts at {OFFLOAD_TOKEN}: install trl>=1.14.2"
    # the completion mask ends at the first stop id too (else the tokens after <offload> would be trained on)
    assert tid in getattr(trainer, "eos_token_ids", []), "this trl masks completions at the tokenizer's EOS only"
