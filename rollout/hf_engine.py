"""Rollout with transformers' own ``generate`` (the default engine where vLLM is absent).

The engine owns an inference copy of the policy built from the HF config; :meth:`HFRolloutEngine.load_weights`
copies the trainer's weights into it in place, or :meth:`HFRolloutEngine.share_weights` runs it on the trainer's
own tensors (no copy, no sync). On CUDA it uses transformers' static KV cache with compilation of the decoding step
(2.8x plain ``generate`` with a dynamic cache at the same 1,024-row batch, SmolLM2-135M's shape on one H200;
docs/benchmarks.md); the compiled graph is only reused when shapes repeat, so every call is cut into FIXED shapes:

* batch buckets: the rows (prompts x n) are split into chunks of ``max_batch_size`` and the last chunk is padded
  up to the next power of two (copies of its last row, dropped afterwards);
* length buckets: prompts are left-padded to a multiple of ``prompt_len_multiple`` and the static cache length to
  a multiple of ``cache_len_multiple`` (transformers keeps the largest length seen, so it settles).

On CPU the dynamic cache is used and nothing is compiled.

``decode_loop="graph"`` replaces ``generate`` by the engine's own loop (:mod:`rollout.graph_decode`): one compiled
function (one CUDA graph) per decode step, same buckets, stop ids, padding and log-probs; the default, ``"auto"``,
runs it on CUDA with a static cache for the text-only, full-attention models it runs.

Log-probs. A logits processor (:class:`SampledTokenLogProbs`, run before transformers' temperature/top-k/top-p
warpers) sees the RAW logits of each step. The engine reports ``log_softmax(logits / T)`` at the sampled token, i.e.
the same quantity the trainer recomputes from ``model(input_ids).logits / T`` (verl/OpenRLHF do not apply
top-k/top-p there either). They are therefore NOT the log-probs of the truncated sampling distribution when
top-k/top-p are active. Greedy decoding reports ``log_softmax(logits)`` (T taken as 1). The processor holds one
step's (rows, vocab) fp32 log-probs at a time, so the rows per ``generate`` call are bounded by ``max_batch_size``
only (not by every step's logits, 100 MB per row at 512 new tokens and a 49k vocabulary).
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F

from rollout import memory
from rollout.base import (RolloutEngine, RolloutOutput, SamplingConfig, check_prompts, check_tags,  # noqa: F401
                          concat_image_inputs, finalize_responses)  # concat_image_inputs re-exported
from rollout.generation_config import generation_config, static_cache_on
from rollout.graph_decode import GraphDecoder, graph_decode_unsupported, resolve_decode_loop
from rollout.log_prob_recorder import SampledTokenLogProbs  # noqa: F401 (re-exported)
from rollout.stop_check import deferred_stop_check
from rollout.sdpa_gqa import (auto_attn_implementation, register_sdpa_gqa,  # noqa: F401 (re-exported)
                              sdpa_gqa_attention_forward)


DECODE_LOOPS = ("auto", "generate", "graph")


def _as_list(x: int | Sequence[int] | None) -> list[int]:
    if x is None:
        return []
    if isinstance(x, int):
        return [x]
    return [int(t) for t in x]


def _next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _on(device: torch.device, want: torch.device) -> bool:
    """``device`` is ``want`` (an index-less ``want`` matches any index of its type)."""
    return device.type == want.type and (want.index is None or device.index == want.index)


class HFRolloutEngine(RolloutEngine):
    """Generation engine on ``transformers.GenerationMixin.generate``.

    Args:
        model_config: a ``transformers.PretrainedConfig`` of a causal LM (the actor's config).
        eos_token_id: EOS id or ids (stop tokens of every call); defaults to ``model_config.eos_token_id``.
        pad_token_id: filler id of left-padded prompts and right-padded responses (None: the first EOS id).
        device: where the inference copy lives when awake (default: ``cuda`` when available, else ``cpu``).
        dtype: inference dtype (default bf16 on CUDA, fp32 on CPU).
        use_static_cache: static cache + compiled decoding (default: True on CUDA, False on CPU).
        compile_mode: ``torch.compile`` mode of the decoding step (transformers' default "reduce-overhead").
        compile_regions: the graph loop compiles one decoder layer for all (:mod:`rollout.compile_regions`); the
            engine then keeps its own weights (a region refuses parameters that are views of one buffer).
        max_batch_size: rows per ``generate`` call (a batch bucket; chunks are padded to powers of two).
        prompt_len_multiple: prompts are left-padded to a multiple of this (length bucket).
        cache_len_multiple: static cache length is rounded up to a multiple of this.
        attn_implementation: attention backend of the inference copy: ``"auto"`` (default: ``"sdpa_gqa"`` on
            CUDA, ``"sdpa"`` elsewhere, ``"eager"`` for a model without SDPA support; see
            :func:`auto_attn_implementation`), ``"sdpa"`` (transformers' own), or ``"sdpa_gqa"``
            (:func:`sdpa_gqa_attention_forward`: grouped-query attention inside SDPA even with a padding mask,
            instead of copying the K/V cache once per query head group; 3.0x ``"sdpa"``'s tokens/s for SmolLM2-135M
            on an H200, docs/benchmarks.md); any other name transformers knows is passed through.
        defer_stop_check: on CUDA, ``generate`` reads its all-rows-finished flag one step late instead of waiting
            for the device after every token (:func:`rollout.stop_check.deferred_stop_check`; same tokens).
        decode_loop: ``"generate"`` (transformers' ``generate``), ``"graph"`` (:mod:`rollout.graph_decode`, one
            CUDA graph per decode step) or ``"auto"`` (:func:`rollout.graph_decode.resolve_decode_loop`).

    Raises:
        ValueError: when neither ``eos_token_id`` nor ``model_config.eos_token_id`` gives an EOS id; an unknown
            ``decode_loop``; ``decode_loop="graph"`` for a model it does not run (the message says why).
    """

    def __init__(self, model_config, eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                 use_static_cache: bool | None = None, compile_mode: str = "reduce-overhead",
                 max_batch_size: int = 256, prompt_len_multiple: int = 64, cache_len_multiple: int = 256,
                 attn_implementation: str = "auto", defer_stop_check: bool = True,
                 decode_loop: str = "auto", compile_regions: bool = False) -> None:
        from transformers import AutoModelForCausalLM

        self.device = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        on_cuda = self.device.type == "cuda"
        self.dtype = dtype or (torch.bfloat16 if on_cuda else torch.float32)
        self.use_static_cache = static_cache_on(use_static_cache, on_cuda)
        self.compile_mode, self.compile_regions = compile_mode, bool(compile_regions)
        self.can_share_weights = not self.compile_regions  # a region refuses parameters that are views of one buffer
        if max_batch_size < 1 or prompt_len_multiple < 1 or cache_len_multiple < 1:
            raise ValueError(f"bucket sizes must be >= 1, got max_batch_size={max_batch_size}, "
                             f"prompt_len_multiple={prompt_len_multiple}, cache_len_multiple={cache_len_multiple}")
        self.max_batch_size, self.prompt_len_multiple = int(max_batch_size), int(prompt_len_multiple)
        self.cache_len_multiple = int(cache_len_multiple)

        self.eos_ids = _as_list(eos_token_id if eos_token_id is not None else getattr(model_config, "eos_token_id", None))
        if not self.eos_ids:
            raise ValueError("no EOS token id: pass eos_token_id or set model_config.eos_token_id")
        self.pad_id = int(pad_token_id) if pad_token_id is not None else self.eos_ids[0]
        if decode_loop not in DECODE_LOOPS:
            raise ValueError(f"decode_loop={decode_loop!r}; expected one of {list(DECODE_LOOPS)}")
        if decode_loop == "graph" and (why := graph_decode_unsupported(model_config)):
            raise ValueError(f"decode_loop='graph' does not run {why}; use decode_loop='generate'")
        self.decode_loop = resolve_decode_loop(decode_loop, model_config, on_cuda, self.use_static_cache)
        self._graph: GraphDecoder | None = None

        if attn_implementation == "auto":
            attn_implementation = auto_attn_implementation(model_config, on_cuda)
        self.attn_implementation = attn_implementation
        if attn_implementation == "sdpa_gqa":
            register_sdpa_gqa()
        model_config = copy.deepcopy(model_config)  # from_config sets _attn_implementation on the config it gets
        from transformers import AutoModelForImageTextToText

        vision = getattr(model_config, "vision_config", None) is not None  # a vision-language model
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        with torch.device(self.device):  # initialised where it lives: the trainer's weights replace these at once
            self.model = auto.from_config(model_config, dtype=self.dtype, attn_implementation=attn_implementation)
        self.model.eval().requires_grad_(False).to(self.device)
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self._awake = True
        self._shared = False  # the parameters are the trainer's tensors (share_weights)
        self._discarded = None  # memory.DiscardedWeights while a level-2 sleep's weights are not all loaded again
        self.defer_stop_check = bool(defer_stop_check)

    @classmethod
    def from_tokenizer(cls, model_config, tokenizer, model_path: str | None = None,
                       stop_token_ids: Sequence[int] | None = None, **kwargs) -> "HFRolloutEngine":
        """Build with the stop ids of :func:`rollout.stop_tokens.resolve_stop_token_ids` (the tokenizer's EOS, the
        model config's and ``generation_config.json``'s ``eos_token_id``, the chat template's end-of-turn token,
        ``stop_token_ids``) and the tokenizer's pad id (falling back to the first stop id)."""
        from rollout.stop_tokens import resolve_stop_token_ids

        stops = resolve_stop_token_ids(tokenizer, model_config, model_path, extra=stop_token_ids)
        return cls(model_config, eos_token_id=stops, pad_token_id=tokenizer.pad_token_id, **kwargs)

    # ---- weights / memory ------------------------------------------------------------------------------------
    uses_torch_allocator = True  # weights and KV cache come from PyTorch's caching allocator (rollout_mode keeps it)
    can_share_weights = True  # False with compile_regions

    def _target(self, targets: dict, name: str, tensor: torch.Tensor, what: str) -> torch.Tensor:
        """Parameter ``name`` of ``targets`` (``state_dict(keep_vars=True)``), checked against ``tensor``'s shape."""
        target = targets.get(name)
        if target is None:
            raise KeyError(f"{what}: unknown parameter {name!r}; expected HF state_dict names such as "
                           f"{list(targets)[:3]}")
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"{what}: {name!r} has shape {tuple(tensor.shape)}, engine expects {tuple(target.shape)}")
        return target

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy ``(name, tensor)`` pairs into the inference copy, in place (keeps compiled graphs' buffers). An engine
        running on shared weights (:meth:`share_weights`) first gets storage of its own again, so a copy never
        writes into the trainer's tensors.

        Names are those of the HF ``state_dict``. With tied embeddings, ``lm_head.weight`` and
        ``model.embed_tokens.weight`` are one tensor, so either name updates both.

        Raises:
            KeyError: unknown name (the message lists a few expected ones).
            ValueError: shape mismatch (both shapes named).
            RuntimeError: asleep after a level-2 sleep, which discarded the weights (wake up first).
        """
        if self._shared:  # storage of its own again (filled by the copies below)
            for p in self.model.parameters():
                p.data = torch.empty_like(p.data)
            self._shared = False
        self._check_not_discarded_asleep("load_weights")
        targets, gone = self.model.state_dict(keep_vars=True), self._discarded
        for name, tensor in named_tensors:
            target = self._target(targets, name, tensor, "load_weights")
            target.data.copy_(tensor.detach().to(device=target.device, dtype=target.dtype), non_blocking=True)
            if gone is not None:
                gone.loaded(target)
        if gone is not None and not gone.missing:
            self._discarded = None

    @torch.no_grad()
    def share_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Run on the trainer's own tensors: each parameter of the inference copy is pointed at the tensor given for
        its name (``param.data = tensor``, no copy), so the engine needs no weights of its own and no sync; the
        trainer must keep those tensors alive and in place (ZeRO-0/1/2 parameters; not ZeRO-3's gathered ones).

        Every parameter must be given (tied weights once), with the engine's shape, dtype and device; buffers move to
        the device. While shared, :meth:`sleep` and :meth:`wake_up` move nothing (the memory is the trainer's).

        Raises:
            KeyError: unknown name. ValueError: a shape, dtype or device that differs, or parameters not given
            (nothing is changed then). RuntimeError: asleep after a level-2 sleep (wake up first).
        """
        self._check_not_discarded_asleep("share_weights")
        targets = self.model.state_dict(keep_vars=True)
        pairs = [(self._target(targets, n, t, "share_weights"), t.detach()) for n, t in named_tensors]
        bad = [tuple(t.shape) for p, t in pairs if t.dtype != p.dtype or not _on(t.device, self.device)]
        if bad:
            raise ValueError(f"share_weights: {len(bad)} tensors are not {self.dtype} on {self.device} (first of shape "
                             f"{bad[0]}); use load_weights to copy them")
        given = {id(p) for p, _ in pairs}
        left = [n for n, p in self.model.named_parameters() if id(p) not in given]
        if left:
            raise ValueError(f"share_weights: {len(left)} parameters not given, e.g. {left[:3]}")
        for p, t in pairs:
            p.data = t
        self._discarded = None
        for module in self.model.modules():  # buffers (rotary frequencies) stay on the device while shared
            for key, buf in module._buffers.items():
                if buf is not None and not _on(buf.device, self.device):
                    module._buffers[key] = buf.to(self.device)
        self._shared = True

    def _check_not_discarded_asleep(self, what: str) -> None:
        if self._discarded is not None and not self._awake:
            raise RuntimeError(f"HFRolloutEngine.{what} while a level-2 sleep has discarded the weights; call "
                               "wake_up(['weights']) first")

    def sleep(self, level: int = 1) -> None:
        """Level 1 moves the inference copy to CPU (kept); level 2 discards it (no copy either way: the weights must
        be loaded again after the next wake-up, as every sync does, and :meth:`generate` refuses to run before; a
        sleep of either level before they all are discards them again). An engine on shared weights
        (:meth:`share_weights`) has none of its own and moves nothing. The graph decode loop's kept KV caches and
        buffers are dropped (allocated again by the next call).

        No ``empty_cache`` here: :func:`rollout.context.rollout_mode` decides about the cache.

        Raises:
            ValueError: level not 1 or 2.
        """
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        gone = self._discarded
        if not self._shared and (level == 2 or gone is not None) and (gone is None or self._awake):
            self._discarded = memory.DiscardedWeights(self.model)  # what a partial load wrote is not kept either
        elif not self._shared and self._discarded is None and self.device.type != "cpu":
            self.model.to("cpu")
        if self._graph is not None:
            self._graph.release()
        self._awake = False

    def wake_up(self, tags: list[str] | None = None) -> None:
        """``"weights"`` moves the inference copy back to its device (nothing to move on shared weights; after a
        level-2 sleep, uninitialised storage that :meth:`load_weights` fills);
        ``"kv_cache"`` is a no-op (transformers allocates the KV cache inside each ``generate`` call, the graph
        decode loop at its first call of each shape).

        Raises:
            ValueError: unknown tag.
        """
        tags = check_tags(tags)
        if "weights" in tags and self._discarded is not None and not self._awake:
            self._discarded.reallocate(self.model, self.device)
            self.model.to(self.device)  # the buffers, where a level-1 sleep moved them
        elif "weights" in tags and self.device.type != "cpu" and not self._shared:
            self.model.to(self.device)
        if "weights" in tags:
            self._awake = True

    # ---- generation ----------------------------------------------------------------------------------------
    def _rows_per_call(self) -> int:
        rows = self.max_batch_size
        return 1 << int(math.floor(math.log2(rows))) if self.use_static_cache else rows

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig,
                 multi_modal_inputs: list[dict] | None = None) -> RolloutOutput:
        """Sample ``n`` responses per prompt with ``model.generate`` or the graph decode loop (``decode_loop``).

        Args:
            prompt_ids: B prompts, lists of token ids without padding.
            sampling: :class:`SamplingConfig`.
            multi_modal_inputs: a vision-language model's per-prompt processor tensors (``pixel_values``,
                ``image_grid_thw``; ``{}`` for a prompt without images), passed to ``generate`` with the rows.

        Returns:
            :class:`RolloutOutput` of (B*n, R) tensors on CPU, prompt-major, R = ``sampling.max_new_tokens``.

        Raises:
            RuntimeError: when the engine is asleep; ValueError: empty prompts.
        """
        if not self._awake:
            raise RuntimeError("HFRolloutEngine.generate called while asleep; call wake_up() first")
        if self._discarded is not None:
            raise RuntimeError(f"HFRolloutEngine.generate: {self._discarded.missing} parameters not loaded since a "
                               "level-2 sleep discarded the weights; load_weights them all first")
        prompts = check_prompts(prompt_ids)
        rows = [p for p in prompts for _ in range(sampling.n)]  # prompt-major: n copies of prompt i contiguous
        mm_rows = [m for m in multi_modal_inputs for _ in range(sampling.n)] if multi_modal_inputs else None
        stop_ids = list(dict.fromkeys(self.eos_ids + sampling.stop_token_ids))
        width = max(len(p) for p in prompts)
        if self.use_static_cache:
            width = -(-width // self.prompt_len_multiple) * self.prompt_len_multiple
        cache_len = -(-(width + sampling.max_new_tokens) // self.cache_len_multiple) * self.cache_len_multiple
        gen_cfg = None if self.decode_loop != "generate" else generation_config(
            self.model.config, sampling, stop_ids, cache_len, self.pad_id, self.use_static_cache, self.compile_mode)
        chunk = self._rows_per_call()

        devices = [self.device] if self.device.type == "cuda" else []
        outs = []
        with torch.random.fork_rng(devices=devices, enabled=sampling.seed is not None):
            if sampling.seed is not None:
                torch.manual_seed(int(sampling.seed))
            for start in range(0, len(rows), chunk):
                part = rows[start:start + chunk]
                mm = mm_rows[start:start + chunk] if mm_rows else None
                outs.append(self._generate_chunk(part, width, cache_len, gen_cfg, sampling, stop_ids, mm))
        return RolloutOutput(*(torch.cat([getattr(o, k) for o in outs]) for k in
                               ("responses", "response_mask", "rollout_log_probs")))

    def _generate_chunk(self, rows: list[list[int]], width: int, cache_len: int, gen_cfg, sampling: SamplingConfig,
                        stop_ids: list[int], mm: list[dict] | None = None) -> RolloutOutput:
        """One call's rows, batch-bucketed and left-padded to ``width``, through ``generate`` (``gen_cfg``) or the
        graph decode loop (``gen_cfg`` None)."""
        real = len(rows)
        if self.use_static_cache:  # batch bucket: pad with copies of the last row
            extra = min(_next_pow2(real), self._rows_per_call()) - real
            rows, mm = rows + [rows[-1]] * extra, (mm + [mm[-1]] * extra if mm else mm)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, p in enumerate(rows):  # left padding
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        if gen_cfg is None:
            if concat_image_inputs(mm or []):
                raise ValueError("decode_loop='graph' takes text prompts only; image inputs need "
                                 "decode_loop='generate'")
            tokens, log_probs, _ = self.graph_decoder.decode(
                ids.to(self.device), mask.to(self.device), cache_len, sampling.max_new_tokens, stop_ids, self.pad_id,
                sampling.temperature, sampling.greedy, sampling.top_k, sampling.top_p, sampling.ignore_eos)
        else:
            tokens, log_probs = self._generate_call(ids, mask, gen_cfg, sampling, mm)
        return finalize_responses(tokens[:real], log_probs[:real], stop_ids, self.pad_id, sampling.max_new_tokens)

    def _generate_call(self, ids: torch.Tensor, mask: torch.Tensor, gen_cfg, sampling: SamplingConfig,
                       mm: list[dict] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``model.generate`` on (rows, W) left-padded ``ids`` / ``mask``: the (rows, L) new tokens and their
        log-probs (:class:`SampledTokenLogProbs`), L <= R."""
        from transformers import LogitsProcessorList

        temp = 1.0 if sampling.greedy else float(sampling.temperature)
        recorder = SampledTokenLogProbs(temp, ids.shape[0], sampling.max_new_tokens, self.device)
        defer = deferred_stop_check() if self.defer_stop_check else contextlib.nullcontext()
        with defer:  # the sequences alone (return_dict_in_generate=False): no cache handed back, nothing to crop
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      generation_config=gen_cfg, logits_processor=LogitsProcessorList([recorder]),
                                      **self._image_kwargs(ids, mm))
        tokens = out[:, ids.shape[1]:]
        return tokens, recorder.finish(tokens)

    @property
    def graph_decoder(self) -> GraphDecoder:
        """The graph decode loop (built at its first use): its step compiled with ``compile_mode`` (one graph, static
        shapes; its layers one region with ``compile_regions``) when ``use_static_cache`` is on, else run eagerly."""
        if self._graph is None:
            kw = dict(mode=self.compile_mode, fullgraph=True, dynamic=False) if self.use_static_cache else None
            self._graph = GraphDecoder(self.model, compile_kwargs=kw, layer_regions=self.compile_regions)
        return self._graph

    def _image_kwargs(self, ids: torch.Tensor, mm: list[dict] | None) -> dict:
        """``generate`` keywords of a vision-language chunk: the rows' image tensors concatenated in row order and
        ``mm_token_type_ids`` (1 at image tokens); ``{}`` without images."""
        kw = {k: v.to(self.device) for k, v in concat_image_inputs(mm or []).items()}
        image_id = getattr(self.model.config, "image_token_id", None)
        if kw and image_id is not None:
            kw["mm_token_type_ids"] = (ids == image_id).long().to(self.device)
        return kw
