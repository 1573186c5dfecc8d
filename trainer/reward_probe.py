"""The return value of every reachable scorer, checked before start-up (:func:`check_scorer_returns`, run by
:func:`trainer.config_checks.check_reward_scorers`).

At run time a scorer's failure scores 0 and is counted (``reward/num_errors``), so that one odd response never
stops training. A scorer that returns something other than a number or a dict with ``score`` (``None``, a string,
a dict without ``score``: a bug in a ``custom_reward_function``) fails on every response, and the run would train on
rewards that are all 0 without stopping. Each reachable scorer is therefore called once here on an empty response
and the row's ground truth; a scorer that raises on it is not judged (an empty response may be an input it refuses),
one that returns a value of the wrong kind stops the run in one line.
"""
from __future__ import annotations

from typing import Any, Sequence

__all__ = ["check_scorer_returns"]


def check_scorer_returns(manager: Any, reward_fn_key: str, datasets: Sequence) -> None:
    """Call each scorer that the rows of ``datasets`` reach (the first row of each ``reward_fn_key`` value; the one
    scorer of ``reward_model.scorer`` / ``custom_reward_function`` on the first row) with an empty response, in
    this process and within the manager's ``timeout_s``.

    Raises:
        ValueError: a scorer returned a value that is neither a number nor a dict with ``score`` (naming the scorer,
            the data source and what it returned).
    """
    from rewards.manager import _in_process
    from trainer.protocol import DataProto

    firsts: dict = {}
    for ds in datasets:
        for row in ds.rows if ds is not None else ():
            firsts.setdefault(repr(row.get(reward_fn_key)) if manager.routes_by_key else "", row)
    for source, row in sorted(firsts.items()):
        one = DataProto.from_dict({}, {"reward_model": [row["reward_model"]], "extra_info": [row.get("extra_info")],
                                       reward_fn_key: [row.get(reward_fn_key)]})
        tasks, fns = manager._tasks(one, [""])
        (_, args, kwargs), fn = tasks[0], fns[0]

        def probe(*a, _fn=fn, **kw):
            try:
                return _fn(*a, **kw)
            except Exception:  # noqa: BLE001 - not judged: the scorer may refuse an empty response
                return 0.0

        status, payload, _ = _in_process(probe, args, kwargs, manager.timeout_s)
        if status == "error":  # only the normalisation of what the scorer returned can fail now
            where = f" for {reward_fn_key}={source}" if source else ""
            code = getattr(fn, "__code__", None)
            name = f"{getattr(fn, '__name__', fn)}" + (f" of {code.co_filename}" if code is not None else "")
            raise ValueError(f"the scorer {name}{where}, given an empty response, returned a value it cannot "
                             f"score: {payload}")
