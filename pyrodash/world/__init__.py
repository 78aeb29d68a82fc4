"""The built-in world: a synthetic step-by-step math task whose hard steps appear mid-solution, and two small
Qwen3-shaped models (SLM, LLM) trained from scratch on it, so the whole pipeline runs on a CPU in minutes.

    pyrodash world build --out worlds/demo --quick
    from pyrodash.world.build import build_world
    from pyrodash.data.benchmarks import load_world_split      # a built world's splits (also load_benchmark)

Modules: task.py (generator), tokenizer.py (char-level tokenizer + chat template), config.py (WorldConfig presets),
pretrain.py (training from scratch), evaluate.py (batched greedy accuracy), build.py (build, cache, load splits).
"""
