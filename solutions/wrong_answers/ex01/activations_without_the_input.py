"""Leaves out the input, reasoning that it does not require grad; but the first Linear saves it for its weight's gradient."""

LOSES = ["test_mlp_activation_bytes_matches_what_autograd_saves"]


def mlp_activation_bytes(batch_size, features, hidden, classes, depth, dtype=torch.float32):
    if min(batch_size, features, hidden, classes, depth) < 1:
        raise ValueError("every size must be at least 1")
    element = torch.empty((), dtype=dtype).element_size()
    return batch_size * depth * hidden * element
