"""Stage plans: consistency of the figures, the fewest chips that fit, layouts, deadlines and
budgets, every stage kind, and clear messages when a stage cannot run."""
import pytest

from forge.errors import ForgeError
from forge.plan import workloads as W
from forge.plan.flops import training_flops_per_token
from forge.plan.hardware import get_system
from forge.plan.model import load_model_config, spec_from_config
from forge.plan.planner import Goal, Setup, compare, plan_stage
from forge.plan.report import assert_plans_fit

L8B = load_model_config("llama-3.1-8b")
L70B = load_model_config("llama-3.1-70b")
CPT = W.pretrain("cpt", 8192, 512, tokens=100e9)


def test_pretrain_plan_figures_are_consistent():
    plan = plan_stage(L8B, CPT, "trn3-ultraserver")
    system = get_system("trn3-ultraserver")
    assert plan.feasible and plan.chips == 144
    per_token = training_flops_per_token(spec_from_config(L8B), 8192)
    assert plan.flops_total == pytest.approx(per_token * CPT.tokens_processed)
    assert plan.hours == pytest.approx(plan.steps * plan.step_time_s / 3600)
    assert plan.cost_usd == pytest.approx(plan.chips * plan.hours * system.usd_per_chip_hour)
    assert plan.energy_kwh == pytest.approx(plan.chips * plan.hours * system.chip.system_w_per_chip / 1000)
    assert plan.tokens_per_mwh == pytest.approx(CPT.tokens_processed / (plan.energy_kwh / 1000))
    assert plan.memory_gib["total"] <= plan.usable_gib
    assert 0 < plan.mfu_achieved <= plan.mfu_assumed + 1e-9
    d = plan.layout_detail
    assert d["tp"] * d["pp"] * d["dp"] == 144


def test_trn3_ultraserver_beats_trn2_ultraserver_and_h100_in_time():
    trn3, trn2, h100 = compare(L8B, CPT, [("trn3", None), ("trn2", None), ("h100", 64)])
    assert trn3.hours < h100.hours and trn3.hours < trn2.hours
    # no published run anchors Trainium2/3: their plans say so and carry a wider band
    assert "projection" in trn3.band_basis and "projection" in trn2.band_basis
    assert trn3.error_band > h100.error_band > 0


def test_70b_does_not_fit_one_h100_node_and_says_from_how_many_chips():
    plan = plan_stage(L70B, W.pretrain("cpt", 4096, 256, tokens=1e9), "h100", Goal(chips=8))
    assert not plan.feasible
    assert plan.min_chips_fit > 8
    assert "does not fit on 8 x NVIDIA H100" in plan.reason and f"fits from {plan.min_chips_fit} chips" in plan.reason
    auto = plan_stage(L70B, W.pretrain("cpt", 4096, 256, tokens=1e9), "h100")
    assert auto.feasible and auto.chips == auto.min_chips_fit


def test_activations_that_exceed_hbm_at_any_tensor_parallel_degree_are_explained():
    long = W.pretrain("long", 2**21, 4, tokens=1e10)
    plan = plan_stage(L8B, long, "trn2.48xlarge", Goal(chips=16))
    assert not plan.feasible
    assert "Activations alone exceed HBM at sequence length 2097152" in plan.reason
    assert "tensor parallel 16" in plan.reason and "more chips do not help" in plan.reason


def test_deadline_picks_the_fewest_chips_that_meet_it():
    loose = plan_stage(L8B, CPT, "h100", Goal(deadline_h=200))
    tight = plan_stage(L8B, CPT, "h100", Goal(deadline_h=30))
    assert loose.feasible and tight.feasible
    assert loose.hours <= 200 and tight.hours <= 30 and tight.chips > loose.chips
    smaller = plan_stage(L8B, CPT, "h100", Goal(chips=tight.chips // 2))
    assert smaller.hours > 30


def test_impossible_deadline_and_budget_say_so():
    plan = plan_stage(L8B, CPT, "h100", Goal(deadline_h=0.5))
    assert not plan.feasible and "deadline 0.5 h cannot be met" in plan.reason
    plan = plan_stage(L8B, CPT, "h100", Goal(budget_usd=100))
    assert not plan.feasible and "budget $100 cannot be met" in plan.reason


def test_budget_picks_the_fastest_plan_within_it():
    plan = plan_stage(L8B, CPT, "trn2", Goal(budget_usd=20_000))
    assert plan.feasible and plan.cost_usd <= 20_000


def test_more_chips_are_not_slower():
    hours = [plan_stage(L8B, CPT, "trn2.48xlarge", Goal(chips=n)).hours for n in (16, 32, 64)]
    assert hours[0] > hours[1] > hours[2]


def test_mfu_override_scales_compute():
    slow = plan_stage(L8B, CPT, "trn2", setup=Setup(mfu=0.2))
    fast = plan_stage(L8B, CPT, "trn2", setup=Setup(mfu=0.4))
    assert slow.hours / fast.hours == pytest.approx(2, rel=0.1)


def test_sft_padding_costs_more_than_packing():
    packed = plan_stage(L8B, W.sft("sft", 4096, 64, tokens=1e9), "trn2")
    padded = plan_stage(L8B, W.sft("sft", 4096, 64, tokens=1e9, examples=W.Examples(False, 1024)), "trn2")
    assert padded.tokens_processed == pytest.approx(4 * packed.tokens_processed, rel=0.01)
    assert padded.hours == pytest.approx(4 * packed.hours, rel=0.05)


def test_dpo_cached_reference_is_cheaper_and_leaner():
    # two epochs: policy fwd+bwd (3 forwards) on chosen and rejected each epoch; the reference
    # forward runs every epoch when live (4 per epoch) or once when cached (3 + 3 + 1)
    cached = plan_stage(L8B, W.dpo("dpo", 2048, 64, pairs=W.Pairs(100_000, epochs=2)), "trn2")
    live = plan_stage(L8B, W.dpo("dpo", 2048, 64, pairs=W.Pairs(100_000, epochs=2), cached_reference=False), "trn2")
    assert cached.feasible and live.feasible
    assert live.flops_total / cached.flops_total == pytest.approx(8 / 7, rel=0.01)
    assert live.memory_gib["frozen"] > 0 == cached.memory_gib["frozen"]
    assert any("cached once" in n for n in cached.notes)


def test_rft_plan_includes_memory_bound_generation():
    rl = W.rft("grpo", W.Generation(prompts=64, group=8, prompt_len=512, gen_len=1536), steps=100)
    plan = plan_stage(L8B, rl, "trn3")
    assert plan.feasible and plan.generation_s_per_step > 0
    assert plan.step_breakdown_s["generation"] == plan.generation_s_per_step
    assert plan.hours == pytest.approx(100 * plan.step_time_s / 3600, rel=1e-6)


def test_unknown_stage_kind_is_a_clear_error():
    with pytest.raises(ForgeError, match="pretrain, midtrain, sft, dpo, rft"):
        W.normalize_kind("distill")


def test_assert_plans_fit_refuses_unless_forced():
    bad = plan_stage(L70B, W.pretrain("cpt", 4096, 8, tokens=1e6), "local")
    assert not bad.feasible and "does not fit on 1 x this machine" in bad.reason
    with pytest.raises(ForgeError, match="stage 'cpt' on local"):
        assert_plans_fit([bad])
    assert len(assert_plans_fit([bad], force=True)) == 1


def test_default_size_larger_than_the_job_can_use_falls_back_to_the_fastest_fitting_count():
    from plan_fixtures import tiny_config
    plan = plan_stage(tiny_config("llama").to_dict(), W.pretrain("tiny", 128, 16, steps=10), "trn3")
    assert plan.feasible and plan.chips < 144
    assert any("cannot use all 144 chips" in n for n in plan.notes)
