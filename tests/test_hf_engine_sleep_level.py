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
    with pytest.raises(RuntimeError, match="before load_weights after a level-2 sleep"):
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
