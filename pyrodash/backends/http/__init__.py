"""The OpenAI-compatible client stack: `OpenAICompatBackend` (`openai_compat.py`), its continuation modes
(`continuation.py`), the endpoint spec (`endpoint.py`), the start-up probes of an LLM and an SLM server (`probe.py`,
`slm_probe.py`) and the two upstream HTTP clients (`lean_client.py` for plain http, `aiohttp_client.py` otherwise).
"""
