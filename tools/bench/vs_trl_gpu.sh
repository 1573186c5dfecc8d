#!/usr/bin/env bash
# TRL vs this project on one H200 (tools/bench/vs_trl.py), one job per call of under 10 minutes.
# Needs on the machine: torch, DeepSpeed, Ray, transformers, trl 1.16 and vLLM importable from PYTHONPATH below,
# SmolLM2-135M-Instruct as an HF folder at $SMOL and GSM8K at data/gsm8k/train.parquet
# (`huggingface-cli download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir $SMOL`; tools/data_preprocess/gsm8k.py).
#   PART=smol OUT=/some/dir bash tools/bench/vs_trl_gpu.sh     job 1 (about 330 s: three sides of about 100 s each)
#   PART=qwen OUT=/some/dir bash tools/bench/vs_trl_gpu.sh     job 2 (up to BUDGET_S; a 1.5B side takes minutes)
#   PART=all runs both in one call, which only fits when BUDGET_S allows (job 1 leaves QWEN_RESERVE_S to job 2).
# Job 1 (smol): SmolLM2-135M, GSM8K, 16 prompts x 8 samples, up to 256 tokens, micro-batch 64, SMOL_STEPS (4)
#   steps: SMOL_SIDES (trl_vllm,ours_hf,ours_vllm).
# Job 2 (qwen): random-weight Qwen2-1.5B architecture with SmolLM2's tokenizer, GSM8K prompts, QWEN_BATCH (64)
#   x 8, exactly 512 tokens (ignore_eos), micro-batch 8, QWEN_STEPS (2) steps: QWEN_SIDES (trl_vllm,ours_vllm).
# BUDGET_S (default 570) bounds the whole script: each side gets at most what is left (vs_trl.py --budget-s); a
# side stopped at its limit keeps the steps it wrote (with a note; none written: reported as failed), the sides
# before it kept. OURS_PROFILE_STEPS (e.g. 4): ours' worker calls of those steps run under torch.profiler (left out
# of the means; tables in logs.tgz, Chrome traces in traces.tgz when it stays under 15 MiB). SMOL_EXTRA: more
# vs_trl.py arguments for job 1 (word-split), e.g. "--ours-override algorithm.rollout_correction.rollout_is=token"
# to force the old-log-prob pass. Files in $OUT (at most 8): smol.json/.md/_split.png, qwen.json/.md/_split.png,
# logs.tgz (every side's log, the profile tables), traces.tgz (not with PART=all), console.log.
set -u
OUT=${OUT:-/tmp/out}
SMOL=${SMOL:-/tmp/smol_hf}
PART=${PART:-smol}
BUDGET_S=${BUDGET_S:-570}
QWEN_RESERVE_S=${QWEN_RESERVE_S:-330}
SMOL_STEPS=${SMOL_STEPS:-4}
SMOL_SIDES=${SMOL_SIDES:-trl_vllm,ours_hf,ours_vllm}
QWEN_BATCH=${QWEN_BATCH:-64}
QWEN_STEPS=${QWEN_STEPS:-2}
QWEN_SIDES=${QWEN_SIDES:-trl_vllm,ours_vllm}
OURS_PROFILE_STEPS=${OURS_PROFILE_STEPS:-}
SMOL_EXTRA=${SMOL_EXTRA:-}
export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_CUDA_ARCH_LIST=9.0
mkdir -p "$OUT" /tmp/vs
exec > >(tee -a "$OUT/console.log") 2>&1
end=$(( $(date +%s) + BUDGET_S ))
left() { echo $(( end - $(date +%s) )); }
common=(--data data/gsm8k/train.parquet --n 8 --lr 1e-6 --max-prompt-len 256 --trl-vllm-gpu-util 0.3
        --vllm-gpu-util 0.3 --seed 1 ${OURS_PROFILE_STEPS:+--ours-profile-steps "$OURS_PROFILE_STEPS"})
if [ "$PART" != qwen ]; then
  reserve=0; [ "$PART" = all ] && reserve=$QWEN_RESERVE_S
  b=$(( $(left) - reserve - 15 ))
  timeout -k 10 $(( b + 40 )) python3 tools/bench/vs_trl.py --model "$SMOL" "${common[@]}" --batch 16 --micro 64 \
    --response-len 256 --steps "$SMOL_STEPS" --sides "$SMOL_SIDES" --timeout 170 --budget-s "$b" \
    --work-dir /tmp/vs/smol --out "$OUT/smol.json" $SMOL_EXTRA
fi
if [ "$PART" != smol ]; then
  timeout -k 10 120 python3 tools/bench/random_model.py qwen2-1.5b --tokenizer "$SMOL" --out /tmp/qwen2_rand \
    --seed 1
  b=$(( $(left) - 30 ))
  timeout -k 10 $(( b + 40 )) python3 tools/bench/vs_trl.py --model "$SMOL" --random-config qwen2-1.5b \
    --random-dir /tmp/qwen2_rand "${common[@]}" --batch "$QWEN_BATCH" --micro 8 --response-len 512 \
    --steps "$QWEN_STEPS" --sides "$QWEN_SIDES" --timeout 270 --budget-s "$b" --work-dir /tmp/vs/qwen \
    --out "$OUT/qwen.json"
fi
(cd /tmp/vs && tar czf "$OUT/logs.tgz" $(ls -d */*.log */*/profile/step_*/*.txt 2>/dev/null))
traces=$(cd /tmp/vs && ls -d */*/profile/step_*/*.json.gz 2>/dev/null)
if [ -n "$traces" ] && [ "$PART" != all ]; then  # PART=all: 8 files without it, the most that come back
  (cd /tmp/vs && tar czf /tmp/vs_traces.tgz $traces)
  if [ "$(stat -c %s /tmp/vs_traces.tgz)" -lt $((15 * 1024 * 1024)) ]; then cp /tmp/vs_traces.tgz "$OUT/traces.tgz"
  else echo "traces.tgz left out: $(stat -c %s /tmp/vs_traces.tgz) bytes"; fi
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
ls -la "$OUT"
