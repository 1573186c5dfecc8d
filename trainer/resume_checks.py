"""A resume continues the checkpoint's optimizer: DeepSpeed restores each param group's ``lr``, ``betas`` and
``weight_decay`` (and the LR scheduler its base learning rates) from the checkpoint, so a new value of those keys on
the command line would have no effect. :func:`check_resume_optim` refuses such a value before start-up, naming the key,
the value and the checkpoint's (the run config each checkpoint keeps in its ``data.pt``). Likewise the data loader's
saved position (epoch, batch index) indexes the checkpoint's row order: :func:`check_resume_data` refuses a changed
key that decides which rows the loader yields, in which order and how many per batch (before start-up), and
:func:`check_resume_rows` rows that differ from the checkpoint's for another reason (the same file names with other
contents, another tokenizer that filters other prompts), once the dataset is built and before any worker starts. Where
the checkpoint keeps its rows' fingerprint, the rows decide for the keys that only filter them (:data:`ROW_FILTER_KEYS`):
a change that leaves the same rows resumes, with a note naming it."""
from __future__ import annotations

import logging
import math
import os

from trainer.config.trainer import run_strategy
from trainer.config_checks import ConfigError, as_int
from trainer.run_roles import critic_on, trained_roles  # noqa: F401 (trained_roles re-exported)

logger = logging.getLogger(__name__)

__all__ = ["DATA_FILTER_KEYS", "DATA_ORDER_KEYS", "RESTORED_OPTIM_KEYS", "ROW_FILTER_KEYS", "SCHEDULE_KEYS",
           "check_resume_checkpoint",
           "check_resume_data", "check_resume_model", "check_resume_optim", "check_resume_rows",
           "resume_seed_warnings"]

#: the ``optim`` keys whose values a resume takes from the checkpoint (the optimizer's param groups)
RESTORED_OPTIM_KEYS = ("lr", "weight_decay", "betas")
#: the ``optim`` keys of the learning-rate schedule: a resume follows the new values from its step on (a warning)
SCHEDULE_KEYS = ("lr_scheduler_type", "lr_warmup_steps", "lr_warmup_steps_ratio", "min_lr_ratio", "num_cycles")
#: the ``data`` keys that fix which rows the saved loader position points at, as ``trainer.launch.build_data`` reads
#: them: the rows (``train_files``; the first ``max_rows``; ``prompt_key``, whose rows without a prompt are skipped),
#: their order (``shuffle``, ``seed``) and the batch size (``train_batch_size``, ``gen_batch_size`` with dynamic
#: sampling, PRIME's ``oversample_factor``). ``train_files`` is compared when the run names files (null: the embedded
#: task, generated from ``seed`` and ``synthetic_task``, compared instead) and the checkpoint holds no fingerprint of
#: its rows (with one, the rows are compared instead of the paths: :func:`check_resume_rows`)
DATA_ORDER_KEYS = ("seed", "shuffle", "train_batch_size", "gen_batch_size", "train_files", "max_rows", "prompt_key",
                   "oversample_factor")
#: the ``data`` keys that decide which prompts the overlong filter drops (``trainer.dataset.PromptDataset``: a prompt
#: of more than ``max_prompt_length`` tokens, counted after the chat template with its kwargs and a row's images);
#: compared when either run filters (``filter_overlong_prompts``; without it the rows stay, cut or refused)
DATA_FILTER_KEYS = ("filter_overlong_prompts", "max_prompt_length", "apply_chat_template_kwargs", "image_key")
#: the ``data`` keys that only decide which rows of the files stay (the first ``max_rows``, the overlong filter): with
#: the checkpoint's row fingerprint the rows built are compared instead (:func:`check_resume_rows`), so a change that
#: keeps the same rows (a larger ``max_prompt_length`` where no prompt was longer, ``max_rows`` beyond the rows there
#: are) resumes; without one, the values are compared
ROW_FILTER_KEYS = ("max_rows", *DATA_FILTER_KEYS)
def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _optim(cfg: dict, path: tuple) -> dict | None:
    node = cfg
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node.get("optim") if isinstance(node, dict) else None


def _saved_state(step_dir: str) -> dict:
    """The trainer state the checkpoint at ``step_dir`` keeps in its ``data.pt``; empty when the file is missing
    (reported by :func:`check_resume_checkpoint`)."""
    import torch

    state_file = os.path.join(step_dir, "data.pt")
    if not os.path.isfile(state_file):
        return {}
    state = torch.load(state_file, map_location="cpu", weights_only=True)
    return state if isinstance(state, dict) else {}


def _saved_config(step_dir: str) -> dict | None:
    """The run config the checkpoint at ``step_dir`` keeps in its ``data.pt``; None when it holds none (or the file
    is missing: reported by :func:`check_resume_checkpoint`)."""
    saved_cfg = _saved_state(step_dir).get("config")
    return saved_cfg if isinstance(saved_cfg, dict) else None


def _has_fingerprint(state: dict) -> bool:
    """The checkpoint's loader state holds the rows' fingerprint (:meth:`trainer.dataset.PromptDataset.fingerprint`),
    which :func:`check_resume_rows` compares with the rows this run builds."""
    loader = state.get("dataloader")
    return isinstance(loader, dict) and "rows" in loader


def _files(value) -> list[str] | None:
    if value is None:
        return None
    return [os.path.normpath(os.path.expanduser(str(f))) for f in ([value] if isinstance(value, str) else value)]


def _plain_value(key: str, value):
    if key == "train_files":
        return _files(value)
    if key == "apply_chat_template_kwargs":
        return dict(value or {})
    return value


def _loader_batch(cfg: dict):
    """The prompts per loader batch that ``cfg`` builds: ``trainer.launch.build_data`` (``gen_batch_size`` with
    dynamic sampling, else ``train_batch_size``), then PRIME's loader (``round(train_batch_size *
    oversample_factor)``, :meth:`trainer.hooks.prime.PrimeHook.wrap_loader`)."""
    d, algo = cfg.get("data") or {}, cfg.get("algorithm") or {}
    if algo.get("use_prime"):
        return round(float(d.get("train_batch_size") or 0) * float(d.get("oversample_factor") or 1.0))
    if (algo.get("filter_groups") or {}).get("enable"):
        return d.get("gen_batch_size") or d.get("train_batch_size")
    return d.get("train_batch_size")


def _follows_train_batch(d: dict) -> bool:
    return d.get("gen_batch_size") in (None, d.get("train_batch_size"))


def _key_diffs(now: dict, saved: dict, keys) -> list[str]:
    """``data.<key>=<now> (checkpoint: <saved>)`` for each of ``keys`` that both ``data`` sections hold and that
    differs."""
    return [f"data.{k}={now[k]!r} (checkpoint: {saved[k]!r})" for k in keys
            if k in now and k in saved and not _same(_plain_value(k, now[k]), _plain_value(k, saved[k]))]


def _row_filter_diffs(now: dict, saved: dict) -> list[str]:
    """The :data:`ROW_FILTER_KEYS` that differ between the ``data`` sections ``now`` and ``saved`` (as
    :func:`_key_diffs`): ``max_rows`` always, the overlong filter's keys when either run filters (without the filter
    the rows stay, cut or refused)."""
    filters = now.get("filter_overlong_prompts") or saved.get("filter_overlong_prompts")
    return _key_diffs(now, saved, ["max_rows", *(DATA_FILTER_KEYS if filters else ())])


def _data_diffs(cfg: dict, saved_cfg: dict, fingerprinted: bool = False) -> list[str]:
    """``<key>=<now> (checkpoint: <saved>)`` for each key of the loader's rows, order and batch size that differs.
    ``fingerprinted``: the checkpoint holds its rows' fingerprint, so neither ``train_files`` (as path text: the same
    rows under another path, a moved or copied folder, resume) nor the keys that only filter rows
    (:data:`ROW_FILTER_KEYS`) are compared: :func:`check_resume_rows` compares the rows themselves.
    ``gen_batch_size`` following ``train_batch_size`` in both (the default interpolation) is not named beside it."""
    now, saved = cfg.get("data") or {}, saved_cfg.get("data")
    if not isinstance(saved, dict):
        return []
    keys = [k for k in DATA_ORDER_KEYS if k not in ROW_FILTER_KEYS
            and not (k == "train_files" and (now.get(k) is None or fingerprinted))
            and not (k == "gen_batch_size" and _follows_train_batch(now) and _follows_train_batch(saved))]
    if now.get("train_files") is None:  # the embedded task: its rows come from data.seed and the task's name
        keys.append("synthetic_task")
    diffs = _key_diffs(now, saved, keys) + ([] if fingerprinted else _row_filter_diffs(now, saved))
    if _loader_batch(cfg) != _loader_batch(saved_cfg):  # also decided by the algorithm: name what changed there
        algo_now, algo_saved = cfg.get("algorithm") or {}, saved_cfg.get("algorithm") or {}
        flags = {"algorithm.filter_groups.enable": lambda a: bool((a.get("filter_groups") or {}).get("enable")),
                 "algorithm.use_prime": lambda a: bool(a.get("use_prime"))}
        diffs += [f"{key}={get(algo_now)!r} (checkpoint: {get(algo_saved)!r})" for key, get in flags.items()
                  if get(algo_now) != get(algo_saved)]
    return diffs


_DATA_ADVICE = ("the checkpoint's data-loader position counts batches of its own row order, so rows would repeat or "
                "be skipped; resume with the checkpoint's values, or start a new run from its HF export "
                "(tools/export_hf.py)")


def check_resume_data(cfg: dict, step_dir: str) -> None:
    """Every key that decides which rows the data loader yields, in which order and how many per batch
    (:data:`DATA_ORDER_KEYS`; :data:`DATA_FILTER_KEYS` when a run filters overlong prompts; dynamic sampling and
    PRIME when they change the batch size) equals the checkpoint's: the saved loader position (epoch, batch index)
    would otherwise point into another row order, so rows would be seen twice or skipped in the resumed epoch (a
    checkpoint without a saved config is not compared). For a checkpoint that holds its rows' fingerprint,
    ``data.train_files`` (as paths) and the keys that only filter rows (:data:`ROW_FILTER_KEYS`) are left to
    :func:`check_resume_rows`, which compares the rows built: the same file under a relative path, a symlinked,
    moved or copied folder, a larger ``max_prompt_length`` that filters no row resume.

    Raises:
        ConfigError: one message naming each differing key and both values.
    """
    state = _saved_state(step_dir)
    saved_cfg = state.get("config")
    diffs = _data_diffs(cfg, saved_cfg if isinstance(saved_cfg, dict) else {}, _has_fingerprint(state))
    if diffs:
        raise ConfigError(f"trainer.resume_mode: {', '.join(diffs)}: {_DATA_ADVICE}")


def check_resume_rows(step_dir: str, dataset, files=None, cfg: dict | None = None) -> None:
    """The training rows built for this run (``dataset``: a :class:`trainer.dataset.PromptDataset`) are the
    checkpoint's: as many, and the same prompts at the rows its fingerprint samples
    (:meth:`~trainer.dataset.PromptDataset.fingerprint`, saved with the loader position). Catches what the config keys
    cannot show (:func:`check_resume_data`): a data file rewritten under the same name, another tokenizer or chat
    template that filters other prompts; and decides for a changed key of :data:`ROW_FILTER_KEYS` (``cfg``: this
    run's config, compared with the checkpoint's): the same rows resume, with one log line naming the change. A
    checkpoint saved without a fingerprint is not compared.

    Raises:
        ConfigError: one line naming the changed filter keys (else ``data.train_files``), the row counts or that the
            prompts differ.
    """
    state = _saved_state(step_dir)
    saved = state.get("dataloader") or {}
    if "rows" not in saved:
        return
    saved_data = (state.get("config") or {}).get("data") if isinstance(state.get("config"), dict) else None
    changed = _row_filter_diffs(cfg.get("data") or {}, saved_data) if cfg and isinstance(saved_data, dict) else []
    now = dataset.fingerprint()
    if int(saved["rows"]) != now["rows"]:
        what = f"{now['rows']} training rows (checkpoint: {int(saved['rows'])})"
    elif saved.get("rows_digest") not in (None, now["rows_digest"]):
        what = f"the same number of training rows ({now['rows']}) but other prompts"
    else:
        if changed:
            logger.info("trainer.resume_mode: %s: the same %d training rows as the checkpoint's, so its data-loader "
                        "position holds; resuming", ", ".join(changed), now["rows"])
        return
    files = _files(files if files is not None else getattr(dataset, "files", None)) or []
    subject = ", ".join(changed) if changed else f"data.train_files={files!r}"
    raise ConfigError(f"trainer.resume_mode: {subject} gives {what}: {_DATA_ADVICE}")


def _optim_diffs(cfg: dict, step_dir: str, keys: tuple[str, ...]) -> list[str]:
    """``<role>.optim.<key>=<now> (checkpoint: <saved>)`` for each of ``keys`` whose value differs from the one the
    checkpoint at ``step_dir`` was saved with, over the trained roles (actor; critic when on; PRIME's PRM). A
    warmup or horizon of -1 (planned later) is not compared: the checkpoint holds the number it was planned to."""
    saved_cfg = _saved_config(step_dir)
    if saved_cfg is None:
        return []
    diffs = []
    for key, path in trained_roles(cfg):
        now, saved = _optim(cfg, path), _optim(saved_cfg, path)
        if not isinstance(now, dict) or not isinstance(saved, dict):
            continue
        diffs += [f"{key}.optim.{k}={now[k]!r} (checkpoint: {saved[k]!r})" for k in keys
                  if k in now and k in saved and not _same(now[k], saved[k])
                  and not (k in ("lr_warmup_steps", "total_training_steps") and isinstance(now[k], int)
                           and now[k] < 0)]
    return diffs


def resume_seed_warnings(cfg: dict, step_dir: str) -> list[str]:
    """One warning line when a resume changes ``trainer.seed``: the seeds of the rollouts' sampling after the resumed
    step come from it, so the run goes on, but not as the run the checkpoint belongs to would have (a changed seed
    on purpose is a use). A checkpoint whose ``data.pt`` holds no config is not compared."""
    saved_cfg = _saved_config(step_dir)
    now, saved = (c.get("trainer", {}).get("seed") if isinstance(c, dict) else None for c in (cfg, saved_cfg))
    if saved is None or now is None or _same(now, saved):
        return []
    return [f"trainer.resume_mode: trainer.seed={now!r} (checkpoint: {saved!r}): the sampling after the resumed step "
            "follows the new seed, so the run is not the one the checkpoint's run would have continued"]


def check_resume_optim(cfg: dict, step_dir: str) -> None:
    """The optimizer settings of every trained role (actor; critic when on; PRIME's PRM) equal those the checkpoint at
    ``step_dir`` was saved with (a checkpoint whose ``data.pt`` holds no config is not compared).

    Raises:
        ConfigError: one line per differing key is joined into one message naming each key and both values.
    """
    diffs = _optim_diffs(cfg, step_dir, RESTORED_OPTIM_KEYS)
    if diffs:
        raise ConfigError(f"trainer.resume_mode: {', '.join(diffs)}: a resume restores the checkpoint's optimizer "
                          "settings, so the new value would be ignored; resume with the checkpoint's values, "
                          "or start a new run from its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")


def check_resume_checkpoint(cfg: dict, path: str) -> None:
    """The checkpoint at ``path`` (``.../global_step_<N>``) was written by this run's strategy and, for Megatron,
    with this run's tensor/pipeline/data-parallel sizes (read from ``actor/meta.pt``).

    A DeepSpeed role folder holds DeepSpeed's ``latest`` tag file; a Megatron one holds ``meta.pt``.

    Raises:
        ConfigError: naming the checkpoint, what wrote it and what this run would need.
    """
    actor = os.path.join(path, "actor")
    if os.path.isfile(os.path.join(actor, "meta.pt")):
        written = "megatron"
    elif os.path.isfile(os.path.join(actor, "latest")):
        written = "deepspeed"
    else:
        role = any(os.path.isfile(os.path.join(path, f)) for f in ("latest", "meta.pt"))  # a role folder was named
        raise ConfigError(f"trainer.resume_mode: {actor!r} holds neither a DeepSpeed (latest) nor a Megatron "
                          "(meta.pt) actor checkpoint" + (f"; {path!r} is a role folder: name its step folder "
                                                          f"{os.path.dirname(path)!r}" if role else ""))
    _check_checkpoint_files(cfg, path)
    strategy = run_strategy(cfg)
    if written != strategy:
        raise ConfigError(f"trainer.resume_mode: {path!r} is a {written} checkpoint but trainer.strategy={strategy}; "
                          f"resume with trainer.strategy={written}, or start from its HF export "
                          "(tools/export_hf.py) as actor_rollout_ref.model.path")
    if written == "deepspeed":
        _check_engine_settings(cfg, path)
    if written == "megatron":
        import torch

        meta = torch.load(os.path.join(actor, "meta.pt"), map_location="cpu", weights_only=True)
        if meta.get("ckpt_format", "torch") == "torch_dist":
            return  # a dist checkpoint reshards to this run's tensor/pipeline/data-parallel sizes on load
        m = cfg["actor_rollout_ref"]["actor"]["megatron"]
        tp = as_int(m["tensor_model_parallel_size"], "tensor_model_parallel_size", 1)
        pp = as_int(m["pipeline_model_parallel_size"], "pipeline_model_parallel_size", 1)
        world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
        want = {"tp_size": tp, "pp_size": pp, "dp_size": world // (tp * pp)}
        saved = {k: int(meta[k]) for k in want}
        if saved != want:
            raise ConfigError(f"trainer.resume_mode: {path!r} (ckpt_format=torch) was saved with {saved} but this "
                              f"run has {want}; resume with the same tensor/pipeline sizes and worker count, or "
                              "start from its HF export (tools/export_hf.py) as actor_rollout_ref.model.path")


def _check_engine_settings(cfg: dict, path: str) -> None:
    """The actor's (and, when on, the critic's) DeepSpeed folder was saved with this run's ZeRO stage and LoRA
    setting (its client state: :func:`trainer.checkpoint.deepspeed_manager.read_client_state`); the worker's load
    refuses either difference, so it is named here, before the workers start. Then each role's optimizer and
    precision (PRIME's PRM too): :func:`trainer.resume_engine.check_engine_layout`."""
    from trainer.checkpoint.deepspeed_manager import read_client_state
    from trainer.config.deepspeed import effective_zero_stage

    if cfg.get("deepspeed") is None:
        return
    stage = effective_zero_stage(cfg["deepspeed"])
    roles = {"actor": ("actor_rollout_ref.model", cfg["actor_rollout_ref"]["model"])}
    if critic_on(cfg):
        roles["critic"] = ("critic.model", cfg["critic"]["model"])
    for role, (key, model) in roles.items():
        try:
            saved = read_client_state(os.path.join(path, role))
        except (OSError, RuntimeError, ValueError):  # nothing recorded to compare: the worker's load judges it
            continue
        if saved.get("zero_stage") is not None and int(saved["zero_stage"]) != stage:
            raise ConfigError(f"trainer.resume_mode: {path!r} ({role}) was saved with ZeRO stage {saved['zero_stage']} "
                              f"but this run trains with stage {stage} (deepspeed.zero_stage); resume with "
                              f"deepspeed=zero{saved['zero_stage']}, or start a new run from its HF export "
                              "(tools/export_hf.py) as actor_rollout_ref.model.path")
        rank = int(model.get("lora_rank") or 0)
        if saved.get("lora") is not None and bool(saved["lora"]) != (rank > 0):
            was = "with LoRA adapters" if saved["lora"] else "without LoRA adapters (every weight trained)"
            raise ConfigError(f"trainer.resume_mode: {path!r} ({role}) was saved {was} but {key}.lora_rank={rank}; "
                              f"resume with the checkpoint's {key}.lora_rank, or start a new run from its HF export "
                              "(tools/export_hf.py) as actor_rollout_ref.model.path")
    from trainer.run_roles import prime_enabled
    from trainer.resume_engine import check_engine_layout

    check_engine_layout(cfg, path, [*roles, *(["reward"] if prime_enabled(cfg) else [])], _saved_config(path))


def _check_checkpoint_files(cfg: dict, path: str) -> None:
    """The step folder holds the trainer state and a folder for each role this run loads (actor; critic when it is
    on; PRIME's reward model), every DeepSpeed role folder holds each saving rank's files (model states, optimizer
    shard, RNG state), and no file of it is cut short (:func:`trainer.checkpoint.verify.verify_step_folder`): a
    missing or short file is named here, before start-up. ``resume_mode=auto`` has already stepped back to the
    newest complete step when there is one (:func:`trainer.checkpoint.resume.resolve_resume_path`); a path named
    explicitly is refused as it is."""
    from trainer.checkpoint.verify import verify_step_folder
    from trainer.run_roles import prime_enabled

    roles = ["actor", *(["critic"] if critic_on(cfg) else []), *(["reward"] if prime_enabled(cfg) else [])]
    world = int(cfg["trainer"]["nnodes"]) * int(cfg["trainer"]["n_gpus_per_node"])
    try:
        verify_step_folder(path, roles, world)
    except ValueError as exc:
        raise ConfigError(f"trainer.resume_mode: {exc}") from exc


def check_resume_model(path: str, hf: dict) -> None:
    """The actor checkpoint at ``path`` (``.../global_step_<N>``) holds the model this run builds: its saved
    ``actor/huggingface/config.json`` agrees with ``hf`` (the run's model config as a dict) on every field of
    ``trainer.megatron.config.MODEL_CONFIG_KEYS`` that both set. Checkpoints saved without a config pass.

    Raises:
        ConfigError: naming the checkpoint and the first differing field with both values.
    """
    import json

    from trainer.megatron.config import model_config_difference

    saved = os.path.join(path, "actor", "huggingface", "config.json")
    if not os.path.isfile(saved):
        return
    with open(saved, encoding="utf-8") as f:
        diff = model_config_difference(json.load(f), hf)
    if diff:
        raise ConfigError(f"trainer.resume_mode: {path!r} holds another model than actor_rollout_ref.model: {diff}")
