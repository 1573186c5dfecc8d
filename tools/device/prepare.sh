#!/usr/bin/env bash
# On the GPU machine (no internet): join SmolLM2's GGUF halves (.mA/, .mB/, carried to the machine),
# check the sha256, convert to a trainable HF folder at /tmp/smol_hf, and preprocess GSM8K/SVAMP from .gdata/
# (the GSM8K/SVAMP jsonl files carried to the machine, git-ignored) into data/.
set -euo pipefail
if [ ! -f /tmp/smol_hf/model.safetensors ]; then
  cat /tmp/smol.gguf.part0 .mB/smol.gguf.part1 > /tmp/smol.gguf
  echo "$(cat .mB/smol.gguf.sha256)  /tmp/smol.gguf" | sha256sum -c
  python3 tools/gguf_to_hf.py /tmp/smol.gguf /tmp/smol_hf
fi
python3 tools/data_preprocess/gsm8k.py --src .gdata/gsm8k --out data/gsm8k >/dev/null
python3 tools/data_preprocess/svamp.py --src .gdata/svamp --out data/svamp >/dev/null
ls data/gsm8k data/svamp /tmp/smol_hf
