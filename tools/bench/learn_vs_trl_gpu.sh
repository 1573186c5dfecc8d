#!/usr/bin/env bash
# Learning per GPU-minute, TRL vs this project, in one call of under 10 minutes on one H200
# (tools/bench/learn_vs_trl.py): one seed, a short budget per side, then the evaluation of every checkpoint.
# Needs on the machine: torch, DeepSpeed, Ray, transformers, trl 1.16 and vLLM importable from PYTHONPATH below,
# SmolLM2-135M-Instruct as an HF folder at $SMOL, SVAMP at data/svamp/{train,test}.parquet
# (python tools/data_preprocess/svamp.py --out data/svamp) and, for GSM8K before/after, $GSM8K (skipped if absent).
#   OUT=/some/dir bash tools/bench/learn_vs_trl_gpu.sh
# BUDGET_S (570) bounds the whole script. Each side gets LEARN_BUDGET_S (180) of wall-clock from its process start,
# saving at every LEARN_EVERY_S (60); seeds LEARN_SEEDS (1); ours with OURS_ENGINE (hf); GSM8K_ROWS (500) GSM8K
# test rows scored for the base model and each run's last checkpoint. The evaluation gets what is left.
# Files in $OUT (5): learn.json, learn.md, learn.png, logs.tgz (every run's log, the evaluator's, its JSON), console.log.
set -u
OUT=${OUT:-/tmp/out}
SMOL=${SMOL:-/tmp/smol_hf}
GSM8K=${GSM8K:-data/gsm8k/test.parquet}
BUDGET_S=${BUDGET_S:-570}
LEARN_BUDGET_S=${LEARN_BUDGET_S:-180}
LEARN_EVERY_S=${LEARN_EVERY_S:-60}
LEARN_SEEDS=${LEARN_SEEDS:-1}
OURS_ENGINE=${OURS_ENGINE:-hf}
GSM8K_ROWS=${GSM8K_ROWS:-500}
export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
  PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TORCH_CUDA_ARCH_LIST=9.0
mkdir -p "$OUT" /tmp/learn
exec > >(tee -a "$OUT/console.log") 2>&1
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -c "import trl, vllm, transformers, torch; print('trl', trl.__version__, 'vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
left=$(( BUDGET_S - ($(date +%s) - start) - 20 ))
timeout -k 10 "$left" python3 tools/bench/learn_vs_trl.py --model "$SMOL" --train data/svamp/train.parquet \
  --test data/svamp/test.parquet --gsm8k "$GSM8K" --gsm8k-rows "$GSM8K_ROWS" --sides trl,ours \
  --seeds "$LEARN_SEEDS" --budget-s "$LEARN_BUDGET_S" --every-s "$LEARN_EVERY_S" --grace-s 45 \
  --ours-engine "$OURS_ENGINE" --total-budget-s $(( left - 15 )) --work-dir /tmp/learn --out "$OUT/learn.json"
echo "learn_vs_trl.py exit $?"
(cd /tmp/learn && tar czf "$OUT/logs.tgz" $(ls *.log eval.json *_result.json 2>/dev/null))
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
ls -la "$OUT"
