"""Config errors and the checks that depend on the training strategy (DeepSpeed vs Megatron) or on a checkpoint:
the reward scorers' options (megatron-core, TP/PP sizes and head counts: :mod:`trainer.megatron_checks`) (a resume's checkpoint:
:mod:`trainer.resume_checks`). Everything
here runs before any worker starts; ``trainer.launch`` calls it and re-exports it.
"""
from __future__ import annotations

import math
import numbers
import os
import re
import reprlib
from contextlib import contextmanager
from typing import Any, Callable, Sequence

__all__ = ["ConfigError", "ConfigErrors", "ErrorCollector", "named_key", "refused_value", "as_int", "as_written",
           "run_checks", "check_rollout_correction", "reward_options", "reward_option_keys",
           "check_reward_scorers", "check_ground_truths"]


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and what was expected."""


class ConfigErrors(ConfigError):
    """Several config errors found in one pass; ``str()`` holds one message per line (``messages``)."""

    def __init__(self, messages: list[str]):
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


#: ``<dotted.key>=<value>...``: the key a message is about (the checks' message form)
_NAMED_KEY = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)+)=")


def named_key(message: str) -> str | None:
    """The dotted key ``message`` starts with (``<key>=<value>; expected ...``), or None."""
    found = _NAMED_KEY.match(message)
    return found.group(1) if found else None


_REFUSED_VALUE = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)+=[^;]*); expected ")  # a value refused by its own check


def refused_value(message: str) -> str | None:
    """``<key>=<value>`` of a line that refuses a value by itself (``<key>=<value>; expected ...``), or None (a line
    on a combination of values, say, refuses no one value)."""
    found = _REFUSED_VALUE.match(message)
    return found.group(1) if found else None


def _reads(message: str, refused: str) -> bool:
    """``message`` is about another key but quotes the refused ``<key>=<value>`` (``... but <key>=<value>: ...``)."""
    key = refused.partition("=")[0]
    return named_key(message) != key and re.search(rf"(?<![\w.]){re.escape(refused)}(?![\w.])", message) is not None


class ErrorCollector:
    """Runs check functions and keeps every :class:`ConfigError` they raise, so that a run reports all of its config
    errors at once instead of one per attempt.

    A check is any callable that raises ``ConfigError`` (or :class:`ConfigErrors`) for a bad value; a check stops at
    its own first error, the collector goes on with the next check. Identical messages are kept once, and a value
    refused by its own check (``<key>=<value>; expected ...``) is reported by that line only: a message about another
    key that quotes the same ``<key>=<value>`` (``... but <key>=<value>: ...``, e.g. a group estimator's check of a
    refused ``rollout.n``) follows from the same bad value and is left out, whichever comes first. A line on a
    combination of valid values (``trainer.strategy=megatron has no critic ...``) refuses no one value and hides
    nothing.

    Example::

        errors = ErrorCollector()
        errors.run(validate, cfg)
        with errors.check():
            preflight(cfg)
        errors.raise_if_any()
    """

    def __init__(self, messages: list[str] | None = None):
        self.messages: list[str] = []
        for m in messages or []:
            self.add(m)

    def add(self, message: str) -> None:
        """Record one message (once), unless it quotes a value a recorded message refuses; one that refuses a value
        drops the recorded messages that quote it (see the class)."""
        if message in self.messages or any(_reads(message, v) for v in map(refused_value, self.messages) if v):
            return
        refused = refused_value(message)
        if refused:
            self.messages = [m for m in self.messages if not _reads(m, refused)]
        self.messages.append(message)

    @contextmanager
    def check(self):
        """A ``with`` block whose ConfigError is recorded instead of raised (other exceptions pass through)."""
        try:
            yield
        except ConfigErrors as exc:
            for m in exc.messages:
                self.add(m)
        except ConfigError as exc:
            self.add(str(exc))

    def run(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``; returns its result, or None when it raised a ConfigError (recorded)."""
        with self.check():
            return fn(*args, **kwargs)
        return None

    def raise_if_any(self) -> None:
        """Raise :class:`ConfigErrors` with every recorded message (a plain ConfigError when there is one)."""
        if len(self.messages) == 1:
            raise ConfigError(self.messages[0])
        if self.messages:
            raise ConfigErrors(self.messages)


def run_checks(cfg: dict, checks) -> None:
    """Run every ``check(cfg)`` of ``checks`` and raise all their ConfigErrors together (see :class:`ErrorCollector`)."""
    errors = ErrorCollector()
    for check in checks:
        errors.run(check, cfg)
    errors.raise_if_any()


def as_written(value) -> str:
    """A config value for an error line, as the user wrote it: a number as it is (``3.0`` stays ``3.0``), a bool
    as YAML writes it (``true``), a string quoted."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def as_int(value, key: str, minimum: int | None = None) -> int:
    """``int(value)`` for a config key, or a ConfigError naming the key, the value and what was expected."""
    try:
        out = int(value)
        if isinstance(value, float) and value != out:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r}; expected an integer") from None
    if minimum is not None and out < minimum:
        raise ConfigError(f"{key}={as_written(value)}; expected an integer >= {minimum}")
    return out


def check_rollout_correction(cfg: dict) -> None:
    """``algorithm.rollout_correction`` (:class:`trainer.algos.rollout_correction.RolloutCorrection`) is valid.

    Raises: ConfigError naming the key."""
    from trainer.algos.rollout_correction import RolloutCorrection

    try:
        RolloutCorrection.from_config(cfg["algorithm"].get("rollout_correction"))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def reward_options(cfg: dict) -> dict:
    """The scorer options: ``reward_model.scorer_kwargs`` merged with verl's
    ``reward_model.custom_reward_function.reward_kwargs``.

    Raises:
        ConfigError: either is not a mapping, or a key is set in both to different values.
    """
    rm = cfg.get("reward_model") or {}
    merged: dict = {}
    for key, opts in (("reward_model.scorer_kwargs", rm.get("scorer_kwargs")),
                      ("reward_model.custom_reward_function.reward_kwargs",
                       (rm.get("custom_reward_function") or {}).get("reward_kwargs"))):
        if not isinstance(opts or {}, dict):
            raise ConfigError(f"{key}={opts!r}; expected a mapping of scorer options")
        for k, v in (opts or {}).items():
            if k in merged and merged[k] != v:
                raise ConfigError(f"scorer option {k!r} is set to {merged[k]!r} and, in {key}, to {v!r}")
            merged[k] = v
    return merged


def reward_option_keys(cfg: dict) -> dict[str, str]:
    """The config key that holds each scorer option of :func:`reward_options`: ``reward_model.scorer_kwargs`` or
    ``reward_model.custom_reward_function.reward_kwargs`` (the first, for an option set in both)."""
    rm = cfg.get("reward_model") or {}
    keys: dict[str, str] = {}
    for key, opts in (("reward_model.scorer_kwargs", rm.get("scorer_kwargs")),
                      ("reward_model.custom_reward_function.reward_kwargs",
                       (rm.get("custom_reward_function") or {}).get("reward_kwargs"))):
        for k in opts if isinstance(opts, dict) else ():
            keys.setdefault(k, key)
    return keys


def check_reward_scorers(make_rm: Callable, reward_fn_key: str, datasets: Sequence,
                         option_keys: dict[str, str] | None = None) -> Any:
    """Build one reward manager with ``make_rm()`` and check every scorer that routing reaches: each distinct
    ``reward_fn_key`` value in the rows of ``datasets`` (:class:`trainer.dataset.PromptDataset` or None) has a
    registered scorer taking the scorer options. Returns the manager. ``option_keys`` (:func:`reward_option_keys`):
    the config key of each option, to name an option value of the wrong type by its key.

    Raises:
        ConfigError: a row without a scorer name in ``reward_fn_key`` (naming the file and the row, or the file that
            lacks the column: :func:`trainer.data_rows.check_reward_key`), a name without a scorer (naming the first row
            that has it), an option a scorer does not take (naming the option and the scorer), or reward components
            (``algorithm.gdpo_reward_keys``) that a scorer does not return (:func:`check_reward_components`), or a
            ground truth a built-in scorer cannot compare (a list, a mapping: :func:`check_ground_truths`), or an
            option value of the wrong type for its scorer's parameter (:class:`rewards.options.OptionValueError`:
            ``reward_model.custom_reward_function.reward_kwargs.bonus='abc': expected a number ...``).
    """
    from rewards.options import OptionValueError
    from trainer.data_rows import DataError, check_reward_key, row_origins, row_place

    try:
        manager = make_rm()
        places: dict = {}  # each scorer name -> (file, index) of the first row that names it
        for ds in datasets if manager.reads_key else ():
            if ds is not None:
                # a row without a scorer name: named with its file and index (a custom function is given any value)
                check_reward_key(ds, reward_fn_key, allow_none=manager.scorer is not None,
                                 batch=not manager.routes_by_key)
                if manager.scorer is None:
                    for row, origin in zip(ds.rows, row_origins(ds)):
                        places.setdefault(row.get(reward_fn_key), origin)
        try:
            manager.check_data_sources(places)
        except KeyError as exc:  # a name without a scorer: the first row that has it
            from rewards.registry import list_scorers

            name = next((v for v in sorted(places, key=repr) if v not in list_scorers()), None)
            if name is None:
                raise
            raise DataError(f"data.reward_fn_key={reward_fn_key!r}: {row_place(*places[name])} has "
                            f"{reward_fn_key}={name!r}: {exc.args[0] if exc.args else exc}") from exc
        check_ground_truths(manager, reward_fn_key, datasets)
        from trainer.reward_probe import check_scorer_returns

        check_scorer_returns(manager, reward_fn_key, datasets)
        if manager.component_keys:
            check_reward_components(make_rm(), reward_fn_key, datasets)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0]) if exc.args else str(exc)) from exc
    except DataError as exc:
        raise ConfigError(str(exc)) from exc
    except OptionValueError as exc:
        key = (option_keys or {}).get(exc.option)
        raise ConfigError(exc.naming(key) if key else f"reward_model: {exc}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"reward_model: {exc}") from exc
    return manager


def check_ground_truths(manager, reward_fn_key: str, datasets: Sequence) -> None:
    """Every row of ``datasets`` routed to a built-in scorer (by its ``reward_fn_key`` value, or the manager's fixed
    ``reward_model.scorer``) has a ground truth that scorer can read: one answer, a string or a number, written as
    the scorer reads a reference answer (:func:`rewards.registry.ground_truth_problem`: ``"six"`` or ``"1,2"`` is no
    number for the gsm8k scorers); a custom reward function is given any value. Each distinct (scorer, value) is
    read once, so large data sets are checked in about a second.

    Raises:
        DataError: one line naming the first such row (file, index), its ground truth, the scorer, what it reads,
            how many other rows are alike, and the ways out.
    """
    from rewards.registry import get_scorer, ground_truth_problem
    from trainer.data_rows import DataError, row_origins, row_place

    bad, seen = [], {}
    for ds in datasets:
        for row, origin in zip(ds.rows, row_origins(ds)) if ds is not None else ():
            fn = manager.scorer if manager.scorer is not None else get_scorer(row.get(reward_fn_key))
            truth = (row.get("reward_model") or {}).get("ground_truth")
            try:
                key = (fn, type(truth), truth)
                why = seen[key] if key in seen else seen.setdefault(key, ground_truth_problem(fn, truth))
            except TypeError:  # a list or a mapping: not hashable, read every time
                why = ground_truth_problem(fn, truth)
            if why is not None:
                bad.append((origin, row, truth, why))
    if not bad:
        return
    origin, row, truth, why = bad[0]
    routed = (f"reward_model.scorer={manager.scorer_name}" if manager.scorer is not None else
              f"{reward_fn_key}={row.get(reward_fn_key)!r}")
    more = f"; {len(bad) - 1} more row(s) too" if len(bad) > 1 else ""
    fix = ("write each ground truth as that scorer reads it" if isinstance(truth, (str, numbers.Real)) else
           "give each row one answer")
    short = reprlib.Repr()
    short.maxstring = short.maxother = 80
    shown = short.repr(truth)  # head ... tail: a solution's answer is at its end
    raise DataError(f"{row_place(*origin)} has reward_model.ground_truth={shown} (a {type(truth).__name__}) "
                    f"and is scored by {routed}: {why}{more}; {fix}, or score it with a "
                    "reward_model.custom_reward_function that reads this ground truth")


def check_reward_components(manager, reward_fn_key: str, datasets: Sequence) -> None:
    """Score one empty response per reachable data source (the first row of each ``reward_fn_key`` value in
    ``datasets``) in this process with ``manager`` (a :class:`rewards.manager.RewardManager` with
    ``component_keys``): a scorer that returns a number, or a dict without a component, would stop the first
    training step. A scorer that raises on the empty response is not judged.

    Raises:
        ValueError: naming the data source, the components asked for and what the scorer returned.
    """
    import torch

    from trainer.protocol import DataProto

    firsts: dict = {}
    for ds in datasets:
        for row in ds.rows if ds is not None else ():
            firsts.setdefault(repr(row.get(reward_fn_key)), row)
    manager.num_workers = 0  # in this process: no scoring pool is started for the probe
    for source, row in sorted(firsts.items()):
        one = DataProto.from_dict({"responses": torch.zeros(1, 1, dtype=torch.long),
                                   "response_mask": torch.zeros(1, 1)},
                                  {"reward_model": [row["reward_model"]], "extra_info": [row.get("extra_info")],
                                   reward_fn_key: [row.get(reward_fn_key)]})
        try:
            manager(one)
        except ValueError as exc:
            raise ValueError(f"algorithm.gdpo_reward_keys={list(manager.component_keys)}: the scorer of "
                             f"{reward_fn_key}={source}, given an empty response: {exc}") from exc


def _import_ended(key: str, path, how: str) -> str:
    """The one line for a custom reward file whose import ended the process (``how``: ``sys.exit(0)``, ...)."""
    return (f"{key}.path={path!r}: importing it ended the process ({how}); a reward file must not end the process "
            "at import: keep a script's own code under `if __name__ == '__main__':`")


def custom_scorer(cfg: dict) -> Callable | None:
    """The function named by ``custom_reward_function.{path,name}`` (verl's keys, stored under
    ``reward_model``; name defaults to ``compute_score``), loaded with :func:`rewards.registry.load_custom_scorer`;
    None when no path is set. The file is imported first in a forked process bounded by the scorer probe's bound
    (:func:`trainer.reward_probe.import_in_probe`, ``min(reward_model.timeout_s, 60 s)``), then in this process.

    Raises:
        ConfigError: the file is missing, fails to import, does not finish importing within the bound (naming the
            seconds; its process is killed), lacks the function or holds a non-callable under that name (one line
            naming the key and the value); its import ended the process (``sys.exit``, ``os._exit``, a crash, or a
            ``KeyboardInterrupt`` the file raised itself, told apart from Ctrl-C by
            :func:`trainer.interrupt.raised_by_code`); ``reward_model.scorer`` names a scorer too (the custom
            function would score every row and the named scorer none).
    """
    rm = cfg.get("reward_model") or {}
    custom = rm.get("custom_reward_function") or {}
    if not custom.get("path"):
        return None
    if rm.get("scorer") is not None:
        raise ConfigError(f"reward_model.scorer={rm['scorer']} and custom_reward_function.path={custom['path']!r} "
                          "both name the scorer; expected one: the custom function scores every row, so set "
                          "reward_model.scorer=null (or drop the path to use the named scorer)")
    from rewards.registry import ImportEndedError, load_custom_scorer
    from trainer.reward_probe import PROBE_BOUND_S, import_in_probe, probe_bound

    key, path = "reward_model.custom_reward_function", custom["path"]
    name = custom.get("name") or "compute_score"
    if os.path.isfile(str(path)):  # a missing file: load_custom_scorer's error
        try:
            timeout_s = float(rm.get("timeout_s"))
        except (TypeError, ValueError):  # refused with the reward manager's own error
            timeout_s = PROBE_BOUND_S
        bound = probe_bound(timeout_s) if math.isfinite(timeout_s) and timeout_s > 0 else PROBE_BOUND_S
        status, how, _ = import_in_probe(str(path), name, bound)
        if status == "ended":
            raise ConfigError(_import_ended(key, path, how))
        if status == "timeout":
            raise ConfigError(
                f"{key}.path={path!r}: importing it did not finish in {bound:g} s (the start-up bound: "
                f"min(reward_model.timeout_s={timeout_s:g}, {PROBE_BOUND_S:g}) s; its process was killed); a reward "
                "file must import within it: make no call at import that can wait forever (a network call without "
                "a timeout, a lock), and for a model or table loaded at import raise reward_model.timeout_s")
    try:
        return load_custom_scorer(path, name)
    except ImportEndedError as exc:
        raise ConfigError(_import_ended(key, path, exc.how)) from exc
    except KeyboardInterrupt as exc:
        from trainer.interrupt import raised_by_code

        if not raised_by_code(exc):  # Ctrl-C / SIGTERM
            raise
        raise ConfigError(_import_ended(key, path, "KeyboardInterrupt raised at import")) from exc
    except (FileNotFoundError, ImportError) as exc:
        raise ConfigError(f"{key}.path={path!r}: {exc}") from exc
    except (AttributeError, TypeError) as exc:
        raise ConfigError(f"{key}.name={name!r}: {exc}") from exc
