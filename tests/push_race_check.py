"""Run by test_server_pool.py as two gloo ranks against one stand-in server: each rank draws on a background thread
(as drawing ahead does), rank 1 longer; rank 0 then pushes the next adapter version while rank 1 may still be
drawing. Prints ``DRAW OK`` or ``DRAW FAILED: <error>`` for this rank's draw, then ``PUSHED``.

    python push_race_check.py RANK PORT SERVER_URL ADAPTER_DIR MODEL_DIR
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist

from lit_grpo.engines import SamplingSpec, VLLMServerEngine
from lit_grpo.policy.model_loading import load_policy


def main() -> None:
    rank, port, url, adapter_dir, model_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    policy = load_policy(model_dir, 4, 8, 0.0, "all-linear")
    engine = VLLMServerEngine(url=url, max_parallel_requests=1, adapter_dir=f"{adapter_dir}/{rank}")
    engine.push_policy(policy)  # version 0, on every rank
    spec = SamplingSpec(max_new_tokens=2, temperature=1.0, seed=1)
    with ThreadPoolExecutor(1) as pool:  # the next epoch's draw: rank 1's takes five times as long
        draw = pool.submit(engine.generate, [[1, 20 + i, 21 + i] for i in range(2 if rank == 0 else 10)], 2, spec)
        dist.barrier()  # the epoch's training keeps the ranks in step
        error = draw.exception()  # the next epoch's start: this rank's own draw, taken
    print("DRAW OK" if error is None else f"DRAW FAILED: {error}", flush=True)
    engine.push_policy(policy)  # the next version, pushed by rank 0 for every rank
    print("PUSHED", flush=True)
    engine.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
