"""A reward function that returns what no reward can be made of (None, a string, a dict without ``score``) stops
the run before start-up in one line naming the function, its file and what it returned. Found by trying it: such a
``custom_reward_function`` scored 0 on every response (each counted in ``reward/num_errors``), and the run trained
on all-zero rewards and exited 0. A function that raises on the probe's empty response is not judged (scorer
failures at run time stay counted, not fatal)."""
import pytest

from tests.test_reliability_config import assert_one_line_error, run_cli

SIG = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
BAD = {"none": (SIG + "    return None\n", "got NoneType"),
       "string": (SIG + "    return 'good'\n", "got str"),
       "dict_without_score": (SIG + "    return {'acc': 1.0}\n", "must include 'score'"),
       "list_of_strings": (SIG + "    return ['1.0x']\n", "could not convert")}
GOOD = {"float": SIG + "    return 1.0\n",
        "int": SIG + "    return 0\n",
        "dict": SIG + "    return {'score': 1.0, 'acc': True}\n",
        "raises_on_empty": SIG + "    return float(solution_str.split()[-1] == ground_truth)\n",
        "nan": SIG + "    return float('nan')\n"}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_scorer_returning_an_unusable_value_stops_before_start_up(tmp_path, name):
    source, needle = BAD[name]
    path = tmp_path / "my_reward.py"
    path.write_text(source)
    proc = run_cli(str(tmp_path / "out"), f"custom_reward_function.path={path}")
    assert_one_line_error(proc, "compute_score", str(path), needle)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_usable_scorer_passes_the_probe(tmp_path, name):
    from hydra import compose, initialize_config_dir

    from trainer.launch import prestart
    from trainer.overrides import CONFIG_DIR

    path = tmp_path / "my_reward.py"
    path.write_text(GOOD[name])
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        prestart(compose(config_name="ppo_trainer", overrides=[f"trainer.output_dir={tmp_path / 'out'}",
                                                               f"reward_model.custom_reward_function.path={path}"]))
