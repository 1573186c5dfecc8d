"""MegatronActorRefWorker with tensor parallelism 2 on CPU: two processes (torch.multiprocessing, gloo).

Each rank builds the worker from the composed config (embedded tiny Llama: 4 heads, 2 KV heads, fp32) with
``actor.megatron.tensor_model_parallel_size=2``. Checked against the HF model in the parent process:
the TP-gathered HF tensors equal the initial HF weights exactly, compute_log_prob equals HF (atol 1e-5), both
TP ranks report the same update metrics, and after the update the rollout engine of each rank holds exactly
the TP-gathered actor weights.
"""
import os

import pytest
import torch

pytest.importorskip("megatron.core")

from tests.e2e_utils import ROOT  # noqa: E402


def _worker(rank, out_dir, port, result_dir):
    import sys

    sys.path.insert(0, ROOT)
    from tests.test_megatron_worker import _batch, _config, _train_batch
    from trainer.protocol import DataProto
    from trainer.workers.megatron_actor import MegatronActorRefWorker

    cfg = _config(out_dir, "megatron", world=2, extra=["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"])
    w = MegatronActorRefWorker(cfg, rank, 2, "127.0.0.1", port)
    w.init_model()
    init_sd = w.hf_state_dict()
    lp = w.compute_log_prob(_batch(0))
    metrics = w.update_actor(_train_batch(w, seed=1))
    d = _batch(3, rows=2)
    w.generate_sequences(DataProto.from_dict({"input_ids": d["input_ids"][:, :6],
                                              "attention_mask": d["attention_mask"][:, :6]}))
    after = w.hf_state_dict()
    engine_ok = all(torch.equal(p.detach().cpu(), after[n]) for n, p in w.engine.model.named_parameters())
    torch.save({"init": init_sd, "lp": lp["old_log_probs"], "ent": lp["entropys"], "metrics": metrics,
                "engine_ok": engine_ok, "changed": any(not torch.equal(init_sd[k], after[k]) for k in after)},
               os.path.join(result_dir, f"rank{rank}.pt"))
    torch.distributed.barrier()


def test_tp2_log_probs_and_sync_match_hf(tmp_path):
    import torch.multiprocessing as mp
    from transformers import AutoModelForCausalLM

    from tests.test_megatron_worker import R, _batch, _config
    from trainer.forward import forward_log_probs
    from trainer.workers.base import free_port

    out = str(tmp_path / "run")
    _config(out, "megatron", world=2)  # writes the embedded model and data once, before the ranks start
    mp.start_processes(_worker, args=(out, free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    res = [torch.load(str(tmp_path / f"rank{r}.pt"), weights_only=False) for r in range(2)]
    hf = AutoModelForCausalLM.from_pretrained(os.path.join(out, "init_model"), dtype=torch.float32).eval()
    hf_sd = hf.state_dict()
    for r in res:
        for k, v in r["init"].items():
            assert torch.equal(v, hf_sd[k]), k            # TP split + gather round-trips the HF weights exactly
        assert r["engine_ok"] and r["changed"]
    d = _batch(0)
    with torch.no_grad():
        ref_lp, ref_ent = forward_log_probs(hf, d["input_ids"], d["attention_mask"], d["position_ids"], R,
                                            calculate_entropy=True, use_remove_padding=False)
    m = d["response_mask"].bool()
    for r in res:
        torch.testing.assert_close(r["lp"][m], ref_lp[m], atol=1e-5, rtol=0)
        torch.testing.assert_close(r["ent"][m], ref_ent[m], atol=1e-5, rtol=0)
    assert res[0]["metrics"]["actor/pg_loss"] == res[1]["metrics"]["actor/pg_loss"]
    assert res[0]["metrics"]["actor/grad_norm"] == res[1]["metrics"]["actor/grad_norm"]
