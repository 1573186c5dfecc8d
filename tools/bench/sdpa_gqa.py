"""Micro-benchmark: SDPA decoding attention with grouped-query heads, K/V repeated per head group
(``repeat_kv``, what transformers' ``sdpa`` does when a padding mask is given) vs ``enable_gqa=True``
(:func:`rollout.hf_engine.sdpa_gqa_attention_forward`), and ``enable_gqa`` under each SDPA backend.

    python tools/bench/sdpa_gqa.py [--out bench_sdpa_gqa.json]

Shapes (SmolLM2-135M decoding 1,024 rows against a 512-position static cache): query (1024, 9, 1, 64), key/value
(1024, 3, 512, 64), bf16, a random bool mask (70% True). Prints ms per call (30 calls after 3 warm-up calls), the
largest difference between the two outputs, and writes the same as JSON. CUDA only.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_sdpa_gqa.json")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    B, H, KV, L, D = 1024, 9, 3, 512, 64
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, KV, L, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    valid = torch.rand(B, 1, 1, L, device="cuda") > 0.3

    def rep(x):
        return x[:, :, None].expand(B, KV, H // KV, L, D).reshape(B, H, L, D)

    def repeat_kv():
        return F.scaled_dot_product_attention(q, rep(k), rep(v), attn_mask=valid)

    def enable_gqa():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=valid, enable_gqa=True)

    def ms(f):
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(30):
            f()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / 30 * 1e3

    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ms_per_call": {}}
    for f in (repeat_kv, enable_gqa):
        res["ms_per_call"][f.__name__] = ms(f)
    res["max_abs_diff"] = (repeat_kv().float() - enable_gqa().float()).abs().max().item()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("math", SDPBackend.MATH)):
        try:
            with sdpa_kernel(be):
                res["ms_per_call"][f"enable_gqa on {name}"] = ms(enable_gqa)
        except RuntimeError as e:
            res["ms_per_call"][f"enable_gqa on {name}"] = f"fails: {str(e)[:80]}"
    for k_, v_ in res["ms_per_call"].items():
        print(f"{k_:24s} {v_ if isinstance(v_, str) else f'{v_:.3f} ms'}")
    print(f"max |diff| {res['max_abs_diff']:.2e}")
    with open(args.out, "w") as f:
        json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
