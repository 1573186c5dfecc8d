#!/usr/bin/env bash
# The GPU runs of docs/results.md on any machine with the project installed: SmolLM2-135M-Instruct (or MODEL) with
# GRPO, GAE, PRIME, LoRA, Megatron, the tiny VLM and the multi-turn tool task on GSM8K/SVAMP. Several runs share a
# GPU (SmolLM2-135M steps are launch-bound), each with its own Ray instance and CUDA_VISIBLE_DEVICES; step times of
# runs that shared a GPU compare only with each other.
#   RUNS="gsm8k_grpo:0 svamp_e:1" MODEL=HuggingFaceTB/SmolLM2-135M-Instruct OUT=runs_out bash tools/bench/rl_runs.sh
# RUNS: name:gpu pairs (the run names are the cases below; megatron*:- use the GPUs of PAIR, default 0,1, and
# MG_GPUS of them, default 2: PAIR=0 MG_GPUS=1 runs the Megatron save/resume pairs on one GPU).
# MODEL: an HF model folder or Hub repository id (fetched once through huggingface_hub). Data: data/gsm8k and
# data/svamp (python tools/data_preprocess/gsm8k.py --out data/gsm8k; svamp.py --out data/svamp).
# Each run stops at T_LONG seconds (default 480; SIGTERM: the trainer finishes its step, saves if save_freq > 0);
# it leaves console.log and metrics.jsonl in $OUT/<name>/ and its checkpoints under RUN_ROOT (default
# $OUT/run_dirs). EXTRA: Hydra overrides added to every run. python tools/bench/run_all.py --only rl_runs --runs
# "..." runs this script and adds a summary of every run to its results.json and results.md.
set -u
OUT=${OUT:?set OUT to the output folder}
RUNS=${RUNS:?set RUNS, e.g. RUNS="gsm8k_grpo:0" (name:gpu pairs)}
MODEL=${MODEL:-HuggingFaceTB/SmolLM2-135M-Instruct}
T_LONG=${T_LONG:-480}
PAIR=${PAIR:-0,1}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN_ROOT=${RUN_ROOT:-$OUT/run_dirs}
if [ ! -d "$MODEL" ]; then  # a Hub id: the local snapshot folder (downloaded once, then from the cache)
  MODEL=$($PY -c "import sys; from tools.bench.run_all import resolve_model; print(resolve_model(sys.argv[1]))" \
    "$MODEL") || exit 2
fi
COMMON="trainer.device=cuda trainer.n_gpus_per_node=1 model=smollm2 actor_rollout_ref.model.path=$MODEL
 reward=format data.train_batch_size=32 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=16
 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128
 data.max_prompt_length=256 data.max_response_length=256 actor_rollout_ref.rollout.prompt_length_bucket=256
 actor_rollout_ref.actor.use_kl_loss=true trainer.export_hf_on_end=false ${EXTRA:-}"
GSM="data=gsm8k actor_rollout_ref.actor.optim.lr=1e-5 trainer.total_training_steps=30 trainer.val_before_train=true
 trainer.test_freq=15 data.val_max_rows=300 data.val_batch_size=150"
# SVAMP: held-out validation sampled at T=0.7 with 2 samples per question (the model card's baseline
# was measured with sampling); runs until its timeout, validating every 10 steps.
SVAMP="data=svamp trainer.total_training_steps=500 trainer.val_before_train=true trainer.test_freq=10
 data.val_batch_size=150 actor_rollout_ref.rollout.val_kwargs.n=2 actor_rollout_ref.rollout.val_kwargs.do_sample=true
 actor_rollout_ref.rollout.val_kwargs.temperature=0.7"

# svamp_e: 512-token responses (the model README's setting) with the overlong punishment over the last 128
SVAMP_E="$SVAMP actor_rollout_ref.actor.optim.lr=5e-5 data.max_response_length=512 reward_model.overlong_buffer.enable=true
 reward_model.overlong_buffer.len=128 reward_model.overlong_buffer.penalty_factor=0.5"

launch() {  # name gpu timeout_s overrides... (RUN_DIR=name: write into $RUN_ROOT/<that run> instead, e.g. to resume it)
  local name=$1 gpu=$2 t=$3; shift 3
  local dir=$RUN_ROOT/${RUN_DIR:-$name}
  mkdir -p "$OUT/$name"
  # --foreground: SIGTERM goes to the trainer only (which finishes its step, saves if save_freq > 0 and stops Ray);
  # without it timeout signals the whole process group and the Ray workers die mid-step
  ( cd "$PWD" && CUDA_VISIBLE_DEVICES=$gpu timeout --foreground -s TERM -k 60 "$t" $PY trainer/main.py $COMMON \
      "$@" trainer.output_dir=$dir > "$OUT/$name/console.log" 2>&1
    echo "exit $?" >> "$OUT/$name/console.log"
    cp $dir/metrics.jsonl "$OUT/$name/" 2>/dev/null ) &
}

save_resume() {  # save at step 2 of a 4-step run, resume from step 2, run steps 3-4 (compare with the first)
  local gpu=$1 SR="data=gsm8k actor_rollout_ref.actor.optim.lr=1e-5 trainer.total_training_steps=4 trainer.save_freq=2"
  mkdir -p "$OUT/save_resume"
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 20 300 $PY trainer/main.py $COMMON $SR trainer.output_dir=$RUN_ROOT/sr1 \
      > "$OUT/save_resume/first.log" 2>&1
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 20 200 $PY trainer/main.py $COMMON $SR trainer.output_dir=$RUN_ROOT/sr2 \
      trainer.resume_mode=$RUN_ROOT/sr1/checkpoints/global_step_2 > "$OUT/save_resume/resumed.log" 2>&1
  cp $RUN_ROOT/sr1/metrics.jsonl "$OUT/save_resume/first.jsonl" 2>/dev/null
  cp $RUN_ROOT/sr2/metrics.jsonl "$OUT/save_resume/resumed.jsonl" 2>/dev/null
  { du -sb $RUN_ROOT/sr1/checkpoints/global_step_2 $RUN_ROOT/sr1/checkpoints/global_step_2/*;
    find $RUN_ROOT/sr1/checkpoints/global_step_2 -type f -printf '%s %p\n'; } > "$OUT/save_resume/sizes.txt" 2>&1
  grep -h "checkpoint loaded in\|saved checkpoint\|Traceback\|Error" "$OUT"/save_resume/*.log > "$OUT/save_resume/summary.txt"
}
megatron_pair() {  # name tag overrides...: a 10-step Megatron GSM8K run on both GPUs saving at steps 5 and 10,
  # then a run resumed from step 5 to step 7 (compare its steps 6-7 with the first run's); logs in $OUT/<name>/
  # (RESUME_EXTRA: overrides for the resumed run only, e.g. another TP size; MG_FIRST_S: the first run's limit, default
  # 300 s; --foreground: a limit stops the trainer alone, which finishes its step and stops its workers)
  local name=$1 tag=$2; shift 2
  local d="$OUT/$name" first="$RUN_ROOT/${tag}1" resumed="$RUN_ROOT/${tag}2"
  local MG="data=gsm8k actor_rollout_ref.actor.optim.lr=1e-5 trainer.strategy=megatron
   trainer.n_gpus_per_node=${MG_GPUS:-2} trainer.save_freq=5 $*"
  CUDA_VISIBLE_DEVICES=$PAIR timeout --foreground -s TERM -k 20 ${MG_FIRST_S:-300} $PY trainer/main.py $COMMON $MG trainer.total_training_steps=10 \
      trainer.output_dir=$first > "$d/first.log" 2>&1
  CUDA_VISIBLE_DEVICES=$PAIR timeout --foreground -s TERM -k 20 150 $PY trainer/main.py $COMMON $MG trainer.total_training_steps=7 \
      trainer.output_dir=$resumed trainer.resume_mode=$first/checkpoints/global_step_5 ${RESUME_EXTRA:-} \
      > "$d/resumed.log" 2>&1
  cp "$first/metrics.jsonl" "$d/first.jsonl" 2>/dev/null
  cp "$resumed/metrics.jsonl" "$d/resumed.jsonl" 2>/dev/null
  du -sb "$first"/checkpoints/global_step_5/* > "$d/sizes.txt" 2>&1
}
megatron_check() {  # name: the GPU check on both GPUs (TP=1/TP=2 log-probs, update, sync, checkpoint round trip
  # and the weights after an update that follows a load) into $OUT/<name>/check.{json,log}
  mkdir -p "$OUT/$1"
  CUDA_VISIBLE_DEVICES=$PAIR timeout -k 10 240 torchrun --nproc_per_node 2 tools/bench/megatron_gpu_check.py \
      --model $MODEL --out "$OUT/$1/check.json" > "$OUT/$1/check.log" 2>&1
}
megatron() {  # on both GPUs: the GPU check, then the save/resume pair of SmolLM2 on the Megatron path
  # (TP=1 x DP=2: SmolLM2's 9 heads do not split over TP=2)
  megatron_check megatron
  megatron_pair megatron mg actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1
}
megatron_tp2() {  # on both GPUs: the GPU check, then the save/resume pair at TP=2 (a random-weight Qwen2 config
  # with SmolLM2's tokenizer: 8 heads, 2 KV heads split over 2; no reward signal, the mechanics only)
  megatron_check megatron_tp2
  $PY -c "from tools.bench.megatron_gpu_check import make_random_qwen2; make_random_qwen2('$RUN_ROOT/qwen2_rand', '$MODEL')" \
      > "$OUT/megatron_tp2/make_model.log" 2>&1
  # random weights score 0, so GRPO's advantages are 0: the entropy bonus makes every step change the weights
  megatron_pair megatron_tp2 mt actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
      actor_rollout_ref.model.path=$RUN_ROOT/qwen2_rand actor_rollout_ref.actor.entropy_coeff=0.01
}
megatron_ckpt() {  # on both GPUs: the SmolLM2 save/resume pair (TP=1 x DP=2) with dist checkpointing and with
  # the torch.save format: compare timing_s/save_checkpoint, "checkpoint loaded in" and sizes.txt of the two
  # (MG_FORMATS: which of the two, default "torch_dist torch")
  local fmt
  for fmt in ${MG_FORMATS:-torch_dist torch}; do
    case $fmt in
      torch_dist) mkdir -p "$OUT/megatron_dist"
        megatron_pair megatron_dist md actor_rollout_ref.actor.megatron.ckpt_format=torch_dist ;;
      torch) mkdir -p "$OUT/megatron_torch"
        megatron_pair megatron_torch mtorch actor_rollout_ref.actor.megatron.ckpt_format=torch ;;
      *) echo "MG_FORMATS: unknown format $fmt (expected torch_dist or torch)" >&2 ;;
    esac
  done
}
megatron_reshard() {  # on both GPUs: a TP=2 dist checkpoint (random-weight Qwen2, as megatron_tp2) resumed at
  # TP=1 x DP=2 (resharded on load, DistributedOptimizer state included); compare steps 6-7 with the TP=2 run
  mkdir -p "$OUT/megatron_reshard"
  $PY -c "from tools.bench.megatron_gpu_check import make_random_qwen2; make_random_qwen2('$RUN_ROOT/qwen2_rand', '$MODEL')" \
      > "$OUT/megatron_reshard/make_model.log" 2>&1
  RESUME_EXTRA=actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1 megatron_pair megatron_reshard mr \
      actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 actor_rollout_ref.model.path=$RUN_ROOT/qwen2_rand \
      actor_rollout_ref.actor.entropy_coeff=0.01
}
vlm_colour() {  # on one GPU: 20 GRPO steps of the tiny random Qwen2-VL on the generated colour task
  # (trainer/embedded_vlm.py), Ulysses SP=1; with two GPUs (vlm_colour:0,1) SP=2. Logs and metrics in $OUT/vlm_colour/
  local gpu=$1 d="$OUT/vlm_colour" spargs="trainer.n_gpus_per_node=1"
  case $gpu in *,*) spargs="trainer.n_gpus_per_node=2 actor_rollout_ref.actor.ulysses_sequence_parallel_size=2" ;; esac
  mkdir -p "$d"
  $PY -c "from trainer.embedded_vlm import write_tiny_vlm, write_colour_task
write_tiny_vlm('$RUN_ROOT/vlm_tiny'); write_colour_task('$RUN_ROOT/vlm_data', 1024, 64)" > "$d/make.log" 2>&1
  CUDA_VISIBLE_DEVICES=$gpu timeout --foreground -s TERM -k 20 480 $PY trainer/main.py trainer.device=cuda \
      $spargs actor_rollout_ref.model.path=$RUN_ROOT/vlm_tiny \
      data.train_files=$RUN_ROOT/vlm_data/train.jsonl data.val_files=$RUN_ROOT/vlm_data/val.jsonl \
      reward_model.scorer=gsm8k_flexible data.max_prompt_length=32 data.max_response_length=2 \
      data.train_batch_size=32 actor_rollout_ref.rollout.n=8 actor_rollout_ref.actor.ppo_mini_batch_size=16 \
      actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.optim.lr=5e-3 \
      trainer.total_training_steps=20 trainer.test_freq=10 trainer.output_dir=$RUN_ROOT/vlm_colour ${EXTRA:-} \
      > "$d/console.log" 2>&1
  echo "exit $?" >> "$d/console.log"
  cp $RUN_ROOT/vlm_colour/metrics.jsonl "$d/" 2>/dev/null
}
tool_synthetic() {  # On one GPU: the embedded data=synthetic_tool (tiny model, python tool, multi-turn loop), 60
  # steps with the transformers engine, then the same with rollout=vllm; compare critic/score/mean and multi_turn/*.
  # Where the sandbox has no user namespaces: EXTRA='actor_rollout_ref.rollout.multi_turn.tools=[{class_name:python,config:{min_isolation:process}}]'
  # (TOOL_ENGINES: which engines, default "hf vllm")
  local gpu=$1 eng
  for eng in ${TOOL_ENGINES:-hf vllm}; do
    local engine_group="rollout=$eng"
    # vLLM takes a share of a GPU other runs may be using (VLLM_UTIL, default 0.15)
    [ "$eng" = vllm ] && engine_group="$engine_group actor_rollout_ref.rollout.gpu_memory_utilization=${VLLM_UTIL:-0.15}"
    mkdir -p "$OUT/tool_synthetic_$eng"
    CUDA_VISIBLE_DEVICES=$gpu timeout --foreground -s TERM -k 20 480 $PY trainer/main.py trainer.device=cuda \
        trainer.n_gpus_per_node=1 data=synthetic_tool $engine_group trainer.total_training_steps=60 \
        trainer.output_dir=$RUN_ROOT/tool_synthetic_$eng ${EXTRA:-} > "$OUT/tool_synthetic_$eng/console.log" 2>&1
    echo "exit $?" >> "$OUT/tool_synthetic_$eng/console.log"
    cp $RUN_ROOT/tool_synthetic_$eng/metrics.jsonl "$OUT/tool_synthetic_$eng/" 2>/dev/null
  done
}
offload() {  # 3 GRPO steps with the optimizer state offloaded during rollout (compare rollout_start memory)
  launch offload "$1" 240 data=gsm8k trainer.total_training_steps=3 \
    actor_rollout_ref.rollout.offload_optimizer_during_rollout=true
}
# LoRA: SmolLM2 GRPO with rank-32 adapters beside full fine-tuning, 30 steps each on the same data
# (gsm8k_lora vs gsm8k_grpo; svamp_lora vs svamp_full, which is the same job as svamp_notool below: held-out
# accuracy every 10 steps, sampled and greedy); reward curve, timing_s/step and
# perf/max_memory_allocated_gb/* from each metrics.jsonl. SmolLM2 ties its embeddings: all-linear leaves lm_head out.
LORA32="actor_rollout_ref.model.lora_rank=32 actor_rollout_ref.model.lora_alpha=64
 actor_rollout_ref.model.target_modules=all-linear actor_rollout_ref.actor.optim.lr=${LORA_LR:-1e-4}"
lora_memory() {  # random-weight Qwen2-1.5B (SmolLM2's tokenizer), ZeRO-2 on one GPU, 4 GRPO steps with the
  # KL loss (full: a reference copy; LoRA: the actor with adapters disabled), full vs LoRA rank 32; the table of
  # peak memory per stage and tokens/s comes from tools/bench/step_profile.py --metrics (step 1 left out);
  # LORA_KINDS: which halves, default "full lora"
  local gpu=$1 d="$OUT/lora_memory"
  mkdir -p "$d"
  $PY tools/bench/random_model.py qwen2-1.5b --tokenizer $MODEL --out $RUN_ROOT/qwen2_15_rand > "$d/make.log" 2>&1
  for kind in ${LORA_KINDS:-full lora}; do
    local own="actor_rollout_ref.actor.optim.lr=1e-5"
    [ "$kind" = lora ] && own="$LORA32"
    CUDA_VISIBLE_DEVICES=$gpu timeout --foreground -s TERM -k 20 400 $PY trainer/main.py $COMMON data=gsm8k deepspeed=zero2 \
        actor_rollout_ref.model.path=$RUN_ROOT/qwen2_15_rand trainer.total_training_steps=4 trainer.val_before_train=false \
        trainer.test_freq=-1 $own trainer.output_dir=$RUN_ROOT/lora_memory_$kind > "$d/$kind.log" 2>&1
    echo "exit $?" >> "$d/$kind.log"
    cp $RUN_ROOT/lora_memory_$kind/metrics.jsonl "$d/$kind.jsonl" 2>/dev/null
    $PY tools/bench/step_profile.py --metrics "$d/$kind.jsonl" --out "$d/$kind.step.json" > "$d/$kind.table.txt" 2>&1
  done
}
# svamp_tool / svamp_notool: the same GRPO job (svamp_e's settings, 30 steps, held-out accuracy on the 300 test rows
# every 10 steps, sampled and greedy) with and without the python tool. The tool run: multi-turn rollouts where the
# model's ```python blocks run in the sandbox (at most 3 model turns), prompts that ask for the tool (data/svamp_tool,
# written here when missing: from the local copy .gdata/svamp if there is one, else from the Hub, together with
# data/svamp when that is missing too, so both hold the same questions), and SmolLM2's chat template with tool answers
# in <tool_response> blocks (tools/chat_templates/smollm2_tool.jinja; its other messages render as SmolLM2's own):
# the scorer reads the final "#### N" only after the last </tool_response>, so a program printing "#### N" earns
# nothing. Saved every 10 steps; NAME_more resumes NAME. Where the sandbox has no user namespaces:
# EXTRA='actor_rollout_ref.rollout.multi_turn.tools=[{class_name:python,config:{min_isolation:process}}]'.
# Plot: python tools/plot_run.py $OUT/svamp_tool $OUT/svamp_notool --out $OUT/plots --name svamp_tool
SVAMP_TOOLCMP="$SVAMP_E trainer.total_training_steps=30 trainer.val_also_greedy=true trainer.save_freq=10
 trainer.max_actor_ckpt_to_keep=1"
SVAMP_TOOL="data.train_files=data/svamp_tool/train.parquet data.val_files=data/svamp_tool/test.parquet
 actor_rollout_ref.rollout.multi_turn.enable=true actor_rollout_ref.rollout.multi_turn.format=python_block
 actor_rollout_ref.rollout.multi_turn.tools=[python] actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3"
svamp_tool_data() {  # data/svamp_tool (and data/svamp when missing) from one source; refuse two different splits
  local src="" d
  [ -d .gdata/svamp ] && src="--src .gdata/svamp"
  for d in svamp svamp_tool; do
    if [ ! -f data/$d/test.parquet ]; then
      local tool=""; [ $d = svamp_tool ] && tool="--tool python"
      $PY tools/data_preprocess/svamp.py $src --out data/$d $tool || return 1
    fi
  done
  $PY -c "import sys; from tools.data_preprocess.svamp import check_same_questions as c; c(*sys.argv[1:])" \
      data/svamp data/svamp_tool
}
for spec in $RUNS; do
  name=${spec%%:*} gpu=${spec##*:}
  case $name in
    gsm8k_grpo) launch gsm8k_grpo "$gpu" "$T_LONG" $GSM ;;
    gsm8k_gae) launch gsm8k_gae "$gpu" "$T_LONG" $GSM algorithm=gae ;;
    gsm8k_prime) launch gsm8k_prime "$gpu" "$T_LONG" $GSM algorithm=prime data.oversample_factor=${PRIME_OVERSAMPLE:-2.0} ;;
    svamp_a) launch svamp_a "$gpu" "$T_LONG" $SVAMP actor_rollout_ref.actor.optim.lr=2e-5 ;;
    svamp_b) launch svamp_b "$gpu" "$T_LONG" $SVAMP actor_rollout_ref.actor.optim.lr=5e-5 ;;
    svamp_c) launch svamp_c "$gpu" "$T_LONG" $SVAMP actor_rollout_ref.actor.optim.lr=5e-5 \
               reward_model.overlong_buffer.enable=true reward_model.overlong_buffer.len=64 \
               reward_model.overlong_buffer.penalty_factor=0.5 ;;
    svamp_d) launch svamp_d "$gpu" "$T_LONG" $SVAMP actor_rollout_ref.actor.optim.lr=5e-5 \
               reward_model.overlong_buffer.enable=true reward_model.overlong_buffer.len=64 \
               reward_model.overlong_buffer.penalty_factor=0.5 actor_rollout_ref.rollout.val_kwargs.n=1 \
               actor_rollout_ref.rollout.val_kwargs.do_sample=false ;;
    repeat_sr1) launch repeat_sr1 "$gpu" 300 data=gsm8k actor_rollout_ref.actor.optim.lr=1e-5 \
               trainer.total_training_steps=4 trainer.save_freq=2 ;;  # run-to-run noise of the save_resume pair
    save_resume) save_resume "$gpu" & ;;
    megatron) megatron & ;;
    megatron_tp2) megatron_tp2 & ;;
    vlm_colour) vlm_colour "$gpu" & ;;
    tool_synthetic) tool_synthetic "$gpu" & ;;
    megatron_ckpt) megatron_ckpt & ;;
    megatron_reshard) megatron_reshard & ;;
    svamp_e) launch svamp_e "$gpu" "$T_LONG" $SVAMP_E ;;  # 512-token responses (the model README's setting)
    svamp_f) launch svamp_f "$gpu" "$T_LONG" $SVAMP actor_rollout_ref.actor.optim.lr=5e-5 data.max_response_length=512 \
               reward_model.overlong_buffer.enable=true reward_model.overlong_buffer.len=128 \
               reward_model.overlong_buffer.penalty_factor=0.5 actor_rollout_ref.actor.use_kl_loss=false \
               actor_rollout_ref.actor.clip_ratio_high=0.28 ;;  # svamp_e with DAPO's clip-higher and no KL loss
    svamp_g) launch svamp_g "$gpu" "$T_LONG" $SVAMP_E trainer.save_freq=10 trainer.max_actor_ckpt_to_keep=1 ;;
    svamp_g_more) RUN_DIR=svamp_g launch svamp_g_more "$gpu" "$T_LONG" $SVAMP_E trainer.save_freq=10 \
               trainer.max_actor_ckpt_to_keep=1 trainer.resume_mode=auto ;;  # svamp_g continued from its last save
    svamp_h) launch svamp_h "$gpu" "$T_LONG" $SVAMP_E data.train_batch_size=16 actor_rollout_ref.rollout.n=16 \
               trainer.save_freq=10 trainer.max_actor_ckpt_to_keep=1 ;;  # groups of 16 (same 256 samples per step)
    svamp_h_more) RUN_DIR=svamp_h launch svamp_h_more "$gpu" "$T_LONG" $SVAMP_E data.train_batch_size=16 \
               actor_rollout_ref.rollout.n=16 trainer.save_freq=10 trainer.max_actor_ckpt_to_keep=1 \
               trainer.resume_mode=auto ;;
    svamp_i) launch svamp_i "$gpu" "$T_LONG" $SVAMP_E data.train_batch_size=16 actor_rollout_ref.rollout.n=16 \
               actor_rollout_ref.actor.optim.lr=1e-4 ;;  # svamp_h at 2x lr (one optimizer step per step, not two)
    svamp_j) launch svamp_j "$gpu" "$T_LONG" $SVAMP_E data.train_batch_size=16 actor_rollout_ref.rollout.n=16 \
               actor_rollout_ref.rollout.temperature=0.7 ;;  # svamp_h sampling its rollouts at T=0.7 (as validated)
    svamp_k) launch svamp_k "$gpu" "$T_LONG" $SVAMP_E data.train_batch_size=16 actor_rollout_ref.rollout.n=16 \
               actor_rollout_ref.rollout.temperature=0.7 actor_rollout_ref.actor.optim.lr=7e-5 ;;  # svamp_j, lr 7e-5
    # 1,024 samples per step (4x svamp_h), generated in one call of 1,024 rows; saved every 8 steps and on
    # SIGTERM; NAME_more resumes NAME from its last save in a later call (no step-0 validation)
    # svamp_r / svamp_s: svamp_l / svamp_o again after the 3x faster sdpa_gqa decoding, validated
    # both ways (T=0.7 x 2 and greedy)
    # svamp_t / svamp_u: svamp_s / svamp_r with the lr decayed to 0 by a cosine over 40 steps
    # (svamp_s peaked at step 16 at lr 1e-4 and then degraded; svamp_r peaked at step 24)
    # svamp_w: svamp_u with DAPO dynamic sampling (groups whose answers all agree are dropped and more batches of
    # 64 prompts generated, at most 3 per step)
    svamp_l|svamp_n|svamp_o|svamp_r|svamp_s|svamp_t|svamp_u|svamp_w|svamp_l_more|svamp_n_more|svamp_o_more|svamp_r_more|svamp_s_more|svamp_t_more|svamp_u_more|svamp_w_more)
      base=${name%_more} more=""
      [ "$base" != "$name" ] && more="trainer.resume_mode=auto trainer.val_before_train=false"
      case $base in
        svamp_l|svamp_r|svamp_u|svamp_w) big="data.train_batch_size=64 actor_rollout_ref.rollout.n=16" ;;  # 4 optimizer steps per step
        svamp_n) big="data.train_batch_size=32 actor_rollout_ref.rollout.n=32 actor_rollout_ref.actor.ppo_mini_batch_size=32" ;;
        svamp_o|svamp_s|svamp_t) big="data.train_batch_size=64 actor_rollout_ref.rollout.n=16 actor_rollout_ref.actor.ppo_mini_batch_size=64
               actor_rollout_ref.actor.optim.lr=1e-4" ;;  # one optimizer step per step, 2x lr
      esac
      case $base in svamp_r|svamp_s|svamp_t|svamp_u|svamp_w) big="$big trainer.val_also_greedy=true" ;; esac
      case $base in svamp_t|svamp_u|svamp_w) big="$big trainer.total_training_steps=40
        actor_rollout_ref.actor.optim.lr_scheduler_type=cosine" ;; esac
      case $base in svamp_u|svamp_w) big="$big actor_rollout_ref.actor.optim.lr=7e-5" ;; esac
      [ "$base" = svamp_w ] && big="$big algorithm.filter_groups.enable=true algorithm.filter_groups.max_num_gen_batches=3"
      RUN_DIR=$base launch "$name" "$gpu" "$T_LONG" $SVAMP_E $big actor_rollout_ref.rollout.max_batch_size=1024 \
        trainer.test_freq=8 trainer.save_freq=8 \
        trainer.max_actor_ckpt_to_keep=1 $more ;;
    # svamp_h's settings, validated both ways (T=0.7 x 2 samples and one greedy answer per question, same weights);
    # svamp_q also decodes with rollout.attn_implementation=sdpa_gqa (same numerics; its step time vs svamp_p's)
    # svamp_v (not run): svamp_q with DAPO dynamic sampling (only groups whose answers differ, up to 4
    # generation batches per step)
    svamp_p|svamp_q|svamp_v|svamp_p_more|svamp_q_more|svamp_v_more)
      base=${name%_more} more=""
      [ "$base" != "$name" ] && more="trainer.resume_mode=auto trainer.val_before_train=false"
      own=""; [ "$base" = svamp_q ] && own="actor_rollout_ref.rollout.attn_implementation=sdpa_gqa"
      [ "$base" = svamp_v ] && own="algorithm.filter_groups.enable=true algorithm.filter_groups.max_num_gen_batches=4"
      RUN_DIR=$base launch "$name" "$gpu" "$T_LONG" $SVAMP_E data.train_batch_size=16 actor_rollout_ref.rollout.n=16 \
        trainer.val_also_greedy=true trainer.save_freq=10 trainer.max_actor_ckpt_to_keep=1 $own $more ;;
    svamp_tool|svamp_notool|svamp_tool_more|svamp_notool_more)
      base=${name%_more} more=""
      [ "$base" != "$name" ] && more="trainer.resume_mode=auto trainer.val_before_train=false"
      mkdir -p "$OUT/$name"
      svamp_tool_data > "$OUT/$name/data.log" 2>&1 || { echo "$name data: see $OUT/$name/data.log" >&2; exit 2; }
      if [ "$base" = svamp_tool ]; then
        RUN_DIR=$base launch "$name" "$gpu" "$T_LONG" $SVAMP_TOOLCMP $SVAMP_TOOL $more \
          "actor_rollout_ref.model.custom_chat_template='$(cat tools/chat_templates/smollm2_tool.jinja)'"
      else
        RUN_DIR=$base launch "$name" "$gpu" "$T_LONG" $SVAMP_TOOLCMP $more
      fi ;;
    offload) offload "$gpu" ;;
    gsm8k_lora) launch gsm8k_lora "$gpu" "$T_LONG" $GSM $LORA32 ;;  # beside gsm8k_grpo (full fine-tuning)
    # gsm8k_lora's job with vLLM serving the adapter (enable_lora, LoRARequest re-loaded after each step), 12 steps
    gsm8k_lora_vllm) launch gsm8k_lora_vllm "$gpu" "$T_LONG" $GSM $LORA32 rollout=vllm trainer.total_training_steps=12 \
               actor_rollout_ref.rollout.lora_sync=adapter trainer.test_freq=-1 trainer.val_before_train=false \
               actor_rollout_ref.rollout.gpu_memory_utilization=${VLLM_UTIL:-0.15} ;;
    svamp_lora) launch svamp_lora "$gpu" "$T_LONG" $SVAMP_TOOLCMP $LORA32 ;;
    svamp_full) launch svamp_full "$gpu" "$T_LONG" $SVAMP_TOOLCMP ;;
    # async on one GPU: the rollout worker shares it (rollout.n_gpus=0.3), staleness 1 beside the same job on-policy
    # (svamp_onpolicy); engine from ASYNC_ENGINE (hf or vllm); compare critic/score/mean, val accuracy, timing_s/step
    # (svamp_onpolicy); engine from ASYNC_ENGINE (hf or vllm), svamp_async_vllm: vLLM in the rollout worker
    svamp_onpolicy|svamp_async|svamp_async_vllm)
      own="trainer.rollout_placement=separate actor_rollout_ref.rollout.n_gpus=0.3 trainer.async.staleness=1"
      eng=${ASYNC_ENGINE:-hf}
      [ "$name" = svamp_onpolicy ] && own=""
      [ "$name" = svamp_async_vllm ] && eng=vllm own="$own actor_rollout_ref.rollout.gpu_memory_utilization=${VLLM_UTIL:-0.15}"
      launch "$name" "$gpu" "$T_LONG" $SVAMP trainer.total_training_steps=30 actor_rollout_ref.actor.optim.lr=5e-5 \
        rollout=$eng $own ;;
    lora_memory) lora_memory "$gpu" & ;;
    # the same GSM8K job with each engine (rollout=hf | rollout=vllm) and each algorithm, truncated importance
    # sampling on in both (its weights and the engine/trainer log-prob gap are logged); vLLM takes 0.15 of the GPU
    hf_grpo|vllm_grpo|hf_gae|vllm_gae|hf_prime|vllm_prime)
      eng=${name%%_*} alg=${name#*_} own=""
      [ "$eng" = vllm ] && own="actor_rollout_ref.rollout.gpu_memory_utilization=${VLLM_UTIL:-0.15}"
      [ "$alg" = prime ] && own="$own data.oversample_factor=${PRIME_OVERSAMPLE:-2.0}"
      launch "$name" "$gpu" "$T_LONG" $GSM rollout=$eng algorithm=$alg algorithm.rollout_correction.rollout_is=token \
        trainer.val_before_train=false trainer.test_freq=-1 $own ;;
    *) echo "unknown run $name" >&2; exit 2 ;;
  esac
  # vLLM measures its free memory while it starts: other processes that allocate or free GPU memory meanwhile make
  # it refuse to start ("No available memory for the cache blocks", "Error in memory profiling"), so runs sharing a
  # GPU start LAUNCH_GAP_S apart
  sleep "${LAUNCH_GAP_S:-0}"
done
wait
nvidia-smi --query-gpu=name,memory.used --format=csv > "$OUT/nvidia_smi.txt" 2>&1
echo "all runs done"
