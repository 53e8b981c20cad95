"""Real-vLLM-server checks, run in a subprocess by test_vllm_server.py: the engine starts a vLLM server on
loopback (with an API key), trains 2 epochs through it, then a second engine connects to the same server by URL,
as to a server a user started, for the sync and stale-engine checks. Prints one JSON line of measured figures.

The model is a copy of tiny-llama whose generation_config.json sets every sampling option a released checkpoint
can carry (``support.PENALISING_GENERATION``), which a server would otherwise take as its default sampling.

Usage: python tests/vllm_server_check.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from lit_grpo.engines import VLLMServerEngine
from lit_grpo.tasks import ArithmeticTask
from support import listening_addresses, penalised_copy
from vllm_sync_check import DATA, greedy_matches, perturb_adapter, sampler_vs_trainer, train_two_epochs

KEY = "lit-grpo-test-key"


def main(root: Path) -> None:
    torch.manual_seed(0)
    engine = VLLMServerEngine(api_key=KEY, kv_cache_gib=0.25, max_model_len=64, shared=True)
    figures: dict[str, Any] = {}
    try:
        module, _, diff_max = train_two_epochs(engine, root, penalised_copy(DATA / "tiny-llama", root / "penalised"))
        figures["logp_diff_max_per_epoch"] = diff_max
        figures["server_url"] = engine.url
        figures["listening"] = listening_addresses(int(engine.url.rsplit(":", 1)[1]))  # the socket's bound address
        server = engine._server
        records = list(ArithmeticTask().heldout_records())
        prompts = [module.tokenizer(r["prompt"])["input_ids"] for r in records[:32]]
        by_url = VLLMServerEngine(url=engine.url, api_key=KEY)
        by_url.push_policy(module.policy)
        figures["greedy_equal"] = greedy_matches(by_url, module, prompts)
        figures["synced_diff"] = sampler_vs_trainer(by_url, module, prompts[:8])
        perturb_adapter(module)
        figures["stale_diff"] = sampler_vs_trainer(by_url, module, prompts[:8])
        by_url.push_policy(module.policy)
        figures["pushed_diff"] = sampler_vs_trainer(by_url, module, prompts[:8])
        by_url.close()
        try:
            VLLMServerEngine(url=engine.url, api_key="wrong-key").push_policy(module.policy)
        except RuntimeError as error:
            figures["wrong_key_error"] = str(error)
    finally:
        engine.close()
    figures["server_stopped"] = server.poll() is not None
    print("FIGURES " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
