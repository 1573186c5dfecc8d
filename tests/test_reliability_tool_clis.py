"""The command-line tools besides the trainer (``tools/plot_run.py``, ``tools/gguf_to_hf.py``) stop on bad input in
one line with exit status 2, not a traceback. Found by trying them: a run folder without metrics.jsonl, an ``--out``
/ OUT_DIR that is a file, and a file that is not GGUF each ended in a traceback; a run stopped while writing its last
metrics line could not be plotted at all."""
import json
import os
import subprocess
import sys

import pytest

from tests.e2e_utils import ROOT


def _tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})


def _one_line(proc, *needles):
    out = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "error: " in ln]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in out, out[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])


def _run_dir(tmp_path, text):
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text(text)
    return str(d)


ROW = json.dumps({"step": 1, "critic/score/mean": 0.5, "response_length/mean": 3.0}) + "\n"


@pytest.mark.parametrize("case", ["no_metrics", "out_is_a_file", "bad_middle_line"])
def test_plot_run_bad_input_is_one_line(tmp_path, case):
    out = tmp_path / "plots"
    if case == "no_metrics":
        args, needle = [str(tmp_path / "nope")], "no metrics.jsonl"
    elif case == "out_is_a_file":
        out.write_text("x")
        args, needle = [_run_dir(tmp_path, ROW)], "is a file"
    else:
        args, needle = [_run_dir(tmp_path, ROW + "{oops\n" + ROW)], "line 2"
    _one_line(_tool("plot_run.py", *args, "--out", str(out)), needle)


def test_plot_run_leaves_out_a_last_line_cut_short(tmp_path):
    proc = _tool("plot_run.py", _run_dir(tmp_path, ROW * 3 + '{"step": 4, "critic/sc'), "--out", str(tmp_path / "p"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "line 4: cut short" in proc.stderr


@pytest.mark.parametrize("case", ["not_gguf", "missing", "out_is_a_file"])
def test_gguf_to_hf_bad_input_is_one_line(tmp_path, case):
    src, out = tmp_path / "model.gguf", tmp_path / "out"
    if case != "missing":
        src.write_text("not a gguf file")
    if case == "out_is_a_file":
        out.write_text("x")
    needle = {"not_gguf": "GGUF", "missing": "not found", "out_is_a_file": "is a file"}[case]
    _one_line(_tool("gguf_to_hf.py", str(src), str(out)), needle)
