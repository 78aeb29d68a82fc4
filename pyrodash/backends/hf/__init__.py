"""The in-process model stack: `HFBackend` (`backend.py`, our own KV-cached decode loop over transformers), its KV
caches (`kv_cache.py`, `prefix_cache.py`), the lean decode step (`lean_step.py`), chat-template resolution
(`chat_template.py`) and GGUF model paths (`gguf.py`). Importing this package imports no torch; `backend.py` does.
"""
