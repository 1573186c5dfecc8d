"""tools/bench/mfu.py: --tiny on CPU writes valid JSON whose MFU follows the hand-computed FLOPs of the tiny config."""
import json

import pytest

from tests.e2e_utils import run_tool
from tools.bench import mfu

# tiny config: hidden 64, 2 layers, 4 heads (d=16), 2 kv heads, intermediate 128, vocab 512 (tied, lm head counted)
# N = 2 * (3*64*128 + 64*16*(4+2*2) + 4*16*64) + 512*64 = 2 * 36864 + 32768 = 106496
# flops/token at 64-token sequences = 6 * 106496 + 12 * 2 * 4 * 16 * 64 = 638976 + 98304 = 737280
TINY_FLOPS_PER_TOKEN = 737280.0


def test_tiny_mfu_json(tmp_path):
    out = tmp_path / "mfu.json"
    mfu.main(["--tiny", "--out", str(out)])
    doc = json.loads(out.read_text())
    [row] = doc["results"]
    assert row["model"] == "tiny" and row["path"] == "torch" and row["tokens_per_microbatch"] == 256
    assert row["flops_per_token"] == TINY_FLOPS_PER_TOKEN
    tokens = 256 * row["iters"]
    assert row["tokens_per_s"] == pytest.approx(tokens / row["seconds"])
    assert row["mfu"] == pytest.approx(TINY_FLOPS_PER_TOKEN * tokens / (row["seconds"] * 989e12), rel=1e-9)
    assert row["peak_mem_gib"] is None  # not measured on CPU


def test_bad_sizes_raise():
    with pytest.raises(ValueError, match="multiple of seq_len"):
        mfu.bench_model("tiny", mfu.pick_device("cpu"), 100, 64, 32, 1, 0, 0, 1e12)
    with pytest.raises(ValueError, match="iters"):
        mfu.bench_model("tiny", mfu.pick_device("cpu"), 128, 64, 32, 0, 0, 0, 1e12)


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        mfu.main(["--help"])
    assert e.value.code == 0 and "--deepspeed" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.bench
def test_tiny_deepspeed_path(tmp_path):
    out = tmp_path / "mfu_ds.json"
    [row] = run_tool("tools/bench/mfu.py", "--tiny", "--deepspeed", out=str(out), timeout=300)["results"]
    assert row["path"] == "deepspeed-zero2" and row["flops_per_token"] == TINY_FLOPS_PER_TOKEN and row["mfu"] > 0
