#!/usr/bin/env bash
# Multi-GPU fine-tunes through the HF Trainer, on one GPU machine, from the repository root:
#   FSDP2 (--fsdp full_shard --fsdp_config benchmarks/configs/fsdp2.json) and DeepSpeed ZeRO-3
#   (--deepspeed benchmarks/configs/zero3.json), each without and with --use_liger_kernel (liger_core_hf
#   launcher), a random-init Llama-3.2-1B-shaped model, 30 steps. Then benchmarks/multigpu_report.py checks
#   the runs (all ranks finished, loss curves agree) and writes summary.csv/json + loss_curves.png.
#
#   bash benchmarks/run_multigpu.sh                # GPU machine; deepspeed from benchmarks/wheelhouse/
#   DEVICE=cpu bash benchmarks/run_multigpu.sh     # CPU rehearsal: tiny model, gloo, 3 steps (minutes);
#                                                  # python3 must import deepspeed there (no wheelhouse)
#
# Knobs (environment): NPROC (GPUs; default: all), STEPS (30), SEQ (2048), BATCH (4 per GPU), MODEL_SIZE (1b),
# RUNS ("fsdp2_base fsdp2_liger zero3_base zero3_liger"), RUN_TIMEOUT_S (200 per run), TOTAL_BUDGET_S (all
# runs, 540), RESULTS
# (benchmarks/results/run/multigpu). The deepspeed wheels come from benchmarks/wheelhouse/ (fill it here with
# benchmarks/fill_wheelhouse.sh; the GPU machine has no package index). Exit status 1 if any run failed or a
# check failed; the log and the results are also copied to $OUT when it is set.
set -u -o pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}  # NVLink multicast off: not every host's driver supports it
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
DEVICE=${DEVICE:-gpu}
RESULTS=${RESULTS:-$root/benchmarks/results/run/multigpu}
RUNS=${RUNS:-fsdp2_base fsdp2_liger zero3_base zero3_liger}
if [ "$DEVICE" = cpu ]; then
  export TRITON_INTERPRET=1 DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES=""
  NPROC=${NPROC:-2} STEPS=${STEPS:-3} SEQ=${SEQ:-32} BATCH=${BATCH:-2} MODEL_SIZE=${MODEL_SIZE:-tiny}
  RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-900} TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-3600}
  EXTRA=(--use_cpu --vocab_size 256 --num_examples 64)
  PRECISION=()
else
  unset TRITON_INTERPRET
  export DS_ACCELERATOR=${DS_ACCELERATOR:-cuda}
  NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
  STEPS=${STEPS:-30} SEQ=${SEQ:-2048} BATCH=${BATCH:-4} MODEL_SIZE=${MODEL_SIZE:-1b}
  RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-200} TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-540}
  EXTRA=()
  PRECISION=(--bf16)
fi
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.rank*.json
LOG="$RESULTS/run_multigpu.log"
exec > >(tee "$LOG") 2>&1

SITE=/tmp/liger_multigpu_site
if [ "$DEVICE" != cpu ] && compgen -G "benchmarks/wheelhouse/*.whl" >/dev/null; then  # cp312 wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    benchmarks/wheelhouse/*.whl || { echo "FAIL: wheelhouse install"; exit 1; }
fi
export PYTHONPATH="$root:$root/integrations/hf_trainer:$SITE${PYTHONPATH:+:$PYTHONPATH}"
echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) device=$DEVICE nproc=$NPROC steps=$STEPS"
python3 - <<'EOF' || { echo "FAIL: environment"; exit 1; }
import importlib, torch, transformers, accelerate
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(),
      "| transformers", transformers.__version__, "| accelerate", accelerate.__version__)
try:
    import deepspeed
    print("deepspeed", deepspeed.__version__)
except Exception as e:  # reported; the zero3 runs then fail loudly
    print("deepspeed NOT importable:", type(e).__name__, e)
EOF
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv

COMMON=(--output_dir /tmp/liger_multigpu_out --max_steps "$STEPS" --per_device_train_batch_size "$BATCH"
  --seq_len "$SEQ" --model_size "$MODEL_SIZE" --learning_rate 1e-4 --lr_scheduler_type constant
  --warmup_steps 0 --logging_steps 1 --save_strategy no --report_to none --disable_tqdm true
  --dataloader_num_workers 0 --seed 42 --max_grad_norm 1.0 --results_dir "$RESULTS" "${PRECISION[@]}"
  "${EXTRA[@]}")
failed=()
t0=$(date +%s)
for name in $RUNS; do
  engine=${name%_*}
  case "$engine" in
    fsdp2) ENGINE_ARGS=(--fsdp full_shard --fsdp_config benchmarks/configs/fsdp2.json) ;;
    zero3) ENGINE_ARGS=(--deepspeed benchmarks/configs/zero3.json) ;;
    *) echo "FAIL: unknown engine in run name $name"; failed+=("$name"); continue ;;
  esac
  LIGER=()
  [ "${name##*_}" = liger ] && LIGER=(--use_liger_kernel)
  start=$(date +%s)
  left=$(( TOTAL_BUDGET_S - (start - t0) - 15 ))  # keep 15 s for the report
  limit=$(( left < RUN_TIMEOUT_S ? left : RUN_TIMEOUT_S ))
  if [ "$limit" -lt 30 ]; then echo "FAIL: no time left for run $name"; failed+=("$name"); continue; fi
  echo "== run $name: ${ENGINE_ARGS[*]} ${LIGER[*]} (limit ${limit} s)"
  timeout -k 10 "$limit" python3 -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
    -m liger_core_hf.launch benchmarks/multigpu_sft.py "${COMMON[@]}" "${ENGINE_ARGS[@]}" "${LIGER[@]}" \
    --run_name "$name" 2>&1 | grep --line-buffered -vE "FutureWarning|return func\(|^\s*warnings.warn|reducer.cpp"
  rc=${PIPESTATUS[0]}
  echo "== run $name: exit $rc after $(( $(date +%s) - start )) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
done

python3 benchmarks/multigpu_report.py "$RESULTS" --runs $RUNS --world-size "$NPROC"
report_rc=$?
if [ -n "${OUT:-}" ]; then
  cp "$LOG" "$RESULTS"/summary.* "$RESULTS"/loss_curves.png "$OUT"/ 2>/dev/null
  tar czf "$OUT/multigpu_results.tar.gz" -C "$RESULTS" . 2>/dev/null
fi
if [ ${#failed[@]} -gt 0 ] || [ "$report_rc" -ne 0 ]; then
  echo "MULTIGPU FAILED: runs ${failed[*]:-none}; report exit $report_rc"
  exit 1
fi
echo "MULTIGPU OK: $RUNS"
