#!/usr/bin/env bash
# Start-up and step times of the SVAMP learning job (tools/bench/learn_vs_trl.py's ours command: 32 prompts x 8,
# 256-token responses, compiled update and decode layer regions) with Ray and with trainer.single_process=true,
# one after the other on one GPU (DEVICE=cpu: one CPU worker), each with empty compile caches. Random SmolLM2-135M weights are enough for
# timings (every response runs to 256 tokens).
#   OUT=/tmp/ab MODEL=/tmp/smol_rand STEPS=30 ORDER="ray sp" bash tools/bench/single_process_ab.sh
# Make the model with: python tools/bench/random_model.py smollm2 --tokenizer <SmolLM2 folder> --out /tmp/smol_rand
# Prints each run's "workers ready" line and steps 1-3 and the last two (step, generation, update, reference
# seconds), and the mean step from step 6; the consoles and metrics are left in $OUT/<mode>/.
set -u
OUT=${OUT:-/tmp/ab}; MODEL=${MODEL:-/tmp/smol_rand}; STEPS=${STEPS:-30}; ORDER=${ORDER:-ray sp}
TRAIN=${TRAIN:-data/svamp/train.parquet}; DEVICE=${DEVICE:-cuda}; CPUS=${CPUS:-4}
read -r -a CMD <<< "$(MODEL=$MODEL TRAIN=$TRAIN STEPS=$STEPS DEVICE=$DEVICE CPUS=$CPUS python3 - <<'PY'
import os, sys
sys.path.insert(0, ".")
from tools.bench.learn_vs_trl import ours_command
job = dict(kl_coef=0.001, ours_engine="hf", model=os.environ["MODEL"], train=os.environ["TRAIN"], batch=32,
           max_prompt_len=256, response_len=256, n=8, micro=64, lr=1e-5, format_score=0.1, device=os.environ["DEVICE"], cpus=int(os.environ["CPUS"]),
           max_steps=int(os.environ["STEPS"]), every_s=60, strict_format=True,
           ours_overrides=["actor_rollout_ref.model.use_torch_compile=true",
                           "actor_rollout_ref.rollout.decode_compile_regions=true"])
print(" ".join(ours_command(job, 1, "OUTDIR")[2:]))
PY
)"
for mode in $ORDER; do
  dir=$OUT/$mode; rm -rf "$dir" "/tmp/ab_cache_$mode"; mkdir -p "$dir"
  extra=(); [ "$mode" = sp ] && extra=(trainer.single_process=true)
  TORCHINDUCTOR_CACHE_DIR=/tmp/ab_cache_$mode/inductor TRITON_CACHE_DIR=/tmp/ab_cache_$mode/triton \
    python3 trainer/main.py "${CMD[@]//OUTDIR/$dir}" "${extra[@]}" > "$dir/console.log" 2>&1
  echo "$mode rc=$?"
  grep -a "workers ready" "$dir/console.log" | cut -c1-400
  python3 - "$mode" "$dir/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[2])]
keys = ["timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/ref"]
for r in rows[:3] + rows[-2:]:
    print(sys.argv[1], r["step"], " ".join(f"{k.split('/')[-1]}={r.get(k, 0):.3f}" for k in keys))
later = [r["timing_s/step"] for r in rows[5:]]
print(sys.argv[1], "steps", len(rows), "mean step from step 6:", round(sum(later) / max(1, len(later)), 3))
PY
done
