"""The transformers engine on the trainer's own tensors (HFRolloutEngine.share_weights): the same samples as an engine
holding a copy, the trainer's later in-place updates seen without a sync, nothing moved by sleep/wake, a later
load_weights never writing into the trainer's tensors; rollout_mode hands the weights over in one call and keeps
PyTorch's cache for an engine that allocates from it."""
import pytest
import torch

from rollout import memory
from rollout.base import SamplingConfig
from rollout.context import iter_actor_params, rollout_mode
from rollout.hf_engine import HFRolloutEngine


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, eos_token_id=1)


def _actor():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(_config())


def _engine(actor=None):
    eng = HFRolloutEngine(_config(), pad_token_id=0, device="cpu", dtype=torch.float32)
    if actor is not None:
        eng.load_weights(actor.named_parameters())
    return eng


def _sample(eng):
    out = eng.generate([[5, 6, 7], [8, 9]], SamplingConfig(n=2, max_new_tokens=6, temperature=1.0, seed=3))
    return out.responses, out.rollout_log_probs


def test_shared_engine_samples_as_a_copy_and_sees_in_place_updates():
    actor = _actor()
    shared = _engine()
    shared.share_weights(actor.named_parameters())
    ptrs = {n: p.data_ptr() for n, p in actor.named_parameters()}
    assert {n: p.data_ptr() for n, p in shared.model.named_parameters() if n in ptrs} == ptrs  # no copy
    for got, want in zip(_sample(shared), _sample(_engine(actor))):
        assert torch.equal(got, want)
    with torch.no_grad():  # an optimizer step of the trainer: in place
        for p in actor.parameters():
            p.add_(0.05 * torch.randn_like(p))
    for got, want in zip(_sample(shared), _sample(_engine(actor))):  # no sync in between
        assert torch.equal(got, want)


def test_share_refuses_partial_or_mismatched_weights_and_changes_nothing():
    actor, eng = _actor(), _engine()
    before = {n: p.data_ptr() for n, p in eng.model.named_parameters()}
    pairs = list(actor.named_parameters())
    with pytest.raises(ValueError, match="parameters not given"):
        eng.share_weights(pairs[:-1])
    with pytest.raises(ValueError, match="are not torch.float32 on cpu"):
        eng.share_weights([(n, p.double()) for n, p in pairs])
    with pytest.raises(KeyError, match="unknown parameter"):
        eng.share_weights([("nope", pairs[0][1])])
    assert {n: p.data_ptr() for n, p in eng.model.named_parameters()} == before and not eng._shared


def test_sleep_and_wake_move_nothing_while_shared_and_load_weights_takes_own_storage(monkeypatch):
    actor = _actor()
    eng = _engine()
    eng.share_weights(actor.named_parameters())
    moves = []
    monkeypatch.setattr(eng.model, "to", lambda *a, **k: moves.append(a))
    eng.device = torch.device("cuda")  # as on a GPU; nothing is allocated while the engine is shared
    eng.sleep(level=1)
    eng.wake_up(["weights", "kv_cache"])
    assert moves == []
    eng.device = torch.device("cpu")
    saved = {n: p.detach().clone() for n, p in actor.named_parameters()}
    other = {n: torch.full_like(p, 0.5) for n, p in actor.named_parameters()}
    eng.load_weights(other.items())  # a copy: into the engine's own storage, not the actor's
    assert all(torch.equal(p, saved[n]) for n, p in actor.named_parameters())
    assert all(torch.equal(p, other[n]) for n, p in eng.model.named_parameters() if n in other)
    eng.device = torch.device("cuda")
    eng.sleep(level=1)
    assert moves == [("cpu",)]  # its own weights again: they go to the CPU


def test_rollout_mode_shares_in_one_call_and_keeps_the_torch_cache(monkeypatch):
    released = []
    monkeypatch.setattr(memory, "empty_cache", lambda: released.append(1))
    actor, eng = _actor(), _engine()
    calls = []
    eng.load_weights = lambda pairs: calls.append(("load", len(list(pairs))))
    share = eng.share_weights
    eng.share_weights = lambda pairs: (calls.append(("share", len(pairs))), share(pairs))
    with rollout_mode(eng, lambda: iter_actor_params(actor, 0, 4096), 4096, share_weights=True):
        pass
    assert calls == [("share", len(list(actor.named_parameters())))] and released == []
    with rollout_mode(eng, lambda: iter_actor_params(actor, 0, 4096), 4096):  # the bucketed copy
        pass
    assert [c[0] for c in calls[1:]] and all(c[0] == "load" for c in calls[1:]) and released == []
