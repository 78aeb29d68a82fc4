#!/bin/bash
# benchmarks/gateway_overhead.py on a machine with more cores and no network (e.g. a lent GPU machine with Python 3.12
# and torch/transformers/httpx/rich/uvloop already there): the missing packages travel as wheels in .whl/.
#
# Here, once (the packages LiteLLM's proxy and `pyrodash serve` import that such a machine lacks; ~54 MB):
#   .venv-litellm/bin/pip list --format=freeze > /tmp/w.txt   # then keep the names the other machine lacks, and add
#   fastapi uvicorn httptools openai jiter distro pydantic pydantic_core starlette (the versions of .venv), then
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl -r /tmp/w.txt
# There:   ROUNDS=3 bash benchmarks/gateway_many_cores.sh     (W="4 8" by default: one run per worker count, both gateways;
#          results also in $OUT/gateway_c64_w<W>.txt). With 4 workers each takes ~16 of the 64 requests that arrive
#          at once and sets them up one after the other (docs/scaling.md section 3: its own header 6.19 ms at p50),
#          then relays them at 1 ms a token (~0.6 of a core at ~40 us a token, `benchmarks/ce_cpu.py` on 2 cores,
#          2026-11-27): more workers shorten both, so one call compares them.
set -o pipefail
PY=${PY:-python3}
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# compiled once here, not by each gateway worker at its start
$PY -m compileall -q -j 0 /tmp/site/litellm /tmp/site/fastapi /tmp/site/pydantic /tmp/site/openai pyrodash >/dev/null 2>&1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "cores: $(nproc)"
for w in ${W:-4 8}; do
  echo "workers: $w"
  timeout "${T64:-170}" $PY benchmarks/gateway_overhead.py --concurrency 64 1 --rounds "${ROUNDS:-3}" --requests "${REQ:-5}" \
    --workers "$w" --litellm /tmp/site/bin/litellm 2>&1 | tee "$OUT/gateway_c64_w$w.txt" | grep -v '^    '
done
timeout 100 $PY benchmarks/engine_overhead.py --runs 30 2>&1 | tail -2 | tee "$OUT/handoff.txt"
