"""HFEngine (design §7) on a tiny random Llama in LoRA: layout, stop handling, log-probs, seeds, constraints."""

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from lit_grpo.engines import HFEngine, SamplingSpec
from lit_grpo.engines.cpu_weights import packed_frozen_linears, packing_available
from lit_grpo.engines.hf_decode import draw_tokens, restrict_first_token
from lit_grpo.errors import InputError
from lit_grpo.policy.logprobs import sequence_logprobs
from lit_grpo.policy.model_loading import completion_stop_ids, load_policy
from lit_grpo.run.model_files import load_tokenizer
from support import build_char_tokenizer, penalised_copy, tiny_llama_config

T = 0.7
PROMPTS = [[1, 21, 22, 15, 23, 24, 33], [1, 25, 15, 26, 33], [1, 30, 31, 32]]  # lengths 7, 5, 4: left padding varies
STOPS = tuple(range(10, 60))  # half the vocabulary: random completions stop at varied lengths


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(tiny_llama_config(len(tokenizer), hidden_size=64, num_layers=2)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def randomise_lora(policy, seed):
    """LoRA B starts at 0 (the adapter is a no-op): give it weights so the engine must run the adapter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


@pytest.fixture(scope="module")
def policy(model_dir):
    policy = load_policy(model_dir, 4, 8, 0.0, "all-linear")
    randomise_lora(policy, 1)
    return policy.eval()


@pytest.fixture
def engine(policy):
    engine = HFEngine()
    engine.push_policy(policy)
    return engine


def trainer_logprobs(policy, prompt, tokens, temperature=T):
    """The trainer's view: sequence_logprobs of prompt + completion at the completion's positions."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logp = sequence_logprobs(policy, ids, torch.ones_like(ids), temperature)[0]  # [L]
    return logp[len(prompt) :]


def assert_trainer_logprobs(policy, prompt, completion, temperature=T):
    """The completion's sampler log-probs equal the trainer's, to 1e-5."""
    expected = trainer_logprobs(policy, prompt, completion.token_ids, temperature)
    assert torch.allclose(torch.tensor(completion.logprobs), expected, rtol=0, atol=1e-5)


def first_token_logits(policy, prompt):
    with torch.no_grad():
        return policy(input_ids=torch.tensor([prompt])).logits[0, -1]  # [V]


def test_n_completions_per_prompt_in_prompt_order_with_trainer_logprobs(policy, engine):
    out = engine.generate(PROMPTS, 3, SamplingSpec(max_new_tokens=6, temperature=T, seed=0, stop_token_ids=STOPS))
    assert [len(group) for group in out] == [3, 3, 3]
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            # the engine's log-probs are those of this prompt's continuation: a row paired with the wrong prompt (or
            # a truncated or untempered distribution) would not match the trainer's forward
            assert_trainer_logprobs(policy, prompt, c)


def test_completions_cut_after_first_stop_token(engine):
    out = engine.generate(PROMPTS, 8, SamplingSpec(max_new_tokens=3, temperature=T, seed=0, stop_token_ids=STOPS))
    reasons = set()
    for group in out:
        for c in group:
            reasons.add(c.finish_reason)
            assert len(c.logprobs) == len(c.token_ids)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] in STOPS  # the stop token is part of the completion
                assert not set(c.token_ids[:-1]) & set(STOPS)  # cut after the first one
                assert 1 <= len(c.token_ids) <= 3
            else:
                assert c.finish_reason == "length"
                assert len(c.token_ids) == 3 and not set(c.token_ids) & set(STOPS)
    assert reasons == {"stop", "length"}  # the seed gives both cases


def test_stop_token_in_the_last_slot_is_stop(engine):
    # every token is a stop token: completions are exactly one token long and finish with "stop"
    spec = SamplingSpec(max_new_tokens=1, temperature=T, seed=0, stop_token_ids=tuple(range(100)))
    out = engine.generate(PROMPTS[:1], 2, spec)
    assert all(c.finish_reason == "stop" and len(c.token_ids) == 1 for c in out[0])


def test_no_stop_tokens_runs_to_max_new_tokens_even_past_the_models_eos(engine):
    # the model's config has eos 2; with no stop ids given, generation must not stop (and pad) at it
    spec = SamplingSpec(max_new_tokens=4, temperature=T, seed=0, allowed_token_ids=((2,),))
    (group,) = engine.generate(PROMPTS[:1], 2, spec)
    for c in group:
        assert c.token_ids[0] == 2 and len(c.token_ids) == 4 and c.finish_reason == "length"


def test_same_seed_same_completions_different_seed_different(engine):
    spec = lambda seed: SamplingSpec(max_new_tokens=6, temperature=T, seed=seed, stop_token_ids=(2,))  # noqa: E731
    first = engine.generate(PROMPTS, 4, spec(11))
    assert engine.generate(PROMPTS, 4, spec(11)) == first
    assert engine.generate(PROMPTS, 4, spec(12)) != first


def test_generate_leaves_the_global_rng_alone(engine):
    state = torch.get_rng_state()
    engine.generate(PROMPTS, 2, SamplingSpec(max_new_tokens=3, temperature=T, seed=5))
    assert torch.equal(torch.get_rng_state(), state)


def test_chunked_generation_keeps_order(policy):
    engine = HFEngine(batch_size=2)  # chunks of 2 + 1 prompts
    engine.push_policy(policy)
    out = engine.generate(PROMPTS, 2, SamplingSpec(max_new_tokens=4, temperature=T, seed=0))
    assert [len(group) for group in out] == [2, 2, 2]
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            assert_trainer_logprobs(policy, prompt, c)


def argmax_decode(policy, prompt, steps):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(policy(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return tuple(ids[len(prompt) :])


def test_greedy_is_deterministic_and_equals_argmax_decoding(policy, engine):
    spec = SamplingSpec(max_new_tokens=5, greedy=True)
    first = engine.generate(PROMPTS, 1, spec)
    assert engine.generate(PROMPTS, 1, spec) == first
    for prompt, (c,) in zip(PROMPTS, first):
        assert c.token_ids == argmax_decode(policy, prompt, 5)
        assert c.finish_reason == "length"
        # greedy takes the untempered distribution's argmax; its log-probs are those at temperature 1
        assert_trainer_logprobs(policy, prompt, c, 1.0)


def test_greedy_stops_at_stop_token(policy, engine):
    tokens = argmax_decode(policy, PROMPTS[0], 5)
    stop = tokens[2]  # make the third argmax token a stop token
    cut = tokens[: tokens.index(stop) + 1]
    (c,), *_ = engine.generate(PROMPTS, 1, SamplingSpec(max_new_tokens=5, greedy=True, stop_token_ids=(stop,)))
    assert c.token_ids == cut and c.finish_reason == "stop"


def test_inverse_cdf_draw_picks_the_token_whose_interval_holds_u():
    # p = [1/4, 0, 1/2, 1/4] (token 1 excluded): cumulative 1/4, 1/4, 3/4, 1
    logp = torch.log(torch.tensor([[0.25, 0.0, 0.5, 0.25]] * 6))
    uniforms = torch.tensor([0.0, 0.2499, 0.2501, 0.7499, 0.7501, 0.9999], dtype=torch.float64)
    assert draw_tokens(logp, uniforms).tolist() == [0, 0, 2, 2, 3, 3]
    # an excluded first token (cumulative exactly 0) is skipped even by u = 0; so is an excluded last one by u -> 1
    logp = torch.log(torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 2))
    assert draw_tokens(logp, torch.tensor([0.0, 1 - 1e-12], dtype=torch.float64)).tolist() == [1, 2]


def test_inverse_cdf_draw_scales_u_by_an_unnormalised_total():
    # probabilities summing to 2 (a rounding-sized error, magnified): u = 0.5 lands at 1.0 of 2.0 -> token 1
    logp = torch.log(torch.tensor([[0.5, 1.0, 0.5]]))
    assert draw_tokens(logp, torch.tensor([0.5], dtype=torch.float64)).tolist() == [1]
    assert draw_tokens(logp, torch.tensor([0.2], dtype=torch.float64)).tolist() == [0]  # 0.4 < 0.5


def test_first_token_restriction_per_row():
    scores = torch.zeros(3, 5)
    out = restrict_first_token(scores, [(1, 3), None, (0, 4)])
    inf = float("-inf")
    assert out.tolist() == [[inf, 0, inf, 0, inf], [0, 0, 0, 0, 0], [0, inf, inf, inf, 0]]
    assert restrict_first_token(scores, [None] * 3) is scores


def test_a_rows_tokens_do_not_depend_on_the_batch_it_was_generated_in(policy):
    spec = SamplingSpec(max_new_tokens=5, temperature=T, seed=7, stop_token_ids=STOPS)
    outputs = []
    for batch_size in (1, 64):
        engine = HFEngine(batch_size=batch_size)
        engine.push_policy(policy)
        outputs.append(engine.generate(PROMPTS, 3, spec))
    for together, alone in zip(*outputs):
        for a, b in zip(together, alone):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


@pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN linear packing")
def test_packed_frozen_linears_compute_what_the_plain_ones_do_and_are_undone(policy):
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        plain = policy(input_ids=ids).logits  # [1, P, V]
        with packed_frozen_linears(policy) as count:
            packed = policy(input_ids=ids).logits
            patched = [m for m in policy.modules() if "forward" in m.__dict__]
        after = policy(input_ids=ids).logits
    frozen = [m for m in policy.modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad]
    assert count == len(frozen) == len(patched) > 0  # every frozen base linear, no LoRA A/B
    assert all(not m.weight.requires_grad for m in patched)
    assert not any("forward" in m.__dict__ for m in policy.modules())
    assert torch.equal(after, plain)
    assert (packed - plain).abs().max().item() < 1e-5


def fresh_policy(path):
    torch.manual_seed(0)  # LoRA A's initialisation
    policy = load_policy(str(path), 4, 8, 0.0, "all-linear")
    randomise_lora(policy, 1)
    return policy.eval()


def test_a_penalising_generation_config_changes_nothing(model_dir, tmp_path):
    # a released checkpoint's generation_config.json (penalties, truncation, suppressed, forced and biased tokens,
    # a minimum and maximum length, a second EOS id): rollouts still sample softmax(logits / T), stop at the spec's
    # ids only, and are the very completions the same weights give without that file
    plain = fresh_policy(model_dir)
    penalised = fresh_policy(penalised_copy(Path(model_dir), tmp_path / "penalised", extra_eos=3))
    for spec in (SamplingSpec(max_new_tokens=6, temperature=T, seed=0, stop_token_ids=(2,)),
                 SamplingSpec(max_new_tokens=6, greedy=True, stop_token_ids=(2,))):
        outputs = []
        for policy in (plain, penalised):
            engine = HFEngine()
            engine.push_policy(policy)
            outputs.append(engine.generate(PROMPTS, 4, spec))
        assert outputs[0] == outputs[1]
        temperature = 1.0 if spec.greedy else T
        for prompt, group in zip(PROMPTS, outputs[1]):
            for c in group:
                assert_trainer_logprobs(penalised, prompt, c, temperature)
                assert c.finish_reason == "stop" or len(c.token_ids) == 6
    assert penalised.get_base_model().generation_config.repetition_penalty == 1.3  # the model's own, restored


def test_allowed_first_tokens_and_renormalised_logprobs(policy, engine):
    allowed_per_prompt = ((5, 6), None, (7, 8, 9))  # one set per prompt; the middle prompt is unconstrained
    spec = SamplingSpec(max_new_tokens=3, temperature=T, seed=0, allowed_token_ids=allowed_per_prompt)
    out = engine.generate(PROMPTS, 6, spec)
    for prompt, allowed, group in zip(PROMPTS, allowed_per_prompt, out):
        if allowed is None:  # full-distribution log-probs throughout
            for c in group:
                assert_trainer_logprobs(policy, prompt, c)
            continue
        full = torch.log_softmax(first_token_logits(policy, prompt) / T, dim=-1)  # [V]
        renormalised = torch.log_softmax(first_token_logits(policy, prompt)[list(allowed)] / T, dim=-1)  # [|allowed|]
        assert torch.exp(renormalised).sum().item() == pytest.approx(1.0, abs=1e-6)
        for c in group:
            first = c.token_ids[0]
            assert first in allowed
            # the first token's log-prob is over the allowed set: log p(first) - log sum over allowed p(a)
            assert c.logprobs[0] == pytest.approx(renormalised[allowed.index(first)].item(), abs=1e-5)
            assert c.logprobs[0] > full[first].item() + 1e-3  # strictly above its unconstrained log-prob
            # later tokens are unconstrained
            later = trainer_logprobs(policy, prompt, c.token_ids)[1:]
            assert torch.allclose(torch.tensor(c.logprobs[1:]), later, rtol=0, atol=1e-5)
        # the engine's first-token log-probs over the allowed set, recomputed per sampled token, sum to 1
        seen = {c.token_ids[0]: c.logprobs[0] for c in group}
        unseen = [a for a in allowed if a not in seen]
        total = sum(torch.exp(torch.tensor(v)).item() for v in seen.values())
        total += sum(torch.exp(renormalised[allowed.index(a)]).item() for a in unseen)
        assert total == pytest.approx(1.0, abs=1e-5)


def test_greedy_without_its_top_first_token_takes_the_runner_up(policy, engine):
    top2 = first_token_logits(policy, PROMPTS[0]).topk(2).indices.tolist()
    everything_but_the_top = tuple(i for i in range(100) if i != top2[0])
    spec = SamplingSpec(max_new_tokens=2, greedy=True, allowed_token_ids=(everything_but_the_top, None, None))
    out = engine.generate(PROMPTS, 1, spec)
    assert out[0][0].token_ids[0] == top2[1]
    assert out[1][0].token_ids[0] == first_token_logits(policy, PROMPTS[1]).argmax().item()  # untouched prompt


def test_first_tokens_outside_the_allowed_set_are_never_sampled(policy, engine):
    spec = SamplingSpec(max_new_tokens=2, temperature=T, seed=0, allowed_token_ids=((0, 1, 2, 3, 99),) * 3)
    out = engine.generate(PROMPTS, 8, spec)
    for group in out:
        for c in group:
            assert c.token_ids[0] in (0, 1, 2, 3, 99)


def test_training_flag_restored_and_generation_in_eval_mode(model_dir):
    # LoRA dropout 0.5: if generate ran in training mode the sampler's log-probs would not match an eval forward
    policy = load_policy(model_dir, 4, 8, 0.5, "all-linear")
    randomise_lora(policy, 2)
    policy.train()
    engine = HFEngine()
    engine.push_policy(policy)
    out = engine.generate(PROMPTS[:2], 2, SamplingSpec(max_new_tokens=4, temperature=T, seed=0))
    assert policy.training
    policy.eval()
    for prompt, group in zip(PROMPTS, out):
        for c in group:
            assert_trainer_logprobs(policy, prompt, c)
    engine.generate(PROMPTS[:1], 1, SamplingSpec(max_new_tokens=1, greedy=True))
    assert not policy.training  # eval stays eval


def test_generate_needs_a_policy(policy):
    engine = HFEngine()
    with pytest.raises(RuntimeError, match="push_policy"):
        engine.generate(PROMPTS, 1, SamplingSpec(max_new_tokens=2))
    engine.push_policy(policy)
    engine.close()
    with pytest.raises(RuntimeError, match="push_policy"):
        engine.generate(PROMPTS, 1, SamplingSpec(max_new_tokens=2))


def test_engine_rejects_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        HFEngine(batch_size=0)


def forward_shapes(policy):
    """Records ``input_ids`` shapes of every forward of the base model; returns (shapes, hook handle)."""
    shapes = []
    base = policy.get_base_model()
    handle = base.register_forward_pre_hook(lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
                                            with_kwargs=True)
    return shapes, handle


@pytest.fixture(scope="module")
def gpt2_policy(tiny_gpt2_dir):
    """Learned absolute positions: a wrong position id for a left-padded row changes its tokens."""
    policy = load_policy(str(tiny_gpt2_dir), 4, 8, 0.0, "all-linear")
    randomise_lora(policy, 2)
    return policy.eval()


@pytest.mark.parametrize("constrained", [False, True])
@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_shared_prompt_prefill_equals_unshared_generation(request, architecture, constrained):
    policy = request.getfixturevalue("policy" if architecture == "llama" else "gpt2_policy")
    prompts = [*PROMPTS, [1]]  # lengths 7, 5, 4 and 1: the last one's shared context is all padding
    allowed = ((21, 22), None, (30,), (25, 26, 27)) if constrained else None
    spec = SamplingSpec(max_new_tokens=6, temperature=T, seed=3, stop_token_ids=STOPS, allowed_token_ids=allowed)
    results = {}
    for share in (False, True):
        engine = HFEngine(share_prompt_prefill=share)
        engine.push_policy(policy)
        shapes, handle = forward_shapes(policy)
        try:
            results[share] = engine.generate(prompts, 4, spec)
        finally:
            handle.remove()
        # shared: one prefill of the 4 prompts' first 6 columns; unshared: 16 rows of all 7 from the start
        assert shapes[0] == ((4, 6) if share else (16, 7))
    for shared_group, unshared_group in zip(results[True], results[False]):
        for shared, unshared in zip(shared_group, unshared_group):
            assert shared.token_ids == unshared.token_ids
            assert shared.finish_reason == unshared.finish_reason
            assert max(abs(a - b) for a, b in zip(shared.logprobs, unshared.logprobs)) < 1e-5
    for index, (prompt, group) in enumerate(zip(prompts, results[True])):
        for completion in group:
            assert all(torch.isfinite(torch.tensor(completion.logprobs)))
            if allowed is None or allowed[index] is None:  # restricted rows are renormalised: tested above
                assert_trainer_logprobs(policy, prompt, completion)
    if constrained:
        assert all(c.token_ids[0] in (21, 22) for c in results[True][0])
        assert all(c.token_ids[0] == 30 and c.logprobs[0] == pytest.approx(0.0, abs=1e-6) for c in results[True][2])


def test_one_sample_per_prompt_does_not_prefill_separately(policy, engine):
    shapes, handle = forward_shapes(policy)
    try:
        engine.generate(PROMPTS, 1, SamplingSpec(max_new_tokens=3, temperature=T, seed=0))
    finally:
        handle.remove()
    assert shapes[0] == (3, 7)  # nothing to share: generate's own prefill of the whole prompts


def test_every_eos_id_of_the_checkpoint_ends_a_completion(model_dir, tmp_path):
    # the tokenizer's EOS (2) and the generation_config's second one (3) both stop rollouts; ids outside the
    # vocabulary are refused by name
    path = penalised_copy(Path(model_dir), tmp_path / "two-eos", extra_eos=3)
    tokenizer, policy = load_tokenizer(str(path)), fresh_policy(path)
    assert completion_stop_ids(tokenizer, policy) == (2, 3)
    policy.get_base_model().generation_config.eos_token_id = [2, 100_000]
    with pytest.raises(InputError, match=r"EOS ids \[100000\].*outside the model's vocabulary of 100"):
        completion_stop_ids(tokenizer, policy)


REPLY = [33, 40, 41, 42, 33]  # an environment's reply after a turn (the tool message's ids)


def two_turns(policy, keep, n_first, n_second, change_weights=False):
    """A first turn told another follows, then a second on prompt + completion + reply for every completion;
    returns (first turn's groups, second turn's groups, the shape of the second call's first forward)."""
    engine = HFEngine(keep_turn_cache=keep)
    engine.push_policy(policy)
    first = engine.generate(PROMPTS, n_first, SamplingSpec(max_new_tokens=6, temperature=T, seed=3,
                                                           stop_token_ids=STOPS, next_turn=True))
    contexts = [prompt + list(c.token_ids) + REPLY for prompt, group in zip(PROMPTS, first) for c in group]
    if change_weights:
        randomise_lora(policy, 5)
    shapes, handle = forward_shapes(policy)
    try:
        second = engine.generate(contexts, n_second, SamplingSpec(max_new_tokens=6, temperature=T, seed=4,
                                                                  stop_token_ids=STOPS))
    finally:
        handle.remove()
    return first, contexts, second, shapes[0]


@pytest.mark.parametrize("n_first, n_second", [(2, 1), (2, 3)])
@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_a_next_turn_runs_only_its_new_tokens_and_draws_what_a_full_prefill_draws(request, architecture, n_first,
                                                                                  n_second):
    policy = request.getfixturevalue("policy" if architecture == "llama" else "gpt2_policy")
    kept_first, contexts, kept_second, kept_shape = two_turns(policy, True, n_first, n_second)
    full_first, full_contexts, full_second, full_shape = two_turns(policy, False, n_first, n_second)
    assert contexts == full_contexts  # the first turn does not depend on keeping
    # kept: the second call first runs each context's new tokens but the last (the reply's, and the last drawn
    # token where a row ran to max_new_tokens) on the relaid cache; in full: every context's whole prompt
    assert kept_shape[0] == len(contexts) and kept_shape[1] <= len(REPLY)
    assert full_shape == ((len(contexts), max(map(len, contexts)) - 1) if n_second > 1
                          else (len(contexts), max(map(len, contexts))))
    for kept_group, full_group, context in zip(kept_second, full_second, contexts):
        for kept, full in zip(kept_group, full_group):
            assert kept.token_ids == full.token_ids and kept.finish_reason == full.finish_reason
            assert max(abs(a - b) for a, b in zip(kept.logprobs, full.logprobs)) < 1e-5
            assert_trainer_logprobs(policy, context, kept)  # the trainer's log-probs of the continued context


def test_a_kept_turn_serves_only_the_same_weights_and_prompts_that_continue_it(policy):
    original = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_B" in n}
    try:
        _, contexts, second, shape = two_turns(policy, True, 2, 1, change_weights=True)
        assert shape == (len(contexts), max(map(len, contexts)))  # the weights moved: a full prefill
        for context, (completion,) in zip(contexts, second):
            assert_trainer_logprobs(policy, context, completion)
    finally:
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if name in original:
                    param.copy_(original[name])
    engine = HFEngine()
    engine.push_policy(policy)
    engine.generate(PROMPTS, 2, SamplingSpec(max_new_tokens=6, temperature=T, seed=3, stop_token_ids=STOPS,
                                             next_turn=True))
    strangers = [[1, 50, 51, 52, 33], [1, 53]]
    shapes, handle = forward_shapes(policy)
    try:
        engine.generate(strangers, 1, SamplingSpec(max_new_tokens=3, temperature=T, seed=0))
    finally:
        handle.remove()
    assert shapes[0] == (2, 5)  # prompts that continue no kept row: their whole prefill, as without a turn


def test_the_end_of_the_turns_lets_a_kept_cache_go(policy):
    engine = HFEngine()
    engine.push_policy(policy)
    first = engine.generate(PROMPTS, 1, SamplingSpec(max_new_tokens=6, temperature=T, seed=3, stop_token_ids=STOPS,
                                                     next_turn=True))
    engine.end_turns()  # e.g. every episode answered: no turn follows
    contexts = [prompt + list(group[0].token_ids) + REPLY for prompt, group in zip(PROMPTS, first)]
    shapes, handle = forward_shapes(policy)
    try:
        engine.generate(contexts, 1, SamplingSpec(max_new_tokens=3, temperature=T, seed=4))
    finally:
        handle.remove()
    assert shapes[0] == (len(contexts), max(map(len, contexts)))  # nothing kept: the whole prefill
