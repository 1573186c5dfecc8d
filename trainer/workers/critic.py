"""The critic worker (GAE): a value head on the same backbone family as the actor, trained with DeepSpeed."""
from __future__ import annotations

import torch

from trainer.protocol import DataProto
from trainer.workers.base import DistributedWorker
from trainer.workers.batching import micro_batches
from trainer.workers.model_utils import ModelRole
from trainer.workers.update import forward_values_micro, ppo_update


class CriticWorker(DistributedWorker):
    """Holds the critic (``trainer.forward.load_value_model``) as a DeepSpeed engine.

    ``config`` is a :class:`trainer.config.workers.CriticWorkerConfig` (``critic`` and its model)."""

    def init_model(self) -> dict:
        import deepspeed  # noqa: F401

        self.init_distributed()
        self.critic_cfg = c = self.config.critic
        self.critic = ModelRole.build(self, self.config.model, sp=c.ulysses_sequence_parallel_size, train=True,
                                      optim_cfg=c.optim, grad_clip=c.grad_clip, total_steps=self.config.total_steps,
                                      value_head=True)
        return self.attach_checkpointing(self.critic, value_head=True)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) f32 for every row, in order: micro-batches of ``critic.forward_micro_batch_size_per_gpu``
        rows, or with ``critic.use_dynamic_bsz`` of ``critic.forward_max_token_len_per_gpu`` tokens (x sp)."""
        self.critic.engine.eval()
        c = self.critic_cfg
        data = data.select(["input_ids", "attention_mask", "position_ids", "responses"])
        data["_row"] = torch.arange(len(data))
        vals, rows = [], []
        # tokens of a dynamic micro-batch (the update's budget when null); read only with use_dynamic_bsz
        budget = (c.forward_max_token_len_per_gpu or c.ppo_max_token_len_per_gpu or 0) * self.critic.sp_size
        for mb in micro_batches(data, c.forward_micro_batch_size_per_gpu, c.use_dynamic_bsz, budget,
                                self.critic.dp_group):
            vals.append(forward_values_micro(self.critic, mb).float().cpu())
            rows.append(mb["_row"])
        return DataProto.from_dict({"values": torch.cat(vals)[torch.argsort(torch.cat(rows))]})

    def update_critic(self, data: DataProto) -> dict:
        return ppo_update(self, self.critic, data, self.critic_cfg, n=self.config.rollout_n, temperature=1.0,
                          kind="critic", response_length=self.config.response_length)
