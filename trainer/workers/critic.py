"""The critic worker (GAE): a value head on the same backbone family as the actor, trained with DeepSpeed."""
from __future__ import annotations

import torch

from trainer.protocol import DataProto
from trainer.workers.base import DistributedWorker, scheduler_total_steps
from trainer.workers.batching import micro_batches
from trainer.workers.model_utils import ModelRole


def forward_values_micro(role: ModelRole, mb: DataProto) -> torch.Tensor:
    """Values of the response positions of one micro-batch: (b, R) f32."""
    from trainer.forward import forward_values

    return forward_values(role.engine, mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                          response_length=mb["responses"].shape[1], use_remove_padding=role.use_remove_padding,
                          sp=role.sp, device=role.device)


class CriticWorker(DistributedWorker):
    """Holds the critic (``trainer.forward.load_value_model``) as a DeepSpeed engine."""

    def init_model(self) -> dict:
        import deepspeed  # noqa: F401

        self.init_distributed()
        cfg = self.config
        self.critic_cfg = cfg["critic"]
        model_cfg = dict(cfg["actor_rollout_ref"]["model"])
        total = scheduler_total_steps(cfg, self.critic_cfg)
        self.critic = ModelRole.build(self, model_cfg, sp=int(self.critic_cfg["ulysses_sequence_parallel_size"]),
                                      train=True, optim_cfg=self.critic_cfg["optim"],
                                      grad_clip=float(self.critic_cfg["grad_clip"]), total_steps=total,
                                      value_head=True, path_override=self.critic_cfg["model"].get("path"))
        return self.attach_checkpointing(self.critic, value_head=True)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) f32 for every row, in order."""
        self.critic.engine.eval()
        mbs = int(self.critic_cfg["ppo_micro_batch_size_per_gpu"])
        data = data.select(["input_ids", "attention_mask", "position_ids", "responses"])
        vals = [forward_values_micro(self.critic, mb).float().cpu() for mb in micro_batches(data, mbs)]
        return DataProto.from_dict({"values": torch.cat(vals)})

    def update_critic(self, data: DataProto) -> dict:
        from trainer.workers.update import ppo_update

        n = int(self.config["actor_rollout_ref"]["rollout"]["n"])
        return ppo_update(self, self.critic, data, self.critic_cfg, n=n, temperature=1.0, kind="critic")
