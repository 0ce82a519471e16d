"""Training FLOPs: the formula against torch's FlopCounterMode on real tiny models, and against
Megatron-LM's and PaLM's closed forms.

What is compared: FlopCounterMode counts matmuls (mm, addmm, bmm; SDPA kernels where it has a
formula) in forward and backward. Models use eager attention, so the s x s score and context
matmuls run dense (the causal mask is added, not skipped): the formula is evaluated in "dense"
mode to count the same work. Plans use "causal" mode (half the score matrix), as Megatron does.
"""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from forge.plan.flops import (
    MegatronArgs,
    attention_span,
    forward_flops_per_token,
    megatron_num_floating_point_operations,
    palm_flops_per_token,
    training_flops_per_token,
)
from forge.plan.model import spec_from_config
from plan_fixtures import ARCHS, LLAMA_31_8B, VOCAB, tiny_model

# (arch, grouped-query attention?, sequence lengths): every architecture with and without GQA
# (MQA for GPTBigCode; GPT-2 has only MHA), several sequence lengths in all.
CASES = [(arch, True, (8, 40)) for arch in ARCHS] + [
    (arch, False, (24,)) for arch in ARCHS if arch != "gpt2"]


@pytest.mark.parametrize("arch,gqa,seq_lens", CASES)
def test_train_step_flops_match_flop_counter(arch, gqa, seq_lens):
    torch.manual_seed(0)
    model, cfg = tiny_model(arch, gqa)
    spec = spec_from_config(cfg)
    batch = 2
    for seq in seq_lens:
        ids = torch.randint(0, VOCAB, (batch, seq))
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, labels=ids).loss.backward()
        predicted = training_flops_per_token(spec, seq, mode="dense") * batch * seq
        measured = counter.get_total_flops()
        assert abs(predicted - measured) / measured < 0.03, (arch, gqa, seq, predicted, measured)


def test_general_form_equals_megatron_num_floating_point_operations():
    spec = spec_from_config(LLAMA_31_8B)
    batch, seq = 4, 8192
    ours = training_flops_per_token(spec, seq, mode="causal") * batch * seq
    megatron = megatron_num_floating_point_operations(
        MegatronArgs(seq, spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn, spec.vocab,
                     swiglu=True), batch)
    assert ours == pytest.approx(megatron, rel=1e-12)


def test_causal_halves_the_attention_core_and_window_caps_it():
    assert attention_span(4096, mode="dense") == 4096
    assert attention_span(4096, mode="causal") == 2048
    assert attention_span(8192, window=4096, mode="causal") == pytest.approx(4096 - 4096**2 / (2 * 8192))
    spec = spec_from_config(LLAMA_31_8B)
    dense = forward_flops_per_token(spec, 8192, "dense")
    causal = forward_flops_per_token(spec, 8192, "causal")
    assert dense - causal == pytest.approx(spec.layers * 4 * spec.q_dim * 4096)


def test_palm_6n_plus_attention_matches_dense_training_flops():
    spec = spec_from_config(LLAMA_31_8B)
    # PaLM's N counts norm weights too (not matmuls): a <0.01% difference
    assert palm_flops_per_token(spec, 4096) == pytest.approx(training_flops_per_token(spec, 4096, "dense"), rel=1e-4)
