"""Takes bytes per number as torch.finfo(dtype).bits / 8: the right size, but a float where an int is promised."""

LOSES = ["test_mlp_activation_bytes_matches_what_autograd_saves"]


def mlp_activation_bytes(batch_size, features, hidden, classes, depth, dtype=torch.float32):
    if min(batch_size, features, hidden, classes, depth) < 1:
        raise ValueError("every size must be at least 1")
    return batch_size * (features + depth * hidden) * torch.finfo(dtype).bits / 8
