"""Memory and parallelism: model states after a real tiny step, ZeRO / tensor / pipeline closed
forms, Korthikanti's activation formula, the alpha-beta ring and the pipeline bubble."""
import math

import pytest
import torch

from forge.plan.hardware import get_system
from forge.plan.memory import (
    activation_bytes,
    layer_activation_bytes,
    memory_per_chip,
    model_state_bytes,
    params_per_chip,
)
from forge.plan.model import count_parameters, load_model_config, spec_from_config
from forge.plan.parallel import (
    Layout,
    Rates,
    Shard,
    Work,
    pipeline_bubble_fraction,
    ring_allgather_time,
    ring_allreduce_time,
    step_time,
)
from plan_fixtures import LLAMA_31_8B, VOCAB, tiny_model


def _state_bytes_after_one_step(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params)
    # Adam's exp_avg / exp_avg_sq; the scalar `step` counters (one per tensor, not per parameter)
    # are left out, as the per-parameter formula does
    optim = sum(t.numel() * t.element_size() for p in params for k, t in opt.state[p].items() if k != "step")
    return weights, grads, optim


@pytest.mark.parametrize("precision,dtype", [("fp32", torch.float32), ("bf16-pure", torch.bfloat16)])
def test_model_states_equal_bytes_after_a_real_step(precision, dtype):
    torch.manual_seed(0)
    model, cfg = tiny_model("llama")
    model = model.to(dtype)
    n = count_parameters(spec_from_config(cfg)).total
    weights, grads, optim = _state_bytes_after_one_step(model)
    formula = model_state_bytes(n, precision)
    assert (formula["weights"], formula["grads"], formula["optimizer"]) == (weights, grads, optim)


def test_zero_stages_closed_forms():
    psi, dp = 1e9, 8
    assert model_state_bytes(psi, "bf16", 0, dp)["total"] == 16 * psi
    assert model_state_bytes(psi, "bf16", 1, dp)["total"] == 4 * psi + 12 * psi / dp    # ZeRO paper, Fig. 1
    assert model_state_bytes(psi, "bf16", 2, dp)["total"] == 2 * psi + 14 * psi / dp
    assert model_state_bytes(psi, "bf16", 3, dp)["total"] == 16 * psi / dp


def test_tensor_and_pipeline_sharding_closed_forms():
    spec = spec_from_config(LLAMA_31_8B)
    pc = count_parameters(spec)
    assert params_per_chip(pc, spec.layers, tp=8) == pc.total / 8
    # 32 layers over 4 stages: the first stage holds 8 blocks + embedding, the last 8 blocks +
    # final norm + lm_head; with untied embeddings of equal size the last stage is the fullest
    first = pc.embedding + 8 * pc.per_layer
    last = 8 * pc.per_layer + pc.final_norm + pc.lm_head
    assert params_per_chip(pc, spec.layers, tp=2, pp=4) == max(first, last) / 2
    assert params_per_chip(pc, spec.layers, tp=2, pp=4) == pytest.approx(pc.total / 8, rel=0.15)


def _gpt(h=1024, a=16, layers=24, dropout=True):
    return spec_from_config({"model_type": "gpt2", "n_embd": h, "n_head": a, "n_layer": layers, "vocab_size": 50304,
                             "n_positions": 2048, "resid_pdrop": 0.1 if dropout else 0.0})


@pytest.mark.parametrize("t", [1, 2, 8])
def test_korthikanti_activation_closed_forms(t):
    g = _gpt()
    s, b, h, a = 2048, 4, g.hidden, g.heads
    sbh = s * b * h
    kw = dict(flash=False, act_bytes=2)
    # Eq. 4 (tensor + sequence parallel): sbh/t * (34 + 5as/h)
    assert layer_activation_bytes(g, Layout(tp=t, micro_batch=b, sp=True), s, **kw) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h))
    # Eq. 2 (tensor parallel only): sbh * (10 + 24/t + 5as/(ht))
    no_sp = sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert layer_activation_bytes(g, Layout(tp=t, micro_batch=b, sp=False), s, **kw) == pytest.approx(no_sp)
    # selective recomputation: sbh * 34/t; full recomputation: 2sbh/t
    assert layer_activation_bytes(g, Layout(tp=t, micro_batch=b, recompute="selective"), s, **kw) == pytest.approx(
        34 * sbh / t)
    assert layer_activation_bytes(g, Layout(tp=t, micro_batch=b, recompute="full"), s, **kw) == pytest.approx(
        2 * sbh / t)


def test_first_pipeline_stage_holds_p_microbatches_in_flight():
    g = _gpt(dropout=False)
    seq = 1024
    per_layer = layer_activation_bytes(g, Layout(), seq, True, 2)
    embedding_output = seq * g.hidden * 2
    # 1F1B: with m >= p the first of 4 stages keeps 4 micro-batches of its 24/4 = 6 blocks
    many = activation_bytes(g, Layout(pp=4, microbatches=16), seq)
    assert many == pytest.approx(6 * per_layer * 4 + embedding_output)
    # with one micro-batch the last stage (6 blocks + fp32 logits) is the fullest
    one = activation_bytes(g, Layout(pp=4, microbatches=1), seq)
    assert one == pytest.approx(6 * per_layer + seq * g.vocab * (2 + 4))


def test_memory_breakdown_adds_up_and_zero3_shards_weights():
    spec = spec_from_config(load_model_config("llama-3.1-8b"))
    pc = count_parameters(spec)
    m0 = memory_per_chip(spec, pc, Layout(dp=8, zero=0), 4096)
    m3 = memory_per_chip(spec, pc, Layout(dp=8, zero=3), 4096)
    assert m0.total == pytest.approx(m0.weights + m0.grads + m0.optimizer + m0.activations + m0.buffers + m0.frozen)
    assert m3.weights == pytest.approx(m0.weights / 8)
    assert m3.activations == m0.activations


def test_ring_collectives_closed_forms():
    n, p, alpha, beta = 1e9, 8, 5e-6, 100e9
    assert ring_allreduce_time(n, p, alpha, beta) == pytest.approx(2 * 7 * alpha + 2 * 7 / 8 * n / beta)
    assert ring_allgather_time(n, p, alpha, beta) == pytest.approx(7 * alpha + 7 / 8 * n / beta)
    assert ring_allreduce_time(n, 1, alpha, beta) == 0.0


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (8, 32), (1, 4)])
def test_pipeline_bubble(p, m):
    assert pipeline_bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))
    spec = spec_from_config(LLAMA_31_8B)
    system = get_system("trn2-ultraserver")
    st = step_time(spec, system, Layout(pp=p, microbatches=m), Work(4096, 1e15), Shard(0.0, 0.0), Rates(1e14))
    assert st.pp_bubble / (st.compute + st.pp_bubble) == pytest.approx((p - 1) / (m + p - 1))
    assert st.compute == pytest.approx(m * 1e15 / p / 1e14)


def test_more_tensor_parallel_means_more_exposed_communication():
    spec = spec_from_config(LLAMA_31_8B)
    system = get_system("p5.48xlarge")
    t2 = step_time(spec, system, Layout(tp=2), Work(4096, 1e15), Shard(1e9, 1e9), Rates(1e14))
    t8 = step_time(spec, system, Layout(tp=8), Work(4096, 1e15), Shard(1e9, 1e9), Rates(1e14))
    assert 0 < t2.tp_comm and math.isfinite(t8.tp_comm)
    assert t8.compute < t2.compute


def test_data_parallel_rings_past_a_node_cross_it_once_per_member_and_cp_ranks_share_zero():
    from forge.plan.parallel import group_allgather_time
    trn1 = get_system("trn1")
    n, up, out = 1e9, trn1.ring_bandwidth(16), trn1.ring_bandwidth(64)
    # tensor parallel filling the node: one member a node, the flat ring over the network
    assert group_allgather_time(n, 4, 16, trn1) == pytest.approx(ring_allgather_time(n, 4, trn1.hop_latency(64), out))
    # TP=4: four members a node each move a quarter over their own share of the NIC, then gather locally
    four = group_allgather_time(n, 64, 4, trn1)
    assert four == pytest.approx(ring_allgather_time(n / 4, 16, trn1.hop_latency(256), out)
                                 + ring_allgather_time(n, 4, trn1.hop_latency(16), up))
    assert four < ring_allgather_time(n, 64, trn1.hop_latency(256), out) / 3
    spec = spec_from_config(load_model_config("llama-3.1-8b"))
    pc = count_parameters(spec)
    flat = memory_per_chip(spec, pc, Layout(dp=2, zero=1), 8192)
    cp = memory_per_chip(spec, pc, Layout(dp=2, zero=1, cp=2), 8192)
    assert cp.optimizer == pytest.approx(flat.optimizer / 2)     # ZeRO shards over dp x cp


def test_kv_projections_replicate_when_tensor_ranks_outnumber_kv_heads():
    spec = spec_from_config(load_model_config("llama-3.1-8b"))   # 8 KV heads
    trn1 = get_system("trn1")                                    # 2 NeuronCores a chip
    work = Work(8192, 1e15, 0.0, 2, kv_flops=1e14)
    shard, rates = Shard(1e9, 1e9), Rates(1e14)
    at4 = step_time(spec, trn1, Layout(tp=4, dp=1), work, shard, rates).compute     # 8 ranks: none
    at16 = step_time(spec, trn1, Layout(tp=16, dp=1), work, shard, rates).compute   # 32 ranks: 4x K/V
    assert at4 * 4 == pytest.approx(1e15 / 1e14)
    assert at16 * 16 == pytest.approx((1e15 + 3 * 1e14) / 1e14)
