"""Shape buckets for CUDA graphs (``torch_compile_mode=reduce-overhead``) on CPU: ``kernels.mark_static_shapes`` makes
``trainer.forward`` pad every host-packed row with fake sequences (``patches.packing.bucket_padding``). The graphs
need CUDA; everything around them is checked here: log-probs, entropy, critic values and gradients equal the
unbucketed model's on awkward batches (empty rows, a fully empty batch, one-token rows, rows already on a bucket,
more sequences than spare pad tokens, left and right padding), also through a DeepSpeed ZeRO-2 engine; the padding's
edge counts; and the launch-time refusals of what cannot run with CUDA graphs."""
from __future__ import annotations

import copy
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import (AutoModelForCausalLM, AutoModelForTokenClassification, LlamaConfig,  # noqa: E402
                          Qwen2Config)

from patches.packing import bucket_padding, token_bucket  # noqa: E402
from patches.ulysses import apply_ulysses_patch, patch_info  # noqa: E402
from trainer.forward import forward_log_probs, forward_values  # noqa: E402
from trainer.workers import kernels  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
              head_dim=8, num_labels=1, classifier_dropout=0.0)
CONFIGS = {"llama": lambda: LlamaConfig(num_key_value_heads=4, **COMMON),
           "qwen2": lambda: Qwen2Config(num_key_value_heads=2, **COMMON)}
MULTIPLE = 4  # small buckets so that a tiny batch hits every case of bucket_padding


def _model(arch: str, value_head: bool):
    torch.manual_seed(0)
    cls = AutoModelForTokenClassification if value_head else AutoModelForCausalLM
    return apply_ulysses_patch(cls.from_config(CONFIGS[arch](), dtype=torch.float32), 1)


def _batch(spec, prompt_len, response_len, seed):
    """Rows of ``(prompt tokens, response tokens)``: prompts left-padded to ``prompt_len``, responses right-padded to
    ``response_len``; position_ids as the trainer makes them."""
    ids = torch.randint(1, 96, (len(spec), prompt_len + response_len), generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(spec):
        mask[i, prompt_len - p:prompt_len + r] = 1
    return ids, mask, (mask.cumsum(1) - 1).clamp(min=0), response_len


# name -> (rows, prompt_len, response_len); comments: real tokens / sequences -> what the layers get
BATCHES = {
    "empty_rows": ([(3, 2), (0, 0), (2, 3), (0, 0)], 4, 4),  # 10 / 2 -> 12 / 4
    "all_rows_empty": ([(0, 0), (0, 0)], 4, 4),  # 0 / 0 -> 4 / 1 (one fake sequence of MULTIPLE tokens)
    "one_token_rows": ([(1, 0), (0, 1), (1, 0), (4, 4)], 4, 4),  # 11 / 4 -> 16 / 8 (1 spare token, 4 fakes)
    "on_a_bucket": ([(4, 4), (4, 4)], 4, 4),  # 16 / 2 -> 16 / 2 (no padding)
    "on_a_bucket_3_rows": ([(4, 4)] * 3, 4, 4),  # 24 / 3 -> 28 / 4 (a whole bucket for one fake sequence)
    "more_rows_than_pad": ([(1, 1)] * 9 + [(0, 1)] * 4, 2, 2),  # 22 / 13 -> 28 / 16 (2 spare tokens, 3 fakes)
    "left_and_right_pad": ([(5, 1), (1, 5), (3, 3), (5, 5)], 5, 5),  # 28 / 4 -> 28 / 4
}


def _shape_recorder(model):
    """Records ``(tokens, cu_seqlens)`` of what the first decoder layer gets at each forward."""
    seen = []
    layer = kernels.decoder_layers(model)[0]
    layer.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(((kw.get("hidden_states", args[0] if args else None)).shape[1],
                                           kw["cu_seq_lens_q"].tolist())), with_kwargs=True)
    return seen


def _outputs_and_loss(model, value_head, ids, mask, pos, R):
    """The head's outputs ``(B, R)`` (values, or log-probs and entropy) and a weighted sum of them over the valid
    response positions. ``model``: a model or a DeepSpeed engine."""
    valid = mask[:, -R:].float()
    if value_head:
        outs = (forward_values(model, ids, mask, pos, R, device="cpu"),)
        return outs, (outs[0] * valid * torch.arange(1.0, R + 1)).sum()
    outs = forward_log_probs(model, ids, mask, pos, R, temperature=0.8, calculate_entropy=True, device="cpu")
    return outs, ((outs[0] + 0.3 * outs[1]) * valid).sum()


def _run(model, value_head, ids, mask, pos, R):
    """:func:`_outputs_and_loss`'s outputs and the parameter gradients of its loss."""
    model.zero_grad(set_to_none=True)
    outs, loss = _outputs_and_loss(model, value_head, ids, mask, pos, R)
    loss.backward()
    return [o.detach() for o in outs], {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("value_head", [False, True], ids=["log_probs", "critic_values"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_bucketed_outputs_and_grads_equal_unbucketed_on_edge_batches(arch, value_head):
    """Per batch: outputs at the valid response positions and every gradient equal the unbucketed model's (fp32,
    atol 1e-5); the layers see a multiple of the bucket's tokens in a power-of-two count of sequences, and a row
    already on a bucket is not padded."""
    base = _model(arch, value_head)
    bucketed = copy.deepcopy(base)
    kernels.mark_static_shapes(bucketed, MULTIPLE)
    seen = _shape_recorder(bucketed)
    for seed, (name, (spec, P, R)) in enumerate(BATCHES.items()):
        ids, mask, pos, R = _batch(spec, P, R, seed)
        want, want_g = _run(base, value_head, ids, mask, pos, R)
        got, got_g = _run(bucketed, value_head, ids, mask, pos, R)
        valid = mask[:, -R:].bool()
        for a, b in zip(got, want):
            torch.testing.assert_close(a[valid], b[valid], atol=1e-5, rtol=0, msg=name)
        assert got_g.keys() == want_g.keys(), name
        for n in want_g:
            torch.testing.assert_close(got_g[n], want_g[n], atol=1e-5, rtol=1e-4, msg=f"{name}: {n}")
        tokens, cu = seen[-1]
        seqs, nnz = len(cu) - 1, int(mask.sum())
        assert tokens == cu[-1] and tokens % MULTIPLE == 0 and tokens >= MULTIPLE, (name, seen[-1])
        assert seqs & (seqs - 1) == 0 and seqs >= max(1, sum(1 for p, r in spec if p + r)), (name, seen[-1])
        assert all(b > a for a, b in zip(cu, cu[1:])), (name, cu)  # every fake sequence has a token
        if name in ("on_a_bucket", "left_and_right_pad"):
            assert tokens == nnz and seqs == len(spec)
    assert [(t, len(cu) - 1) for t, cu in seen] == [(12, 4), (4, 1), (16, 8), (16, 2), (28, 4), (28, 16), (28, 4)]


@pytest.fixture(scope="module")
def dist_group():
    """One-process gloo group for DeepSpeed (reused if another test already made one)."""
    pytest.importorskip("deepspeed")
    from tests.e2e_utils import one_process_group

    return one_process_group()


@pytest.mark.parametrize("value_head", [False, True], ids=["log_probs", "critic_values"])
def test_a_deepspeed_zero2_engine_is_bucketed_and_steps_like_the_plain_model(dist_group, value_head):
    """The workers pass the DeepSpeed engine to forward_*: its ``__getattr__`` finds the module's
    patch settings (``patch_info``), so the row is padded (17 real tokens in 3 sequences -> 32 tokens with a bucket of 16, 4
    sequences); one ZeRO-2 SGD step (lr 1, no clipping) moves every parameter by the unbucketed model's gradient."""
    base = _model("qwen2", value_head)
    ids, mask, pos, R = _batch([(4, 4), (0, 0), (0, 3), (3, 3)], 4, 4, 0)
    want, want_g = _run(copy.deepcopy(base), value_head, ids, mask, pos, R)
    model = copy.deepcopy(base)
    kernels.mark_static_shapes(model, 16)
    seen = _shape_recorder(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
           "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 10 ** 9}
    engine, *_ = dist_group.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), config=cfg)
    assert patch_info(engine) == patch_info(model) and patch_info(engine).static_token_multiple == 16
    valid = mask[:, -R:].float()
    outs, loss = _outputs_and_loss(engine, value_head, ids, mask, pos, R)
    assert [(t, len(cu) - 1) for t, cu in seen] == [(32, 4)]
    for a, b in zip(outs, want):
        torch.testing.assert_close(a.detach()[valid.bool()], b[valid.bool()], atol=1e-5, rtol=0)
    engine.backward(loss)
    engine.step()
    for n, p in engine.module.named_parameters():
        torch.testing.assert_close(before[n] - p.detach(), want_g[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("nnz,num_seqs,multiple", [(0, 0, 1), (1, 1, 1), (3, 3, 1), (0, 5, 4), (10, 9, 4),
                                                   (22, 13, 4), (1000, 600, 256), (2 ** 40, 1, 256),
                                                   (2 ** 40 + 1, 2 ** 20 + 1, 256)])
def test_bucket_padding_edge_counts(nnz, num_seqs, multiple):
    """Tiny and huge counts, and more fake sequences than a bucket has tokens: a multiple of the bucket in a
    power-of-two count of sequences, each fake one >= 1 token, the padding within the docstring's bound."""
    fake = bucket_padding(nnz, num_seqs, multiple)
    total, count = nnz + sum(fake), num_seqs + len(fake)
    assert total % multiple == 0 and total >= multiple
    assert count & (count - 1) == 0 and count >= 1
    assert all(isinstance(n, int) and n >= 1 for n in fake)
    assert total in (token_bucket(nnz, multiple), token_bucket(nnz + len(fake), multiple))
    assert sum(fake) <= max(multiple, total // 8) + len(fake)  # under 1/8 of the bucket beyond one token per fake


def test_token_buckets_are_few_per_doubling_and_pad_under_an_eighth():
    """Rows of 16k-32k tokens (64 sequences of 250-500 tokens) meet 9 buckets of 256 tokens' multiples, not 65;
    every bucket holds its tokens with less than 1/8 (or less than one multiple) of padding."""
    buckets = {token_bucket(n, 256) for n in range(16384, 32769)}
    assert len(buckets) == 9 and min(buckets) == 16384 and max(buckets) == 32768
    for n in list(range(0, 5000)) + [2 ** 20 + 1, 3 * 2 ** 30 + 7]:
        t = token_bucket(n, 256)
        assert t % 256 == 0 and t >= max(n, 256) and (t - n <= 256 or (t - n) * 8 < t)
    assert [token_bucket(n, 1) for n in (0, 1, 7, 8, 9, 15, 16, 17, 33)] == [1, 1, 7, 8, 9, 15, 16, 18, 36]
    with pytest.raises(ValueError, match="token_bucket needs multiple >= 1 and nnz >= 0, got nnz=-1, multiple=4"):
        token_bucket(-1, 4)


@pytest.mark.parametrize("args", [(-1, 0, 4), (0, -1, 4), (4, 1, 0), (4, 1, -256)])
def test_bucket_padding_refuses_negative_counts_and_empty_buckets(args):
    with pytest.raises(ValueError, match=rf"multiple >= 1 and counts >= 0, got nnz={args[0]}, "
                                         rf"num_seqs={args[1]}, multiple={args[2]}"):
        bucket_padding(*args)


def test_mark_static_shapes_refuses_unpatched_models_and_empty_buckets():
    torch.manual_seed(0)
    plain = AutoModelForCausalLM.from_config(CONFIGS["llama"](), dtype=torch.float32)
    with pytest.raises(ValueError, match="needs the packed forward"):
        kernels.mark_static_shapes(plain, 256)
    with pytest.raises(ValueError, match="token_multiple must be >= 1, got 0"):
        kernels.mark_static_shapes(apply_ulysses_patch(plain, 1), 0)


RO = {"use_torch_compile": True, "torch_compile_mode": "reduce-overhead"}


@pytest.mark.parametrize("value", [False, 0, None])
def test_cuda_graph_modes_refuse_the_padded_batch_forward(value):
    """use_remove_padding=false has no packed rows to bucket: refused before any worker loads the model (it was
    accepted at launch and failed in ModelRole.build's mark_static_shapes); read as the worker reads it."""
    for mode in kernels.CUDAGRAPH_MODES:
        with pytest.raises(ValueError, match=f"torch_compile_mode={mode} needs actor_rollout_ref.model."
                                             f"use_remove_padding=true .*got {str(value).lower()}"):
            kernels.check_kernel_options({**RO, "torch_compile_mode": mode, "use_remove_padding": value}, "cuda", 2)
    kernels.check_kernel_options({**RO, "use_remove_padding": True}, "cuda", 2)
    kernels.check_kernel_options({"use_torch_compile": True, "use_remove_padding": False}, "cuda", 2)  # no graphs


def test_launch_checks_cuda_graphs_with_sp_and_the_prime_reward_model():
    from tests.test_launch_checks import _cfg
    from trainer.launch import ConfigError, validate

    graphs = ("actor_rollout_ref.model.use_torch_compile=true", "actor_rollout_ref.model.torch_compile_mode="
              "reduce-overhead", "trainer.device=cuda")
    validate(_cfg(*graphs))
    validate(_cfg(*graphs, "algorithm=prime"))
    with pytest.raises(ConfigError, match=r"model.use_remove_padding=true .*got false"):
        validate(_cfg(*graphs, "actor_rollout_ref.model.use_remove_padding=false"))
    for key in ("critic", "actor_rollout_ref.ref", "actor_rollout_ref.actor"):  # SP with CUDA graphs is accepted
        validate(_cfg(*graphs, f"{key}.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=2",
                      "critic.enable=true"))
    with pytest.raises(ConfigError, match=r"ZeRO stage 2 .*got stage 1"):
        validate(_cfg(*graphs, "+deepspeed.ds_config={zero_optimization:{stage:1}}"))
    with pytest.raises(ConfigError, match=r"deepspeed.offload_optimizer=true is not supported"):
        validate(_cfg(*graphs, "deepspeed.offload_optimizer=true"))
    # the PRM worker builds actor_rollout_ref.model with reward_model's SP size and model overrides
    validate(_cfg(*graphs, "algorithm=prime", "reward_model.ulysses_sequence_parallel_size=2"))
    with pytest.raises(ConfigError, match=r"PRIME reward model \(actor_rollout_ref.model with reward_model.model."
                                          r"enable_gradient_checkpointing=true\): .*is not supported"):
        validate(_cfg(*graphs, "algorithm=prime", "+reward_model.model.enable_gradient_checkpointing=true"))
    with pytest.raises(ConfigError, match=r"reward_model.model.use_remove_padding=false\): .*use_remove_padding=true"):
        validate(_cfg(*graphs, "algorithm=prime", "+reward_model.model.use_remove_padding=false"))
    validate(_cfg("algorithm=prime", "+reward_model.model.enable_gradient_checkpointing=true",
                  "reward_model.ulysses_sequence_parallel_size=2"))  # no CUDA graphs: nothing to refuse
