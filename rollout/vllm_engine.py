"""vLLM rollout engine, colocated with the trainer and put to sleep while it trains.

Written against vLLM's offline API (``vllm.LLM``, ``SamplingParams``, sleep mode, ``collective_rpc``). Tested with a
fake ``LLM`` that records the call protocol (``tests/test_rollout_vllm_protocol.py``, CPU) and for real on a GPU
(``tests/test_rollout_vllm_gpu.py``, vLLM 0.24.0). Install with ``pip install -e .[vllm]``. vLLM runs inside the
worker's process: set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the worker sets it when unset).
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import torch

from rollout.base import RolloutEngine, RolloutOutput, SamplingConfig, check_prompts, check_tags, finalize_responses


def import_vllm():
    """Import vllm lazily. Raises ImportError naming the install command when it is absent."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ImportError("rollout.name=vllm needs vLLM: install it with `pip install -e .[vllm]` "
                          "(or use rollout.name=hf, the transformers engine)") from err
    return vllm


class VLLMRolloutEngine(RolloutEngine):
    """vLLM ``LLM`` with ``enable_sleep_mode=True``, asleep (level 1) right after creation.

    Args:
        model_path: HF folder of the actor (config + tokenizer; weights may be dummy, they are synced).
        eos_token_id: stop id(s) of every call (the set of :func:`rollout.stop_tokens.resolve_stop_token_ids`),
            passed to vLLM as ``stop_token_ids`` besides ``SamplingConfig.stop_token_ids``.
        pad_token_id: response filler (falls back to the first EOS id).
        tensor_model_parallel_size: vLLM TP size (``rollout.tensor_model_parallel_size``).
        gpu_memory_utilization, dtype, max_model_len, seed, enforce_eager, load_format: passed to ``vllm.LLM``.
        logprobs_mode: vLLM's ``logprobs_mode``; ``"processed_logprobs"`` (default) returns the log-probs of the
            temperature-scaled distribution that was sampled, which is what the trainer recomputes (vLLM's own
            default, ``"raw_logprobs"``, ignores the temperature).
        llm_cls: the ``LLM`` class (tests pass a fake); default ``vllm.LLM``.
        sampling_params_cls: the ``SamplingParams`` class; default ``vllm.SamplingParams``.
        lora_request_cls: the ``LoRARequest`` class of :meth:`load_lora_adapter`; default
            ``vllm.lora.request.LoRARequest`` (needs ``enable_lora=True`` among ``llm_kwargs``).
        **llm_kwargs: extra ``vllm.LLM`` arguments.

    Raises:
        ImportError: vLLM absent and no ``llm_cls`` given.
    """

    def __init__(self, model_path: str, eos_token_id: int | list[int], pad_token_id: int | None = None,
                 tensor_model_parallel_size: int = 1, gpu_memory_utilization: float = 0.5, dtype: str = "bfloat16",
                 max_model_len: int | None = None, seed: int = 0, enforce_eager: bool = False,
                 load_format: str = "dummy", logprobs_mode: str = "processed_logprobs", llm_cls: Any = None,
                 sampling_params_cls: Any = None, lora_request_cls: Any = None, **llm_kwargs) -> None:
        # colocation: the engine lives in this (the trainer's) process, so that load_weights reaches its model
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if llm_cls is None or sampling_params_cls is None:
            vllm = import_vllm()
            llm_cls = llm_cls or vllm.LLM
            sampling_params_cls = sampling_params_cls or vllm.SamplingParams
        self._sampling_params_cls = sampling_params_cls
        self._lora_request_cls = lora_request_cls
        self.lora_request = None  # the adapter every generate call uses (load_lora_adapter)
        self._lora_ids = 0
        self.eos_ids = [eos_token_id] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        if not self.eos_ids:
            raise ValueError("eos_token_id is empty; expected at least one EOS id")
        self.pad_id = int(pad_token_id) if pad_token_id is not None else self.eos_ids[0]
        self.llm = llm_cls(model=model_path, tensor_parallel_size=int(tensor_model_parallel_size),
                           gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, max_model_len=max_model_len,
                           seed=seed, enforce_eager=enforce_eager, load_format=load_format,
                           logprobs_mode=logprobs_mode, enable_sleep_mode=True, **llm_kwargs)
        self.llm.sleep(level=1)
        self._kv_awake = False  # sleep dropped the KV cache and reset the prefix cache

    # ---- memory ---------------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """``LLM.sleep(level)``: 1 offloads weights to CPU and drops the KV cache, 2 drops both.

        Raises: ValueError for another level."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        self.llm.sleep(level=level)
        self._kv_awake = False

    def wake_up(self, tags: list[str] | None = None) -> None:
        """``LLM.wake_up(tags=...)``; one tag per call (as OpenRLHF does) so weights come before the KV cache."""
        for tag in check_tags(tags):
            self.llm.wake_up(tags=[tag])
            self._kv_awake = self._kv_awake or tag == "kv_cache"

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Pass one bucket of ``(hf_name, tensor)`` to the vLLM model's ``load_weights`` (vLLM maps HF names,
        fuses qkv/gate_up and handles tied embeddings itself).

        Uses ``llm.collective_rpc`` when the engine offers it (vLLM >= 0.7, every TP worker), else the driver
        worker's ``model_runner.model.load_weights`` (older single-process engines).
        """
        weights = list(named_tensors)
        if hasattr(self.llm, "collective_rpc"):
            self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        else:
            _load_into_model(self.llm.llm_engine.model_executor.driver_worker.model_runner.model, weights)

    def weights_updated(self) -> None:
        """``LLM.reset_prefix_cache()``: vLLM's automatic prefix caching (on by default) would otherwise serve
        prompt prefixes, e.g. a chat template's system turn shared by every prompt, from KV blocks computed with
        the old weights. Only while the KV cache is awake: ``sleep`` resets the prefix cache itself, so an engine
        that sleeps between updates (colocated) has nothing cached; one that stays awake (a rollout worker of
        ``trainer.rollout_placement=separate``) needs the reset.

        Raises: RuntimeError when vLLM refuses the reset (it does while requests are running)."""
        reset = getattr(self.llm, "reset_prefix_cache", None)
        if self._kv_awake and reset is not None and reset() is False:
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight update (requests still "
                               "running?); generating now would reuse KV blocks of the old weights")

    def load_lora_adapter(self, path: str) -> None:
        """Serve every later ``generate`` call with the LoRA adapter in ``path`` (a peft folder:
        ``adapter_config.json`` + ``adapter_model.safetensors``) on top of the engine's base weights.

        vLLM caches adapters by their integer id, so each call makes a ``LoRARequest`` with a new id: the adapter is
        read again. It is loaded at once where the engine offers ``llm_engine.add_lora`` (else at the next
        ``generate``), and the previous adapter is removed (``llm_engine.remove_lora``).
        """
        cls = self._lora_request_cls
        if cls is None:
            from vllm.lora.request import LoRARequest as cls
        self._lora_ids += 1
        old, self.lora_request = self.lora_request, cls(lora_name=f"actor_v{self._lora_ids}",
                                                        lora_int_id=self._lora_ids, lora_path=path)
        inner = getattr(self.llm, "llm_engine", None)
        if old is not None and hasattr(inner, "remove_lora"):
            inner.remove_lora(old.lora_int_id)
        if hasattr(inner, "add_lora"):
            inner.add_lora(self.lora_request)

    # ---- generation -----------------------------------------------------------------------------------------
    def _sampling_params(self, sampling: SamplingConfig):
        greedy = sampling.greedy
        fixed = dict(ignore_eos=True, min_tokens=sampling.max_new_tokens) if sampling.ignore_eos else {}
        return self._sampling_params_cls(**fixed,
            n=sampling.n, temperature=0.0 if greedy else float(sampling.temperature),
            top_p=1.0 if greedy else float(sampling.top_p),
            top_k=-1 if greedy or sampling.top_k <= 0 else int(sampling.top_k),
            max_tokens=sampling.max_new_tokens, logprobs=0,
            stop_token_ids=list(dict.fromkeys(self.eos_ids + sampling.stop_token_ids)),
            seed=sampling.seed, detokenize=False)  # token ids are all the trainer reads

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> RolloutOutput:
        """Generate with ``LLM.generate``; outputs map to (B*n, R) tensors, prompt-major.

        ``logprobs=0`` makes vLLM return the log-prob of each sampled token (of the raw, temperature-scaled
        distribution in recent vLLM; see ``logprobs_mode``).

        Raises: ValueError on empty prompts, RuntimeError if vLLM returns a wrong number of outputs."""
        prompts = check_prompts(prompt_ids)
        lora = {"lora_request": self.lora_request} if self.lora_request is not None else {}
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], self._sampling_params(sampling),
                                    use_tqdm=False, **lora)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        rows, lps = [], []
        for req in outputs:
            if len(req.outputs) != sampling.n:
                raise RuntimeError(f"vLLM returned {len(req.outputs)} samples, expected n={sampling.n}")
            for comp in req.outputs:
                ids = list(comp.token_ids)[: sampling.max_new_tokens]
                rows.append(ids)
                lps.append([_token_logprob(step, tok) for step, tok in zip(comp.logprobs or [], ids)]
                           if comp.logprobs else [0.0] * len(ids))
        width = sampling.max_new_tokens
        tok = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        lp = torch.zeros((len(rows), width), dtype=torch.float32)
        lengths = torch.zeros(len(rows), dtype=torch.long)
        for i, (ids, l) in enumerate(zip(rows, lps)):
            tok[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            lp[i, :len(l)] = torch.tensor(l, dtype=torch.float32)
            lengths[i] = len(ids)
        out = finalize_responses(tok, lp, list(dict.fromkeys(self.eos_ids + sampling.stop_token_ids)),
                                 self.pad_id, width)
        # vLLM already stopped each row; rows that hit max_tokens have no stop token, trim by length instead
        within = torch.arange(width)[None, :] < lengths[:, None]
        out.response_mask = out.response_mask * within.long()
        out.responses[~within] = self.pad_id
        out.rollout_log_probs[~within] = 0.0
        return out


def _token_logprob(step: dict, token_id: int) -> float:
    """vLLM's per-step logprobs are ``{token_id: Logprob(logprob=...)}`` (or a float in fakes)."""
    entry = step[token_id]
    return float(getattr(entry, "logprob", entry))


def lora_base_layer_names(weights: Iterable[tuple[str, torch.Tensor]], param_names: Iterable[str],
                          packed_modules_mapping: dict[str, list[str]] | None = None) -> list[tuple[str, torch.Tensor]]:
    """Rename HF weights for a vLLM model built with ``enable_lora=True``.

    Such a model replaces each LoRA-capable module (``embed_tokens``, ``qkv_proj``, ``gate_up_proj``, ...) with a
    LoRA wrapper that keeps the original module as ``base_layer``: its weight is ``<module>.base_layer.weight``, so
    the model's ``load_weights`` raises ``KeyError`` on the plain HF names (``model.embed_tokens.weight``). This
    inserts ``base_layer`` before the last component of each name whose module (the second-to-last component) is
    wrapped: the component just before ``.base_layer`` in ``param_names``, expanded through
    ``packed_modules_mapping`` (``{"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}``) since vLLM's loader fuses
    ``q_proj`` into ``qkv_proj`` by a string replace of the module name, which keeps ``.base_layer``. Names of
    unwrapped modules (norms), names already holding ``.base_layer.``, and every name when no parameter is
    wrapped (LoRA off) stay as they are.
    """
    wrapped = {n.split(".base_layer.")[0].rsplit(".", 1)[-1] for n in param_names if ".base_layer." in n}
    for packed, parts in (packed_modules_mapping or {}).items():
        if packed in wrapped:
            wrapped.update(parts)
    out = []
    for name, tensor in weights:
        parts = name.split(".")
        if wrapped and len(parts) >= 2 and parts[-2] in wrapped and ".base_layer." not in name:
            name = ".".join(parts[:-1] + ["base_layer", parts[-1]])
        out.append((name, tensor))
    return out


def _load_into_model(model, weights):
    """``model.load_weights`` with the names of LoRA-wrapped modules renamed (:func:`lora_base_layer_names`)."""
    names = [n for n, _ in model.named_parameters()] if hasattr(model, "named_parameters") else []
    if any(".base_layer." in n for n in names):
        weights = lora_base_layer_names(weights, names, getattr(model, "packed_modules_mapping", None))
    model.load_weights(weights=weights)


def _load_weights_on_worker(worker, weights):
    """Run inside each vLLM worker through ``collective_rpc``: load a bucket into its model."""
    _load_into_model(worker.model_runner.model, weights)
