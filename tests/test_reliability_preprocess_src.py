"""A ``--src`` folder whose jsonl rows are not what the preprocessing tool reads stops the tool in one line naming
the file, the line and the missing or wrong column, and writes nothing. Found by trying it: rows without the
dataset's columns raised KeyError with a traceback (gsm8k, svamp, math500), a line that is not JSON was reported
without its file, and gsm8k wrote train.parquet before failing on test.jsonl."""
import json
import os
import subprocess
import sys

import pytest

from tests.e2e_utils import ROOT

TOOLS = {"gsm8k": (["train", "test"], {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}),
         "svamp": (["test"], {"Body": "Ann has 2 apples.", "Question": "How many?", "Answer": 2.0}),
         "math500": (["train", "test"], {"problem": "What is 1+1?", "answer": "2"})}


def _run(tool, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "data_preprocess", f"{tool}.py"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})


def _write(folder, split, lines):
    folder.mkdir(exist_ok=True)
    (folder / f"{split}.jsonl").write_text("".join(line + "\n" for line in lines))


def _one_line(proc, *needles):
    lines = [ln for ln in proc.stderr.splitlines() if ": error: " in ln]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])


BAD = {
    "missing_column": lambda good: json.dumps({k: v for k, v in list(good.items())[1:]}),
    "not_json": lambda good: '{"oops": ',
    "not_an_object": lambda good: json.dumps([1, 2]),
    "wrong_type": lambda good: json.dumps({**good, list(good)[0]: 5}),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("kind", sorted(BAD))
def test_a_bad_src_row_is_one_line_naming_file_and_line_and_nothing_is_written(tmp_path, tool, kind):
    splits, good = TOOLS[tool]
    src, out = tmp_path / "src", tmp_path / "out"
    for split in splits:
        _write(src, split, [json.dumps(good)] * 2)
    _write(src, splits[-1], [json.dumps(good), BAD[kind](good)])   # the last split read is the bad one
    proc = _run(tool, "--src", str(src), "--out", str(out))
    _one_line(proc, f"{splits[-1]}.jsonl, line 2")
    if kind == "missing_column":
        assert repr([list(good)[0]]) in proc.stderr
    assert not out.exists() or os.listdir(out) == []


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_good_src_rows_pass(tmp_path, tool):
    splits, good = TOOLS[tool]
    src, first = tmp_path / "src", list(good)[0]
    n = 702 if tool == "svamp" else 2   # svamp's first 700 rows train, the rest are held out
    for split in splits:
        _write(src, split, [json.dumps({**good, first: f"{split} {i}: {good[first]}"}) for i in range(n)])
    proc = _run(tool, "--src", str(src), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-2000:]
