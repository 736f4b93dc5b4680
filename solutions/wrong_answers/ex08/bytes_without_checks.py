"""The right formula, but no argument checks: stage 1.0, a float count and True go through."""

LOSES = ["test_model_state_bytes_rejects_bad_arguments"]


def model_state_bytes(num_params, dp_degree, stage, optimizer_bytes_per_param=12):
    params, grads, optimizer = 2 * num_params, 2 * num_params, optimizer_bytes_per_param * num_params
    if stage >= 1:
        optimizer /= dp_degree
    if stage >= 2:
        grads /= dp_degree
    if stage >= 3:
        params /= dp_degree
    return float(params + grads + optimizer)
