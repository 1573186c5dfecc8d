#!/usr/bin/env bash
# On a 2-GPU machine (after tools/device/prepare.sh): the GPU benchmarks of docs/benchmarks.md, writing JSON
# and logs to $OUT. Phase 1 runs TRL-vs-ours on GPU 0 while GPU 1 runs the MFU, profile and 1-GPU sync benches
# (separate GPUs, so they do not share a device); phase 2 uses both GPUs (Ulysses SP=2, ZeRO-3 sync over 2 ranks).
# Use: OUT=/some/dir bash tools/device/benches.sh            (the first set, 2026-11-30)
#      OUT=/some/dir GPU=1 SET=kernels bash tools/device/benches.sh   (MFU with and without the fused kernels)
#      OUT=/some/dir SET=ulysses bash tools/device/benches.sh         (SP=1 vs SP=2 with --accum 4, bisection)
#      OUT=/some/dir GPU=0 SET=sync bash tools/device/benches.sh      (MFU + profile + the no-host-sync GPU test)
#      OUT=/some/dir GPU=1 SET=mfu_base|compile bash tools/device/benches.sh  (MFU without / with whole-layer
#      torch.compile graphs, the compiled profile and the GPU tests)
#      OUT=/some/dir SET=graphs bash tools/device/benches.sh   (CUDA graphs, torch_compile_mode=reduce-overhead:
#      MFU, its GPU tests, MFU without compile on the same machine; PART=profile: the graphed and the
#      default-compiled MFU and profiles)
#      OUT=/some/dir SET=ulysses_graphs bash tools/device/benches.sh  (SP=1 vs SP=2 with CUDA graphs; not run yet)
#      OUT=/some/dir SET=s6 [PART=sp|mfu] bash tools/device/benches.sh  (SP with traced all-to-alls: GPU
#      test, SP=1 vs SP=2 with CUDA graphs and compile; MFU + shape profile)
#      OUT=/some/dir SET=s7 [PART=sp|mfu] bash tools/device/benches.sh  (SP=1 vs SP=2 at equal tokens
#      per GPU; MFU at 4 and 16 micro-batches per step + shape profile; GPU clocks sampled)
#      OUT=/some/dir SET=s8 [PART=bucket|gaps] bash tools/device/benches.sh  (1 GPU: MFU without vs with
#      DeepSpeed's reduce bucket on one rank, and the CUDA-graph GPU tests; PART=gaps: the GPU's idle gaps in a
#      16-micro-batch profile, MFU at 16 and 32 micro-batches per step; PART=ab: one-thread host packing vs not, same
#      machine, alternating; PART=sp, 2 GPUs: SP=1 vs SP=2 at 8k with graphs, the trainer with SP=2 + graphs)
#      OUT=/some/dir SET=s10 bash tools/device/benches.sh  (2 GPUs: Ulysses GPU tests, SP=1 vs SP=2 at 8k
#      with graphs at equal tokens per GPU, the trainer with SP=2 + graphs, rollout engine sdpa vs sdpa_gqa)
set -u
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
sample_clocks() {  # GPU clocks, power and throttle reasons every 0.5 s into $OUT/smi.csv until this script exits
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 500 > "$OUT/smi.csv" 2>&1 &
  trap "kill $! 2>/dev/null" EXIT
}
e2e_sp2_graphs() {  # DIR LIMIT_S: the trainer itself (embedded default) with SP=2 and CUDA graphs on 2 GPUs, 10 steps
  timeout -k 15 "$2" python3 trainer/main.py trainer.device=cuda trainer.n_gpus_per_node=2 \
    trainer.total_training_steps=10 trainer.output_dir=/tmp/e2e_sp actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 \
    actor_rollout_ref.model.use_torch_compile=true actor_rollout_ref.model.torch_compile_mode=reduce-overhead \
    > "$1/e2e_sp2_graphs.log" 2>&1
  echo "exit $?" >> "$1/e2e_sp2_graphs.log"
  cp /tmp/e2e_sp/metrics.jsonl "$1/e2e_sp2_graphs.jsonl" 2>/dev/null
}
case ${SET:-first} in
  kernels)  # each variant in its own process (Liger patches transformers process-wide)
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    for v in "base:" "compile:--compile" "liger:--liger" "liger_compile:--liger --compile"; do
      timeout -k 10 110 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 12 --warmup 3 ${v#*:} \
        --out "$OUT/mfu_${v%%:*}.json" > "$OUT/mfu_${v%%:*}.log" 2>&1
    done
    timeout -k 10 80 python3 tools/bench/mfu.py --deepspeed --models smollm2-135m --iters 12 --warmup 3 --compile \
      --out "$OUT/mfu_smol_compile.json" > "$OUT/mfu_smol_compile.log" 2>&1
    tar czf "$OUT/mfu.tgz" -C "$OUT" $(cd "$OUT" && ls mfu_*) && rm -f "$OUT"/mfu_*
    exit 0 ;;
  sync)  # after the host-sync-free packed forward: MFU, the kernel-level profile and the no-sync GPU test
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    timeout -k 10 110 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 12 --warmup 3 \
      --out "$OUT/mfu_sync.json" > "$OUT/mfu_sync.log" 2>&1
    timeout -k 10 90 python3 tools/bench/step_profile.py --profile --model qwen2-1.5b --tokens 4096 \
      --trace /tmp/p_sync.json --out "$OUT/prof_sync.json" > "$OUT/prof_sync.log" 2>&1
    timeout -k 10 120 python3 -m pytest -q -m gpu tests/test_patches_ulysses_gpu.py > "$OUT/gpu_tests.log" 2>&1
    tar czf "$OUT/sync.tgz" -C "$OUT" mfu_sync.json mfu_sync.log prof_sync.json prof_sync.log gpu_tests.log \
      && rm -f "$OUT"/mfu_sync.* "$OUT"/prof_sync.* "$OUT"/gpu_tests.log
    exit 0 ;;
  mfu_base)  # the update's MFU after the host-sync-free packed forward (no fused kernels)
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    timeout -k 10 120 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 12 --warmup 3 \
      --out "$OUT/mfu_base.json" > "$OUT/mfu_base.log" 2>&1
    tar czf "$OUT/mfu_base.tgz" -C "$OUT" mfu_base.json mfu_base.log && rm -f "$OUT"/mfu_base.json "$OUT"/mfu_base.log
    exit 0 ;;
  compile)  # torch.compile with whole-layer graphs (the attention traced, no graph break), its kernel-level
    # profile, and the GPU tests of the packed path
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    timeout -k 10 200 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 12 --warmup 3 --compile \
      --out "$OUT/mfu_compile.json" > "$OUT/mfu_compile.log" 2>&1
    timeout -k 10 150 python3 tools/bench/step_profile.py --profile --compile --model qwen2-1.5b --tokens 4096 \
      --trace /tmp/p_compile.json --out "$OUT/prof_compile.json" > "$OUT/prof_compile.log" 2>&1
    timeout -k 10 120 python3 -m pytest -q -m gpu tests/test_patches_ulysses_gpu.py > "$OUT/gpu_tests.log" 2>&1
    tar czf "$OUT/compile.tgz" -C "$OUT" mfu_compile.json mfu_compile.log prof_compile.json prof_compile.log \
      gpu_tests.log; rm -f "$OUT"/mfu_compile.* "$OUT"/prof_compile.* "$OUT"/gpu_tests.log
    exit 0 ;;
  graphs)  # CUDA graphs over the compiled layers (one GPU, nothing else on it)
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    M="python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 16 --warmup 8"
    P="python3 tools/bench/step_profile.py --profile --model qwen2-1.5b --tokens 4096"
    if [ "${PART:-mfu}" = mfu ]; then
      timeout -k 10 220 $M --compile-mode reduce-overhead --out "$OUT/mfu_graphs.json" > "$OUT/mfu_graphs.log" 2>&1
      timeout -k 10 150 python3 -m pytest -q -m gpu tests/test_cudagraphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
      timeout -k 10 100 $M --out "$OUT/mfu_base.json" > "$OUT/mfu_base.log" 2>&1
    elif [ "${PART}" = ds ]; then  # fused AdamW (the new default) and DeepSpeed gradient-buffer settings
      timeout -k 10 100 python3 -m pytest -q -m gpu tests/test_cudagraphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
      timeout -k 10 120 $M --compile-mode reduce-overhead --out "$OUT/mfu_graphs_fused.json" > "$OUT/mfu_graphs_fused.log" 2>&1
      timeout -k 10 120 $M --compile-mode reduce-overhead --ds-config '{"zero_optimization": {"contiguous_gradients": false}}' \
        --out "$OUT/mfu_graphs_nocontig.json" > "$OUT/mfu_graphs_nocontig.log" 2>&1
      timeout -k 10 120 $M --compile-mode reduce-overhead --ds-config '{"zero_optimization": {"reduce_bucket_size": 2000000000}}' \
        --out "$OUT/mfu_graphs_bucket.json" > "$OUT/mfu_graphs_bucket.log" 2>&1
    elif [ "${PART}" = overlap ]; then
      timeout -k 10 120 python3 -m pytest -q -m gpu tests/test_cudagraphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
      timeout -k 10 120 $M --compile-mode reduce-overhead --ds-config '{"zero_optimization": {"overlap_comm": true}}' \
        --out "$OUT/mfu_graphs_overlap.json" > "$OUT/mfu_graphs_overlap.log" 2>&1
      timeout -k 10 120 $M --compile-mode reduce-overhead --out "$OUT/mfu_graphs_fused2.json" > "$OUT/mfu_graphs_fused2.log" 2>&1
      timeout -k 10 120 $M --compile-mode reduce-overhead --ds-config '{"zero_optimization": {"reduce_bucket_size": 200000000}}' \
        --out "$OUT/mfu_graphs_bucket2e8.json" > "$OUT/mfu_graphs_bucket2e8.log" 2>&1
    elif [ "${PART}" = final ]; then  # the defaults (fused AdamW, overlap_comm) + graphs, longer timed loops; and
      # the trainer's embedded default (tiny random model, varying packed shapes) on CUDA with and without graphs
      timeout -k 10 120 $M --iters 48 --compile-mode reduce-overhead --out "$OUT/mfu_graphs_final.json" \
        > "$OUT/mfu_graphs_final.log" 2>&1
      timeout -k 10 100 $M --iters 48 --out "$OUT/mfu_base_final.json" > "$OUT/mfu_base_final.log" 2>&1
      GRAPHS="actor_rollout_ref.model.use_torch_compile=true actor_rollout_ref.model.torch_compile_mode=reduce-overhead"
      for name in graphs eager; do
        [ $name = graphs ] && X=$GRAPHS || X=
        timeout -k 15 140 python3 trainer/main.py trainer.device=cuda trainer.n_gpus_per_node=1 \
          trainer.total_training_steps=30 trainer.output_dir=/tmp/e2e_$name $X > "$OUT/e2e_$name.log" 2>&1
        cp /tmp/e2e_$name/metrics.jsonl "$OUT/e2e_$name.jsonl" 2>/dev/null
      done
    else  # PART=profile
      timeout -k 10 100 python3 -m pytest -q -m gpu tests/test_cudagraphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
      timeout -k 10 150 $P --deepspeed --compile-mode reduce-overhead --trace /tmp/p_graphs.json \
        --out "$OUT/prof_graphs.json" > "$OUT/prof_graphs.log" 2>&1
      timeout -k 10 230 $M --compile-mode max-autotune --out "$OUT/mfu_autotune.json" > "$OUT/mfu_autotune.log" 2>&1
      timeout -k 10 80 python3 tools/bench/mfu.py --deepspeed --models smollm2-135m --iters 16 --warmup 8 \
        --compile-mode reduce-overhead --out "$OUT/mfu_smol_graphs.json" > "$OUT/mfu_smol_graphs.log" 2>&1
    fi
    exit 0 ;;
  s6)  # 2 GPUs: the GPU test of SP=2 with the functional all-to-alls (eager, compiled, CUDA graphs),
    # SP=1 vs SP=2 with CUDA graphs and with torch.compile (all-to-alls traced into the layers); PART=mfu: the MFU
    # with graphs and a profile recording the copies' shapes (GPU 0)
    if [ "${PART:-sp}" = sp ]; then
      timeout -k 10 170 python3 -m pytest -q -m gpu tests/test_ulysses_graphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
      for mode in reduce-overhead default; do  # (default without --compile ran EAGER: the bench compiles only with --compile or a non-default mode)
        timeout -k 10 ${T_ULYSSES:-190} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192,16384 \
          --iters 8 --warmup 3 --accum 4 --no-search --equiv-tokens 0 --compile-mode $mode --timeout 120 \
          --out "$OUT/ulysses_$mode.json" > "$OUT/ulysses_$mode.log" 2>&1
      done
    elif [ "${PART}" = sp2 ]; then  # after the eager path went back to dist.all_to_all_single: the GPU test (per-rank
      # files with the modes done), SP=1 vs SP=2 eager and with torch.compile (mode default)
      timeout -k 10 240 python3 tests/test_ulysses_graphs_gpu.py "$OUT/gpu_test" > "$OUT/gpu_test.log" 2>&1
      for k in eager: compile:--compile; do
        timeout -k 10 ${T_ULYSSES:-170} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192,16384 \
          --iters 8 --warmup 3 --accum 4 --no-search --equiv-tokens 0 ${k#*:} --timeout 120 \
          --out "$OUT/ulysses_${k%%:*}.json" > "$OUT/ulysses_${k%%:*}.log" 2>&1
      done
    else
      export CUDA_VISIBLE_DEVICES=${GPU:-0}
      timeout -k 10 150 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 48 --warmup 8 \
        --compile-mode reduce-overhead --out "$OUT/mfu_graphs.json" > "$OUT/mfu_graphs.log" 2>&1
      timeout -k 10 120 python3 tools/bench/step_profile.py --profile --shapes --model qwen2-1.5b --tokens 4096 \
        --deepspeed --compile-mode reduce-overhead --trace /tmp/p_graphs.json --out "$OUT/prof_graphs.json" \
        > "$OUT/prof_graphs.log" 2>&1
    fi
    exit 0 ;;
  s8)  # 1 GPU: ZeRO-2 on one rank without DeepSpeed's reduce bucket (reduce_bucket_size=1: one
    # gradient copy per backward instead of two; overlap_comm off) vs the trainer's default (5e8-element bucket +
    # overlap_comm), CUDA graphs, 16 micro-batches per step; then no bucket at 4; the CUDA-graph GPU tests. (Run at
    # 09cfd54, where no bucket was briefly the default: 23.8% vs 37.3% MFU, reverted.) GPU clocks: smi.csv.
    sample_clocks
    if [ "${PART:-bucket}" = sp ]; then  # 2 GPUs: SP=1 vs SP=2 at 8k with CUDA graphs and equal tokens per GPU
      # (after the one-thread host packing), then the trainer itself with SP=2 and CUDA graphs (tiny model, 2 ranks)
      timeout -k 10 ${T_ULYSSES:-170} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192 --tokens-per-gpu \
        --iters 8 --warmup 3 --accum 4 --no-search --equiv-tokens 0 --compile-mode reduce-overhead --timeout 120 \
        --out "$OUT/ulysses_pg_graphs.json" > "$OUT/ulysses_pg_graphs.log" 2>&1
      e2e_sp2_graphs "$OUT" ${T_E2E:-150}
      exit 0
    fi
    export CUDA_VISIBLE_DEVICES=${GPU:-0}
    A="--deepspeed --models qwen2-1.5b --iters 48 --warmup 8 --compile-mode reduce-overhead"
    M="python3 tools/bench/mfu.py $A"
    if [ "${PART:-bucket}" = ab ]; then  # same machine, alternating: the host packing on one thread (new) vs the
      # pool's thread count (old: trainer.forward.host_op_threads replaced by a no-op), 16 and 4 micro-batches per step
      for r in 1 2; do for v in new old; do for a in 16 4; do
        P=""; [ $v = old ] && P="import trainer.forward as f, contextlib; f.host_op_threads = lambda n=1: contextlib.nullcontext(); "
        timeout -k 5 100 python3 -c "${P}import sys; from tools.bench.mfu import main; main(sys.argv[1:])" $A --accum $a \
          --out "$OUT/ab_${v}_a${a}_r$r.json" > "$OUT/ab_${v}_a${a}_r$r.log" 2>&1
      done; done; done
      exit 0
    fi
    if [ "${PART:-bucket}" = gaps ]; then  # where the GPU idles: a 16-micro-batch profile with the idle gaps and
      # the host op in each; MFU at 16 and 32 micro-batches per optimizer step (the trainer's default settings)
      timeout -k 10 150 python3 tools/bench/step_profile.py --profile --model qwen2-1.5b --tokens 4096 --micro-batches 16 \
        --deepspeed --compile-mode reduce-overhead --trace /tmp/p_gaps.json --out "$OUT/prof_gaps.json" > "$OUT/prof_gaps.log" 2>&1
      timeout -k 10 ${T_MFU:-120} $M --accum 16 --out "$OUT/mfu_accum16.json" > "$OUT/mfu_accum16.log" 2>&1
      timeout -k 10 ${T_MFU:-120} $M --accum 32 --iters 64 --out "$OUT/mfu_accum32.json" > "$OUT/mfu_accum32.log" 2>&1
      exit 0
    fi
    OLD='{"zero_optimization": {"reduce_bucket_size": 500000000, "overlap_comm": true}}'
    NEW='{"zero_optimization": {"reduce_bucket_size": 1, "overlap_comm": false}}'
    timeout -k 10 ${T_MFU:-120} $M --accum 16 --ds-config "$NEW" --out "$OUT/mfu_nobucket_accum16.json" \
      > "$OUT/mfu_nobucket_accum16.log" 2>&1
    timeout -k 10 ${T_MFU:-120} $M --accum 16 --ds-config "$OLD" --out "$OUT/mfu_bucket_accum16.json" \
      > "$OUT/mfu_bucket_accum16.log" 2>&1
    timeout -k 10 ${T_MFU:-120} $M --accum 4 --ds-config "$NEW" --out "$OUT/mfu_nobucket_accum4.json" \
      > "$OUT/mfu_nobucket_accum4.log" 2>&1
    timeout -k 10 120 python3 -m pytest -q -m gpu tests/test_cudagraphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
    exit 0 ;;
  s10)  # 2 GPUs, after the fused q/k/v all-to-all (one exchange for q, k and v per layer): the Ulysses GPU
    # tests (NCCL, 2 ranks: SP=2 vs SP=1 with varlen_attn in bf16; traced all-to-alls eager / compiled / CUDA graphs),
    # SP=1 vs SP=2 at 8k with CUDA graphs and equal tokens per GPU, the trainer itself with SP=2 + graphs; then on
    # GPU 0 the HF rollout engine with sdpa vs sdpa_gqa (rollout.attn_implementation). One archive: $OUT/s10.tgz.
    sample_clocks
    W=$OUT/s10; mkdir -p "$W"
    timeout -k 10 ${T_TESTS:-100} python3 -m pytest -q -m gpu tests/test_patches_ulysses_gpu.py > "$W/gpu_tests.log" 2>&1
    timeout -k 10 ${T_GRAPHS_TEST:-90} python3 tests/test_ulysses_graphs_gpu.py "$W/gpu_test" > "$W/gpu_test.log" 2>&1
    timeout -k 10 ${T_ULYSSES:-170} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192 --tokens-per-gpu \
      --iters 12 --warmup 3 --accum 4 --no-search --equiv-tokens 0 --compile-mode reduce-overhead --timeout 120 \
      --out "$W/ulysses_pg_graphs.json" > "$W/ulysses_pg_graphs.log" 2>&1
    e2e_sp2_graphs "$W" ${T_E2E:-110}
    [ "${ROLLOUT:-1}" = 1 ] && CUDA_VISIBLE_DEVICES=0 timeout -k 10 ${T_ROLLOUT:-150} python3 tools/bench/rollout.py --skip-plain --skip-sync \
      --prompts 128 --n 4 --new-tokens 512 --max-batch 512 --attn sdpa,sdpa_gqa --out "$W/rollout_attn.json" \
      > "$W/rollout_attn.log" 2>&1
    cp "$OUT/smi.csv" "$W/" 2>/dev/null
    tar czf "$OUT/s10.tgz" -C "$OUT" s10 && rm -rf "$W"
    exit 0 ;;
  s7)  # 2 GPUs. PART=sp: SP=1 vs SP=2 with each GPU holding the same tokens (--tokens-per-gpu: the
    # trainer's budget ppo_max_token_len_per_gpu x sp), CUDA graphs then eager. PART=mfu (GPU 0): MFU with graphs at
    # 4 and 16 micro-batches per optimizer step, then the profile recording the copies' shapes. GPU clocks, power
    # and throttle reasons are sampled every 0.5 s throughout (smi.csv).
    sample_clocks
    if [ "${PART:-sp}" = sp ]; then
      for k in graphs:--compile-mode=reduce-overhead eager:; do
        timeout -k 10 ${T_ULYSSES:-220} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192,16384 \
          --tokens-per-gpu --iters 8 --warmup 3 --accum 4 --no-search --equiv-tokens 0 ${k#*:} --timeout 120 \
          --out "$OUT/ulysses_pg_${k%%:*}.json" > "$OUT/ulysses_pg_${k%%:*}.log" 2>&1
      done
    else
      export CUDA_VISIBLE_DEVICES=${GPU:-0}
      for a in 4 16; do
        timeout -k 10 150 python3 tools/bench/mfu.py --deepspeed --models qwen2-1.5b --iters 48 --warmup 8 --accum $a \
          --compile-mode reduce-overhead --out "$OUT/mfu_graphs_accum$a.json" > "$OUT/mfu_graphs_accum$a.log" 2>&1
      done
      timeout -k 10 120 python3 tools/bench/step_profile.py --profile --shapes --model qwen2-1.5b --tokens 4096 \
        --deepspeed --compile-mode reduce-overhead --trace /tmp/p_graphs.json --out "$OUT/prof_graphs.json" \
        > "$OUT/prof_graphs.log" 2>&1
    fi
    exit 0 ;;
  ulysses_graphs)  # SP=1 vs SP=2 with CUDA graphs (before the functional all-to-alls: never run)
    timeout -k 10 ${T_ULYSSES:-300} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192,16384 \
      --iters 8 --warmup 3 --accum 4 --no-search --equiv-tokens 0 --compile-mode reduce-overhead --timeout 150 \
      --out "$OUT/ulysses_graphs.json" > "$OUT/ulysses_graphs.log" 2>&1
    exit 0 ;;
  ulysses)
    timeout -k 10 ${T_ULYSSES:-300} python3 tools/bench/ulysses.py --models qwen2-1.5b --tokens 8192,16384 \
      --iters 8 --warmup 2 --accum 4 --search-start 32768 --search-max 131072 --search-refine 3 --timeout 60 \
      --out "$OUT/ulysses_accum4.json" > "$OUT/ulysses_accum4.log" 2>&1
    exit 0 ;;
esac
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
