#!/usr/bin/env bash
# One seed of tools/bench/learn_vs_trl.py on a GPU machine lent for about 30 minutes, where one command may run
# for 10 minutes at most: started detached, it outlives the command that starts it, and later commands poll it.
#   setsid nohup bash tools/bench/learn_vs_trl_loan.sh > /tmp/learn_loan.out 2>&1 < /dev/null &
#   ... later commands: tail "$OUT/console.log"; the run is over when "$OUT/ALLDONE" exists.
# Ours runs first (it needs no vLLM), with PYTHONPATH=/tmp/site:$PWD; TRL waits for "$VLLM_READY" (a file the
# command that finished unpacking vLLM into /tmp/vsite touches), so vLLM can be copied and unpacked while ours
# trains. Then TRL (PYTHONPATH=/tmp/vsite:/tmp/site:$PWD), then one evaluation of both runs' checkpoints.
# Needs: torch, DeepSpeed, Ray, transformers and trl 1.16 under /tmp/site (or the machine's own), SmolLM2 as an HF
# folder at $SMOL, SVAMP at $DATA/svamp/{train,test}.parquet (tools/data_preprocess/svamp.py) and, for GSM8K
# before/after, $DATA/gsm8k/test.parquet (skipped if absent).
# Settings: OUT (/tmp/qout), SMOL (/tmp/smol_hf), DATA (data), LEARN_SEED (1; a comma list runs each seed of each
# side in turn, each with its own empty compile caches), LEARN_BUDGET_S (540, per side and seed),
# LEARN_EVERY_S (60), GSM8K_ROWS (500), LEARN_ARGS (more training arguments, e.g. --strict-format: words split at
# spaces, no quoting), LEARN_SIDES (ours,trl: the sides to train; one side alone is scored by the same evaluator, so
# it can be set beside earlier runs of the other side), VLLM_READY (/tmp/vsite.ok), VLLM_WAIT_S (900: how long TRL,
# and the evaluator, wait for it).
# Files in $OUT: ours_s<seed>.json, trl_s<seed>.json, learn.json/.md/.png, logs.tgz (the consoles, the evaluation,
# TRL's result and ours' metrics.jsonl of every step), console.log, and ALLDONE at the end, holding
# "ok" or the steps that failed (the script then exits 1), or the line refusing a setting (exit 2).
set -u
OUT=${OUT:-/tmp/qout}
SMOL=${SMOL:-/tmp/smol_hf}
DATA=${DATA:-data}
LEARN_SEED=${LEARN_SEED:-1}
LEARN_BUDGET_S=${LEARN_BUDGET_S:-540}
LEARN_EVERY_S=${LEARN_EVERY_S:-60}
GSM8K_ROWS=${GSM8K_ROWS:-500}
read -r -a extra <<< "${LEARN_ARGS:-}"
VLLM_READY=${VLLM_READY:-/tmp/vsite.ok}
VLLM_WAIT_S=${VLLM_WAIT_S:-900}
LEARN_SIDES=${LEARN_SIDES:-ours,trl}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_CUDA_ARCH_LIST=9.0
mkdir -p "$OUT" /tmp/learn
case "$LEARN_SIDES" in ours|trl|ours,trl|trl,ours) ;;  # refused: earlier results kept, ALLDONE says why
  *) echo "LEARN_SIDES='$LEARN_SIDES': expected ours, trl or ours,trl" | tee "$OUT/ALLDONE"; exit 2;; esac
read -r -a seeds <<< "${LEARN_SEED//,/ }"
dups=$(printf '%s\n' "${seeds[@]}" | sort | uniq -d)
if [ "${#seeds[@]}" -eq 0 ] || [ -n "$dups" ] || printf '%s\n' "${seeds[@]}" | grep -qvxE '[0-9]+'; then
  echo "LEARN_SEED='$LEARN_SEED': expected a comma list of distinct whole numbers (e.g. 1,2)" | tee "$OUT/ALLDONE"
  exit 2
fi
rm -f "$OUT/ALLDONE" "$OUT"/ours_s*.json "$OUT"/trl_s*.json
failed=()
exec > >(tee -a "$OUT/console.log") 2>&1
date
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
common=(--model "$SMOL" --train "$DATA/svamp/train.parquet" --test "$DATA/svamp/test.parquet"
        --gsm8k "$DATA/gsm8k/test.parquet" --gsm8k-rows "$GSM8K_ROWS"
        --budget-s "$LEARN_BUDGET_S" --every-s "$LEARN_EVERY_S" --grace-s 45 --work-dir /tmp/learn --skip-eval
        "${extra[@]}")
# Each side starts with the files it imports already read once (outside its clock), so that neither pays for a
# fresh machine's cold disk cache and the side run second does not inherit the first one's reads.
warm() { local t=$SECONDS; python3 -c "import torch; torch.zeros(1, device='cuda'); import $1" >/dev/null 2>&1 \
  && echo "warm-up (imports $1): $((SECONDS - t)) s" || echo "warm-up of $1 failed; the side starts anyway"; }
# ... and each run (side and seed) with its own empty compile caches (inductor, Triton, vLLM), so that none finds
# graphs compiled by an earlier one
cold() { rm -rf "/tmp/learn_cache/$1"; export TORCHINDUCTOR_CACHE_DIR=/tmp/learn_cache/$1/inductor \
  TRITON_CACHE_DIR=/tmp/learn_cache/$1/triton VLLM_CACHE_ROOT=/tmp/learn_cache/$1/vllm; }
side() {  # side: each seed in turn, cold
  for seed in "${seeds[@]}"; do
    cold "$1_s$seed"
    python3 tools/bench/learn_vs_trl.py "${common[@]}" --sides "$1" --seeds "$seed" --out "$OUT/$1_s$seed.json" \
      || failed+=("$1_s$seed")
  done
  echo "$1 done $(date)"
}
if [[ ",$LEARN_SIDES," == *,ours,* ]]; then
  PYTHONPATH=/tmp/site:$PWD warm "transformers, deepspeed, ray, datasets, trainer.main"
  PYTHONPATH=/tmp/site:$PWD side ours
fi
waited=0
while [ ! -f "$VLLM_READY" ] && [ "$waited" -lt "$VLLM_WAIT_S" ]; do
  [ $((waited % 60)) -eq 0 ] && echo "waiting for $VLLM_READY (vLLM unpacked) before TRL and the evaluation: ${waited} s"
  sleep 2; waited=$((waited + 2))
done
[ -f "$VLLM_READY" ] || { echo "no $VLLM_READY after $VLLM_WAIT_S s: TRL not run, evaluation without vLLM"; failed+=(vllm); }
export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0
if [ -f "$VLLM_READY" ] && [[ ",$LEARN_SIDES," == *,trl,* ]]; then
  python3 -c "import trl, vllm, transformers, torch; print('trl', trl.__version__, 'vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
  warm "transformers, vllm, trl"
  side trl
fi
docs=$(ls "$OUT"/ours_s*.json "$OUT"/trl_s*.json 2>/dev/null | paste -sd, -)
if [ -n "$docs" ]; then  # score what was trained, even one side
  python3 tools/bench/learn_vs_trl.py --eval-from "$docs" --work-dir /tmp/learn --out "$OUT/learn.json" \
    "${extra[@]}" || failed+=(eval)  # LEARN_ARGS' --eval-* options; the training ones go unread here
else
  failed+=(eval)
fi
echo "eval done $(date)"
names=(eval.log eval.json)  # this call's runs only: /tmp/learn may hold an earlier call's too
for seed in "${seeds[@]}"; do
  names+=("ours_s$seed.log" "ours_s$seed/metrics.jsonl" "trl_s$seed.log" "trl_s${seed}_result.json")
done
logs=$(cd /tmp/learn && ls "${names[@]}" 2>/dev/null)
# shellcheck disable=SC2086  # file names without spaces, written by learn_vs_trl.py
[ -n "$logs" ] && (cd /tmp/learn && tar czf "$OUT/logs.tgz" $logs)
status=${failed[*]:-ok}
echo "done: $status"
sleep 1  # let tee write the last lines before ALLDONE tells a poller to read them
echo "$status" > "$OUT/ALLDONE"
[ "$status" = ok ]
