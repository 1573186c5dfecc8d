"""MegatronActorRefWorker on CPU (gloo, 1 process, tp = pp = 1), against HF and the DeepSpeed actor worker.

Both workers are built in this process from the composed Hydra config (embedded tiny Llama, fp32) and share one
gloo process group of world size 1. Checked: log-probs equal the HF model's (atol 1e-5), one update_actor gives
the DeepSpeed actor's losses and gradient norm, the rollout engine receives the Megatron weights converted to HF,
a save/load round trip resumes bit-exact, and the HF export loads with ``from_pretrained``.
"""
import os

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.e2e_utils import ROOT  # noqa: E402
from trainer.protocol import DataProto  # noqa: E402

P, R = 6, 5


def _config(out_dir, strategy, world=1, extra=()):
    """The actor worker's config (:class:`trainer.config.workers.ActorWorkerConfig`) of :func:`_run_config`."""
    from trainer.config.workers import actor_worker_config

    return actor_worker_config(_run_config(out_dir, strategy, world, extra))


def _run_config(out_dir, strategy, world=1, extra=()):
    from hydra import compose, initialize_config_dir

    from trainer.embedded_assets import prepare_embedded
    from trainer.launch import resolve_config, validate

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        c = compose("ppo_trainer", overrides=[
            f"trainer.strategy={strategy}", f"trainer.n_gpus_per_node={world}", f"trainer.output_dir={out_dir}",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "data.train_batch_size=4", "deepspeed=zero1", "trainer.total_training_steps=4", *extra])
    cfg = resolve_config(c)
    validate(cfg)
    prepare_embedded(cfg)
    return cfg


def _batch(seed, rows=16):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 23, (rows, P + R), generator=g)
    ids[::2, P + 1] = 0  # the pad id sampled as a response token: HF's padding_idx row gets no gradient from it
    ids[1::4, P - 1] = 0  # and in a prompt
    mask = torch.ones(rows, P + R, dtype=torch.long)
    for i in range(rows):  # left-padded prompts, right-padded responses
        mask[i, :i % 3] = 0
        mask[i, P + R - (i % 4):] = 0
    pos = torch.clamp(mask.cumsum(1) - 1, min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos,
                                "responses": ids[:, P:], "response_mask": mask[:, P:].float()})


def _train_batch(worker, seed):
    d = _batch(seed)
    d.union(worker.compute_log_prob(d).select(["old_log_probs"]))
    d.union(worker.compute_ref_log_prob(d))
    d["advantages"] = torch.randn(len(d), R, generator=torch.Generator().manual_seed(seed + 100))
    return d


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    from megatron.core import parallel_state as ps

    from trainer.workers.actor import ActorRolloutRefWorker
    from trainer.workers.megatron_actor import MegatronActorRefWorker

    out = str(tmp_path_factory.mktemp("mw"))
    ds = ActorRolloutRefWorker(_config(out, "deepspeed"), 0, 1)
    ds.init_model()
    mg = MegatronActorRefWorker(_config(out, "megatron"), 0, 1)
    info = mg.init_model()
    yield {"ds": ds, "mg": mg, "info": info, "out": out}
    ps.destroy_model_parallel()
    if torch.distributed.is_initialized():
        # through DeepSpeed, which then drops its cached groups (a later test's deepspeed.initialize would
        # otherwise use the destroyed world group)
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()


def _params(worker):
    return {k: v.clone() for k, v in worker.hf_state_dict().items()}


def test_log_probs_equal_hf(workers):
    from transformers import AutoModelForCausalLM

    from trainer.forward import forward_log_probs

    mg, out = workers["mg"], workers["out"]
    assert workers["info"]["pad_token_id"] == 0 and workers["info"]["num_params"] > 0
    parts = workers["info"]["startup_s"]  # the start-up line's split, in order (trainer.placement.startup_split)
    assert list(parts) == ["imports", "distributed", "weights read", "actor", "reference", "rollout engine"]
    assert all(v >= 0 for v in parts.values())
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(out, "init_model"), dtype=torch.float32).eval()
    hf.load_state_dict(mg.hf_state_dict(), strict=False)  # the actor's current weights (tied head: no lm_head)
    d = _batch(0)
    with torch.no_grad():
        ref_lp, ref_ent = forward_log_probs(hf, d["input_ids"], d["attention_mask"], d["position_ids"], R,
                                            calculate_entropy=True, use_remove_padding=False)
    got = mg.compute_log_prob(d)
    m = d["response_mask"].bool()
    assert got["old_log_probs"].shape == (16, R) and got["old_log_probs"].dtype == torch.float32
    torch.testing.assert_close(got["old_log_probs"][m], ref_lp[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["entropys"][m], ref_ent[m], atol=1e-5, rtol=0)


def test_one_update_matches_deepspeed_actor(workers):
    """Same start weights, same batch, fp32: losses and gradient norm agree (rtol 1e-4); both actors move.

    After one AdamW step each parameter moves by about ``lr * sign(grad)``, so weights are compared loosely
    (99% of all elements within 1e-6, every element within 2 * lr); the gradient norm checks the gradient scale."""
    ds, mg = workers["ds"], workers["mg"]
    ds_sd = {k: v.detach().clone() for k, v in ds.actor.engine.module.state_dict().items()}
    from trainer.megatron.model import load_hf_weights

    load_hf_weights(mg.actor.engine.module, ds_sd, mg.shape)  # both start from the DeepSpeed actor's weights
    before = _params(mg)
    d = _train_batch(mg, seed=1)
    d_ds = _batch(1)
    lp_ds = ds.compute_log_prob(d_ds)["old_log_probs"]
    m = d["response_mask"].bool()
    torch.testing.assert_close(d["old_log_probs"][m], lp_ds[m], atol=1e-5, rtol=0)
    m_mg = mg.update_actor(d)
    m_ds = ds.update_actor(d)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr"):
        assert len(m_mg[key]) == len(m_ds[key]) > 0, key
        torch.testing.assert_close(torch.tensor(m_mg[key]), torch.tensor(m_ds[key]), rtol=1e-4, atol=1e-6)
    after = _params(mg)
    lr = float(m_mg["actor/lr"][0])
    assert any(not torch.equal(before[k], after[k]) for k in before), "update_actor did not change the weights"
    ds_after = ds.actor.engine.module.state_dict()
    diffs = torch.cat([(v - ds_after[k].float()).abs().flatten() for k, v in after.items()])
    assert float(diffs.max()) <= 2 * lr + 1e-6
    assert float((diffs <= 1e-6).float().mean()) >= 0.99


def test_rollout_engine_receives_megatron_weights(workers):
    mg = workers["mg"]
    mg.update_actor(_train_batch(mg, seed=2))  # weights differ from the initial ones the engine was built with
    d = _batch(3, rows=2)
    prompts = DataProto.from_dict({"input_ids": d["input_ids"][:, :P], "attention_mask": d["attention_mask"][:, :P]})
    gen = mg.generate_sequences(prompts)
    assert gen["responses"].shape[0] == 2 * 4 and gen["input_ids"].shape[1] == P + gen["responses"].shape[1]
    want = mg.hf_state_dict()
    got = dict(mg.engine.model.named_parameters())
    for name, t in want.items():
        assert torch.equal(got[name].detach().cpu(), t), name
    fp = mg.weights_fingerprint()
    for name, s in fp["actor"].items():
        assert s == pytest.approx(fp["engine"][name], abs=1e-9), name


def test_checkpoint_round_trip_resumes_bit_exact(workers, tmp_path):
    mg = workers["mg"]
    mg.update_actor(_train_batch(mg, seed=3))  # a checkpoint follows a step: the optimizer has its state (alone too)
    path = str(tmp_path / "global_step_7" / "actor")
    mg.save_checkpoint(path)
    b = _train_batch(mg, seed=4)
    first = mg.update_actor(b)
    w_first = _params(mg)
    mg.load_checkpoint(path)
    second = mg.update_actor(b)
    w_second = _params(mg)
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert first[key] == second[key], key
    for k in w_first:
        assert torch.equal(w_first[k], w_second[k]), k
    with pytest.raises(FileNotFoundError):
        mg.load_checkpoint(str(tmp_path / "global_step_8" / "actor"))


def test_export_hf_loads_with_from_pretrained(workers, tmp_path):
    from transformers import AutoModelForCausalLM

    mg = workers["mg"]
    mg.export_hf(str(tmp_path / "hf"))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    sd = model.state_dict()
    for k, v in mg.hf_state_dict().items():
        assert torch.equal(sd[k], v), k


def test_pipeline_parallel_is_refused_by_the_worker(workers):
    from trainer.workers.megatron_actor import MegatronActorRefWorker

    from trainer.config.workers import actor_worker_config

    cfg = _run_config(workers["out"], "megatron")
    cfg["actor_rollout_ref"]["actor"]["megatron"]["pipeline_model_parallel_size"] = 2  # past the launch checks
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=2"):
        MegatronActorRefWorker(actor_worker_config(cfg), 0, 1).init_model()
