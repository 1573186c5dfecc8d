"""Shared helpers of the benchmark scripts in ``tools/bench/``: model configs, packed batches, timing, output.

Nothing here is a benchmark by itself. Every script prints a plain-text table (:func:`print_table`) and writes
one JSON document (:func:`write_json`) whose ``meta`` block records the exact command, the date, torch and
device names, so that a number is never separated from how it was measured.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import time
from typing import Any, Iterable, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

__all__ = ["MODEL_CONFIGS", "hf_config", "build_model", "packed_batch", "sync", "Timer", "peak_memory_gib",
           "reset_peak_memory", "run_meta", "actor_micro_step", "deepspeed_engine", "update_setup", "kernel_options", "apply_tiny",
           "write_json", "write_report_files", "run_job_file", "print_table", "pick_device", "DeviceMemorySampler", "ROOT"]

# Architectures of the real models, random weights (hidden, layers, heads, kv heads, intermediate, vocab).
MODEL_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2-1.5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=131072,
                                 rope_theta=1000000.0, tie_word_embeddings=True, bos_token_id=151643,
                                 eos_token_id=151643)),
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=131072,
                                   rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
    # CPU smoke-test size: every code path, seconds on 2 cores (4 heads, 2 KV heads: SP=2 divides both)
    "tiny": ("llama", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                           tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)),
}


def hf_config(name: str):
    """The transformers config of ``name`` (a key of :data:`MODEL_CONFIGS`).

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model config {name!r}; expected one of {sorted(MODEL_CONFIGS)}")
    kind, kw = MODEL_CONFIGS[name]
    from transformers import LlamaConfig, Qwen2Config

    return (Qwen2Config if kind == "qwen2" else LlamaConfig)(**kw)


def build_model(name: str, device: torch.device | str, dtype: torch.dtype, sp_group=None, seed: int = 0,
                gradient_checkpointing: bool = False):
    """A random-weight causal LM of config ``name`` on ``device`` in ``dtype``, patched with
    ``patches.ulysses.apply_ulysses_patch(model, sp_group)`` (packed varlen attention; Ulysses when the group
    has size > 1). Weights depend only on ``seed`` (same on every rank)."""
    from transformers import AutoModelForCausalLM

    from patches.ulysses import apply_ulysses_patch

    cfg = hf_config(name)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    apply_ulysses_patch(model, sp_group)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def packed_batch(num_tokens: int, seq_len: int, response_len: int, vocab_size: int, device="cpu", seed: int = 0,
                 host_inputs: bool = False):
    """A full (unpadded) batch of ``num_tokens // seq_len`` rows of ``seq_len`` tokens, the last
    ``response_len`` of each row being the response; the packed forward turns it into one ``(1, num_tokens)`` row.

    Returns:
        dict with ``input_ids`` ``(B, seq_len)`` int64, ``attention_mask`` ``(B, seq_len)`` int64 (all 1),
        ``position_ids`` ``(B, seq_len)`` int64 (0..seq_len-1), ``response_mask`` ``(B, R)`` float32,
        ``advantages`` ``(B, R)`` float32 unit normal (seed 1) on ``device``, ``response_length`` R, ``seqlens``
        (list of B ints) and ``device``. With ``host_inputs`` the three input
        tensors stay on the CPU, as the trainer's micro-batches do (``forward_log_probs(..., device=device)`` then
        packs on the host without host syncs); ``response_mask`` is always on ``device``.

    Raises:
        ValueError: ``seq_len`` not dividing ``num_tokens`` or ``response_len`` not in ``[1, seq_len)``.
    """
    if seq_len < 2 or num_tokens < seq_len or num_tokens % seq_len:
        raise ValueError(f"num_tokens ({num_tokens}) must be a positive multiple of seq_len ({seq_len} >= 2)")
    if not 0 < response_len < seq_len:
        raise ValueError(f"response_len must be in [1, seq_len={seq_len}), got {response_len}")
    b = num_tokens // seq_len
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (b, seq_len), generator=g)
    where = "cpu" if host_inputs else device
    adv = torch.randn((b, response_len), generator=torch.Generator().manual_seed(1))
    return dict(input_ids=ids.to(where), attention_mask=torch.ones_like(ids).to(where),
                position_ids=torch.arange(seq_len).expand(b, -1).contiguous().to(where),
                response_mask=torch.ones(b, response_len, device=device), response_length=response_len,
                advantages=adv.to(device), seqlens=[seq_len] * b, device=torch.device(device))


def deepspeed_engine(model, device: torch.device, zero_stage: int, lr: float, ds_config: dict | None = None):
    """Wrap ``model`` as the trainer's actor does (one rank, the trainer's DeepSpeed config and optimizer, bf16 with
    fp32 master weights on CUDA): returns the DeepSpeed engine. ``ds_config``: merged into DeepSpeed's config last,
    as the trainer's ``deepspeed.ds_config``. Sets MASTER_ADDR/PORT if unset."""
    import deepspeed

    from trainer.config import DeepSpeedConfig, OptimConfig, WorkerRuntime
    from trainer.config.packaged import packaged_section
    from trainer.workers.base import DistributedWorker, free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    ds = packaged_section(DeepSpeedConfig, "deepspeed", [f"deepspeed.zero_stage={zero_stage}"],
                          ds_config=ds_config or None)
    cfg = WorkerRuntime(deepspeed=ds, seed=1, cpus_per_worker=max(1, torch.get_num_threads()))
    w = DistributedWorker(cfg, rank=0, world_size=1, master_addr=os.environ["MASTER_ADDR"],
                          master_port=int(os.environ["MASTER_PORT"]), device=device.type)
    w.init_distributed()
    optim = packaged_section(OptimConfig, "actor_rollout_ref.actor.optim", lr=lr)
    opt, sched = w.build_optimizer(model, optim, total_steps=10 ** 6)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=w.ds_config(train=True))
    return engine


def update_setup(model, device: torch.device, use_deepspeed: bool, kernels: dict | None = None,
                 zero_stage: int = 2, lr: float = 1e-6, ds_config: dict | None = None):
    """The optimizer side of an actor-update loop: ``(fwd, backward_fn, step, optimizer)``.

    ``use_deepspeed``: the trainer's DeepSpeed engine (:func:`deepspeed_engine`); ``fwd`` is the engine,
    ``backward_fn`` its ``backward`` (no division by gradient accumulation steps: the trainer normalises losses),
    ``step`` its ``step`` and ``optimizer`` the torch optimizer inside it. Otherwise ``torch.optim.AdamW`` on
    ``model`` with ``step`` = step + ``zero_grad``; with a CUDA-graph ``kernels`` mode its gradients are made safe to
    accumulate (``trainer.workers.kernels.keep_graph_grads``).
    """
    if use_deepspeed:
        engine = deepspeed_engine(model, device, zero_stage, lr=lr, ds_config=ds_config)
        inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
        return engine, (lambda loss: engine.backward(loss, scale_wrt_gas=False)), engine.step, inner
    from trainer.workers.kernels import CUDAGRAPH_MODES, compile_mode, keep_graph_grads

    if compile_mode(kernels or {}) in CUDAGRAPH_MODES:
        keep_graph_grads(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, None, step, opt


def actor_micro_step(model, batch: dict, sp=None, backward: bool = True, temperature: float = 1.0,
                     backward_fn=None) -> torch.Tensor:
    """One micro-batch of the actor update path: packed ``trainer.forward.forward_log_probs`` (Ulysses when
    ``sp`` has size > 1), the PPO clipped loss (``trainer.core_algos`` "vanilla", token-mean) with
    ``old_log_probs`` = detached log-probs and unit-normal advantages, then backward (``backward_fn(loss)`` if
    given, e.g. a DeepSpeed engine's ``backward``, else ``loss.backward()``).

    Args:
        batch: from :func:`packed_batch`. Returns: the scalar loss (detached), float32.
    """
    from trainer import core_algos
    from trainer.forward import forward_log_probs

    lp, _ = forward_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                              batch["response_length"], temperature=temperature, sp=sp,
                              device=batch.get("device"))
    mask = batch["response_mask"]
    adv = batch.get("advantages")
    if adv is None:  # made on the host: a pageable copy, i.e. a host sync per micro-batch
        adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)).to(mask.device)
    loss, _ = core_algos.get_policy_loss_fn("vanilla")(lp.detach(), lp, adv, mask, loss_agg_mode="token-mean",
                                                        config={"clip_ratio": 0.2, "clip_ratio_c": 3.0})
    if backward:
        (backward_fn or torch.Tensor.backward)(loss)
    return loss.detach()


def kernel_options(args) -> dict:
    """The trainer's fused-kernel options from ``--liger/--compile/--compile-mode`` (a mode other than default
    implies ``use_torch_compile``)."""
    return dict(use_liger=args.liger, use_torch_compile=args.compile or args.compile_mode != "default",
                torch_compile_mode=args.compile_mode)


def apply_tiny(args, parser, **values) -> None:
    """Set the ``--tiny`` sizes on ``args``, except options the user gave explicitly (value != parser default)."""
    for k, v in values.items():
        if getattr(args, k) == parser.get_default(k):
            setattr(args, k, v)


def pick_device(requested: str | None = None) -> torch.device:
    """``cuda`` when available (or requested), else ``cpu``. Raises ValueError if cuda is requested but absent."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but torch.cuda.is_available() is False")
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(device=None) -> None:
    """``torch.cuda.synchronize`` on CUDA (kernels are asynchronous), nothing on CPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


class Timer:
    """Wall-clock seconds of a block, synchronising CUDA before and after: ``with Timer(dev) as t: ...; t.s``."""

    def __init__(self, device=None):
        self.device, self.s = device, float("nan")

    def __enter__(self):
        sync(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.s = time.perf_counter() - self._t0
        return False


def reset_peak_memory(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device) -> float | None:
    """``torch.cuda.max_memory_allocated`` in GiB on CUDA; None on CPU (not measured there)."""
    if torch.device(device).type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


class DeviceMemorySampler:
    """Peak memory in use on one GPU, whole device (every process and allocator: CUDA contexts, PyTorch's caching
    allocator, vLLM's pools), sampled from outside the measured processes, so this process needs no CUDA context.

    ``with DeviceMemorySampler() as m: run()`` then ``m.peak_gib``, ``m.baseline_gib`` (in use when sampling
    began: other processes), ``m.source`` (``"nvml"`` via pynvml, ``"nvidia-smi"``, or None when neither works:
    then both values stay None). Samples every ``interval_s`` seconds in a daemon thread, so a peak shorter than
    that can be missed. ``index``: the GPU's NVML index (default: the first entry of ``CUDA_VISIBLE_DEVICES``
    when it is a number, else 0; NVML numbers GPUs by PCI order, which CUDA follows only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""

    def __init__(self, index: int | None = None, interval_s: float = 0.1):
        if index is None:
            first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            index = int(first) if first.isdigit() else 0
        self.index, self.interval_s = index, interval_s
        self.peak_gib = self.baseline_gib = self.source = None
        self._read = self._open()

    def _open(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self.source = "nvml"
            return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
        except Exception:  # no pynvml or no driver: try the command line tool
            pass
        import shutil
        import subprocess

        if shutil.which("nvidia-smi") is None:
            return None
        cmd = ["nvidia-smi", f"--id={self.index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]

        def read():
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return float(out.stdout.strip().splitlines()[0]) / 1024  # MiB -> GiB
        try:
            read()
        except Exception:
            return None
        self.source = "nvidia-smi"
        return read

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            try:
                self.peak_gib = max(self.peak_gib, self._read())
            except Exception:  # a failed sample is skipped
                pass

    def __enter__(self):
        import threading

        if self._read is not None:
            self.baseline_gib = self.peak_gib = self._read()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._read is not None:
            self._stop.set()
            self._thread.join(timeout=15)
        return False


def run_meta(args=None, machine: str | None = None) -> dict[str, Any]:
    """Provenance of a measurement: UTC date, command line, python/torch/transformers versions, device name."""
    import transformers

    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores)"
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=" ".join([os.path.relpath(sys.argv[0], ROOT) if sys.argv[0] else "python"] + sys.argv[1:]),
                python=platform.python_version(), torch=torch.__version__, transformers=transformers.__version__,
                device=dev, gpus=torch.cuda.device_count(), host=platform.node())
    if machine:
        meta["machine"] = machine
    if args is not None:
        meta["args"] = {k: v for k, v in vars(args).items()}
    return meta


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, torch.Tensor):
        return _clean(x.tolist())
    return x


def write_json(path: str | None, doc: dict) -> None:
    """Write ``doc`` as strict JSON (NaN/inf become strings) to ``path``; parents are created; None: no file."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_clean(doc), f, indent=1, allow_nan=False, default=str)
    print(f"wrote {path}", flush=True)


def run_job_file(path: str, fn) -> dict:
    """A child process's work: the job dict in the JSON file ``path``, ``res = fn(job)`` written as JSON to
    ``job["trl_result"]``; returns ``res``."""
    with open(path, encoding="utf-8") as f:
        job = json.load(f)
    res = fn(job)
    with open(job["trl_result"], "w", encoding="utf-8") as f:
        json.dump(res, f)
    return res


def write_report_files(doc: dict, out: str, text: str, plot_fn, png_path: str) -> str | None:
    """``doc`` as JSON at ``out`` (:func:`write_json`), ``text`` (markdown) at ``<out stem>.md`` and printed, and
    ``plot_fn(doc, png_path)`` (returns the path, or None when it drew nothing); returns the PNG path or None."""
    write_json(out, doc)
    stem = os.path.splitext(out)[0]
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    print(text, flush=True)
    png = plot_fn(doc, png_path)
    print(f"wrote {stem}.md" + (f", {png}" if png else " (no plot: matplotlib absent or nothing to draw)"), flush=True)
    return png


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"
    return str(v)


def print_table(rows: Sequence[dict], columns: Iterable[str] | None = None, title: str | None = None) -> str:
    """Print ``rows`` (dicts) as an aligned text table over ``columns`` (default: keys of the first row);
    returns the text. Missing values print as ``-``."""
    rows = list(rows)
    cols = list(columns) if columns is not None else (list(rows[0]) if rows else [])
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = [title] if title else []
    lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    text = "\n".join(lines)
    print(text, flush=True)
    return text
