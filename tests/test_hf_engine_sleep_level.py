"""The transformers engine's sleep levels: level 1 keeps its own weights (moved to the CPU on a GPU), level 2
discards them (no copy either way) and refuses to generate until the weights are loaded again; the trainer's
rollout_mode loads them after every wake-up, so a level-2 engine samples exactly what a level-1 engine does."""
import pytest
import torch

from rollout.base import SamplingConfig
from rollout.context import iter_actor_params, rollout_mode
from tests.test_shared_weights import _actor, _engine

PROMPTS = [[3, 4, 5], [6, 7]]


def _sample(eng, actor, level):
    with rollout_mode(eng, lambda: iter_actor_params(actor, 0, 4096), 4096, sleep_level=level):
        return eng.generate(PROMPTS, SamplingConfig(n=2, do_sample=False, max_new_tokens=5))


def test_level_two_frees_every_parameter_and_samples_as_level_one_after_the_sync():
    actor = _actor()
    one, two = _engine(actor), _engine(actor)
    for step in range(2):  # the second step wakes a discarded engine again
        a, b = _sample(one, actor, 1), _sample(two, actor, 2)
        assert torch.equal(a.responses, b.responses) and torch.equal(a.rollout_log_probs, b.rollout_log_probs)
        assert all(p.numel() == 0 for p in two.model.parameters())  # asleep: nothing held
        assert all(p.numel() > 0 for p in one.model.parameters())
        with torch.no_grad():  # the trainer's update between steps
            for p in actor.parameters():
                p.mul_(0.9)
    rotary = dict(two.model.named_buffers())
    assert rotary and all(t.numel() > 0 for t in rotary.values())  # buffers are not synced: kept


def test_level_two_refuses_to_generate_before_the_weights_are_loaded_and_keeps_their_shapes():
    actor = _actor()
    eng = _engine(actor)
    shapes = {n: p.shape for n, p in eng.model.named_parameters()}
    eng.sleep(level=2)
    eng.sleep(level=2)  # asleep twice: the shapes are the weights', not the emptied tensors'
    eng.wake_up(["weights"])
    assert {n: p.shape for n, p in eng.model.named_parameters()} == shapes
    with pytest.raises(RuntimeError, match="parameters not loaded since a level-2 sleep discarded the weights"):
        eng.generate(PROMPTS, SamplingConfig(max_new_tokens=2))
    eng.sleep(level=2)  # awake again and slept without a load: freed again
    assert all(p.numel() == 0 for p in eng.model.parameters())
    eng.wake_up(["weights"])
    eng.load_weights(actor.state_dict().items())
    assert eng.generate(PROMPTS, SamplingConfig(max_new_tokens=2)).responses.shape == (2, 2)


def test_shared_weights_are_never_discarded():
    actor = _actor()
    eng = _engine()
    eng.share_weights(actor.named_parameters())
    eng.sleep(level=2)
    eng.wake_up(["weights"])
    assert all(p.data_ptr() == q.data_ptr() for p, q in zip(eng.model.parameters(), actor.parameters()))
    assert eng.generate(PROMPTS, SamplingConfig(max_new_tokens=2)).responses.shape == (2, 2)


def test_a_partial_empty_or_failed_load_after_level_two_still_refuses_to_generate():
    actor = _actor()
    eng = _engine(actor)
    eng.sleep(level=2)
    eng.wake_up(["weights"])
    eng.load_weights([])
    eng.load_weights([("model.norm.weight", actor.model.norm.weight)])
    with pytest.raises(KeyError):
        eng.load_weights([("nope", torch.zeros(1))])
    n = len(list(eng.model.parameters()))
    with pytest.raises(RuntimeError, match=rf"generate: {n - 1} parameters not loaded since a level-2 sleep"):
        eng.generate(PROMPTS, SamplingConfig(max_new_tokens=2))
    eng.load_weights([(k, v) for k, v in actor.state_dict().items() if k != "model.norm.weight"])
    assert eng.generate(PROMPTS, SamplingConfig(max_new_tokens=2)).responses.shape == (2, 2)  # every one now


def test_loading_or_sharing_while_discarded_and_asleep_says_to_wake_up_first():
    actor = _actor()
    eng = _engine(actor)
    eng.sleep(level=2)
    for call in (lambda: eng.load_weights(actor.state_dict().items()),
                 lambda: eng.share_weights(actor.named_parameters())):
        with pytest.raises(RuntimeError, match=r"level-2 sleep has discarded the weights; call wake_up\(\['weights'\]\)"):
            call()


def test_level_one_then_level_two_wakes_on_the_engine_device(monkeypatch):
    """A level-1 sleep moves the copy (buffers too) to the CPU; a level-2 sleep then discards it there: the wake-up
    still allocates the parameters, and moves the buffers, on the engine's device (a GPU, here named only)."""
    from rollout import memory

    eng = _engine(_actor())
    eng.device = torch.device("cuda", 0)
    calls = []
    monkeypatch.setattr(eng.model, "to", lambda *a, **k: calls.append(("to", a)))
    monkeypatch.setattr(memory.DiscardedWeights, "reallocate", lambda self, m, device: calls.append(("alloc", device)))
    eng.sleep(level=1)
    eng.sleep(level=2)
    eng.wake_up(["weights"])
    assert calls == [("to", ("cpu",)), ("alloc", eng.device), ("to", (eng.device,))]


def test_a_sleep_between_two_buckets_after_level_two_discards_the_first_bucket_again():
    actor = _actor()
    pairs = list(actor.state_dict().items())
    eng = _engine(actor)
    eng.sleep(level=2)
    eng.wake_up(["weights"])
    eng.load_weights(pairs[:len(pairs) // 2])
    eng.sleep(level=1)
    eng.wake_up(["weights"])
    eng.load_weights(pairs[len(pairs) // 2:])
    with pytest.raises(RuntimeError, match="parameters not loaded since a level-2 sleep"):
        eng.generate(PROMPTS, SamplingConfig(max_new_tokens=2))
    eng.load_weights(pairs)
    fresh = _engine(actor)
    sampling = SamplingConfig(n=1, do_sample=False, max_new_tokens=4)
    assert torch.equal(eng.generate(PROMPTS, sampling).responses, fresh.generate(PROMPTS, sampling).responses)
