"""The actor worker (DeepSpeed on CPU, one gloo rank) runs its transformers engine on the actor's own parameters
with ZeRO-1/2 (no copy, no sync: after an update the engine holds the new weights), and keeps the bucketed copy
with ZeRO-3, whose gathered parameters do not persist."""
import os

import pytest
import torch

from tests.e2e_utils import ROOT
from trainer.protocol import DataProto

P = 4


def _worker(out_dir, zero, *more):
    from hydra import compose, initialize_config_dir

    from trainer.config.workers import actor_worker_config
    from trainer.embedded_assets import prepare_embedded
    from trainer.launch import resolve_config, validate
    from trainer.workers.actor import ActorRolloutRefWorker

    with initialize_config_dir(config_dir=os.path.join(ROOT, "configs"), version_base=None):
        c = compose("ppo_trainer", overrides=[
            f"deepspeed={zero}", "trainer.n_gpus_per_node=1", f"trainer.output_dir={out_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.lr=0.05", "trainer.total_training_steps=4", *more])
    cfg = resolve_config(c)
    validate(cfg)
    prepare_embedded(cfg)
    w = ActorRolloutRefWorker(actor_worker_config(cfg), 0, 1)
    w.init_model()
    return w


def _prompts():
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11], [0, 0, 12, 13], [14, 15, 16, 17]])
    return DataProto.from_dict({"input_ids": ids, "attention_mask": (ids > 0).long()}, meta={"seed": 1})


def _same_storage(w) -> bool:
    actor = {n: p.data_ptr() for n, p in w.actor.engine.module.named_parameters()}
    engine = {n: p.data_ptr() for n, p in w.engine.model.named_parameters() if n in actor}
    return bool(engine) and engine == {n: actor[n] for n in engine}


def _train_once(w, rows):
    rows = rows.select(["input_ids", "attention_mask", "position_ids", "responses", "response_mask"])
    rows.union(w.compute_log_prob(rows).select(["old_log_probs"]))
    rows["advantages"] = torch.linspace(-1, 1, len(rows))[:, None].expand_as(rows["response_mask"]).contiguous()
    return w.update_actor(rows)


@pytest.mark.parametrize("zero,shared", [("zero2", True), ("zero3", False)])
def test_engine_runs_on_the_actor_weights_with_zero2_and_copies_them_with_zero3(tmp_path, zero, shared):
    w = _worker(str(tmp_path), zero)
    rows = w.generate_sequences(_prompts())
    assert _same_storage(w) is shared
    fp = w.weights_fingerprint()
    before = dict(fp["engine"])
    assert fp["engine"] == pytest.approx(fp["actor"], rel=1e-6)
    _train_once(w, rows)
    w.generate_sequences(_prompts())
    fp = w.weights_fingerprint()
    assert fp["engine"] == pytest.approx(fp["actor"], rel=1e-6)  # the updated weights, shared or synced
    assert fp["engine"] != before  # the update moved them
    assert _same_storage(w) is shared


def test_the_logged_lr_is_the_rate_the_step_used(tmp_path):
    """With a warmup the first optimizer step runs at lr 0 (verl's schedule): its weights stay, and actor/lr says 0
    (it used to say the next step's rate, read after the scheduler had moved on)."""
    w = _worker(str(tmp_path), "zero2", "actor_rollout_ref.actor.optim.lr_warmup_steps=2")
    rows = w.generate_sequences(_prompts())
    lrs, changed = [], []
    for _ in range(3):
        before = {n: p.detach().clone() for n, p in w.actor.engine.module.named_parameters()}
        lrs.append(_train_once(w, rows)["actor/lr"][0])
        changed.append(any(not torch.equal(before[n], p) for n, p in w.actor.engine.module.named_parameters()))
    assert lrs == pytest.approx([0.0, 0.025, 0.05]) and changed == [False, True, True]
