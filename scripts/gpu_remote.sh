#!/usr/bin/env bash
# The GPU check on a lent CUDA machine that has PyTorch (CUDA 13) but neither onnxruntime-gpu
# nor hybridrt's server packages, reached by calls that each carry at most 64 MiB (docs/gpu.md,
# "Reproduce"). Run from the repository root there:
#
#   bash scripts/gpu_remote.sh part 0      # first call: .whl/q0, .whl/py, .gpuwork/configs;
#                                          # starts the background job (checkpoints, exports)
#   bash scripts/gpu_remote.sh part 1 / 2  # one part of onnxruntime-gpu each
#   bash scripts/gpu_remote.sh main SECONDS  # last part, install, the check (scripts/gpu_check.py)
#
# .whl/q0..q3: `split -b 58m` of a tar.xz of onnxruntime-gpu 1.31.1's `onnxruntime` folder and
# dist-info (without libonnxruntime.so, which the Python module does not load); .whl/ort2.sha256
# its checksum; .whl/py: starlette and uvicorn wheels (the server). Files land under /tmp there.
set -euo pipefail
PY=python3
ROOT=$(pwd)

background() {  # checkpoints, float32 exports, then (once onnxruntime-gpu is in) float16 conversions
  cd /tmp/repo
  export PYTHONPATH=/tmp/repo TOKENIZERS_PARALLELISM=false
  for n in granite-h-1b granite-h-350m jamba-125m; do  # jamba: Mamba1 (Scans) with attention
    d=/tmp/gw/bench/$n
    $PY benchmarks/make_bench_checkpoint.py /tmp/configs/$n.json -o $d/hf
    $PY -c "import sys, hybridrt; hybridrt.export_model(sys.argv[1], sys.argv[2], validate=False)" $d/hf $d/f32 \
      || echo "export of $n failed here: gpu_check.py exports it"
    echo "$n exported at $(date +%T)"
  done
  while [ ! -f /tmp/ort/ready ]; do sleep 2; done
  export PYTHONPATH=/tmp/ort:/tmp/repo
  convert() {  # directory, output, kv dtype
    $PY -c "import sys; from hybridrt.quantization import quantize; quantize(sys.argv[1], sys.argv[2], 'float16', kv_dtype=sys.argv[3])" "$@"
  }
  convert /tmp/gw/bench/granite-h-1b/f32 /tmp/gw/bench/granite-h-1b/f16kv float16 &
  convert /tmp/gw/bench/granite-h-1b/f32 /tmp/gw/bench/granite-h-1b/f16 float32 &
  convert /tmp/gw/bench/granite-h-350m/f32 /tmp/gw/bench/granite-h-350m/f16kv float16 &
  convert /tmp/gw/bench/jamba-125m/f32 /tmp/gw/bench/jamba-125m/f16kv float16 &
  wait
  echo "converted at $(date +%T)"
  touch /tmp/gw/ready
}

case "$1" in
  part)
    mkdir -p /tmp/parts
    cp ".whl/q$2" /tmp/parts/
    if [ "$2" = 0 ]; then
      rm -rf /tmp/repo /tmp/gw && mkdir -p /tmp/repo /tmp/gw/bench /tmp/site
      cp -r hybridrt scripts benchmarks tests pyproject.toml /tmp/repo/
      cp -r .gpuwork/configs /tmp/configs
      $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/py/*.whl
      setsid nohup bash /tmp/repo/scripts/gpu_remote.sh background >/tmp/bg.log 2>&1 </dev/null &
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    fi
    ls -la /tmp/parts
    ;;
  background)
    background
    ;;
  main)
    budget=$2
    cp .whl/q3 /tmp/parts/
    cat /tmp/parts/q0 /tmp/parts/q1 /tmp/parts/q2 /tmp/parts/q3 >/tmp/ort2.tar.xz
    (cd /tmp && sed 's#ort2.tar.xz#/tmp/ort2.tar.xz#' "$ROOT/.whl/ort2.sha256" | sha256sum -c -)
    mkdir -p /tmp/ort && tar -C /tmp/ort -xJf /tmp/ort2.tar.xz && touch /tmp/ort/ready
    export PYTHONPATH=/tmp/ort:/tmp/site:$ROOT PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
    $PY scripts/gpu_check.py --work .gpuwork --out "$OUT" --no-transformers \
      --device-paths llama granitemoehybrid mamba2 --budget $((budget / 3)) 2>&1 | tee "$OUT/families.log" | cut -c1-300
    mv "$OUT/gpu.json" "$OUT/families.json"
    while [ ! -f /tmp/gw/ready ] && [ "$SECONDS" -lt $((budget / 2)) ]; do sleep 2; done
    cp /tmp/bg.log "$OUT/background.log"
    $PY scripts/gpu_check.py --work .gpuwork --bench-work /tmp/gw --out "$OUT" --skip-families \
      --configs /tmp/configs/granite-h-1b.json /tmp/configs/jamba-125m.json /tmp/configs/granite-h-350m.json \
      --runs hybridrt_f16kv_graph hybridrt_f16kv hybridrt_f32 torch_bf16 torch_f32 hybridrt_f16 serve \
      --serve-seconds 100 --budget $((budget - SECONDS - 20)) 2>&1 | tee "$OUT/bench.log" | cut -c1-400
    ;;
esac
