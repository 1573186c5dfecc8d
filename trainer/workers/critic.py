"""The critic worker (GAE): a value head on the same backbone family as the actor, trained with DeepSpeed."""
from __future__ import annotations

import torch

from trainer.protocol import DataProto
from trainer.workers.base import DistributedWorker, scheduler_total_steps
from trainer.workers.batching import micro_batches
from trainer.workers.lora import LORA_KEYS
from trainer.workers.model_utils import ModelRole, role_model_config
from trainer.workers.update import forward_values_micro, ppo_update


class CriticWorker(DistributedWorker):
    """Holds the critic (``trainer.forward.load_value_model``) as a DeepSpeed engine."""

    def init_model(self) -> dict:
        import deepspeed  # noqa: F401

        self.init_distributed()
        cfg = self.config
        self.critic_cfg = cfg["critic"]
        model_cfg = role_model_config(cfg["actor_rollout_ref"]["model"], self.critic_cfg["model"])
        model_cfg.update({k: self.critic_cfg["model"].get(k) for k in LORA_KEYS})  # the critic's own LoRA (verl)
        total = scheduler_total_steps(cfg, self.critic_cfg)
        self.critic = ModelRole.build(self, model_cfg, sp=int(self.critic_cfg["ulysses_sequence_parallel_size"]),
                                      train=True, optim_cfg=self.critic_cfg["optim"],
                                      grad_clip=float(self.critic_cfg["grad_clip"]), total_steps=total,
                                      value_head=True, path_override=self.critic_cfg["model"].get("path"))
        return self.attach_checkpointing(self.critic, value_head=True)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R) f32 for every row, in order: micro-batches of ``critic.forward_micro_batch_size_per_gpu``
        rows, or with ``critic.use_dynamic_bsz`` of ``critic.forward_max_token_len_per_gpu`` tokens (x sp)."""
        self.critic.engine.eval()
        c = self.critic_cfg
        mbs = int(c.get("forward_micro_batch_size_per_gpu") or c["ppo_micro_batch_size_per_gpu"])
        max_tok = int(c.get("forward_max_token_len_per_gpu") or c.get("ppo_max_token_len_per_gpu", 32768))
        data = data.select(["input_ids", "attention_mask", "position_ids", "responses"])
        data["_row"] = torch.arange(len(data))
        vals, rows = [], []
        for mb in micro_batches(data, mbs, bool(c.get("use_dynamic_bsz")), max_tok * self.critic.sp_size,
                                self.critic.dp_group):
            vals.append(forward_values_micro(self.critic, mb).float().cpu())
            rows.append(mb["_row"])
        return DataProto.from_dict({"values": torch.cat(vals)[torch.argsort(torch.cat(rows))]})

    def update_critic(self, data: DataProto) -> dict:
        n = int(self.config["actor_rollout_ref"]["rollout"]["n"])
        return ppo_update(self, self.critic, data, self.critic_cfg, n=n, temperature=1.0, kind="critic")
