"""The batch driver cuts an in-process model's batches from its requests ordered shortest prompt first
(`pyrodash.engine.batch._shortest_first`): a left-padded batch then prefills little padding, and every answer is still
the one its question gets alone, in the caller's order. Reverting to the callers' order fails the batch check; a
mix-up of the results' order fails the answer check."""

from __future__ import annotations

from tiny_models import tiny_model

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.prompts import get_prompts


def test_batches_go_shortest_prompt_first_and_answers_keep_the_callers_order():
    slm, llm = HFBackend(*tiny_model(seed=0), name="slm"), HFBackend(*tiny_model(seed=1), name="llm")
    seen: list[list[int]] = []
    generate = llm.generate_batch

    def spy(reqs, batch_size=None):
        seen.append([len(llm.prompt_ids(r)) for r in reqs])
        return generate(reqs, batch_size)

    llm.generate_batch = spy
    engine = CollaborateEngine(slm, llm, get_prompts("world-v1"), Prices(0, 0, 0, 0), max_tokens=12)
    questions = [f"question {i}: " + "and more " * n for i, n in enumerate([40, 2, 30, 5, 25, 1, 35, 8])]
    together = engine.batch(questions, mode="llm", batch_size=3)
    assert len(seen) == 3
    flat = [n for batch in seen for n in batch]
    assert flat == sorted(flat)  # each batch holds neighbours in length
    seen.clear()
    alone = [engine.batch([q], mode="llm")[0] for q in questions]
    assert len({d.output for d in alone}) > 1  # (answers that differ, so an order mix-up shows)
    assert [d.output for d in together] == [d.output for d in alone]
    assert [d.usage.llm_in for d in together] == [d.usage.llm_in for d in alone]
