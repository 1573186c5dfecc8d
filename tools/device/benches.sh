#!/usr/bin/env bash
# On a 2-GPU machine (after tools/device/prepare.sh): the GPU benchmarks of issues #4, #6 and #9, writing JSON
# and logs to $OUT. Phase 1 runs TRL-vs-ours on GPU 0 while GPU 1 runs the MFU, profile and 1-GPU sync benches
# (separate GPUs, so they do not share a device); phase 2 uses both GPUs (Ulysses SP=2, ZeRO-3 sync over 2 ranks).
# Use: OUT=/some/dir bash tools/device/benches.sh
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
(CUDA_VISIBLE_DEVICES=0 timeout -k 10 295 python3 tools/bench/vs_trl.py --model /tmp/smol_hf \
   --data data/gsm8k/train.parquet --batch 16 --n 8 --micro 16 --response-len 256 --lr 1e-6 --steps 3 \
   --timeout 140 --work-dir /tmp/vs_trl --out "$OUT/vs_trl.json" > "$OUT/vs_trl.log" 2>&1;
 cp /tmp/vs_trl/*.log "$OUT/" 2>/dev/null) &
(export CUDA_VISIBLE_DEVICES=1
 timeout -k 10 120 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b,smollm2-135m --iters 12 --warmup 3 \
   --out "$OUT/mfu_ds_zero2.json" > "$OUT/mfu.log" 2>&1
 timeout -k 10 75 python3 tools/bench/step_profile.py --profile --model qwen2-1.5b --tokens 4096 \
   --trace /tmp/actor_trace.json --out "$OUT/profile_qwen2.json" > "$OUT/profile.log" 2>&1
 timeout -k 10 70 python3 tools/bench/rollout.py --skip-gen --zero3 --out "$OUT/sync_zero3_1gpu.json" \
   > "$OUT/sync1.log" 2>&1) &
wait
timeout -k 10 70 torchrun --nproc_per_node 2 tools/bench/rollout.py --skip-gen --zero3 \
  --out "$OUT/sync_zero3_2gpu.json" > "$OUT/sync2.log" 2>&1
timeout -k 10 190 python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192,16384,32768 --iters 3 --warmup 1 \
  --search-start 32768 --search-max 131072 --search-refine 3 --timeout 60 --out "$OUT/ulysses.json" > "$OUT/ulysses.log" 2>&1
echo "benches done"
