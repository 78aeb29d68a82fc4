"""Evaluation: methods (SLM, SLM+SFT, LLM, the routers, PyroDash, the oracles) x benchmarks -> per-example records."""
