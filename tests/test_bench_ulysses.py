"""tools/bench/ulysses.py on CPU (gloo): SP=2 pool, equivalence to SP=1, skipped head counts, failure handling."""
import json

import pytest

from tests.e2e_utils import run_tool
from tools.bench import ulysses



def test_sp2_tiny_json(tmp_path):
    out = tmp_path / "u.json"
    ulysses.main(["--tiny", "--models", "tiny,smollm2-135m", "--sp-sizes", "2", "--tokens", "256", "--no-search",
                  "--out", str(out)])
    doc = json.loads(out.read_text())
    rows = {r["model"]: r for r in doc["throughput"]}
    assert rows["tiny"]["status"] == "ok" and rows["tiny"]["sp"] == 2 and rows["tiny"]["tokens"] == 256
    assert rows["tiny"]["tokens_per_s_per_gpu"] == pytest.approx(256 * 2 / rows["tiny"]["seconds"] / 2)
    # SmolLM2 has 9 attention heads: SP=2 cannot split them
    assert rows["smollm2-135m"]["status"].startswith("skipped") and "(9)" in rows["smollm2-135m"]["status"]
    [eq] = doc["equivalence"]
    assert eq["model"] == "tiny" and eq["dtype"] == "torch.float32" and eq["tokens"] == 256
    assert 0.0 <= eq["max_abs_diff"] < 1e-4
    assert doc["search"] == []


@pytest.mark.bench
def test_tokens_per_gpu_packs_one_sequence_per_sp_rank(tmp_path):
    """--tokens-per-gpu: the SP=2 micro-batch holds 2 sequences of --tokens (each rank holds --tokens), as the
    trainer's budget ppo_max_token_len_per_gpu x sp does; without it one sequence (each rank holds half)."""
    rows = {}
    for flag in ([], ["--tokens-per-gpu"]):
        out = tmp_path / f"u{len(flag)}.json"
        ulysses.main(["--tiny", "--sp-sizes", "2", "--tokens", "256", "--no-search", "--equiv-tokens", "0",
                      "--out", str(out), *flag])
        [rows[bool(flag)]] = json.loads(out.read_text())["throughput"]
    assert (rows[False]["seqs"], rows[False]["micro_batch_tokens"]) == (1, 256)
    assert (rows[True]["seqs"], rows[True]["micro_batch_tokens"]) == (2, 512)
    r = rows[True]
    assert r["tokens_per_s_per_gpu"] == pytest.approx(512 * 2 / r["seconds"] / 2)


def test_failed_trial_closes_pool():
    pool = ulysses.Pool(1, "cpu", timeout_s=120)
    res = pool.run(dict(kind="train", model="no-such-model", tokens=64, iters=1, warmup=0,
                        gradient_checkpointing=False))
    assert "unknown model config 'no-such-model'" in res["error"] and res["oom"] is False
    assert not pool.alive and all(not p.is_alive() for p in pool.procs)


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        ulysses.main(["--help"])
    assert e.value.code == 0 and "--search-max" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.bench
def test_full_tiny_run(tmp_path):
    out = tmp_path / "u.json"
    doc = run_tool("tools/bench/ulysses.py", "--tiny", out=str(out), timeout=600)
    assert [(r["sp"], r["tokens"], r["status"]) for r in doc["throughput"]] == [
        (1, 256, "ok"), (1, 512, "ok"), (2, 256, "ok"), (2, 512, "ok")]
    # CPU never runs out of memory at this size: the doubling stops at --search-max (1024)
    assert [(r["sp"], r["longest_tokens"], r["stopped_by"]) for r in doc["search"]] == [(1, 1024, "cap"),
                                                                                       (2, 1024, "cap")]
    assert doc["equivalence"][0]["max_abs_diff"] < 1e-4


def test_longest_sequence_doubles_then_bisects_between_last_fit_and_first_oom():
    from tools.bench.ulysses import longest_sequence

    tried = []

    def fits(T, limit=59_000):
        tried.append(T)
        return {"error": "CUDA out of memory", "oom": True} if T > limit else {"peak_mem_gib": T / 1000, "seconds": 1.0}

    last, stop, nxt = longest_sequence(fits, 8192, 1 << 20, refine=0)
    assert (last["tokens"], stop, nxt) == (32768, "OOM", 65536) and tried == [8192, 16384, 32768, 65536]
    tried.clear()
    last, stop, nxt = longest_sequence(fits, 8192, 1 << 20, refine=3)
    # 65536 fails; bisect: 49152 fits, 57344 fits, 61440 fails
    assert tried[4:] == [49152, 57344, 61440]
    assert (last["tokens"], last["peak_mem_gib"], stop, nxt) == (57344, 57.344, "OOM", 61440)
    assert longest_sequence(fits, 8192, 20000, refine=3)[1:] == ("cap", 32768)      # cap: no bisection
    assert longest_sequence(lambda T: {"error": "boom", "oom": False}, 8192, 1 << 20, 2) == (None, "error: boom", 8192)
