"""Rollout engines behind one Protocol; the only package that touches an inference library."""

from lit_grpo.engines.base import Completion, FinishReason, RolloutEngine, SamplingSpec
from lit_grpo.engines.hf import HFEngine
from lit_grpo.engines.vllm_engine import VLLMEngine
from lit_grpo.engines.vllm_server import VLLMServerEngine

__all__ = ["Completion", "FinishReason", "HFEngine", "RolloutEngine", "SamplingSpec", "VLLMEngine", "VLLMServerEngine"]
