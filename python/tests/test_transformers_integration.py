"""flashhop.integrations.transformers: registration, the optional import, the PyTorch fallback and
its warnings, the padded and packed paths against independent references (on the CPU, with a
reference attention injected), and on a Hopper GPU small random models of four architectures
against transformers' own attention: logits, greedy generation through the KV cache, gradients.

The GPU comparisons follow FlashAttention's rule: against the model in float32 with transformers'
attention (SDPA; eager for Gemma 2, which has no SDPA support), flashhop's bfloat16 model may err by
twice what the same model errs in bfloat16 with transformers' attention, plus a bfloat16 unit of
the reference's largest magnitude."""
import copy
import os
import pathlib
import subprocess
import sys
import types
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashhop  # noqa: E402
from flashhop.integrations import transformers as integration  # noqa: E402
from helpers import attention_reference, requires_hopper, skip_unless_built, visible_keys  # noqa: E402
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

_COMMON = dict(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256)
# (config, the attention implementation it is compared with); head dim 64 throughout.
MODELS = {
    "llama": (LlamaConfig(**_COMMON), "sdpa"),
    "qwen2_sliding": (Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=8, max_window_layers=1), "sdpa"),
    "mistral_sliding": (MistralConfig(**_COMMON, sliding_window=8), "sdpa"),
    "gemma2_softcap_sliding": (Gemma2Config(**_COMMON, head_dim=64, sliding_window=8, attn_logit_softcapping=50.0),
                               "eager"),
}


@pytest.fixture
def fresh_warnings():
    """The integration's fallback warnings, recorded from a state in which none has been given."""
    integration._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    integration._warned.clear()


def _fallback_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith("flashhop:")]


def _models(name, device, dtype):
    """The model with flashhop's attention and the same weights with transformers' attention, each
    from its own copy of the config (from_config sets the attention implementation on it)."""
    config, reference = MODELS[name]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="flashhop")
    other = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=reference)
    other.load_state_dict(model.state_dict())
    return model.to(device, dtype), other.to(device, dtype)


def _padded_batch(lengths, device, seqlen=None):
    """Random token ids (batch, seqlen), left-padded to the longest prompt, and their attention mask."""
    seqlen = seqlen or max(lengths)
    ids = torch.randint(0, _COMMON["vocab_size"], (len(lengths), seqlen), device=device)
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long, device=device)
    for row, length in enumerate(lengths):
        mask[row, seqlen - length:] = 1
    return ids, mask


def test_importing_flashhop_does_not_import_transformers():
    package_root = pathlib.Path(flashhop.__file__).resolve().parents[1]
    code = "import sys, flashhop; assert 'transformers' not in sys.modules, 'flashhop imported transformers'"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_registration():
    assert "flashhop" in ALL_ATTENTION_FUNCTIONS.valid_keys()
    assert ALL_ATTENTION_FUNCTIONS["flashhop"] is integration.attention_forward
    assert "flashhop" in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping
    model = AutoModelForCausalLM.from_config(copy.deepcopy(MODELS["llama"][0]), attn_implementation="flashhop")
    assert model.config._attn_implementation == "flashhop"


def test_every_layer_runs_the_integration(monkeypatch):
    calls = []
    attention = integration._attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return attention(*args, **kwargs)

    monkeypatch.setattr(integration, "_attention", counted)
    model, _ = _models("llama", "cpu", torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model(torch.randint(0, 256, (2, 9)))
    assert len(calls) == _COMMON["num_hidden_layers"]


@pytest.mark.parametrize("name", MODELS)
def test_cpu_model_falls_back_and_matches_transformers(name, fresh_warnings):
    model, other = _models(name, "cpu", torch.float32)
    ids, mask = _padded_batch([9, 14, 5], "cpu")
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        model(ids, attention_mask=mask)
        expected = other(ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(logits[valid], expected[valid], atol=1e-5, rtol=1e-5)
    assert _fallback_warnings(fresh_warnings) == [
        "flashhop: tensors on cpu: attention runs in PyTorch instead (warned once per reason)"]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", MODELS)
def test_cpu_greedy_generation_matches_transformers(name, cache):
    model, other = _models(name, "cpu", torch.float32)
    ids, mask = _padded_batch([6, 13, 9], "cpu")
    options = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, cache_implementation=cache)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokens = model.generate(ids, **options)
    assert torch.equal(tokens, other.generate(ids, **options))


def _module(is_causal=True, num_key_value_groups=2):
    return types.SimpleNamespace(is_causal=is_causal, num_key_value_groups=num_key_value_groups, training=False)


def _heads_first(batch=2, nheads=4, nheads_kv=2, seqlen_q=11, seqlen_k=11, head_dim=16, dtype=torch.float32):
    """query, key, value in transformers' layout (batch, nheads, seqlen, head_dim), on the CPU."""
    return (torch.randn(batch, nheads, seqlen_q, head_dim, dtype=dtype),
            torch.randn(batch, nheads_kv, seqlen_k, head_dim, dtype=dtype),
            torch.randn(batch, nheads_kv, seqlen_k, head_dim, dtype=dtype))


def test_4d_mask_goes_to_sdpa(fresh_warnings):
    query, key, value = _heads_first()
    mask = torch.randn(2, 1, 11, 11)  # additive, not a padding mask
    for _ in range(2):
        out, weights = integration.attention_forward(_module(), query, key, value, mask, scaling=0.3)
    expected, _ = sdpa_attention_forward(_module(), query, key, value, mask, scaling=0.3)
    assert weights is None
    torch.testing.assert_close(out, expected)
    assert _fallback_warnings(fresh_warnings) == [
        "flashhop: a 4-D attention mask or a position bias, given to transformers' SDPA attention: "
        "attention runs in PyTorch instead (warned once per reason)"]


def test_dropout_falls_back(fresh_warnings):
    query, key, value = _heads_first()
    out, _ = integration.attention_forward(_module(), query, key, value, None, dropout=0.5)
    assert out.shape == (2, 11, 4, 16)
    assert _fallback_warnings(fresh_warnings) == [
        "flashhop: dropout: attention runs in PyTorch instead (warned once per reason)"]


def test_float_2d_mask_is_an_error():
    q, k, v = (t.transpose(1, 2) for t in _heads_first())
    with pytest.raises(ValueError, match=r"attention_mask is a 2-D torch.float32 tensor: expected a 2-D bool"):
        integration.padded_attention(q, k, v, torch.zeros(2, 11), integration.torch_attention)


def test_attention_sinks_are_an_error():
    query, key, value = _heads_first()
    with pytest.raises(NotImplementedError, match="s_aux"):
        integration.attention_forward(_module(), query, key, value, None, s_aux=torch.zeros(4))


# (causal, window_size, softcap, seqlen_q, seqlen_k)
TORCH_ATTENTION_CASES = [(False, (-1, -1), 0.0, 11, 11), (True, (-1, -1), 0.0, 11, 11), (True, (-1, -1), 0.0, 4, 11),
                         (True, (3, 0), 0.0, 11, 11), (False, (3, 2), 0.0, 7, 11), (True, (5, 0), 20.0, 11, 11),
                         (True, (-1, -1), 2.0, 1, 11)]


@pytest.mark.parametrize("causal, window_size, softcap, seqlen_q, seqlen_k", TORCH_ATTENTION_CASES)
def test_torch_attention_matches_the_reference(causal, window_size, softcap, seqlen_q, seqlen_k):
    q, k, v = (t.transpose(1, 2) for t in _heads_first(seqlen_q=seqlen_q, seqlen_k=seqlen_k, dtype=torch.float64))
    got = integration.torch_attention(q, k, v, 0.4, causal, window_size=window_size, softcap=softcap)
    expected, _ = attention_reference(q, k, v, 0.4, causal, window_size, softcap)
    torch.testing.assert_close(got, expected)


def _reference_attend(**options):
    """A per-sequence attention for the helpers, in float64: helpers.attention_reference."""
    return lambda q, k, v: attention_reference(q, k, v, **options)[0]


def _masked_reference(q, k, v, visible):
    """Attention over the padded batch with visible (batch, seqlen_q, seqlen_k), by key positions in
    the padded tensors; query rows that see no key are 0."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    probs = torch.softmax(scores.masked_fill(~visible[:, None], float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhqk,bkhd->bqhd", probs, v)


# (padding: lengths of the rows' tokens, left or right padded; seqlen_q; seqlen_k; the keys that
# the mask covers; causal, window)
PADDED_CASES = {
    "prefill_left": ([11, 6, 1], "left", 11, 11, 11, True, (-1, -1)),
    "prefill_right": ([11, 6, 3], "right", 11, 11, 11, True, (-1, -1)),
    "prefill_left_window": ([11, 8, 4], "left", 11, 11, 11, True, (2, 0)),
    "bidirectional_right": ([11, 5, 9], "right", 11, 11, 11, False, (-1, -1)),
    "decode_left": ([11, 6, 2], "left", 1, 11, 11, True, (-1, -1)),
    "decode_left_window": ([11, 6, 2], "left", 1, 11, 11, True, (3, 0)),
    "chunk_left": ([11, 7, 4], "left", 3, 11, 11, True, (-1, -1)),
    "chunk_left_padded_query": ([11, 7, 2], "left", 3, 11, 11, True, (-1, -1)),
    "static_cache_left": ([9, 5, 2], "left", 1, 16, 9, True, (-1, -1)),
}


@pytest.mark.parametrize("case", PADDED_CASES)
def test_padded_attention_matches_the_reference(case):
    lengths, side, seqlen_q, seqlen_k, mask_length, causal, window_size = PADDED_CASES[case]
    q, k, v = (t.transpose(1, 2) for t in _heads_first(batch=len(lengths), seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                                                       dtype=torch.float64))
    mask = torch.zeros(len(lengths), mask_length, dtype=torch.bool)
    for row, length in enumerate(lengths):
        mask[row, :length] = True
    if side == "left":
        mask = mask.flip(1)
    attend = _reference_attend(causal=causal, window_size=window_size)
    got = integration.padded_attention(q, k, v, mask, attend)

    visible = mask[:, None, :] & visible_keys(seqlen_q, mask_length, causal, window_size)[None]
    queries = mask[:, -seqlen_q:] if seqlen_q > 1 else torch.ones(len(lengths), 1, dtype=torch.bool)
    expected = _masked_reference(q, k[:, :mask_length], v[:, :mask_length], visible) * queries[:, :, None, None]
    assert got.shape == q.shape
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("described_by", ["position_ids", "cu_seq_lens"])
def test_packed_sequences_stay_apart(described_by):
    lengths = [4, 1, 6]
    query, key, value = _heads_first(batch=1, seqlen_q=11, seqlen_k=11, dtype=torch.float64)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    bounds = torch.tensor([0, 4, 5, 11], dtype=torch.int32)
    kwargs = (dict(position_ids=positions) if described_by == "position_ids"
              else dict(cu_seq_lens_q=bounds, cu_seq_lens_k=bounds, max_length_q=6, max_length_k=6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, _ = integration.attention_forward(_module(), query, key, value, None, scaling=0.25, **kwargs)
    sequence = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))
    visible = (sequence[:, None] == sequence[None, :]) & visible_keys(11, 11, causal=True)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    torch.testing.assert_close(got, _masked_reference(q, k, v, visible[None]))


def test_position_ids_that_count_up_are_one_sequence():
    query, key, value = _heads_first(batch=1)
    q, k = query.transpose(1, 2), key.transpose(1, 2)
    assert integration._packed_sequence_bounds(torch.arange(5, 16)[None], q, k) is None
    packed = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7]])
    assert integration._packed_sequence_bounds(packed, q, k).tolist() == [0, 3, 11]


def test_the_layers_of_a_forward_read_its_position_ids_once(monkeypatch):
    """The host waits for the ids once per tensor (every layer gets the same one), and again
    where they changed in place."""
    query, key, value = _heads_first(batch=1)
    q, k = query.transpose(1, 2), key.transpose(1, 2)
    reads = []
    equal = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: reads.append(1) or equal(a, b))
    positions = torch.arange(11)[None]
    for _ in range(3):
        assert integration._packed_sequence_bounds(positions, q, k) is None
    assert len(reads) == 1
    positions[0, 3:] = torch.arange(8)
    for _ in range(3):
        assert integration._packed_sequence_bounds(positions, q, k).tolist() == [0, 3, 11]
    assert len(reads) == 2


@pytest.mark.parametrize("sliding_window, causal, expected",
                         [(None, True, (-1, -1)), (8, True, (7, 0)), (8, False, (8, 8))])
def test_window_size_convention(sliding_window, causal, expected):
    assert integration._window_size(sliding_window, causal) == expected


def _rule_bound(reference, baseline):
    """The error FlashAttention's rule (the module docstring) allows against reference."""
    baseline_error = (baseline.double() - reference.double()).abs().max().item()
    return 2 * baseline_error + torch.finfo(torch.bfloat16).eps * reference.abs().max().item()


def _assert_rule(name, got, reference, baseline):
    error = (got.double() - reference.double()).abs().max().item()
    bound = _rule_bound(reference, baseline)
    assert error <= bound, f"{name}: max error {error:.3g} > {bound:.3g} (FlashAttention's rule)"


def _gpu_models(name):
    """flashhop's model in bfloat16, transformers' attention in bfloat16 (the baseline) and in
    float32 (the reference), all with the bfloat16 weights, after a first call that skips the test
    where the build lacks the kernel. Without an end-of-sequence token, generation runs its full
    length."""
    model, baseline = _models(name, "cuda", torch.bfloat16)
    reference = copy.deepcopy(baseline).float()
    for m in (model, baseline, reference):
        m.generation_config.eos_token_id = None
    with torch.no_grad():
        skip_unless_built(model, torch.randint(0, 256, (1, 4), device="cuda"))
    return model, baseline, reference


@requires_hopper
@pytest.mark.parametrize("name", MODELS)
def test_gpu_logits(name, fresh_warnings):
    model, baseline, reference = _gpu_models(name)
    ids, mask = _padded_batch([40, 23, 7, 33], "cuda")
    with torch.no_grad():
        logits, base, ref = (m(ids, attention_mask=mask).logits for m in (model, baseline, reference))
        dense = [m(ids).logits for m in (model, baseline, reference)]
    valid = mask.bool()
    _assert_rule("padded logits", logits[valid], ref[valid], base[valid])
    _assert_rule("logits", *dense)
    assert _fallback_warnings(fresh_warnings) == []


@requires_hopper
@pytest.mark.parametrize("name", MODELS)
def test_gpu_greedy_generation(name, fresh_warnings):
    """32 greedy tokens from a left-padded batch through the KV cache. Random weights give nearly
    level logits, where bfloat16 rounding may flip an argmax and every later token with it, so the
    tokens are not compared with another implementation's. Instead the logits of each decoding step
    meet the rule against the float32 reference and the bfloat16 baseline run without a cache over
    the same tokens, and each chosen token is the reference's argmax up to that bound."""
    model, baseline, reference = _gpu_models(name)
    ids, mask = _padded_batch([5, 17, 11, 30], "cuda")
    with torch.no_grad():
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=32, do_sample=False, output_logits=True,
                                   return_dict_in_generate=True)
        tokens = generated.sequences
        full_mask = torch.cat([mask, torch.ones_like(tokens[:, ids.shape[1]:])], dim=1)
        # The logits at position p predict token p + 1: the 32 steps are the positions before each new token.
        steps = slice(ids.shape[1] - 1, tokens.shape[1] - 1)
        ref, base = (m(tokens, attention_mask=full_mask).logits[:, steps].float() for m in (reference, baseline))
    logits = torch.stack(generated.logits, dim=1).float()
    _assert_rule("decoding logits", logits, ref, base)
    # Within the bound of the reference's logits, a chosen token's logit is within twice it of the reference's largest.
    chosen = ref.gather(-1, tokens[:, ids.shape[1]:, None])[..., 0]
    assert (chosen >= ref.max(dim=-1).values - 2 * _rule_bound(ref, base)).all(), (
        "a chosen token is not the reference's argmax")
    assert _fallback_warnings(fresh_warnings) == []


@requires_hopper
@pytest.mark.parametrize("name", MODELS)
def test_gpu_training_step_gradients(name, fresh_warnings):
    model, baseline, reference = _gpu_models(name)
    ids, mask = _padded_batch([40, 23, 7, 33], "cuda")
    # Without a loss at the first token, predicted from the padding before it, where implementations differ.
    labels = ids.masked_fill(mask.cumsum(dim=1) <= 1, -100)
    for m in (model, baseline, reference):
        m.train()
        m(ids, attention_mask=mask, labels=labels).loss.backward()
    parameters = zip(model.named_parameters(), baseline.parameters(), reference.parameters())
    for (name_, p), base, ref in parameters:
        _assert_rule(f"grad of {name_}", p.grad, ref.grad, base.grad)
    assert _fallback_warnings(fresh_warnings) == []
