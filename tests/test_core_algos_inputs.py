"""Inputs the advantage estimators read besides the rewards: ``sum_pi_squared`` from the actor's log-prob pass
(hand values, packed = padded, Ulysses SP=2 = SP=1 on gloo) and which stage makes it for which estimator."""
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.e2e_utils import resolved_config, run_gloo_ranks
from tests.test_forward import CONFIGS, P, R
from tests.test_forward import batch as _batch
from trainer import adv_inputs
from trainer.forward import forward_log_probs, log_probs_from_logits


def test_sum_pi_squared_hand_values_from_the_chunked_pass():
    # softmax([0, ln 3]) = [1/4, 3/4]: sum p^2 = 10/16; at temperature 2 the logits are halved:
    # p = [1, sqrt 3] / (1 + sqrt 3)
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]], requires_grad=True)
    labels = torch.tensor([1, 0])
    lp, ent, spp = log_probs_from_logits(logits, labels, calculate_entropy=True, calculate_sum_pi_squared=True)
    torch.testing.assert_close(spp, torch.tensor([10 / 16, 0.5]))
    torch.testing.assert_close(lp, torch.log(torch.tensor([0.75, 0.5])))
    assert not spp.requires_grad and lp.requires_grad
    lp.sum().backward()  # the log-probs keep their gradient
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.25, 0.25], [0.5, -0.5]]))
    s3 = math.sqrt(3.0)
    _, none, spp_t = log_probs_from_logits(logits.detach(), labels, temperature=2.0, chunk_size=1,
                                           calculate_sum_pi_squared=True)
    assert none is None
    torch.testing.assert_close(spp_t, torch.tensor([4 / (1 + s3) ** 2, 0.5]))
    assert len(log_probs_from_logits(logits.detach(), labels)) == 2  # without the flag: (log_probs, entropy)


def _tiny_lm():
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(CONFIGS["llama"](), attn_implementation="sdpa", dtype=torch.float32)


def _reference(model):
    """sum_v softmax(z / T)^2 of the padded forward's full logits at each response position."""
    ids, mask, pos, _ = _batch()
    with torch.no_grad():
        z = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -R - 1:-1] / 0.7
    return torch.softmax(z, -1).square().sum(-1)


def test_sum_pi_squared_of_the_packed_forward_equals_the_padded_logits():
    from patches.ulysses import apply_ulysses_patch

    model = _tiny_lm()
    want = _reference(model)
    ids, mask, pos, ok = _batch()
    padded = forward_log_probs(model, ids, mask, pos, R, temperature=0.7, use_remove_padding=False,
                               calculate_sum_pi_squared=True)
    packed_model = apply_ulysses_patch(model, 1)
    lp, ent, spp = forward_log_probs(packed_model, ids, mask, pos, R, temperature=0.7, calculate_entropy=True,
                                     chunk_size=3, calculate_sum_pi_squared=True)
    assert len(padded) == 3 and ent is not None
    torch.testing.assert_close(padded[2][ok], want[ok], atol=1e-6, rtol=0)
    torch.testing.assert_close(spp[ok], want[ok], atol=1e-6, rtol=0)
    assert ((spp[ok] > 0) & (spp[ok] <= 1)).all()


def sp2_body(rank, world, errors):
    """One gloo rank: both ranks form one SP=2 group and pass the same batch; every rank gets the whole rows."""
    from patches.ulysses import apply_ulysses_patch, build_dp_sp_groups

    mesh = build_dp_sp_groups(world, 2, rank)
    model = _tiny_lm()
    want = _reference(model)
    ids, mask, pos, ok = _batch()
    lp_ref = forward_log_probs(model, ids, mask, pos, R, temperature=0.7, use_remove_padding=False)[0]
    sharded = apply_ulysses_patch(model, mesh.sp)
    with torch.no_grad():
        lp, _, spp = forward_log_probs(sharded, ids, mask, pos, R, temperature=0.7, calculate_sum_pi_squared=True,
                                       device="cpu")
    try:
        torch.testing.assert_close(spp[ok], want[ok], atol=1e-5, rtol=0)
        torch.testing.assert_close(lp[ok], lp_ref[ok].detach(), atol=1e-5, rtol=0)
    except AssertionError as e:
        errors.append(f"sp=2: {e}")


def test_sum_pi_squared_under_ulysses_sp2_is_gathered_like_the_log_probs():
    errors = run_gloo_ranks(2, sp2_body, __name__)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("est, made", [("optimal_token_baseline", ("sum_pi_squared",)), ("grpo", ()), ("gae", ())])
def test_the_log_prob_pass_makes_sum_pi_squared_exactly_for_an_estimator_that_reads_it(est, made):
    cfg = resolved_config(f"algorithm.adv_estimator={est}")
    assert adv_inputs.log_prob_pass_columns(cfg) == made
    from trainer import core_algos

    spec = core_algos.get_adv_estimator_spec(est)
    assert ("sum_pi_squared" in adv_inputs.stage_columns(cfg, spec)) == bool(made)
    assert adv_inputs.missing_inputs(spec, cfg) == []


def test_verl_calculate_sum_pi_squared_is_accepted_and_says_whether_it_is_used():
    from tests.verl_scripts import composed

    key = "actor_rollout_ref.actor.calculate_sum_pi_squared"
    *_, report = composed(["algorithm.adv_estimator=optimal_token_baseline", f"{key}=true"])
    assert report.errors == [] and f"{key}=true: computed: algorithm.adv_estimator=optimal_token_baseline reads it" \
        in report.notes
    *_, report = composed(["algorithm.adv_estimator=grpo", f"{key}=true"])
    assert report.errors == [] and any(w.startswith(f"{key}=true: ignored: sum_pi_squared is computed only")
                                       for w in report.warnings)
