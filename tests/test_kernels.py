"""Optional fused kernels (trainer/workers/kernels.py): option checks, Liger's call protocol (with a fake
liger_kernel module; the real one needs CUDA/Triton) and torch.compile equivalence on CPU."""
from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from patches.ulysses import apply_ulysses_patch
from trainer.forward import forward_log_probs, use_compiled_log_probs
from trainer.workers import kernels
from trainer.workers.kernels import LIGER_KWARGS, apply_kernel_options, check_kernel_options, decoder_layers

from tests.logprob_utils import assert_same, compiled_pair, lp_ent_grads


def _tiny():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def test_check_kernel_options_refuses_what_cannot_run(monkeypatch):
    check_kernel_options({}, "cpu", 3)  # both off: anything goes
    with pytest.raises(ValueError, match=r"use_liger=true needs trainer.device=cuda.*'cpu'"):
        check_kernel_options({"use_liger": True}, "cpu", 2)
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="liger-kernel is not installed"):
        check_kernel_options({"use_liger": True}, "cuda", 2)
    monkeypatch.setattr(kernels.importlib.util, "find_spec", lambda name: object())
    with pytest.raises(ValueError, match="use_liger=true and .*use_torch_compile=true together fail"):
        check_kernel_options({"use_liger": True, "use_torch_compile": True}, "cuda", 2)
    check_kernel_options({"use_liger": True}, "cuda", 2)
    with pytest.raises(ValueError, match="use_torch_compile=true does not work with deepspeed.zero_stage=3"):
        check_kernel_options({"use_torch_compile": True}, "cuda", 3)
    with pytest.raises(ValueError, match=r"use_torch_compile='yes'; expected true or false"):
        check_kernel_options({"use_torch_compile": "yes"}, "cpu", 2)
    check_kernel_options({"use_torch_compile": True}, "cpu", 2)


def test_launch_validate_refuses_liger_on_cpu_and_kernels_on_megatron():
    from tests.test_launch_checks import _cfg
    from trainer.launch import ConfigError, check_megatron, validate

    with pytest.raises(ConfigError, match="use_liger=true needs trainer.device=cuda"):
        validate(_cfg("actor_rollout_ref.model.use_liger=true"))
    validate(_cfg("actor_rollout_ref.model.use_torch_compile=true"))
    with pytest.raises(ConfigError, match="does not work with deepspeed.zero_stage=3"):  # stage 3 via ds_config
        validate(_cfg("actor_rollout_ref.model.use_torch_compile=true",
                      "+deepspeed.ds_config={zero_optimization:{stage:3}}"))
    pytest.importorskip("megatron.core")
    with pytest.raises(ConfigError, match="model.use_torch_compile=true applies to Hugging Face models"):
        check_megatron(_cfg("actor_rollout_ref.model.use_torch_compile=true"), 2)


def test_liger_protocol_with_fake_module(monkeypatch):
    calls = []

    def apply_to_llama(model=None, rope=False, rms_norm=False, swiglu=False, cross_entropy=True,
                       fused_linear_cross_entropy=True):
        calls.append(dict(model=model, rope=rope, rms_norm=rms_norm, swiglu=swiglu, cross_entropy=cross_entropy,
                          fused_linear_cross_entropy=fused_linear_cross_entropy))

    mp = types.ModuleType("liger_kernel.transformers.monkey_patch")
    mp.MODEL_TYPE_TO_APPLY_LIGER_FN = {"llama": apply_to_llama}
    for name, mod in (("liger_kernel", types.ModuleType("liger_kernel")),
                      ("liger_kernel.transformers", types.ModuleType("liger_kernel.transformers")),
                      ("liger_kernel.transformers.monkey_patch", mp)):
        monkeypatch.setitem(sys.modules, name, mod)
    model = _tiny()
    assert apply_kernel_options(model, {"use_liger": True}) == ["liger(llama)"]
    assert calls == [dict(model=model, **LIGER_KWARGS)]
    assert calls[0]["cross_entropy"] is False and calls[0]["fused_linear_cross_entropy"] is False
    model.config.model_type = "gpt2"
    with pytest.raises(ValueError, match=r"no kernels for model_type 'gpt2'; supported: \['llama'\]"):
        apply_kernel_options(model, {"use_liger": True})


def test_torch_compile_layers_match_eager_logprobs_and_grads():
    """Compiled decoder layers (Ulysses attention left eager) + compiled log-prob math give the eager values and
    parameter gradients (fp32, atol 1e-5) on packed batches of two different lengths (dynamic shapes)."""
    base = _tiny()
    apply_ulysses_patch(base)
    eager, compiled = copy.deepcopy(base), copy.deepcopy(base)
    assert len(decoder_layers(compiled)) == 2
    try:
        applied = apply_kernel_options(compiled, {"use_torch_compile": True})
        assert applied[0].startswith("torch.compile(2 layers")
        for L in (12, 17):
            g = torch.Generator().manual_seed(L)
            ids = torch.randint(1, 96, (3, L), generator=g)
            mask = torch.ones_like(ids)
            mask[0, :3] = 0
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            out = []
            for m in (eager, compiled):
                use_compiled_log_probs(m is compiled)
                out.append(lp_ent_grads(m, ids, mask, pos, 5, 0.8))
            assert_same(out[1], out[0], grad_rtol=1e-5)
    finally:
        use_compiled_log_probs(False)


def test_torch_compile_traces_whole_layers_on_host_packed_forward():
    """A host-packed forward (``device=`` given, inputs on the CPU) on a model patched for a fixed SP size of 1
    hands the boundaries to the attention as keyword arguments, so each compiled decoder layer is one graph: no
    graph break at the attention (which the general path has), and values and gradients equal eager (fp32)."""
    with compiled_pair(apply_ulysses_patch(_tiny(), 1)) as (eager, compiled, counters):
        for L in (12, 17, 23):  # only the layers compiled here: the log-prob math is covered by the test above
            g = torch.Generator().manual_seed(L)
            ids = torch.randint(1, 96, (3, L), generator=g)
            mask = torch.ones_like(ids)
            mask[0, :3] = 0
            mask[2, :L // 2] = 0
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            assert_same(*(lp_ent_grads(m, ids, mask, pos, 5, 0.8, device="cpu") for m in (compiled, eager)),
                        grad_rtol=1e-5)
        assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] >= 1


def test_general_attention_path_still_breaks_the_graph_and_matches():
    """Without the boundary keyword arguments (device tensors, or a model patched with a run-time SP size) the
    attention runs eagerly inside the compiled layer (one graph break per layer call) and gives the same values."""
    # SP size taken from the active group at each forward
    with compiled_pair(apply_ulysses_patch(_tiny())) as (eager, compiled, counters):
        ids = torch.randint(1, 96, (2, 9), generator=torch.Generator().manual_seed(0))
        mask = torch.ones_like(ids)
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        lp = [forward_log_probs(m, ids, mask, pos, 4, device="cpu")[0] for m in (eager, compiled)]
        torch.testing.assert_close(lp[1], lp[0], atol=1e-5, rtol=0)
        assert sum(counters["graph_break"].values()) >= 1


def test_boundary_kwargs_path_matches_padded_reference(monkeypatch):
    """The traceable attention path (host-packed, fixed SP size 1, boundaries as keyword arguments) gives the
    log-probs and gradients of the unpatched model's padded SDPA forward (fp32, atol 1e-5), and is the path taken
    (the general path is made to fail)."""
    import patches.ulysses as ulysses_mod

    base = _tiny()
    patched = apply_ulysses_patch(copy.deepcopy(base), 1)

    def fail(*a, **k):
        raise AssertionError("general attention path used")

    monkeypatch.setattr(ulysses_mod, "_attention_eager", fail)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 96, (3, 14), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[1, :1] = 0
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    want = lp_ent_grads(base, ids, mask, pos, 6, 0.9, use_remove_padding=False)
    got = lp_ent_grads(patched, ids, mask, pos, 6, 0.9, device="cpu")
    assert_same(got, want, valid=mask[:, -6:].bool(), grad_rtol=1e-4)


def test_boundary_kwargs_only_for_models_taking_var_kwargs():
    """A model whose forward has no ``**kwargs`` (e.g. remote code) is not given the boundary arguments."""
    from patches.ulysses import bucket_max_seqlen, forward_takes_var_kwargs

    class NoKwargs(torch.nn.Module):
        def forward(self, input_ids, position_ids=None, attention_mask=None, use_cache=False):
            return input_ids

    assert forward_takes_var_kwargs(_tiny()) and not forward_takes_var_kwargs(NoKwargs())
    wrapped = types.SimpleNamespace(module=NoKwargs())  # a DeepSpeed engine's inner module is what counts
    assert not forward_takes_var_kwargs(wrapped)
    assert [bucket_max_seqlen(n) for n in (0, 1, 16, 17, 1000, 1024, 1025)] == [16, 16, 16, 32, 1024, 1024, 2048]
    # a sliding window caps the bound when every sequence fits in it (Phi-3-mini's 2047), not otherwise
    assert [bucket_max_seqlen(n, cap=2047) for n in (1025, 2047, 2048, 100)] == [2047, 2047, 2048, 128]
    assert bucket_max_seqlen(1025, cap=None) == 2048


def test_check_kernel_options_compile_mode():
    check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"}, "cuda", 2)
    check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "max-autotune-no-cudagraphs"}, "cpu", 2)
    check_kernel_options({"use_torch_compile": False, "torch_compile_mode": "default"}, "cpu", 2)
    with pytest.raises(ValueError, match=r"torch_compile_mode='fast'; expected one of default, reduce-overhead"):
        check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "fast"}, "cuda", 2)
    with pytest.raises(ValueError, match="torch_compile_mode=reduce-overhead needs .*use_torch_compile=true"):
        check_kernel_options({"torch_compile_mode": "reduce-overhead"}, "cuda", 2)
    with pytest.raises(ValueError, match="records CUDA graphs and needs trainer.device=cuda, got 'cpu'"):
        check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"}, "cpu", 2)
    for stage in (0, 1):
        with pytest.raises(ValueError, match=f"max-autotune needs ZeRO stage 2 .*got stage {stage}"):
            check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "max-autotune"}, "cuda", stage)
    with pytest.raises(ValueError, match="contiguous_gradients=false fails"):
        check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"}, "cuda", 2,
                             ds_config={"zero_optimization": {"contiguous_gradients": False}})
    check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"}, "cuda", 2,
                         ds_config={"zero_optimization": {"overlap_comm": True}})
    with pytest.raises(ValueError, match="enable_gradient_checkpointing=true is not supported"):
        check_kernel_options({"use_torch_compile": True, "torch_compile_mode": "reduce-overhead",
                              "enable_gradient_checkpointing": True}, "cuda", 2)


def test_keep_graph_grads_copies_each_fresh_gradient_once_and_keeps_the_sums():
    """The hook adopts a copy of a fresh gradient (what a CUDA graph's output would be) and then accumulates into
    that copy in place; the gradients equal an unhooked model's over micro-batches and after zero_grad."""
    from trainer.workers.kernels import keep_graph_grads

    plain, hooked = _tiny(), _tiny()
    assert keep_graph_grads(hooked) == sum(1 for _ in hooked.parameters())
    w = hooked.model.norm.weight
    produced = []
    w.register_hook(lambda g: produced.append(g.data_ptr()))  # the gradient handed to AccumulateGrad (no ref kept)
    ids = torch.randint(1, 96, (2, 7), generator=torch.Generator().manual_seed(0))
    for rounds in range(2):
        for m in (plain, hooked):
            m.zero_grad(set_to_none=True)
        first = None
        for k in range(3):
            for m in (plain, hooked):
                m(input_ids=ids + k).logits.float().pow(2).mean().backward()
            first = w.grad if first is None else first
            assert w.grad.data_ptr() != produced[-1]  # never the produced (e.g. graph-owned) tensor
            assert w.grad is first  # one copy per fresh gradient, then in-place accumulation
        for (n, a), b in zip(plain.named_parameters(), hooked.parameters()):
            torch.testing.assert_close(b.grad, a.grad, msg=n)


def test_launch_validate_checks_the_compile_mode_and_accepts_cuda_graphs_with_sp():
    from tests.test_launch_checks import _cfg
    from trainer.launch import ConfigError, validate

    with pytest.raises(ConfigError, match="records CUDA graphs and needs trainer.device=cuda"):
        validate(_cfg("actor_rollout_ref.model.use_torch_compile=true",
                      "actor_rollout_ref.model.torch_compile_mode=reduce-overhead"))
    with pytest.raises(ConfigError, match="torch_compile_mode='fast'"):
        validate(_cfg("actor_rollout_ref.model.use_torch_compile=true",
                      "actor_rollout_ref.model.torch_compile_mode=fast"))
    # SP with CUDA graphs: the all-to-alls are recorded in the graphs (tests/test_ulysses_graphs_gpu.py)
    validate(_cfg("actor_rollout_ref.model.use_torch_compile=true", "trainer.device=cuda",
                  "actor_rollout_ref.model.torch_compile_mode=reduce-overhead",
                  "critic.ulysses_sequence_parallel_size=2", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                  "trainer.n_gpus_per_node=2", "critic.enable=true"))


@pytest.mark.parametrize("nnz,num_seqs,multiple", [(4096, 4, 256), (4000, 4, 256), (4000, 3, 256), (0, 0, 256),
                                                   (100, 1, 256), (256, 3, 256), (300, 255, 256), (513, 6, 512),
                                                   (7, 7, 1)])
def test_bucket_padding_gives_a_token_multiple_and_a_power_of_two_count(nnz, num_seqs, multiple):
    from patches.packing import bucket_padding, token_bucket

    fake = bucket_padding(nnz, num_seqs, multiple)
    total, count = nnz + sum(fake), num_seqs + len(fake)
    assert total % multiple == 0 and total >= multiple
    assert count > 0 and count & (count - 1) == 0
    assert all(n >= 1 for n in fake)
    # the smallest bucket that holds the real tokens and one token per fake sequence
    assert total in (token_bucket(nnz, multiple), token_bucket(nnz + len(fake), multiple))
    if nnz % multiple == 0 and nnz and num_seqs & (num_seqs - 1) == 0:
        assert fake == []
    with pytest.raises(ValueError, match="multiple >= 1"):
        bucket_padding(nnz, num_seqs, 0)


def test_static_shape_buckets_keep_logprobs_and_grads_and_fix_the_shapes():
    """A model marked for CUDA graphs (kernels.mark_static_shapes) pads each host-packed row to a bucket with fake
    sequences: the log-probs, entropy and gradients are those of the unpadded forward (fp32, atol 1e-5), the model
    sees a multiple of the bucket's tokens and a power-of-two count of sequences, and rows of different lengths
    in one bucket give the model identical shapes."""
    base = apply_ulysses_patch(_tiny(), 1)
    bucketed = copy.deepcopy(base)
    kernels.mark_static_shapes(bucketed, 16)
    seen = []
    bucketed.model.embed_tokens.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))

    def record_cu(*a, **k):
        seen.append(("cu", tuple(k["cu_seq_lens_q"].shape)))
        return bucketed.model.__class__.forward(bucketed.model, *a, **k)

    bucketed.model.forward = record_cu
    for L, gaps in ((12, (3, 0, 6)), (13, (0, 0, 2)), (9, (1, 4, 0))):
        g = torch.Generator().manual_seed(L)
        ids = torch.randint(1, 96, (3, L), generator=g)
        mask = torch.ones_like(ids)
        for r, k in enumerate(gaps):
            mask[r, :k] = 0
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        want = lp_ent_grads(base, ids, mask, pos, 5, 0.8, device="cpu")
        got = lp_ent_grads(bucketed, ids, mask, pos, 5, 0.8, device="cpu")
        assert_same(got, want, valid=mask[:, -5:].bool(), grad_rtol=1e-5)
    # 27, 37 and 20 real tokens in 3 rows -> 32, 48, 32 tokens; 3 sequences + fakes -> 4 (cu_seqlens of 5)
    assert seen == [("cu", (5,)), (1, 32), ("cu", (5,)), (1, 48), ("cu", (5,)), (1, 32)], seen


def test_cuda_graphs_refuse_an_sp_model_without_the_traced_all_to_alls():
    """CUDA graphs with SP need the boundary keyword arguments (traced all-to-alls); a model patched with an int SP
    size (group taken at run time) has them off and is refused before anything is compiled."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from patches.ulysses import apply_ulysses_patch, patch_info

    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    model = apply_ulysses_patch(AutoModelForCausalLM.from_config(cfg), 2)
    with pytest.raises(ValueError, match="needs a model patched with a bound SP group .*SP size 2"):
        apply_kernel_options(model, {"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"})
    assert not patch_info(model).compiled
