"""The PRIME PRM worker in one process (gloo, world 1, real DeepSpeed engines, tiny models from a config).

Checks: scores are beta*(log pi_prm - log pi_ref) and 0 on padding; ``update_rm`` returns the scores of its
training forward in the ORIGINAL row order even with dynamic (token-budget, reordered) micro-batches (a verl
defect); one update lowers the PRM cross-entropy on the batch; the checkpoint round-trips the PRM.
"""
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("deepspeed")

from trainer.protocol import DataProto  # noqa: E402


def _make_models(root):
    from transformers import AutoModelForCausalLM

    from trainer import embedded

    tok_dir = os.path.join(root, "tok")
    tok = embedded.build_tokenizer(tok_dir)
    paths = []
    for seed, name in ((0, "prm"), (1, "ref")):
        torch.manual_seed(seed)
        conf = embedded.tiny_model_config(len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                          num_key_value_heads=1, intermediate_size=64)
        path = os.path.join(root, name)
        AutoModelForCausalLM.from_config(conf).save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(path)
    return len(tok), paths


def _config(prm, ref, dynamic, zero_stage=2):
    """The PRM worker's config of the packaged algorithm=prime config with these models and small batches."""
    from trainer.config.packaged import packaged_config
    from trainer.config.prm import prm_worker_config

    return prm_worker_config(packaged_config([
        "algorithm=prime", f"actor_rollout_ref.model.path={prm}", "trainer.cpus_per_worker=1",
        "trainer.total_training_steps=4", f"deepspeed.zero_stage={zero_stage}", "deepspeed.bf16=false",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", f"reward_model.model.path={prm}",
        f"reward_model.model.ref_path={ref}", "reward_model.model.beta_train=0.5", "reward_model.model.optim.lr=1e-3",
        "reward_model.mini_batch_size=2", "reward_model.micro_batch_size_per_gpu=2",
        f"reward_model.use_dynamic_bsz={str(dynamic).lower()}", "reward_model.max_token_len_per_gpu=12"],
        planned_steps=1))


def _batch(vocab):
    g = torch.Generator().manual_seed(3)
    P, R = 4, 4
    prompt_len, resp_len = [4, 2, 3, 1], [4, 1, 2, 3]
    ids = torch.zeros(4, P + R, dtype=torch.long)
    attn = torch.zeros(4, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_len, resp_len)):
        ids[i, P - p:P + r] = torch.randint(5, vocab, (p + r,), generator=g)
        attn[i, P - p:P + r] = 1
    pos = torch.clamp(torch.cumsum(attn, 1) - 1, min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": attn, "position_ids": pos,
                                "responses": ids[:, P:], "response_mask": attn[:, P:].float(),
                                "acc": torch.tensor([1.0, 0.0, 0.0, 1.0])}, {"uid": ["a", "a", "b", "b"]})


def _ce(scores, acc):
    return float(torch.nn.functional.binary_cross_entropy_with_logits(scores.sum(-1), acc))


@pytest.fixture(autouse=True)
def _own_process_group():
    """The worker joins a process group and sets MASTER_PORT in this process: end both after the test, so that a
    later in-process group (e.g. tools/bench/common.py's) does not reuse a port that is still bound."""
    saved = dict(os.environ)
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()  # also drops DeepSpeed's cached groups of the ended world
    os.environ.clear()
    os.environ.update(saved)


def test_prm_worker_scores_update_order_and_checkpoint(tmp_path):
    from trainer.workers.prm import PRMWorker

    vocab, (prm, ref) = _make_models(str(tmp_path))
    w = PRMWorker(_config(prm, ref, dynamic=True), 0, 1, device="cpu", role="prm")
    info = w.init_model()
    assert info["ref_path"] == ref
    data = _batch(vocab)
    mask = data["response_mask"]
    s0 = w.compute_rm_scores(data)["rm_scores"]
    assert s0.shape == (4, 4) and torch.equal(s0[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert s0[mask > 0].abs().min() > 0  # two different random models: every valid token has a reward
    out = w.update_rm(data)
    # the training forward ran before the step and its scores come back in the original row order
    assert torch.allclose(out["rm_scores"], s0, atol=1e-5)
    m = out.meta["metrics"]
    assert len(m["reward_model/grad_norm"]) == 1 and m["reward_model/skipped_steps"] == [0.0]
    # the mini-batch's mean CE over its 4 sequences, not a mean of the (unequal) dynamic micro-batches' means
    assert m["reward_model/ce_loss"] == [pytest.approx(_ce(s0, data["acc"]), rel=1e-5)]
    s1 = w.compute_rm_scores(data)["rm_scores"]
    assert _ce(s1, data["acc"]) < _ce(s0, data["acc"])  # one step lowers the PRM cross-entropy
    ckpt = str(tmp_path / "global_step_1" / "reward")
    w.save_checkpoint(ckpt)
    w.update_rm(data)
    assert not torch.allclose(w.compute_rm_scores(data)["rm_scores"], s1)
    w.load_checkpoint(ckpt)
    assert torch.allclose(w.compute_rm_scores(data)["rm_scores"], s1, atol=1e-6)
    with pytest.raises(KeyError, match="acc"):
        w.update_rm(data.select(["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]))
