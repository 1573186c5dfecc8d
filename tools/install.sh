#!/usr/bin/env bash
# Install the project and its dependencies. Usage: bash tools/install.sh [test|vllm|megatron]
# - CPU machines get PyTorch's CPU build (torch==2.13.0); on a GPU machine install your CUDA build of torch
#   first and set DSRL_KEEP_TORCH=1.
# - DeepSpeed ships only as source; it is built against the installed torch (--no-build-isolation, no ops
#   pre-built: DS_BUILD_OPS=0; the ops it needs are JIT-compiled at run time).
set -euo pipefail
extra=${1:-}
if [ -z "${DSRL_KEEP_TORCH:-}" ] && ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q torch==2.13.0
fi
DS_BUILD_OPS=0 python -m pip install -q --no-build-isolation "deepspeed==0.19.*"
python -m pip install -q -e ".${extra:+[$extra]}"
