#!/usr/bin/env bash
# tools/bench/rl_runs.sh on the transfer-limited GPU machine that tools/device/gpu_session.sh prepares: SmolLM2 at
# /tmp/smol_hf, checkpoints under /tmp/runs, the Python of that machine. Same variables (RUNS, OUT, T_LONG, EXTRA,
# LAUNCH_GAP_S, ...); RUNS defaults to the first batch of docs/results.md. gpu_session.sh wait_runs packs $OUT.
#   OUT=/some/dir T_LONG=480 [LAUNCH_GAP_S=90] [RUNS="svamp_b:0 gsm8k_gae:1"] bash tools/device/rl_runs.sh
export MODEL=${MODEL:-/tmp/smol_hf} RUN_ROOT=${RUN_ROOT:-/tmp/runs}
export RUNS=${RUNS:-"gsm8k_grpo:0 gsm8k_gae:0 svamp_a:0 gsm8k_prime:1 svamp_b:1 save_resume:1"}
exec bash "$(dirname "$0")/../bench/rl_runs.sh"
