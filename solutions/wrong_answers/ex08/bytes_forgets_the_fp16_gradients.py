"""Counts parameters and optimizer state but not the 2Ψ bytes of fp16 gradients."""

LOSES = ["test_model_state_bytes_gives_the_zero_papers_figure", "test_model_state_bytes_follows_the_formula_at_every_stage"]


def model_state_bytes(num_params, dp_degree, stage, optimizer_bytes_per_param=12):
    _check_whole("num_params", num_params, 0, "the number of parameters")
    _check_whole("dp_degree", dp_degree, 1, "the number of data-parallel GPUs")
    _check_whole("optimizer_bytes_per_param", optimizer_bytes_per_param, 0, "the optimizer's bytes per parameter")
    if isinstance(stage, bool) or not isinstance(stage, int) or stage not in STAGES:
        raise ValueError(f"stage is {stage!r}: pass 0, 1, 2 or 3")
    params, optimizer = 2 * num_params, optimizer_bytes_per_param * num_params
    if stage >= 1:
        optimizer /= dp_degree
    if stage >= 3:
        params /= dp_degree
    return float(params + optimizer)
