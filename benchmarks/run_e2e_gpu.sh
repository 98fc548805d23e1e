#!/usr/bin/env bash
# End-to-end GPU runs, from the repository root, with the peer wheels in .whl/ (see run_gpu.sh):
#   1. benchmarks/e2e_llama1b.py   Llama-3.2-1B shape: HF vs liger-kernel vs liger_core (tokens/s, peak memory)
#   2. benchmarks/convergence.py   bf16 100-step loss curves, patched vs unpatched (Llama- and Qwen2-shaped)
#   3. HF Trainer SFT run with and without --use_liger_kernel (integrations/hf_trainer/examples/sft_gpu.py)
# Results land in benchmarks/results/ and $OUT (the SFT log) and are packed into $OUT/e2e_results.tar.gz.
set -u -o pipefail
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/benchmarks/results/run}
mkdir -p "$OUT"
SITE=/tmp/liger_peer_site
compgen -G ".whl/*.whl" >/dev/null &&
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
export PYTHONPATH="$root:$root/integrations/hf_trainer:$SITE"
exec > >(tee -a "$OUT/e2e_gpu.log") 2>&1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
echo "== e2e"; timeout -k 10 300 python3 benchmarks/e2e_llama1b.py --timeout 150
echo "== convergence"; timeout -k 10 150 python3 benchmarks/convergence.py
ARGS="--output_dir /tmp/sft --bf16 --max_steps 12 --per_device_train_batch_size 4 --logging_steps 1
      --save_strategy no --report_to none --optim adamw_torch_fused --learning_rate 1e-5 --disable_tqdm true"
for flag in "" "--use_liger_kernel"; do
  echo "== sft ${flag:-(no flag)}"
  # shellcheck disable=SC2086
  timeout -k 10 120 python3 -m liger_core_hf.launch integrations/hf_trainer/examples/sft_gpu.py $ARGS $flag |
    tee -a "$OUT/sft_gpu_runs.log" | grep -E "^RESULT|Error|liger_core" | tail -5
done
tar czf "$OUT/e2e_results.tar.gz" benchmarks/results/e2e_* benchmarks/results/convergence_* "$OUT/sft_gpu_runs.log" 2>/dev/null
ls -la "$OUT"
