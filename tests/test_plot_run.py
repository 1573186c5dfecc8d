"""tools/plot_run.py draws the run plots from metrics.jsonl files."""
import json
import os

import pytest

from tools.plot_run import load_metrics, plot, series


def _write(path, rows):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def _rows(prm: bool):
    rows = [{"step": 0, "val/svamp/acc": 0.01, "val/svamp/format": 0.1}]
    for s in range(1, 4):
        r = {"step": s, "critic/score/mean": 0.1 * s, "reward/acc/mean": 0.05 * s, "reward/format/mean": 0.3 * s,
             "response_length/mean": 100 + s, "response_length/clip_ratio": 0.0, "actor/kl_loss": 1e-3 * s,
             "actor/entropy": 2.0, "timing_s/step": 5.0, "timing_s/gen": 3.0, "timing_s/update_actor": 1.5}
        if prm:
            r.update({"reward_model/ce_loss": 0.69, "reward_model/dpo_acc_abs": 0.5, "prime/pass_ratio": 0.0})
        rows.append(r)
    return rows


def test_series_skips_rows_without_a_number():
    assert series([{"step": 0, "a": 1}, {"step": 1}, {"step": 2, "a": True}, {"step": 3, "a": 2.5}], "a") == \
        ([0, 3], [1.0, 2.5])


def test_plots_overlay_runs_and_add_prm_plot_only_for_prime_runs(tmp_path):
    _write(tmp_path / "grpo", _rows(prm=False))
    _write(tmp_path / "prime", _rows(prm=True))
    out = tmp_path / "plots"
    only_grpo = plot([str(tmp_path / "grpo")], str(out), "a")
    assert sorted(os.path.basename(p) for p in only_grpo) == ["a_kl_entropy.png", "a_length.png", "a_reward.png",
                                                              "a_timing.png"]
    both = plot([str(tmp_path / "grpo"), str(tmp_path / "prime" / "metrics.jsonl")], str(out), "b")
    assert "b_prm.png" in [os.path.basename(p) for p in both]
    assert all(os.path.getsize(p) > 1000 for p in both)


def test_missing_metrics_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        load_metrics(str(tmp_path / "nope"))


def test_held_out_accuracy_and_format_on_their_own_axes_greedy_dashed(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    rows = _rows(prm=False)
    rows[0].update({"val/svamp/greedy/acc": 0.02, "val/svamp/greedy/format": 0.2})
    _write(tmp_path / "run", rows)
    figs = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    plot([str(tmp_path / "run")], str(tmp_path / "plots"), "g")
    reward = figs[0]
    _, acc_ax, fmt_ax = reward.axes
    acc = {ln.get_label(): ln.get_linestyle() for ln in acc_ax.get_lines()}
    fmt = {ln.get_label(): ln.get_linestyle() for ln in fmt_ax.get_lines()}
    assert acc == {"run svamp": "-", "run svamp/greedy": "--"}
    assert fmt == {"run svamp": "-", "run svamp/greedy": "--"}
    for fig in figs:
        real_close(fig)


def test_training_score_is_over_every_generated_row_when_logged(tmp_path, monkeypatch):
    """With dynamic sampling the trained batch is filtered, so critic/score/mean overstates the reward; the plot
    uses reward/score/mean (every generated row) and falls back to critic/score/mean for older runs."""
    import matplotlib.pyplot as plt

    rows = _rows(prm=False)
    for r in rows[1:]:
        r["reward/score/mean"] = 0.01 * r["step"]
    _write(tmp_path / "new", rows)
    _write(tmp_path / "old", _rows(prm=False))
    figs = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    plot([str(tmp_path / "new"), str(tmp_path / "old")], str(tmp_path / "plots"), "s")
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in figs[0].axes[0].get_lines()}
    assert lines["new score"] == [0.01, 0.02, 0.03]
    assert [round(v, 6) for v in lines["old score"]] == [0.1, 0.2, 0.3]
    for fig in figs:
        real_close(fig)


def test_tool_run_beside_a_run_without_tools(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    tool = _rows(prm=False)
    for r in tool[1:]:
        r.update({"multi_turn/tool_calls/mean": 0.5 * r["step"], "multi_turn/tool_errors": float(r["step"] - 1),
                  "multi_turn/tool_calls_total": 4.0 * (r["step"] - 1), "multi_turn/num_turns/mean": 2.0 + r["step"]})
    tool[-1]["val/svamp/acc"] = 0.2
    _write(tmp_path / "svamp_tool", tool)
    _write(tmp_path / "svamp_notool", _rows(prm=False))
    figs = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    written = plot([str(tmp_path / "svamp_tool"), str(tmp_path / "svamp_notool")], str(tmp_path / "p"), "t")
    assert "t_tools.png" in [os.path.basename(p) for p in written]
    calls, errors, turns, acc = next(f for f in figs if len(f.axes) == 4).axes
    assert [ln.get_label() for ln in calls.get_lines()] == ["svamp_tool"]
    [err] = errors.get_lines()
    assert list(err.get_xdata()) == [2, 3] and list(err.get_ydata()) == [0.25, 0.25]  # steps with calls only
    assert list(turns.get_lines()[0].get_ydata()) == [3.0, 4.0, 5.0]
    assert {ln.get_label(): list(ln.get_ydata()) for ln in acc.get_lines()} == {
        "svamp_tool svamp": [0.01, 0.2], "svamp_notool svamp": [0.01]}
    assert "t_tools.png" not in [os.path.basename(p) for p in plot([str(tmp_path / "svamp_notool")],
                                                                    str(tmp_path / "p"), "n")]
    for fig in figs:
        real_close(fig)
