"""Issue 42 §2: ``model.dtype: auto`` never picks the pathological path. On a CPU without bf16 arithmetic a bf16
checkpoint loads in float32 when two float32 copies of its weights fit in half the available memory, else in bf16;
on a GPU the checkpoint's own dtype. Every verdict here is told the CPU and the memory (faked), never reads this
machine's; the expected sizes are counted by hand from the configs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from lit_grpo.engines.base import engine_dtype
from lit_grpo.policy.model_loading import load_policy, run_base_dtype
from lit_grpo.run import dtype_choice
from lit_grpo.run.dtype_choice import (
    NO_BF16_PACKING,
    auto_dtype,
    cgroup_available,
    cgroup_memory,
    choose_auto_dtype,
    cpu_arithmetic,
    float32_weight_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "data" / "tiny-qwen2-chat"  # bf16 on disk
# tiny-qwen2-chat by hand: hidden 64, 2 heads of 32 (1 KV head), MLP 128, 2 layers, vocabulary 32,704, tied head.
# Per layer: q 64x64+64, k 64x32+32, v 64x32+32, o 64x64, MLP 3 x 64x128, two norms of 64 = 37,120.
TINY_PARAMS = 32_704 * 64 + 2 * 37_120 + 64  # + the final norm = 2,167,360
TINY_FP32 = 4 * TINY_PARAMS  # 8,669,440 bytes
NONE = "none of avx512_bf16, amx_bf16, avx_ne_convert"
# Qwen2.5-0.5B width at 2 layers (issue 42's model): 136,134,656 embedding + 2 x 14,912,384 per layer + 896 norm
WIDTH_2L_FP32 = 4 * (151_936 * 896 + 2 * 14_912_384 + 896)  # 663,841,280 bytes


def test_bf16_checkpoint_without_bf16_arithmetic_loads_float32_when_two_copies_fit_in_half_the_memory():
    # 2 x 663,841,280 = 1,327,682,560 bytes; half of 2,655,365,120 is exactly that: fits
    choice = choose_auto_dtype("bfloat16", "cpu", (), WIDTH_2L_FP32, 2_655_365_120)
    assert choice.dtype == torch.float32
    assert choice.line == (
        "model.dtype auto: the checkpoint is bfloat16; loading it in float32: this CPU has no bf16 arithmetic "
        f"({NONE}), where bf16 training is several times slower, and float32 fits (2 copies of 0.66 GB of float32 "
        "weights within 50% of the 2.66 GB available); set model.dtype bfloat16 for half the memory")


def test_bf16_checkpoint_without_bf16_arithmetic_stays_bf16_when_float32_does_not_fit():
    choice = choose_auto_dtype("bfloat16", "cpu", (), WIDTH_2L_FP32, 2_655_365_119)  # one byte short
    assert choice.dtype == torch.bfloat16
    assert choice.line == (
        "model.dtype auto: the checkpoint is bfloat16; loading it in bfloat16: this CPU has no bf16 arithmetic "
        f"({NONE}), where float32 trains several times faster, but it does not fit comfortably (2 copies of 0.66 GB "
        "of float32 weights exceed 50% of the 2.66 GB available); set model.dtype float32 to choose it anyway")


def test_qwen_0_5b_wants_four_times_its_float32_weights_available():
    weights = 4 * 494_000_000  # 1.976 GB
    assert choose_auto_dtype("bfloat16", "cpu", (), weights, 8_000_000_000).dtype == torch.float32  # 3.952 <= 4.0
    assert choose_auto_dtype("bfloat16", "cpu", (), weights, 7_000_000_000).dtype == torch.bfloat16  # 3.952 > 3.5


def test_a_cpu_with_bf16_arithmetic_keeps_bf16_whatever_the_memory():
    for available in (10**6, 10**12):
        choice = choose_auto_dtype("bfloat16", "cpu", ("avx512_bf16", "amx_bf16"), WIDTH_2L_FP32, available)
        assert choice.dtype == torch.bfloat16
        assert choice.line == ("model.dtype auto: the checkpoint is bfloat16; loading it in bfloat16: this CPU "
                               "computes in bf16 (avx512_bf16, amx_bf16)")


def test_on_a_gpu_the_checkpoints_own_dtype():
    for named in ("bfloat16", "float16", "float32"):
        choice = choose_auto_dtype(named, "cuda", (), WIDTH_2L_FP32, 10**12)
        assert choice.dtype == getattr(torch, named)
    assert choose_auto_dtype("bfloat16", "cuda", None, None, None).line == (
        "model.dtype auto: the checkpoint is bfloat16; loading it in bfloat16 (the checkpoint's own, on cuda)")


def test_what_cannot_be_read_keeps_the_checkpoints_dtype_and_says_so():
    unknown_cpu = choose_auto_dtype("bfloat16", "cpu", None, WIDTH_2L_FP32, 10**12)
    assert (unknown_cpu.dtype, unknown_cpu.line) == (torch.bfloat16, (
        "model.dtype auto: the checkpoint is bfloat16; loading it in bfloat16 (the checkpoint's own; whether this CPU "
        "computes in bf16 cannot be read here: set model.dtype float32 if steps are slow)"))
    for size, available in ((None, 10**12), (WIDTH_2L_FP32, None)):
        unknown = choose_auto_dtype("bfloat16", "cpu", (), size, available)
        assert (unknown.dtype, unknown.line) == (torch.bfloat16, (
            f"model.dtype auto: the checkpoint is bfloat16; loading it in bfloat16: this CPU has no bf16 arithmetic "
            f"({NONE}), where float32 trains several times faster, but the size of the float32 weights or the memory "
            "available cannot be read here; set model.dtype float32 to choose it"))


def test_float16_follows_the_same_rule_with_its_own_instructions():
    assert choose_auto_dtype("float16", "cpu", (), 100, 400).dtype == torch.float32
    assert choose_auto_dtype("float16", "cpu", ("avx512_fp16",), 100, 400).line == (
        "model.dtype auto: the checkpoint is float16; loading it in float16: this CPU computes in fp16 (avx512_fp16)")
    assert "none of avx512_fp16, amx_fp16" in choose_auto_dtype("float16", "cpu", (), 101, 400).line


def test_float32_and_unnamed_checkpoints_load_in_float32_whatever_the_memory():
    assert choose_auto_dtype("float32", "cpu", (), 10**12, 1).line == (
        "model.dtype auto: the checkpoint is float32; loading it in float32")
    assert choose_auto_dtype(None, "cpu", (), None, None).line == (
        "model.dtype auto: the checkpoint's config names no dtype; loading it in float32")
    odd = choose_auto_dtype("float64", "cpu", (), None, None)
    assert (odd.dtype, odd.line) == (torch.float32, "model.dtype auto: the checkpoint is float64, not a dtype the base "
                                                    "is loaded in (float32, bfloat16, float16); loading it in float32")


# --- what the machine tells the rule (faked) ---------------------------------------------------------------------
SAPPHIRE = {"avx512_bw": True, "avx512_bf16": True, "amx_bf16": True, "avx_ne_convert": False, "avx512_fp16": True,
            "amx_fp16": False}
AVX2_ONLY = {key: False for key in SAPPHIRE}


def test_the_cpu_is_read_from_cpuinfo_and_the_override_reads_it_as_avx2(monkeypatch):
    monkeypatch.delenv(NO_BF16_PACKING, raising=False)
    monkeypatch.setattr(dtype_choice.platform, "machine", lambda: "x86_64")
    assert cpu_arithmetic("bfloat16", SAPPHIRE) == ("avx512_bf16", "amx_bf16")
    assert cpu_arithmetic("float16", SAPPHIRE) == ("avx512_fp16",)
    assert cpu_arithmetic("bfloat16", AVX2_ONLY) == ()
    monkeypatch.setenv(NO_BF16_PACKING, "1")
    assert cpu_arithmetic("bfloat16", SAPPHIRE) == ()
    monkeypatch.setattr(dtype_choice.platform, "machine", lambda: "aarch64")
    assert cpu_arithmetic("bfloat16", SAPPHIRE) is None


def test_a_cgroup_limit_counts_what_the_group_holds_less_reclaimable_file_pages(tmp_path):
    assert cgroup_available(8_000, 5_000, 1_000) == 4_000
    assert cgroup_available(8_000, 9_500, 0) == 0
    assert cgroup_available(None, 5_000, 0) is None
    (tmp_path / "memory.max").write_text("4000000000\n")
    (tmp_path / "memory.current").write_text("1500000000\n")
    (tmp_path / "memory.stat").write_text("anon 1000000000\ninactive_file 500000000\n")
    assert cgroup_memory(tmp_path) == 3_000_000_000  # 4.0 GB - (1.5 - 0.5) GB
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (v1 / "memory" / "memory.usage_in_bytes").write_text("100\n")
    assert cgroup_memory(v1) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("1000\n")
    (v1 / "memory" / "memory.stat").write_text("total_inactive_file 50\n")
    assert cgroup_memory(v1) == 950


def test_float32_weight_bytes_from_the_safetensors_header_and_from_the_config():
    assert float32_weight_bytes(str(MODEL)) == TINY_FP32
    assert dtype_choice._meta_float32_bytes(str(MODEL), False) == TINY_FP32  # a hub id not yet downloaded


def on_a_machine(monkeypatch, arithmetic: tuple[str, ...], available: int) -> None:
    monkeypatch.setattr(dtype_choice, "cpu_arithmetic", lambda named: arithmetic)
    monkeypatch.setattr(dtype_choice, "available_memory", lambda: available)


def test_auto_dtype_reads_the_checkpoint_and_shares_the_memory_among_the_nodes_processes(monkeypatch):
    on_a_machine(monkeypatch, (), 4 * TINY_FP32)
    assert auto_dtype(str(MODEL)).dtype == torch.float32  # 2 x 8,669,440 within half of 34,677,760
    assert auto_dtype(str(MODEL), processes_here=2).dtype == torch.bfloat16  # each of 2 ranks gets 17,338,880
    on_a_machine(monkeypatch, (), 4 * TINY_FP32 - 1)
    assert auto_dtype(str(MODEL)).dtype == torch.bfloat16
    assert auto_dtype(str(MODEL), "cuda").dtype == torch.bfloat16
    on_a_machine(monkeypatch, ("amx_bf16",), 10**12)
    assert auto_dtype(str(MODEL)).dtype == torch.bfloat16


def frozen_dtypes(policy) -> set[torch.dtype]:
    return {p.dtype for p in policy.parameters() if not p.requires_grad}


def test_load_policy_follows_the_choice_and_says_it_once(monkeypatch, caplog):
    on_a_machine(monkeypatch, (), 10**12)
    with caplog.at_level(logging.INFO):
        policy = load_policy(str(MODEL), 4, 8, 0.0, "all-linear", dtype="auto")
    assert frozen_dtypes(policy) == {torch.float32}
    assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model.dtype auto")]
    assert len(notes) == 1 and notes[0].startswith("model.dtype auto: the checkpoint is bfloat16; loading it in "
                                                   "float32: this CPU has no bf16 arithmetic")
    assert engine_dtype("auto", policy) == "float32"  # a vLLM engine's copy follows the policy
    assert engine_dtype("bfloat16", policy) == "bfloat16"  # unless the engine names its own
    caplog.clear()
    with caplog.at_level(logging.INFO):
        policy = load_policy(str(MODEL), 4, 8, 0.0, "all-linear", dtype="bfloat16")
    assert frozen_dtypes(policy) == {torch.bfloat16} and engine_dtype("auto", policy) == "bfloat16"
    assert not [r for r in caplog.records if r.getMessage().startswith("model.dtype auto")]


class FakeStrategy:
    """What ``run_base_dtype`` asks of a trainer's strategy: its device, and a broadcast from rank 0 (here rank 0's
    choice is a fixed one, as another rank sees it)."""

    def __init__(self, device: str, rank0: object | None = None) -> None:
        self.root_device, self.rank0, self.seen = torch.device(device), rank0, []

    def broadcast(self, obj: object) -> object:
        self.seen.append(obj)
        return obj if self.rank0 is None else self.rank0


class FakeTrainer:
    def __init__(self, strategy: FakeStrategy, num_devices: int) -> None:
        self.strategy, self.num_devices = strategy, num_devices


def test_a_run_decides_on_its_device_with_the_memory_per_process_and_rank_zeros_choice_holds(monkeypatch):
    on_a_machine(monkeypatch, (), 4 * TINY_FP32)
    assert run_base_dtype(str(MODEL), "auto", FakeTrainer(FakeStrategy("cpu"), 1)) == torch.float32
    assert run_base_dtype(str(MODEL), "auto", FakeTrainer(FakeStrategy("cpu"), 2)) == torch.bfloat16
    assert run_base_dtype(str(MODEL), "auto", FakeTrainer(FakeStrategy("meta"), 1)) == torch.bfloat16  # not the CPU
    rank0 = choose_auto_dtype("bfloat16", "cpu", (), 1, 10)  # rank 0 read more memory: float32
    strategy = FakeStrategy("cpu", rank0)
    assert run_base_dtype(str(MODEL), "auto", FakeTrainer(strategy, 2)) == torch.float32
    assert strategy.seen[0].dtype == torch.bfloat16  # this rank's own reading was overruled
    assert run_base_dtype(str(MODEL), "float16", FakeTrainer(FakeStrategy("cpu"), 1)) == torch.float16


@pytest.mark.parametrize("arithmetic, expected", [((), torch.float32), (("avx512_bf16",), torch.bfloat16)])
def test_the_policy_module_loads_what_auto_chose(monkeypatch, arithmetic, expected):
    from lit_grpo.policy.module import PolicyModule

    on_a_machine(monkeypatch, arithmetic, 10**12)
    module = PolicyModule(model_name_or_path=str(MODEL), lora={"rank": 4})
    module.configure_model()
    assert frozen_dtypes(module.policy) == {expected}
