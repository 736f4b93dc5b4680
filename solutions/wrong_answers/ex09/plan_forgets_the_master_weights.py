"""Counts AdamW's two fp32 moments but not the fp32 master weights: 8 bytes of optimizer state per element, not 12."""

LOSES = ["test_plan_memory_counts_llama_3_8b", "test_plan_memory_counts_each_gpus_slice"]

_solution_plan_memory = plan_memory


def plan_memory(model, layout, stage):
    n = _solution_plan_memory(model, layout, stage)["params"] // 2
    return {"params": 2 * n, "grads": 2 * n, "optimizer": 8 * n, "total": 12 * n}
