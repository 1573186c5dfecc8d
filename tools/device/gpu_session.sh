#!/usr/bin/env bash
# One GPU machine session in steps, each step one call of a lent machine that carries at most 64 MiB
# (wheels, model halves and vLLM parts travel one per call, see ../README of the device tool).
#   bash tools/device/gpu_session.sh wheels        (carry .whl)   install the Python wheels into /tmp/site
#   bash tools/device/gpu_session.sh model_a       (carry .mA)    first half of SmolLM2's GGUF
#   bash tools/device/gpu_session.sh model_b       (carry .mB .gdata) second half, convert, preprocess GSM8K/SVAMP
#   bash tools/device/gpu_session.sh vllm_a|vllm_b (carry .vA / .vB)
#   bash tools/device/gpu_session.sh vllm_c        (carry .vC)    install vLLM, its GPU tests (on the GPU alone: their
#                                                   memory checks are device-wide), then the RL runs of both engines
#                                                   and EXTRA_RUNS (default: the tiny VLM's 20-step colour task),
#                                                   started LAUNCH_GAP_S (default 90) apart, vLLM's first
#                                                   (INSTALL_ONLY=1: install vLLM, nothing else)
#   RUNS="a:0 b:0" bash tools/device/gpu_session.sh runs   start rl_runs.sh runs in the background
#   bash tools/device/gpu_session.sh wait_runs     pack the RL runs' logs and metrics into $OUT/runs.tgz when they end
#                                                   (or at WAIT_S; unfinished runs with their logs so far)
#   bash tools/device/gpu_session.sh bench_memory  vllm_memory.py: the empty_cache rule, broken and overdone
#   bash tools/device/gpu_session.sh bench_rollout rollout.py --engine hf,vllm, SmolLM2 and a random Qwen2-1.5B
#                                                   (ROLL_MODELS="smol qwen" picks them)
# Background runs write under /tmp/eng (they outlive the call that starts them; setsid).
set -u
step=${1:?step}
OUT=${OUT:-/tmp/out}
export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 VLLM_USE_FLASHINFER_SAMPLER=0 \
  VLLM_ENABLE_V1_MULTIPROCESSING=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
RUNS_HF="hf_grpo:0 hf_gae:0 hf_prime:0"
RUNS_VLLM="vllm_grpo:0 vllm_gae:0 vllm_prime:0"

start_runs() {  # runs...: rl_runs.sh in a new session, outputs under /tmp/eng
  mkdir -p /tmp/eng
  OUT=/tmp/eng T_LONG=${T_LONG:-1200} RUNS="$*" setsid nohup bash tools/device/rl_runs.sh \
    > "/tmp/eng/launch_$(date +%s).log" 2>&1 < /dev/null &
  sleep 2
}

case $step in
  wheels)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    python3 -c "import torch, deepspeed, ray, transformers; print(torch.__version__, deepspeed.__version__, ray.__version__, transformers.__version__, torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv ;;
  model_a) cp .mA/smol.gguf.part0 /tmp/ && ls -la /tmp/smol.gguf.part0 ;;
  model_b)
    bash tools/device/prepare.sh ;;
  vllm_a) cp .vA/* /tmp/ ;;
  vllm_b) cp .vB/* /tmp/ ;;
  vllm_c)
    cp .vC/vpart2 /tmp/ && cat /tmp/vpart0 /tmp/vpart1 /tmp/vpart2 > /tmp/vllm.tar.xz \
      && echo "$(cat .vC/sha)  /tmp/vllm.tar.xz" | sha256sum -c && mkdir -p /tmp/vsite \
      && (cd /tmp/vsite && xz -dc /tmp/vllm.tar.xz | tar x) \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite .vC/*.whl || exit 1
    python3 -c "import vllm; print('vllm', vllm.__version__)"
    [ "${INSTALL_ONLY:-0}" = 1 ] && exit 0
    VLLM_GPU_REPORT=$OUT/vllm_gpu.json timeout -k 10 ${TEST_S:-300} python3 -m pytest -m gpu -q -s \
      tests/test_rollout_vllm_gpu.py -p no:cacheprovider 2>&1 | tail -n 60 | tee "$OUT/vllm_gpu_tests.log"
    LAUNCH_GAP_S=${LAUNCH_GAP_S:-90} start_runs $RUNS_VLLM $RUNS_HF ${EXTRA_RUNS:-vlm_colour:0}
    echo "started: $RUNS_VLLM $RUNS_HF ${EXTRA_RUNS:-vlm_colour:0}" ;;
  runs)  # RUNS (name:gpu pairs) in the background, LAUNCH_GAP_S (default 60) apart; then wait_runs
    LAUNCH_GAP_S=${LAUNCH_GAP_S:-60} start_runs ${RUNS:?set RUNS}
    echo "started: $RUNS" ;;
  wait_runs)
    end=$(( $(date +%s) + ${WAIT_S:-420} ))
    # rl_runs.sh lives until its last run ends (runs start LAUNCH_GAP_S apart, some after a model is built)
    while pgrep -f "bench/rl_runs.sh" > /dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 10; done
    pgrep -f "bench/rl_runs.sh" > /dev/null && echo "runs still going at WAIT_S" || echo "all runs ended"
    tar czf "$OUT/runs.tgz" -C /tmp/eng --exclude='*.tgz' . 2>/dev/null  # logs and metrics (checkpoints: /tmp/runs)
    tail -n 3 /tmp/eng/*/console.log 2>/dev/null | tail -n 40
    ls -la /tmp/eng ;;
  bench_memory)
    timeout -k 10 ${MEM_S:-300} python3 tools/bench/vllm_memory.py --model /tmp/smol_hf --eager \
      --out "$OUT/vllm_memory.json" 2>&1 | tail -n 30 ;;
  bench_rollout)
    case " ${ROLL_MODELS:-smol qwen} " in *" smol "*)
    timeout -k 10 ${ROLL_S:-240} python3 tools/bench/rollout.py --engine hf,vllm --model /tmp/smol_hf --prompts 512 \
      --n 1 --new-tokens 512 --skip-plain --skip-sync --attn sdpa_gqa --vllm-gpu-util 0.4 \
      --out "$OUT/rollout_smollm2.json" 2>&1 | tail -n 8 ;; esac
    case " ${ROLL_MODELS:-smol qwen} " in *" qwen "*)
    timeout -k 10 ${ROLL_S:-240} python3 tools/bench/rollout.py --engine hf,vllm --random qwen2-1.5b --prompts 512 \
      --n 1 --new-tokens 512 --skip-plain --skip-sync --attn sdpa_gqa --vllm-gpu-util 0.4 \
      --out "$OUT/rollout_qwen2_1.5b.json" 2>&1 | tail -n 8 ;; esac ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
exit 0
