"""Sizes wk and wv like wq, (n_heads · head_dim, dim), ignoring grouped-query attention's fewer key/value heads."""

LOSES = ["test_plan_memory_counts_llama_3_8b", "test_plan_memory_counts_each_gpus_slice"]

_solution_plan_memory = plan_memory


def plan_memory(model, layout, stage):
    _solution_plan_memory(model, layout, stage)  # its checks
    return _solution_plan_memory(model._replace(n_kv_heads=model.n_heads), layout, stage)
