"""Every registered policy loss takes optimizer steps in the actor worker (DeepSpeed ZeRO-2 on CPU, one gloo rank, the
embedded tiny model) on one sampled batch: its loss and the KL to the old policy are finite and the weights move.
One worker process serves every loss (the worker's ``actor_cfg`` is swapped), instead of one entry-point run each."""
import dataclasses
import math

import torch

from tests.test_e2e_algorithms import _config_error
from tests.test_shared_weights_worker import _prompts, _worker
from trainer import core_algos


def test_every_registered_policy_loss_takes_a_finite_step(tmp_path):
    w = _worker(str(tmp_path), "zero2")
    rows = w.generate_sequences(_prompts())
    rows = rows.select(["input_ids", "attention_mask", "position_ids", "responses", "response_mask",
                        "rollout_log_probs"])
    rows.union(w.compute_log_prob(rows).select(["old_log_probs"]))
    rows["advantages"] = torch.linspace(-1, 1, len(rows))[:, None].expand_as(rows["response_mask"]).contiguous()
    base = w.actor_cfg
    for mode in sorted(core_algos.POLICY_LOSS_REGISTRY):
        assert _config_error([f"actor_rollout_ref.actor.policy_loss.loss_mode={mode}"]) is None, mode  # accepted
        w.actor_cfg = dataclasses.replace(base, policy_loss=dataclasses.replace(base.policy_loss, loss_mode=mode))
        before = {n: p.detach().clone() for n, p in w.actor.engine.module.named_parameters()}
        metrics = w.update_actor(rows)
        for key in ("actor/pg_loss", "actor/ppo_kl", "actor/grad_norm"):
            assert metrics[key] and all(math.isfinite(v) for v in metrics[key]), (mode, key, metrics.get(key))
        moved = any(not torch.equal(before[n], p) for n, p in w.actor.engine.module.named_parameters())
        assert moved, f"{mode}: the step left the weights as they were"
