"""verl's keys on this framework: the handling of every key of :data:`trainer.verl_keys.VERL_KEYS` in a composed config.

:func:`apply_verl_keys` takes the resolved config (a plain dict), finds the keys that match an entry of the table,
removes them and, by the entry's kind, maps them onto this framework's keys, warns that they are ignored (and
why), or records a config error that says what to use instead. ``python -m trainer.verl_compat --markdown``
prints the README's key table from the same entries.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache

from trainer.verl_keys import VERL_KEYS, VerlKey

R = "actor_rollout_ref.rollout"
_MISSING = object()


def _glob_to_regex(pattern: str) -> str:
    """A dotted key pattern as a regex: ``{a,b}`` either name, ``*`` one name, ``.**`` any subtree (or none)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "{":
            depth, j = 1, i + 1
            while depth:
                depth += {"{": 1, "}": -1}.get(pattern[j], 0)
                j += 1
            alts, depth, start = [], 0, i + 1
            for k in range(i + 1, j):
                ch = pattern[k]
                if (ch == "," and depth == 0) or k == j - 1:
                    alts.append(pattern[start:k])
                    start = k + 1
                depth += {"{": 1, "}": -1}.get(ch, 0)
            out.append("(?:" + "|".join(_glob_to_regex(a) for a in alts) + ")")
            i = j
        elif pattern.startswith(".**", i):
            out.append(r"(?:\..+)?")
            i += 3
        elif c == "*":
            out.append(r"[^.]+")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


@lru_cache(maxsize=None)
def _compiled() -> tuple[tuple[re.Pattern, VerlKey], ...]:
    return tuple((re.compile(_glob_to_regex(e.pattern) + r"\Z"), e) for e in VERL_KEYS)


def match(key: str) -> VerlKey | None:
    """The first table entry whose pattern matches the dotted ``key``, or None."""
    for rx, entry in _compiled():
        if rx.match(key):
            return entry
    return None


def same_value(value, ok) -> bool:
    """``value == ok`` without Python's ``True == 1`` (a bool matches only a bool)."""
    if isinstance(value, bool) or isinstance(ok, bool):
        return isinstance(value, bool) and isinstance(ok, bool) and value == ok
    return value == ok


def leaves(node, prefix: str = ""):
    """``(dotted_key, value)`` of every leaf of a nested dict; an empty dict is a leaf."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif prefix:
        yield prefix, node


@dataclass
class Report:
    """What :func:`apply_verl_keys` did: ``warnings`` and ``notes`` (one line each) and config ``errors``."""

    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _get(cfg: dict, key: str, default=None):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _set(cfg: dict, key: str, value) -> None:
    node = cfg
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _pop(cfg: dict, key: str) -> None:
    """Remove ``key`` and every parent dict it leaves empty."""
    parts = key.split(".")
    chain = [cfg]
    for part in parts[:-1]:
        chain.append(chain[-1][part])
    chain[-1].pop(parts[-1], None)
    for depth in range(len(parts) - 1, 0, -1):
        if chain[depth]:
            break
        chain[depth - 1].pop(parts[depth - 1], None)


def _fmt(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


class _Context:
    """The state one :func:`apply_verl_keys` call works on: the config, every verl key found and the report."""

    def __init__(self, cfg: dict, found: dict[str, object], given: frozenset = frozenset(), set_by_user=None):
        self.cfg, self.found, self.report, self.given, self.set_by_user = cfg, found, Report(), given, set_by_user

    @property
    def device(self) -> str:
        return str(_get(self.cfg, "trainer.device", "cpu"))

    def warn(self, key: str, value, text: str) -> None:
        self.report.warnings.append(f"{key}={_fmt(value)}: {text}")

    def note(self, key: str, value, text: str) -> None:
        self.report.notes.append(f"{key}={_fmt(value)}: {text}")

    def error(self, key: str, value, text: str) -> None:
        self.report.errors.append(f"{key}={_fmt(value)}: {text}")

    def read_as(self, key: str, value, target: str, quiet: bool = False, written=_MISSING) -> bool:
        """Set ``target`` to the verl key's ``value`` (False, and an error naming both, when the user also set
        ``target`` to another value: on the command line, or away from every value configs/ ships). ``written``:
        the verl key's value as the user wrote it, when ``value`` is its translation (shown in the error)."""
        if self.contradicts(key, value, target, written):
            return False
        _set(self.cfg, target, value)
        (self.note if quiet else self.warn)(key, value, f"read as {target}={_fmt(value)}")
        return True

    def contradicts(self, key: str, value, target: str, written=_MISSING) -> bool:
        """Whether ``target`` was set by the user to a value other than ``value`` (an error line naming both, with
        the verl key's value as ``written``, else ``value``)."""
        from trainer.config_reads import plain

        run = plain(self.cfg)
        now = _get(run, target, _MISSING)
        if now is _MISSING or same_value(now, value):
            return False
        if target not in self.given and not (self.set_by_user and self.set_by_user(run, target, now)):
            return False
        self.error(key, value if written is _MISSING else written,
                   f"contradicts {target}={_fmt(now)} (the same setting under verl's name); give one of the two, "
                   "or the same value to both")
        return True


def _offload(ctx: _Context, key: str, value, target: str) -> None:
    """``actor.fsdp_config.param_offload / optimizer_offload=true`` onto the deepspeed group."""
    if not value:
        return
    if ctx.device == "cpu":
        return ctx.warn(key, value, "no effect with trainer.device=cpu (the weights and optimizer state are in host "
                                    "memory already)")
    ds = ctx.cfg["deepspeed"]
    from trainer.config.deepspeed import effective_zero_stage

    stage = effective_zero_stage(ds)
    _set(ctx.cfg, target, True)
    extra = ""  # below ZeRO-3, unused_setting_warnings says that offload_param has no effect
    if target.endswith("offload_optimizer"):
        extra = "" if stage >= 1 else " (ZeRO-Offload needs ZeRO stage >= 1: add deepspeed=zero2)"
        if ds["optimizer"] == "torch_adamw":
            ds["optimizer"] = "deepspeed_adamw"
            extra = " with deepspeed.optimizer=deepspeed_adamw (DeepSpeedCPUAdam; ZeRO-Offload refuses torch's " \
                    "AdamW)" + extra
    ctx.warn(key, value, f"read as {target}=true{extra}")


def _same_offload(ctx: _Context, key: str, value, target: str) -> None:
    what = "offload_param" if key.endswith("param_offload") else "offload_optimizer"
    if value and ctx.device == "cpu":
        return ctx.warn(key, value, "no effect with trainer.device=cpu (the weights and optimizer state are in "
                                    "host memory already)")
    current = bool(ctx.cfg["deepspeed"].get(what)) and ctx.device != "cpu"
    if bool(value) == current:
        return ctx.note(key, value, f"follows deepspeed.{what}={_fmt(current)}")
    ctx.warn(key, value, f"ignored: every role follows deepspeed.{what}={_fmt(current)} (one DeepSpeed setting for "
                         "the whole run; set it with actor_rollout_ref.actor.fsdp_config.* or deepspeed.*)")


def _strategy(ctx: _Context, key: str, value, target: str) -> None:
    role = key.rsplit(".", 1)[0]
    if value in ("fsdp", "fsdp2"):
        return ctx.warn(key, value, "training runs with DeepSpeed ZeRO here (the deepspeed group: zero1|zero2|zero3)")
    if value != "megatron":
        return ctx.error(key, value, "expected fsdp, fsdp2 or megatron (fsdp: DeepSpeed ZeRO here)")
    if role == "actor_rollout_ref.actor":
        return ctx.read_as(key, value, "trainer.strategy")
    if role == "actor_rollout_ref.ref":
        return ctx.note(key, value, "the reference model follows the actor (trainer.strategy)")
    ctx.error(key, value, "the Megatron path has no critic or reward-model worker; leave it at fsdp (DeepSpeed)")


def _grad_clip(ctx: _Context, key: str, value, target: str) -> None:
    role = key[: -len(".optim.clip_grad")]
    ctx.read_as(key, value, f"{role}.optim.grad_clip" if role.startswith("reward_model") else f"{role}.grad_clip",
                quiet=True)


def _warmup_style(ctx: _Context, key: str, value, target: str) -> None:
    if value not in ("constant", "cosine"):
        return ctx.error(key, value, "expected constant or cosine (use optim.lr_scheduler_type)")
    ctx.read_as(key, value, key.replace("warmup_style", "lr_scheduler_type"), quiet=True)


def _max_samples(ctx: _Context, key: str, value, target: str) -> None:
    every = value is None or int(value) < 0
    if ctx.read_as(key, None if every else value, target, quiet=True, written=value) and every:
        _set(ctx.cfg, target, None)


def _max_resp_len(ctx: _Context, key: str, value, target: str) -> None:
    want = int(_get(ctx.cfg, "data.max_response_length"))
    if value is not None and int(value) != want:
        ctx.error(key, value, f"the overlong penalty counts up to data.max_response_length={want}; set the two equal")


def _prime(cfg: dict) -> bool:
    from trainer.hooks.prime import prime_enabled

    return prime_enabled(cfg)


def _reward_model_enable(ctx: _Context, key: str, value, target: str) -> None:
    if _prime(ctx.cfg):
        return ctx.note(key, value, "the PRM of algorithm=prime is the reward model")
    ctx.error(key, value, target)


def _prm_max_token_len(ctx: _Context, key: str, value, target: str) -> None:
    if not _prime(ctx.cfg):
        return ctx.warn(key, value, "ignored: there is no reward-model worker without algorithm=prime")
    ctx.read_as(key, value, "reward_model.max_token_len_per_gpu", quiet=True)


def _sum_pi_squared(ctx: _Context, key: str, value, target: str) -> None:
    from trainer.adv_inputs import log_prob_pass_columns

    est = _get(ctx.cfg, "algorithm.adv_estimator")
    if "sum_pi_squared" in log_prob_pass_columns(ctx.cfg):
        return ctx.note(key, value, f"computed: algorithm.adv_estimator={est} reads it")
    ctx.warn(key, value, f"ignored: sum_pi_squared is computed only for an estimator that reads it "
                         f"(optimal_token_baseline), not for algorithm.adv_estimator={est}")


RULES = {"deepspeed.offload_param": _offload, "deepspeed.offload_optimizer": _offload, "same_offload": _same_offload,
         "strategy": _strategy, "grad_clip": _grad_clip, "warmup_style": _warmup_style, "data.max_rows": _max_samples,
         "data.val_max_rows": _max_samples, "max_resp_len": _max_resp_len,
         "reward_model_enable": _reward_model_enable, "prm_max_token_len": _prm_max_token_len,
         "sum_pi_squared": _sum_pi_squared}


def _vllm_arg(ctx: _Context, key: str, value, entry: VerlKey) -> None:
    if _get(ctx.cfg, f"{R}.name") != "vllm":
        return ctx.warn(key, value, "ignored: an argument of vllm.LLM, and this run generates with "
                                      f"{R}.name=hf")
    rel = key[len(R) + 1:]
    rel = rel[len("engine_kwargs.vllm."):] if rel.startswith("engine_kwargs.vllm.") else rel
    if rel == "cudagraph_capture_sizes":
        rel = "compilation_config.cudagraph_capture_sizes"
    if rel != "engine_kwargs.vllm":  # an empty engine_kwargs.vllm dict adds nothing
        _set(ctx.cfg, f"{R}.engine_kwargs.vllm.{rel}", value)
        ctx.note(key, value, f"passed to vllm.LLM as {rel}={_fmt(value)}")


def _apply_one(ctx: _Context, key: str, value, entry: VerlKey) -> None:
    if any(same_value(value, ok) for ok in entry.ok):
        return
    if entry.kind == "ignore":
        ctx.warn(key, value, f"ignored: {entry.note}")
    elif entry.kind == "refuse":
        ctx.error(key, value, f"not supported: {entry.note}")
    elif entry.kind in ("map", "alias"):
        target = entry.target
        if entry.pattern.endswith(".**") and key.startswith(entry.pattern[:-3]):  # a subtree: keep the path below
            target += key[len(entry.pattern) - 3:]
        elif isinstance(_get(ctx.cfg, target), dict):
            target = f"{target}.{key.rsplit('.', 1)[1]}"
        ctx.read_as(key, value, target, quiet=entry.kind == "alias")
    elif entry.kind == "vllm":
        _vllm_arg(ctx, key, value, entry)
    elif entry.kind == "rule":
        RULES[entry.target](ctx, key, value, entry.note if entry.target == "reward_model_enable" else entry.target)
    else:
        raise ValueError(f"verl key table: unknown kind {entry.kind!r} of {entry.pattern!r}")


def apply_verl_keys(cfg: dict, given=(), set_by_user=None) -> Report:
    """Handle every key of ``cfg`` (a resolved config, changed in place) that matches :data:`VERL_KEYS`.

    The matched keys are removed; mappings set this framework's keys; ``warnings`` say what is ignored and why;
    ``errors`` (one line each, naming key and value) say what to use instead. Entries are applied in table order,
    so that a rule may rely on the ones above it (the reference model's offload follows the actor's). A verl key
    mapped onto a key the user also set to another value is an error naming both: a key of ``given`` (the command
    line's keys), or one for which ``set_by_user(run, key, value)`` is true
    (:func:`trainer.unused_settings.set_by_user`: away from every value configs/ ships).
    """
    from trainer.config_reads import plain

    found = {key: value for key, value in leaves(plain(cfg)) if match(key) is not None}  # a walk that reads nothing
    ctx = _Context(cfg, found, frozenset(given), set_by_user)
    for key in found:
        _pop(cfg, key)
    order = {e.pattern: i for i, e in enumerate(VERL_KEYS)}
    for key, value in sorted(found.items(), key=lambda kv: order[match(kv[0]).pattern]):
        _apply_one(ctx, key, value, match(key))
    return ctx.report


def command_line_keys() -> set[str]:
    """The dotted keys the run's command line set (Hydra's task overrides); empty outside a Hydra app."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    return {o.lstrip("+~").partition("=")[0] for o in HydraConfig.get().overrides.task}


def override_errors(key: str, value) -> list[str]:
    """Errors a command-line override ``key=value`` of a ``refuse`` entry gives before composition (the value
    as Hydra parsed it); [] for every other key."""
    out = []
    for leaf, v in leaves(value, key) if isinstance(value, dict) and value else [(key, value)]:
        entry = match(leaf)
        if entry is not None and entry.kind == "refuse" and not any(same_value(v, ok) for ok in entry.ok):
            out.append(f"{leaf}={_fmt(v)}: not supported: {entry.note}")
    return out


# ---- the README table ---------------------------------------------------------------------------------------------
_KIND_TEXT = {"map": "mapped", "alias": "same meaning", "ignore": "ignored (warning)", "refuse": "refused",
              "vllm": "vLLM argument", "rule": "mapped"}


def markdown_table() -> str:
    """The "Coming from verl" key table: one row per entry of :data:`VERL_KEYS` (pattern, handling, reason)."""
    rows = ["| verl key | here | what happens |", "|---|---|---|"]
    for e in VERL_KEYS:
        kind = _KIND_TEXT[e.kind]
        if e.kind in ("map", "alias"):
            kind += f": `{e.target}`"
        elif e.kind == "rule" and "." in (e.target or ""):
            kind += f": `{e.target}`"
        if e.ok:
            kind += " (silent for " + ", ".join(f"`{_fmt(v)}`" for v in e.ok) + ")"
        rows.append(f"| `{e.pattern}` | {kind} | {e.note.replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m trainer.verl_compat --markdown")
    print(markdown_table())
